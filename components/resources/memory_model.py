"""Training memory: Piper Eq. 1-5 as printed, and the one per-stage model both planners use.

1. ``piper_eq1`` ... ``piper_eq5``: Piper Sec. III-A exactly as printed (bytes). Symbols as Piper
   Table II: d, d_ffn, E (routed experts), L, H (heads), k (top-k), b (batch, sequences),
   s (sequence), EP, PP, M (micro-batches), i (stage). Per layer:
   static 64 d^2 (attention, 4 d^2 x 16 B) + 48 E d d_ffn / EP (experts, 3 d d_ffn x 16 B);
   attention activations 12 b s d + 4 H b s^2 (2 bytes x (6 b s d + 2 b H s^2));
   expert activations 2 b s k (3 d_ffn + d) / EP. With FlashAttention, 4 b H s^2 -> 2 b H s.
   The printed equations read b as a per-GPU batch in the attention term and as the EP group's
   batch in the expert term; we implement them as printed (the paper's model, reproduced).

2. ``LayoutMemory``: bytes on one GPU of every pipeline stage of a DP x TP (+SP) x PP (1F1B,
   interleaved or GPipe) x EP x ETP x CP layout, for any ZeRO stage and recompute mode, by term
   (``StageMemory``: weights, grads, optimizer, activations, buffers). Activations per layer from
   formulas.moe_activation_terms_per_layer, model state from formulas.model_state_bytes at a
   precision preset; the rules are docs/planner.md's "Memory per GPU". The parallelism planner
   searches layouts with it; Piper's PP x EP planner (``all_stages``: TP = CP = 1, the attention
   data-parallel over the EP group) uses the same model, so one layout has one memory. With a
   memory kind (allocated, reserved, device) the profile's constant overhead gives way to the
   sourced terms of memory_terms (docs/planner.md, "Memory kinds and terms"); ``per_gpu_memory``
   answers one fixed layout.

Also here: X-MoE Table 2 activation sizes and App. C.2 SSMB vs TED trade-off (Eq. 1-2), and MoP
Table 1's per-rank memory with an FSDP-style plan beside it (MoP Table 2-3).
"""

from __future__ import annotations

from dataclasses import dataclass

from moe_repro.components.model.params import (
    attention_params,
    dense_ffn_params,
    residual_ffn_params,
    shared_expert_params,
)
from moe_repro.components.model.pipeline_split import stage_sizes
from moe_repro.components.model.zoo import MoEModel
from moe_repro.components.resources import formulas as F
from moe_repro.components.resources import memory_terms as MT

ACT_BYTES = 2  # bf16/fp16 activations


def _positive(**values) -> None:
    for name, v in values.items():
        if v is None or v <= 0:
            raise ValueError(f"{name} must be positive, got {v}")


# --------------------------------------------------------------------------------------------
# 1. Piper Eq. 1-5, as printed
# --------------------------------------------------------------------------------------------


def piper_attention_activation(b: float, s: int, d: int, H: int, flash: bool = False) -> float:
    """Piper Table III: 12 b s d + 4 b H s^2 bytes; with FlashAttention 4 b H s^2 -> 2 b H s."""
    return 12 * b * s * d + (2 * b * H * s if flash else 4 * b * H * s * s)


def piper_expert_activation(b: float, s: int, k: int, d: int, d_ffn: int, EP: int = 1) -> float:
    """Piper Table III / Eq. 2: 2 b s k (3 d_ffn + d) / EP bytes (E[s_e] = b s k / E per expert)."""
    return 2 * b * s * k * (3 * d_ffn + d) / EP


def piper_eq1(d, d_ffn, E, L, H, k, b, s, flash=False) -> float:
    """Eq. 1: unpartitioned memory M_u (one hypothetical GPU of infinite memory)."""
    return piper_eq2(d, d_ffn, E, L, H, k, b, s, EP=1, flash=flash)


def piper_eq2(d, d_ffn, E, L, H, k, b, s, EP, flash=False) -> float:
    """Eq. 2: per-GPU memory under expert-data parallelism (P = EP)."""
    _positive(EP=EP, L=L)
    return L * (
        64 * d * d
        + 48 * E / EP * d * d_ffn
        + piper_attention_activation(b, s, d, H, flash)
        + piper_expert_activation(b, s, k, d, d_ffn, EP)
    )


def piper_eq3(d, d_ffn, E, L, H, k, b, s, EP, PP, flash=False) -> float:
    """Eq. 3: GPipe, every stage keeps all M micro-batches (= b sequences) alive at the peak."""
    _positive(PP=PP)
    return piper_eq2(d, d_ffn, E, L, H, k, b, s, EP, flash) / PP


def piper_eq4(d, d_ffn, E, L, H, k, b, s, EP, PP, M, i, flash=False) -> float:
    """Eq. 4: 1F1B, stage i holds (PP - i) in-flight micro-batches of b/M sequences."""
    _positive(EP=EP, PP=PP, M=M)
    if not 0 <= i < PP:
        raise ValueError(f"stage i must be in 0..{PP - 1}, got {i}")
    per_micro = piper_attention_activation(b / M, s, d, H, flash) + piper_expert_activation(
        b / M, s, k, d, d_ffn, EP
    )
    return L / PP * (64 * d * d + 48 * E / EP * d * d_ffn + (PP - i) * per_micro)


def piper_eq5(d, d_ffn, E, L, H, k, b, s, EP, PP, M, flash=False) -> float:
    """Eq. 5: M_1F1B(0) - M_1F1B(PP-1) = L (PP-1)/PP x (activations of one micro-batch)."""
    _positive(EP=EP, PP=PP, M=M)
    per_micro = piper_attention_activation(b / M, s, d, H, flash) + piper_expert_activation(
        b / M, s, k, d, d_ffn, EP
    )
    return L * (PP - 1) / PP * per_micro


