"""The gate on runs stored at a load above the core count: wall-clock metrics are listed as not
gated (their false-positive rate is unbounded there), CPU time is gated, broken values still
fail, and --gate-loaded-wall gates them anyway."""

from __future__ import annotations

import math

import pytest

from moe_repro.records import gate
from moe_repro.records.record import SuiteRecord


def _record(scale=1.0, load=1.0, cores=2, wall_value=None):
    times = [1e-3 * scale * (1 + 0.01 * i) for i in range(5)]
    cpu = [0.5e-3 * scale * (1 + 0.01 * i) for i in range(5)]
    return SuiteRecord(
        suite="gemm",
        params=["n"],
        metrics=[
            {"name": "time_s", "unit": "s", "better": "lower", "kind": "measured"},
            {"name": "cpu_time_s", "unit": "s", "better": "lower", "kind": "measured"},
        ],
        records=[
            {
                "suite": "gemm",
                "n": 128,
                "time_s": times[2] if wall_value is None else wall_value,
                "cpu_time_s": cpu[2],
                "samples": {"time_s": times, "cpu_time_s": cpu},
                "load_start": load,
                "load_end": load,
            }
        ],
        environment={"timestamp": "2026-11-28T08:00:00+00:00", "noise": {"cpu_count": cores}},
    )


def _status(base, cur, **kw):
    b = {(e.result, e.key, e.metric): e for e in gate._suite_entries(base)}
    c = {(e.result, e.key, e.metric): e for e in gate._suite_entries(cur)}
    return {f.metric: f for f in gate.compare(b, c, **kw)}


def test_an_idle_pair_gates_both_clocks():
    found = _status(_record(), _record(scale=2.0))
    assert found["time_s"].status == found["cpu_time_s"].status == "regression"


@pytest.mark.parametrize("loaded_side", ["baseline", "current"])
def test_a_loaded_side_leaves_wall_time_not_gated_and_cpu_time_gated(loaded_side):
    base = _record(load=18.0 if loaded_side == "baseline" else 1.0)
    cur = _record(scale=2.0, load=18.0 if loaded_side == "current" else 1.0)
    found = _status(base, cur)
    assert found["time_s"].status == "not-gated"
    assert "load 18" in found["time_s"].why and "2 cores" in found["time_s"].why
    assert found["cpu_time_s"].status == "regression"
    assert gate.exit_code(list(found.values())) == gate.EXIT_REGRESSION
    forced = _status(base, cur, gate_loaded_wall=True)
    assert forced["time_s"].status == "regression"


def test_a_load_at_the_core_count_is_not_loaded():
    found = _status(_record(load=2.0), _record(scale=2.0, load=2.0))
    assert found["time_s"].status == "regression"


def test_a_broken_wall_value_on_a_loaded_run_still_fails():
    found = _status(_record(load=18.0), _record(load=18.0, wall_value=math.nan))
    assert found["time_s"].status == "regression" and "not finite" in found["time_s"].why


def test_the_run_load_is_used_where_points_have_none():
    base, cur = _record(), _record(scale=2.0)
    for rec in (base, cur):
        for r in rec.records:
            del r["load_start"], r["load_end"]
    cur.environment.noise = {"cpu_count": 2, "load_start": [9.0, 5.0, 3.0], "load_end": None}
    (entry,) = [e for e in gate._suite_entries(cur) if e.metric == "time_s"]
    assert entry.load == 9.0 and entry.cores == 2 and entry.loaded
    assert _status(base, cur)["time_s"].status == "not-gated"


def test_records_without_noise_context_are_gated_as_before():
    base, cur = _record(), _record(scale=2.0)
    for rec in (base, cur):
        rec.environment.noise = None
    assert _status(base, cur)["time_s"].status == "regression"
