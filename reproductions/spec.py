"""The reproduction spec format: a paper's published values as data, our values, a grade per cell.

A reproduction module defines ``REPRODUCTION = Reproduction(id=..., ...)``; the id's entry in
:mod:`moe_repro.catalog` says what it is (title, paper element, how, description). Its
``compute`` function returns a :class:`Result` whose cells it builds with :meth:`compare` (a
number the paper prints) or :meth:`claim` (a statement the paper makes in words). The paper's
value is looked up, never used to compute ``ours``.

The grade is the grading policy's (records/grading.py), never the reproduction's: a
reproduction declares the class of each cell's number (``grade_class``: exact, prediction,
sampled, other-hardware) and the policy decides; sampled cells pass their per-seed values,
``explained`` cells the value recomputed with the cause removed (:meth:`Cell.explain`; a table's
convention through :meth:`Reproduction.try_convention`), claims their words. A cell also states
what its number is (``quantity``: ratio, percent change) and, where a method acts, what the
computation gives without it (``without``); :func:`apply_policy` runs the checks every cell gets.

Deviation: relative, (ours - paper) / |paper|, except for cells in percent (percentage points).

How each cell's number was made (``how``: letters of catalog.HOW) is not typed: the code that
measures, simulates or samples says so when it runs (components/provenance.py), and a cell is
labelled with what ran in the innermost ``tracking()`` scope; a reproduction that mixes ways
computes each part inside its own ``with tracking():`` or passes ``compare(..., made=...)``.

Why: a paper's values, ours and the grade are kept apart so no reproduction grades itself. The
labelling rules in full: see docs/validation-and-grading.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable

from moe_repro import catalog
from moe_repro.catalog import HOW
from moe_repro.components.provenance import current, letters, tracking
from moe_repro.records import grading
from moe_repro.records.record import VERDICTS  # one list of grades: the record schema's
from moe_repro.records.record import Cell  # one cell type, from compare() to the stored record


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
        return grading.half_unit(self.printed)


@dataclass(frozen=True)
class PaperClaim:
    """A claim the paper states in words ("comparable below 16 nodes", "1-3 pp"), quoted."""

    row: str
    column: str
    statement: str  # quoted or closely paraphrased from the paper
    source: str  # where: "Sec. VII-C, text on Fig. 8"


def is_percent(unit: str) -> bool:
    return unit.strip() in ("%", "pp")


def deviation_of(paper: float, ours: float, unit: str) -> tuple[float | None, str | None]:
    """(deviation, its unit): percentage points for % cells, else relative to |paper|."""
    if is_percent(unit):
        return ours - paper, "pp"
    if paper == 0:
        return None, None
    return (ours - paper) / abs(paper), "rel"


def grade_of(
    paper: PaperValue | None, ours: float | None, grade_class: str, quantity: str = "value"
) -> str:
    """The policy's grade of one number (records/grading.py)."""
    if ours is None or (isinstance(ours, float) and math.isnan(ours)):
        return "not-reproduced"
    if paper is None:
        return "no-paper-value"
    return grading.grade_value(paper.value, paper.half_unit, ours, grade_class, quantity)


def quantity_of(unit: str, quantity: str | None) -> str:
    """The quantity a cell's number is (grading.QUANTITIES): as declared, else a ratio for a
    number in "x", else a plain value."""
    if quantity is not None:
        if quantity not in grading.QUANTITIES:
            raise ValueError(f"quantity must be one of {', '.join(grading.QUANTITIES)}")
        return quantity
    return "ratio" if unit.strip() in ("x", "×") else "value"


@lru_cache(maxsize=1)
def scored_predictors() -> frozenset:
    """(predictor, platform) pairs `repro validate` scores (reproductions/validation.py)."""
    from moe_repro.reproductions.validation import load_points

    points = load_points()["points"]
    return frozenset(
        (p["predictor"], p["platform"]) for p in points if p.get("role", "scored") == "scored"
    )


