"""The result record: one typed, versioned shape for everything the harness stores.

Two kinds share a header (``schema_version``, ``kind``, ``environment``):

- ``reproduction``: one paper table or figure, paper vs ours, a verdict per cell
  (``repro run ID --json FILE``: at least ``id``, ``title``, ``cells``, ``environment``);
- ``suite``: one benchmark run, a flat record per grid point (``repro bench SUITE --json FILE``:
  at least ``suite``, ``records``, ``environment``).

Readers dispatch on ``kind``; nothing downstream tells kinds apart by which keys exist. Files are
read through :func:`load_records`, which migrates older versions first and validates after: a
file that cannot be read, or that does not validate, raises :class:`UnreadableRecord` naming it.

Version history
- 1: no ``schema_version`` and no ``kind`` (files written before the schema existed): the kind
  is inferred once, in :func:`migrate`, from ``cells`` (reproduction) or ``records`` (suite).
- 2: ``schema_version`` and ``kind`` written by every command.
"""

from __future__ import annotations

import json
import os
import reprlib
from typing import Annotated, Any, Literal, Union

import math

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

SCHEMA_VERSION = 3  # 3: a suite record keeps its suite's summary lines (SuiteRecord.summary)
# Deepest nesting a result may have: real records nest a handful of levels (a cell's
# counterfactual, a figure's series); a file nested deeper is not a result, and would otherwise
# exhaust the parser's recursion (RecursionError) or a reader's.
MAX_DEPTH = 64
# A name that becomes part of a file name (a reproduction id, a suite, a figure): letters,
# digits, '_', '.', '-', starting with a letter or digit (no '/', no '..' alone, no dot file).
SAFE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
# Grades of one cell, each meaning one thing (records/grading.py is the policy that decides them;
# reproductions/spec.py applies it); the words are shown on the site's index and every page.
GRADE_MEANING = {
    "match": "within the paper's printed precision (half a unit of its last digit)",
    "close": "a prediction outside the printed precision, within the one prediction tolerance "
    "(records/grading.py)",
    "explained": "outside the policy's bound, and the cell recomputed with the cause removed "
    "agrees (the counterfactual is recorded with the cell)",
    "deviates": "outside the policy's bound; no recomputation removes the gap (the note says "
    "what was tried, and which of our components is at fault where one is)",
    "seed-dependent": "a sampled cell whose grade differs between seeds (the fraction of seeds "
    "that agree is shown)",
    "claim-holds": "a claim the paper states in words holds on our numbers",
    "claim-fails": "a claim the paper states in words fails on our numbers",
    "not-comparable": "the paper's number is a different quantity, or was measured on other "
    "hardware (shown side by side, not graded)",
    "echo": "ours restates an input or follows from our own formulas: shown, never evidence",
    "not-evidence": "ours equals what the same computation gives without the method (a "
    "balancer that moves nothing, a reused number): shown, never counted as agreement",
    "no-paper-value": "the paper prints no number for this cell; ours only",
    "not-reproduced": "we have no number here (the note says why)",
}
VERDICTS = tuple(GRADE_MEANING)
# Grades that compare ours with something the paper states: the evidence a reproduction rests on.
EVIDENCE = (
    "match",
    "close",
    "explained",
    "deviates",
    "seed-dependent",
    "claim-holds",
    "claim-fails",
)
# Causes an ``explained`` cell may record: each is something outside our model, and the cell is
# recomputed with it removed (records/grading.py). Our own model's or balancer's fault is not a
# cause: such a cell deviates and names the component (``fault``).
CAUSE_MEANING = {
    "unit-convention": "the same quantity in other units (GB printed for GiB, ...)",
    "counting-convention": "the same quantity counted another way (which parameters, which bytes)",
    "paper-inconsistency": "the paper contradicts itself; the note cites both statements",
    "different-input": "our input is not the paper's (e.g. a synthetic routing trace); the cell "
    "recomputed on the paper's stated input agrees",
    "unstated-input": "the paper does not state an input the number depends on, and over that "
    "input's plausible range ours spans the paper's value (range in the note)",
}
CAUSES = tuple(CAUSE_MEANING)
KINDS = ("reproduction", "suite")
STORE_DIRS = {"reproduction": "reproductions", "suite": "suites"}  # kind -> store directory


def grade_counts(verdicts) -> dict[str, int]:
    """Cells per grade, in GRADE_MEANING's order, grades with no cell left out. Counted from
    the cells' grades (a stored ``summary`` may predate a grade)."""
    counts: dict[str, int] = {}
    for v in verdicts:
        counts[v] = counts.get(v, 0) + 1
    return {v: counts[v] for v in VERDICTS if v in counts}


