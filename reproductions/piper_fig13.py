"""piper-fig13: Piper vs MoE frameworks on X-MoE's Small/Medium/Large/Super (Piper Fig. 13).

Ours: the planner's estimate for Piper's layout at the GPU counts of the caption (8, 32, 80 and
512 MI250X GCDs), each model at its X-MoE Table 3 sequence length. The framework columns
(DeepSpeed-MoE, DeepSpeed-TED, Tutel, X-MoE) are measurements of other systems and are not
reproduced; the speed-up over X-MoE is ours divided by X-MoE's printed value.
"""

from __future__ import annotations

from moe_repro.components.model.zoo import get_model
from moe_repro.records import grading
from moe_repro.reproductions._resource import best_plan, describe, planner_assumptions
from moe_repro.reproductions.spec import Figure, PaperClaim, PaperValue, Reproduction, Result

_SRC = "Fig. 13 (as transcribed in piper-review.md 9.5); GPU counts from its caption"
# zoo key -> (row, GPUs, seq, Piper TFLOPS, X-MoE TFLOPS)
_PRINTED = {
    "xmoe-small": ("10.1B Small", 8, 2048, "90.44", "44.0"),
    "xmoe-medium": ("55.2B Medium", 32, 4096, "57.83", "24.20"),
    "xmoe-large": ("201.4B Large", 80, 4096, "46.89", "24.10"),
    "xmoe-super": ("545.4B Super", 512, 4096, "36.96", "10.20"),
}
PIPER, XMOE, SPEEDUP = "Piper TFLOPS / GPU", "X-MoE TFLOPS / GPU", "Piper / X-MoE"
PAPER_VALUES = [
    v
    for row, _, _, p, x in _PRINTED.values()
    for v in (PaperValue(row, PIPER, p, "TFLOPS", _SRC), PaperValue(row, XMOE, x, "TFLOPS", _SRC))
]
# The other frameworks' bars of Fig. 13 (piper-review.md 9.5), per model in the order of _PRINTED;
# None = OOM. Measurements of other systems: drawn in the figure, not graded.
FRAMEWORKS = {
    "DeepSpeed-MoE": ("20.40", None, None, None),
    "DeepSpeed-TED": ("20.40", None, None, None),
    "Tutel": ("33.00", "4.70", None, None),
}

FITS, SPEEDUP_RANGE = "Piper on the caption's GPU counts", "Piper / X-MoE throughput"
PAPER_CLAIMS = [
    PaperClaim(
        FITS,
        "memory-feasible layout",
        "Piper can train the small, medium, large, and super model "
        "using 8, 32, 80, and 512 MI250X GPUS instead of 256 and 1024 GPUs used by X-MoE",
        "Piper Fig. 13 caption",
    ),
    PaperClaim(
        SPEEDUP_RANGE,
        "ratio",
        "Our framework Piper can train these models with only a fraction of "
        "their requirement at 2-3.6X throughput",
        "Piper Sec. VII-C, on Fig. 13",
    ),
]


