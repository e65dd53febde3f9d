"""piper-fig10: per-GPU memory vs node count and strategy, the HBM line, minimum nodes (Piper Fig. 10).

For the X-MoE 'Super' model (the text's '545B super model'; the caption says 615B), per node
count n (g = 8 GCDs per node, G = 8 n) and strategy, the per-GPU peak from two memory models:

- Piper's own resource model, Eq. 2-4 exactly as printed (components.resources.memory_model
  ``piper_eq2`` ... ``piper_eq4``): the model Fig. 10 is computed from ("we computed the
  required memory for various node count with different distribution strategies", Sec. VII).
  EDP is Eq. 2, GPipe Eq. 3, 1F1B Eq. 4 at stage 0 (the binding stage, Eq. 11).
- Our per-stage model (``stage_memory``): whole layers per stage, the framework overhead M_fw,
  each GPU holding the activations of the b s k token-expert pairs it receives, and full
  activation checkpointing as a further strategy ('1F1B + AC').

EDP: PP = 1, EP = min(G, E); beyond E GPUs the extra GPUs are data-parallel replicas of the EP
group with the same per-GPU memory (no ZeRO). Pipelined strategies: every (PP, EP) with
PP x EP = G, EP | E, PP <= L, EP <= g N_h (Eq. 7-10), the smallest peak shown. Micro-batch: one
sequence of ``seq`` tokens (b/M = 1 in Eq. 3-4), M = alpha x PP. Minimum nodes: the first n
whose best 1F1B layout fits in HBM (Eq. 11).
"""

from __future__ import annotations

from moe_repro.components.model.params import param_counts
from moe_repro.components.model.zoo import get_model
from moe_repro.components.network.platform import load_builtin
from moe_repro.components.resources.memory_model import (
    MemoryOptions,
    all_stages,
    piper_attention_activation,
    piper_eq2,
    piper_eq3,
    piper_eq4,
)
from moe_repro.reproductions.spec import Figure, PaperClaim, PaperValue, Reproduction, Result

NODES = (8, 16, 32, 64, 128)
EQ_EDP, EQ_GPIPE, EQ_1F1B = "EDP (Eq. 2)", "PPxEP GPipe (Eq. 3)", "PPxEP 1F1B (Eq. 4)"
ST_EDP, ST_GPIPE, ST_1F1B, ST_AC = (
    "EDP (stage model)",
    "PPxEP GPipe (stage model)",
    "PPxEP 1F1B (stage model)",
    "1F1B + AC (stage model)",
)
EQ_STRATEGIES = (EQ_EDP, EQ_GPIPE, EQ_1F1B)
STAGE_STRATEGIES = (ST_EDP, ST_GPIPE, ST_1F1B, ST_AC)
ROW, ROW_STAGE = "Super model", "Super model (our stage model)"
MIN_NODES, PARAMS, PARAMS_CAPTION = "minimum nodes", "parameters", "parameters (caption)"
GIB = 2.0**30
_CAPTION = "Fig. 10 caption ('at least 64 nodes')"

PAPER_VALUES = [
    PaperValue(ROW, MIN_NODES, "64", "nodes", _CAPTION),
    PaperValue(ROW_STAGE, MIN_NODES, "64", "nodes", _CAPTION),
    # X-MoE Table 3 prints the Super model as 545.4 'B'; xmoe-table3 shows every row of that table
    # is a count in units of 2^30 parameters, so the text's 545 is in that unit.
    PaperValue(
        ROW,
        PARAMS,
        "545",
        "2^30 parameters ('B')",
        "Piper Sec. VII text ('super model with 545B'), X-MoE Table 3's 545.4",
    ),
    PaperValue(ROW, PARAMS_CAPTION, "615", "B", "Fig. 10 caption ('a 615 B parameter model')"),
]
PAPER_CLAIMS = [
    PaperClaim(
        "1F1B vs GPipe",
        "peak memory per GPU",
        "The 1F1B schedule reduces pipeline bubble fraction and peak activation memory over GPipe",
        "Piper Sec. II-C",
    ),
    PaperClaim(
        "binding stage",
        "1F1B stage 0",
        "The fifth [constraint] uses the stage-0 peak from the 1F1B model, which is the binding "
        "memory constraint across all stages",
        "Piper Sec. III-C, after Eq. 11",
    ),
]


