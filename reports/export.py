"""Flat tables of stored results (pandas), for CSV / JSON Lines export and the site's raw links."""

from __future__ import annotations

import pandas as pd

from moe_repro.records.record import ReproductionRecord, SuiteRecord


def _keep_integers(rows: list[dict]) -> pd.DataFrame:
    """A frame of ``rows`` whose integer columns stay integers (pandas' nullable Int64) where
    some rows lack the key: otherwise the gaps turn the column to float ("ranks 4.0")."""
    df = pd.DataFrame(rows)
    for col in df.columns:
        values = [r[col] for r in rows if r.get(col) is not None]
        if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            df[col] = df[col].astype("Int64")
    return df


def reproduction_frame(record: ReproductionRecord) -> pd.DataFrame:
    env = record.environment
    rows = [
        {
            "id": record.id,
            **cell.model_dump(),
            "git_commit": env.git_commit,
            "timestamp": env.timestamp,
        }
        for cell in record.cells
    ]
    return _keep_integers(rows)


def suite_frame(record: SuiteRecord) -> pd.DataFrame:
    env = record.environment
    rows = [
        {
            **{k: v for k, v in r.items() if k != "samples"},
            "git_commit": env.git_commit,
            "timestamp": env.timestamp,
            "device": getattr(env, "device", None),
        }
        for r in record.records
    ]
    return _keep_integers(rows)


FRAMES = {"reproduction": reproduction_frame, "suite": suite_frame}


def frame(record: ReproductionRecord | SuiteRecord) -> pd.DataFrame:
    """One row per cell (reproduction) or grid point (suite)."""
    return FRAMES[record.kind](record)


# A spreadsheet reads a cell starting with one of these as a formula (=HYPERLINK(...), +cmd|..., @SUM):
# CSV injection (OWASP)
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def escape_formula(value):
    """A text cell a spreadsheet would run as a formula, prefixed with a single quote (OWASP's
    advice), so that it shows as the text it is; numbers, a negative one too, stay numbers."""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


def csv_safe(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with every text cell and column name escaped by :func:`escape_formula`: stored
    results come from files anyone can write, and their text reaches a spreadsheet through
    the export."""
    out = df.copy()
    for col in out.columns:
        if out[col].dtype == object or pd.api.types.is_string_dtype(out[col].dtype):
            out[col] = out[col].map(escape_formula)
    out.columns = [escape_formula(c) for c in out.columns]
    return out


def write(df: pd.DataFrame, fmt: str) -> str:
    """Serialise to text in ``fmt`` (csv or jsonl); the caller writes it atomically. CSV text
    cells that a spreadsheet would run as formulas are escaped (JSON Lines is data, not run).
    CSV rows end in CRLF (RFC 4180): the writer then quotes every cell holding a CR or LF, which
    with "\n" alone it leaves bare for a CR, and a bare CR splits the row where it is read."""
    if fmt == "csv":
        return csv_safe(df).to_csv(index=False, lineterminator="\r\n")
    if fmt == "jsonl":
        return df.to_json(orient="records", lines=True)
    raise ValueError(f"format must be csv or jsonl, got {fmt!r}")