def compute(repro: Reproduction, params: dict) -> Result:
    alpha, platform = int(params["alpha"]), str(params["platform"])
    cells, inputs, ours_by_row, fits, ratios = [], [], {}, {}, {}
    for key, (row, gpus, seq, piper, xmoe) in _PRINTED.items():
        m = get_model(key)
        nodes = max(1, gpus // 8)
        pl = best_plan(key, platform, nodes, seq, alpha)
        c = pl.best
        ours = c.estimate.tflops_per_gpu if c else None
        cells.append(
            repro.compare(
                row,
                PIPER,
                ours,
                "TFLOPS",
                note=(describe(pl) + " (estimate)")
                if c
                else f"no feasible layout on {gpus} GPUs: "
                + "; ".join(x.why_not for x in pl.candidates[:2]),
            )
        )
        cells.append(
            repro.compare(
                row,
                XMOE,
                None,
                "TFLOPS",
                note="X-MoE's measured throughput on 256/1024 GPUs: another system, not "
                "reproduced here",
            )
        )
        if ours:
            cells.append(
                repro.compare(
                    row,
                    SPEEDUP,
                    ours / float(xmoe),
                    "x",
                    note=f"ours / X-MoE's printed {xmoe}; the paper's own ratio is "
                    f"{float(piper) / float(xmoe):.2f}x",
                )
            )
        inputs.append(
            {"model": key, "gpus": gpus, "seq": seq, "E": m.n_experts, "plan": c and c.to_dict()}
        )
        ours_by_row[row] = ours
        fits[row] = c is not None
        if ours:
            ratios[row] = ours / float(xmoe)
    cells.append(
        repro.claim(
            FITS,
            "memory-feasible layout",
            all(fits.values()),
            float(sum(fits.values())),
            "models",
            note="a layout within HBM (Eq. 7-11, checkpointing allowed) on the caption's GPU count, per model: "
            + ", ".join(f"{row} {'yes' if ok else 'no'}" for row, ok in fits.items()),
        )
    )
    # "2-3.6X" read by the policy (records/grading.py read_claim: a range at the precision of its more
    # precise end, 1.95-3.65); the claim is about every model, so the ratio tested is the one of ours
    # farthest outside the reading (any one inside if none is out).
    reading = grading.read_claim("2-3.6x")
    worst = max(
        ratios.values(), key=lambda r: max(reading.low - r, r - reading.high, 0.0), default=None
    )
    own = [float(p) / float(x) for _, _, _, p, x in _PRINTED.values()]
    cells.append(
        repro.claim(
            SPEEDUP_RANGE,
            "ratio",
            None,
            worst if len(ratios) == len(_PRINTED) else None,
            "x",
            reading="2-3.6x",
            note=(
                f"ours / X-MoE's printed TFLOPS: {', '.join(f'{row} {r:.2f}x' for row, r in ratios.items())}; "
                f"holds if every ratio is inside the reading (tested: the one farthest out); the paper's own "
                f"ratios are {', '.join(f'{r:.2f}x' for r in own)}"
            ),
        )
    )
    assumptions = [
        "GPU counts 8, 32, 80, 512 (caption); sequence 2048 for Small, 4096 otherwise (X-MoE Table 3); "
        f"1 sequence per GPU per micro-batch, M = {alpha} x PP.",
        "X-MoE models: two-matrix experts, 4 H^2 attention, no embeddings (components.model.params).",
        *planner_assumptions(best_plan("xmoe-small", platform, 1, 2048, alpha)),
    ]
    rows = [row for row, *_ in _PRINTED.values()]
    # A framework's missing bar is OOM in Fig. 13: labelled as the paper prints it.
    series = [
        {
            "label": name,
            "x": rows,
            "y": [None if v is None else float(v) for v in vals],
            "kind": "paper",
            "oom": [r for r, v in zip(rows, vals) if v is None],
        }
        for name, vals in FRAMEWORKS.items()
    ]
    series += [
        {
            "label": "X-MoE",
            "x": rows,
            "y": [float(x) for *_, x in _PRINTED.values()],
            "kind": "paper",
        },
        {
            "label": "Piper",
            "x": rows,
            "y": [float(p) for *_, p, _ in _PRINTED.values()],
            "kind": "paper",
        },
        {
            "label": "Piper, ours (resource-model estimate)",
            "x": rows,
            "y": [ours_by_row[r] for r in rows],
            "kind": "ours",
        },
    ]
    fig = Figure(
        name="piper-fig13",
        title="Throughput vs MoE frameworks; Piper on 8/32/80/512 GPUs",
        xlabel="model (X-MoE Table 3 configuration)",
        ylabel="throughput (TFLOPS per GPU = MI250X GCD)",
        series=series,
        yscale="log",
        form="bars",
    )  # Fig. 13's grouped bars
    return Result(cells=cells, assumptions=assumptions, figures=[fig], extra={"inputs": inputs})


REPRODUCTION = Reproduction(
    id="piper-fig13",
    paper_values=PAPER_VALUES,
    paper_claims=PAPER_CLAIMS,
    compute=compute,
    defaults={"alpha": 4, "platform": "frontier"},
    grade_class="prediction",  # our planner predicting throughput Piper measured on Frontier
)
