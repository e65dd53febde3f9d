"""CPU time beside wall time, the slowdown knob and the noise context stored with a run; timing
logic on fake clocks (tests/conftest.py), never on the wall clock."""

from __future__ import annotations

import pytest

from moe_repro.records import environment
from moe_repro.runtime.timing import HostTimer
from moe_repro.suites import runner
from moe_repro.suites.base import Suite


class TickClock:
    """Moves by ``tick`` at every read: a busy loop over it ends."""

    def __init__(self, tick: float):
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def test_spin_grows_both_clocks_by_the_fraction():
    wall, cpu = TickClock(2.0**-10), TickClock(2.0**-12)
    w0, c0 = wall.now, cpu.now
    runner.spin(0.25, 1.0, 0.5, wall=wall, cpu=cpu)
    # the CPU clock runs a quarter as fast: its target (0.125 s) decides, and the wall overshoots
    assert 0.125 <= cpu.now - c0 <= 0.125 + 4 * 2.0**-12
    assert wall.now - w0 >= 0.25
    wall, cpu = TickClock(2.0**-10), TickClock(2.0**-10)
    runner.spin(0.0, 1.0, 1.0, wall=wall, cpu=cpu)
    assert wall.now <= 4 * 2.0**-10  # nothing to add: no spinning


@pytest.fixture
def clocks(monkeypatch, fake_clock):
    """Wall (fake_clock, also the device timer's) and CPU fake clocks patched into the runner;
    the spin moves both by its fraction, as a real spin does on an idle core."""
    from conftest import FakeClock

    cpu = FakeClock(0.0)
    monkeypatch.setattr(runner, "WALL_CLOCK", fake_clock)
    monkeypatch.setattr(runner, "CPU_CLOCK", cpu)
    monkeypatch.setattr(runner, "timer_for", lambda device: HostTimer(fake_clock))

    def spin(fraction, wall_s, cpu_s):
        fake_clock.advance(fraction * wall_s)
        cpu.advance(fraction * cpu_s)

    monkeypatch.setattr(runner, "spin", spin)
    return fake_clock, cpu


def _suite(wall, cpu, call_wall, call_cpu):
    def run(state):
        wall.advance(call_wall)
        cpu.advance(call_cpu)

    return Suite(name="ticks", params={"x": [1]}, setup=lambda p, ctx: {}, run=run)


@pytest.mark.parametrize("slowdown", [0.0, 0.25, 0.1, 0.375])
def test_a_point_keeps_cpu_time_and_the_slowdown_grows_both(clocks, slowdown):
    wall, cpu = clocks
    call_wall, call_cpu = 2.0**-8, 2.0**-10  # a quarter of the wall time on the CPU
    suite = _suite(wall, cpu, call_wall, call_cpu)
    config = runner.RunConfig(warmup=1, repeats=4, min_sample_s=4 * call_wall, check=False)
    record = runner.run_point(suite, {"x": 1, "slowdown": slowdown}, config)
    assert record["number"] == 4
    # whole extra calls (0.25 of 4: one), the rest of a call spun (0.1 of 4: 0.4 of one)
    assert record["samples"]["time_s"] == pytest.approx([call_wall * (1 + slowdown)] * 4)
    assert record["samples"]["cpu_time_s"] == pytest.approx([call_cpu * (1 + slowdown)] * 4)
    assert record["cpu_time_s"] == pytest.approx(call_cpu * (1 + slowdown))
    assert record["slowdown"] == slowdown  # the record says it was slowed
    assert "load_start" in record and "load_end" in record


def test_slowdown_is_a_parameter_of_every_suite_and_checked():
    from moe_repro.suites import get_suite

    gemm = get_suite("gemm")
    overrides = gemm.parse_overrides(["n=64", "slowdown=0,0.1"])
    assert overrides["slowdown"] == [0.0, 0.1]
    assert [p["slowdown"] for p in gemm.grid(overrides)] == [0.0, 0.1]
    for bad in (["slowdown=-0.5"], ["slowdown=11"]):
        with pytest.raises(ValueError, match="slowdown must be"):
            gemm.grid(gemm.parse_overrides(bad))
    with pytest.raises(ValueError, match="cannot read"):
        gemm.parse_overrides(["slowdown=fast"])


def test_the_slowdown_is_not_part_of_a_points_key_and_cpu_time_is_gated():
    from moe_repro.records.gate import _suite_entries
    from moe_repro.suites import get_suite
    from moe_repro.suites.runner import suite_record

    gemm = get_suite("gemm")
    point = {"n": 64, "dtype": "float32", "device": "auto", "slowdown": 0.1}
    rec = {**point, "suite": "gemm", "time_s": 1.0, "cpu_time_s": 0.5, "samples": {}}
    record = suite_record(gemm, [rec])
    entries = _suite_entries(record)
    assert {e.key for e in entries} == {"n=64 dtype=float32 device=auto"}
    cpu = [e for e in entries if e.metric == "cpu_time_s"]
    assert cpu and cpu[0].better == "lower" and cpu[0].kind == "measured"


def test_noise_context_flags_a_load_above_the_core_count(monkeypatch):
    monkeypatch.setattr(environment.os, "cpu_count", lambda: 2)
    loads = iter([(1.0, 1.0, 1.0), (3.5, 2.0, 1.0)])
    monkeypatch.setattr(environment.os, "getloadavg", lambda: next(loads))
    environment.mark_start(force=True)
    noise = environment.noise_context()
    assert noise["load_start"] == [1.0, 1.0, 1.0] and noise["load_end"] == [3.5, 2.0, 1.0]
    assert noise["loaded"] is True and noise["cpu_count"] == 2
    monkeypatch.setattr(environment.os, "getloadavg", lambda: (1.5, 1.0, 1.0))
    environment.mark_start(force=True)
    assert environment.noise_context()["loaded"] is False


def test_noise_context_without_a_load_average(monkeypatch):
    def missing():
        raise OSError("no load average here")

    monkeypatch.setattr(environment.os, "getloadavg", missing)
    environment.mark_start(force=True)
    noise = environment.noise_context()
    assert noise["load_start"] is None and noise["loaded"] is None
    assert noise["cpu_time_s"] >= 0
    environment.mark_start(force=True)


def test_every_environment_carries_the_noise_context():
    env = environment.collect_environment(["repro", "test"])
    assert set(env["noise"]) >= {"load_start", "load_end", "cpu_time_s", "cpu_freq_mhz", "loaded"}
