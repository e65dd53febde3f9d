"""``repro gate``: the CI regression check over stored results."""

from __future__ import annotations

import sys

import click

_HELP = """Compare CURRENT results against BASELINE results; fail on regressions.

\b
Analytic and simulated metrics must match exactly: any change fails.
Measured metrics fail only when the median is worse by more than --threshold
AND (with >= 4 repeats on both sides) a Mann-Whitney U test gives p < --alpha.
Improvements and new results are reported, never failing.

\b
Exit codes:
  0  no regression, nothing missing
  1  regression (a measured metric significantly worse, or an exact value changed)
  2  bad input (a path that does not exist, a malformed threshold)
  3  a baseline result is missing from the current results (and no regression)
  4  internal error while comparing
"""


@click.command("gate", help=_HELP)
@click.option("--baseline", required=True, type=click.Path(), help="Result file or directory.")
@click.option("--current", required=True, type=click.Path(), help="Result file or directory.")
@click.option("--threshold", default="5%", show_default=True,
              help="Minimum change of a measured median that counts (e.g. 5% or 0.05).")
@click.option("--suite-threshold", "suite_thresholds", multiple=True, metavar="NAME=PCT",
              help="Per-suite threshold, e.g. --suite-threshold alltoall=15% (repeatable).")
@click.option("--alpha", type=click.FloatRange(0, 1), default=0.05, show_default=True,
              help="Significance level of the Mann-Whitney U test.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write every finding to this file.")
@click.option("--all", "show_all", is_flag=True, help="Also list unchanged metrics.")
def command(baseline, current, threshold, suite_thresholds, alpha, json_path, show_all) -> None:
    from moe_repro.records import gate
    from moe_repro.records.atomic import atomic_write_json
    from moe_repro.cli.errors import BadInput
    from moe_repro.reports.terminal import table

    try:
        global_t = gate.parse_threshold(threshold)
        per_suite = {}
        for pair in suite_thresholds:
            name, sep, pct = pair.partition("=")
            if not sep:
                raise ValueError(f"--suite-threshold expects NAME=PCT, got {pair!r}")
            per_suite[name] = gate.parse_threshold(pct)
        base, cur = gate.load_entries(baseline), gate.load_entries(current)
    except (ValueError, FileNotFoundError) as e:
        raise BadInput(str(e)) from None
    if not base:
        raise BadInput(f"no results found in baseline {baseline}")
    try:
        findings = gate.compare(base, cur, global_t, per_suite, alpha)
    except Exception as e:  # the gate's own failure must not look like a regression
        click.echo(f"repro gate: internal error: {type(e).__name__}: {e}", err=True)
        sys.exit(gate.EXIT_INTERNAL)
    shown = [f for f in findings if show_all or f.status != "unchanged"]
    rows = [[f.status, f.result, f.key, f.metric, _fmt(f.baseline), _fmt(f.current),
             "-" if f.ratio is None else f"{f.ratio:.3f}", f.why] for f in shown]
    if rows:
        click.echo(table(["status", "result", "key", "metric", "baseline", "current", "ratio", "why"], rows))
    counts = {}
    for f in findings:
        counts[f.status] = counts.get(f.status, 0) + 1
    click.echo("gate: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    if json_path:
        atomic_write_json(json_path, {"findings": gate.findings_json(findings), "counts": counts})
    sys.exit(gate.exit_code(findings))


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.6g}"
