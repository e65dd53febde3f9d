from dataclasses import replace

import pytest

from moe_repro.suites import all_suites
from moe_repro.suites.runner import RunConfig, measure
from moe_repro.records.stats import quantile, summarize


def test_quantiles_match_hand_values():
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.25) == pytest.approx(1.75)
    s = summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s["median"], s["q1"], s["q3"], s["min"], s["max"], s["n"]) == (
        3.0,
        2.0,
        4.0,
        1.0,
        5.0,
        5,
    )


def test_grid_and_overrides_are_typed_and_validated():
    gemm = all_suites()["gemm"]
    grid = gemm.grid(gemm.parse_overrides(["n=64,96", "dtype=float32"]))
    assert [p["n"] for p in grid] == [64, 96]
    for bad in (["m=3"], ["n=x"], ["n"], ["=3"]):
        with pytest.raises(ValueError):
            gemm.parse_overrides(bad)


def test_gemm_suite_measures_and_checks():
    gemm = all_suites()["gemm"]
    records = measure(gemm, gemm.grid({"n": [32, 64]}), RunConfig(repeats=3, min_sample_s=0.001))
    assert [r["n"] for r in records] == [32, 64]
    for r in records:
        assert r["correct"] is True and r["wrong"] == 0
        assert len(r["samples"]["time_s"]) == 3
        assert r["time_s_min"] <= r["time_s"] <= r["time_s_max"]
        # derived per sample: the median TFLOP/s is the one of the median time
        assert r["tflops"] == pytest.approx(2 * r["n"] ** 3 / r["time_s"] / 1e12)


def test_gemm_check_counts_wrong_elements():
    from moe_repro.suites import gemm

    state = gemm.setup({"n": 16, "dtype": "float32", "device": "cpu"})
    real_mm = gemm.torch.mm
    try:
        gemm.torch.mm = lambda a, b, out: out.copy_(real_mm(a, b) + 1.0)  # a broken kernel
        assert gemm.check(state) == 256
    finally:
        gemm.torch.mm = real_mm


@pytest.mark.multiprocess
@pytest.mark.parametrize("ranks", [2, 4])
def test_allreduce_suite_runs_for_real_on_both_backends(ranks):
    suite = all_suites()["allreduce"]
    grid = suite.grid({"ranks": [ranks], "bytes": [8, 4096]})
    records = measure(suite, grid, RunConfig(repeats=2, min_sample_s=0.001, timeout_s=120))
    assert {(r["backend"], r["bytes"]) for r in records} == {
        ("gloo", 8),
        ("gloo", 4096),
        ("mpi", 8),
        ("mpi", 4096),
    }
    for r in records:
        assert r["correct"] and r["world_size"] == ranks
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 2 * (ranks - 1) / ranks, rel=1e-9)


def test_sizes_take_suffixes_and_doubling_ranges():
    from moe_repro.suites.base import doubling_range, parse_size

    assert (
        parse_size("4K") == 4096
        and parse_size("64M") == 64 * 1024 * 1024
        and parse_size("12") == 12
    )
    assert doubling_range("1K:8K") == [1024, 2048, 4096, 8192]
    assert doubling_range("3:3") == [3]
    gemm = all_suites()["gemm"]
    assert gemm.parse_overrides(["n=32:128,1K"])["n"] == [32, 64, 128, 1024]
    for bad in (["n=8K:1K"], ["n=0:4"], ["n=1Q"]):
        with pytest.raises(ValueError):
            gemm.parse_overrides(bad)


def test_measure_takes_a_suite_by_name_and_derives_what_its_grid_derives(monkeypatch):
    """measure() is the one entry point: by name, with derive=True a point written by code gets
    the parameters the suite's grid would add (eplb-policy: gpus = nodes x gpus_per_node)."""
    import moe_repro.suites.runner as runner

    seen = []
    monkeypatch.setattr(
        runner, "run_point", lambda suite, params, config, ctx=None: seen.append(params) or {}
    )
    point = {
        k: v
        for k, v in all_suites()["eplb-policy"].grid(quick=True)[0].items()
        if k not in ("gpus", "slots_per_gpu", "row_bytes")
    }
    point.update(nodes=2, gpus_per_node=4)
    measure("eplb-policy", [point])
    assert "gpus" not in seen[0]  # as given
    measure("eplb-policy", [point], derive=True)
    assert seen[1]["gpus"] == 8 and seen[1]["row_bytes"] == point["hidden"] * point["itemsize"]


@pytest.mark.timing
def test_calls_per_sample_come_from_the_median_of_number_from_single_calls(fake_clock):
    """One slow single call (a stall) must not set the calls per sample when several are timed:
    with number_from 3 the median call sets it, with 1 the stalled one does. Each call moves a
    fake clock (binary fractions of a second: the divisions are exact)."""
    from moe_repro.runtime.timing import HostTimer
    from moe_repro.suites.base import Suite
    from moe_repro.suites.runner import RunConfig, prepare_point

    call_s, stall_s = 2.0**-10, 2.0**-4  # about 1 ms, and a 62.5 ms stall

    def run(state):
        state["calls"] += 1
        # warm-up call, then the timed single calls: the first one stalls
        fake_clock.advance(stall_s if state["calls"] == 2 else call_s)

    suite = Suite(name="stall", params={"x": [1]}, setup=lambda p, ctx: {"calls": 0}, run=run)
    config = RunConfig(warmup=1, min_sample_s=16 * call_s)
    timer = HostTimer(fake_clock)
    *_, number_one, _ = prepare_point(suite, {"x": 1}, config, timer=timer)
    *_, number_three, _ = prepare_point(
        suite, {"x": 1}, replace(config, number_from=3), timer=timer
    )
    assert number_one == 1  # the stall alone already lasts longer than a sample
    assert number_three == 16  # min_sample_s over the median call
