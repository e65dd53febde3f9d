"""A results store's histories and the change points in them (``repro gate --history``).

Each stored run of a suite or reproduction gives, per grid point or cell, one value of each
metric (records/gate.py reads them, so keys and directions are the gate's); in time order these
are a history, and records/changepoints.py finds its steps (asv's method). A step to a worse
level that the newest runs still show is an open regression: the gate fails on it.

Only metrics with a better direction are judged (a step of a metric without one is neither a
regression nor an improvement); ``correct`` is left out (a broken check is the direct gate's).
As in the gate, a step of a wall-clock metric next to a run stored at a load above its core
count is reported but does not fail (``loaded``): such runs' wall times moved by several times
between runs of the same code (README, "The gate's error rate").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from moe_repro.records.changepoints import (
    DEFAULT_MIN_RATIO,
    Step,
    detect_steps,
    open_regressions,
)
from moe_repro.records.record import KINDS


@dataclass
class Series:
    kind: str  # reproduction | suite
    result: str  # reproduction id or suite name
    key: str  # a grid point ("k=v k=v") or a cell ("row | column")
    metric: str
    unit: str
    better: str  # higher | lower
    runs: list[str] = field(default_factory=list)  # stored file names, oldest first
    commits: list[str | None] = field(default_factory=list)
    timestamps: list[str] = field(default_factory=list)
    values: list[float | None] = field(default_factory=list)
    loaded: list[bool] = field(default_factory=list)  # the run's load exceeded its cores


@dataclass
class HistoryFlag:
    series: Series
    step: Step
    open: bool  # still worse at the newest run (a regression not undone)
    loaded: bool = False  # a wall-clock step beside a run at a load above its cores

    @property
    def fails(self) -> bool:
        """Whether the gate fails on it: an open regression not explained by the load."""
        return self.open and not self.loaded

    @property
    def run(self) -> str:
        """The stored run where the new level starts."""
        return self.series.runs[self.step.index]

    @property
    def commit(self) -> str | None:
        return self.series.commits[self.step.index]


def series_of(store, kind: str, name: str) -> list[Series]:
    """Every history of one stored suite or reproduction, keyed as the gate keys them."""
    from moe_repro.records.gate import CPU_METRICS, ENTRIES, GateInputError

    found: dict[tuple[str, str], Series] = {}
    paths = store.history(kind, name)
    n = 0
    for path in paths:
        record = store.read(path)
        if record is None:
            continue
        try:
            entries = ENTRIES[record.kind](record)
        except GateInputError:
            continue  # a run with a malformed metric has no point in the history
        for e in entries:
            if e.better not in ("higher", "lower") or e.metric == "correct":
                continue
            s = found.get((e.key, e.metric))
            if s is None:
                s = found[(e.key, e.metric)] = Series(kind, name, e.key, e.metric, e.unit, e.better)
                # earlier runs without this metric are points with no number
                s.runs, s.commits = [""] * n, [None] * n
                s.timestamps, s.values, s.loaded = [""] * n, [None] * n, [False] * n
            s.runs.append(path.name)
            s.commits.append(record.environment.git_commit)
            s.timestamps.append(record.timestamp)
            s.values.append(e.value)
            s.loaded.append(e.kind == "measured" and e.metric not in CPU_METRICS and e.loaded)
        n += 1
        for s in found.values():  # runs without this point or metric: no number here
            while len(s.values) < n:
                s.runs.append(path.name)
                s.commits.append(record.environment.git_commit)
                s.timestamps.append(record.timestamp)
                s.values.append(None)
                s.loaded.append(False)
    return list(found.values())


def flag_series(series: Series, min_ratio: float = DEFAULT_MIN_RATIO) -> list[HistoryFlag]:
    """The steps of one history, each marked open or not."""
    higher = series.better == "higher"
    steps = detect_steps(series.values, higher_is_better=higher, min_ratio=min_ratio)
    still = open_regressions(series.values, steps, higher_is_better=higher, min_ratio=min_ratio)
    return [
        HistoryFlag(series, step, step in still, _beside_load(series, step.index)) for step in steps
    ]


def _beside_load(series: Series, index: int) -> bool:
    """Whether the run where the step starts, or the last run with a number before it, was
    loaded (for a wall-clock metric: Series.loaded)."""
    before = [i for i in range(index) if series.values[i] is not None]
    return series.loaded[index] or bool(before and series.loaded[before[-1]])


def flag_store(
    store, min_ratio: float = DEFAULT_MIN_RATIO, kinds: tuple[str, ...] = KINDS
) -> list[HistoryFlag]:
    """The steps of every history in a results store, suites and reproductions by name."""
    flags = []
    for kind in kinds:
        for name in store.names(kind):
            for series in series_of(store, kind, name):
                flags.extend(flag_series(series, min_ratio))
    return flags
