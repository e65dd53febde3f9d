"""The regression gate: compare two sets of stored results, metric by metric.

Rules (asv's, adapted):
- exact metrics (analytic and simulated results, and `correct`): any change is reported and
  fails the gate; they are deterministic, so a change is a change of code or model.
- measured metrics: a change fails only if it is both large and real: the median moved in the
  metric's worse direction by more than the threshold (default 5%, per-suite overrides), and,
  where both sides kept at least 4 repeats, a two-sided Mann-Whitney U test on the samples gives
  p < alpha (default 0.05). Improvements are found the same way and reported, never failing.
- a result present in the baseline and absent from the current set is `missing`.

Inputs are result files (`repro run --json`, `repro bench --json`) or directories of them (a
results store, or a folder such as `.ci/baseline`); in a directory the newest run per
reproduction or suite counts.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

from moe_repro.records.record import ReproductionRecord, SuiteRecord, load_records
from moe_repro.records.stats import mann_whitney_u

EXIT_PASS, EXIT_REGRESSION, EXIT_BAD_INPUT, EXIT_MISSING, EXIT_INTERNAL = 0, 1, 2, 3, 4
MIN_SAMPLES_FOR_TEST = 4
EXACT_REL = 1e-12  # exact metrics: allow only the last bits of a float to differ

_RESERVED = {"suite", "samples", "repeats", "number", "wrong", "correct", "world_size",
             "ranks_per_node", "error"}


@dataclass
class Entry:
    result: str  # reproduction id or suite name
    key: str  # a cell ("row | column") or a grid point ("k=v k=v")
    metric: str
    kind: str  # exact | measured
    better: str  # higher | lower | none
    unit: str
    value: float | None
    samples: list[float] | None = None


@dataclass
class Finding:
    result: str
    key: str
    metric: str
    kind: str
    status: str  # regression | improvement | changed | unchanged | missing | new
    baseline: float | None
    current: float | None
    ratio: float | None = None
    p_value: float | None = None
    unit: str = ""
    why: str = ""


def _records(path: Path) -> list:
    """Every record in a result file, or in the JSON files under a directory. A file that is
    not a valid record is bad input (UnreadableRecord names it): the gate must not pass a run
    by skipping the file that held its regression."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*.json") if not p.name.startswith("."))
    records = [record for f in files for record in load_records(f)]
    if not records:  # an empty side would turn every result into "missing", not a wrong path
        raise ValueError(f"no results found in {path}")
    return records


def load_entries(path: str | Path) -> dict[tuple, Entry]:
    """All comparable metrics of a results file or directory, keyed by (result, key, metric)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such file or directory: {path}")
    newest: dict[tuple[str, str], object] = {}
    for record in _records(path):
        ident = (record.kind, record.name)
        if ident not in newest or record.timestamp >= newest[ident].timestamp:
            newest[ident] = record
    entries: dict[tuple, Entry] = {}
    for record in newest.values():
        for e in ENTRIES[record.kind](record):
            entries[(e.result, e.key, e.metric)] = e
    return entries


def _reproduction_entries(p: ReproductionRecord) -> list[Entry]:
    letters = {part.strip()[:1] for part in (p.how or "A").split("+")}
    default_kind = "exact" if letters <= {"A", "S"} else "measured"
    out = []
    for c in p.cells:
        extra = c.model_extra or {}
        out.append(Entry(p.id, f"{c.row} | {c.column}", "ours", extra.get("kind", default_kind),
                         extra.get("better", "none"), c.unit, c.ours, extra.get("samples")))
    return out


def _suite_entries(p: SuiteRecord) -> list[Entry]:
    metrics = {m.name: m for m in p.metrics}
    stats = {f"{m}{s}" for m in metrics for s in ("_iqr", "_min", "_max")}
    out = []
    for r in p.records:
        params = p.params or [k for k in r if k not in metrics and k not in stats and k not in _RESERVED]
        key = " ".join(f"{k}={r[k]}" for k in params if k in r)
        for name, m in metrics.items():
            if name in r:
                measured = m.kind == "measured" and not r.get("simulated")
                kind = "measured" if measured else "exact"  # a simulated record is deterministic
                out.append(Entry(p.suite, key, name, kind, m.better, m.unit,
                                 r[name], (r.get("samples") or {}).get(name)))
        if "correct" in r:
            out.append(Entry(p.suite, key, "correct", "exact", "higher", "", float(r["correct"])))
    return out


ENTRIES = {"reproduction": _reproduction_entries, "suite": _suite_entries}


def parse_threshold(text: str) -> float:
    text = text.strip()
    value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    if not 0 <= value < 10:
        raise ValueError(f"threshold out of range: {text}")
    return value


def compare(baseline: dict[tuple, Entry], current: dict[tuple, Entry], threshold: float = 0.05,
            suite_thresholds: dict[str, float] | None = None, alpha: float = 0.05) -> list[Finding]:
    findings = []
    for k, b in baseline.items():
        c = current.get(k)
        if c is None:
            findings.append(Finding(b.result, b.key, b.metric, b.kind, "missing", b.value, None,
                                    unit=b.unit, why="absent from the current results"))
            continue
        findings.append(_compare_one(b, c, (suite_thresholds or {}).get(b.result, threshold), alpha))
    for k, c in current.items():
        if k not in baseline:
            findings.append(Finding(c.result, c.key, c.metric, c.kind, "new", None, c.value, unit=c.unit))
    return findings


def _compare_one(b: Entry, c: Entry, threshold: float, alpha: float) -> Finding:
    f = Finding(b.result, b.key, b.metric, b.kind, "unchanged", b.value, c.value, unit=b.unit)
    if b.value is None or c.value is None:
        if (b.value is None) != (c.value is None):
            f.status, f.why = "changed", "a value appeared or disappeared"
            if b.kind == "exact":
                f.status = "regression"
        return f
    f.ratio = c.value / b.value if b.value else (math.inf if c.value else 1.0)
    if b.kind == "exact":
        if abs(c.value - b.value) > EXACT_REL * max(abs(b.value), abs(c.value)):
            f.status, f.why = "regression", "exact (analytic/simulated) value changed"
        return f
    worse = (f.ratio > 1 + threshold) if b.better == "lower" else (f.ratio < 1 / (1 + threshold))
    better = (f.ratio < 1 / (1 + threshold)) if b.better == "lower" else (f.ratio > 1 + threshold)
    if b.better == "none":
        if abs(f.ratio - 1) > threshold:
            f.status, f.why = "changed", f"moved {f.ratio - 1:+.1%} (no better direction)"
        return f
    if not (worse or better):
        return f
    if b.samples and c.samples and min(len(b.samples), len(c.samples)) >= MIN_SAMPLES_FOR_TEST:
        _, f.p_value = mann_whitney_u(b.samples, c.samples)
        if f.p_value >= alpha:
            f.status, f.why = "unchanged", f"{f.ratio - 1:+.1%} but not significant (p={f.p_value:.3f})"
            return f
    f.status = "regression" if worse else "improvement"
    f.why = f"median {f.ratio - 1:+.1%} (threshold {threshold:.0%})" + (
        f", Mann-Whitney p={f.p_value:.3g}" if f.p_value is not None else ", too few repeats for a test")
    return f


def exit_code(findings: list[Finding]) -> int:
    statuses = {f.status for f in findings}
    if "regression" in statuses:
        return EXIT_REGRESSION
    if "missing" in statuses:
        return EXIT_MISSING
    return EXIT_PASS


def findings_json(findings: list[Finding]) -> list[dict]:
    return [asdict(f) for f in findings]
