"""``repro validate``: the predictors scored against published measurements of real clusters.

Offline and analytic/simulated only (seconds): the points are data shipped with the package
(reproductions/validation_points.json, each with its paper, table, row and hardware); see
moe_repro.reproductions.validation for what each predictor is."""

from __future__ import annotations

import click

from moe_repro.cli.errors import BadInput, OutputFile

# as reproductions.validation.PREDICTORS (not imported: `repro --help` starts without it)
_PREDICTORS = ("step-time", "memory", "alltoall-bandwidth", "gemm-time", "attention-core")
# the MoE step-time set (reproductions/moe_step_points.py), scored by its own module
MOE_STEP = "moe-step-time"
_CHOICES = (*_PREDICTORS, MOE_STEP)


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
        if s.predicts:
            out.append(f"{s.predictor} predicts: {s.predicts}")
        if s.groups:  # per measured kind and per model family (summarise)
            out.append(
                table(
                    ["group", "points", "predicted", "MAPE", "max |error|"],
                    [[g, str(n), str(k), _err(m), _err(x)] for g, n, k, m, x in s.groups],
                )
            )
        if s.predictor == "memory":
            out.append(
                "runs that ran, predicted over their GPU's memory: "
                + (", ".join(s.over_capacity) or "none")
            )
            out += [
                f"ran out of memory: {x.point_id}: predicted {_num(x.predicted)} GiB against "
                f"{_num(x.capacity)} GiB ({'over: right' if x.over_capacity else 'under: wrong'})"
                for x in s.oom
            ]
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


def _err(x) -> str:
    return "-" if x is None else f"{x:.1%}"


def format_ep_report(ep: dict) -> str:
    """The EP set: errors per regime and per library, in-sample beside leave-one-library-out,
    then every cell (published in the library's unit, simulated turned into that unit)."""
    from moe_repro.reports.terminal import table

    rows = []
    for name, g in ep["groups"].items():
        h = ep["held_out_groups"][name]
        rows.append(
            [name, str(g.cells), _err(g.mape), _err(g.median), _err(g.max_abs)]
            + [_err(h.mape), _err(h.median), _err(h.max_abs), g.worst]
        )
    held = {x.point_id: x for x in ep["held_out"]}
    out = [
        "\nEP dispatch/combine set: published per-GPU figures of EP libraries (each in its own "
        "unit, components/network/ep_units.py) against the simulator's EP kernel model "
        "(simulated); regime latency = <= 256 tokens per rank. Leave-one-library-out: each "
        "library predicted by the model fitted on the others (the model fits no constant to any "
        "cell, so the two columns agree).",
        table(
            ["group", "cells", "MAPE", "median |err|", "max |err|"]
            + ["LOLO MAPE", "LOLO median", "LOLO max", "worst cell"],
            rows,
        ),
        table(
            ["cell", "published", "simulated", "unit", "error", "LOLO error", "source"],
            [
                [
                    x.point_id,
                    _num(x.measured),
                    _num(x.predicted),
                    x.unit,
                    _pct(x.error),
                    _pct(held[x.point_id].error),
                    x.source,
                ]
                for x in ep["scored"]
            ],
        ),
        f"unscored EP cells: {len(ep['unscored'])} (each says why in "
        "reproductions/ep_validation_points.json)",
    ]
    out += [f"  - not included: {u['what']}: {u['why']}" for u in ep["not_included"]]
    out.append("EP model parameters (none set from a cell):")
    out += [f"  - {p['name']}: {p['value']} ({p['role']}; {p['source']})" for p in ep["parameters"]]
    return "\n".join(out)


