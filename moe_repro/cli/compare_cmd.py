"""``repro compare A B``: what changed between two stored runs or commits (asv compare)."""

from __future__ import annotations

import click

from moe_repro.cli.errors import OutputFile

_HELP = """Compare two stored runs or commits of the results store, metric by metric.

\b
A and B each name: a commit (4 to 40 hex digits of the stored git_commit:
every result stored at it, the newest run of each), a stored run's file name
(<timestamp>-<commit>, or <suite>/<timestamp>-<commit>), or a result file.
Each metric both hold gets a row: A, B, B/A, the Mann-Whitney p where both
sides kept at least 4 samples, and a verdict by the gate's rule: slower or
faster (past --threshold and significant at --alpha), noisy (past the
threshold, not significant), same, or changed (an exact value, or one with no
better direction). Reproductions on both sides also list cells whose grade
changed. Only rows that are not "same" are shown unless --all.

\b
Exit codes: 0 compared (a slower row is a result, not an error; use repro gate
to fail CI), 2 a name that matches no stored run or commit, or bad options.
"""


@click.command("compare", help=_HELP)
@click.argument("a")
@click.argument("b")
@click.option(
    "--threshold",
    default=None,
    help="Minimum change of a measured median that counts (default: the gate's).",
)
@click.option(
    "--alpha",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    default=None,
    help="Significance level of the Mann-Whitney U test (default: the gate's).",
)
@click.option("--all", "show_all", is_flag=True, help="Also list metrics that did not move.")
@click.option(
    "--json",
    "json_path",
    type=OutputFile(),
    default=None,
    help="Write the comparison to this file.",
)
@click.pass_obj
def command(store, a, b, threshold, alpha, show_all, json_path) -> None:
    from dataclasses import asdict

    from moe_repro.cli.errors import BadInput
    from moe_repro.records import gate
    from moe_repro.records.atomic import atomic_write_json
    from moe_repro.records.compare import CompareInputError, compare_runs, format_comparison

    try:
        limit = None if threshold is None else gate.parse_threshold(threshold)
        if alpha is not None and alpha != alpha:
            raise gate.GateInputError("--alpha must be a number")
        comparison = compare_runs(store, a, b, threshold=limit, alpha=alpha)
    except (CompareInputError, gate.GateInputError) as e:
        raise BadInput(" ".join(str(e).split())) from None
    click.echo(format_comparison(comparison, show_all=show_all))
    if json_path:
        try:
            atomic_write_json(json_path, asdict(comparison), make_parents=False)
        except OSError as e:
            raise BadInput(f"cannot write --json {json_path}: {e.strerror or e}") from None