# --------------------------------------------------------------------------------------------
# 2. The planners' memory model: bytes on one GPU of each pipeline stage of a layout
# --------------------------------------------------------------------------------------------

ALL_LAYERS = 10**9  # recompute (full, ALL_LAYERS): every layer of each model chunk


@dataclass(frozen=True)
class LayerWeights:
    """Weights of one layer by how a layout splits them."""

    moe: bool
    w_tp: float  # split over TP (matrices)
    w_rep: float  # replicated over TP (norms, MLA down-projections + latent norms, router)
    w_exp: float  # routed-expert weights, all E experts


def mla_replicated(m: MoEModel) -> int:
    """MLA weights Megatron-core keeps duplicated over TP: the query and KV down-projections
    (d r_q, d (r_kv + d_rope)) and the two latent norms (r_q + r_kv). 0 for other attention."""
    if m.attn_params != "mla" or m.mla is None:
        return 0
    a, d = m.mla, m.d_model
    rq = a.q_lora_rank or 0
    return d * rq + rq + d * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank


def layer_weights(m: MoEModel) -> tuple[LayerWeights, LayerWeights]:
    """(dense layer, MoE layer) weights; summed over the layers plus the embedding, head and
    final norm they equal formulas.parameters(m)["total"]."""
    d = m.d_model
    attn = attention_params(m)
    rep_attn = mla_replicated(m)
    norms = 2 * d
    extra = m.extra_params_per_layer
    resid = residual_ffn_params(m)
    dense_ffn = dense_ffn_params(m) if m.n_dense_layers else 0
    dense = LayerWeights(False, attn + extra + resid + dense_ffn - rep_attn, norms + rep_attn, 0.0)
    router = d * m.n_experts if m.n_experts > 1 else 0
    moe = LayerWeights(
        True,
        attn + extra + resid + shared_expert_params(m) - rep_attn,
        norms + rep_attn + router,
        float(m.n_experts * m.expert_params()),
    )
    return dense, moe


@dataclass(frozen=True)
class Stage:
    """One physical pipeline stage: its dense and MoE layers and those of each model chunk."""

    r: int
    n_dense: int
    n_moe: int
    first: bool
    last: bool
    chunks: tuple = ()  # (dense, MoE) layers of each model chunk on this stage, dense first

    @property
    def n_layers(self) -> int:
        return self.n_dense + self.n_moe

    def recomputed(self, n: int) -> tuple[int, int]:
        """(dense, MoE) layers recomputed when the first ``n`` layers of each model chunk are
        (Megatron-core's block method: the first recompute_num_layers of each chunk)."""
        rd = rm = 0
        for nd, nm in self.chunks:
            r = min(n, nd + nm)
            rd += min(r, nd)
            rm += r - min(r, nd)
        return rd, rm


def pipeline_stages(m: MoEModel, pp: int, v: int = 1, every: bool = False) -> list[Stage]:
    """The stages of PP x VPP model chunks (pipeline_split; chunk k on stage k mod PP). Unless
    ``every``: the first of each distinct (dense, MoE, first, last) composition only. Within one
    composition the earliest holds the most micro-batches, so it binds memory, and all have the
    same time: checking these is checking every stage."""
    chunks = stage_sizes(m.layers, pp * v)
    first_moe = m.layers - m.n_moe_layers  # dense layers come first (DeepSeek, Kimi)
    starts = [sum(chunks[:k]) for k in range(len(chunks))]
    seen, out = set(), []
    for r in range(pp):
        comp = []
        for j in range(v):
            lo, n = starts[j * pp + r], chunks[j * pp + r]
            dense_here = max(0, min(lo + n, first_moe) - lo)
            comp.append((dense_here, n - dense_here))
        nd, nm = sum(c[0] for c in comp), sum(c[1] for c in comp)
        key = (nd, nm, r == 0, r == pp - 1, tuple(comp))
        if every or key not in seen:
            seen.add(key)
            out.append(Stage(r, nd, nm, r == 0, r == pp - 1, tuple(comp)))
    return out


