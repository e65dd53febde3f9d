"""The regression gate: compare two sets of stored results, metric by metric.

Rules (asv's, adapted):
- exact metrics (analytic, seeded Monte Carlo and simulated results, and `correct`): any change
  is reported and fails the gate; they are deterministic, so a change is a change of code or
  model. A reproduction cell is judged by what produced it (its own ``how``), wherever it sits.
- measured metrics: a change fails only if it is both large and real: the median moved in the
  metric's worse direction by more than the threshold (default 5%, per-suite overrides), and,
  where both sides kept at least 4 repeats, a two-sided Mann-Whitney U test on the samples gives
  p < alpha (default 0.05). Improvements are found the same way and reported, never failing.
- a result present in the baseline and absent from the current set is `missing`.
- a current value (or measured sample) that is NaN or infinite is a regression ("not finite"),
  whatever the baseline holds: a broken measurement must never pass. So is a negative current
  value of a suite metric whose unit is a duration, a size or a rate (non_negative_unit: a time
  of -1 s is a broken timer, not a speed-up). A baseline value broken either way, with a sound
  current one, is reported as an improvement (the baseline was broken). Reproduction cells are
  not held to a sign: their units also name differences ("FEPLB below FasterMoE", in ms).

Bad input raises GateInputError (or UnreadableRecord, naming the file): a path that does not
exist, a file that is not a regular file or is larger than records/inputs.py's RESULT_LIMIT, a
file that is not a valid record, a side with no records, a metric that is not a JSON number (a
string such as "1.2", or true/false; ``correct`` alone is true/false), a number beyond float's
range, a current side of only another kind than the baseline's (suites vs reproductions).

Inputs are result files (`repro run --json`, `repro bench --json`), ``-`` for standard input, or
directories of them (a results store, or a folder such as `.ci/baseline`); in a directory the
newest run per reproduction or suite counts. In a results store (holding ``reproductions/`` or
``suites/``) the results are the files under those two folders; anything else there (``repro
validate``'s ``validation/validation.json``, which holds no run) is skipped with a note naming it.
"""

from __future__ import annotations

import math
import reprlib
from typing import Any, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from moe_repro.records.inputs import RESULT_LIMIT, STDIN, InputError, read_input
from moe_repro.records.record import STORE_DIRS, ReproductionRecord, SuiteRecord, parse_records
from moe_repro.records.stats import mann_whitney_u

EXIT_PASS, EXIT_REGRESSION, EXIT_BAD_INPUT, EXIT_MISSING, EXIT_INTERNAL = 0, 1, 2, 3, 4
MIN_SAMPLES_FOR_TEST = 4
CPU_METRICS = {"cpu_time_s"}  # measured by the CPU clock: gated even on a loaded run
# The defaults of --threshold and --alpha (README, "The gate's error rate", says how they were
# chosen from the measured false-positive rate and power).
DEFAULT_THRESHOLD = 0.05
DEFAULT_ALPHA = 0.05
EXACT_REL = 1e-12  # exact metrics: allow only the last bits of a float to differ