NOTE_WORDS = 60  # a cell's note at most; longer text goes to Cell.detail


@dataclass
class Figure:
    """Data for one figure; reports/ draws it with matplotlib (components never plot).
    ``form`` follows the paper's figure: "lines" (default), "bars" (grouped bars, one group per
    x category, one bar per series), "stacked-bars" (series stacked per x category), "dots".
    A bar whose y is None and whose series lists the x in ``oom`` is labelled OOM, as papers
    print it."""

    name: str
    title: str
    xlabel: str
    ylabel: str
    series: list[dict]  # {"label", "x", "y", "kind": "ours"|"paper", optional "oom": [x, ...]}
    xscale: str = "linear"
    yscale: str = "linear"
    form: str = "lines"


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
    # The class of most cells' numbers (records/grading.py); compare(grade_class=) for others.
    grade_class: str = "exact"
    defaults: dict[str, Any] = field(default_factory=dict)
    # `repro run ID --full`: parameters that make the run paper-sized where the defaults are cut
    # down to finish in minutes on a small machine (empty: the defaults are the full run).
    full: dict[str, Any] = field(default_factory=dict)
    paper_claims: list[PaperClaim] = field(default_factory=list)
    # The `repro validate` predictor this reproduction's ``prediction`` cells come from
    # ("step-time", "memory", "alltoall-bandwidth", ...), on the platform ``platform`` or the
    # ``platform`` parameter: a prediction is scored only where validate scores that pair, else
    # its class is grading.UNSCORED (None: no scored predictor, every prediction unscored).
    predictor: str | None = None
    platform: str | None = None

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

    def compare(
        self,
        row: str,
        column: str,
        ours: float | None,
        unit: str,
        note: str | None = None,
        *,
        grade_class: str | None = None,
        seeds: list[float] | None = None,
        echo: bool = False,
        not_comparable: str | None = None,
        derived_from: str | None = None,
        made: set | None = None,
        quantity: str | None = None,
        without: float | list[float] | None = None,
        depends_on: list[Cell] | None = None,
    ) -> Cell:
        """Build the cell for (row, column): look up the paper's value and let the policy grade
        ours (records/grading.py).
        ``grade_class``: this number's class (default: the reproduction's).
        ``seeds``: a sampled cell's per-seed values (at least grading.MIN_SEEDS); each is graded
        and the grade must hold at every seed, else ``seed-dependent``. ``ours`` is the value
        shown (None: the median over seeds).
        ``echo``: ours restates an input or follows from our own formulas (never evidence).
        ``not_comparable``: why the paper's number is a different quantity.
        ``derived_from``: "row / column" of the cell this one is computed from (counted once).
        ``made``: the set a ``tracking()`` scope collected while ours was computed (else what
        had run so far in the innermost open scope).
        ``quantity``: what the number is (grading.QUANTITIES; default a ratio for "x", else a
        value): decides its direction and how its miss is measured.
        ``without``: what the same computation gives without the method (a balancer's Before
        LB, the baseline; per seed for a sampled cell): ours equal to it is ``not-evidence``.
        ``depends_on``: the graded cells ours is the product of (a method's straggler = Before
        LB x the share it leaves): agreement while one of them deviates is a coincidence,
        ``not-evidence`` (grading.coincidence)."""
        pv = self.paper_value(row, column)
        cls = grade_class or self.grade_class
        qty = quantity_of(unit, quantity)
        if cls not in grading.GRADE_CLASSES:
            raise ValueError(f"{self.id}: grade class must be one of {', '.join(grading.CLASSES)}")
        made = current() if made is None else made
        seed_info = None
        if cls == "sampled" or seeds is not None:
            if cls != "sampled" or not seeds:
                raise ValueError(
                    f"{self.id} ({row!r}, {column!r}): a sampled cell passes seeds "
                    f"and grade_class='sampled'"
                )
            values = [float(v) for v in seeds]
            if ours is None:
                ours = (
                    sorted(values)[len(values) // 2]
                    if len(values) % 2
                    else 0.5
                    * (sorted(values)[len(values) // 2 - 1] + sorted(values)[len(values) // 2])
                )
            seed_info = {"values": values, "range": [min(values), max(values)]}
            if pv is None or any(math.isnan(v) for v in values):
                verdict = grade_of(pv, ours, "prediction", qty)
            else:
                base = None
                if without is not None:
                    base = (
                        [float(w) for w in without]
                        if isinstance(without, (list, tuple))
                        else [float(without)] * len(values)
                    )
                verdict, agree = grading.grade_seeds(pv.value, pv.half_unit, values, qty, base)
                seed_info["agree"] = agree
        else:
            verdict = grade_of(pv, ours, cls, qty)
            if (
                without is not None
                and verdict in grading.AGREE
                and grading.same_as_without(ours, float(without))
            ):
                verdict = grading.NOT_EVIDENCE
        if verdict == grading.NOT_EVIDENCE:
            words = "equals what the same computation gives without the method: not evidence"
            note = f"{note}; {words}" if note else words
        elif depends_on and grading.coincidence(verdict, [c.verdict for c in depends_on]):
            verdict = grading.NOT_EVIDENCE
            words = (
                "agrees while cells it is computed from deviate ("
                + ", ".join(
                    f"{c.row} / {c.column}" for c in depends_on if c.verdict in grading.DISAGREE
                )
                + "): a coincidence, not evidence"
            )
            note = f"{note}; {words}" if note else words
        deviation = deviation_unit = None
        if pv is not None and ours is not None and not math.isnan(ours):
            deviation, deviation_unit = deviation_of(pv.value, ours, unit)
        if verdict not in ("not-reproduced", "no-paper-value"):
            if not_comparable:
                verdict = "not-comparable"
                note = f"{note}; {not_comparable}" if note else not_comparable
                if seed_info:  # nothing was graded: no share of seeds agreeing to show
                    seed_info.pop("agree", None)
            elif echo:
                verdict = "echo"
        return Cell(
            row=row,
            column=column,
            paper=None if pv is None else pv.value,
            ours=ours,
            unit=unit,
            verdict=verdict,
            note=note,
            paper_printed=None if pv is None else pv.printed,
            paper_unit=None if pv is None else pv.unit,
            paper_source=None if pv is None else pv.source,
            deviation=deviation,
            deviation_unit=deviation_unit,
            tolerance=grading.tolerance_words(cls, qty) if verdict == "close" else None,
            how=None if made is None or verdict == "not-reproduced" else letters(made),
            grade_class=cls,
            seeds=seed_info,
            derived_from=derived_from,
            quantity=qty,
        )

    def claim(
        self,
        row: str,
        column: str,
        holds: bool | None,
        ours: float | None,
        unit: str,
        note: str,
        made: set | None = None,
        *,
        reading: str | None = None,
        seeds_hold: list[bool] | None = None,
        echo: bool = False,
        derived_from: str | None = None,
        values: list[float] | None = None,
        counterfactual: tuple | None = None,
    ) -> Cell:
        """Grade a claim the paper states in words (``paper_claims``) on our numbers.
        ``holds``: True/False for a direction or ordering claim tested in code, None when ours
        cannot test it (not-reproduced). ``reading``: a number in the paper's words ("2x",
        "2-3.6x", "<1%"): the policy reads it (grading.read_claim) and tests ``ours``; pass
        ``holds=None`` then. ``seeds_hold``: per-seed outcomes of a sampled claim (all must
        agree, else seed-dependent). ``echo``: the claim follows from our own formulas and
        cannot fail: shown, not evidence. ``note`` says which of our numbers test it.
        ``values``: every number a range or bound in words covers ("1.1-9x at >= 16 nodes"):
        the reading must hold for each (one claim, one reading).
        ``counterfactual``: (test, perturbed inputs, what is perturbed): the policy runs the
        claim's test on each perturbed input (grading.can_fail); a claim that holds for every
        one cannot fail and is ``echo``.
        Direction first: a claim that fails on ours (``holds`` False, the median) fails, whatever
        some seeds give."""
        pc = self.paper_claim(row, column)
        if pc is None:
            raise ValueError(f"{self.id}: no paper claim for ({row!r}, {column!r})")
        read = None
        seed_info = None
        if reading is not None:
            if holds is not None:
                raise ValueError(
                    f"{self.id} ({row!r}, {column!r}): a claim read by the policy "
                    f"does not also pass holds="
                )
            read = grading.read_claim(reading)
            if values is not None:
                holds = bool(values) and all(read.holds(float(v)) for v in values)
            else:
                holds = None if ours is None or math.isnan(ours) else read.holds(ours)
        elif values is not None:
            raise ValueError(f"{self.id} ({row!r}, {column!r}): values= needs reading=")
        if seeds_hold is not None and holds is False:
            verdict = "claim-fails"  # direction first: the claim fails on ours (the median)
            seed_info = {
                "holds": list(seeds_hold),
                "agree": sum(map(bool, seeds_hold)) / max(len(seeds_hold), 1),
            }
        elif seeds_hold is not None:
            grades = ["claim-holds" if h else "claim-fails" for h in seeds_hold]
            verdict, agree = grading.consensus(grades)
            seed_info = {"holds": list(seeds_hold), "agree": agree}
        else:
            verdict = (
                "not-reproduced" if holds is None else ("claim-holds" if holds else "claim-fails")
            )
        if counterfactual is not None and verdict != "not-reproduced":
            test, perturbed, what = counterfactual
            if not grading.can_fail(test, perturbed):
                echo = True
                words = f"holds for all {len(perturbed)} perturbations of {what}: cannot fail"
                note = f"{note}; {words}" if note else words
        if echo and verdict != "not-reproduced":
            verdict = "echo"
        made = current() if made is None else made
        return Cell(
            row=row,
            column=column,
            paper=None,
            ours=ours,
            unit=unit,
            verdict=verdict,
            note=note,
            paper_printed=pc.statement,
            paper_source=pc.source,
            how=None if made is None or verdict == "not-reproduced" else letters(made),
            grade_class="claim",
            seeds=seed_info,
            reading=None if read is None else read.describe(),
            derived_from=derived_from,
        )

    def run(self, params: dict | None = None) -> Result:
        merged = {**self.defaults, **(params or {})}
        unknown = set(params or {}) - set(self.defaults)
        if unknown:
            raise ValueError(
                f"{self.id}: unknown parameter(s) {', '.join(sorted(unknown))}; "
                f"known: {', '.join(sorted(self.defaults)) or 'none'}"
            )
        with tracking() as ran:
            result = self.compute(self, merged)
        # compare() and claim() label their cells as they build them; a Cell built directly
        # (e.g. _trainer_cells.formula_cell) gets everything that ran. No number, no how.
        for cell in result.cells:
            if cell.how is None and cell.verdict != "not-reproduced":
                cell.how = letters(ran)
        apply_policy(result.cells, self.predictor, self.platform or merged.get("platform"))
        return result

    def try_convention(
        self, cells: dict, recount: dict, cause: str, removed: str, note: str
    ) -> grading.Judged:
        """Offer a convention (unit, rounding, counting, stated input) as the cause of deviating
        cells, judged by the policy's one rule (grading.judge_convention) on every cell of the
        table: ``cells``: (row, column) -> cell; ``recount``: (row, column) -> the cell's number
        under the convention, for every cell it changes (the others keep theirs). Accepted: each
        deviating cell is recomputed through Cell.explain. Rejected: the deviating cells keep
        their grade and the note says why."""
        entries = {}
        for key, cell in cells.items():
            pv = self.paper_value(*key)
            if pv is None or cell.ours is None:
                continue
            entries[key] = (pv.value, pv.half_unit, cell.ours, recount.get(key, cell.ours))
        judged = grading.judge_convention(entries)
        for key, value in recount.items():
            cell = cells[key]
            if cell.verdict != "deviates":
                continue
            if judged.accepted:
                cell.explain(cause, note, counterfactual=value, removed=removed)
            else:
                words = f"{note}: {value:.4g}{cell.unit}, not accepted ({judged.why}"
                if judged.broken:
                    more = len(judged.broken) - 1
                    words += (
                        ": " + " / ".join(judged.broken[0]) + (f" and {more} more" if more else "")
                    )
                cell.note = f"{cell.note}; {words})" if cell.note else f"{words})"
        return judged


def apply_policy(cells: list[Cell], predictor: str | None, platform: str | None) -> None:
    """The policy's checks run on every cell of a result once it is computed:
    - a ``prediction`` whose (predictor, platform) `repro validate` does not score is of class
      grading.UNSCORED (graded alike, counted apart);
    - a sampled cell whose per-seed numbers are another cell's (a reused number) is
      ``not-evidence``;
    - an ``explained`` cell whose recomputation lands inside the printed precision by less than
      grading.MARGIN_UNITS of a unit says so."""
    scored = (predictor, platform) in scored_predictors() if predictor and platform else False
    seen: dict[tuple, str] = {}
    for cell in cells:
        if cell.grade_class == "prediction" and not scored:
            cell.grade_class = grading.UNSCORED
        values = (cell.seeds or {}).get("values")
        # per-seed numbers that vary are a signature: another cell with the same ones reuses them
        if values and len(set(values)) > 1 and not cell.derived_from:
            key = tuple(values)
            first = seen.setdefault(key, f"{cell.row} / {cell.column}")
            if first != f"{cell.row} / {cell.column}" and cell.verdict in (
                *grading.AGREE,
                "seed-dependent",
            ):
                cell.verdict = grading.NOT_EVIDENCE
                cell.tolerance = None
                words = f"the same per-seed numbers as {first}: a reused number, not evidence"
                cell.note = f"{cell.note}; {words}" if cell.note else words
        cf = cell.counterfactual or {}
        if (
            cell.verdict == "explained"
            and cf.get("grade") == "match"
            and cell.paper_printed
            and isinstance(cf.get("ours"), (int, float))
        ):
            half = grading.half_unit(cell.paper_printed)
            margin = grading.margin_units(cell.paper, half, float(cf["ours"]))
            if margin < grading.MARGIN_UNITS:
                cf["margin_units"] = margin
                words = (
                    f"the recomputation lands inside the printed precision by "
                    f"{margin:.2f} of a unit, less than {grading.MARGIN_UNITS}"
                )
                cell.note = f"{cell.note}; {words}" if cell.note else words


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


def agreement_of(cells: list[Cell | dict]) -> str:
    """'x of y compared cells agree, ...' (records/grading.py)."""
    return grading.agreement_line(grading.agreement(cells))


def record_of(
    repro: Reproduction,
    result: Result,
    params: dict,
    argv: list[str],
    invocation: list[str] | None = None,
):
    """The stored record of one run of ``repro`` (records/record.py, kind ``reproduction``).
    ``argv``: the command that reruns this one result (``command``); ``invocation``: the command
    line that actually ran, when known (``environment.command``; else ``argv``)."""
    from moe_repro.records.environment import collect_environment
    from moe_repro.records.record import ReproductionRecord

    how = how_of(result.cells)
    return ReproductionRecord(
        id=repro.id,
        title=repro.title,
        paper=repro.paper,
        element=repro.element,
        how=how,
        how_words=" + ".join(HOW[letter] for letter in how.split("+")),
        simulated="S" in how,
        description=repro.description,
        params={**repro.defaults, **params},
        tolerance="records/grading.py (one policy)",
        cells=list(result.cells),
        summary=summarize(result.cells),
        assumptions=result.assumptions,
        figures=[f.__dict__ for f in result.figures],
        extra=result.extra,
        command=" ".join(argv),
        environment=collect_environment(invocation or argv),
    )