def split_stages(m: MoEModel, pp: int, v: int, first: int, last: int) -> list[Stage]:
    """The representative pipeline stages of a split: memory_model.pipeline_stages for the even
    split (first = last = 0), else the stages of pipeline_split.stage_sizes(L, PP, first, last),
    each stage's layers cut into its VPP model chunks as evenly as possible (a chunk may hold no
    decoder layer, as Megatron's first chunk holds only the embedding when the embedding is
    counted as a layer); chunk j of stage r is model chunk j x PP + r, dense layers first."""
    if not (first or last):
        return pipeline_stages(m, pp, v)
    sizes = stage_sizes(m.layers, pp, first or None, last or None)
    per_stage = [[n // v + (1 if j < n % v else 0) for j in range(v)] for n in sizes]
    order = [(r, j) for j in range(v) for r in range(pp)]  # model order of the chunks
    start, starts = 0, {}
    for r, j in order:
        starts[r, j] = start
        start += per_stage[r][j]
    first_moe = m.layers - m.n_moe_layers  # dense layers come first (DeepSeek, Kimi)
    seen, out = set(), []
    for r in range(pp):
        comp = []
        for j in range(v):
            lo, n = starts[r, j], per_stage[r][j]
            dense_here = max(0, min(lo + n, first_moe) - lo)
            comp.append((dense_here, n - dense_here))
        nd, nm = sum(c[0] for c in comp), sum(c[1] for c in comp)
        key = (nd, nm, r == 0, r == pp - 1, tuple(comp))
        if key not in seen:
            seen.add(key)
            out.append(Stage(r, nd, nm, r == 0, r == pp - 1, tuple(comp)))
    return out


@dataclass(frozen=True)
class MemoryLayout:
    """The degrees memory depends on. ``micro_batch``: sequences per data-parallel rank per
    micro-batch; ``schedule``: 1f1b (interleaved when ``vpp`` > 1) or gpipe (every micro-batch
    held). Experts are data-parallel over EDP = DP x CP x TP / (EP x ETP) ranks."""

    tp: int = 1
    cp: int = 1
    pp: int = 1
    vpp: int = 1
    ep: int = 1
    etp: int = 1
    dp: int = 1
    sp: bool = False
    micro_batch: int = 1
    micro_batches: int = 1
    schedule: str = "1f1b"

    @property
    def edp(self) -> int:
        return self.dp * self.cp * self.tp // (self.ep * self.etp)


@dataclass(frozen=True)
class StageMemory:
    """Bytes on one GPU of pipeline stage ``stage``, by term; ``host``: state offloaded to the
    host (not in ``total``). ``extras``: the terms a memory ``kind`` adds (memory_terms), as
    (name, bytes) pairs; none without a kind."""

    stage: int
    weights: float
    grads: float
    optimizer: float  # master weights and optimizer moments
    activations: float  # with the last stage's fp32 logits
    buffers: float  # framework overhead + ZeRO-3's prefetched weights
    host: float = 0.0
    extras: tuple = ()
    kind: str | None = None

    TERMS = ("weights", "grads", "optimizer", "activations", "buffers")

    @property
    def total(self) -> float:
        return sum(self.terms().values()) + sum(b for _, b in self.extras)

    def terms(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in self.TERMS}

    def binding_term(self) -> str:
        terms = self.terms()
        return max(terms, key=lambda k: terms[k])

    def to_dict(self) -> dict[str, float]:
        """The terms (with any extras by name), ``total`` and ``host`` (a plan's ``memory``)."""
        return {**self.terms(), **dict(self.extras), "total": self.total, "host": self.host}

    def breakdown(self) -> list[tuple[str, float, str]]:
        """Every term as (name, bytes, source), the live-tensor terms first."""
        rows = [(k, v, MT.SOURCES[k]) for k, v in self.terms().items()]
        return rows + [(k, v, MT.SOURCES[k]) for k, v in self.extras]


def in_flight(layout: MemoryLayout, r: int) -> int:
    """Model chunks whose activations stage r holds at its peak: GPipe all M; 1F1B
    min(PP - r, M) (Narayanan et al. 2021; Piper Eq. 4); interleaved min(M v, 2 (PP - r - 1) +
    (v - 1) PP + 1) (Megatron-core ``num_warmup_microbatches`` + 1)."""
    q, v, M = layout.pp, layout.vpp, layout.micro_batches
    if layout.schedule == "gpipe":
        if v > 1:
            raise ValueError("the gpipe schedule has no virtual stages (vpp must be 1)")
        return M
    if layout.schedule != "1f1b":
        raise ValueError(f"schedule must be '1f1b' or 'gpipe', got {layout.schedule!r}")
    if v == 1:
        return min(q - r, M)
    return min(M * v, 2 * (q - r - 1) + (v - 1) * q + 1)


def eager_swiglu_extra(m: MoEModel, moe: bool, n: float, t: int = 1, cf: float = 1.0) -> float:
    """Bytes an eager SwiGLU keeps beyond the fused one's n_mat d_ffn per token: silu(w1 x)
    (torchtitan FeedForward and its grouped experts compute ``w2(silu(w1 x) * w3 x)``; autograd
    keeps w1 x, w3 x, silu(w1 x) and their product). ``n``: tokens of one micro-batch per
    CP rank; dense FFN, or routed copies and shared experts, / TP."""
    if moe:
        copies = cf * m.top_k * n / t
        return ACT_BYTES * (copies * m.d_ffn + m.n_shared * n * (m.d_ffn_shared or m.d_ffn) / t)
    return ACT_BYTES * n * (m.d_ffn_dense or m.d_ffn) / t


def torchtitan_op_sac_bytes(m: MoEModel, moe: bool, n: float, t: int = 1, sp: bool = False):
    """Bytes one layer keeps under torchtitan's per-op selective checkpointing (its
    ``_save_list`` policy: the outputs of SDPA (with its fp32 log-sum-exp), of TP's
    reduce-scatters and of every other ``aten.mm`` of the block, the first, third, ... in call
    order; everything else recomputed), plus the block's input. The block's matmuls in order:
    attention wq, wk, wv (MLA: wq or wq_a and wq_b, wkv_a, wkv_b), wo; a dense FFN's w1, w3,
    w2; an MoE block's router gate and its shared experts' w1, w3, w2 (the routed experts are
    grouped GEMMs, not in the list). Column-parallel outputs / TP; row-parallel ones (wo, w2)
    are the full-width partial sums. ``n``: tokens of one micro-batch per CP rank."""
    d, heads = m.d_model, m.heads
    if m.mla is not None:
        a = m.mla
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        q = [a.q_lora_rank, heads * qk / t] if a.q_lora_rank else [heads * qk / t]
        mms = q + [a.kv_lora_rank + a.qk_rope_head_dim]
        mms += [heads * (a.qk_nope_head_dim + a.v_head_dim) / t, d]
        attn_out = heads * a.v_head_dim / t
    else:
        hd = m.head_dim or d // heads
        kv = (m.n_kv_heads or heads) * hd / t
        mms = [heads * hd / t, kv, kv, d]
        attn_out = heads * hd / t
    if moe:
        ds = (m.d_ffn_shared or m.d_ffn) / t
        mms += [m.n_experts] + [ds, ds, d] * m.n_shared
    else:
        ffn = (m.d_ffn_dense or m.d_ffn) / t
        mms += [ffn, ffn, d]
    saved = sum(mms[0::2]) + attn_out
    block_in = d / (t if sp else 1)
    reduce_scatters = 2 * d / t if (t > 1 and sp) else 0.0
    return n * (ACT_BYTES * (saved + block_in + reduce_scatters) + 4.0 * heads / t)


class LayerMemory:
    """One layer's activation bytes and a parameter count's model-state bytes for a model,
    sequence and precision, cached (a search asks them for every layout, stage and mode)."""

    def __init__(
        self,
        m: MoEModel,
        seq: int,
        prec: F.Precision,
        flash: bool = True,
        dropout: bool = False,
        capacity_factor: float = 1.0,
        kind: str | None = None,
        settings: MT.MemorySettings | None = None,
    ):
        self.m, self.seq, self.prec = m, seq, prec
        self.flash, self.dropout, self.cf = flash, dropout, capacity_factor
        # the memory kind every LayoutMemory over this model predicts unless it names its own
        self.kind, self.settings = MT.check_kind(kind), settings or MT.MemorySettings()
        self.dense_l, self.moe_l = layer_weights(m)
        self.act_cache: dict[tuple, float] = {}
        self.state_cache: dict[tuple, dict[str, float]] = {}

    def layer_act(
        self, moe: bool, t: int, sp: bool, c: int, mb: int, mode: str, et: int = 1
    ) -> float:
        """formulas.moe_activation_terms_per_layer; with ETP > 1 the dispatched expert input is
        the ETP group's all-gathered tokens (ETP x formulas' ``dispatch``), the intermediates are
        ETP x the tokens at d_ffn / ETP (unchanged) and the combine input is reduce-scattered back
        (unchanged): Megatron-core MoEAlltoAllTokenDispatcher gathers over the expert-TP group
        after the EP all-to-all and reduce-scatters before the return all-to-all."""
        et = et if moe else 1
        key = (moe, t, sp, c, mb, mode, et)
        if key not in self.act_cache:
            terms = F.moe_activation_terms_per_layer(
                self.m,
                self.seq,
                mb,
                moe=moe,
                t=t,
                sp=sp,
                cp=c,
                recompute=mode,
                bytes_per_value=ACT_BYTES,
                dropout=self.dropout,
                capacity_factor=self.cf,
            )
            if et > 1 and "dispatch" in terms:
                terms["dispatch"] *= et
            self.act_cache[key] = sum(terms.values())
        return self.act_cache[key]

    def state(self, n_params: float, n: int, z: int) -> dict[str, float]:
        """formulas.model_state_bytes of ``n_params`` sharded over ``n`` ranks at ZeRO ``z``."""
        key = (n_params, n, z)
        if key not in self.state_cache:
            self.state_cache[key] = (
                F.model_state_bytes(n_params, n, z, self.prec)
                if n_params
                else dict.fromkeys(
                    ("weights", "grads", "master", "optimizer", "total", "host"), 0.0
                )
            )
        return self.state_cache[key]


class LayoutMemory:
    """The memory of one layout's stages for any ZeRO stage and recompute mode (docs/planner.md,
    "Memory per GPU"). A recompute mode is (kind, N): none, selective, or full with the first N
    layers of each model chunk recomputed (ALL_LAYERS: every layer).

    ``memory_kind`` (default: the LayerMemory's, itself None): None counts the live tensors plus
    ``overhead_bytes`` (the profile's constant); "allocated", "reserved" or "device" count the
    live tensors plus the sourced terms of memory_terms that kind includes, in place of the
    constant (docs/planner.md, "Memory kinds and terms")."""

    def __init__(
        self,
        lm: LayerMemory,
        layout: MemoryLayout,
        stages: list[Stage],
        overhead_bytes: float = 0.0,
        memory_kind: str | None = None,
        settings: MT.MemorySettings | None = None,
    ):
        self.lm, self.layout, self.stages = lm, layout, stages
        self.kind = MT.check_kind(memory_kind) if memory_kind is not None else lm.kind
        self.settings = settings or lm.settings
        self.overhead = overhead_bytes if self.kind is None else 0.0
        self._extras: dict[tuple, tuple] = {}
        self.nmax = max(nd + nm for st in stages for nd, nm in st.chunks)  # largest chunk
        self.params = [self._stage_params(st) for st in stages]
        self._acts: dict[tuple, list[float]] = {}
        self._static: dict[int, list[tuple[dict, dict]]] = {}

    def _stage_params(self, st: Stage) -> tuple[float, float]:
        """(dense, expert) parameters one GPU of stage ``st`` holds: matrices / TP, the
        replicated weights whole; the input embedding (vocab-parallel) on the first stage, the
        final norm and the output head (a copy of a tied embedding when PP > 1) on the last;
        this GPU's routed experts, / (EP x ETP)."""
        m, lay = self.lm.m, self.layout
        dl, ml = self.lm.dense_l, self.lm.moe_l
        V, d = m.vocab or 0, m.d_model
        w_tp = st.n_dense * dl.w_tp + st.n_moe * ml.w_tp
        w_rep = st.n_dense * dl.w_rep + st.n_moe * ml.w_rep
        if st.first and V:
            w_tp += V * d
        if st.last and V:
            w_rep += d
            if not m.tie_embeddings or lay.pp > 1:
                w_tp += V * d
        return w_tp / lay.tp + w_rep, st.n_moe * ml.w_exp / (lay.ep * lay.etp)

    def mode_key(self, kind: str, n: int) -> tuple[str, int]:
        """(none|selective, 0) or (full, N) with N clamped to the largest chunk."""
        return (kind, 0) if kind in ("none", "selective") else ("full", min(n, self.nmax))

    def activations(self, kind: str, n: int) -> list[float]:
        """Activation bytes of every stage under (kind, N): the chunks in flight x their layers'
        activations (recomputed layers keep their inputs only), + one layer's working set under
        recompute, + the last stage's fp32 logits of one micro-batch (vocab-parallel: / TP)."""
        k = self.mode_key(kind, n)
        if k not in self._acts:
            self._acts[k] = self._activations(*k)
        return self._acts[k]

    def _activations(self, kind: str, n: int) -> list[float]:
        m, lay, flash = self.lm.m, self.layout, self.lm.flash
        t, sp, c, mb, et = lay.tp, lay.sp, lay.cp, lay.micro_batch, lay.etp

        cfg = self.settings
        n_tok = mb * self.lm.seq / c

        def la(moe: bool, mode: str) -> float:
            present = m.n_moe_layers if moe else m.n_dense_layers
            if not present:
                return 0.0
            act = self.lm.layer_act(moe, t, sp, c, mb, mode, et)
            if cfg.mlp == "eager" and mode != "full" and m.n_mat == 3:
                act += eager_swiglu_extra(m, moe, n_tok, t, self.lm.cf)
            return act

        if kind == "selective" and cfg.selective == "torchtitan-op":
            # every layer keeps what the policy saves; the layer in backward is recomputed whole
            rest = "selective" if flash else "none"
            a_work = max(la(False, rest), la(True, rest))
            a_dense = torchtitan_op_sac_bytes(m, False, n_tok, t, sp) if m.n_dense_layers else 0
            a_moe = torchtitan_op_sac_bytes(m, True, n_tok, t, sp) if m.n_moe_layers else 0
            in_dense, in_moe = a_dense, a_moe
        elif kind == "full":
            # the layers not recomputed keep everything (Megatron's block method); with
            # FlashAttention that is what selective keeps
            rest = "selective" if flash else "none"
            a_dense, a_moe = la(False, rest), la(True, rest)
            in_dense, in_moe = la(False, "full"), la(True, "full")
            a_work = max(a_dense, a_moe)
        else:
            mem_mode = "selective" if (flash and kind == "none") else kind
            a_dense, a_moe = la(False, mem_mode), la(True, mem_mode)
            in_dense, in_moe, a_work = a_dense, a_moe, 0.0
        V, s_loc = m.vocab or 0, self.lm.seq / c
        acts = []
        for st in self.stages:
            rd, rm = st.recomputed(n) if kind == "full" else (0, 0)
            per_mb = (
                rd * in_dense + rm * in_moe + (st.n_dense - rd) * a_dense + (st.n_moe - rm) * a_moe
            )
            act = in_flight(lay, st.r) * per_mb / lay.vpp + a_work
            if st.last and V:  # the logits of one micro-batch (fp32 unless a compiled loss)
                act += MT.logits_kept_bytes(cfg.loss) * mb * s_loc * V / t
            acts.append(act)
        return acts

    def static(self, z: int) -> list[tuple[dict, dict]]:
        """Per stage (dense, expert) model-state bytes at ZeRO ``z``: the dense part sharded over
        DP x CP (Megatron's distributed optimizer and FSDP), the experts over EDP."""
        if z not in self._static:
            lay = self.layout
            self._static[z] = [
                (self.lm.state(dp_, lay.dp * lay.cp, z), self.lm.state(ep_, lay.edp, z))
                for dp_, ep_ in self.params
            ]
        return self._static[z]

    def buffers(self, z: int) -> float:
        """The framework overhead, + under ZeRO-3 two layers' gathered weights (prefetch)."""
        if z != 3:
            return self.overhead
        m, lay, dl, ml = self.lm.m, self.layout, self.lm.dense_l, self.lm.moe_l
        big_layer = max(
            (ml.w_tp / lay.tp + ml.w_rep + ml.w_exp / (lay.ep * lay.etp))
            if m.n_moe_layers
            else 0.0,
            (dl.w_tp / lay.tp + dl.w_rep) if m.n_dense_layers else 0.0,
        )
        return self.overhead + 2 * big_layer * self.lm.prec.weights

    def need(self, z: int, kind: str, n: int) -> tuple[float, int]:
        """(bytes, index) of the stage that needs the most under ZeRO ``z`` and (kind, N)."""
        acts, static = self.activations(kind, n), self.static(z)
        totals = [sd["total"] + se["total"] + a for (sd, se), a in zip(static, acts)]
        if self.kind is not None:
            totals = [
                t + sum(b for _, b in self.extra_terms(z, kind, n, i)) for i, t in enumerate(totals)
            ]
        i = max(range(len(totals)), key=lambda k: totals[k])
        return totals[i] + self.buffers(z), i

    def stage(self, z: int, kind: str, n: int, i: int) -> StageMemory:
        """The terms of stage index ``i`` (of ``stages``) under ZeRO ``z`` and (kind, N)."""
        sd, se = self.static(z)[i]
        return StageMemory(
            stage=self.stages[i].r,
            weights=sd["weights"] + se["weights"],
            grads=sd["grads"] + se["grads"],
            optimizer=sd["master"] + sd["optimizer"] + se["master"] + se["optimizer"],
            activations=self.activations(kind, n)[i],
            buffers=self.buffers(z),
            host=sd["host"] + se["host"],
            extras=self.extra_terms(z, kind, n, i) if self.kind is not None else (),
            kind=self.kind,
        )

    def _layer_local(self) -> float:
        """Parameters of the largest layer on one GPU (matrices / TP, experts / (EP x ETP))."""
        m, lay, dl, ml = self.lm.m, self.layout, self.lm.dense_l, self.lm.moe_l
        return max(
            (ml.w_tp / lay.tp + ml.w_rep + ml.w_exp / (lay.ep * lay.etp))
            if m.n_moe_layers
            else 0.0,
            (dl.w_tp / lay.tp + dl.w_rep) if m.n_dense_layers else 0.0,
        )

    def extra_terms(self, z: int, kind: str, n: int, i: int) -> tuple:
        """The (name, bytes) terms of memory_terms that this LayoutMemory's memory kind adds to
        stage index ``i`` under ZeRO ``z`` and recompute (kind, N)."""
        key = (z, *self.mode_key(kind, n), i)
        if key not in self._extras:
            self._extras[key] = self._extra_terms(z, kind, n, i)
        return self._extras[key]

    def _extra_terms(self, z: int, kind: str, n: int, i: int) -> tuple:
        m, lay, st, prec = self.lm.m, self.layout, self.stages[i], self.lm.prec
        cfg, mk = self.settings, self.kind
        assert mk is not None
        facts = cfg.facts
        t, c, e, et = lay.tp, lay.cp, lay.ep, lay.etp
        V, d = m.vocab or 0, m.d_model
        terms: dict[str, float] = {}
        # allocated: workspaces and the step's transients
        terms["cuBLAS workspaces"] = MT.cublas_workspaces(facts)
        allocs = [facts.cublas_workspace_bytes] * MT.CUBLAS_HANDLES
        dispatch = 0.0
        if st.n_moe and m.n_experts > 1:
            dispatch = MT.moe_dispatch_transient(
                lay.micro_batch * self.lm.seq / (c * t),
                d,
                m.top_k,
                self.lm.cf,
                et,
                e,
                max(1, m.n_experts // e),
                cfg.dropless_worst_case,
                ACT_BYTES,
            )
            terms["MoE dispatch transient"] = dispatch
        logits = loss = 0.0
        if st.last and V:
            tokens = lay.micro_batch * self.lm.seq / c
            logits = MT.logits_kept_bytes(cfg.loss) * tokens * V / t  # what activations keep
            name = cfg.loss_at(z)
            if name == "torch" and t > 1:  # torchtitan's default under TP: torch's loss_parallel
                name = "torch-loss-parallel"
            loss = MT.logits_loss_transient(tokens, V, t, name)
            terms["fp32 logits and loss transient"] = loss
        framework = cfg.framework_at(z)
        layer = self._layer_local()
        dense, expert = self.params[i]
        local = dense + expert
        reduce = MT.grad_reduction_buffers(framework, layer, local, prec.grads)
        terms["gradient reduction buffers"] = reduce
        sharded = (dense / (lay.dp * lay.cp) + expert / lay.edp) if z >= 1 else local
        step = 0.0
        if prec.optimizer and not prec.offload_optimizer:
            step = MT.optimizer_step_temporaries(sharded, prec.optimizer / 2, cfg.optimizer)
        backward = self.activations(kind, n)[i] + self.buffers(z) + dispatch + loss + reduce
        terms["optimizer-step temporaries"] = max(0.0, step - backward)
        if MT.includes(mk, "reserved"):
            rs = layer * 4.0 if framework == "fsdp2" else 0.0  # the fp32 reduce-scatter input
            transients = [dispatch, logits, loss, reduce - rs, rs, step]
            if z == 3:  # two layers' gathered weights, one allocation each
                transients += [layer * prec.weights] * 2
            terms["allocator: segment rounding"] = MT.segment_rounding(allocs + transients)
            terms["allocator: fragmentation"] = MT.fragmentation(
                max(transients), cfg.expandable_segments
            )
        if MT.includes(mk, "device"):
            terms["CUDA context"] = facts.cuda_context_bytes
            terms["NCCL buffers"] = self._nccl(st, z)
            if cfg.dispatcher in ("deepep", "hybrid-ep") and e > 1 and st.n_moe:
                terms["DeepEP buffers"] = MT.deepep_buffers(d, e)
        return tuple((k, v) for k, v in terms.items() if MT.includes(mk, MT.KIND_OF[k]))

    def _nccl(self, st: Stage, z: int) -> float:
        """NCCL buffers of the communicators stage ``st``'s GPU uses (memory_terms.SOURCES)."""
        lay, m, facts = self.layout, self.lm.m, self.settings.facts
        g = facts.gpus_per_node
        t, c, q, e, et = lay.tp, lay.cp, lay.pp, lay.ep, lay.etp
        total = MT.nccl_collective(t, facts) + MT.nccl_collective(lay.dp * c, facts)
        # rank order tp-cp-dp-pp: a CP ring inside TP x CP ranks, a pipeline neighbour one
        # TP x CP x DP span away; EP ranks ETP apart (Megatron-core's expert folding)
        if c > 1:
            peers = 1 if c == 2 else 2
            cp_on_node = t * c <= g
            total += MT.nccl_p2p(peers * cp_on_node, peers * (not cp_on_node), facts)
        if q > 1:
            peers = 1 if (st.first or st.last) else 2
            pp_on_node = t * c * lay.dp < g
            total += MT.nccl_p2p(peers * pp_on_node, peers * (not pp_on_node), facts)
        if m.n_moe_layers and m.n_experts > 1:
            if e > 1 and st.n_moe and self.settings.dispatcher not in ("deepep", "hybrid-ep"):
                nvl_peers = min(e, max(1, g // et)) - 1
                total += MT.nccl_p2p(nvl_peers, e - 1 - nvl_peers, facts)
            total += MT.nccl_collective(lay.edp, facts) + MT.nccl_collective(et, facts)
        return total

    def lightest_fit(
        self, z: int, modes: tuple, hbm: float
    ) -> tuple[tuple[tuple[str, int], int] | None, tuple | None, int]:
        """The lightest recompute mode of ``modes`` that fits ``hbm`` under ZeRO ``z``: (((kind,
        N), stage index) or None, the last mode that did not fit as ((kind, N), index, bytes) or
        None, modes tried). "block" is the smallest N of Megatron's block method that fits,
        found by bisection (the memory falls as N grows)."""
        last_bad, tried = None, 0
        for kind, n in modes:
            tried += 1
            if kind == "block":
                if self.nmax < 2:
                    continue
                total, i = self.need(z, "full", self.nmax - 1)
                if total > hbm:
                    last_bad = (("full", self.nmax - 1), i, total)
                    continue
                lo, hi, hi_i = 1, self.nmax - 1, i
                while lo < hi:
                    mid = (lo + hi) // 2
                    tm, im = self.need(z, "full", mid)
                    if tm <= hbm:
                        hi, hi_i = mid, im
                    else:
                        lo = mid + 1
                return (("full", hi), hi_i), last_bad, tried
            total, i = self.need(z, kind, n)
            if total <= hbm:
                return ((kind, n), i), last_bad, tried
            last_bad = ((kind, n), i, total)
        return None, last_bad, tried


@dataclass(frozen=True)
class MemoryOptions:
    """Piper's planner's memory settings (PP x EP layouts, ``all_stages``)."""

    flash_attention: bool = True
    checkpointing: bool = False  # full activation checkpointing of every layer
    zero_stage: int = 0  # shards the replicated (non-expert) state over EP x DP, experts over DP
    overhead_bytes: float = 0.0  # framework overhead M_fw (communication buffers, allocator, ...)
    precision: str = "bf16-adam"  # formulas.PRECISION_PRESETS (Piper III-A1: 16 B per parameter)
    kind: str | None = None  # memory_terms.KINDS; None: live tensors + overhead_bytes
    settings: MT.MemorySettings | None = None  # with a kind: the platform's facts and framework


def all_stages(
    m: MoEModel,
    PP: int,
    EP: int,
    micro_batch: int,
    seq: int,
    M: int,
    schedule: str = "1f1b",
    opts: MemoryOptions = MemoryOptions(),
    DP: int = 1,
) -> list[StageMemory]:
    """Every stage of a PP x EP (x DP) layout without TP or CP, by the model above: the
    attention and dense layers data-parallel over EP x DP, the experts over DP. ``micro_batch``:
    sequences per GPU per micro-batch."""
    _positive(PP=PP, EP=EP, micro_batch=micro_batch, seq=seq, M=M, DP=DP)
    if m.n_experts % EP:
        raise ValueError(f"EP={EP} does not divide the expert count E={m.n_experts} (Eq. 8)")
    layout = MemoryLayout(
        pp=PP, ep=EP, dp=EP * DP, micro_batch=micro_batch, micro_batches=M, schedule=schedule
    )
    lm = LayerMemory(
        m,
        seq,
        F.precision(opts.precision),
        opts.flash_attention,
        kind=opts.kind,
        settings=opts.settings,
    )
    lay = LayoutMemory(lm, layout, pipeline_stages(m, PP, every=True), opts.overhead_bytes)
    kind, n = ("full", ALL_LAYERS) if opts.checkpointing else ("none", 0)
    return [lay.stage(opts.zero_stage, kind, n, i) for i in range(PP)]


def per_gpu_memory(
    m: MoEModel,
    platform,
    layout: MemoryLayout,
    seq: int,
    kind: str | None = "reserved",
    zero: int = 1,
    recompute: tuple[str, int] = ("none", 0),
    precision: str = "bf16-adam",
    flash_attention: bool = True,
    dropout: bool = False,
    capacity_factor: float = 1.0,
    settings: MT.MemorySettings | None = None,
    first_stage_layers: int = 0,
    last_stage_layers: int = 0,
) -> StageMemory:
    """The binding (largest) stage of one fixed layout, by term, as the planners count it:
    ``kind`` "allocated" (torch max_memory_allocated), "reserved" (max_memory_reserved),
    "device" (nvidia-smi) or None (live tensors + the profile's framework_overhead_GB, the
    planners' default). ``recompute``: (none|selective, 0) or (full, N layers per chunk;
    ALL_LAYERS: all). ``settings`` default: the platform's DeviceFacts, Megatron-core at ZeRO
    0-2 and FSDP2 at ZeRO-3 (memory_terms.MemorySettings). ``first_stage_layers`` /
    ``last_stage_layers``: an uneven split (:func:`split_stages`; 0: the even split)."""
    settings = settings or MT.MemorySettings(facts=MT.device_facts(platform))
    lm = LayerMemory(
        m, seq, F.precision(precision), flash_attention, dropout, capacity_factor, kind, settings
    )
    stages = split_stages(m, layout.pp, layout.vpp, first_stage_layers, last_stage_layers)
    mem = LayoutMemory(lm, layout, stages, platform.overhead_bytes)
    _, i = mem.need(zero, *recompute)
    return mem.stage(zero, *recompute, i)


# --------------------------------------------------------------------------------------------
# X-MoE Table 2 and App. C.2
# --------------------------------------------------------------------------------------------


def xmoe_activation_elements(b: int, s: int, h: int, h_ffn: int, k: int) -> dict[str, int]:
    """X-MoE Table 2 (elements per MoE layer): A_dispatch = A_combine = k b s H,
    A_interm^0 = A_interm^1 = k b s H_FFN (padding-free, capacity factor 1)."""
    return {
        "A_dispatch": k * b * s * h,
        "A_combine": k * b * s * h,
        "A_interm0": k * b * s * h_ffn,
        "A_interm1": k * b * s * h_ffn,
    }


def ssmb_activation_saving(c: float, k: int, S: int, H: int, G: int) -> float:
    """X-MoE App. C.2 Eq. 1: bytes saved per device by SSMB with TP = G: 4 c k S H (G-1)/G."""
    return 4 * c * k * S * H * (G - 1) / G


def ssmb_model_state_cost(E: int, EP: int, H_ffn: int, H: int, G: int) -> float:
    """X-MoE App. C.2: extra model-state bytes of SSMB over TED with ZeRO-1:
    (E / EP) 8 H_FFN H (G-1)/G; its minimum (EP = E) is Eq. 2: 8 H_FFN H (G-1)/G."""
    return E / EP * 8 * H_ffn * H * (G - 1) / G


def ssmb_beats_ted(k: int, H_ffn: int, S: int, c: float = 1.0) -> bool:
    """SSMB saves more than TED when r = k / H_FFN > 2 / (c S) (X-MoE Sec. 4.3, App. C.2)."""
    return k / H_ffn > 2 / (c * S)


# --------------------------------------------------------------------------------------------
# MoP Table 1 (per-rank memory per component) and an FSDP-style plan for comparison (Table 2-3)
# --------------------------------------------------------------------------------------------


def mop_partition(m: MoEModel) -> dict[str, int]:
    """MoP Eq. 3: Theta = Theta_dns (attention, norms, routers, shared/dense FFNs, input
    embedding) + Theta_exp (routed experts) + Theta_voc (output projection)."""
    from moe_repro.components.model.params import param_counts

    pc = param_counts(m)
    voc = m.vocab * m.d_model if m.vocab else 0
    return {"dns": pc.total - pc.routed_experts - voc, "exp": pc.routed_experts, "voc": voc}


def _layer_working_set(m: MoEModel, tokens: float) -> dict[str, float]:
    """bf16 activations of the one layer being (re)computed under full checkpointing: attention
    (Piper Table III with FlashAttention, 12 N H) and the un-chunked MoE buffers (dispatch and
    combine 2 x N k H, intermediates N k n_mat I)."""
    h = m.d_model
    return {
        "attention": 12 * tokens * h,
        "moe": ACT_BYTES * (2 * tokens * m.top_k * h + tokens * m.top_k * m.n_mat * m.d_ffn),
    }


def mop_rank_memory(
    m: MoEModel, W: int, D: int, P: int, seq: int, overhead_bytes: float = 0.0
) -> dict[str, float]:
    """Per-rank device bytes under MoP Table 1 (one sequence per step, N = S / D tokens per rank).

    dense/expert weights: bf16 weight + grad (4 B) of Theta/W (optimizer host-resident, §3.5);
    vocabulary weights: 4 B x Theta_voc / P; attention activations: full checkpointing keeps
    2 N H per layer plus one layer's 12 N H; MoE activations: the un-chunked O(N k H) buffers of one
    layer, an upper bound (MoP's memory-efficient LLEP lowers it by an unpublished factor);
    logits: one fp32 block of N V / P; optimizer: 0 on device (12 Theta / W on the host)."""
    _positive(W=W, D=D, P=P, seq=seq)
    part = mop_partition(m)
    n = seq / D
    ws = _layer_working_set(m, n)
    return {
        "dense weights": 4 * part["dns"] / W,
        "attention activations": ACT_BYTES * n * m.d_model * m.layers + ws["attention"],
        "expert weights": 4 * part["exp"] / W,
        "MoE activations (bound)": ws["moe"],
        "vocabulary weights": 4 * part["voc"] / P,
        "vocabulary logits": 4 * n * (m.vocab or 0) / P,
        "optimizer state (device)": 0.0,
        "framework overhead": overhead_bytes,
    }


def fsdp_rank_memory(
    m: MoEModel,
    fsdp: int,
    ep: int,
    cp: int,
    tp: int,
    offload: bool,
    seq: int,
    overhead_bytes: float = 0.0,
) -> dict[str, float]:
    """Per-rank device bytes of an FSDP2-style plan (MoP Table 3's axes), W = fsdp x cp x tp ranks,
    EP borrowed from them; one sequence split over CP (N = S / cp), TP with sequence parallelism
    dividing activations by tp. Persistent state: 16 B/param sharded over W (4 B with optimizer
    CPU offload); FSDP all-gather buffers for two layers (prefetch); full activation checkpointing
    (layer inputs kept, one layer recomputed); fp32 + bf16 logits of N V / tp (loss parallel)."""
    _positive(fsdp=fsdp, ep=ep, cp=cp, tp=tp, seq=seq)
    from moe_repro.components.model.params import layer_params

    W = fsdp * cp * tp
    part = mop_partition(m)
    total = part["dns"] + part["exp"] + part["voc"]
    n = seq / cp
    rep, exp = layer_params(m, moe=True)
    ws = _layer_working_set(m, n)
    return {
        "persistent state": (4 if offload else 16) * total / W,
        "all-gather buffers": 2 * ACT_BYTES * (rep / tp + exp / ep),
        "checkpointed activations": ACT_BYTES * n * m.d_model * m.layers / tp,
        "layer working set": (ws["attention"] + ws["moe"]) / tp,
        "logits": 6 * n * (m.vocab or 0) / tp,
        "framework overhead": overhead_bytes,
    }
