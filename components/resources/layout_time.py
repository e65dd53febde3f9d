"""Step time of one parallel layout, for the parallelism planner.

A layout (TP with or without SP, PP x VPP, CP, EP x ETP, DP, micro-batch size and count) is
timed per micro-batch on its slowest pipeline stage: compute (time_model.layer_forward of each
layer kind, the head on the last stage, backward and any recomputed forward:
time_model.train_time) plus the TP/SP, EP, ETP, CP and PP communication each stage exposes;
the data-parallel traffic per step at each ZeRO stage comes from the largest stage's
parameters. Every second comes from components.resources.time_model, every byte from
components.resources.formulas; the rules, with their sources in Megatron-core, DeepSpeed and
FSDP, are docs/planner.md's "Step time". parallel_planner searches the layouts, checks their
memory (memory_model.LayoutMemory) and adds these parts up into a step time.

Why apart: the search (which layouts, which rules reject them) and the time of one layout are
read and changed separately; this module holds the second.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from moe_repro.components.model.zoo import MoEModel
from moe_repro.components.network.platform import Platform
from moe_repro.components.resources import ep_time as E
from moe_repro.components.resources import formulas as F
from moe_repro.components.resources import time_model as T
from moe_repro.components.resources.memory_model import (
    LayerMemory,
    LayoutMemory,
    MemoryLayout,
    Stage,
)


@dataclass(frozen=True)
class PlanContext:
    """What every layout's evaluation reads: the model, platform, GPUs, batch, precision, the
    ZeRO stages and recompute modes searched, the shapes and rates (parallel_planner builds it)."""

    m: MoEModel
    p: Platform
    seq: int
    G: int
    g: int
    B: int
    prec: F.Precision
    zeros: tuple
    modes: tuple
    flash: bool
    V: int
    d: int
    kvw: int
    peak: float
    model_flops_step: float
    hbm: float
    cf: float
    d_ffn: int
    dropout: bool = False
    overlap_dp: bool = True
    fused_grad_accumulation: bool = True
    overlap_tp: bool = True
    dispatcher: str = "alltoall"  # ep_time.DISPATCHERS
    model_key: str = ""  # for ep_time.node_limit (group-limited routers)
    overlap_ep: bool = False  # EP hidden behind another micro-batch's compute (module docstring)
    gemm_precision: str = "bf16"  # the GEMM rate ``p`` carries (time_model.gemm_rate_platform)


@dataclass(frozen=True)
class Layout:
    """One layout's degrees: TP (+SP), PP x VPP, CP, EP x ETP, DP, micro-batch size and count."""

    t: int
    sp: bool
    q: int
    v: int
    c: int
    e: int
    dp: int
    mb: int
    M: int
    et: int
    first: int = 0  # layers of the first pipeline stage when the split is uneven (0: even split)
    last: int = 0  # layers of the last pipeline stage when the split is uneven (0: even split)

    @property
    def edp(self) -> int:
        return self.dp * self.c * self.t // (self.e * self.et)

    def memory_layout(self) -> MemoryLayout:
        return MemoryLayout(
            tp=self.t,
            cp=self.c,
            pp=self.q,
            vpp=self.v,
            ep=self.e,
            etp=self.et,
            dp=self.dp,
            sp=self.sp,
            micro_batch=self.mb,
            micro_batches=self.M,
        )


@dataclass(frozen=True)
class Slot:
    """The slowest stage's time per micro-batch (``total``) and its parts, seconds; ``forward``:
    its forward compute; ``bytes``: what one GPU sends per micro-batch, by dimension."""

    total: float
    compute: float
    tp: float
    ep: float
    etp: float
    cp: float
    pp: float
    stage: Stage
    forward: float
    bytes: dict