def layouts(m, G: int, p) -> list[tuple[int, int]]:
    """(PP, EP) with PP x EP = G, EP | E, PP <= L, EP <= g N_h (Piper Eq. 7-10)."""
    ep_limit = p.gpus_per_node * p.switch_group_nodes
    return [
        (G // ep, ep)
        for ep in range(1, G + 1)
        if G % ep == 0 and m.n_experts % ep == 0 and G // ep <= m.layers and ep <= ep_limit
    ]


def eq4_stage0(
    m,
    PP: int,
    EP: int,
    micro: float,
    seq: int,
    M: int,
    n_mat: int = 3,
    expert_act_per_ep: bool = True,
    overhead: float = 0.0,
) -> float:
    """Piper Eq. 4 at stage 0 built from its terms, with switches for what it assumes: ``n_mat``
    weight matrices per expert (as printed: 3, i.e. 48 = 3 x 16 bytes and 3 d_ffn + d), expert
    activations divided by EP (as printed: 2 b s k / (M EP)) and no framework overhead. With the
    defaults it is ``piper_eq4`` (tests check this)."""
    d, f, E, L, k = m.d_model, m.d_ffn, m.n_experts, m.layers, m.top_k
    expert_act = 2 * micro * seq * k * (n_mat * f + d) / (EP if expert_act_per_ep else 1)
    per_micro = piper_attention_activation(micro, seq, d, m.heads, flash=True) + expert_act
    return L / PP * (64 * d * d + 16 * n_mat * E / EP * d * f + PP * per_micro) + overhead


def eq_peak(m, G: int, strategy: str, seq: int, alpha: int, p, micro: float = 1.0, **variant):
    """(bytes, (PP, EP)) of the best layout under Piper's Eq. 2-4 as printed (``variant``: the
    switches of ``eq4_stage0``, 1F1B only)."""
    d, f, E, L, H, k = m.d_model, m.d_ffn, m.n_experts, m.layers, m.heads, m.top_k
    if strategy == EQ_EDP:
        ep = min(G, E)
        if E % ep:
            return None, None
        return piper_eq2(d, f, E, L, H, k, micro, seq, ep, flash=True), (1, ep)
    best = None
    for PP, EP in layouts(m, G, p):
        M = alpha * PP
        if strategy == EQ_GPIPE:
            v = piper_eq3(d, f, E, L, H, k, micro * M, seq, EP, PP, flash=True)
        elif variant:
            v = eq4_stage0(m, PP, EP, micro, seq, M, **variant)
        else:
            v = piper_eq4(d, f, E, L, H, k, micro * M, seq, EP, PP, M, 0, flash=True)
        if best is None or v < best[0]:
            best = (v, (PP, EP))
    return best if best else (None, None)


def stage_peak(m, G: int, strategy: str, seq: int, alpha: int, p):
    """(bytes, (PP, EP), binding stage) of the best layout under our per-stage model."""
    opts = MemoryOptions(
        flash_attention=True, checkpointing=strategy == ST_AC, overhead_bytes=p.overhead_bytes
    )
    if strategy == ST_EDP:
        ep = min(G, m.n_experts)
        if m.n_experts % ep:
            return None, None, None
        stages = all_stages(m, 1, ep, 1, seq, 1, "1f1b", opts)
        peak = max(stages, key=lambda s: s.total)
        return peak.total, (1, ep), peak.stage
    best = None
    for PP, EP in layouts(m, G, p):
        sched = "gpipe" if strategy == ST_GPIPE else "1f1b"
        stages = all_stages(m, PP, EP, 1, seq, alpha * PP, sched, opts)
        peak = max(stages, key=lambda s: s.total)
        if best is None or peak.total < best[0]:
            best = (peak.total, (PP, EP), peak.stage)
    return best if best else (None, None, None)


def min_nodes(peaks: dict[int, float | None], hbm: float) -> int | None:
    """The first node count (ascending) whose peak fits in ``hbm`` bytes (Eq. 11)."""
    return next((n for n in sorted(peaks) if peaks[n] is not None and peaks[n] <= hbm), None)


def _fmt_nodes(n: int | None) -> str:
    return "none up to 128" if n is None else str(n)


def compute(repro: Reproduction, params: dict) -> Result:
    seq, alpha = int(params["seq"]), int(params["alpha"])
    p = load_builtin("frontier")
    m = get_model("xmoe-super")
    g, hbm = p.gpus_per_node, p.hbm_bytes
    cells, layouts_out = [], {}
    series = {s: ([], []) for s in EQ_STRATEGIES + STAGE_STRATEGIES}
    peaks = {s: {} for s in EQ_STRATEGIES + STAGE_STRATEGIES}
    binding = {}
    for n in NODES:
        G = n * g
        for strategy in EQ_STRATEGIES + STAGE_STRATEGIES:
            if strategy in EQ_STRATEGIES:
                peak, layout = eq_peak(m, G, strategy, seq, alpha, p)
            else:
                peak, layout, stage = stage_peak(m, G, strategy, seq, alpha, p)
                binding[(n, strategy)] = stage
            peaks[strategy][n] = peak
            layouts_out[(n, strategy)] = layout
            if peak is None:
                note = "no layout satisfies Eq. 7-10 at this size"
            elif strategy in (EQ_EDP, ST_EDP):
                note = f"PP=1 x EP={layout[1]}" + (
                    f" (x {G // layout[1]} data-parallel replicas)" if G > layout[1] else ""
                )
            else:
                note = f"PP={layout[0]} x EP={layout[1]}"
            cells.append(
                repro.compare(
                    f"{n} nodes", strategy, None if peak is None else peak / 1e9, "GB", note=note
                )
            )
            if peak is not None:
                series[strategy][0].append(n)
                series[strategy][1].append(peak / 1e9)

    # Minimum nodes: Piper's Eq. 4 as printed, its sensitivity to what it assumes, our stage model.
    eq_min = min_nodes(peaks[EQ_1F1B], hbm)
    variants = {
        "with M_fw = 4 GB": dict(overhead=p.overhead_bytes),
        "with two-matrix experts (X-MoE's Super: 32 E d d_ffn / EP, 2 d_ffn + d)": dict(n_mat=2),
        "with each GPU keeping the activations of the b s k token-expert pairs it receives "
        "(no / EP)": dict(expert_act_per_ep=False),
    }
    variant_min = {
        label: min_nodes(
            {n: eq_peak(m, n * g, EQ_1F1B, seq, alpha, p, **kw)[0] for n in NODES}, hbm
        )
        for label, kw in variants.items()
    }
    two_seq = min_nodes(
        {n: eq_peak(m, n * g, EQ_1F1B, seq, alpha, p, micro=2.0)[0] for n in NODES}, hbm
    )
    at = {n: peaks[EQ_1F1B][n] / 1e9 for n in (32, 64)}
    eq_cell = repro.compare(
        ROW,
        MIN_NODES,
        eq_min,
        "nodes",
        note=(
            f"Piper Eq. 4 as printed (stage 0, b/M = 1 sequence of {seq}, M = {alpha} x PP): {at[32]:.1f} GB "
            f"at 32 nodes, {at[64]:.1f} GB at 64, against {hbm / 1e9:g} GB"
        ),
    )
    eq_cell.detail = (
        f"Piper Eq. 4 as printed (stage 0, FlashAttention, b/M = 1 sequence of {seq}, M = {alpha} x PP), the "
        f"model Fig. 10 is computed from: {at[32]:.1f} GB at 32 nodes, {at[64]:.1f} GB at 64, against "
        f"{hbm / 1e9:g} GB. Same answer "
        + "; ".join(f"{k}: {_fmt_nodes(v)}" for k, v in variant_min.items() if v == eq_min)
        + "; a different one "
        + "; ".join(f"{k}: {_fmt_nodes(v)}" for k, v in variant_min.items() if v != eq_min)
        + f", and with b/M = 2 sequences: {_fmt_nodes(two_seq)}. The paper states neither its "
        "micro-batch nor its sequence for Fig. 10; 64 follows from one sequence per micro-batch"
    )
    cells.append(eq_cell)
    st_plain, st_ac = min_nodes(peaks[ST_1F1B], hbm), min_nodes(peaks[ST_AC], hbm)
    no_div = variant_min[next(k for k in variants if "no / EP" in k)]
    at_max = (peaks[ST_1F1B][max(NODES)] or 0) / 1e9
    cell = repro.compare(
        ROW_STAGE,
        MIN_NODES,
        st_ac if st_plain is None else st_plain,
        "nodes",
        note=(
            f"our stage model: 1F1B fits at {_fmt_nodes(st_plain)} without checkpointing ({at_max:.1f} GB at "
            f"{max(NODES)} nodes), at {_fmt_nodes(st_ac)} with it; ours is the smaller"
        ),
    )
    if cell.verdict == "deviates":
        # Our stage model's own accounting, not something outside it: a fault of ours, named.
        cell.blame(
            "stage memory model",
            (
                f"it keeps each GPU's received token-expert activations; Eq. 4 with that change fits at "
                f"{_fmt_nodes(no_div)}, so ours only fits with checkpointing, which Eq. 4 leaves out"
            ),
        )
        cell.detail = (
            f"Eq. 4 as printed gives {_fmt_nodes(eq_min)} (row above) because it divides the expert activations "
            f"by EP; the same Eq. 4 with each GPU keeping the activations of the token-expert pairs it receives, "
            f"as our stage model does, fits at {_fmt_nodes(no_div)} (under 1F1B stage 0 holds PP micro-batches of "
            "L/PP layers, i.e. L layers' activations of one micro-batch, whatever PP is). Our stage model then "
            "only fits with activation checkpointing, which Eq. 4 does not model. Which accounting the paper's "
            "measured runs follow is not stated; the difference is our model's, so the cell is a deviation"
        )
    cells.append(cell)

    # Parameters: the text's 545 is X-MoE's count in units of 2^30; the caption's 615 is not.
    pc = param_counts(m)
    cell = repro.compare(
        ROW,
        PARAMS,
        pc.total / GIB,
        "2^30 parameters ('B')",
        note=f"{pc.total / 1e9:.1f} x 10^9 parameters = {pc.total / GIB:.2f} x 2^30 "
        "(X-MoE Table 3's unit, see xmoe-table3)",
    )
    medium = param_counts(get_model("xmoe-medium"))
    no_router = (pc.total - pc.routers) / GIB
    # X-MoE's count leaves the routers out; the same recount on X-MoE's Medium row (55.2) agrees
    # only without them (55.235; with them 55.252 prints 55.3), so it is X-MoE's rule, not one row's.
    cell.explain(
        "counting-convention",
        f"X-MoE counts without the {m.layers} routers ({pc.routers / GIB:.2f} x 2^30): "
        f"{no_router:.2f}, its Table 3's 545.4; its Medium row agrees only that way too",
        counterfactual=no_router,
        removed=f"the {m.layers} routers left out",
    )
    cell.detail = (
        f"Without the {m.layers} routers (d E = {m.d_model * m.n_experts:,} weights each, "
        f"{pc.routers / GIB:.2f} x 2^30 in all) ours is {no_router:.2f}, X-MoE Table 3's 545.4, which the text "
        "prints as 545. X-MoE leaves routers out: its Medium row (55.2) also follows only without them "
        f"({(medium.total - medium.routers) / GIB:.3f}; with them {medium.total / GIB:.3f} would print "
        f"{medium.total / GIB:.1f})"
    )
    cells.append(cell)
    cell = repro.compare(
        ROW,
        PARAMS_CAPTION,
        pc.total / 1e9,
        "B",
        note=(
            f"{pc.total / 1e9:.1f} x 10^9 ({pc.total / GIB:.1f} x 2^30); the text names the "
            "same model '545B', which ours reproduces (row 'parameters'); 615 fits neither "
            f"unit. A 64-layer Super would count {pc.total / m.layers * 64 / 1e9:.1f} x 10^9: "
            "a guess fitted to the caption, not a recomputation"
        ),
    )
    cells.append(cell)

    # Claims, on our stage model.
    ratios = [
        peaks[ST_1F1B][n] / peaks[ST_GPIPE][n]
        for n in NODES
        if peaks[ST_1F1B][n] is not None and peaks[ST_GPIPE][n]
    ]
    cells.append(
        repro.claim(
            "1F1B vs GPipe",
            "peak memory per GPU",
            bool(ratios) and max(ratios) < 1,
            max(ratios, default=None),
            "x",
            echo=True,  # our stage model holds fewer micro-batches under 1F1B by construction
            note=f"best 1F1B / best GPipe peak per GPU (stage model) at {list(NODES)} nodes: "
            + ", ".join(f"{r:.2f}" for r in ratios)
            + "; below 1 by our model's construction (1F1B holds at "
            "most PP micro-batches, GPipe all M): shown, not evidence",
        )
    )
    stages0 = [
        binding[(n, s)] for n in NODES for s in (ST_1F1B, ST_AC) if binding.get((n, s)) is not None
    ]
    cells.append(
        repro.claim(
            "binding stage",
            "1F1B stage 0",
            bool(stages0) and all(s == 0 for s in stages0),
            float(max(stages0, default=0)),
            "stage index",
            echo=True,  # stage 0 holds the most micro-batches in our 1F1B model by construction
            note="the stage with the largest peak in the best 1F1B layout (with and without checkpointing) at "
            f"every node count: {sorted(set(stages0))}; it follows from our model (1F1B stage 0 holds the "
            "most micro-batches, and the Super model has no output head on the last stage): shown, not evidence",
        )
    )

    fig = Figure(
        name="piper-fig10",
        title="Super model: per-GPU memory vs nodes and strategy (64 GB HBM line)",
        xlabel="nodes (8 MI250X GCDs each)",
        ylabel="peak memory per GPU (GB, 10^9 bytes)",
        xscale="log",
        yscale="log",
        series=[{"label": s, "x": xs, "y": ys, "kind": "ours"} for s, (xs, ys) in series.items()]
        + [
            {"label": "HBM 64 GB (limit)", "x": [], "y": hbm / 1e9, "kind": "limit"},
            # The caption states one value: the model trains "with at least 64 nodes", i.e.
            # fits in HBM from 64 nodes on; drawn where that puts it, on the HBM line.
            {
                "label": "Piper: fits from 64 nodes (caption; on the HBM line)",
                "x": [repro.paper_value(ROW, MIN_NODES).value],
                "y": [hbm / 1e9],
                "kind": "paper",
            },
        ],
    )
    assumptions = [
        "Model: X-MoE Super (H 7168, H_FFN 2560, 256 experts, top-8, 61 layers, 56 heads of 128), two-matrix "
        "experts in the stage model, 4 H^2 attention, no embeddings; Eq. 2-4 use their printed coefficients "
        "(three-matrix experts: 48 E d d_ffn, 3 d_ffn + d).",
        f"Sequence {seq}, one sequence per GPU per micro-batch (b/M = 1 in Eq. 3-4), M = {alpha} x PP; "
        f"FlashAttention; 16 B/param; Frontier (8 GCDs/node, N_h = 4, 64 GB HBM). Stage model: framework "
        f"overhead {p.overhead_bytes / 1e9:g} GB, whole layers per stage (the first L mod PP stages one more).",
        "Fig. 10's bars are not printed as numbers; its conclusion (>= 64 nodes) and the model's size are "
        "compared.",
    ]
    return Result(
        cells=cells,
        assumptions=assumptions,
        figures=[fig],
        extra={
            "layouts": {f"{n}/{s}": v for (n, s), v in layouts_out.items()},
            "min_nodes": {
                "eq4": eq_min,
                "stage 1f1b": st_plain,
                "stage 1f1b+ac": st_ac,
                **{f"eq4 {k}": v for k, v in variant_min.items()},
                "eq4 b/M=2": two_seq,
            },
        },
    )


REPRODUCTION = Reproduction(
    id="piper-fig10",
    paper_values=PAPER_VALUES,
    paper_claims=PAPER_CLAIMS,
    compute=compute,
    defaults={"seq": 4096, "alpha": 4},
    grade_class="exact",  # Fig. 10 is computed from Eq. 2-4 (Sec. VII), not measured; counts and formulas
)