class UnreadableRecord(ValueError):
    """A stored result that cannot be read or does not match the schema; names the file."""

    def __init__(self, where: str | os.PathLike | None, reason: str):
        self.path = None if where is None else str(where)
        self.reason = reason
        super().__init__(f"{self.path or 'result'}: {reason}")


class _Open(BaseModel):
    """Parts whose keys are open (an environment, a cell): extra keys are kept, not refused."""

    model_config = ConfigDict(extra="allow")


class Environment(_Open):
    """Provenance captured by records/environment.py; the keys named here are always read."""

    timestamp: str = ""
    git_commit: str | None = None
    git_dirty: bool | None = None
    command: str | None = None


class Cell(_Open):
    """One graded cell of a reproduction: built by reproductions/spec.py (compare, claim), tried
    against a cause by :meth:`explain` or blamed on a component by :meth:`blame`, stored as is in
    a reproduction record. One type from the computation to the file: the record holds the cells
    a reproduction built, checked again when the record is made (``revalidate_instances``: a cell
    changed after it was built, e.g. by explain, is checked as stored)."""

    model_config = ConfigDict(extra="allow", revalidate_instances="always")

    row: str
    column: str
    paper: float | None = None
    ours: float | None = None
    unit: str = ""
    verdict: Literal[VERDICTS]  # type: ignore[valid-type]
    note: str | None = None
    paper_printed: str | None = None
    paper_unit: str | None = None
    paper_source: str | None = None
    deviation: float | None = None  # relative, (ours - paper) / |paper|; pp for % cells
    deviation_unit: Literal["rel", "pp"] | None = None
    cause: str | None = None  # explained cells: one of CAUSES
    tolerance: str | None = None  # close cells: the tolerance they are within
    grade_class: str | None = None  # records/grading.py CLASSES (None: older records)
    counterfactual: dict[str, Any] | None = None  # the cell recomputed with the cause removed
    fault: str | None = None  # deviates: our component at fault, where one is
    seeds: dict[str, Any] | None = None  # sampled cells: per-seed values and agreement
    reading: str | None = None  # claims: how the paper's words were read
    derived_from: str | None = None  # "row / column" of the cell this one is derived from
    detail: str | None = None  # a longer investigation, shown in a linked section
    how: str | None = None  # HOW letters of what produced ours, e.g. "S" (None: older records)

    @model_validator(mode="after")
    def _agreement_needs_numbers(self, info: ValidationInfo):
        # NaN compares false with everything; a grade of agreement on a non-finite number is a
        # broken record, never shown as agreement. The gate reads such a cell (lenient_grades):
        # to it the number is what matters, and a non-finite current number is a regression.
        if self.verdict in ("match", "close") and not (info.context or {}).get("lenient_grades"):
            for side in ("ours", "paper"):
                value = getattr(self, side)
                if isinstance(value, float) and not math.isfinite(value):
                    raise ValueError(f"graded {self.verdict} but {side} is {value}")
        return self

    def to_dict(self) -> dict:
        """The cell as stored (the record's JSON form)."""
        return self.model_dump(mode="python")

    def explain(
        self, cause: str, note: str, counterfactual: float | list[float] | None, removed: str
    ) -> "Cell":
        """Try a cause for a deviation by computation: ``counterfactual`` is this cell recomputed
        with the cause removed (``removed`` says what was changed: "GiB instead of GB", "dropout
        on"), a list of per-seed values for a sampled cell. It is graded by the same policy; if
        it agrees, ``deviates`` becomes ``explained``; if not (or None: nothing was recomputed),
        the cell stays ``deviates`` and the note keeps the hypothesis and what the rerun gave.
        A cell that does not deviate keeps its grade; the note and the rerun are still added."""
        from moe_repro.records import grading

        if cause not in CAUSES:
            raise ValueError(
                f"cause must be one of {', '.join(CAUSES)}, got {cause!r} (our own "
                f"model's fault is not a cause: use blame())"
            )
        grade = None
        if counterfactual is not None and self.paper is not None and self.paper_printed:
            half = grading.half_unit(self.paper_printed)
            cls = self.grade_class or "exact"
            if isinstance(counterfactual, (list, tuple)):
                grade, _ = grading.grade_seeds(self.paper, half, list(counterfactual))
            else:
                grade = grading.grade_value(self.paper, half, counterfactual, cls)
            self.counterfactual = {
                "cause": cause,
                "removed": removed,
                "ours": counterfactual,
                "grade": grade,
            }
        if self.verdict == "deviates" and grade in ("match", "close"):
            self.verdict, self.cause = "explained", cause
            self.tolerance = None
        elif counterfactual is None:
            note = f"{note} (a hypothesis: not recomputed)"
        elif grade not in ("match", "close"):
            note = f"{note} (recomputed with {removed}: still {grade})"
        self.note = f"{self.note}; {note}" if self.note else note
        return self

    def blame(self, component: str, note: str) -> "Cell":
        """Name the component of ours (model, simulator, balancer, planner) at fault for a
        deviation: the cell stays ``deviates`` (never explained) and says so."""
        self.fault = component
        self.note = f"{self.note}; {note}" if self.note else note
        return self