@dataclass
class LayoutView:
    """One layout with what its memory and time parts share (built once per layout by
    ``layout_view``): its memory model, and the memo of its slot time per recompute mode."""

    lay: Layout
    mem: LayoutMemory
    s_loc: float  # tokens of a sequence on one CP rank
    pp_off_node: bool  # a pipeline neighbour on another node
    cp_off_node: bool  # a CP ring spanning nodes
    layer_fwd: dict  # moe -> time_model.Compute of one layer's forward on one GPU
    time_memo: dict = field(default_factory=dict)

    def label(self, kind: str, n: int) -> tuple[str, int]:
        """The recompute mode as reported: none, selective, full (every layer) or full:N."""
        kind, n = self.mem.mode_key(kind, n)
        if kind != "full":
            return kind, 0
        nmax = self.mem.nmax
        return ("full", nmax) if n >= nmax else (f"full:{n}", n)


def layout_view(
    lay: Layout, stages: list[Stage], ctx: PlanContext, memory: LayerMemory
) -> LayoutView:
    """The layout's memory model over its representative stages, and each layer kind's forward
    time on one GPU (a TP rank's GEMMs see its CP shard of the micro-batch)."""
    m, seq, g = ctx.m, ctx.seq, ctx.g
    mem = LayoutMemory(memory, lay.memory_layout(), stages, ctx.p.overhead_bytes)
    rows = lay.mb * seq / lay.c
    layer_fwd = {
        moe: T.layer_forward(
            m, moe, ctx.p, rows, seq, lay.t, lay.sp, lay.e, lay.et, ctx.flash, ctx.dropout
        )
        for moe in (False, True)
        if (m.n_moe_layers if moe else m.n_dense_layers)
    }
    span_dp = lay.t * lay.c * lay.dp  # ranks a DP (and EDP) group spans
    return LayoutView(lay, mem, seq / lay.c, span_dp * lay.q > g, lay.t * lay.c > g, layer_fwd)


def slot_time(lv: LayoutView, ctx: PlanContext, kind: str, n: int) -> Slot:
    """Time: the slowest stage's time per micro-batch under (kind, N), with its parts and
    bytes (module docstring, "Step time"); every second from components.resources.time_model."""
    k = lv.mem.mode_key(kind, n)
    if k not in lv.time_memo:
        slots = [_stage_slot(lv, ctx, st, *k) for st in lv.mem.stages]
        best = slots[0]
        for slot in slots[1:]:
            if slot.total > best.total:
                best = slot
        lv.time_memo[k] = best
    return lv.time_memo[k]


def _stage_slot(lv: LayoutView, ctx: PlanContext, st: Stage, kind: str, n: int) -> Slot:
    """One stage's time per micro-batch: compute (with any recomputed forward) and the exposed
    TP, EP, ETP, CP and PP communication."""
    m, p = ctx.m, ctx.p
    lay = lv.lay
    none = T.Compute()
    dense_fwd, moe_fwd = lv.layer_fwd.get(False, none), lv.layer_fwd.get(True, none)
    rd, rm = st.recomputed(n) if kind == "full" else (0, 0)
    layers_fwd = st.n_dense * dense_fwd + st.n_moe * moe_fwd
    if kind == "full":
        recomputed = rd * dense_fwd + rm * moe_fwd
    elif kind == "selective":
        recomputed = layers_fwd.attention_only()
    else:
        recomputed = none
    fwd = layers_fwd + (T.head_forward(m, p, lay.mb * ctx.seq / lay.c, lay.t) if st.last else none)
    comp = T.train_time(fwd, recomputed)
    core_s = (1 + T.BACKWARD_GEMM) * fwd.attention + recomputed.attention
    tp_s, tp_b = _tp_time(lv, ctx, st.n_layers, rd + rm, layers_fwd.gemm)
    ep_s, ep_b, etp_s, etp_b = _expert_time(lv, ctx, st, rm)
    if ctx.overlap_ep:
        # Megatron-core --overlap-moe-expert-parallel-comm / DualPipe: a micro-batch's forward
        # runs beside another's backward, each one's EP all-to-alls under the other's compute
        ep_s = max(0.0, ep_s - comp)
    cp_s = cp_b = 0.0
    if lay.c > 1:  # the ring exchange overlaps the attention core it feeds
        cp_b = F.cp_ring_bytes_per_layer(ctx.seq, lay.mb, ctx.kvw, lay.c) * st.n_layers / lay.t
        cp_s = max(0.0, T.transfer_time(p, cp_b, lv.cp_off_node, messages=0) - core_s)
    pp_s, pp_b = _pp_time(lv, ctx)
    return Slot(
        comp + tp_s + ep_s + etp_s + cp_s + pp_s,
        comp,
        tp_s,
        ep_s,
        etp_s,
        cp_s,
        pp_s,
        st,
        fwd.total,
        {"tp": tp_b, "ep": ep_b, "etp": etp_b, "cp": cp_b, "pp": pp_b},
    )


