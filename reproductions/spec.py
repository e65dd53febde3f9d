"""The reproduction spec format: a paper's published values as data, our values, a grade per cell.

A reproduction module defines ``REPRODUCTION = Reproduction(id=..., ...)``; the id's entry in
:mod:`moe_repro.catalog` says what it is (title, paper element, how, description). Its
``compute`` function returns a :class:`Result` whose cells it builds with :meth:`compare` (a
number the paper prints) or :meth:`claim` (a statement the paper makes in words). The paper's
value is looked up, never used to compute ``ours``, and the grade decided (records/record.py
lists the grades):

- ``not-reproduced``: we have no number (``ours`` is None); the note says why.
- ``no-paper-value``: the paper printed nothing for this cell.
- ``echo``: ours restates an input or a formula the paper also states; not evidence.
- ``not-comparable``: the paper's number is a different quantity; the note says which.
- ``match``: within half a unit of the paper's last printed digit.
- ``close``: within the tolerance the spec states (relative/absolute slack), shown on the cell.
- ``explained``: outside it, for a cause someone found and recorded (``cause`` in CAUSES, and a
  note saying how it was established).
- ``deviates``: outside it, cause unknown.
- ``claim-holds`` / ``claim-fails``: a claim the paper states in words, tested on our numbers.

Deviation: relative, (ours - paper) / |paper| (so a negative paper value keeps the sign of the
difference), except for cells in percent, whose deviation is ours - paper in percentage points.

How each cell's number was made (``how``: letters of catalog.HOW, e.g. "A", "R", "A+S") is not
typed: the code that measures, simulates or samples says so when it runs
(components/provenance.py). By default a cell is labelled with everything that had run in the
innermost ``tracking()`` scope when the cell was built: :meth:`Reproduction.run` opens one around
the whole computation, and a number is computed before its cell, so nothing that made it is
missed (but an analytic cell built after a measurement would be over-labelled R). A
reproduction that mixes ways therefore computes each part inside its own ``with tracking():``
(cells built there get that part's kinds), or passes a scope's set as ``compare(...,
made=...)``. The record's ``how`` is the union over its cells; tests check it against the
catalog's.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from typing import Any, Callable

from moe_repro import catalog
from moe_repro.catalog import HOW
from moe_repro.components.provenance import current, letters, tracking
from moe_repro.records.record import CAUSES, VERDICTS  # one list of grades: the record schema's



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
class PaperClaim:
    """A claim the paper states in words ("comparable below 16 nodes", "1-3 pp"), quoted."""

    row: str
    column: str
    statement: str  # quoted or closely paraphrased from the paper
    source: str  # where: "Sec. VII-C, text on Fig. 8"


@dataclass(frozen=True)
class Tolerance:
    """``close`` if |ours - paper| <= half a printed unit (if ``printed``) + rel |paper| + abs.
    ``match`` needs the printed precision alone."""

    rel: float = 0.0
    abs: float = 0.0
    printed: bool = True

    def bound(self, paper: PaperValue) -> float:
        return (paper.half_unit if self.printed else 0.0) + self.rel * abs(paper.value) + self.abs

    @property
    def has_slack(self) -> bool:
        return bool(self.rel or self.abs)

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
    deviation: float | None = None  # relative, or percentage points (deviation_unit "pp")
    deviation_unit: str | None = None
    cause: str | None = None
    tolerance: str | None = None
    how: str | None = None  # letters of catalog.HOW, from what ran (components/provenance.py)

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items()}

    def explain(self, cause: str, note: str) -> "Cell":
        """Record the cause someone found for a deviation: ``deviates`` becomes ``explained``.
        A cell that does not deviate keeps its grade (its note is still added)."""
        if cause not in CAUSES:
            raise ValueError(f"cause must be one of {', '.join(CAUSES)}, got {cause!r}")
        if self.verdict == "deviates":
            self.verdict, self.cause = "explained", cause
        self.note = f"{self.note}; {note}" if self.note else note
        return self


def is_percent(unit: str) -> bool:
    return unit.strip() in ("%", "pp")


def deviation_of(paper: float, ours: float, unit: str) -> tuple[float | None, str | None]:
    """(deviation, its unit): percentage points for % cells, else relative to |paper|."""
    if is_percent(unit):
        return ours - paper, "pp"
    if paper == 0:
        return None, None
    return (ours - paper) / abs(paper), "rel"


def verdict_for(paper: PaperValue | None, ours: float | None, tolerance: Tolerance) -> str:
    if ours is None or (isinstance(ours, float) and math.isnan(ours)):
        return "not-reproduced"
    if paper is None:
        return "no-paper-value"
    miss = abs(ours - paper.value)
    if miss <= (paper.half_unit if tolerance.printed else 0.0):
        return "match"
    return "close" if miss <= tolerance.bound(paper) else "deviates"


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
    paper_claims: list[PaperClaim] = field(default_factory=list)

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

    def paper_claim(self, row: str, column: str) -> PaperClaim | None:
        for claim in self.paper_claims:
            if claim.row == row and claim.column == column:
                return claim
        return None

    def compare(self, row: str, column: str, ours: float | None, unit: str,
                note: str | None = None, tolerance: Tolerance | None = None, *,
                echo: bool = False, not_comparable: str | None = None,
                made: set | None = None) -> Cell:
        """Build the cell for (row, column): look up the paper's value and grade ours.
        ``echo``: ours restates an input or formula (graded echo, not evidence).
        ``not_comparable``: why the paper's number is a different quantity.
        ``made``: the set a ``tracking()`` scope collected while ours was computed (else what
        had run so far in the innermost open scope)."""
        pv = self.paper_value(row, column)
        tol = tolerance or self.tolerance
        made = current() if made is None else made
        verdict = verdict_for(pv, ours, tol)
        deviation = deviation_unit = None
        if pv is not None and ours is not None and not math.isnan(ours):
            deviation, deviation_unit = deviation_of(pv.value, ours, unit)
        if verdict not in ("not-reproduced", "no-paper-value"):
            if not_comparable:
                verdict = "not-comparable"
                note = f"{note}; {not_comparable}" if note else not_comparable
            elif echo:
                verdict = "echo"
        return Cell(row=row, column=column, paper=None if pv is None else pv.value, ours=ours,
                    unit=unit, verdict=verdict, note=note,
                    paper_printed=None if pv is None else pv.printed,
                    paper_unit=None if pv is None else pv.unit,
                    paper_source=None if pv is None else pv.source, deviation=deviation,
                    deviation_unit=deviation_unit,
                    tolerance=tol.describe() if verdict == "close" else None,
                    how=None if made is None or verdict == "not-reproduced" else letters(made))

    def claim(self, row: str, column: str, holds: bool | None, ours: float | None, unit: str,
              note: str, made: set | None = None) -> Cell:
        """Grade a claim the paper states in words (``paper_claims``) on our numbers: ``holds``
        True/False, or None when ours cannot test it (not-reproduced). ``note`` says how it was
        tested (which of our numbers, which threshold the words imply)."""
        pc = self.paper_claim(row, column)
        if pc is None:
            raise ValueError(f"{self.id}: no paper claim for ({row!r}, {column!r})")
        verdict = "not-reproduced" if holds is None else ("claim-holds" if holds else "claim-fails")
        made = current() if made is None else made
        return Cell(row=row, column=column, paper=None, ours=ours, unit=unit, verdict=verdict,
                    note=note, paper_printed=pc.statement, paper_source=pc.source,
                    how=None if made is None or holds is None else letters(made))

    def run(self, params: dict | None = None) -> Result:
        merged = {**self.defaults, **(params or {})}
        unknown = set(params or {}) - set(self.defaults)
        if unknown:
            raise ValueError(f"{self.id}: unknown parameter(s) {', '.join(sorted(unknown))}; "
                             f"known: {', '.join(sorted(self.defaults)) or 'none'}")
        with tracking() as ran:
            result = self.compute(self, merged)
        # compare() and claim() label their cells as they build them; a Cell built directly
        # (e.g. _trainer_cells.formula_cell) gets everything that ran. No number, no how.
        for cell in result.cells:
            if cell.how is None and cell.verdict != "not-reproduced":
                cell.how = letters(ran)
        return result


def how_of(cells: list[Cell]) -> str:
    """The letters of every cell's ``how``, in catalog.HOW's order: "A+R" when some cells are
    analytic and others measured ("A" for a result without cells)."""
    used = {part for c in cells if c.how for part in c.how.split("+")}
    return "+".join(letter for letter in HOW if letter in used) or "A"


def summarize(cells: list[Cell]) -> dict[str, int]:
    counts = {v: 0 for v in VERDICTS}
    for c in cells:
        counts[c.verdict] += 1
    return counts


def status_of(cells: list[Cell | dict]) -> str:
    """One word for an index (records/record.py: status_of)."""
    from moe_repro.records.record import status_of as status_of_verdicts

    return status_of_verdicts({c["verdict"] if isinstance(c, dict) else c.verdict for c in cells})


def record_of(repro: Reproduction, result: Result, params: dict, argv: list[str],
              invocation: list[str] | None = None):
    """The stored record of one run of ``repro`` (records/record.py, kind ``reproduction``).
    ``argv``: the command that reruns this one result (``command``); ``invocation``: the command
    line that actually ran, when known (``environment.command``; else ``argv``)."""
    from moe_repro.records.environment import collect_environment
    from moe_repro.records.record import ReproductionRecord

    how = how_of(result.cells)
    return ReproductionRecord(
        id=repro.id, title=repro.title, paper=repro.paper, element=repro.element, how=how,
        how_words=" + ".join(HOW[letter] for letter in how.split("+")), simulated="S" in how,
        description=repro.description, params={**repro.defaults, **params},
        tolerance=repro.tolerance.describe(), cells=[c.to_dict() for c in result.cells],
        summary=summarize(result.cells), assumptions=result.assumptions,
        figures=[f.__dict__ for f in result.figures], extra=result.extra,
        command=" ".join(argv), environment=collect_environment(invocation or argv))
