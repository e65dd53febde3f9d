"""Public formulas for planning parallel training: parameters, FLOPs, activation memory, model
state under ZeRO, and communication volume per parallel dimension.

Pure functions of numbers or of a zoo ``MoEModel``; standard library only (no torch). Every
function's docstring names its source -- the paper and equation/section, or the public reference
implementation whose formula it follows -- and says where ours differs and why. Sources:

- [Megatron-FLOPs] NVIDIA/Megatron-LM ``megatron/training/training.py``,
  ``num_floating_point_operations`` (``transformer_flops``): 3 (fwd, wgrad, dgrad) x 2 FLOPs per
  multiply-add x weights per token, plus core attention, plus the logit layer.
- [Megatron-Mem] NVIDIA/Megatron-LM ``megatron/training/theoretical_memory_usage.py``: 18 B per
  parameter (6 + 12/DP with the distributed optimizer) and Korthikanti Table 2 per layer.
- [Narayanan] Narayanan et al., SC'21, "Efficient Large-Scale Language Model Training on GPU
  Clusters Using Megatron-LM", Eq. 3: F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) per iteration.
- [Korthikanti] Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
  Models", Sec. 4.1 (per-layer activations), Sec. 4.2 (tensor and sequence parallelism), Sec. 5
  (selective recomputation) and Table 2.
- [ZeRO] Rajbhandari et al., SC'20, "ZeRO: Memory Optimizations Toward Training Trillion
  Parameter Models", Sec. 3.1 (16 B/param mixed-precision Adam), Sec. 5.1 / Fig. 1 (stages),
  Sec. 7 (communication volume).
- [Shoeybi] Shoeybi et al. 2019, "Megatron-LM", Sec. 3 / Fig. 4: two all-reduces forward and two
  backward per transformer layer under tensor parallelism.
- [DeepSeek-V2] DeepSeek-AI 2024, Sec. 2.1 (Multi-head Latent Attention);
  [DeepSeek-V3] DeepSeek-AI 2024, Sec. 3.3 (FP8 training, low-precision optimizer states).
- [X-MoE] X-MoE Table 2 (MoE activations: dispatch, intermediates, combine) and App. C.2.

Units: bytes and FLOPs, never GB; 1 GB = 1e9 bytes where a test compares with a paper.
"""

from __future__ import annotations

from dataclasses import dataclass

from moe_repro.components.model.params import attention_params, param_counts
from moe_repro.components.model.zoo import MoEModel

__all__ = [
    "parameters",
    "attention_widths",
    "forward_flops_breakdown",
    "forward_flops_per_token",
    "train_flops_per_token",
    "narayanan_eq3_flops",
    "activation_terms_per_layer",
    "activation_bytes_per_layer",
    "moe_activation_terms_per_layer",
    "moe_activation_bytes_per_layer",
    "Precision",
    "PRECISION_PRESETS",
    "precision",
    "model_state_bytes",
    "ring_allreduce_bytes",
    "allgather_bytes",
    "reduce_scatter_bytes",
    "alltoall_bytes",
    "dp_bytes_per_step",
    "tp_bytes_per_layer",
    "pp_p2p_bytes_per_microbatch",
    "ep_alltoall_bytes_per_layer",
    "cp_ring_bytes_per_layer",
    "kv_width",
    "comm_bytes_per_step",
]

ATTENTION_MODES = ("full", "causal", "none")
RECOMPUTE_MODES = ("none", "selective", "full")


def _positive(**values) -> None:
    for name, v in values.items():
        if v is None or v <= 0:
            raise ValueError(f"{name} must be positive, got {v}")


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")


# ============================================================================================
# 1. Parameters
# ============================================================================================


def _mla_latent_norms(m: MoEModel) -> int:
    """The two latent RMSNorm weights inside MLA attention (r_q + r_kv), 0 for other attention."""
    if m.attn_params != "mla" or m.mla is None:
        return 0
    return (m.mla.q_lora_rank or 0) + m.mla.kv_lora_rank


def parameters(m: MoEModel) -> dict[str, int]:
    """Total and active parameters of a zoo model, by component.

    Counts come from ``components.model.params.param_counts`` (which already includes the router,
    d E per MoE layer; MLA attention per DeepSeek-V2 Sec. 2.1; shared experts; dense layers; norm
    weights; untied or tied embeddings) and are the same convention as Megatron-LM's
    ``compute_weight_and_optimizer_memory`` [Megatron-Mem], except: Megatron omits the router and
    counts LayerNorm biases (``norm_size`` 2); we count the router and norm weights only. Biases
    and learned position embeddings (GPT-3) are not modelled.

    The components (embedding, lm_head, attention, norms, router, routed_experts, shared_experts,
    dense_ffn, extra) sum to ``total``; MLA's two latent norms move from attention to norms.
    Added here: ``embedding`` (the input table, V d) split from ``lm_head`` (V d when untied, 0
    when tied), ``non_embedding`` (total - embedding - lm_head), and ``matmul_active``: the
    weights each token multiplies, i.e. active - input table (a lookup) - norm weights (including
    MLA's latent norms) + V d for a tied head (the shared matrix is still a matmul in the head).
    ``matmul_active`` is the N of the 6N rule and what the FLOP functions below use.
    """
    pc = param_counts(m)
    table = m.vocab * m.d_model if m.vocab else 0
    head = pc.embeddings - table  # V d untied, 0 tied
    latent_norms = m.layers * _mla_latent_norms(m)
    matmul_active = pc.active - table - pc.norms - latent_norms + (table if m.tie_embeddings else 0)
    return {
        "total": pc.total,
        "active": pc.active,
        "embedding": table,
        "lm_head": head,
        "attention": pc.attention - latent_norms,
        "norms": pc.norms + latent_norms,
        "router": pc.routers,
        "routed_experts": pc.routed_experts,
        "routed_active": pc.routed_active,
        "shared_experts": pc.shared_experts,
        "dense_ffn": pc.dense_ffn,
        "extra": pc.extra,
        "non_embedding": pc.total - pc.embeddings,
        "matmul_active": matmul_active,
    }


