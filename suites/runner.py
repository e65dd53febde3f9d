"""Runs a suite's grid: warm-up, calibrated repeats, median and spread per metric.

Timing follows timeit/asv: one *sample* is the mean time of ``number`` back-to-back calls, with
``number`` chosen so that a sample lasts at least ``min_sample_s`` (timer resolution and call
overhead then stay small); ``repeats`` samples give the median and spread. In a distributed
world all ranks start a sample together (barrier) and a sample's time is the slowest rank's.
Each sample also keeps the CPU time of its calls (``time.process_time``: ``cpu_time_s``), and
each point the 1-minute load average before and after its samples (``load_start``,
``load_end``), so a reader can tell a slow machine from a loaded one. A point's ``slowdown``
(suites/base.py) makes each sample do that fraction more of the suite's own calls: a known
regression, injected without touching what the suite measures.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from moe_repro.components.provenance import produced
from moe_repro.suites.base import Suite
from moe_repro.records.stats import summarize
from moe_repro.runtime.device import bind, resolve_device
from moe_repro.runtime.timing import peak_memory_bytes, reset_peak_memory, timer_for


@dataclass
class RunConfig:
    warmup: int = 1
    repeats: int = 5
    min_sample_s: float = 0.01
    max_number: int = 10_000
    check: bool = True
    timeout_s: float = 300.0
    # Single calls timed to choose ``number`` (their median): 1 by default; more where one call
    # can hit a scheduler stall several times its own length (a shared machine's small worlds).
    number_from: int = 1


# The clocks a sample reads besides the device timer (tests inject their own).
CPU_CLOCK: Callable[[], float] = time.process_time
WALL_CLOCK: Callable[[], float] = time.perf_counter


def spin(fraction: float, wall_s: float, cpu_s: float, wall=None, cpu=None) -> None:
    """Busy-wait until at least ``fraction`` of ``wall_s`` more wall time and of ``cpu_s`` more
    CPU time have passed: both clocks of a sample grow by that fraction (the slowdown knob)."""
    wall, cpu = wall or WALL_CLOCK, cpu or CPU_CLOCK
    w0, c0 = wall(), cpu()
    x = 0
    while wall() - w0 < fraction * wall_s or cpu() - c0 < fraction * cpu_s:
        for i in range(200):
            x += i * i


def timed_with_cpu(
    suite: Suite, state: Any, number: int, ctx, timer, slowdown: float = 0.0
) -> tuple[float, float]:
    """Mean seconds of one of ``number`` back-to-back calls, by ``timer`` (CUDA events on a GPU:
    the host clock would time the kernel launches only), and their mean CPU time; a world's
    times are its slowest rank's. ``slowdown`` > 0 makes the sample do that fraction more of
    the same work: ``slowdown * number`` more calls inside the timed region (the fraction of a
    call left over by :func:`spin`, from the calls' own mean wall and CPU time), so both
    clocks grow by it under whatever load the machine has, as a real regression's would."""
    if ctx is not None:
        ctx.barrier()
    timer.start()
    c0, w0 = CPU_CLOCK(), WALL_CLOCK()
    for _ in range(number):
        suite.run(state)
    if slowdown > 0:
        extra = slowdown * number
        wall_per_call = (WALL_CLOCK() - w0) / number
        cpu_per_call = (CPU_CLOCK() - c0) / number
        for _ in range(int(extra)):
            suite.run(state)
        if extra % 1:
            spin(extra % 1, wall_per_call, cpu_per_call)
    elapsed = timer.stop() / number
    cpu = (CPU_CLOCK() - c0) / number
    if ctx is None:
        return elapsed, cpu
    return ctx.all_reduce_max(elapsed), ctx.all_reduce_max(cpu)


def timed(suite: Suite, state: Any, number: int, ctx, timer) -> float:
    """Mean seconds of one of ``number`` back-to-back calls (:func:`timed_with_cpu`'s wall time);
    a world's time is its slowest rank's."""
    return timed_with_cpu(suite, state, number, ctx, timer)[0]


def _load1() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def summarized(samples: dict[str, list[float]]) -> dict[str, float]:
    """Each metric's median, spread (iqr), min and max over its samples: a record's numbers."""
    out = {}
    for name, xs in samples.items():
        s = summarize(xs)
        out.update(
            {
                name: s["median"],
                f"{name}_iqr": s["iqr"],
                f"{name}_min": s["min"],
                f"{name}_max": s["max"],
            }
        )
    return out


def prepare_point(suite: Suite, params: dict, config: RunConfig, ctx=None, timer=None) -> tuple:
    """Everything before a point's timed samples: device, setup, the correctness check, the
    warm-up calls and ``number`` (calls per sample, so that a sample lasts min_sample_s).
    ``timer`` is the device's (runtime/timing.timer_for) unless given (a test's fake clock).
    Returns (state, record so far, timer, number, device)."""
    produced("measured")
    device = resolve_device(params.get("device", "auto"), ctx)
    bind(device)
    timer = timer or timer_for(device)
    state = suite.setup({**params, "device": str(device)}, ctx)
    record: dict[str, Any] = {"suite": suite.name, **params}
    if config.check and suite.check is not None:
        wrong = int(suite.check(state))
        if ctx is not None:
            wrong = int(ctx.all_reduce_max(float(wrong)))
        record.update(wrong=wrong, correct=wrong == 0)
    for _ in range(config.warmup):
        timed(suite, state, 1, ctx, timer)
    single = sorted(timed(suite, state, 1, ctx, timer) for _ in range(config.number_from))[
        (config.number_from - 1) // 2
    ]
    number = (
        1
        if single <= 0
        else int(min(config.max_number, max(1, math.ceil(config.min_sample_s / single))))
    )
    return state, record, timer, number, device


def run_point(suite: Suite, params: dict, config: RunConfig, ctx=None) -> dict:
    """Measure one grid point; returns one flat record.

    The device comes from the runtime's one rule (runtime/device.py): in a world the backend
    and local rank decide, alone the point's ``device`` (auto by default). The suite's setup
    sees it as ``params["device"]`` (e.g. ``cuda:1``); the record keeps the asked-for value and
    adds ``device_used`` and the ``clock`` that timed it."""
    state, record, timer, number, device = prepare_point(suite, params, config, ctx)
    samples: dict[str, list[float]] = {"time_s": []}
    cpu_times: list[float] = []
    slowdown = float(params.get("slowdown", 0.0) or 0.0)
    reset_peak_memory(device)
    load_start = _load1()
    for _ in range(config.repeats):
        t, cpu = timed_with_cpu(suite, state, number, ctx, timer, slowdown)
        samples["time_s"].append(t)
        cpu_times.append(cpu)
        for name, value in (suite.derive(params, state, t) if suite.derive else {}).items():
            samples.setdefault(name, []).append(float(value))
    samples["cpu_time_s"] = cpu_times  # after the derived metrics: the suite's own come first
    peak = peak_memory_bytes(device)  # CUDA: the allocator's high-water mark over the samples
    record.update(load_start=load_start, load_end=_load1())
    record.update(
        summarized(samples),
        repeats=config.repeats,
        number=number,
        samples=samples,
        device_used=str(device),
        clock=timer.clock,
    )
    if peak is not None:
        record["cuda_max_allocated_bytes"] = int(
            ctx.all_reduce_max(float(peak)) if ctx is not None else peak
        )
    if ctx is not None:
        record.update(world_size=ctx.world_size, ranks_per_node=ctx.ranks_per_node)
    return record


def simulated_record(suite: Suite, params: dict) -> dict:
    """A grid point predicted by ``suite.simulate``: same keys as a measured record, exact
    values (no spread), ``simulated: true``."""
    metrics = suite.simulate(params)
    record: dict[str, Any] = {"suite": suite.name, **params}
    for name, value in metrics.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            record.update(
                {name: value, f"{name}_iqr": 0.0, f"{name}_min": value, f"{name}_max": value}
            )
        else:
            record[name] = value
    record.update(repeats=1, number=1, samples={}, simulated=True)
    return record


def run_points_on_rank(ctx, suite: str, points: list[dict], config: dict, out_dir: str) -> int:
    """Launcher target: run a world's grid points on this rank (every rank runs all of them);
    rank 0 writes each finished record to ``out_dir/<index>.json`` at once (the records are
    world-reduced: every rank holds the same numbers), so the parent can report and keep each
    point while the world still runs."""
    from moe_repro.records.atomic import atomic_write_json
    from moe_repro.suites import all_suites

    s, cfg = all_suites()[suite], RunConfig(**config)
    for i, params in enumerate(points):
        record = run_point(s, params, cfg, ctx)
        if ctx.rank == 0:
            atomic_write_json(Path(out_dir) / f"{i:06d}.json", record)
    return len(points)


class _PointReader(threading.Thread):
    """Passes ``out_dir/<index>.json`` to ``deliver`` in index order as the files appear."""

    def __init__(self, out_dir: Path, total: int, deliver: Callable[[dict], None]):
        super().__init__(name="point-reader", daemon=True)
        self.out_dir, self.total, self.deliver = out_dir, total, deliver
        self.count = 0
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def _drain(self) -> None:
        with self._lock:
            while self.count < self.total:
                path = self.out_dir / f"{self.count:06d}.json"
                if not path.exists():
                    return
                record = json.loads(path.read_text())
                self.count += 1
                self.deliver(record)

    def run(self) -> None:
        while not self._halt.wait(0.2):
            self._drain()

    def finish(self) -> None:
        self._halt.set()
        self.join()
        self._drain()


def world_key(suite: Suite, params: dict) -> tuple:
    return tuple(params[k] for k in suite.world_params)


def measure(
    suite: Suite | str,
    grid: list[dict],
    config: RunConfig | None = None,
    progress: Callable[[int, int, dict], None] | None = None,
    done: Callable[[dict], None] | None = None,
    derive: bool = False,
) -> list[dict]:
    """The one way to run a suite (``repro bench``, the reproductions, ``repro calibrate`` and the
    all-to-all validation all come here): every grid point measured by :func:`run_point` (warm-up,
    calibrated repeats, median and spread), simulated by the suite's simulator where the point
    says so, or launched one world per distinct world parameters for a multi-process suite.

    ``suite``: a Suite or its name. ``grid``: full parameter dicts; ``derive=True`` adds the
    parameters the suite derives from a point (e.g. ranks = nodes x gpus_per_node), as the
    suite's own grid does (points written by code rather than made by ``Suite.grid``).
    ``config``: RunConfig() by default. ``progress(i, n, point)`` before a point or world,
    ``done(record)`` as each record finishes."""
    from moe_repro.records.environment import mark_start

    mark_start()  # the load average and CPU time as the run starts (records/environment.py)
    if isinstance(suite, str):
        from moe_repro.suites import get_suite

        suite = get_suite(suite)
    if derive and suite.derived_params is not None:
        grid = [{**p, **suite.derived_params(p)} for p in grid]
    config = config if config is not None else RunConfig()
    if suite.measure_grid is not None:
        own = suite.measure_grid(grid, config, progress, done)
        if own is not None:
            return own
    records: list[dict] = []
    if suite.simulate is not None and any(p.get("simulated") for p in grid):
        for i, params in enumerate(p for p in grid if p.get("simulated")):
            if progress:
                progress(i, len(grid), params)
            rec = simulated_record(suite, params)
            records.append(rec)
            if done:
                done(rec)
        grid = [p for p in grid if not p.get("simulated")]
        if not grid:
            return records
    if not suite.distributed:
        for i, params in enumerate(grid):
            if progress:
                progress(i, len(grid), params)
            rec = run_point(suite, params, config)
            records.append(rec)
            if done:
                done(rec)
        return records

    from moe_repro.runtime import signals
    from moe_repro.runtime.launch import init_launched_world, launched_world_size, run_ranks
    from moe_repro.runtime.workdirs import POINTS_PREFIX, make_workdir

    external = launched_world_size()
    if external:  # started by torchrun / srun / mpirun: this process is one rank of the world
        points = [dict(p, ranks=external) for p in grid]
        points = [p for i, p in enumerate(points) if p not in points[:i]]
        backend = str(points[0].get("backend", "gloo"))  # one world, one backend
        points = [p for p in points if p.get("backend", "gloo") == backend]
        ctx = init_launched_world(backend)
        for i, params in enumerate(points):
            if progress and ctx.rank == 0:
                progress(i, len(points), params)
            rec = run_point(suite, params, config, ctx)
            records.append(rec)
            if done and ctx.rank == 0:
                done(rec)
        return records if ctx.rank == 0 else []  # only rank 0 reports

    worlds: dict[tuple, list[dict]] = {}
    for params in grid:
        worlds.setdefault(world_key(suite, params), []).append(params)
    i = 0
    for points in worlds.values():
        first = points[0]
        if progress:
            progress(i, len(grid), {k: first[k] for k in suite.world_params})

        def deliver(rec: dict) -> None:
            records.append(rec)
            if done:
                done(rec)

        # one launch per world (starting ranks costs seconds); its points come back one by one.
        # The folder is a registered work directory (runtime/workdirs.py): it names its owner,
        # so the launch's janitor removes it if this process is SIGKILLed.
        out_dir = None
        try:
            # A signal held off here is delivered as the block ends: inside the try, so the
            # folder it created is removed below.
            with signals.deferred():  # never without its owner file
                out_dir = make_workdir(POINTS_PREFIX)
            reader = _PointReader(out_dir, len(points), deliver)
            reader.start()
            try:
                run_ranks(
                    "moe_repro.suites.runner:run_points_on_rank",
                    {
                        "suite": suite.name,
                        "points": points,
                        "config": asdict(config),
                        "out_dir": str(out_dir),
                    },
                    world_size=int(first["ranks"]),
                    ranks_per_node=int(first.get("ranks_per_node") or first["ranks"]),
                    backend=str(first.get("backend", "gloo")),
                    timeout_s=config.timeout_s,
                )
            finally:
                reader.finish()  # the points that finished, even when the world failed
                if reader.count:
                    produced("measured")  # on the ranks just launched, not in this process
        finally:
            if out_dir is not None:
                with signals.deferred():  # a second signal must not cut the removal short
                    shutil.rmtree(out_dir, ignore_errors=True)
        if reader.count != len(points):
            raise RuntimeError(
                f"{suite.name}: the world returned {reader.count} of {len(points)} points"
            )
        i += len(points)
    return records


def suite_record(
    suite: Suite, records: list[dict], interrupted: bool = False, error: str | None = None
):
    """The stored record of one suite run (records/record.py, kind ``suite``): the suite's
    declaration (parameters, metrics, what a table shows) beside its flat records."""
    from moe_repro.records.environment import collect_environment
    from moe_repro.records.record import SuiteRecord

    return SuiteRecord(
        suite=suite.name,
        description=suite.description,
        params=list(suite.params),
        metrics=[asdict(m) for m in suite.all_metrics],
        records=records,
        table_keys=list(suite.table_keys),
        table_metrics=list(suite.table_metrics),
        interrupted=interrupted,
        error=error,
        environment=collect_environment(),
        summary=list(suite.summary(records)) if suite.summary and records else [],
    )
