"""``repro gate``: the CI regression check over stored results."""

from __future__ import annotations

import sys

import click

from moe_repro.cli.errors import OutputFile
from moe_repro.cli.finite import FiniteFloatRange

_HELP = """Compare CURRENT results against BASELINE results; fail on regressions.

\b
Analytic, seeded Monte Carlo and simulated metrics must match exactly: any
change fails. Each
reproduction cell is judged by what produced it, so an analytic cell inside a
reproduction that also measures is compared exactly too.
Measured metrics fail only when the median is worse by more than --threshold
AND (with >= 4 repeats on both sides) a two-sided Mann-Whitney U test gives
p < --alpha (exact p for small samples without ties, scipy.stats). A measured
metric with no better direction (most measured reproduction cells) cannot be
judged that way: it is listed by name as "not-gated".
A current value or sample that is NaN or infinite is a regression ("not
finite"), whatever the baseline holds; it never passes, even in a cell graded
match. So is a current value that is null where the baseline had a number, and
a negative current value or sample of a suite metric whose unit is a duration,
a size or a rate (s, ms, us, B, GB, GB/s, ...): a broken measurement, not a
speed-up. (Reproduction cells keep their sign: a cell's unit may name a
difference.) A baseline value broken either way is reported as an improvement.
Improvements and new results are reported, never failing.
A wall-clock metric (time_s and what derives from it) of a run stored at a
1-minute load average above its core count is not gated (listed as
"not-gated", with the load): on such a run no threshold kept the gate's false
positives within 1% (README, "The gate's error rate"); its cpu_time_s is
gated as usual. --gate-loaded-wall gates it anyway.

\b
Inputs: a result file (repro run --json, repro bench --json), - for standard
input (one side), or a directory of result files. In a results store (a
directory holding reproductions/ or suites/), the newest run of each
reproduction and suite counts, and other files there (repro validate's
validation/validation.json) are not a result: skipped with a note.

\b
--history STORE (instead of --baseline and --current) reads every stored run
of a results store and finds the steps in each metric's history (asv's
piecewise-constant fit, records/changepoints.py): a step of at least --min-step
beyond the noise of its segments is a regression or an improvement, named with
the run and commit where it starts. A regression the newest runs still show
is open and fails the gate (exit 1); one a later step undid is listed only, and
so is a wall-clock step beside a run stored at a load above its core count.

\b
Exit codes (CI can tell "slower" from "broken"):
  0  pass: no regression, nothing missing
  1  regression: a measured metric significantly worse, an exact value
     changed, or a current value not finite or impossibly negative
  2  bad input, nothing compared: a path that does not exist; a path that
     is not a regular file (a FIFO, a device such as /dev/zero, a socket:
     refused unread; only - reads a pipe); a file over 256 MiB; a file that
     is empty, not JSON, holds no results, or fails the result schema; a
     metric that is not a JSON number (a string such as "1.2", or true/false:
     only `correct` is true/false); a number beyond the range of a float
     (1e400); a current side holding only another kind of result than the
     baseline (suites vs reproductions); a bad --threshold, --suite-threshold
     or --alpha; a --json path that cannot be written (its directory must
     exist: it is not created)
  3  missing: a baseline result is absent from the current results (and no
     regression)
  4  internal error: the gate itself failed (a bug; one line on stderr)
"""


