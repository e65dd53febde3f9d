"""mop-llep: least-loaded EP vs plain EP on skewed routing, over real gloo ranks (MoP Sec. 3.3).

MoP adopts LLEP (Nguyen et al.) "unchanged as our routing layer" and recaps it: "up to 5x
MoE-layer speedup and 4x peak-memory reduction over standard expert parallelism". Those are
"up to" figures from another paper's GPUs: their size is not comparable with a CPU's (shown in
the note), and what is graded is their direction, as a claim: LLEP faster than plain EP. Suite
llep-layer runs components/balance/least_loaded_ep.LeastLoadedMoELayer and plain
components/moe/moe_layer.MoELayer on the same skewed routing over ``ranks`` real gloo processes
on this CPU; we report: rows computed on the busiest rank (token straggler), forward+backward
wall time (median of ``repeats``, the slowest rank per repeat), and the largest difference
between the two layers' outputs and input gradients (LLEP is exact: it moves compute, not the
assignment of tokens to experts).
"""

from __future__ import annotations

from moe_repro.records import grading
from moe_repro.reproductions.spec import PaperClaim, Reproduction, Result

LAYER_NAMES = {"plain": "plain EP", "llep": "LLEP"}
FASTER = "direction: faster than plain EP"
PAPER_CLAIMS = [
    PaperClaim(
        "LLEP",
        FASTER,
        "[LLEP] delivers up to 5x MoE-layer speedup and 4x "
        "peak-memory reduction over standard expert parallelism",
        "MoP Sec. 3.3 (recap of LLEP, Nguyen et al.)",
    )
]


def compute(repro: Reproduction, params: dict) -> Result:
    from moe_repro.reproductions.suite_runs import pick, run_grid, without_samples

    ranks = int(params["ranks"])
    if ranks < 2 or int(params["experts"]) % ranks:
        raise ValueError("need ranks >= 2 dividing experts")
    base = {
        k: params[k]
        for k in ("ranks", "tokens", "d_model", "d_ffn", "experts", "top_k", "skew", "seed")
    }
    points = [dict(base, backend="gloo", layer=layer) for layer in LAYER_NAMES]
    records = run_grid("llep-layer", points, int(params["repeats"]), timeout_s=300)
    note = (
        f"real: {ranks} gloo ranks on this CPU, {params['tokens']} tokens/rank, E={params['experts']}, "
        f"top-{params['top_k']}, skew {params['skew']} (synthetic router bias)"
    )
    cells = []
    for layer, name in LAYER_NAMES.items():
        r = pick(records, layer=layer)
        cells.append(
            repro.compare(name, "rows on busiest rank", r["rows_busiest"], "rows", note=note)
        )
        cells.append(
            repro.compare(
                name, "token straggler (max - mean)", r["straggler_rows"], "rows", note=note
            )
        )
        cells.append(
            repro.compare(
                name,
                "layer fwd+bwd time (median)",
                r["time_s"] * 1e3,
                "ms",
                note=note + "; slowest rank per repeat",
            )
        )
    plain, llep = pick(records, layer="plain"), pick(records, layer="llep")
    speedup = plain["time_s"] / llep["time_s"]
    cells.append(
        repro.compare(
            "LLEP",
            "speedup vs plain EP",
            speedup,
            "x",
            note=note + "; MoP Sec. 3.3 recaps 'up to 5x' on GPUs (not comparable)",
        )
    )
    # The direction at every repeat, paired fastest with fastest (as xmoe-fig11's): with the
    # policy's minimum of repeats, one that holds at some repeats only is seed-dependent.
    per_repeat = [
        a < b for a, b in zip(sorted(llep["samples"]["time_s"]), sorted(plain["samples"]["time_s"]))
    ]
    enough = len(per_repeat) >= grading.MIN_SEEDS
    cells.append(
        repro.claim(
            "LLEP",
            FASTER,
            speedup > 1,
            speedup,
            "x",
            seeds_hold=per_repeat if enough else None,
            note=f"LLEP {llep['time_s'] * 1e3:.4g} ms vs plain EP {plain['time_s'] * 1e3:.4g} ms per "
            f"fwd+bwd (medians)"
            + (
                f"; LLEP faster at {sum(per_repeat)} of {len(per_repeat)} repeats" if enough else ""
            ),
        )
    )
    cells.append(
        repro.compare(
            "LLEP",
            "max |LLEP - plain EP| (output, input grad)",
            llep["max_abs_diff"],
            "abs",
            note="exact semantics: differences are fp32 summation order only",
        )
    )
    assumptions = [
        "Router skew: feature 0 of every token is 1 and the gate's row 0 rises linearly "
        "over the experts, so later experts are preferred (a synthetic, fixed skew).",
        "LLEP plan: capacity ceil(N/W) per rank, excess to the least-loaded rank "
        "(components/balance/least_loaded_ep.py; MoP does not print LLEP's algorithm).",
        "CPU timings with gloo: the all-to-alls and weight copies cost more than on "
        "NVLink, so the speedup is this machine's, not the paper's regime.",
        "Default 2 ranks: this machine has 2 cores; with more ranks than cores the ranks "
        "share cores and the busiest rank's extra work no longer sets the time.",
    ]
    return Result(cells=cells, assumptions=assumptions, extra={"records": without_samples(records)})


REPRODUCTION = Reproduction(
    id="mop-llep",
    paper_values=[],
    paper_claims=PAPER_CLAIMS,
    compute=compute,
    grade_class="other-hardware",
    defaults={
        "ranks": 2,
        "tokens": 512,
        "d_model": 64,
        "d_ffn": 256,
        "experts": 8,
        "top_k": 2,
        "skew": 4.0,
        "repeats": 5,
        "seed": 0,
    },
)
