"""Two stored runs side by side (``repro compare A B``; asv's ``compare``, codspeed's report).

A and B each name a stored run or a commit of the results store: a commit (at least 4 hex
digits of ``git_commit``, every result stored at it, the newest run of each), a stored file's
name (``<timestamp>-<commit>``, with or without ``.json``: every result stored under that name;
``<suite>/<name>``: that suite's alone), or a path
to a result file. Every metric both sides hold gets a row: its value at A and at B, the ratio
B / A and a verdict by the gate's own rule (records/gate.py, the same threshold and test):

- ``slower`` / ``faster``: worse / better by more than the threshold and, where both sides
  kept at least 4 samples, significant by the Mann-Whitney U test (asv's rule);
- ``noisy``: moved past the threshold but not significantly (the samples overlap), or a
  wall-clock metric of a run at a load above its core count (the gate does not gate it);
- ``same``: within the threshold; ``changed``: an exact value, or one without a better
  direction, changed.

For a throughput (higher is better) ``slower`` means lower. Reproductions present on both sides
also list the cells whose grade changed (``match`` -> ``deviates``, ...).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from moe_repro.records.record import KINDS, ReproductionRecord, SuiteRecord, UnreadableRecord

VERDICT_OF_STATUS = {"regression": "slower", "improvement": "faster", "unchanged": "same"}
_HEX = re.compile(r"^[0-9a-fA-F]{4,40}$")


class CompareInputError(ValueError):
    """A name that matches no stored run or commit, or more than one commit (exit 2)."""


@dataclass
class Row:
    kind: str  # suite | reproduction
    suite: str  # suite name or reproduction id
    metric: str
    params: str  # the grid point ("k=v k=v") or the cell ("row | column")
    unit: str
    value_a: float | None
    value_b: float | None
    ratio: float | None  # value_b / value_a
    p_value: float | None
    verdict: str  # slower | faster | same | noisy | changed
    why: str = ""


@dataclass
class GradeChange:
    reproduction: str
    cell: str  # "row | column"
    grade_a: str
    grade_b: str


@dataclass
class Comparison:
    a: str  # what A resolved to, in words
    b: str
    rows: list[Row] = field(default_factory=list)
    grade_changes: list[GradeChange] = field(default_factory=list)
    only_a: list[str] = field(default_factory=list)  # results stored at A only ("suite gemm")
    only_b: list[str] = field(default_factory=list)
    noise_a: str = ""  # the load the side's runs were stored at, in words ("" where unknown)
    noise_b: str = ""

    def verdicts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.rows:
            counts[r.verdict] = counts.get(r.verdict, 0) + 1
        return counts

    def slower(self) -> list[Row]:
        return [r for r in self.rows if r.verdict == "slower"]


Side = dict[tuple[str, str], ReproductionRecord | SuiteRecord]


def _all_runs(store):
    for kind in KINDS:
        for name in store.names(kind):
            for path in store.history(kind, name):
                yield kind, name, path


def resolve(store, name: str) -> tuple[Side, str]:
    """The records ``name`` stands for (newest per result) and a description of them."""
    text = name.strip()
    if not text:
        raise CompareInputError("an empty name: give a commit or a stored run")
    path = Path(text)
    if path.suffix == ".json" and path.is_file() and not path.name.startswith("."):
        from moe_repro.records.record import load_records

        try:
            records = load_records(path)
        except UnreadableRecord as e:
            raise CompareInputError(str(e)) from None
        return _newest(records), f"file {path}"
    stem = text.removesuffix(".json")
    folder, _, file_stem = stem.rpartition("/")
    runs = [
        (kind, n, p)
        for kind, n, p in _all_runs(store)
        if p.stem == file_stem and (not folder or folder == n)
    ]
    if runs:  # one stored file, or files of several results stored under the same name
        side: Side = {}
        for kind, n, p in runs:
            record = store.read(p)
            if record is None:
                raise CompareInputError(f"stored run {p} cannot be read")
            side[(kind, n)] = record
        return side, f"run {stem}"
    if _HEX.match(text):
        matched: dict[str, list] = {}
        for kind, n, p in _all_runs(store):
            record = store.read(p)
            commit = record.environment.git_commit if record is not None else None
            if commit and commit.lower().startswith(text.lower()):
                matched.setdefault(commit, []).append(record)
        if len(matched) > 1:
            raise CompareInputError(
                f"{text!r} is the start of {len(matched)} commits "
                f"({', '.join(c[:12] for c in sorted(matched))}): give more digits"
            )
        if matched:
            (commit, records), *_ = matched.items()
            return _newest(records), f"commit {commit[:12]}"
    known = sorted({(r.environment.git_commit or "")[:10] for r in _records(store)} - {""})
    hint = f" (commits stored: {', '.join(known[:6])}{', ...' if len(known) > 6 else ''})"
    raise CompareInputError(
        f"no stored run or commit named {text!r} in {store.root}" + (hint if known else "")
    )


def _records(store):
    for _, _, p in _all_runs(store):
        record = store.read(p)
        if record is not None:
            yield record


def _newest(records) -> Side:
    out: Side = {}
    for record in records:
        ident = (record.kind, record.name)
        if ident not in out or record.timestamp >= out[ident].timestamp:
            out[ident] = record
    return out


def compare_runs(
    store, a: str, b: str, threshold: float | None = None, alpha: float | None = None
) -> Comparison:
    """A against B (names as the module says); threshold and alpha default to the gate's."""
    from moe_repro.records import gate

    side_a, what_a = resolve(store, a)
    side_b, what_b = resolve(store, b)
    threshold = gate.DEFAULT_THRESHOLD if threshold is None else threshold
    alpha = gate.DEFAULT_ALPHA if alpha is None else alpha
    out = Comparison(what_a, what_b, noise_a=noise_words(side_a), noise_b=noise_words(side_b))
    for ident in sorted(side_a.keys() | side_b.keys()):
        label = f"{ident[0]} {ident[1]}"
        if ident not in side_b:
            out.only_a.append(label)
            continue
        if ident not in side_a:
            out.only_b.append(label)
            continue
        ra, rb = side_a[ident], side_b[ident]
        try:
            ea = {(e.key, e.metric): e for e in gate.ENTRIES[ra.kind](ra)}
            eb = {(e.key, e.metric): e for e in gate.ENTRIES[rb.kind](rb)}
        except gate.GateInputError as e:
            raise CompareInputError(f"{label}: {e}") from None
        for k, ea_entry in ea.items():
            eb_entry = eb.get(k)
            if eb_entry is None:
                continue
            f = gate._loaded_wall(
                ea_entry, eb_entry, gate._compare_one(ea_entry, eb_entry, threshold, alpha)
            )
            out.rows.append(_row(ident, ea_entry, f))
        if isinstance(ra, ReproductionRecord) and isinstance(rb, ReproductionRecord):
            grades_a = {f"{c.row} | {c.column}": c.verdict for c in ra.cells}
            for c in rb.cells:
                cell = f"{c.row} | {c.column}"
                if cell in grades_a and grades_a[cell] != c.verdict:
                    out.grade_changes.append(GradeChange(ra.id, cell, grades_a[cell], c.verdict))
    return out