def _tp_time(
    lv: LayoutView, ctx: PlanContext, n_layers: int, rec: int, gemm_s: float
) -> tuple[float, float]:
    """(exposed seconds, bytes) of a stage's TP/SP collectives per micro-batch; ``rec`` layers
    recomputed, ``gemm_s`` the forward's GEMM time the backward's collectives hide behind."""
    t, sp, mb, p, s_loc = lv.lay.t, lv.lay.sp, lv.lay.mb, ctx.p, lv.s_loc
    if t == 1:
        return 0.0, 0.0
    tp_b = (
        F.tp_bytes_per_layer(s_loc, mb, ctx.d, t, sp, "none") * (n_layers - rec)
        + F.tp_bytes_per_layer(s_loc, mb, ctx.d, t, sp, "full") * rec
    )
    per_op = 2 if sp else 1  # SP: an all-gather and a reduce-scatter where TP all-reduces
    if not ctx.overlap_tp:
        return T.transfer_time(
            p, tp_b, off_node=False, messages=(4 * n_layers + 2 * rec) * per_op
        ), tp_b
    # the column-parallel layers' backward collectives (two per layer: all-reduces, or with SP
    # reduce-scatters) run beside the weight-gradient GEMMs (Megatron-LM's asynchronous TP
    # all-reduce; Korthikanti et al. Sec. 6.2), which take about the forward's GEMM time: only
    # what exceeds them is exposed. SP's all-gathers of the row-parallel layers' gradients come
    # before their GEMMs: exposed.
    hidden_b = F.tp_bytes_per_layer(s_loc, mb, ctx.d, t, sp, "none") / (4 if sp else 2) * n_layers
    tp_s = T.transfer_time(
        p,
        tp_b - hidden_b,
        off_node=False,
        messages=(4 * n_layers + 2 * rec) * per_op - 2 * n_layers,
    )
    tp_s += max(0.0, T.transfer_time(p, hidden_b, off_node=False, messages=2 * n_layers) - gemm_s)
    return tp_s, tp_b


