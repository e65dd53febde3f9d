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
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

SCHEMA_VERSION = 2
# Grades of one cell, each meaning one thing (reproductions/spec.py decides them); the words are
# shown on the site's index and every reproduction page.
GRADE_MEANING = {
    "match": "within the paper's printed precision (half a unit of its last digit)",
    "close": "outside the printed precision, within the tolerance the reproduction states (shown)",
    "explained": "outside tolerance for a cause someone found and recorded with the cell",
    "deviates": "outside tolerance, cause not found",
    "claim-holds": "a claim the paper states in words holds on our numbers",
    "claim-fails": "a claim the paper states in words fails on our numbers",
    "not-comparable": "the paper's number is a different quantity (the note says which)",
    "echo": "ours restates an input or a formula: shown, never counted as evidence",
    "no-paper-value": "the paper prints no number for this cell; ours only",
    "not-reproduced": "we have no number here (the note says why)",
}
VERDICTS = tuple(GRADE_MEANING)
# Grades that compare ours with something the paper states: the evidence a reproduction rests on.
EVIDENCE = ("match", "close", "explained", "deviates", "claim-holds", "claim-fails")
# Causes an ``explained`` cell may record (someone found it; the note says how), each meaning one
# thing; shown beside the grades.
CAUSE_MEANING = {
    "unit-convention": "the same quantity in other units (GB printed for GiB, ...)",
    "counting-convention": "the same quantity counted another way (which parameters, which bytes)",
    "different-hardware": "the paper's machine is not this one, and the difference accounts for it",
    "modelling-assumption": "an assumption of our model, named in the note with what it moves",
    "paper-inconsistency": "the paper contradicts itself; the note cites both statements",
    "different-input": "our input is not the paper's (e.g. a synthetic routing trace), and the "
                       "input's own statistics account for it",
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


STATUS_MEANING = {
    "some-deviate": "an unexplained deviation or a failed claim",
    "explained-deviations": "every deviation has a recorded cause",
    "reproduced": "every compared cell matches, is close, or its claim holds",
    "partly-reproduced": "as reproduced, but some cells could not be computed here",
    "not-compared": "numbers, but nothing the paper states to compare them with",
    "not-reproducible-here": "nothing could be computed on this machine",
}


def status_of(verdicts: set[str]) -> str:
    """One word for an index from a result's cell grades, worst first (STATUS_MEANING). A result
    with nothing compared is never "partly reproduced"."""
    if verdicts & {"deviates", "claim-fails"}:
        return "some-deviate"
    compared = verdicts & set(EVIDENCE)
    if not compared:
        return "not-reproducible-here" if verdicts and verdicts <= {"not-reproduced"} else "not-compared"
    if "explained" in verdicts:
        return "explained-deviations"
    return "partly-reproduced" if "not-reproduced" in verdicts else "reproduced"


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
    how: str | None = None  # HOW letters of what produced ours, e.g. "S" (None: older records)


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


class ReproductionRecord(_Record):
    kind: Literal["reproduction"] = "reproduction"
    id: str
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
    extra: dict[str, Any] = Field(default_factory=dict)
    command: str = ""

    @property
    def name(self) -> str:
        return self.id

    @property
    def status(self) -> str:
        return status_of({c.verdict for c in self.cells})


class SuiteRecord(_Record):
    kind: Literal["suite"] = "suite"
    suite: str
    description: str = ""
    params: list[str] = Field(default_factory=list)  # the grid's parameter names
    metrics: list[MetricDeclaration] = Field(default_factory=list)
    records: list[dict[str, Any]]  # one flat dict per grid point: params and metrics
    table_keys: list[str] = Field(default_factory=list)  # what a table shows first
    table_metrics: list[str] = Field(default_factory=list)
    interrupted: bool = False
    error: str | None = None

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
        raise ValueError(f"schema_version {version} is newer than this moe-repro reads "
                         f"({SCHEMA_VERSION}): upgrade moe-repro")
    if version == 1:  # the one place that looks at which keys exist
        if "cells" in data:
            kind = "reproduction"
        elif "records" in data:
            kind = "suite"
        else:
            raise ValueError("a version-1 result has neither 'cells' (a reproduction) nor "
                             "'records' (a suite)")
        data = {**data, "kind": kind, "schema_version": SCHEMA_VERSION}
    return data


def validate(data: Any, where: str | os.PathLike | None = None) -> ReproductionRecord | SuiteRecord:
    """One payload (any version) -> a validated record; UnreadableRecord names ``where``."""
    try:
        return _RECORD.validate_python(migrate(data))
    except ValidationError as e:
        first = e.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "record"
        more = f" (+{e.error_count() - 1} more)" if e.error_count() > 1 else ""
        raise UnreadableRecord(where, f"{field}: {first['msg']}{more}") from None
    except ValueError as e:
        raise UnreadableRecord(where, str(e)) from None


def load_records(path: str | os.PathLike) -> list[ReproductionRecord | SuiteRecord]:
    """Every record in a result file (one object, or a list of them as ``run --json`` writes
    for several ids)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise UnreadableRecord(path, f"cannot read: {e}") from None
    except json.JSONDecodeError as e:
        raise UnreadableRecord(path, f"not JSON ({e.msg} at line {e.lineno})") from None
    items = data if isinstance(data, list) else [data]
    if not items:
        raise UnreadableRecord(path, "an empty list: no results")
    return [validate(item, path if len(items) == 1 else f"{path}[{i}]") for i, item in enumerate(items)]


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