@click.command("gate", help=_HELP)
@click.option("--baseline", type=click.Path(), help="Result file, directory, or - (stdin).")
@click.option("--current", type=click.Path(), help="Result file, directory, or - (stdin).")
@click.option(
    "--history",
    "history",
    type=click.Path(),
    default=None,
    metavar="STORE",
    help="A results store: find steps in every metric's history instead.",
)
@click.option(
    "--min-step",
    default=None,
    help="--history: the smallest step that counts (default 25%).",
)
@click.option(
    "--threshold",
    default="5%",
    show_default=True,
    help="Minimum change of a measured median that counts (e.g. 5% or 0.05).",
)
@click.option(
    "--suite-threshold",
    "suite_thresholds",
    multiple=True,
    metavar="NAME=PCT",
    help="Per-suite threshold, e.g. --suite-threshold alltoall=15% (repeatable).",
)
@click.option(
    "--alpha",
    type=FiniteFloatRange(0, 1, min_open=True),
    default=0.05,
    show_default=True,
    callback=lambda ctx, param, value: _finite(param, value),
    help="Significance level of the Mann-Whitney U test.",
)
@click.option(
    "--json",
    "json_path",
    type=OutputFile(),
    default=None,
    help="Write every finding to this file (its directory must exist).",
)
@click.option(
    "--gate-loaded-wall",
    is_flag=True,
    help="Also gate wall-clock metrics of runs stored at a load above their core count.",
)
@click.option("--all", "show_all", is_flag=True, help="Also list unchanged metrics.")
def command(
    baseline,
    current,
    history,
    min_step,
    threshold,
    suite_thresholds,
    alpha,
    json_path,
    gate_loaded_wall,
    show_all,
) -> None:
    from moe_repro.cli.errors import BadInput
    from moe_repro.records import gate

    if history is not None and (baseline is not None or current is not None):
        raise BadInput("--history compares a store's runs: give it without --baseline/--current")
    if history is None and (baseline is None or current is None):
        raise BadInput("give --baseline and --current, or --history STORE")
    if min_step is not None and history is None:
        raise BadInput("--min-step applies to --history only")
    try:
        if history is not None:
            code = _history(history, min_step, json_path, show_all)
        else:
            code = _gate(baseline, current, threshold, suite_thresholds, alpha, json_path, show_all)
    except click.ClickException:  # bad input: main prints it and exits 2
        raise
    except Exception as e:  # the gate's own failure must not look like a regression or a pass
        message = " ".join(f"{type(e).__name__}: {e}".split())
        click.echo(f"repro gate: internal error: {message}", err=True)
        sys.exit(gate.EXIT_INTERNAL)
    sys.exit(code)


