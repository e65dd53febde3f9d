"""Run a benchmark suite's grid from inside a reproduction (real measurements on this machine).

:func:`run_grid` is the one way a reproduction measures, so it is also where a measured run
shows its progress and keeps what finished. Inside :func:`watching` (``repro run`` opens it
around each reproduction), every finished grid point

- prints a progress line on the watch's stream: points done / total, time elapsed and an
  estimate of the time left (a line rewritten in place on a terminal, plain lines otherwise);
- is written to the results store as a suite record (``ROOT/suites/<suite>/``), rewritten as
  each point finishes and marked ``interrupted`` until the grid completes, so a run that is
  interrupted or times out keeps every point it finished.

A multi-process suite hands each world's points back one by one as they finish
(suites/runner.py), so progress and storage are per point there too.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TextIO


@dataclass
class Watch:
    """What ``repro run`` wants from the grids a reproduction measures: progress lines on
    ``stream`` (None: none) prefixed with ``label``, and finished points saved in ``store``
    (a results store; None: not saved), the run's ``command`` recorded with them."""

    label: str
    stream: TextIO | None = None
    store: Any = None
    command: list[str] | None = None
    saved: list[Path] = field(default_factory=list)  # suite records written during the run
    started: float = field(default_factory=time.monotonic)
    last_line: float = field(default_factory=time.monotonic)  # when progress was last shown
    inline: bool = False  # a progress line is open (being rewritten) on a terminal
    status: str | None = None  # the grid being measured: "moe-layer 3/29 points"


_WATCH: Watch | None = None
TICK_S = 30.0  # a computation with no grid points to count says it is alive this often


@contextmanager
def watching(watch: Watch):
    """Report progress and keep finished points of every grid measured inside this block. Where
    nothing has been reported for TICK_S (a training run, a long simulation: no grid points to
    count), a line says how long the reproduction has been running."""
    global _WATCH
    previous, _WATCH = _WATCH, watch
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(1.0):
            now = time.monotonic()
            if now - watch.last_line >= TICK_S:
                _show(watch, f"{watch.status or 'running'}, {clock(now - watch.started)} elapsed")

    ticker = threading.Thread(target=tick, name="progress-tick", daemon=True)
    if watch.stream is not None:
        ticker.start()
    try:
        yield watch
    finally:
        stop.set()
        if ticker.is_alive():
            ticker.join()
        if watch.inline:
            _show(watch, "", end=True)
        _WATCH = previous


STEP_LINE_S = 5.0  # off a terminal, a step counter prints a line at most this often


def step_progress(what: str) -> Callable[[int, int], None]:
    """A callback ``(done, total)`` for a computation that counts its own steps (a training run):
    progress lines like a grid's ("training 40/200 steps, 0:31 elapsed, about 2:04 left") on the
    watch ``repro run`` opened; does nothing outside one."""
    watch, start = _WATCH, time.monotonic()

    def report(done: int, total: int) -> None:
        if watch is None:
            return
        now = time.monotonic()
        watch.status = f"{what} {done}/{total} steps"
        finished = done >= total
        if not (finished or _is_terminal(watch.stream) or now - watch.last_line >= STEP_LINE_S):
            return
        elapsed = now - start
        left = elapsed / done * (total - done) if done else 0.0
        _show(
            watch,
            f"{watch.status}, {clock(elapsed)} elapsed"
            + ("" if finished else f", about {clock(left)} left"),
            end=finished,
        )

    return report


