"""A results store's histories and the change points in them (``repro gate --history``).

Each stored run of a suite or reproduction gives, per grid point or cell, one value of each
metric (records/gate.py reads them, so keys and directions are the gate's); in time order these
are a history, and records/changepoints.py finds its steps (asv's method). A step to a worse
level that the newest runs still show is an open regression: the gate fails on it.

Only metrics with a better direction are judged (a step of a metric without one is neither a
regression nor an improvement); ``correct`` is left out (a broken check is the direct gate's).
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


@dataclass
class HistoryFlag:
    series: Series
    step: Step
    open: bool  # still worse at the newest run (a regression not undone)

    @property
    def run(self) -> str:
        """The stored run where the new level starts."""
        return self.series.runs[self.step.index]

    @property
    def commit(self) -> str | None:
        return self.series.commits[self.step.index]


def series_of(store, kind: str, name: str) -> list[Series]:
    """Every history of one stored suite or reproduction, keyed as the gate keys them."""
    from moe_repro.records.gate import ENTRIES, GateInputError

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
                s.timestamps, s.values = [""] * n, [None] * n
            s.runs.append(path.name)
            s.commits.append(record.environment.git_commit)
            s.timestamps.append(record.timestamp)
            s.values.append(e.value)
        n += 1
        for s in found.values():  # runs without this point or metric: no number here
            while len(s.values) < n:
                s.runs.append(path.name)
                s.commits.append(record.environment.git_commit)
                s.timestamps.append(record.timestamp)
                s.values.append(None)
    return list(found.values())


def flag_series(series: Series, min_ratio: float = DEFAULT_MIN_RATIO) -> list[HistoryFlag]:
    """The steps of one history, each marked open or not."""
    higher = series.better == "higher"
    steps = detect_steps(series.values, higher_is_better=higher, min_ratio=min_ratio)
    still = open_regressions(series.values, steps, higher_is_better=higher, min_ratio=min_ratio)
    return [HistoryFlag(series, step, step in still) for step in steps]


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
