"""Causal self-attention core with PyTorch SDPA, shaped from the model zoo (Piper Sec. IV-A1).

``scaled_dot_product_attention`` picks the flash or memory-efficient kernel on GPUs (head
sizes they support) and the math/flash-CPU kernel on CPUs. Shapes follow the zoo: H query
heads, H_kv key/value heads (grouped-query attention when H_kv < H), head_dim d (d_model / H
where the zoo gives none: approximate for DeepSeek's MLA, whose q/k heads are 192 wide and v
heads 128).

FLOPs of the forward core (QK^T and PV, 2 FLOPs per multiply-add):
    4 * b * H * s^2 * d, halved with a causal mask (the FlashAttention benchmark convention);
backward = 2.5x forward (recomputing QK^T plus the four gradient matmuls, as FlashAttention counts).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from moe_repro.components.model.zoo import MoEModel


@dataclass(frozen=True)
class AttentionShape:
    heads: int
    kv_heads: int
    head_dim: int

    def __post_init__(self):
        if min(self.heads, self.kv_heads, self.head_dim) < 1 or self.heads % self.kv_heads:
            raise ValueError(
                f"invalid attention shape {self}: need positive sizes and "
                "heads divisible by kv_heads"
            )


def shape_from_model(model: MoEModel, heads: int | None = None) -> AttentionShape:
    """The zoo model's attention shape; ``heads`` (optional) keeps head_dim and the GQA ratio
    but uses fewer query heads, to fit a small device."""
    if not model.n_heads:
        raise ValueError(f"{model.key} has no n_heads in the zoo")
    head_dim = model.head_dim or model.d_model // model.n_heads
    kv = model.n_kv_heads or model.n_heads
    if heads:
        heads = min(heads, model.n_heads)
        group = model.n_heads // kv
        heads = max(group, heads - heads % group)
        kv = heads // group
        return AttentionShape(heads, kv, head_dim)
    return AttentionShape(model.n_heads, kv, head_dim)


def attention_flops(
    batch: int, seq: int, shape: AttentionShape, causal: bool = True, backward: bool = False
) -> float:
    fwd = 4.0 * batch * shape.heads * seq * seq * shape.head_dim * (0.5 if causal else 1.0)
    return fwd * (3.5 if backward else 1.0)


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True
) -> torch.Tensor:
    """q [b, H, s, d], k and v [b, H_kv, s, d] -> [b, H, s, d]."""
    if q.dim() != 4 or k.shape != v.shape or q.shape[-1] != k.shape[-1] or q.shape[1] % k.shape[1]:
        raise ValueError(
            f"need q [b, H, s, d] and k, v [b, H_kv, s, d] with H_kv | H, got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    return F.scaled_dot_product_attention(
        q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1]
    )


def reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True
) -> torch.Tensor:
    """Explicit softmax(q k^T / sqrt(d) + mask) v in float64 (for checks)."""
    group = q.shape[1] // k.shape[1]
    q, k, v = (
        q.double(),
        k.double().repeat_interleave(group, 1),
        v.double().repeat_interleave(group, 1),
    )
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        s = q.shape[2]
        scores = scores.masked_fill(
            torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1), float("-inf")
        )
    return torch.softmax(scores, -1) @ v