def run_grid(
    suite_name: str, points: list[dict], repeats: int, timeout_s: float = 600.0, check: bool = True
) -> list[dict]:
    """Records of ``points`` (full parameter dicts) measured by suite ``suite_name`` (find one
    with :func:`pick`). Multi-process suites are launched one world per distinct world
    parameters. Params a suite derives from a point (e.g. ranks = nodes x gpus_per_node) are
    added here, as the suite's own grid does. ``timeout_s`` bounds one launched world."""
    from moe_repro.suites import all_suites
    from moe_repro.suites.runner import RunConfig, measure

    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    suite = all_suites()[suite_name]
    config = RunConfig(
        warmup=1, repeats=repeats, min_sample_s=0.01, check=check, timeout_s=timeout_s
    )
    keeper = _Keeper(_WATCH, suite, len(points))
    try:  # the runner's one entry point; the keeper stores and reports each finished point
        records = measure(suite, points, config, done=keeper.add, derive=True)
    except BaseException as e:  # interrupted, timed out, or a failing point: keep what finished
        keeper.close(error=f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
        raise
    keeper.close()
    return records


class _Keeper:
    """One grid's progress lines and its suite record in the store, updated per point."""

    def __init__(self, watch: Watch | None, suite, total: int):
        self.watch, self.suite, self.total = watch, suite, total
        self.records: list[dict] = []
        self.start = time.monotonic()
        self.path: Path | None = None
        self.environment = None
        if watch is not None:
            watch.status = f"{suite.name} 0/{total} points"
            self._show(f"{watch.status} (measuring on this machine)")

    def add(self, record: dict) -> None:
        self.records.append(record)
        if self.watch is None:
            return
        self._save(interrupted=len(self.records) < self.total)
        done, elapsed = len(self.records), time.monotonic() - self.start
        left = elapsed / done * (self.total - done)
        self.watch.status = f"{self.suite.name} {done}/{self.total} points"
        self._show(
            f"{self.suite.name} {done}/{self.total} points, {clock(elapsed)} elapsed"
            + (f", about {clock(left)} left" if done < self.total else ""),
            end=done == self.total,
        )

    def close(self, error: str | None = None) -> None:
        if self.watch is None:
            return
        self.watch.status = None
        if error is not None:
            if self.records:
                self._save(interrupted=True, error=error)
            kept = (
                f"; the {len(self.records)} finished are stored in {self.path}" if self.path else ""
            )
            self._show(
                f"{self.suite.name} stopped after {len(self.records)}/{self.total} points "
                f"({error}){kept}",
                end=True,
            )
        elif self.watch.inline:
            self._show("", end=True)

    def _save(self, interrupted: bool, error: str | None = None) -> None:
        from moe_repro.records.atomic import atomic_write_json
        from moe_repro.records.environment import collect_environment
        from moe_repro.records.record import SuiteRecord, dump

        store = self.watch.store
        if store is None:
            return
        if self.environment is None:  # once per grid: the file name keeps its start time
            self.environment = collect_environment(self.watch.command)
        s = self.suite
        record = SuiteRecord(
            suite=s.name,
            description=s.description,
            params=list(s.params),
            metrics=[_asdict(m) for m in s.all_metrics],
            records=self.records,
            table_keys=list(s.table_keys),
            table_metrics=list(s.table_metrics),
            interrupted=interrupted,
            error=error,
            environment=self.environment,
        )
        if self.path is None:
            self.path = store.save(record)
            self.watch.saved.append(self.path)
        else:
            atomic_write_json(self.path, dump(record))  # the same run, more points finished

    def _show(self, text: str, end: bool = False) -> None:
        if self.watch.stream is not None:
            _show(self.watch, text, end)


_LOCK = threading.Lock()


def _show(watch: Watch, text: str, end: bool = False) -> None:
    """One progress line for ``watch``: rewritten in place on a terminal (a newline when
    ``end``), a plain line otherwise."""
    stream = watch.stream
    if stream is None:
        return
    line = f"{watch.label}: {text}" if text else ""
    with _LOCK:
        if _is_terminal(stream):
            # rewrite the open line; end=True with no text closes it, keeping what it says
            stream.write(("\r\x1b[K" + line if line else "") + ("\n" if end else ""))
            watch.inline = not end
        elif line:
            stream.write(line + "\n")
        stream.flush()
        watch.last_line = time.monotonic()


def _asdict(obj) -> dict:
    from dataclasses import asdict

    return asdict(obj)


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def clock(seconds: float) -> str:
    """'1:05' for 65 s, '1:01:05' for an hour and more."""
    s = int(round(seconds))
    h, m = divmod(s // 60, 60)
    return f"{h}:{m:02d}:{s % 60:02d}" if h else f"{m}:{s % 60:02d}"


def device_words() -> str:
    """'cpu: <model>' or 'cuda: <GPU name>', the device these measurements ran on."""
    from moe_repro.records.environment import device_description

    d = device_description()
    return f"{d['device_type']}: {d['device']}"


def pick(records: list[dict], **match) -> dict:
    for r in records:
        if all(r.get(k) == v for k, v in match.items()):
            return r
    raise KeyError(f"no record with {match}")


def without_samples(records: list[dict]) -> list[dict]:
    """Records as stored in a reproduction's extra: medians and spreads, not the raw samples."""
    return [{k: v for k, v in r.items() if k != "samples"} for r in records]


def csv_param(text, kind=str) -> list:
    """'a,b,c' (a reproduction parameter) -> [kind(a), kind(b), kind(c)]."""
    return [kind(t.strip()) for t in str(text).split(",") if t.strip()]