# Units of quantities that cannot be negative: durations, sizes, and rates per second.
_DURATIONS = {"s", "ms", "us", "µs", "ns", "min", "h"}
_SIZES = {"B", "bytes", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB"}


def non_negative_unit(unit: str) -> bool:
    """Whether a metric in ``unit`` is a duration, a size or a rate (".../s"): never negative."""
    return unit in _DURATIONS or unit in _SIZES or unit.endswith("/s")


_RESERVED = {
    "suite",
    "samples",
    "repeats",
    "number",
    "wrong",
    "correct",
    "world_size",
    "ranks_per_node",
    "error",
    "slowdown",
    "load_start",
    "load_end",
}


class GateInputError(ValueError):
    """The gate's inputs cannot be compared (exit 2), as opposed to a regression (exit 1)."""


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
    source: str = ""  # the record kind it came from: reproduction | suite
    non_negative: bool = False  # a suite metric in a unit that cannot be negative
    load: float | None = None  # the point's highest 1-minute load average, where stored
    cores: int | None = None  # the cores of the machine that ran it

    @property
    def loaded(self) -> bool:
        """Measured at a load above the core count (records/environment.py's ``loaded``)."""
        return self.load is not None and self.cores is not None and self.load > self.cores


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


_WARNED: set[str] = set()
_NOTES: list[str] = []


def _result_files(path: Path) -> tuple[list[Path], list[Path], list[Path]]:
    """The JSON files of a directory to read as results, the entries that are not regular files
    (skipped with a warning: opening a FIFO would block), and the files of a results store
    outside its result folders (skipped with a note: they hold no run)."""
    found = sorted(p for p in path.rglob("*.json") if not p.name.startswith("."))
    # is_file() looks with stat and opens nothing
    files = [p for p in found if p.is_file()]
    not_regular = [p for p in found if not p.is_file() and not p.is_dir()]
    store = [path / d for d in STORE_DIRS.values() if (path / d).is_dir()]
    outside = [p for p in files if store and not any(d in p.parents for d in store)]
    return [p for p in files if p not in outside], not_regular, outside


def _read(where, stdin_ok: bool = False) -> list:
    """The records of one file (``-``: standard input), refused with its name if unreadable."""
    try:
        raw = read_input(where, RESULT_LIMIT, stdin_ok=stdin_ok)
    except InputError as e:
        raise GateInputError(str(e)) from None
    if not raw:  # a run that died before writing
        raise GateInputError(f"{_shown(where)}: empty file, no results")
    # lenient_grades: a cell graded match on a NaN is read, and its NaN judged a regression
    return parse_records(raw, _shown(where), lenient_grades=True)


def _shown(where) -> str:
    return "<stdin>" if str(where) == STDIN else str(where)


def _records(path: Path) -> list:
    """Every record in a result file, or in the JSON files under a directory. A file that is
    not a valid record is bad input (UnreadableRecord names it): the gate must not pass a run
    by skipping the file that held its regression."""
    skipped: list[Path] = []
    outside: list[Path] = []
    if str(path) == STDIN:
        records = _read(path, stdin_ok=True)
    else:
        if path.is_dir():
            files, skipped, outside = _result_files(path)
        else:  # a file the user named: read only if it is a regular file (records/inputs.py)
            files = [path]
        records = [record for f in files for record in _read(f)]
    if not records:  # an empty side would turn every result into "missing", not a wrong path
        raise GateInputError(f"no results found in {_shown(path)}")
    for p, why in [
        *((p, "warning: skipped {}: not a regular file") for p in skipped),
        *(
            (
                p,
                "note: skipped {}: not a result (a results store keeps its runs under "
                "reproductions/ and suites/)",
            )
            for p in outside
        ),
    ]:
        if str(p) not in _WARNED:
            _WARNED.add(str(p))  # once, though both sides may be the same directory
            _NOTES.append(f"repro gate: {why.format(p)}")
    return records


def take_notes() -> list[str]:
    """What was skipped, one line each, said once both sides have loaded (bad input on either
    side ends in its one error line alone)."""
    lines = list(_NOTES)
    _NOTES.clear()
    return lines


def load_entries(path: str | Path) -> dict[tuple, Entry]:
    """All comparable metrics of a results file or directory (``-``: standard input), keyed by
    (result, key, metric)."""
    path = Path(path)
    try:
        found = str(path) == STDIN or path.exists()
    except OSError as e:  # e.g. a name longer than the file system allows
        raise GateInputError(f"cannot read {str(path)[:80]}: {e.strerror}") from None
    if not found:
        raise GateInputError(f"no such file or directory: {path}")
    newest: dict[tuple[str, str], ReproductionRecord | SuiteRecord] = {}
    try:
        records = _records(path)
    except OSError as e:  # unreadable directory or file
        raise GateInputError(f"cannot read {str(path)[:80]}: {e.strerror}") from None
    for record in records:
        ident = (record.kind, record.name)
        if ident not in newest or record.timestamp >= newest[ident].timestamp:
            newest[ident] = record
    entries: dict[tuple, Entry] = {}
    for record in newest.values():
        try:
            record_entries = ENTRIES[record.kind](record)
        except GateInputError as e:
            raise GateInputError(f"{_shown(path)}: {e}") from None
        for entry in record_entries:
            entry.source = record.kind
            entries[(entry.result, entry.key, entry.metric)] = entry
    return entries


def check_comparable(baseline: dict[tuple, Entry], current: dict[tuple, Entry]) -> None:
    """Refuse a current side that holds only another kind of result than the baseline (say,
    reproductions against a suite baseline): that is the wrong file, not every result missing."""
    base_kinds = {e.source for e in baseline.values()}
    cur_kinds = {e.source for e in current.values()}
    if base_kinds and cur_kinds and not base_kinds & cur_kinds:
        raise GateInputError(
            f"the current results are {_plural(cur_kinds)} and the baseline "
            f"{_plural(base_kinds)}: nothing to compare"
        )


def _plural(kinds: set[str]) -> str:
    return " and ".join(f"{k} results" for k in sorted(kinds))


def _number(value, where: str) -> float | None:
    """A metric value as a float (None stays None: a value that was not computed). Only a JSON
    number is one: a string ("1.2") or a boolean is bad input, never converted."""
    if value is None or type(value) is float:
        return value
    if type(value) is int:
        try:
            return float(value)
        except OverflowError:  # parse_records refuses these already; a record built otherwise
            raise GateInputError(
                f"{where} is {reprlib.repr(value)}, beyond the range of a float"
            ) from None
    raise GateInputError(f"{where} is {reprlib.repr(value)}, not a number")


def _flag(value, where: str) -> float | None:
    """``correct`` as 1.0 or 0.0: the runner stores it as true/false (None: not checked)."""
    if value is None or type(value) is bool:
        return None if value is None else float(value)
    raise GateInputError(f"{where} is {reprlib.repr(value)}, not true or false")


def _numbers(values, where: str) -> list[float] | None:
    if values is None:
        return None
    if not isinstance(values, list):
        raise GateInputError(f"{where} samples are {reprlib.repr(values)}, not a list of numbers")
    out = [_number(v, f"{where} sample") for v in values]
    numbers = [v for v in out if v is not None]
    if len(numbers) != len(out):
        raise GateInputError(f"{where} samples hold null, not only numbers")
    return numbers


def _how_kind(how: str) -> str:
    """exact for what is deterministic: analytic (A), Monte Carlo with fixed seeds (M) and
    simulated (S) numbers (catalog.HOW_MEANING); measured for what ran for real (R)."""
    letters = {part.strip()[:1] for part in how.split("+")}
    return "exact" if letters <= {"A", "M", "S"} else "measured"


def _reproduction_entries(p: ReproductionRecord) -> list[Entry]:
    default_kind = _how_kind(p.how or "A")
    out = []
    for c in p.cells:
        extra = c.model_extra or {}
        key = f"{c.row} | {c.column}"
        # each cell by what produced it (schema 2 records it per cell): an analytic cell inside
        # a reproduction that also measures is still compared exactly
        kind = extra.get("kind") or (_how_kind(c.how) if c.how else default_kind)
        out.append(
            Entry(
                p.id,
                key,
                "ours",
                kind,
                extra.get("better", "none"),
                c.unit,
                c.ours,
                _numbers(extra.get("samples"), f"{p.id} {key}: ours"),
            )
        )
    return out


def _point_load(r: dict, noise: dict) -> float | None:
    """The highest 1-minute load average stored for a grid point (its own, else the run's)."""
    loads = [r.get("load_start"), r.get("load_end")]
    if not any(isinstance(x, (int, float)) for x in loads):
        loads = [(noise.get(k) or [None])[0] for k in ("load_start", "load_end")]
    numbers = [float(x) for x in loads if isinstance(x, (int, float)) and not isinstance(x, bool)]
    return max(numbers) if numbers else None


def _suite_entries(p: SuiteRecord) -> list[Entry]:
    metrics = {m.name: m for m in p.metrics}
    extra = p.environment.model_extra or {}
    found = extra.get("noise")
    noise: dict = found if isinstance(found, dict) else {}
    cores = noise.get("cpu_count") or extra.get("cpu_count")
    cores = cores if isinstance(cores, int) and not isinstance(cores, bool) else None
    stats = {f"{m}{s}" for m in metrics for s in ("_iqr", "_min", "_max")}
    out = []
    for r in p.records:
        params = p.params or [
            k for k in r if k not in metrics and k not in stats and k not in _RESERVED
        ]
        key = " ".join(f"{k}={r[k]}" for k in params if k in r)
        load = _point_load(r, noise)
        for name, m in metrics.items():
            if name in r:
                measured = m.kind == "measured" and not r.get("simulated")
                kind = "measured" if measured else "exact"  # a simulated record is deterministic
                where = f"{p.suite} {key}: {name}"
                samples = r.get("samples") or {}
                if not isinstance(samples, dict):
                    raise GateInputError(
                        f"{p.suite} {key}: samples are {reprlib.repr(samples)}, not a mapping"
                    )
                out.append(
                    Entry(
                        p.suite,
                        key,
                        name,
                        kind,
                        m.better,
                        m.unit,
                        _number(r[name], where),
                        _numbers(samples.get(name), where),
                        non_negative=non_negative_unit(m.unit),
                        load=load,
                        cores=cores,
                    )
                )
        if "correct" in r:
            out.append(
                Entry(
                    p.suite,
                    key,
                    "correct",
                    "exact",
                    "higher",
                    "",
                    _flag(r["correct"], f"{p.suite} {key}: correct"),
                )
            )
    return out


ENTRIES: dict[str, Callable[[Any], list[Entry]]] = {
    "reproduction": _reproduction_entries,
    "suite": _suite_entries,
}


def parse_threshold(text: str) -> float:
    """'5%' or '0.05' -> 0.05; anything else, or outside [0, 10), is a GateInputError."""
    text = text.strip()
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < 10:  # also refuses nan and inf
        raise GateInputError(
            f"threshold must be a percentage (5%) or a fraction (0.05) in [0, 1000%), got {text!r}"
        )
    return value


def compare(
    baseline: dict[tuple, Entry],
    current: dict[tuple, Entry],
    threshold: float = DEFAULT_THRESHOLD,
    suite_thresholds: dict[str, float] | None = None,
    alpha: float = DEFAULT_ALPHA,
    gate_loaded_wall: bool = False,
) -> list[Finding]:
    findings = []
    for k, b in baseline.items():
        c = current.get(k)
        if c is None:
            findings.append(
                Finding(
                    b.result,
                    b.key,
                    b.metric,
                    b.kind,
                    "missing",
                    b.value,
                    None,
                    unit=b.unit,
                    why="absent from the current results",
                )
            )
            continue
        finding = _compare_one(b, c, (suite_thresholds or {}).get(b.result, threshold), alpha)
        if not gate_loaded_wall:
            finding = _loaded_wall(b, c, finding)
        findings.append(finding)
    for k, c in current.items():
        if k not in baseline:
            findings.append(
                Finding(c.result, c.key, c.metric, c.kind, "new", None, c.value, unit=c.unit)
            )
    return findings


def _loaded_wall(b: Entry, c: Entry, f: Finding) -> Finding:
    """A wall-clock metric (every measured one but CPU_METRICS) of a side measured at a load
    above its core count is not gated: on such a run no threshold keeps the gate's false
    positives within 1% (README, "The gate's error rate"); its CPU time still is. A broken
    value (not finite, negative) stays a regression."""
    if f.status not in ("regression", "improvement") or b.kind != "measured":
        return f
    if b.metric in CPU_METRICS or not (b.loaded or c.loaded):
        return f
    if f.why.startswith(("current value is", "current sample is", "baseline value was")):
        return f
    side = b if b.loaded else c
    f.status = "not-gated"
    f.why = (
        f"{f.why}; not gated: {'baseline' if side is b else 'current'} ran at load "
        f"{side.load:g} on {side.cores} cores (wall clock; cpu_time_s is gated)"
    )
    return f


def _compare_one(b: Entry, c: Entry, threshold: float, alpha: float) -> Finding:
    f = Finding(b.result, b.key, b.metric, b.kind, "unchanged", b.value, c.value, unit=b.unit)
    # NaN compares false with everything, so without this a NaN result would pass every check.
    broken = [v for v in [c.value, *(c.samples or [])] if v is not None and not math.isfinite(v)]
    if broken:
        what = "value" if c.value is not None and not math.isfinite(c.value) else "sample"
        f.status, f.why = "regression", f"current {what} is not finite ({broken[0]})"
        return f
    if c.non_negative:  # a negative duration, size or rate is a broken measurement
        negative = [v for v in [c.value, *(c.samples or [])] if v is not None and v < 0]
        if negative:
            what = "value" if c.value is not None and c.value < 0 else "sample"
            f.status = "regression"
            f.why = (
                f"current {what} is negative ({negative[0]:g} {c.unit}): impossible for its unit"
            )
            return f
    if b.value is not None and c.value is not None and not math.isfinite(b.value):
        f.status, f.why = "improvement", f"baseline value was not finite ({b.value})"
        return f
    if b.non_negative and b.value is not None and c.value is not None and b.value < 0:
        f.status, f.why = "improvement", f"baseline value was negative ({b.value:g} {b.unit})"
        return f
    if c.value is None and b.value is not None:  # a metric that is no longer computed is broken
        f.status, f.why = "regression", "current value is null (the baseline had one)"
        return f
    if b.value is None or c.value is None:
        if c.value is not None:
            f.status, f.why = "changed", "a value appeared where the baseline had none"
        return f
    f.ratio = c.value / b.value if b.value else (math.inf if c.value else 1.0)
    if b.kind == "exact":
        if abs(c.value - b.value) > EXACT_REL * max(abs(b.value), abs(c.value)):
            f.status, f.why = "regression", "exact (analytic/simulated) value changed"
        return f
    worse = (f.ratio > 1 + threshold) if b.better == "lower" else (f.ratio < 1 / (1 + threshold))
    better = (f.ratio < 1 / (1 + threshold)) if b.better == "lower" else (f.ratio > 1 + threshold)
    if b.better == "none":
        # measured with no better direction: nothing says which way is a regression, so it is
        # listed by name as not gated (never silently passed)
        f.status = "not-gated"
        f.why = f"measured, no better direction: not gated (moved {f.ratio - 1:+.1%})"
        return f
    if not (worse or better):
        return f
    no_test = ", too few repeats for a test"
    if b.samples and not all(math.isfinite(v) for v in b.samples):
        no_test = ", no test (a baseline sample is not finite)"
    elif b.samples and b.non_negative and any(v < 0 for v in b.samples):
        no_test = ", no test (a baseline sample is negative)"
    elif b.samples and c.samples and min(len(b.samples), len(c.samples)) >= MIN_SAMPLES_FOR_TEST:
        no_test = ""
        _, f.p_value = mann_whitney_u(b.samples, c.samples)
        if f.p_value >= alpha:
            f.status, f.why = (
                "unchanged",
                f"{f.ratio - 1:+.1%} but not significant (p={f.p_value:.3f})",
            )
            return f
    f.status = "regression" if worse else "improvement"
    f.why = f"median {f.ratio - 1:+.1%} (threshold {threshold:.0%})" + (
        f", Mann-Whitney p={f.p_value:.3g}" if f.p_value is not None else no_test
    )
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