def attention_widths(m: MoEModel) -> dict[str, int]:
    """Widths (elements per token) of one layer's attention tensors, all heads.

    ``q``, ``k``, ``v``: the query/key/value tensors the core attention reads (GQA: K and V have
    H_kv heads; MLA [DeepSeek-V2 Sec. 2.1]: q and k have H (d_nope + d_rope), v has H d_v, the
    decompressed tensors a training kernel reads); ``o``: the core's output (input to the output
    projection); ``latent``: MLA's compressed query and KV latents plus the shared RoPE key
    (r_q + r_kv + d_rope), 0 otherwise; ``heads``: H; ``d_qk``, ``d_v``: per-head widths.
    Piper's ``"4d2"`` attention is read as MHA with d_h = d / H.
    """
    h = m.heads
    if m.attn_params == "mla":
        if m.mla is None:
            raise ValueError(f"{m.key}: attn_params='mla' needs the mla shapes")
        a = m.mla
        dqk, dv = a.qk_nope_head_dim + a.qk_rope_head_dim, a.v_head_dim
        return {
            "heads": h,
            "d_qk": dqk,
            "d_v": dv,
            "q": h * dqk,
            "k": h * dqk,
            "v": h * dv,
            "o": h * dv,
            "latent": (a.q_lora_rank or 0) + a.kv_lora_rank + a.qk_rope_head_dim,
        }
    hd = m.head_dim or m.d_model // h
    kv = m.n_kv_heads or h
    return {
        "heads": h,
        "d_qk": hd,
        "d_v": hd,
        "q": h * hd,
        "k": kv * hd,
        "v": kv * hd,
        "o": h * hd,
        "latent": 0,
    }


# ============================================================================================
# 2. FLOPs
# ============================================================================================


def forward_flops_breakdown(m: MoEModel, seq: int, attention: str = "full") -> dict[str, float]:
    """Forward FLOPs per token by component, whole model (all layers plus the LM head).

    Every matmul costs 2 FLOPs per multiply-add, so a weight matrix of P entries costs 2 P per
    token [Megatron-FLOPs ``fma_expansion_factor``]. Components: ``attention_proj`` (the Q/K/V/O
    projections; MLA's down/up projections per DeepSeek-V2 Sec. 2.1, computed unabsorbed as in
    training), ``attention_core`` (QK^T and AV), ``ffn`` (dense layers' FFNs and Arctic's residual
    FFN), ``routed`` (top-k routed experts only), ``shared`` (shared experts), ``router``
    (2 d E per MoE layer), ``extra`` (per-layer extras, e.g. DeepSeek-V3.2's indexer, as 2 x
    weights), ``head`` (2 V d, tied or not).

    Attention core per layer and token: 2 s H (d_qk + d_v) [QK^T over s keys + AV], i.e.
    4 s d_attn for MHA, as in Narayanan Eq. 3's 4 B s^2 h per layer. ``attention``: ``"full"``
    counts all s keys (Narayanan Eq. 3; PaLM App. B: 6N + 12 L H Q T); ``"causal"`` halves it,
    as current Megatron-LM does ("causal mask (only half of the mask is non-zero)", s/2, not the
    exact (s+1)/2) [Megatron-FLOPs]; ``"none"`` leaves it out.

    Differences from [Megatron-FLOPs]: Megatron leaves out the router and counts MLA's latent
    norms as matmul weights (the ``+ 1`` terms); we count the router and not the norms.
    """
    _positive(seq=seq)
    _choice("attention", attention, ATTENTION_MODES)
    d, L = m.d_model, m.layers
    pc = param_counts(m)
    w = attention_widths(m)
    core = 2.0 * seq * w["heads"] * (w["d_qk"] + w["d_v"]) * L
    core *= {"full": 1.0, "causal": 0.5, "none": 0.0}[attention]
    return {
        "attention_proj": 2.0 * L * (attention_params(m) - _mla_latent_norms(m)),
        "attention_core": float(core),
        "ffn": 2.0 * pc.dense_ffn,
        "routed": 2.0 * pc.routed_active,
        "shared": 2.0 * pc.shared_experts,
        "router": 2.0 * pc.routers,
        "extra": 2.0 * pc.extra,
        "head": 2.0 * (m.vocab or 0) * d,
    }


def forward_flops_per_token(
    m: MoEModel, seq: int, attention: str = "full", head: bool = True
) -> float:
    """Forward FLOPs per token: 2 x matmul_active [6N rule's forward third] + attention core.

    Equals 2 x ``parameters(m)["matmul_active"]`` + the core term of ``forward_flops_breakdown``
    (sources and conventions there); ``head=False`` leaves out the LM head (2 V d).
    """
    parts = forward_flops_breakdown(m, seq, attention)
    if not head:
        parts["head"] = 0.0
    return sum(parts.values())


