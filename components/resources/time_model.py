"""The one time model both planners use: Piper's PP x EP planner (perf_model.estimate) and the
parallelism planner (parallel_planner). Everything that turns work into seconds is here; the
planners count the work (FLOPs, bytes, layers per stage) and add the seconds up.

Kernels (one GPU): each GEMM a roofline at its own shape (Williams et al. 2009), with tile and
wave quantization where the profile gives its SM count (gemm_efficiency); the attention core at
the achievable attention rate (FlashAttention, Dao et al. 2022 Sec. 3) or, with materialised
scores, a roofline of that rate and the scores' HBM traffic; the non-GEMM kernels at HBM
bandwidth; backward 2 x forward (1.5 x for HBM-bound kernels) plus any recomputed forward; a
published layer forward time in the profile (calibration.layer_forward) scales a layer's kernel
times (layer_time_factor).
Communication: bytes / the link's per-GPU rate + one latency per message; an all-to-all's on-
and off-node parts run concurrently; DP reductions expose only what exceeds the compute they
hide behind.
Pipeline: M slots of the slowest stage plus a bubble of (PP - 1) / VPP slots (Narayanan et al.
2021 Sec. 2.2), i.e. the (M + PP - 1) slots of Piper III-D when VPP = 1.

Why one module: the two planners must not price the same work differently. Where a simpler form
was possible the more faithful one is used (per-GEMM rooflines, timed non-GEMM kernels, MLA's
down-projections and the router replicated over TP, no recompute of the output head, latency by
link class). Each rule and its reasons: see docs/planner.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from moe_repro.components.model.zoo import MoEModel, megatron_gpt
from moe_repro.components.network.platform import ON_NODE_CLASSES, Platform
from moe_repro.components.resources import formulas as F

BYTES_PER_VALUE = 2  # bf16 operands and activations
BACKWARD_GEMM = 2.0  # backward / forward for GEMMs and attention: data + weight gradients
BACKWARD_HBM = 1.5  # backward / forward for HBM-bound kernels (see the module docstring)
# Output tiles cuBLAS chooses among: NVIDIA, Matrix Multiplication Background User's Guide
# (DU-09799-001), Sec. 2.3, from the most efficient (256x128, 128x256) to the least (64x64). All
# are taken at the ceiling's rate: the guide ranks the smaller ones less efficient but gives no
# factor, so shapes a small tile wins are timed optimistically.
GEMM_TILES = (
    (256, 128),
    (128, 256),
    (128, 128),
    (256, 64),
    (64, 256),
    (128, 64),
    (64, 128),
    (64, 64),
)


# ============================================================================================
# Kernels
# ============================================================================================


@dataclass(frozen=True)
class Gemm:
    """``count`` GEMMs of [rows x k] @ [k x n] on one GPU."""

    count: float
    rows: float
    k: float
    n: float

    @property
    def flops(self) -> float:
        return 2.0 * self.count * self.rows * self.k * self.n


def gemm_efficiency(p: Platform, rows: float, n: float) -> float:
    """Fraction of the profile's GEMM ceiling a [rows x k] @ [k x n] GEMM reaches; 1 on a
    profile without ``sm_count``. NVIDIA's Matrix Multiplication Background guide, Ch. 3: the
    output is cut into tiles (tile quantization, Sec. 3.1: a partial tile costs a whole one) that
    run one per SM in waves (wave quantization, Sec. 3.2: a partial wave costs a whole one), so
    the useful rows x n is set against the tile area of every whole wave launched; of
    GEMM_TILES the one that wastes least is taken (cuBLAS's heuristic chooses among its tiles). A
    GEMM of fewer tiles than SMs is taken to fill the SMs by splitting K (cuBLAS's split-K), so
    only its tile padding counts. The ceiling (``achievable_gemm_tflops``) is a measurement at a
    shape that quantizes without loss."""
    if not p.sm_count or rows <= 0 or n <= 0:
        return 1.0
    best = 0.0
    for tile_rows, tile_n in GEMM_TILES:
        tiles = math.ceil(rows / tile_rows) * math.ceil(n / tile_n)
        slots = math.ceil(tiles / p.sm_count) * p.sm_count if tiles >= p.sm_count else tiles
        best = max(best, rows * n / (slots * tile_rows * tile_n))
    return best


def gemm_time(p: Platform, rows: float, k: float, n: float) -> float:
    """Seconds of one [rows x k] @ [k x n] GEMM on ``p`` (module docstring: a roofline at the
    shape's rate, the profile's ceiling x gemm_efficiency)."""
    if rows <= 0 or k <= 0 or n <= 0:
        return 0.0
    flops = 2.0 * rows * k * n
    nbytes = BYTES_PER_VALUE * (rows * k + k * n + rows * n)
    return max(flops / (p.gemm_flops * gemm_efficiency(p, rows, n)), nbytes / p.hbm_bytes_per_s)


def gemms_time(p: Platform, gemms) -> float:
    return sum(g.count * gemm_time(p, g.rows, g.k, g.n) for g in gemms)


GEMM_PRECISIONS = ("bf16", "fp8")


def gemm_rate_platform(p: Platform, precision: str = "bf16") -> Platform:
    """The profile as the GEMMs of a recipe in ``precision`` see it: ``bf16`` as given; ``fp8``
    (Transformer Engine's FP8 and MXFP8 recipes run the linear layers' GEMMs in FP8) scales the
    achievable GEMM ceiling by the data sheet's dense FP8 / BF16 peak (``gpu.peak_fp8_tflops`` /
    ``gpu.peak_tflops``): the same fraction of peak as BF16. The attention core, the non-GEMM
    kernels and the bytes moved are unchanged. ValueError for an unknown precision or a profile
    without an FP8 peak."""
    if precision not in GEMM_PRECISIONS:
        raise ValueError(
            f"GEMM precision must be one of {', '.join(GEMM_PRECISIONS)}, got {precision!r}"
        )
    if precision == "bf16":
        return p
    fp8 = (p.raw.get("gpu") or {}).get("peak_fp8_tflops")
    if not fp8 or not p.peak_flops:
        raise ValueError(f"platform {p.name} states no gpu.peak_fp8_tflops: FP8 GEMM rate unknown")
    return replace(p, gemm_flops=p.gemm_flops * float(fp8) * 1e12 / p.peak_flops)


def hbm_time(p: Platform, nbytes: float) -> float:
    """Seconds of a kernel bound by HBM bandwidth that reads and writes ``nbytes``."""
    return nbytes / p.hbm_bytes_per_s


def attention_core_time(
    p: Platform, tokens: float, keys: float, heads: float, d_qk: int, d_v: int, flash: bool = True
) -> float:
    """Forward seconds of QK^T and AV for ``tokens`` queries over ``keys`` keys each, ``heads``
    heads on this GPU. FlashAttention: 2 tokens keys heads (d_qk + d_v) FLOPs, halved for the
    causal mask, at the attention rate. Materialised scores: every score computed (no halving),
    and QK^T writes and AV reads 2 B per score: max(FLOPs / attention rate, bytes / HBM)."""
    flops = 2.0 * tokens * keys * heads * (d_qk + d_v)
    if flash:
        return 0.5 * flops / p.attention_flops
    score_bytes = 2 * BYTES_PER_VALUE * tokens * keys * heads
    return max(flops / p.attention_flops, score_bytes / p.hbm_bytes_per_s)


# ============================================================================================
# One layer's forward on one GPU
# ============================================================================================


def attention_gemms(m: MoEModel, rows: float, t: int = 1) -> list[Gemm]:
    """The attention projections of one layer: Q/K/V (fused) and output, split over ``t`` TP
    ranks (column- then row-parallel); MLA [DeepSeek-V2 Sec. 2.1]: query and KV down-projections
    (replicated over TP), their up-projections and the output projection (split)."""
    d = m.d_model
    if m.attn_params == "4d2":
        return [Gemm(1, rows, d, 3 * d / t), Gemm(1, rows, d / t, d)]
    w = F.attention_widths(m)
    if m.attn_params == "mla":
        a = m.mla
        if a is None:
            raise ValueError(f"{m.key}: attn_params='mla' needs the mla shapes")
        out = []
        if a.q_lora_rank:
            out += [Gemm(1, rows, d, a.q_lora_rank), Gemm(1, rows, a.q_lora_rank, w["q"] / t)]
        else:
            out.append(Gemm(1, rows, d, w["q"] / t))
        out += [
            Gemm(1, rows, d, a.kv_lora_rank + a.qk_rope_head_dim),
            Gemm(1, rows, a.kv_lora_rank, w["heads"] * (a.qk_nope_head_dim + a.v_head_dim) / t),
            Gemm(1, rows, w["o"] / t, d),
        ]
        return out
    return [Gemm(1, rows, d, (w["q"] + w["k"] + w["v"]) / t), Gemm(1, rows, w["o"] / t, d)]


def ffn_gemms(m: MoEModel, rows: float, width: float, count: float = 1) -> list[Gemm]:
    """One FFN of ``width`` (already split over any tensor parallelism): n_mat - 1 input matrices
    (d -> width) and one output matrix (width -> d)."""
    return [
        Gemm(count * (m.n_mat - 1), rows, m.d_model, width),
        Gemm(count, rows, width, m.d_model),
    ]


def layer_gemms(
    m: MoEModel, moe: bool, rows: float, t: int = 1, ep: int = 1, etp: int = 1
) -> list[Gemm]:
    """Every GEMM of one layer's forward on one GPU. ``rows``: the tokens a TP rank's GEMMs see
    (the whole sequence shard of its TP group); the E / ``ep`` local experts each receive
    ``etp`` x ep x rows k / (t E) tokens (balanced routing; the ETP group all-gathers the
    dispatched tokens) at width d_ffn / ``etp``; the router runs on the sequence-parallel
    shard (rows / t) and is replicated over TP."""
    out = attention_gemms(m, rows, t)
    if m.extra_params_per_layer:
        out.append(Gemm(1, rows, m.d_model, m.extra_params_per_layer / m.d_model / t))
    if moe:
        local = m.n_experts / ep
        per_expert = etp * ep * rows * m.top_k / (t * m.n_experts)
        out += ffn_gemms(m, per_expert, m.d_ffn / etp, local)
        if m.n_experts > 1:
            out.append(Gemm(1, rows / t, m.d_model, m.n_experts))
        if m.n_shared:
            out += ffn_gemms(m, rows, (m.d_ffn_shared or m.d_ffn) / t, m.n_shared)
    elif m.d_ffn_dense:
        out += ffn_gemms(m, rows, m.d_ffn_dense / t)
    if m.d_ffn_residual:
        out += ffn_gemms(m, rows, m.d_ffn_residual / t)
    return out


@dataclass(frozen=True)
class Compute:
    """Forward seconds of some work on one GPU, by kind: ``gemm``, ``attention`` (the core),
    ``hbm`` (non-GEMM kernels, the scores' softmax and dropout included), ``scores_hbm`` (the
    part of ``hbm`` on materialised scores, what selective recompute re-runs with the core)."""

    gemm: float = 0.0
    attention: float = 0.0
    hbm: float = 0.0
    scores_hbm: float = 0.0

    @property
    def total(self) -> float:
        return self.gemm + self.attention + self.hbm

    def __add__(self, o: "Compute") -> "Compute":
        return Compute(
            self.gemm + o.gemm,
            self.attention + o.attention,
            self.hbm + o.hbm,
            self.scores_hbm + o.scores_hbm,
        )

    def __mul__(self, x: float) -> "Compute":
        return Compute(self.gemm * x, self.attention * x, self.hbm * x, self.scores_hbm * x)

    __rmul__ = __mul__

    def attention_only(self) -> "Compute":
        """What selective recompute re-runs (Korthikanti et al. 2022 Sec. 5): the core, and the
        softmax and dropout of its scores."""
        return Compute(0.0, self.attention, self.scores_hbm, self.scores_hbm)


def layer_forward(
    m: MoEModel,
    moe: bool,
    p: Platform,
    rows: float,
    keys: float,
    t: int = 1,
    sp: bool = False,
    ep: int = 1,
    etp: int = 1,
    flash: bool = True,
    dropout: bool = False,
) -> Compute:
    """Forward seconds of one layer on one GPU of a TP group whose GEMMs see ``rows`` tokens,
    each attending to ``keys`` keys (module docstring). Non-GEMM bytes per
    formulas.elementwise_bytes_per_token (Megatron-LM's kernel set)."""
    w = F.attention_widths(m)
    core = attention_core_time(p, rows, keys, w["heads"] / t, w["d_qk"], w["d_v"], flash)
    if moe:
        f = m.top_k * m.d_ffn + m.n_shared * (m.d_ffn_shared or m.d_ffn)
    else:
        f = m.d_ffn_dense or 0
    f += m.d_ffn_residual or 0
    top_k = m.top_k if moe and m.n_experts > 1 else 0

    def ew(with_flash: bool) -> float:
        return F.elementwise_bytes_per_token(
            m.d_model,
            m.heads,
            keys,
            f,
            m.n_mat,
            t,
            sp or moe and t > 1,
            with_flash,
            dropout,
            top_k,
            BYTES_PER_VALUE,
        )

    hbm_bytes = ew(flash) * rows
    scores_bytes = hbm_bytes - ew(True) * rows
    return Compute(
        gemms_time(p, layer_gemms(m, moe, rows, t, ep, etp)),
        core,
        hbm_time(p, hbm_bytes),
        hbm_time(p, scores_bytes),
    ) * layer_time_factor(p)


def head_forward(m: MoEModel, p: Platform, rows: float, t: int = 1) -> Compute:
    """The output head, [rows x d] @ [d x V / t] (vocabulary-parallel); none without a vocabulary."""
    return Compute(
        gemm=gemm_time(p, rows, m.d_model, m.vocab / t) if m.vocab else 0.0
    ) * layer_time_factor(p)


def calibration_layer(p: Platform) -> dict | None:
    """The profile's measured layer forward (``calibration.layer_forward``), or None."""
    return (p.raw.get("calibration") or {}).get("layer_forward")


def uncalibrated(p: Platform) -> Platform:
    """``p`` without its measured layer: kernel times from the rates alone."""
    return replace(p, raw={k: v for k, v in p.raw.items() if k != "calibration"})


def calibration_terms(p: Platform) -> dict:
    """The measured layer forward of ``p``'s profile against the model at the profile's rates:
    ``modelled_kernels_s`` (GEMMs, attention core, non-GEMM kernels of one dense GPT layer as the
    measurement ran it), ``modelled_tp_s`` (its two forward all-reduces over NVLink, Shoeybi et al.
    2019 Sec. 3; not scaled) and ``measured_s``. The factor is (measured - TP) / kernels: the
    measured time less the communication the model already prices, over the kernels."""
    cal = calibration_layer(p)
    if cal is None:
        raise ValueError(f"platform {p.name} has no calibration.layer_forward")
    bare = uncalibrated(p)
    h, heads, s, b, t = cal["hidden"], cal["heads"], cal["seq"], cal["micro_batch"], cal["tp"]
    m = megatron_gpt(1, h, heads, None, cal["dropout"], cal["ffn"])
    kernels = layer_forward(
        m, False, bare, b * s, s, t, False, 1, 1, cal["flash_attention"], cal["dropout"]
    ).total
    tp = 0.0
    if t > 1:  # the forward's two of the layer's four all-reduces
        tp = transfer_time(
            bare, F.tp_bytes_per_layer(s, b, h, t, False, "none") / 2, off_node=False, messages=2
        )
    return {
        "measured_s": cal["measured_ms"] / 1e3,
        "modelled_kernels_s": kernels,
        "modelled_tp_s": tp,
    }


def layer_time_factor(p: Platform) -> float:
    """Measured / modelled kernel time of the profile's measured layer (calibration_terms); 1.0
    without one. Computed once per profile object."""
    if calibration_layer(p) is None:
        return 1.0
    cached = p.__dict__.get("_layer_time_factor")
    if cached is None:
        c = calibration_terms(p)
        cached = (c["measured_s"] - c["modelled_tp_s"]) / c["modelled_kernels_s"]
        if cached <= 0:
            raise ValueError(
                f"platform {p.name}: calibration.layer_forward measured_ms is below the "
                f"modelled communication of that layer ({c['modelled_tp_s'] * 1e3:.3g} ms)"
            )
        object.__setattr__(p, "_layer_time_factor", cached)  # a frozen dataclass: cache beside it
    return cached


def train_time(forward: Compute, recomputed: Compute = Compute()) -> float:
    """Forward + backward (module docstring) + the recomputed forward."""
    return (
        (1 + BACKWARD_GEMM) * (forward.gemm + forward.attention)
        + (1 + BACKWARD_HBM) * forward.hbm
        + recomputed.total
    )


# ============================================================================================
# Communication
# ============================================================================================


def link_bytes_per_s(p: Platform, off_node: bool) -> float:
    """Per-GPU bandwidth of a transfer: the intra-node all-to-all rate (NVLink line rate x
    efficiency.nvlink, platform.from_dict) inside a node; across nodes nics x B_NIC / g x
    network efficiency."""
    return (
        p.nic_bytes_per_s_per_gpu * p.network_efficiency
        if off_node
        else p.intra_node_a2a_bytes_per_s
    )


def link_latency_s(p: Platform, off_node: bool) -> float:
    """One message's latency: the on-node link classes' inside a node, the largest of all link
    classes across nodes (a collective waits for its farthest message); 0 without links."""
    lat = [
        float(lk.get("latency_us", 0.0)) * 1e-6
        for lk in p.links
        if off_node or lk["class"] in ON_NODE_CLASSES
    ]
    if not lat:  # a profile naming no on-node class: its fastest link
        lat = [min(float(lk.get("latency_us", 0.0)) for lk in p.links) * 1e-6] if p.links else [0.0]
    return max(lat)


def transfer_time(p: Platform, nbytes: float, off_node: bool, messages: float = 1) -> float:
    """Seconds to send ``nbytes`` per GPU over the link (``messages`` latencies added)."""
    return nbytes / link_bytes_per_s(p, off_node) + messages * link_latency_s(p, off_node)


def alltoall_time(
    p: Platform, on_node_bytes: float, off_node_bytes: float, messages: float = 1
) -> float:
    """An all-to-all sending ``on_node_bytes`` to peers in the node and ``off_node_bytes`` off it
    per GPU: both parts proceed at once, the slower bounds it; one latency per collective."""
    if on_node_bytes <= 0 and off_node_bytes <= 0:
        return 0.0
    off = off_node_bytes > 0
    return max(
        on_node_bytes / link_bytes_per_s(p, False),
        off_node_bytes / link_bytes_per_s(p, True) if off else 0.0,
    ) + messages * link_latency_s(p, off)


def exposed_dp_time(
    grad_s: float,
    gather_s: float,
    zero: int,
    micro_batches: int,
    forward_s: float,
    backward_s: float,
    overlap: bool = True,
) -> float:
    """Seconds of the data-parallel reduction (``grad_s``: reduce or reduce-scatter of gradients;
    ``gather_s``: all-gather of weights) a step exposes (module docstring). ``forward_s`` /
    ``backward_s``: one micro-batch's forward / backward (with any recompute) it hides behind.
    ``overlap=False``: ZeRO 0/1 run it once after the last backward (Megatron-LM before
    --overlap-grad-reduce)."""
    if zero in (0, 1) and not overlap:
        return grad_s + gather_s
    if zero in (0, 1):
        return max(0.0, grad_s - backward_s) + max(0.0, gather_s - forward_s)
    if zero == 2:
        return micro_batches * max(0.0, grad_s - backward_s) + max(0.0, gather_s - forward_s)
    return micro_batches * (
        max(0.0, gather_s - forward_s) + max(0.0, gather_s + grad_s - backward_s)
    )


# ============================================================================================
# Pipeline
# ============================================================================================


def pipeline_step(slot_s: float, micro_batches: int, pp: int, vpp: int = 1) -> tuple[float, float]:
    """(busy, bubble) seconds of a pipelined step whose slowest stage takes ``slot_s`` per
    micro-batch: M slots, and (PP - 1) / VPP idle slots (module docstring)."""
    if slot_s < 0 or micro_batches <= 0 or pp <= 0 or vpp <= 0:
        raise ValueError(
            f"pipeline_step needs slot >= 0 and positive M, PP, VPP; got "
            f"{slot_s}, {micro_batches}, {pp}, {vpp}"
        )
    return micro_batches * slot_s, (pp - 1) / vpp * slot_s


def bubble_fraction(pp: int, micro_batches: int, vpp: int = 1) -> float:
    """Idle fraction of a step: bubble / (busy + bubble) = (PP-1)/VPP / (M + (PP-1)/VPP)."""
    busy, bubble = pipeline_step(1.0, micro_batches, pp, vpp)
    return bubble / (busy + bubble)
