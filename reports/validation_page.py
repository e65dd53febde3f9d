"""The validation page: our predictions against published measurements of real clusters.

It reads what ``repro validate`` stored (``<results>/validation/validation.json``: every scored
point, per-predictor MAPE and maximum error, the parameters' sources and the anchors' published
errors) and draws, per predictor, predicted against measured on log axes with the identity line
and a band of the grading policy's prediction tolerance (records/grading.PREDICTION_TOLERANCE: a
prediction inside it is graded close), beside the errors Calculon, vTrain and ASTRA-sim publish
for theirs. Nothing is recomputed here (reports read stored results only)."""

from __future__ import annotations

import json
from pathlib import Path

from moe_repro.records.atomic import atomic_write_bytes, atomic_write_text
from moe_repro.records.grading import PREDICTION_TOLERANCE
from moe_repro.reports import html

STORED = Path("validation") / "validation.json"
BAND = PREDICTION_TOLERANCE  # the band drawn around the identity line: the graded tolerance


def stored_validation(root: Path) -> dict | None:
    """The stored ``repro validate`` result under a results root, or None (never run, unreadable)."""
    from moe_repro.records.inputs import RESULT_LIMIT, read_input

    path = Path(root) / STORED
    try:  # a FIFO or device in its place is refused unread (records/inputs.py)
        return json.loads(read_input(path, RESULT_LIMIT).decode("utf-8"))
    except (OSError, ValueError):
        return None


MEASURED_HERE = (
    "gemm-time",
    "attention-core",
)  # predictors scored against this project's own measurements


def _png_and_svg(f) -> dict[str, bytes]:
    """A drawn figure's PNG and SVG bytes; the figure is closed."""
    import io

    import matplotlib.pyplot as plt

    out = {}
    for fmt in ("png", "svg"):
        buf = io.BytesIO()
        f.savefig(buf, format=fmt, bbox_inches="tight")
        out[fmt] = buf.getvalue()
    plt.close(f)
    return out


def scatter(predictor: str, points: list[dict], unit: str) -> dict[str, bytes]:
    """Predicted vs measured (log-log), identity line and +-BAND band; PNG and SVG bytes."""

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [p for p in points if p["predicted"] is not None]
    f, ax = plt.subplots(figsize=(5.2, 4.4), dpi=110)
    if pts:
        lo = min(min(p["measured"], p["predicted"]) for p in pts) / 1.3
        hi = max(max(p["measured"], p["predicted"]) for p in pts) * 1.3
        xs = [lo, hi]
        ax.fill_between(
            xs,
            [x * (1 - BAND) for x in xs],
            [x * (1 + BAND) for x in xs],
            color="0.88",
            label=f"+-{BAND:.0%}",
        )
        ax.plot(xs, xs, color="0.3", linewidth=1, label="predicted = measured")
        ours = predictor in MEASURED_HERE
        ax.plot(
            [p["measured"] for p in pts],
            [p["predicted"] for p in pts],
            "o",
            color="tab:blue",
            markersize=3 if len(pts) > 40 else 6,
            label="measured here" if ours else "published point",
        )
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(
        f"measured ({unit}, {'on one GPU here' if predictor in MEASURED_HERE else 'as published'})"
    )
    ax.set_ylabel(f"predicted ({unit}, {'simulated' if _simulated(predictor) else 'analytic'})")
    ax.set_title(predictor)
    ax.legend(loc="upper left", fontsize=8)
    return _png_and_svg(f)


def terms_figure(points: list[dict], unit: str) -> dict[str, bytes] | None:
    """The memory predictor's points, one row each (sorted by measured), as stacked bars of the
    prediction by term (the live-tensor terms, then each sourced term) against the measured
    peak: left in the unit, the measured peak a black mark; right each bar as a share of its
    measured peak (the line at 1), so the small runs show too. Where the sources print only a
    total, this is what our prediction of it is made of. PNG and SVG bytes; None when no point
    carries terms."""

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = sorted((p for p in points if p.get("terms")), key=lambda p: p["measured"])
    if not pts:
        return None
    names = list(dict.fromkeys(k for p in pts for k, v in p["terms"].items() if v > 0))
    colours = plt.get_cmap("tab20").colors
    f, (ax, rel) = plt.subplots(
        1,
        2,
        figsize=(12.0, 1.4 + 0.24 * len(pts)),
        dpi=110,
        sharey=True,
        gridspec_kw={"width_ratios": [3, 2]},
    )
    ys = list(range(len(pts)))
    left = [0.0] * len(pts)
    share = [0.0] * len(pts)
    for i, name in enumerate(names):
        widths = [p["terms"].get(name, 0.0) for p in pts]
        parts = [w / p["measured"] for w, p in zip(widths, pts)]
        colour = colours[i % len(colours)]
        ax.barh(ys, widths, left=left, height=0.7, color=colour, label=name)
        rel.barh(ys, parts, left=share, height=0.7, color=colour)
        left = [a + w for a, w in zip(left, widths)]
        share = [a + w for a, w in zip(share, parts)]
    kinds = ", ".join(sorted({p["measured_kind"] for p in pts}))
    ax.plot(
        [p["measured"] for p in pts],
        ys,
        "|",
        color="black",
        markersize=9,
        mew=2,
        label=f"measured ({kinds})",
    )
    rel.axvline(1.0, color="black", linewidth=1.2)
    ax.set_yticks(ys, [p["id"] for p in pts], fontsize=6)
    ax.set_xlabel(f"per-GPU memory ({unit}): predicted by term (analytic) | measured")
    rel.set_xlabel("predicted by term / measured peak (1: measured)")
    ax.set_title("the prediction by term against the measured peak", fontsize=10)
    ax.legend(loc="lower right", fontsize=7)
    return _png_and_svg(f)