def train_flops_per_token(
    m: MoEModel, seq: int, attention: str = "full", recompute: str = "none"
) -> float:
    """Training FLOPs per token (hardware FLOPs: recomputation included when asked).

    ``"none"``: 3 x forward (forward, backward data-gradient, backward weight-gradient)
    [Megatron-FLOPs ``forward_backward_expansion_factor = 3``]; the model FLOPs of an MFU.
    ``"full"``: the transformer layers run their forward twice, 4 x forward for the layers and
    3 x for the LM head, as Narayanan Eq. 3 counts (96 = 4 x 24 for the layers, 6 B s h V for the
    logit layer) -- full activation recomputation re-runs each layer, never the head.
    ``"selective"``: 3 x forward + one more forward of the attention core (Korthikanti Sec. 5:
    only QK^T, softmax, dropout and AV are recomputed).
    """
    _choice("recompute", recompute, RECOMPUTE_MODES)
    parts = forward_flops_breakdown(m, seq, attention)
    fwd = sum(parts.values())
    extra = {"none": 0.0, "selective": parts["attention_core"], "full": fwd - parts["head"]}[
        recompute
    ]
    return 3 * fwd + extra


def narayanan_eq3_flops(B: float, s: int, l: int, h: int, V: int) -> float:
    """Narayanan et al. SC'21 Eq. 3, as printed: F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) FLOPs
    per iteration (B sequences of s tokens, l layers, hidden h, vocabulary V).

    It assumes MHA, a 4h two-matrix FFN, full activation recomputation (the 96 = 4 x 24), no
    causal halving of attention, and a 3x logit layer; biases and norms are left out.
    ``train_flops_per_token(m, s, "full", "full") * B * s`` equals it for such a model (the test
    checks GPT-3 175B). Current Megatron-LM [Megatron-FLOPs] no longer uses it: it counts 3x (no
    recomputation) and halves causal attention.
    """
    return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))


def elementwise_bytes_per_token(
    h: int,
    a: int,
    s: float,
    ffn_active: float,
    n_mat: int = 2,
    t: int = 1,
    sp: bool = False,
    flash: bool = True,
    dropout: bool = False,
    moe_top_k: int = 0,
    bytes_per_value: float = 2,
) -> float:
    """HBM bytes the non-GEMM kernels of one transformer layer's forward read and write per
    token (one GPU of a TP group), Megatron-LM's kernel set (its fusions: bias + GeLU,
    bias + dropout + add, scale + mask + softmax):

      layer norms: 2 x (read h, write h)                                          4 h
      bias + dropout + add, twice: read out and residual, write h (+ 1-byte mask)  6 h (+ h masks)
      FFN activation: read the n_mat - 1 input projections, write one width      n_mat x f
      attention scores (no FlashAttention): softmax reads and writes a s          2 a s
        attention dropout: reads and writes a s, writes a 1-byte mask               2 a s (+ a s mask)
      MoE permute and unpermute of k token copies (read and write each)           4 k h

    ``f``: the FFN width a token passes through (top-k x the expert width for MoE, plus shared
    experts). TP divides the head and FFN terms; sequence parallelism also divides the h terms.
    The GEMMs' own operand traffic is not here (the GEMM roofline holds it). With FlashAttention
    the scores never reach HBM (Dao et al. 2022 Sec. 3). The backward of each of these kernels
    reads the forward's input (or output) and the incoming gradient and writes one gradient:
    1.5 x the forward's traffic (callers apply it)."""
    h_share = h / t if sp else h
    values = 10 * h_share + n_mat * ffn_active / t + 4 * moe_top_k * h_share
    masks = 2 * h_share if dropout else 0.0
    if not flash:
        values += 2 * a * s / t + (2 * a * s / t if dropout else 0.0)
        masks += a * s / t if dropout else 0.0
    return values * bytes_per_value + masks


# ============================================================================================
# 3. Activation memory per transformer layer (Korthikanti et al. 2022)
# ============================================================================================


def _attention_terms(
    n: float,
    s_keys: float,
    h: int,
    w: dict,
    t: int,
    sp: bool,
    v: float,
    mb: float,
    dropout: bool,
    recompute: str,
) -> dict[str, float]:
    """Attention block and layer norms (Korthikanti Sec. 4.1), per rank. n: tokens on this CP rank
    (s b / cp); the core keeps heads x (s/cp) x s scores per sequence."""
    rep = (lambda x: x / t) if sp else (lambda x: x)  # width-h tensors TP replicates unless SP
    split = lambda x: x / t  # head-sharded tensors
    terms = {
        "layernorm": rep(2 * n * h * v),  # two LN inputs (4 sbh)
        "attention_input": rep(n * h * v)
        + rep(n * w["latent"] * v),  # QKV input (2 sbh) [+ MLA latents]
        "attention_qkv": split(n * (w["q"] + w["k"] + w["v"]) * v),  # Q, K (4 sbh) and V (2 sbh)
        "attention_out": split(n * w["o"] * v),  # output-projection input (2 sbh)
        "attention_dropout": rep(n * h * mb),  # dropout mask after the projection (sbh)
    }
    # Scores: softmax output (2 as^2b), its dropout mask (as^2b) and dropout output (2 as^2b); with
    # no attention dropout only the softmax output is kept.
    per_score = (2 * v + mb) if dropout else v
    core = split(w["heads"] * n * s_keys * per_score)
    terms["attention_core"] = 0.0 if recompute in ("selective", "full") else core
    return terms


