"""Plain-text tables for the terminal."""

from __future__ import annotations

from moe_repro.records.record import ReproductionRecord, SuiteRecord, grade_counts
from moe_repro.reports.numbers import column, fmt

SPREAD_FLAG = 0.5  # a spread (IQR / median) above this is flagged under the table
SIZE_KEYS = ("size", "sizes", "bytes")  # grid keys that are byte counts


def _num(x, unit: str | None = None) -> str:
    """The site's number format (reports/numbers.py): 12,345; 0.0031; 3.14 ms; 2.93 MiB."""
    return fmt(x, unit, ascii=True)


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def format_result(record: ReproductionRecord) -> str:
    head = f"{record.id}: {record.title} ({record.element}, {record.how_words})"
    rows = []
    for c in record.cells:
        if c.deviation is None:
            dev = "-"
        elif c.deviation_unit == "pp":
            dev = f"{c.deviation:+.1f} pp"
        else:
            dev = f"{c.deviation:+.2%}"
        grade = f"{c.verdict} ({c.cause})" if c.cause else c.verdict
        rows.append(
            [
                c.row,
                c.column,
                _num(c.paper_printed or c.paper),
                _num(c.ours),
                c.unit,
                c.how or "",
                dev,
                grade,
            ]
        )
    out = [head, table(["row", "column", "paper", "ours", "unit", "how", "dev", "grade"], rows)]
    notes = [(c.row, c.column, c.note) for c in record.cells if c.note]
    if notes:
        out.append("notes:")
        out += [f"  {r} / {col}: {n}" for r, col, n in notes]
    out.append(
        "grades: "
        + ", ".join(f"{v} {k}" for k, v in grade_counts(c.verdict for c in record.cells).items())
    )
    out.append(f"{record.id}: {record.status}")  # 'x of y compared cells agree, ...' last
    return "\n".join(out)


def _point_without_impl(r: dict, keys: list[str]) -> tuple:
    return tuple(str(r.get(k)) for k in keys if k != "impl")


def _impl_baseline(records: list[dict], keys: list[str], metric: str):
    """Where a run compares implementations (an ``impl`` axis with several values), each row's
    main metric is also given as a ratio to the first implementation's at the same point, so
    side-by-side results read as "x pft" without arithmetic. None otherwise."""
    impls = list(dict.fromkeys(r.get("impl") for r in records))
    if "impl" not in keys or len(impls) < 2:
        return None
    first = impls[0]
    return first, {
        _point_without_impl(r, keys): r.get(metric) for r in records if r.get("impl") == first
    }


def format_records(record: SuiteRecord) -> str:
    """A suite run's table: the record's table keys (default: every grid parameter), then the
    median of its table metrics (default: the first three declared)."""
    records = record.records
    if not records:
        return "(no records)"
    keys = list(record.table_keys) or list(record.params)
    metric_names = [m.name for m in record.metrics if m.name in records[0]]
    if record.table_metrics:
        metric_names = [m for m in record.table_metrics if m in records[0]]
    metric_names = metric_names[: len(record.table_metrics) or 3]
    headers = keys + [f"{m} (median)" for m in metric_names] + ["spread(iqr)"]
    has_check = "correct" in records[0]
    if has_check:
        headers.append("#wrong")
    simulated = any(r.get("simulated") for r in records)
    if simulated:  # a simulated number always says so
        headers.append("simulated")
    units = {m.name: m.unit for m in record.metrics}  # seconds and bytes print in their units
    main = metric_names[0]
    baseline = _impl_baseline(records, keys, main)
    # One unit per column, named in the header (reports/numbers.py column()).
    columns = []
    for k in keys:  # grid values are labels: each in its own unit (1 KiB, 4 MiB)
        columns.append([_num(r.get(k), "B" if k in SIZE_KEYS else None) for r in records])
    for j, m in enumerate(metric_names):
        name, cells = column([r.get(m) for r in records], units.get(m), ascii=True)
        headers[len(keys) + j] = f"{m} (median, {name})" if name else f"{m} (median)"
        columns.append(cells)
    if baseline:
        headers.insert(len(keys) + 1, f"x {baseline[0]}")
    rows, flagged = [], False
    for n, r in enumerate(records):
        row = [cells[n] for cells in columns]
        if baseline:
            base = baseline[1].get(_point_without_impl(r, keys))
            row.insert(
                len(keys) + 1, f"{r[main] / base:.2f}" if base and r.get(main) is not None else "-"
            )
        spread = (
            r[main + '_iqr'] / r[main] if r.get(main) and r.get(main + "_iqr") is not None else None
        )
        flag = spread is not None and spread > SPREAD_FLAG
        flagged |= flag
        row.append("-" if spread is None else f"{spread:.1%}" + (" !" if flag else ""))
        if has_check:
            row.append(str(r.get("wrong", "-")))
        if simulated:
            row.append("yes" if r.get("simulated") else "no (real)")
        rows.append(row)
    out = table(headers, rows)
    if flagged:
        out += (
            f"\n! spread (IQR / median) above {SPREAD_FLAG:.0%}: the samples disagree (a busy machine, "
            f"or too short a call); rerun with more --repeats or a larger --min-sample-s on an idle machine"
        )
    return out