class MetricDeclaration(_Open):
    name: str
    unit: str = ""
    better: Literal["higher", "lower", "none"] = "none"
    kind: Literal["measured", "analytic", "simulated"] = "measured"
    description: str = ""


class _Record(BaseModel):
    # Closed: a key the schema does not know is an error, so a typo or a stray field is caught
    # when the file is read, not when a report tries to use it.
    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    environment: Environment

    @property
    def name(self) -> str:
        raise NotImplementedError

    @property
    def timestamp(self) -> str:
        return self.environment.timestamp


class Figure(_Open):
    """What a figure must hold to be drawn and named; its series are checked when drawn."""

    name: str = Field(pattern=SAFE_NAME)
    title: str
    series: list[dict[str, Any]] = Field(default_factory=list)


class ReproductionRecord(_Record):
    kind: Literal["reproduction"] = "reproduction"
    id: str = Field(pattern=SAFE_NAME)
    title: str = ""
    paper: str = ""
    element: str = ""
    how: str = ""  # union of the cells' how (before schema 2's cell how: the catalog's label)
    how_words: str = ""
    simulated: bool = False  # some cell's number is simulated (how contains S)
    description: str = ""
    params: dict[str, Any] = Field(default_factory=dict)
    tolerance: str = ""
    cells: list[Cell]
    summary: dict[str, int] = Field(default_factory=dict)
    assumptions: list[str] = Field(default_factory=list)
    figures: list[dict[str, Any]] = Field(default_factory=list)

    @field_validator("figures")
    @classmethod
    def _figures_have_names(cls, figures):
        for figure in figures:
            Figure.model_validate(figure)
        return figures

    extra: dict[str, Any] = Field(default_factory=dict)
    command: str = ""

    @property
    def name(self) -> str:
        return self.id

    @property
    def agreement(self) -> dict[str, int]:
        """Compared cells that agree, are explained, deviate, depend on the seed (grading.py)."""
        from moe_repro.records.grading import agreement

        return agreement(self.cells)

    @property
    def status(self) -> str:
        """'x of y compared cells agree, ...' (records/grading.py: agreement_line)."""
        from moe_repro.records.grading import agreement_line

        return agreement_line(self.agreement)


class SuiteRecord(_Record):
    kind: Literal["suite"] = "suite"
    suite: str = Field(pattern=SAFE_NAME)
    description: str = ""
    params: list[str] = Field(default_factory=list)  # the grid's parameter names
    metrics: list[MetricDeclaration] = Field(default_factory=list)
    records: list[dict[str, Any]]  # one flat dict per grid point: params and metrics
    table_keys: list[str] = Field(default_factory=list)  # what a table shows first
    table_metrics: list[str] = Field(default_factory=list)
    interrupted: bool = False
    error: str | None = None
    # What the suite's own summary said of these records (Suite.summary, computed when they were
    # stored), e.g. alltoall-validation's median error per backend and algorithm; shown on its page.
    summary: list[str] = Field(default_factory=list)

    @property
    def name(self) -> str:
        return self.suite


Record = Annotated[Union[ReproductionRecord, SuiteRecord], Field(discriminator="kind")]
_RECORD = TypeAdapter(Record)