def activation_terms_per_layer(
    s: int,
    b: int,
    h: int,
    a: int,
    t: int = 1,
    sp: bool = False,
    recompute: str = "none",
    bytes_per_value: float = 2,
    cp: int = 1,
    ffn: int | None = None,
    n_mat: int = 2,
    dropout: bool = True,
) -> dict[str, float]:
    """Activation bytes one GPT layer keeps for backward, per micro-batch and GPU, by term.

    Korthikanti et al. 2022 Sec. 4.1: with 16-bit values and 1-byte dropout masks a layer stores
    attention 11 sbh + 5 a s^2 b (QKV input 2, Q and K 4, V 2, projection input 2, dropout mask 1;
    softmax output 2 a s^2 b, its mask a s^2 b, dropout output 2 a s^2 b), MLP 19 sbh (first
    linear input 2, GeLU input 8, GeLU output 8, dropout mask 1) and layer norms 4 sbh: in all
    sbh (34 + 5 a s / h) (Eq. 1). Table 2 (t = tensor-parallel size):

    ======================================  =============================
    no parallelism                          sbh (34 + 5as/h)
    tensor parallel                         sbh (10 + 24/t + 5as/(ht))
    tensor + sequence parallel              sbh (34/t + 5as/(ht))
    tensor parallel + selective recompute   sbh (10 + 24/t)
    tensor + sequence + selective           sbh (34/t)
    full recompute                          2 sbh
    ======================================  =============================

    The 10 sbh that TP replicates are the width-h tensors (layer-norm inputs, QKV and MLP inputs,
    both dropout masks); SP shards them along s. Selective recomputation drops the attention
    core (5as^2b). Full recomputation keeps the layer input only: 2 sbh as Table 2 prints it;
    with SP the stored input is the sequence-sharded tensor, 2 sbh / t (Megatron-LM checkpoints
    the SP-sharded hidden states) -- an extension, Table 2 has no SP row for it. Megatron-LM's
    ``compute_activation_memory`` (SP + selective: sbh (18 + 4 f/h) / t) and
    ``compute_activation_memory_without_sp`` (sbh (10 + 24/t)) are the same formulas for f = 4h
    [Megatron-Mem].

    Extensions, each reducing to Table 2 at its default: ``ffn`` (FFN width f, default 4h) and
    ``n_mat`` (2: GeLU, intermediates GeLU input + output = 2 f per token; 3: SwiGLU, gate and up
    outputs + their product = 3 f): MLP = 2 sbh + 2 n_mat sbf + sbh; ``bytes_per_value`` (2:
    bf16/fp16 values; masks stay 1 byte); ``dropout=False`` (no masks, and the core keeps only
    the softmax output, 2 a s^2 b); ``cp`` (context parallelism: each rank holds s/cp queries, so
    every linear term divides by cp and the score term is a (s/cp) s b). FlashAttention keeps no
    scores: use ``recompute="selective"`` for it (it keeps the softmax statistics, 4 a s b / (t cp)
    bytes, which we leave out).
    """
    _positive(s=s, b=b, h=h, a=a, t=t, cp=cp, bytes_per_value=bytes_per_value)
    _choice("recompute", recompute, RECOMPUTE_MODES)
    v, mb = bytes_per_value, (1 if dropout else 0)
    n = s * b / cp
    if recompute == "full":
        return {"layer_input": (n * h * v) / (t if sp else 1)}
    f = 4 * h if ffn is None else ffn
    w = {"heads": a, "q": h, "k": h, "v": h, "o": h, "latent": 0}
    terms = _attention_terms(n, s, h, w, t, sp, v, mb, dropout, recompute)
    rep = (lambda x: x / t) if sp else (lambda x: x)
    terms["mlp_input"] = rep(n * h * v)
    terms["mlp_intermediate"] = n * n_mat * f * v / t
    terms["mlp_dropout"] = rep(n * h * mb)
    return terms


def activation_bytes_per_layer(
    s: int,
    b: int,
    h: int,
    a: int,
    t: int = 1,
    sp: bool = False,
    recompute: str = "none",
    bytes_per_value: float = 2,
    cp: int = 1,
    ffn: int | None = None,
    n_mat: int = 2,
    dropout: bool = True,
) -> float:
    """Korthikanti et al. 2022 Table 2, one dense GPT layer, bytes per GPU per micro-batch of b
    sequences of length s (the sum of ``activation_terms_per_layer``; see it for the derivation)."""
    return sum(
        activation_terms_per_layer(
            s, b, h, a, t, sp, recompute, bytes_per_value, cp, ffn, n_mat, dropout
        ).values()
    )