def _simulated(predictor: str) -> bool:
    return predictor == "alltoall-bandwidth" or predictor.startswith("EP ")


def ep_sections(ep: dict) -> list[dict]:
    """The stored EP set per library and unit kind (GB/s or us), in the summaries' form:
    published against simulated, each cell in the library's own unit."""
    out = {}
    for c in ep.get("cells", []):
        kind = "us" if c["unit"] == "us" else "GB/s"
        out.setdefault((c["library"], kind), []).append(c)
    sections = []
    for (lib, kind), cells in sorted(out.items()):
        errs = [(abs(c["error"]), c["id"]) for c in cells if c["error"] is not None]
        sections.append(
            {
                "predictor": f"EP {lib} ({kind})",
                "predicted": len(errs),
                "mape": sum(e for e, _ in errs) / len(errs) if errs else None,
                "max_abs_error": max(errs)[0] if errs else None,
                "worst": max(errs)[1] if errs else "",
                "points": cells,
                "unit": kind,
            }
        )
    return sections


def moe_step_section(doc: dict, out: Path) -> dict | None:
    """The MoE step-time set `repro validate` stored (``moe_step_time``): its points drawn as
    predicted against measured (the scatter of every predictor, the step in seconds), the
    per-source and leave-one-source-out MAPE, and each layout set's ranking (Spearman rho
    between predicted and measured, and the measured rate of the planner's top pick over the
    best measured). None when the set was not stored."""
    m = (doc or {}).get("moe_step_time")
    if not m or not m.get("points"):
        return None
    pts = [
        {**p, "id": p["point_id"], "unit": "s"}
        for p in m["points"]
        if p.get("measured") is not None
    ]
    names = {}
    for fmt, data in scatter("moe-step-time", pts, "s").items():
        names[fmt] = f"validation-moe-step-time.{fmt}"
        atomic_write_bytes(Path(out) / names[fmt], data)
    return {**m, "points": pts, "figure": names}


def write_validation_page(store, out: Path) -> Path:
    doc = stored_validation(store.root)
    predictors = []
    if doc is not None:
        for s in doc.get("summaries", []):
            pts = [p for p in doc.get("points", []) if p["predictor"] == s["predictor"]]
            unit = pts[0]["unit"] if pts else ""
            names = {}
            for fmt, data in scatter(s["predictor"], pts, unit).items():
                names[fmt] = f"validation-{s['predictor']}.{fmt}"
                atomic_write_bytes(Path(out) / names[fmt], data)
            by_term = terms_figure(pts, unit)
            if by_term is not None:
                for fmt, data in by_term.items():
                    names[f"terms_{fmt}"] = f"validation-{s['predictor']}-terms.{fmt}"
                    atomic_write_bytes(Path(out) / names[f"terms_{fmt}"], data)
            predictors.append({**s, "points": pts, "figure": names, "unit": unit})
        for s in ep_sections(doc.get("ep") or {}):
            names = {}
            slug = (
                s["predictor"].replace(" ", "-").replace("/", "").replace("(", "").replace(")", "")
            )
            for fmt, data in scatter(s["predictor"], s["points"], s["unit"]).items():
                names[fmt] = f"validation-{slug}.{fmt}"
                atomic_write_bytes(Path(out) / names[fmt], data)
            predictors.append({**s, "figure": names})
    return atomic_write_text(
        Path(out) / "validation.html",
        html.environment()
        .get_template("validation.html")
        .render(
            doc=doc,
            predictors=predictors,
            moe=moe_step_section(doc, out) if doc is not None else None,
            band=BAND,
            home="index.html",
            css=html.css(),
        ),
    )