def _row(ident, entry, f) -> Row:
    verdict = VERDICT_OF_STATUS.get(f.status, "changed")
    if f.status == "unchanged" and f.p_value is not None:
        verdict = "noisy"  # past the threshold, not significant
    if f.status == "regression" and entry.better == "none":
        verdict = "changed"
    if f.status == "not-gated":
        moved = f.ratio is not None and f.ratio > 0 and abs(math.log(f.ratio)) > 1e-12
        verdict = "changed" if moved else "same"
        if "ran at load" in f.why:  # a wall-clock change on a loaded run (gate._loaded_wall)
            verdict = "noisy"
    if f.kind == "exact" and f.status == "regression" and entry.better in ("lower", "higher"):
        worse = (f.ratio or 1) > 1 if entry.better == "lower" else (f.ratio or 1) < 1
        verdict = "slower" if worse else "faster"
    return Row(
        ident[0],
        ident[1],
        entry.metric,
        entry.key,
        entry.unit,
        f.baseline,
        f.current,
        f.ratio,
        f.p_value,
        verdict,
        f.why,
    )


def noise_words(side: Side) -> str:
    """The highest 1-minute load average stored with a side's runs (environment ``noise``), the
    cores, and whether that was above them; "" where no run kept a load."""
    loads: list[float] = []
    cores: set[int] = set()
    for record in side.values():
        noise = (record.environment.model_extra or {}).get("noise")
        if not isinstance(noise, dict):
            continue
        for key in ("load_start", "load_end"):
            value = noise.get(key)
            if isinstance(value, list) and value and isinstance(value[0], (int, float)):
                loads.append(float(value[0]))
        if isinstance(noise.get("cpu_count"), int):
            cores.add(noise["cpu_count"])
    if not loads:
        return ""
    n = min(cores) if cores else None
    where = f" on {n} cores" if n else ""
    flag = " (loaded: wall-clock rows are noisy)" if n and max(loads) > n else ""
    return f"load average up to {max(loads):g}{where}{flag}"


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def format_comparison(comparison: Comparison, show_all: bool = False) -> str:
    """The comparison as terminal text: changed rows (every row with ``show_all``), the grade
    changes, what only one side holds, and the count per verdict."""
    c = comparison
    lines = [
        f"A: {c.a}" + (f", {c.noise_a}" if c.noise_a else ""),
        f"B: {c.b}" + (f", {c.noise_b}" if c.noise_b else ""),
    ]
    rows = [r for r in c.rows if show_all or r.verdict != "same"]
    if rows:
        head = ["verdict", "result", "params", "metric", "A", "B", "B/A", "p"]
        cells = [
            [
                r.verdict,
                r.suite,
                r.params,
                r.metric,
                _fmt(r.value_a),
                _fmt(r.value_b),
                "-" if r.ratio is None else f"{r.ratio:.3f}",
                "-" if r.p_value is None else f"{r.p_value:.3g}",
            ]
            for r in rows
        ]
        widths = [max(len(h), *(len(row[i]) for row in cells)) for i, h in enumerate(head)]
        for row in [head, ["-" * w for w in widths], *cells]:
            lines.append("  ".join(x.ljust(w) for x, w in zip(row, widths)).rstrip())
    for g in c.grade_changes:
        lines.append(f"grade changed: {g.reproduction} {g.cell}: {g.grade_a} -> {g.grade_b}")
    if c.only_a:
        lines.append(f"only at A: {', '.join(c.only_a)}")
    if c.only_b:
        lines.append(f"only at B: {', '.join(c.only_b)}")
    counts = c.verdicts()
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "nothing in common"
    lines.append(f"compare: {summary}")
    return "\n".join(lines)
