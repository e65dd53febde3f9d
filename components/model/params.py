"""Parameter counts (total and active per token) computed from a zoo architecture.

Weights only, biases ignored (as in the papers' formulas); RMS/LayerNorm weights counted (2 per
layer plus a final norm). Per component:

- attention, ``attn_params``:
  ``"4d2"``: Piper Table III's 4 d^2 (Q, K, V, O of width d);
  ``"gqa"``: Q and O of width H d_h, K and V of width H_kv d_h (MHA when H_kv = H):
  d H d_h + 2 d H_kv d_h + H d_h d;
  ``"mla"``: DeepSeek-V2 Sec. 2.1 Multi-head Latent Attention, with r_q = q_lora_rank,
  r_kv = kv_lora_rank, d_n / d_r / d_v the no-RoPE / RoPE / value head dims:
  d r_q + r_q H (d_n + d_r)  [queries; d H (d_n + d_r) without a low-rank query]
  + d (r_kv + d_r) + r_kv H (d_n + d_v)  [compressed KV and its up-projection]
  + H d_v d  [output] + r_q + r_kv  [the two latent norms].
- routed expert: n_mat d d_ffn; shared expert: n_mat d d_ffn_shared; router: d E per MoE layer.
- dense FFN (layers that are not MoE): n_mat d d_ffn_dense; Arctic's residual FFN in every layer.
- embeddings: V d for the input table, plus V d for an untied output head (0 if V unknown).

Active parameters replace each MoE layer's E routed experts by its top-k: every other weight is
used by every token. Embedding rows are counted whole, as model cards do.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from moe_repro.components.model.zoo import MoEModel


def attention_params(m: MoEModel) -> int:
    """Attention weights of one layer (see the module docstring for the three conventions)."""
    d = m.d_model
    if m.attn_params == "4d2":
        return 4 * d * d
    if m.attn_params == "mla":
        if m.mla is None:
            raise ValueError(f"{m.key}: attn_params='mla' needs the mla shapes")
        a, h = m.mla, m.heads
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        q = (
            d * h * qk
            if a.q_lora_rank is None
            else d * a.q_lora_rank + a.q_lora_rank * h * qk + a.q_lora_rank
        )
        kv = d * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank * h * (
            a.qk_nope_head_dim + a.v_head_dim
        )
        return q + kv + a.kv_lora_rank + h * a.v_head_dim * d
    if m.attn_params == "gqa":
        h = m.heads
        hd = m.head_dim or d // h
        kv = m.n_kv_heads or h
        return d * h * hd + 2 * d * kv * hd + h * hd * d
    raise ValueError(f"{m.key}: unknown attn_params {m.attn_params!r}")


def shared_expert_params(m: MoEModel) -> int:
    """Weights of one MoE layer's shared (always active) experts."""
    return m.n_shared * m.n_mat * m.d_model * (m.d_ffn_shared or m.d_ffn)


def dense_ffn_params(m: MoEModel) -> int:
    """Weights of the FFN of one dense (non-MoE) layer."""
    if m.n_dense_layers == 0:
        return 0
    if m.d_ffn_dense is None:
        raise ValueError(f"{m.key}: has dense layers but no d_ffn_dense")
    return m.n_mat * m.d_model * m.d_ffn_dense


def residual_ffn_params(m: MoEModel) -> int:
    return 0 if m.d_ffn_residual is None else m.n_mat * m.d_model * m.d_ffn_residual


def embedding_params(m: MoEModel) -> int:
    if m.vocab is None:
        return 0
    return m.vocab * m.d_model * (1 if m.tie_embeddings else 2)


@dataclass(frozen=True)
class ParamCounts:
    attention: int
    norms: int
    routed_experts: int  # all routed experts of all MoE layers
    routed_active: int  # top-k of them per MoE layer
    shared_experts: int
    routers: int
    dense_ffn: int  # dense layers' FFNs and Arctic-style residual FFNs
    embeddings: int
    extra: int

    @property
    def total(self) -> int:
        return (
            self.attention
            + self.norms
            + self.routed_experts
            + self.shared_experts
            + self.routers
            + self.dense_ffn
            + self.embeddings
            + self.extra
        )

    @property
    def active(self) -> int:
        return self.total - self.routed_experts + self.routed_active

    @property
    def non_expert(self) -> int:
        """Everything but the routed experts: what expert parallelism replicates."""
        return self.total - self.routed_experts

    def to_dict(self) -> dict:
        return {**asdict(self), "total": self.total, "active": self.active}


def param_counts(m: MoEModel) -> ParamCounts:
    L, Lm = m.layers, m.n_moe_layers
    return ParamCounts(
        attention=L * attention_params(m),
        norms=2 * L * m.d_model + m.d_model,
        routed_experts=Lm * m.n_experts * m.expert_params(),
        routed_active=Lm * min(m.top_k, m.n_experts) * m.expert_params(),
        shared_experts=Lm * shared_expert_params(m),
        routers=Lm * m.d_model * m.n_experts if m.n_experts > 1 else 0,
        dense_ffn=m.n_dense_layers * dense_ffn_params(m) + L * residual_ffn_params(m),
        embeddings=embedding_params(m),
        extra=L * m.extra_params_per_layer,
    )


def layer_params(m: MoEModel, moe: bool) -> tuple[int, int]:
    """(replicated, routed-expert) weights of one layer: what EP replicates vs splits."""
    replicated = (
        attention_params(m) + 2 * m.d_model + residual_ffn_params(m) + m.extra_params_per_layer
    )
    if not moe:
        return replicated + dense_ffn_params(m), 0
    router = m.d_model * m.n_experts if m.n_experts > 1 else 0
    return replicated + shared_expert_params(m) + router, m.n_experts * m.expert_params()
