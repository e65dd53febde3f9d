"""``repro validate``: the predictors scored against published measurements of real clusters.

Offline and analytic/simulated only (seconds): the points are data shipped with the package
(reproductions/validation_points.json, each with its paper, table, row and hardware); see
moe_repro.reproductions.validation for what each predictor is."""

from __future__ import annotations

import click

from moe_repro.cli.errors import BadInput, OutputFile

# as reproductions.validation.PREDICTORS (not imported: `repro --help` starts without it)
_PREDICTORS = ("step-time", "memory", "alltoall-bandwidth", "gemm-time", "attention-core")


def _pct(x) -> str:
    return "-" if x is None else f"{x * 100:+.1f}%"


def _num(x) -> str:
    if x is None:
        return "-"
    return f"{x:.3g}" if abs(x) < 100 else f"{x:.1f}"


def format_report(summaries, doc: dict) -> str:
    from moe_repro.reports.terminal import table

    out = [
        "Predictions scored against published measurements of real clusters, and (gemm-time, attention-core) against "
        "this project's own GEMM measurements on one GPU (predicted numbers are analytic or simulated; "
        "measured numbers are the sources').",
        table(
            ["predictor", "points", "predicted", "MAPE", "max |error|", "worst point"],
            [
                [
                    s.predictor,
                    str(s.points),
                    str(s.predicted),
                    "-" if s.mape is None else f"{s.mape:.1%}",
                    "-" if s.max_abs_error is None else f"{s.max_abs_error:.1%}",
                    s.worst,
                ]
                for s in summaries
            ],
        ),
    ]
    for s in summaries:
        out.append(f"\n{s.predictor} ({s.scored[0].how if s.scored else '-'}):")
        out.append(
            table(
                ["point", "measured", "predicted", "unit", "error", "source", "note"],
                [
                    [
                        x.point_id,
                        _num(x.measured),
                        _num(x.predicted),
                        x.unit,
                        _pct(x.error),
                        x.source,
                        x.note,
                    ]
                    for x in s.scored
                ],
            )
        )
    out.append("\nparameters (none set from a scored point):")
    out += [
        f"  - {p['name']}: {p['value']} ({p['role']}; {p['source']})"
        for p in doc.get("parameters", [])
    ]
    out.append("published measurements left unscored, and why:")
    out += [f"  - {u['what']}: {u['why']}" for u in doc.get("unscored", [])]
    out.append("published errors of other predictors, for comparison:")
    out += [f"  - {a['tool']}: {a['error']} ({a['source']})" for a in doc.get("anchors", [])]
    return "\n".join(out)


@click.command(
    "validate",
    short_help="Score the planner, memory model and simulator against published cluster numbers.",
)
@click.option(
    "--predictor",
    "predictors",
    multiple=True,
    type=click.Choice(_PREDICTORS),
    help="Score only this predictor (repeatable; default all).",
)
@click.option(
    "--json",
    "json_path",
    type=OutputFile(),
    default=None,
    help="Write every scored point and the per-predictor MAPE and max error to this file.",
)
@click.pass_obj
def command(store, predictors, json_path) -> None:
    """Score each predictor against published measurements of real clusters and print, per
    predictor, the mean and maximum absolute percentage error, then every point with its source.

    Example: repro validate --predictor step-time
    """
    from moe_repro.records.atomic import atomic_write_json
    from moe_repro.reproductions.validation import load_points, validate

    doc = load_points()
    try:
        summaries = validate(tuple(predictors) or _PREDICTORS, doc)
    except ValueError as e:
        raise BadInput(str(e)) from None
    click.echo(format_report(summaries, doc))
    payload = {
        "summaries": [s.to_dict() for s in summaries],
        "points": [x.to_dict() for s in summaries for x in s.scored],
        "parameters": doc.get("parameters", []),
        "unscored": doc.get("unscored", []),
        "anchors": doc.get("anchors", []),
    }
    if store is not None:  # the site's validation page reads the latest stored result
        from moe_repro.reports.validation_page import STORED

        path = atomic_write_json(store.root / STORED, payload)
        click.echo(f"stored: {path}")
    if json_path:
        atomic_write_json(json_path, payload)