def _expert_time(
    lv: LayoutView, ctx: PlanContext, st: Stage, rm: int
) -> tuple[float, float, float, float]:
    """(EP seconds, EP bytes, ETP seconds, ETP bytes) of a stage per micro-batch; ``rm`` MoE
    layers recomputed (a full recompute repeats the forward's half of the traffic)."""
    m, p, g, lay = ctx.m, ctx.p, ctx.g, lv.lay
    e, et = lay.e, lay.et
    ep_s = ep_b = etp_s = etp_b = 0.0
    if not st.n_moe:
        return ep_s, ep_b, etp_s, etp_b
    moe_fwds = st.n_moe + 0.5 * rm
    tokens = lay.mb * ctx.seq / (lay.t * lay.c)
    if e > 1:
        # one dispatch per ctx.dispatcher (ep_time: the simulator's model in closed form); a
        # layer's forward dispatches and combines, its backward does both again; the capacity
        # factor scales the rows sent
        on_node = min(e, max(1, g // et))  # EP peers inside a node (expert order tp-ep-dp-pp)
        one = E.dispatch_time(
            p,
            ctx.dispatcher,
            e,
            on_node,
            ctx.cf * tokens,
            m.top_k,
            m.n_experts,
            2 * ctx.d,
            E.node_limit(ctx.model_key, max(1, e // on_node)),
        )
        ep_s, ep_b = one.seconds * 4 * moe_fwds, one.bytes * 4 * moe_fwds
    if et > 1:
        # expert TP: all-gather the dispatched tokens over the ETP group, reduce-scatter the
        # expert outputs; the backward does the reverse: 2 all-gathers + 2 reduce-scatters of
        # ETP x (c k tokens h 2 B), (ETP-1)/ETP of each sent
        gathered = et * ctx.cf * m.top_k * tokens * ctx.d * 2
        etp_b = (
            2 * (F.allgather_bytes(gathered, et) + F.reduce_scatter_bytes(gathered, et)) * moe_fwds
        )
        etp_s = T.transfer_time(p, etp_b, off_node=False, messages=4 * st.n_moe + 2 * rm)
    return ep_s, ep_b, etp_s, etp_b


def _pp_time(lv: LayoutView, ctx: PlanContext) -> tuple[float, float]:
    """(seconds, bytes) of a stage's pipeline sends per micro-batch: Megatron's scatter/gather
    (Narayanan et al. 2021 Sec. 4.1, on by default): without SP each TP rank sends 1/t of the
    activation and the receivers all-gather it on NVLink."""
    lay, p = lv.lay, ctx.p
    if lay.q == 1:
        return 0.0, 0.0
    pp_b = (
        F.pp_p2p_bytes_per_microbatch(lv.s_loc, lay.mb, ctx.d, lay.t, lay.sp, scatter_gather=True)
        * lay.v
    )
    pp_s = T.transfer_time(p, pp_b, lv.pp_off_node, messages=2 * lay.v)
    if lay.t > 1 and not lay.sp:
        pp_s += T.transfer_time(
            p, F.allgather_bytes(pp_b * lay.t, lay.t), off_node=False, messages=2 * lay.v
        )
    return pp_s, pp_b


def dp_time(ctx: PlanContext, lv: LayoutView, z: int, slot: Slot) -> tuple[float, float, float]:
    """(gradient bytes, weight all-gather bytes, exposed seconds) of the data-parallel traffic
    at ZeRO ``z``: the dense part over DP x CP, the experts over EDP, per the module docstring's
    overlap rules."""
    lay, prec = lv.lay, ctx.prec
    dense_p = max(d_p for d_p, _ in lv.mem.params)
    exp_p = max(e_p for _, e_p in lv.mem.params)
    grad_b = ag_b = 0.0
    for n_params, n in ((dense_p, lay.dp * lay.c), (exp_p, lay.edp)):
        if n_params and n > 1:
            if z == 0:
                grad_b += F.ring_allreduce_bytes(n_params * prec.grads, n)
            else:
                grad_b += F.reduce_scatter_bytes(n_params * prec.grads, n)
                ag_b += F.allgather_bytes(n_params * prec.weights, n)
    dp_off_node = lay.t * lay.c * lay.dp > ctx.g
    t_grad = T.transfer_time(ctx.p, grad_b, dp_off_node, messages=0)
    t_ag = T.transfer_time(ctx.p, ag_b, dp_off_node, messages=0)
    bwd_mb = slot.compute - slot.forward  # backward (with any recomputed forward) of one mb
    dp_s = T.exposed_dp_time(t_grad, t_ag, z, lay.M, slot.forward, bwd_mb, ctx.overlap_dp)
    return grad_b, ag_b, dp_s


def time_assumptions(p: Platform, flash: bool) -> list[str]:
    """The time rules above in words, with the numbers of platform ``p`` (a plan's
    assumptions)."""
    g = p.gpus_per_node
    peak_given = "peak_tflops" in p.raw.get("gpu", {}) and p.peak_flops > 0
    return [
        f"compute (time_model): each GEMM at its own shape, a roofline of the achievable "
        f"{p.gemm_flops / 1e12:g} TFLOPS"
        + (f" x tile and wave quantization on {p.sm_count} SMs" if p.sm_count else "")
        + " and HBM, attention core (causal halved) at "
        f"{p.attention_flops / 1e12:g} TFLOPS, whatever the precision preset (FP8 speed-up not "
        "modelled); backward = 2 x forward (1.5 x for non-GEMM kernels); recompute adds the recomputed "
        "forward; non-GEMM kernels "
        f"(norms, activations, bias-dropout-add{', softmax and dropout of the scores' if not flash else ''}) "
        f"at HBM {p.hbm_bytes_per_s / 1e9:g} GB/s; every stage "
        "runs at the pace of the slowest (uneven splits put extra layers on the first stages)"
        + _calibration_note(p),
        f"communication: formulas' bytes; TP/SP, CP and EP inside a node at {p.intra_node_a2a_bytes_per_s / 1e9:g} "
        f"GB/s per GPU, off-node at NIC {p.nic_bytes_per_s_per_gpu / 1e9:g} GB/s per GPU x efficiency "
        f"{p.network_efficiency:g}; per-collective latency from the profile's links; TP/SP, EP and "
        "PP traffic exposed (not overlapped), except the column-parallel layers' backward TP "
        "collectives (two per layer), which overlap the weight-gradient GEMMs (Megatron-LM's "
        "asynchronous TP all-reduce; exposed only beyond them); EP all-to-all: on- and off-node parts concurrent, "
        "full recompute repeats the forward's two; ETP: all-gather + reduce-scatter of the "
        "ETP-gathered dispatched tokens forward and again backward, 4 (ETP-1) c k tokens h 2 B per MoE "
        "layer, on NVLink (Megatron-core token_dispatcher); CP ring overlapped with the attention core",
        "DP: ZeRO-0/1 reduce gradients once per step, overlapped with the last micro-batch's "
        "backward; ZeRO-1/2 all-gather updated weights overlapped with the next step's first "
        "forward; ZeRO-2 reduce-scatters gradients every micro-batch and ZeRO-3 also all-gathers "
        "weights for every forward and backward (DeepSpeed/FSDP under gradient accumulation), "
        "each overlapped with that micro-batch's compute; only the excess is counted; a DP group "
        f"inside one node of {g} GPUs uses NVLink, others the NIC",
        "pipeline: bubble (PP - 1) / VPP slots of the slowest stage (Narayanan 2021); P2P scatter/gather "
        "(1/TP of each activation per rank, all-gathered on NVLink; Narayanan 2021 Sec. 4.1); interleaving "
        "multiplies P2P sends by VPP",
        "optimizer step: one HBM pass reading and writing the stage's model state (weights, gradients, "
        "master, moments); gradient accumulation fused into the weight-gradient GEMMs (no pass of its "
        "own) unless asked otherwise; not modelled: kernel launch gaps, a kernel's fixed start and "
        "tail (thin GEMMs are optimistic), the host's data loading and logging",
        "search: for each layout and ZeRO stage only the lightest recompute mode that fits is kept "
        "(none, selective, full:N with the smallest N found by bisection, full; heavier ones fit too "
        "and are slower); ranked by step time",
        f"MFU: model FLOPs per step (formulas.train_flops_per_token, causal, no recompute) / "
        f"(GPUs x {'peak' if peak_given else 'achievable GEMM (the profile has no peak)'} "
        f"{(p.peak_flops if peak_given else p.gemm_flops) / 1e12:g} TFLOPS x step time)",
    ]


def _calibration_note(p) -> str:
    """What a profile's measured layer (time_model.layer_time_factor) does to every layer's
    kernel times; empty without one."""
    cal = T.calibration_layer(p)
    if cal is None:
        return ""
    c = T.calibration_terms(p)
    return (
        f"; then every layer's kernel times x {T.layer_time_factor(p):.3f}, measured / modelled for "
        f"one measured layer on this platform ({cal['source']}: {c['measured_s'] * 1e3:g} ms forward, "
        f"of which the model prices {c['modelled_tp_s'] * 1e3:.2f} ms of TP all-reduces and "
        f"{c['modelled_kernels_s'] * 1e3:.2f} ms of kernels; profile calibration.layer_forward)"
    )
