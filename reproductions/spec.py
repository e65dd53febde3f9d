"""The reproduction spec format: a paper's published values as data, our values, a verdict per cell.

A reproduction module defines ``REPRODUCTION = Reproduction(id=..., ...)``; the id's entry in
:mod:`moe_repro.catalog` says what it is (title, paper element, how, description). Its
``compute`` function returns a :class:`Result` whose cells it builds with :func:`compare`, which
looks up the paper's value for the cell (never used to compute ``ours``) and decides the verdict:

- ``not-reproduced``: we have no number (``ours`` is None); the note says why.
- ``no-paper-value``: the paper printed nothing for this cell.
- ``match``: within tolerance of the paper's value.
- ``deviates``: outside it; a ``note`` says why where the cause is known.

Tolerance defaults to the printed precision: a value printed as ``1.21`` covers [1.205, 1.215],
so ``ours`` matches if it lies within half a unit of the last printed digit (plus an optional
relative slack). This is the tightest honest test of a rounded table.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from typing import Any, Callable

from moe_repro import catalog
from moe_repro.catalog import HOW
from moe_repro.records.record import VERDICTS  # one list of verdicts: the record schema's



@dataclass(frozen=True)
class PaperValue:
    """One published number, as printed."""

    row: str
    column: str
    printed: str  # exactly as printed, e.g. "1.21", "2,057.6"
    unit: str  # unit as printed in the paper (header or caption)
    source: str  # where: "Table IV", "Fig. 8 (read off the plot)", ...

    @property
    def value(self) -> float:
        return float(self.printed.replace(",", "").lstrip("~"))

    @property
    def half_unit(self) -> float:
        """Half a unit of the last printed digit: the rounding interval of the printed value."""
        exponent = Decimal(self.printed.replace(",", "").lstrip("~")).as_tuple().exponent
        return 0.5 * 10.0 ** int(exponent)


@dataclass(frozen=True)
class Tolerance:
    """``match`` if |ours - paper| <= half a printed unit (if ``printed``) + rel |paper| + abs."""

    rel: float = 0.0
    abs: float = 0.0
    printed: bool = True

    def bound(self, paper: PaperValue) -> float:
        return (paper.half_unit if self.printed else 0.0) + self.rel * abs(paper.value) + self.abs

    def describe(self) -> str:
        parts = []
        if self.printed:
            parts.append("printed precision (half a unit of the last digit)")
        if self.rel:
            parts.append(f"{self.rel:.1%} relative")
        if self.abs:
            parts.append(f"{self.abs:g} absolute")
        return " + ".join(parts) or "exact"


@dataclass
class Cell:
    row: str
    column: str
    paper: float | None
    ours: float | None
    unit: str
    verdict: str
    note: str | None = None
    paper_printed: str | None = None
    paper_unit: str | None = None
    paper_source: str | None = None
    deviation: float | None = None  # (ours - paper) / paper

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items()}


def verdict_for(paper: PaperValue | None, ours: float | None, tolerance: Tolerance) -> str:
    if ours is None or (isinstance(ours, float) and math.isnan(ours)):
        return "not-reproduced"
    if paper is None:
        return "no-paper-value"
    return "match" if abs(ours - paper.value) <= tolerance.bound(paper) else "deviates"


@dataclass
class Figure:
    """Data for one figure; reports/ draws it with matplotlib (components never plot)."""

    name: str
    title: str
    xlabel: str
    ylabel: str
    series: list[dict]  # {"label", "x", "y", "kind": "ours"|"paper"}
    xscale: str = "linear"
    yscale: str = "linear"


@dataclass
class Result:
    cells: list[Cell]
    assumptions: list[str] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Reproduction:
    """How one reproduction computes; what it is (title, paper, element, how, description)
    lives in its catalog entry (moe_repro.catalog), looked up by ``id``."""

    id: str
    paper_values: list[PaperValue]
    compute: Callable[["Reproduction", dict], Result]
    tolerance: Tolerance = field(default_factory=Tolerance)
    defaults: dict[str, Any] = field(default_factory=dict)

    @property
    def entry(self) -> catalog.ReproductionEntry:
        """This id's catalog entry; an id missing from the catalog is a ValueError."""
        return catalog.reproduction(self.id)

    @property
    def title(self) -> str:
        return self.entry.title

    @property
    def paper(self) -> str:
        """Key of the paper: piper, xmoe, feplb, mop."""
        return self.entry.paper

    @property
    def element(self) -> str:
        """The paper element: "Table IV", "Fig. 8", ..."""
        return self.entry.element

    @property
    def how(self) -> str:
        """Letters of HOW joined with "+", e.g. "A", "R+S"."""
        return self.entry.how

    @property
    def description(self) -> str:
        return self.entry.description

    def paper_value(self, row: str, column: str) -> PaperValue | None:
        for pv in self.paper_values:
            if pv.row == row and pv.column == column:
                return pv
        return None

    def compare(self, row: str, column: str, ours: float | None, unit: str,
                note: str | None = None, tolerance: Tolerance | None = None) -> Cell:
        """Build the cell for (row, column): look up the paper's value and decide the verdict."""
        pv = self.paper_value(row, column)
        tol = tolerance or self.tolerance
        verdict = verdict_for(pv, ours, tol)
        deviation = None
        if pv is not None and ours is not None and pv.value != 0:
            deviation = (ours - pv.value) / pv.value
        return Cell(row=row, column=column, paper=None if pv is None else pv.value, ours=ours,
                    unit=unit, verdict=verdict, note=note,
                    paper_printed=None if pv is None else pv.printed,
                    paper_unit=None if pv is None else pv.unit,
                    paper_source=None if pv is None else pv.source, deviation=deviation)

    def run(self, params: dict | None = None) -> Result:
        merged = {**self.defaults, **(params or {})}
        unknown = set(params or {}) - set(self.defaults)
        if unknown:
            raise ValueError(f"{self.id}: unknown parameter(s) {', '.join(sorted(unknown))}; "
                             f"known: {', '.join(sorted(self.defaults)) or 'none'}")
        return self.compute(self, merged)


def summarize(cells: list[Cell]) -> dict[str, int]:
    counts = {v: 0 for v in VERDICTS}
    for c in cells:
        counts[c.verdict] += 1
    return counts


def status_of(cells: list[Cell | dict]) -> str:
    """One word for an index (records/record.py: status_of)."""
    from moe_repro.records.record import status_of as status_of_verdicts

    return status_of_verdicts({c["verdict"] if isinstance(c, dict) else c.verdict for c in cells})


def record_of(repro: Reproduction, result: Result, params: dict, argv: list[str]):
    """The stored record of one run of ``repro`` (records/record.py, kind ``reproduction``)."""
    from moe_repro.records.environment import collect_environment
    from moe_repro.records.record import ReproductionRecord

    return ReproductionRecord(
        id=repro.id, title=repro.title, paper=repro.paper, element=repro.element, how=repro.how,
        how_words=" + ".join(HOW.get(h.strip()[0], h) for h in repro.how.split("+")),
        description=repro.description, params={**repro.defaults, **params},
        tolerance=repro.tolerance.describe(), cells=[c.to_dict() for c in result.cells],
        summary=summarize(result.cells), assumptions=result.assumptions,
        figures=[f.__dict__ for f in result.figures], extra=result.extra,
        command=" ".join(argv), environment=collect_environment(argv))