def moe_activation_terms_per_layer(
    m: MoEModel,
    s: int,
    b: int,
    moe: bool = True,
    t: int = 1,
    sp: bool = False,
    cp: int = 1,
    recompute: str = "none",
    bytes_per_value: float = 2,
    dropout: bool = False,
    capacity_factor: float = 1.0,
    router_bytes: float | None = None,
) -> dict[str, float]:
    """Activation bytes one layer of a zoo model keeps for backward, per micro-batch and GPU.

    Derivation. Korthikanti's 34 sbh + 5as^2b splits as attention 11 sbh + 5 a s^2 b, MLP 19 sbh,
    layer norms 4 sbh (``activation_terms_per_layer``). Attention and layer norms are kept as
    Korthikanti counts them, with the model's real widths (GQA: K and V of H_kv heads; MLA
    [DeepSeek-V2 Sec. 2.1]: decompressed q/k of H (d_nope + d_rope), v and output of H d_v, plus
    the latents r_q + r_kv + d_rope, which TP replicates like the layer input). In an MoE layer
    the MLP part becomes, per token of this rank (n = s b / (cp t)):

    - the MLP input (normed hidden, kept for the router and shared experts): 2 h,
    - the router's probabilities: E values (``router_bytes`` each, default ``bytes_per_value``;
      Megatron's ``--moe-router-dtype fp32`` makes it 4),
    - per routed copy (c k copies: top-k times the capacity factor c, 1 = dropless average):
      the dispatched input 2 h (X-MoE Table 2 A_dispatch), the expert's intermediates
      2 n_mat d_ffn (A_interm^0, A_interm^1 for n_mat = 2), and the expert output kept for the
      combine's gate-weight gradient 2 h (A_combine),
    - shared experts: 2 n_mat d_ffn_shared each (their input is the MLP input);
      Arctic's residual FFN likewise,
    - the MLP dropout mask h (1 byte) when ``dropout``.

    With E = 1, k = 1 and no dispatch copies this is Korthikanti's 19 sbh MLP. Expert
    parallelism does not change the count under balanced routing: each rank receives as many
    token copies as it sends. ``t`` > 1 on an MoE layer needs ``sp=True`` (Megatron-core: "When
    using MoE with expert parallelism and tensor parallelism, sequence parallelism must be
    enabled", megatron/core/transformer/moe/README.md); experts are not tensor-split (expert TP =
    1, MoE parallel folding), so every MoE term divides by t. A dense layer (``moe=False``) has
    the model's dense FFN (d_ffn_dense) in place of the MoE block. ``dropout`` defaults to False
    (Llama, Mixtral and DeepSeek train without dropout); ``recompute`` and ``cp`` as in
    ``activation_terms_per_layer``. The one layer being recomputed under full recomputation
    (its full working set, once per stage) is the stage model's business, not counted here.
    """
    _positive(
        s=s, b=b, t=t, cp=cp, bytes_per_value=bytes_per_value, capacity_factor=capacity_factor
    )
    _choice("recompute", recompute, RECOMPUTE_MODES)
    if moe and m.n_moe_layers == 0:
        raise ValueError(f"{m.key} has no MoE layer; pass moe=False")
    if moe and t > 1 and not sp:
        raise ValueError(
            "an MoE layer with tensor parallelism needs sequence parallelism (sp=True), "
            "as Megatron-core requires"
        )
    v, mb, h = bytes_per_value, (1 if dropout else 0), m.d_model
    n = s * b / cp
    if recompute == "full":
        return {"layer_input": (n * h * v) / (t if sp else 1)}
    terms = _attention_terms(n, s, h, attention_widths(m), t, sp, v, mb, dropout, recompute)
    rep = (lambda x: x / t) if sp else (lambda x: x)
    terms["mlp_input"] = rep(n * h * v)
    terms["mlp_dropout"] = rep(n * h * mb)
    if moe:
        copies = capacity_factor * m.top_k * n / t
        rb = v if router_bytes is None else router_bytes
        terms["router"] = rep(n * m.n_experts * rb) if m.n_experts > 1 else 0.0
        terms["dispatch"] = copies * h * v
        terms["expert_intermediate"] = copies * m.n_mat * m.d_ffn * v
        terms["combine"] = copies * h * v
        terms["shared_experts"] = m.n_shared * n * m.n_mat * (m.d_ffn_shared or m.d_ffn) * v / t
    else:
        if m.d_ffn_dense is None:
            raise ValueError(f"{m.key}: a dense layer needs d_ffn_dense")
        terms["mlp_intermediate"] = n * m.n_mat * m.d_ffn_dense * v / t
    if m.d_ffn_residual:
        terms["residual_ffn"] = n * m.n_mat * m.d_ffn_residual * v / t
    return terms


def moe_activation_bytes_per_layer(
    m: MoEModel,
    s: int,
    b: int,
    moe: bool = True,
    t: int = 1,
    sp: bool = False,
    cp: int = 1,
    recompute: str = "none",
    bytes_per_value: float = 2,
    dropout: bool = False,
    capacity_factor: float = 1.0,
    router_bytes: float | None = None,
) -> float:
    """Sum of ``moe_activation_terms_per_layer`` (see it for the derivation and sources)."""
    return sum(
        moe_activation_terms_per_layer(
            m,
            s,
            b,
            moe,
            t,
            sp,
            cp,
            recompute,
            bytes_per_value,
            dropout,
            capacity_factor,
            router_bytes,
        ).values()
    )