def format_moe_report(rep, doc: dict) -> str:
    """The MoE step-time set: in-sample beside leave-one-source-out and calibration-off MAPE,
    the error per source, Spearman's rho and the top pick per layout set, then every point."""
    from moe_repro.reports.terminal import table

    out = [
        "\nMoE step-time set (reproductions/moe_step_points.json): published MoE training runs, "
        "each layout fixed in the planner (analytic); leave-one-source-out re-derives every "
        "constant a point set without that source (constants set by a point: "
        + (", ".join(rep.fitted) or "none")
        + ").",
        table(
            ["points scored", "MAPE", "LOSO MAPE", "calibration off", "max |error|", "worst"],
            [
                [
                    str(rep.counts["scored"]),
                    _err(rep.mape),
                    _err(rep.loso_mape),
                    _err(rep.uncalibrated_mape),
                    _err(rep.max_abs_error),
                    rep.worst,
                ]
            ],
        ),
        table(
            ["source", "points", "MAPE (held out)", "max |error|"],
            [
                [k, str(b["points"]), _err(b["mape"]), _err(b["max"])]
                for k, b in rep.by_source.items()
            ],
        ),
        table(
            ["layout set", "ranked", "rho", "top pick", "top pick / best measured"],
            [
                [
                    s.name,
                    str(len(s.predicted)),
                    "-" if s.rho is None else f"{s.rho:+.2f}",
                    s.top_pick or "-",
                    _err(s.top_pick_vs_best),
                ]
                for s in rep.sets
            ],
        ),
        table(
            ["point", "measured s", "predicted s", "error", "note"],
            [
                [x.point_id, _num(x.measured), _num(x.predicted), _pct(x.error), x.note[:80]]
                for x in rep.scored
                if x.error is not None
            ],
        ),
        f"unscored MoE points: {sum(x.error is None for x in rep.scored)} of {len(rep.scored)} "
        "(each says why: python -m moe_repro.reproductions.moe_step_points)",
    ]
    return "\n".join(out)


def moe_payload(rep) -> dict:
    return {
        "counts": rep.counts,
        "mape": rep.mape,
        "loso_mape": rep.loso_mape,
        "uncalibrated_mape": rep.uncalibrated_mape,
        "max_abs_error": rep.max_abs_error,
        "by_source": rep.by_source,
        "fitted": rep.fitted,
        "points": [dict(vars(x), error=x.error) for x in rep.scored],
        "sets": [vars(s) for s in rep.sets],
    }


def ep_payload(ep: dict) -> dict:
    return {
        "groups": [g.to_dict() for g in ep["groups"].values()],
        "held_out_groups": [g.to_dict() for g in ep["held_out_groups"].values()],
        "cells": [
            dict(x.to_dict(), library=c["library"], regime=c["regime"], platform=c["platform"])
            for x, c in zip(ep["scored"], ep["cells"])
        ],
        "held_out": [x.to_dict() for x in ep["held_out"]],
    }


@click.command(
    "validate",
    short_help="Score the planner, memory model and simulator against published cluster numbers.",
)
@click.option(
    "--predictor",
    "predictors",
    multiple=True,
    type=click.Choice(_CHOICES),
    help="Score only this predictor (repeatable; default all).",
)
@click.option(
    "--json",
    "json_path",
    type=OutputFile(),
    default=None,
    help="Write every scored point and the per-predictor MAPE and max error to this file.",
)
@click.option(
    "--ep-set/--no-ep-set",
    "ep_set",
    default=None,
    help="Score the EP dispatch/combine set (default: on when no --predictor is given).",
)
@click.pass_obj
def command(store, predictors, json_path, ep_set) -> None:
    """Score each predictor against published measurements of real clusters and print, per
    predictor, the mean and maximum absolute percentage error, then every point with its source.

    Example: repro validate --predictor step-time
    """
    from moe_repro.records.atomic import atomic_write_json
    from moe_repro.reproductions.validation import load_points, score_ep, validate

    doc = load_points()
    base = tuple(p for p in predictors if p != MOE_STEP)
    moe = None
    try:
        summaries = validate(base or _PREDICTORS, doc) if base or not predictors else []
        ep = score_ep() if (ep_set if ep_set is not None else not predictors) else None
        if MOE_STEP in predictors or not predictors:
            from moe_repro.reproductions import moe_step_points

            moe = moe_step_points.score()
    except ValueError as e:
        raise BadInput(str(e)) from None
    if summaries:
        click.echo(format_report(summaries, doc))
    if ep is not None:
        click.echo(format_ep_report(ep))
    if moe is not None:
        click.echo(format_moe_report(moe, moe_step_points.load()))
    payload = {
        "summaries": [s.to_dict() for s in summaries],
        "points": [x.to_dict() for s in summaries for x in s.scored],
        "parameters": doc.get("parameters", []),
        "unscored": doc.get("unscored", []),
        "anchors": doc.get("anchors", []),
    }
    if ep is not None:
        payload["ep"] = ep_payload(ep)
    if moe is not None:
        payload["moe_step_time"] = moe_payload(moe)
    if store is not None:  # the site's validation page reads the latest stored result
        from moe_repro.reports.validation_page import STORED

        path = atomic_write_json(store.root / STORED, payload)
        click.echo(f"stored: {path}")
    if json_path:
        atomic_write_json(json_path, payload)