def migrate(data: Any) -> dict:
    """Bring one stored payload to the current version (raises ValueError if it cannot)."""
    if not isinstance(data, dict):
        raise ValueError(f"a result is a JSON object, got {type(data).__name__}")
    version = data.get("schema_version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError(f"schema_version must be a positive integer, got {version!r}")
    if version > SCHEMA_VERSION:
        raise ValueError(
            f"schema_version {version} is newer than this moe-repro reads "
            f"({SCHEMA_VERSION}): upgrade moe-repro"
        )
    if version == 1:  # the one place that looks at which keys exist
        if "cells" in data:
            kind = "reproduction"
        elif "records" in data:
            kind = "suite"
        else:
            raise ValueError(
                "a version-1 result has neither 'cells' (a reproduction) nor 'records' (a suite)"
            )
        data = {**data, "kind": kind, "schema_version": SCHEMA_VERSION}
    if version == 2:  # 3 added SuiteRecord.summary, empty for a run stored before it
        data = {**data, "schema_version": SCHEMA_VERSION}
    return data


def validate(
    data: Any, where: str | os.PathLike | None = None, lenient_grades: bool = False
) -> ReproductionRecord | SuiteRecord:
    """One payload (any version, as read from JSON) -> a validated record; UnreadableRecord
    names ``where``. Strict: no value is converted to another type ("1.2" or true is not a
    number). ``lenient_grades``: see :func:`parse_records`."""
    try:
        return _RECORD.validate_python(
            migrate(data), strict=True, context={"lenient_grades": lenient_grades}
        )
    except ValidationError as e:
        first = e.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "record"
        more = f" (+{e.error_count() - 1} more)" if e.error_count() > 1 else ""
        got = f", got {reprlib.repr(first['input'])}" if first["type"].endswith("_type") else ""
        raise UnreadableRecord(where, f"{field}: {first['msg']}{got}{more}") from None
    except ValueError as e:
        raise UnreadableRecord(where, str(e)) from None


def depth_over(data: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``data`` nests lists and dicts more than ``limit`` deep (walked without recursion)."""
    stack = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            if depth > limit:
                return True
            stack.extend(
                (child, depth + 1) for child in (node.values() if isinstance(node, dict) else node)
            )
    return False


class _OutOfRange(ValueError):
    """A JSON number beyond float's range (1e400, or an integer of hundreds of digits)."""


def _parse_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # only the literals NaN/Infinity are non-finite on purpose (dump)
        raise _OutOfRange(
            f"the number {text[:24]}{'...' if len(text) > 24 else ''} is beyond "
            "the range of a float"
        )
    return value


def _parse_int(text: str) -> int:
    try:
        value = int(text)
        float(value)
    except (ValueError, OverflowError):  # over the digit limit of int(), or over float's range
        raise _OutOfRange(
            f"the integer {text[:24]}... ({len(text)} digits) is beyond the range of a float"
        ) from None
    return value


def parse_records(
    raw: bytes, where: str | os.PathLike, lenient_grades: bool = False
) -> list[ReproductionRecord | SuiteRecord]:
    """Every record in the bytes of a result file (one object, or a list of them as ``run
    --json`` writes for several ids); UnreadableRecord names ``where``. Types are strict (a
    number is a JSON number, never a string or a boolean) and numbers within float's range.
    ``lenient_grades``: keep a cell graded as agreement on a non-finite number (see
    :meth:`Cell._agreement_needs_numbers`), for the gate to report as a regression."""
    try:
        data = json.loads(raw.decode("utf-8"), parse_float=_parse_float, parse_int=_parse_int)
    except UnicodeDecodeError as e:
        raise UnreadableRecord(where, f"cannot read: {e}") from None
    except json.JSONDecodeError as e:
        raise UnreadableRecord(where, f"not JSON ({e.msg} at line {e.lineno})") from None
    except _OutOfRange as e:
        raise UnreadableRecord(where, str(e)) from None
    except RecursionError:  # json's parser recurses once per nesting level
        raise UnreadableRecord(
            where, f"JSON nested deeper than {MAX_DEPTH} levels: not a result"
        ) from None
    if depth_over(data):
        raise UnreadableRecord(where, f"JSON nested deeper than {MAX_DEPTH} levels: not a result")
    items = data if isinstance(data, list) else [data]
    if not items:
        raise UnreadableRecord(where, "an empty list: no results")
    return [
        validate(item, where if len(items) == 1 else f"{where}[{i}]", lenient_grades)
        for i, item in enumerate(items)
    ]


def load_records(
    path: str | os.PathLike, lenient_grades: bool = False
) -> list[ReproductionRecord | SuiteRecord]:
    """Every record in a result file (:func:`parse_records`). The file is read by
    records/inputs.py: a FIFO, device or directory is refused unread, as is a file over
    RESULT_LIMIT; each is an UnreadableRecord naming the path."""
    from moe_repro.records.inputs import RESULT_LIMIT, InputError, read_input

    try:
        raw = read_input(path, RESULT_LIMIT)
    except InputError as e:
        raise UnreadableRecord(path, e.reason) from None
    return parse_records(raw, path, lenient_grades)


def load_record(path: str | os.PathLike) -> ReproductionRecord | SuiteRecord:
    """The one record of a result file written by the store."""
    records = load_records(path)
    if len(records) != 1:
        raise UnreadableRecord(path, f"holds {len(records)} results, expected one")
    return records[0]


def dump(record: ReproductionRecord | SuiteRecord) -> dict:
    """The JSON-ready dict of a record. NaN stays NaN (json writes it as NaN): a missing value is
    None, a broken one NaN, and readers such as the gate must be able to tell them apart."""
    return record.model_dump(mode="python")
