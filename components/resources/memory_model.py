"""Training-memory model: Piper Eq. 1-5 as printed, and a per-stage model the planner uses.

Two layers, kept apart on purpose:

1. ``piper_eq1`` ... ``piper_eq5``: Piper Sec. III-A exactly as printed (bytes). Symbols as Piper
   Table II: d, d_ffn, E (routed experts), L, H (heads), k (top-k), b (batch, sequences),
   s (sequence), EP, PP, M (micro-batches), i (stage). Per layer:
   static 64 d^2 (attention, 4 d^2 x 16 B) + 48 E d d_ffn / EP (experts, 3 d d_ffn x 16 B);
   attention activations 12 b s d + 4 H b s^2 (2 bytes x (6 b s d + 2 b H s^2));
   expert activations 2 b s k (3 d_ffn + d) / EP. With FlashAttention, 4 b H s^2 -> 2 b H s.
   Note on b: the attention term charges b sequences to every GPU while the expert term divides
   b s k by EP, so the printed equations read b as a per-GPU batch in one term and as the EP
   group's batch in the other. We implement them as printed; the stage model below uses one
   consistent b (sequences per GPU per micro-batch).

2. ``stage_memory``: bytes on one GPU of pipeline stage i of a PP x EP mesh (optionally times an
   outer data-parallel degree DP), with the options the equations leave out: dense and MoE layers,
   shared experts, real attention parameter counts (GQA/MLA via components.model.params), embeddings on
   the first and the output head (and fp32 logits) on the last stage, FlashAttention, full
   activation checkpointing, ZeRO-1/2/3 sharding of replicated state, framework overhead. With the
   same conventions as Eq. 4 it reduces to it (tests check this).

Also here: X-MoE Table 2 activation sizes and App. C.2 SSMB vs TED trade-off (Eq. 1-2), and the
per-state bytes of ZeRO stages (MoP Sec. 2.3, Eq. 1-2).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from moe_repro.components.model.params import embedding_params, layer_params
from moe_repro.components.model.pipeline_split import stage_layers
from moe_repro.components.model.zoo import MoEModel

# Mixed-precision Adam (Piper III-A1, MoP Eq. 1): bf16 weight 2 + bf16 grad 2 + fp32 master 4
# + fp32 momentum 4 + fp32 variance 4 bytes per parameter.
WEIGHT_BYTES, GRAD_BYTES, OPTIMIZER_BYTES = 2, 2, 12
BYTES_PER_PARAM = WEIGHT_BYTES + GRAD_BYTES + OPTIMIZER_BYTES  # 16
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
# ZeRO (Rajbhandari et al. 2020; MoP Sec. 2.3): bytes per parameter on one of n sharding ranks
# --------------------------------------------------------------------------------------------


def state_bytes_per_param(zero_stage: int, n: int) -> float:
    """ZeRO-0: 16; ZeRO-1: 2 + 2 + 12/n; ZeRO-2: 2 + 14/n; ZeRO-3: 16/n bytes per parameter."""
    _positive(n=n)
    if zero_stage == 0:
        return BYTES_PER_PARAM
    if zero_stage == 1:
        return WEIGHT_BYTES + GRAD_BYTES + OPTIMIZER_BYTES / n
    if zero_stage == 2:
        return WEIGHT_BYTES + (GRAD_BYTES + OPTIMIZER_BYTES) / n
    if zero_stage == 3:
        return BYTES_PER_PARAM / n
    raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage}")


# --------------------------------------------------------------------------------------------
# 2. Per-stage model of a PP x EP (x DP) mesh
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryOptions:
    flash_attention: bool = True
    checkpointing: bool = False  # full activation checkpointing: keep each layer's input only
    zero_stage: int = 0  # shards replicated (non-expert) state over EP x DP, experts over DP
    overhead_bytes: float = 0.0  # framework overhead M_fw (communication buffers, allocator, ...)
    embeddings: bool = True  # embedding on stage 0, output head + fp32 logits on the last stage
    shared_and_dense: bool = True  # count shared experts and dense layers (Piper's Eq. ignore them)


def schedule_in_flight(schedule: str, PP: int, M: int, i: int) -> int:
    """Micro-batches whose activations stage i holds at its peak.

    1F1B (Narayanan et al. 2021; Piper Eq. 4): PP - i, at most M. GPipe: all M."""
    if schedule == "1f1b":
        return min(PP - i, M)
    if schedule == "gpipe":
        return M
    raise ValueError(f"schedule must be '1f1b' or 'gpipe', got {schedule!r}")


def layer_activation_bytes(
    m: MoEModel, moe: bool, b: float, s: int, flash: bool, shared_and_dense: bool = True
) -> float:
    """Activations one layer keeps for backward, per GPU, for b sequences of this GPU.

    Attention: Piper Table III with H = the model's heads. FFN: Piper's 2 x tokens x
    (n_mat d_ffn + d) with tokens = b s k routed into this GPU's experts under balanced routing
    (each GPU receives as many token-expert pairs as it sends); n_mat d_ffn generalises Piper's
    3 d_ffn (gate, up, product) to two-matrix FFNs (up, activation). Shared experts and dense FFNs
    see all b s local tokens."""
    d = m.d_model
    act = piper_attention_activation(b, s, d, m.heads, flash)
    if moe:
        act += ACT_BYTES * b * s * m.top_k * (m.n_mat * m.d_ffn + d)
        if shared_and_dense and m.n_shared:
            act += ACT_BYTES * b * s * m.n_shared * (m.n_mat * (m.d_ffn_shared or m.d_ffn) + d)
    elif shared_and_dense and m.d_ffn_dense:
        act += ACT_BYTES * b * s * (m.n_mat * m.d_ffn_dense + d)
    if shared_and_dense and m.d_ffn_residual:
        act += ACT_BYTES * b * s * (m.n_mat * m.d_ffn_residual + d)
    return act


@dataclass
class StageMemory:
    stage: int
    layers: int
    params_replicated: float  # weights replicated over the EP group (attention, router, shared...)
    params_experts: float  # this GPU's routed experts
    static_bytes: float
    activation_bytes: float
    in_flight: int
    overhead_bytes: float
    terms: dict[str, float] = field(default_factory=dict)  # named contributions, bytes

    @property
    def total(self) -> float:
        return self.static_bytes + self.activation_bytes + self.overhead_bytes

    def binding_term(self) -> str:
        return max(self.terms, key=self.terms.get)


def stage_memory(
    m: MoEModel,
    PP: int,
    EP: int,
    i: int,
    micro_batch: float,
    seq: int,
    M: int,
    schedule: str = "1f1b",
    opts: MemoryOptions = MemoryOptions(),
    DP: int = 1,
) -> StageMemory:
    """Peak bytes on one GPU of stage i. ``micro_batch``: sequences per GPU per micro-batch."""
    _positive(PP=PP, EP=EP, micro_batch=micro_batch, seq=seq, M=M, DP=DP)
    if m.n_experts % EP:
        raise ValueError(f"EP={EP} does not divide the expert count E={m.n_experts} (Eq. 8)")
    if not 0 <= i < PP:
        raise ValueError(f"stage i must be in 0..{PP - 1}, got {i}")
    layers = stage_layers(m.layers, PP)[i]
    first_moe = m.layers - m.n_moe_layers  # dense layers come first (DeepSeek, Kimi)
    rep = exp = 0.0
    act_layers = []
    for layer in layers:
        moe = layer >= first_moe
        if not opts.shared_and_dense and not moe:
            moe = True  # Piper's Table II: "assume all are MoE layers"
        r, e = layer_params(m, moe)
        if not opts.shared_and_dense and moe:
            r = r - (m.n_shared * m.n_mat * m.d_model * (m.d_ffn_shared or m.d_ffn))
        rep += r
        exp += e / EP
        act_layers.append(
            layer_activation_bytes(
                m, moe, micro_batch, seq, opts.flash_attention, opts.shared_and_dense
            )
        )
    logits = 0.0
    if opts.embeddings and m.vocab:
        emb = embedding_params(m)
        if i == 0:
            rep += m.vocab * m.d_model
        if i == PP - 1:
            rep += emb - m.vocab * m.d_model if not m.tie_embeddings else 0
            # fp32 logits for the loss: 4 bytes x b s V (what MoP's sharded vocabulary removes).
            logits = 4 * micro_batch * seq * m.vocab
    in_flight = schedule_in_flight(schedule, PP, M, i)
    if opts.checkpointing:
        # Each in-flight micro-batch keeps every layer's input; the layer being recomputed holds
        # its full activations once.
        kept = in_flight * len(layers) * ACT_BYTES * micro_batch * seq * m.d_model
        act = kept + max(act_layers, default=0.0)
    else:
        act = in_flight * sum(act_layers)
    act += logits
    rep_bytes = rep * state_bytes_per_param(opts.zero_stage, EP * DP)
    exp_bytes = exp * state_bytes_per_param(opts.zero_stage, DP)
    terms = {
        "replicated weights+states": rep_bytes,
        "expert weights+states": exp_bytes,
        "activations": act - logits,
        "logits": logits,
        "framework overhead": opts.overhead_bytes,
    }
    return StageMemory(
        stage=i,
        layers=len(layers),
        params_replicated=rep,
        params_experts=exp,
        static_bytes=rep_bytes + exp_bytes,
        activation_bytes=act,
        in_flight=in_flight,
        overhead_bytes=opts.overhead_bytes,
        terms=terms,
    )


def all_stages(
    m: MoEModel,
    PP: int,
    EP: int,
    micro_batch: float,
    seq: int,
    M: int,
    schedule: str = "1f1b",
    opts: MemoryOptions = MemoryOptions(),
    DP: int = 1,
) -> list[StageMemory]:
    return [stage_memory(m, PP, EP, i, micro_batch, seq, M, schedule, opts, DP) for i in range(PP)]


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