def _gate(
    baseline,
    current,
    threshold,
    suite_thresholds,
    alpha,
    json_path,
    show_all,
    gate_loaded_wall=False,
) -> int:
    from moe_repro.cli.errors import BadInput
    from moe_repro.records import gate
    from moe_repro.records.atomic import atomic_write_json
    from moe_repro.records.record import UnreadableRecord
    from moe_repro.reports.terminal import table

    # Everything the gate reads or writes is checked before it compares anything.
    try:
        global_t = gate.parse_threshold(threshold)
        per_suite = {}
        for pair in suite_thresholds:
            name, sep, pct = pair.partition("=")
            if not sep or not name:
                raise gate.GateInputError(f"--suite-threshold expects NAME=PCT, got {pair!r}")
            per_suite[name] = gate.parse_threshold(pct)
        if baseline == current == "-":
            raise gate.GateInputError("only one of --baseline and --current can be - (stdin)")
        base = _side("baseline", baseline, gate)
        cur = _side("current", current, gate)
        gate.check_comparable(base, cur)
    except (gate.GateInputError, UnreadableRecord) as e:
        raise BadInput(" ".join(str(e).split())) from None
    for line in gate.take_notes():
        click.echo(line, err=True)
    findings = gate.compare(base, cur, global_t, per_suite, alpha, gate_loaded_wall)
    shown = [f for f in findings if show_all or f.status != "unchanged"]
    rows = [
        [
            f.status,
            f.result,
            f.key,
            f.metric,
            _fmt(f.baseline),
            _fmt(f.current),
            "-" if f.ratio is None else f"{f.ratio:.3f}",
            f.why,
        ]
        for f in shown
    ]
    if rows:
        click.echo(
            table(
                ["status", "result", "key", "metric", "baseline", "current", "ratio", "why"], rows
            )
        )
    counts = {}
    for f in findings:
        counts[f.status] = counts.get(f.status, 0) + 1
    click.echo("gate: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    if json_path:
        try:
            atomic_write_json(
                json_path,
                {"findings": gate.findings_json(findings), "counts": counts},
                make_parents=False,
            )
        except OSError as e:  # checked above; the disk can still fill or the directory vanish
            raise BadInput(f"cannot write --json {json_path}: {e.strerror or e}") from None
    return gate.exit_code(findings)


def _history(path: str, min_step, json_path, show_all) -> int:
    """``--history STORE``: the steps of every history in a results store."""
    from dataclasses import asdict
    from pathlib import Path

    from moe_repro.cli.errors import BadInput
    from moe_repro.records import gate
    from moe_repro.records.atomic import atomic_write_json
    from moe_repro.records.changepoints import DEFAULT_MIN_RATIO
    from moe_repro.records.history import flag_store
    from moe_repro.records.record import KINDS, STORE_DIRS
    from moe_repro.records.store import ResultsStore

    try:
        ratio = DEFAULT_MIN_RATIO if min_step is None else 1 + gate.parse_threshold(min_step)
    except gate.GateInputError as e:
        raise BadInput(str(e).replace("threshold", "--min-step")) from None
    root = Path(path)
    if not root.is_dir():
        raise BadInput(f"--history {path}: not a directory (a results store)")
    store = ResultsStore(
        root, on_unreadable=lambda e: click.echo(f"repro gate: warning: skipped {e}", err=True)
    )
    try:
        has_runs = any(store.names(kind) for kind in KINDS)
    except OSError as e:
        raise BadInput(f"--history {path}: cannot read: {e.strerror or e}") from None
    if not has_runs:
        folders = " or ".join(f"{d}/" for d in STORE_DIRS.values())
        raise BadInput(f"--history {path}: no stored runs (a results store holds {folders})")
    flags = flag_store(store, ratio)
    shown = sorted(flags, key=lambda f: (not f.open, f.step.kind != "regression"))
    rows = [
        [
            ("open " if f.open else "") + f.step.kind + (" (loaded run)" if f.loaded else ""),
            f.series.result,
            f.series.key,
            f.series.metric,
            _fmt(f.step.before),
            _fmt(f.step.after),
            f"{f.step.ratio:.3f}",
            f"{f.run} ({(f.commit or 'no commit')[:10]})",
        ]
        for f in shown
    ]
    if rows:
        from moe_repro.reports.terminal import table

        click.echo(
            table(["step", "result", "key", "metric", "before", "after", "ratio", "from run"], rows)
        )
    failing = sum(f.fails for f in flags)
    loaded = sum(f.open and f.loaded for f in flags)
    regressions = sum(f.step.kind == "regression" for f in flags)
    undone = regressions - failing - loaded
    click.echo(
        f"gate --history: {failing} open regression(s), {loaded} beside a loaded run (wall "
        f"clock, not gated), {undone} undone, {len(flags) - regressions} improvement(s) "
        f"(steps of at least {ratio - 1:.0%})"
    )
    if json_path:
        steps = [
            {
                **asdict(f.step),
                "result": f.series.result,
                "key": f.series.key,
                "metric": f.series.metric,
                "run": f.run,
                "commit": f.commit,
                "open": f.open,
                "loaded": f.loaded,
            }
            for f in flags
        ]
        try:
            atomic_write_json(json_path, {"steps": steps}, make_parents=False)
        except OSError as e:
            raise BadInput(f"cannot write --json {json_path}: {e.strerror or e}") from None
    return gate.EXIT_REGRESSION if failing else gate.EXIT_PASS


def _side(which: str, path: str, gate):
    """The entries of one side; an error names the side (the file is named by the loader)."""
    from moe_repro.records.record import UnreadableRecord

    try:
        return gate.load_entries(path)
    except (gate.GateInputError, UnreadableRecord) as e:
        raise gate.GateInputError(f"{which}: {e}") from None


def _finite(param, value: float) -> float:
    if value != value:  # NaN passes click's range check (every comparison with it is false)
        raise click.BadParameter(f"{value} is not a number", param=param)
    return value


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.6g}"