# ============================================================================================
# 4. Model state under ZeRO / FSDP
# ============================================================================================


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter of each piece of model state, with the source that states them."""

    weights: float  # the working copy the forward/backward reads
    grads: float
    master: float  # fp32 master weights held by the optimizer (0: none)
    optimizer: float  # optimizer moments (Adam: m and v)
    source: str
    notes: str = ""
    zero_stage: int | None = None  # the stage the source trains with, where it says
    offload_optimizer: bool = False  # master + moments live in host memory (ZeRO-Offload style)

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.master + self.optimizer


PRECISION_PRESETS: dict[str, Precision] = {
    "bf16-adam": Precision(
        2,
        2,
        4,
        8,
        source="ZeRO Sec. 3.1: mixed-precision Adam keeps fp16 parameters and gradients (2 + 2 B) "
        "and fp32 parameters, momentum and variance (K = 12 B): 16 B per parameter",
        notes="bf16 in place of fp16 changes no byte count.",
    ),
    "megatron": Precision(
        2,
        4,
        4,
        8,
        source="Megatron-LM megatron/training/theoretical_memory_usage.py: 18 B per parameter, "
        "6 + 12/DP with --use-distributed-optimizer (bf16 weights 2, fp32 main grads 4, "
        "fp32 master + Adam 12)",
        notes="fp32 gradient accumulation (--accumulate-allreduce-grads-in-fp32); with "
        "zero_stage=1 model_state_bytes gives Megatron's 6 + 12/DP.",
    ),
    "fp8-params": Precision(
        1,
        2,
        4,
        8,
        source="Transformer Engine fp8_model_init / Megatron-core --fp8-param-gather: FP8 working "
        "weights (1 B), fp32 master weights and Adam states in the optimizer",
        notes="Gradients assumed bf16 as in bf16-adam; FP8 scaling factors (one per tensor or "
        "block) are negligible.",
    ),
    "deepseek-v3-fp8": Precision(
        1,
        4,
        4,
        4,
        source="DeepSeek-V3 report Sec. 3.3 (Fig. 6; Sec. 3.3.3 'Low-Precision Optimizer States'): "
        "FP8 GEMM weights, master weights and weight gradients kept in FP32, AdamW first "
        "and second moments in BF16: 1 + 4 + 4 + 4 = 13 B",
        notes="The report does not say whether an FP8 weight copy stays resident or is cast from "
        "the master for each GEMM; without a resident copy it is 12 B. Its 128x128 block "
        "scales (1/16384 per weight) are left out.",
    ),
    "adam-8bit": Precision(
        2,
        2,
        4,
        2,
        source="Dettmers et al. 2022 (8-bit Optimizers via Block-wise Quantization, ICLR 2022): "
        "Adam's two 32-bit states stored in 8 bits, 2 B instead of 8; bitsandbytes Adam8bit",
        notes="Block-wise quantization constants (one fp32 per 2048-value block and state) add "
        "2 x 4 / 2048 = 0.004 B per parameter, left out; weights, grads and master as bf16-adam.",
    ),
    "piper": Precision(
        2,
        2,
        4,
        8,
        source="Piper Sec. III-A1 and Table II (beta_p): 16 B per parameter: 2 B fp16 param, 2 B "
        "fp16 grad, 4 B fp32 master copy, 4 + 4 B fp32 momentum and variance",
        notes="Piper's introduction quotes 'approximately 20 bytes' per parameter for mixed "
        "precision (citing its refs [3], [4]); its model (Eq. 1-5) uses 16.",
    ),
    "xmoe": Precision(
        2,
        2,
        4,
        8,
        zero_stage=1,
        source="X-MoE Sec. 5 and App. C.2: half-precision training with ZeRO-1 data parallelism; "
        "App. C.2's model-state cost 8 H_FFN H per replicated two-matrix expert (2 H_FFN H "
        "parameters) is 4 B per parameter of weight + gradient left unsharded by ZeRO-1",
        notes="X-MoE does not state the optimizer's bytes (12 B fp32 master + Adam assumed) nor "
        "whether 'half precision' is bf16 or fp16 (it runs on AMD MI250X).",
    ),
    "mop": Precision(
        2,
        2,
        4,
        8,
        offload_optimizer=True,
        source="MoP Sec. 2.1 Eq. 1: 2 Theta (bf16 weights) + 2 Theta (grads) + 12 Theta (fp32 "
        "master, m, v; AdamW) = 16 Theta; Sec. 3.5: the optimizer state is host-resident",
        notes="MoP does not state a ZeRO stage for itself (its FSDP2 baseline is ZeRO-3, Sec. 2.3 "
        "Eq. 2); offload_optimizer marks the 12 B as host memory.",
    ),
}


def precision(p: str | Precision) -> Precision:
    """A preset by name (``PRECISION_PRESETS``) or a Precision as given."""
    if isinstance(p, Precision):
        return p
    try:
        return PRECISION_PRESETS[p]
    except KeyError:
        raise ValueError(
            f"unknown precision preset {p!r}; known: {', '.join(PRECISION_PRESETS)}"
        ) from None


def model_state_bytes(
    n_params: float,
    dp: int,
    zero_stage: int = 0,
    precision_preset: str | Precision = "bf16-adam",
    offload_optimizer: bool | None = None,
) -> dict[str, float]:
    """Model-state bytes on one rank of a data-parallel group of ``dp`` ranks, ZeRO stage 0-3.

    ZeRO Sec. 5.1 / Fig. 1 (Psi parameters, N_d = dp, K = master + optimizer bytes):
    stage 0 (DDP) (2 + 2 + K) Psi; stage 1 (P_os) 2 Psi + 2 Psi + K Psi / N_d; stage 2 (P_os+g)
    2 Psi + (2 + K) Psi / N_d; stage 3 (P_os+g+p) (2 + 2 + K) Psi / N_d. FSDP FULL_SHARD is stage
    3, SHARD_GRAD_OP stage 2; Megatron's distributed optimizer is stage 1 (it shards the fp32
    master and Adam states only: 6 + 12/DP with the "megatron" preset) [Megatron-Mem]. The 2s
    generalise to the preset's weight and gradient bytes. ``offload_optimizer`` (default: the
    preset's) moves master + optimizer to the host (ZeRO-Offload): reported as ``host``, not in
    ``total``. Returns weights, grads, master, optimizer, total (device), host.
    """
    _positive(n_params=n_params, dp=dp)
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage}")
    p = precision(precision_preset)
    off = p.offload_optimizer if offload_optimizer is None else offload_optimizer
    shard = lambda stage: dp if zero_stage >= stage else 1
    out = {
        "weights": n_params * p.weights / shard(3),
        "grads": n_params * p.grads / shard(2),
        "master": n_params * p.master / shard(1),
        "optimizer": n_params * p.optimizer / shard(1),
    }
    host = out["master"] + out["optimizer"] if off else 0.0
    if off:
        out["master"] = out["optimizer"] = 0.0
    out["total"] = out["weights"] + out["grads"] + out["master"] + out["optimizer"]
    out["host"] = host
    return out


# ============================================================================================
# 5. Communication volume (bytes one GPU sends)
# ============================================================================================


def ring_allreduce_bytes(nbytes: float, n: int) -> float:
    """Bytes one rank sends in a ring all-reduce of an ``nbytes`` buffer: 2 (n-1)/n nbytes
    (reduce-scatter + all-gather; ZeRO Sec. 7.1; the nccl-tests bus-bandwidth convention)."""
    _positive(n=n)
    return 2 * (n - 1) / n * nbytes


def allgather_bytes(nbytes: float, n: int) -> float:
    """Bytes one rank sends in a ring all-gather whose gathered result is ``nbytes``: (n-1)/n."""
    _positive(n=n)
    return (n - 1) / n * nbytes


def reduce_scatter_bytes(nbytes: float, n: int) -> float:
    """Bytes one rank sends in a ring reduce-scatter of an ``nbytes`` input: (n-1)/n nbytes."""
    _positive(n=n)
    return (n - 1) / n * nbytes


def alltoall_bytes(nbytes: float, n: int) -> float:
    """Bytes leaving one rank in an all-to-all of its ``nbytes`` buffer split evenly over n ranks:
    (n-1)/n nbytes (its own share stays)."""
    _positive(n=n)
    return (n - 1) / n * nbytes


def dp_bytes_per_step(
    n_params: float, dp: int, zero_stage: int = 0, precision_preset: str | Precision = "bf16-adam"
) -> float:
    """Data-parallel traffic per step and rank for ``n_params`` parameters replicated over ``dp``.

    ZeRO Sec. 7: stage 0 all-reduces the gradients, 2 (N-1)/N Psi g (Sec. 7.1); stages 1-2
    reduce-scatter gradients and all-gather the updated weights, (N-1)/N Psi (g + w) -- 2 Psi for
    16-bit both, the same as DP (Sec. 7.2.1); stage 3 / FSDP all-gathers weights in the forward
    and again in the backward and reduce-scatters gradients, (N-1)/N Psi (2 w + g) -- 3 Psi,
    1.5x DP (Sec. 7.2.2). g, w: the preset's gradient and weight bytes (fp32 gradients make
    stage 0 cost 8 B/param, Megatron's distributed optimizer 4 + 2).
    """
    _positive(n_params=n_params, dp=dp)
    p = precision(precision_preset)
    if zero_stage == 0:
        return ring_allreduce_bytes(n_params * p.grads, dp)
    if zero_stage in (1, 2):
        return (dp - 1) / dp * n_params * (p.grads + p.weights)
    if zero_stage == 3:
        return (dp - 1) / dp * n_params * (2 * p.weights + p.grads)
    raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage}")


def tp_bytes_per_layer(
    s: float,
    b: float,
    h: int,
    t: int,
    sp: bool = False,
    recompute: str = "none",
    bytes_per_value: float = 2,
) -> float:
    """Tensor-parallel traffic of one transformer layer, forward + backward, per rank.

    Shoeybi et al. 2019 Sec. 3 / Fig. 4: two all-reduces of the s b h activations in the forward
    (after attention and after the MLP) and two in the backward: 4 x 2 (t-1)/t sbh bytes. With
    sequence parallelism (Korthikanti Sec. 4.2.2) each all-reduce becomes an all-gather plus a
    reduce-scatter, 4 + 4 of (t-1)/t sbh: the same bytes. Full recomputation repeats the forward's
    two (Korthikanti Sec. 5); selective does not (the attention core has no TP communication).
    s is the sequence on this rank (divide by cp first). Megatron's SP backward re-gathers the
    layer input for the weight gradient instead of storing it; that extra all-gather is not
    counted (it is a memory-for-traffic choice of the implementation, not of the formula).
    """
    _positive(s=s, b=b, h=h, t=t)
    _choice("recompute", recompute, RECOMPUTE_MODES)
    count = 4 + (2 if recompute == "full" else 0)
    one = s * b * h * bytes_per_value
    if sp:
        return count * (allgather_bytes(one, t) + reduce_scatter_bytes(one, t))
    return count * ring_allreduce_bytes(one, t)


def pp_p2p_bytes_per_microbatch(
    s: float,
    b: float,
    h: int,
    t: int = 1,
    sp: bool = False,
    scatter_gather: bool = False,
    bytes_per_value: float = 2,
) -> float:
    """Pipeline point-to-point bytes one rank sends per micro-batch at a stage boundary: the
    s b h activation forward plus its gradient backward, 2 sbh x bytes (Narayanan Sec. 4.1; Piper
    Sec. III-B2). Sequence parallelism, or Narayanan's scatter/gather optimisation (Sec. 4.1: each
    of the t TP ranks sends 1/t and the receivers all-gather over NVLink), divides it by t."""
    _positive(s=s, b=b, h=h, t=t)
    return 2 * s * b * h * bytes_per_value / (t if (sp or scatter_gather) else 1)


def ep_alltoall_bytes_per_layer(
    tokens: float,
    k: int,
    h: int,
    ep: int,
    bytes_per_value: float = 2,
    capacity_factor: float = 1.0,
    backward: bool = True,
) -> float:
    """Expert-parallel all-to-all bytes leaving one rank for one MoE layer.

    The rank's ``tokens`` each go to k experts (c k copies with capacity factor c): the dispatch
    sends c k tokens h bytes_per_value, of which (EP-1)/EP leave the rank under balanced routing,
    and the combine returns the same (Piper Sec. III-B1 / Eq. 6: 2 b s k d / EP per peer pair).
    The backward repeats both (gradients): 4 all-to-alls per layer with ``backward``. ``tokens``
    is what this rank routes: s b / (t cp) under SP and CP.
    """
    _positive(k=k, h=h, ep=ep, capacity_factor=capacity_factor)
    one = alltoall_bytes(capacity_factor * k * tokens * h * bytes_per_value, ep)
    return (4 if backward else 2) * one


def kv_width(m: MoEModel) -> int:
    """Elements per token of the K and V that context parallelism passes around: 2 H_kv d_h
    (GQA/MHA); for MLA the decompressed K (H (d_nope + d_rope)) and V (H d_v), which Megatron-core's
    CP for MLA exchanges (TransformerEngine's KV P2P ring) -- an assumption: passing MLA's latent
    (r_kv + d_rope per token) would be ~40x less."""
    w = attention_widths(m)
    return w["k"] + w["v"]


def cp_ring_bytes_per_layer(s: int, b: int, kv: int, cp: int, bytes_per_value: float = 2) -> float:
    """Ring-attention (context-parallel) bytes one rank sends for one layer, forward + backward.

    Liu et al. 2023 (Ring Attention) Sec. 3; Megatron-core / TransformerEngine CP (P2P ring): the
    s/cp-token K and V block of ``kv`` elements per token travels cp-1 hops in the forward; the
    backward passes K/V around again and the dK/dV partial sums too: 3 (cp-1) (s/cp) b kv bytes
    (the gradients counted at ``bytes_per_value``).
    """
    _positive(s=s, b=b, kv=kv, cp=cp)
    return 3 * (cp - 1) * (s / cp) * b * kv * bytes_per_value


def comm_bytes_per_step(
    m: MoEModel,
    seq: int,
    micro_batch: int,
    micro_batches: int,
    dp: int = 1,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    cp: int = 1,
    sp: bool | None = None,
    zero_stage: int = 0,
    precision_preset: str | Precision = "bf16-adam",
    recompute: str = "none",
    capacity_factor: float = 1.0,
    bytes_per_value: float = 2,
) -> dict[str, float]:
    """Bytes one GPU sends per training step, per parallel dimension (an average stage).

    Mesh: dp x tp x pp x cp GPUs for attention and dense parts; for the MoE part EP (expert TP 1)
    is carved out of dp x cp x tp (Megatron-core "MoE Parallel Folding": the EP x TP group in MoE
    is a sub-group of DP x CP x TP in attention), so experts are data-parallel over
    dp cp tp / ep ranks. Each step runs ``micro_batches`` micro-batches of ``micro_batch``
    sequences of ``seq`` tokens per DP rank; layers are spread evenly over pp stages (L/pp each,
    MoE layers in proportion). ``sp`` defaults to tp > 1.

    - dp: ``dp_bytes_per_step`` for the non-expert weights this rank holds ((total - routed) /
      (tp pp)) over dp cp ranks, plus the routed experts it holds (routed / (ep pp)) over
      dp cp tp / ep ranks;
    - tp: ``tp_bytes_per_layer`` x layers per stage x micro-batches, at s = seq / cp;
    - pp: ``pp_p2p_bytes_per_microbatch`` x micro-batches (0 when pp = 1);
    - ep: ``ep_alltoall_bytes_per_layer`` x MoE layers per stage x micro-batches, tokens =
      micro_batch seq / (tp cp);
    - cp: ``cp_ring_bytes_per_layer`` x layers per stage x micro-batches.
    """
    _positive(
        seq=seq,
        micro_batch=micro_batch,
        micro_batches=micro_batches,
        dp=dp,
        tp=tp,
        pp=pp,
        ep=ep,
        cp=cp,
    )
    sp = tp > 1 if sp is None else sp
    if (dp * cp * tp) % ep:
        raise ValueError(
            f"EP={ep} must divide dp x cp x tp = {dp * cp * tp} (MoE parallel folding)"
        )
    if m.n_moe_layers and m.n_experts % ep:
        raise ValueError(f"EP={ep} does not divide the expert count E={m.n_experts}")
    pc = param_counts(m)
    dense_params = (pc.total - pc.routed_experts) / (tp * pp)
    expert_params = pc.routed_experts / (ep * pp)
    edp = dp * cp * tp // ep
    dp_bytes = dp_bytes_per_step(dense_params, dp * cp, zero_stage, precision_preset)
    if expert_params:
        dp_bytes += dp_bytes_per_step(expert_params, edp, zero_stage, precision_preset)
    layers = m.layers / pp
    moe_layers = m.n_moe_layers / pp
    s_local = seq / cp
    h = m.d_model
    tp_b = (
        tp_bytes_per_layer(s_local, micro_batch, h, tp, sp, recompute, bytes_per_value) * layers
        if tp > 1
        else 0.0
    )
    pp_b = (
        pp_p2p_bytes_per_microbatch(s_local, micro_batch, h, tp, sp, False, bytes_per_value)
        if pp > 1
        else 0.0
    )
    tokens = micro_batch * seq / (tp * cp) if sp else micro_batch * seq / cp
    ep_b = (
        ep_alltoall_bytes_per_layer(tokens, m.top_k, h, ep, bytes_per_value, capacity_factor)
        * moe_layers
        if ep > 1 and moe_layers
        else 0.0
    )
    cp_b = (
        cp_ring_bytes_per_layer(seq, micro_batch, kv_width(m), cp, bytes_per_value) * layers / tp
        if cp > 1
        else 0.0
    )
    out = {
        "dp": dp_bytes,
        "tp": tp_b * micro_batches,
        "pp": pp_b * micro_batches,
        "ep": ep_b * micro_batches,
        "cp": cp_b * micro_batches,
    }
    out["total"] = sum(out.values())
    return out
