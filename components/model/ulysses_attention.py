"""Ulysses-style sequence-parallel causal attention (MoP Sec. 3.2; DeepSpeed-Ulysses).

Outside attention every rank of a D-rank group holds its own contiguous chunk of one sequence
(sequence-sharded layout, all heads). Attention needs the whole sequence per row of the softmax,
so an all-to-all swaps to the head-sharded layout (the whole sequence, H/D of the heads), the
ordinary causal attention runs on that head slice, and a second all-to-all swaps back. Either
layout holds O(S H / D) activations per rank (MoP: "the same per-rank activation peak").

Chunks may be uneven (S not divisible by D; a rank may hold no tokens): the exchanges are
all-to-all-v with the chunk lengths of every rank, learnt with one small all-gather. Heads (and
key/value heads for grouped-query attention) must be divisible by D; otherwise ValueError.
Rank r's chunk is the r-th piece of the sequence (positions follow rank order).

Bytes per call, per rank, per tensor of element size e (nccl-tests alltoall convention: the piece
kept locally is no traffic): seq->head sends S_r (D-1)/D H_t d e for each of q, k, v (H_t their
head counts), head->seq sends (S - S_r) H/D d e for the output; backward mirrors both.
Differentiable through components.alltoall.flat.all_to_all_v.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from moe_repro.components.alltoall.flat import all_to_all_v


def gather_chunk_lengths(local_len: int, group=None, device=None) -> list[int]:
    """Every rank's sequence-chunk length, in group rank order (``device``: where the backend
    wants its tensors, e.g. the GPU for NCCL)."""
    n = dist.get_world_size(group)
    mine = torch.tensor([local_len], dtype=torch.int64, device=device)
    out = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(n)]
    dist.all_gather(out, mine, group=group)
    return [int(t) for t in out]


def seq_to_head(x: torch.Tensor, lengths: list[int], rank: int, group=None) -> torch.Tensor:
    """(S_r, heads, d) sequence-sharded -> (S, heads/D, d) head-sharded (full sequence)."""
    d_group = len(lengths)
    s_local, heads, dim = x.shape
    per = heads // d_group
    # Rows for destination j: my tokens, head group j -> (D, S_r, heads/D * d) in rank order.
    send = (
        x.reshape(s_local, d_group, per * dim).transpose(0, 1).reshape(d_group * s_local, per * dim)
    )
    recv = all_to_all_v(send, [s_local] * d_group, list(lengths), group)
    return recv.reshape(sum(lengths), per, dim)


def head_to_seq(y: torch.Tensor, lengths: list[int], rank: int, group=None) -> torch.Tensor:
    """(S, heads/D, d) head-sharded -> (S_r, heads, d) sequence-sharded."""
    d_group = len(lengths)
    _, per, dim = y.shape
    s_local = lengths[rank]
    recv = all_to_all_v(y.reshape(-1, per * dim), list(lengths), [s_local] * d_group, group)
    # Received from source j: my tokens of head group j, (D, S_r, per*d) -> (S_r, D*per, d).
    return (
        recv.reshape(d_group, s_local, per * dim)
        .transpose(0, 1)
        .reshape(s_local, d_group * per, dim)
    )


def ulysses_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group=None,
    causal: bool = True,
    lengths: list[int] | None = None,
) -> torch.Tensor:
    """Attention of this rank's chunk over the whole sequence split across ``group``.

    q: (S_r, H, d); k, v: (S_r, H_kv, d) with H_kv dividing H. Returns (S_r, H, d), equal to
    rows [sum(lengths[:r]), sum(lengths[:r+1])) of SDPA on the concatenated sequence.
    """
    d_group, rank = dist.get_world_size(group), dist.get_rank(group)
    if q.dim() != 3 or k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ValueError(
            f"expected q (S_r, H, d) and k, v (S_r, H_kv, d), got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads % d_group or kv_heads % d_group:
        raise ValueError(
            f"Ulysses needs the head counts divisible by the sequence-parallel degree: "
            f"heads={heads}, kv_heads={kv_heads}, degree={d_group}"
        )
    if heads % kv_heads:
        raise ValueError(f"heads={heads} must be a multiple of kv_heads={kv_heads}")
    if lengths is None:
        lengths = gather_chunk_lengths(q.shape[0], group, q.device)
    elif len(lengths) != d_group or lengths[rank] != q.shape[0]:
        raise ValueError(
            f"lengths {lengths} do not match the group ({d_group}) or this chunk ({q.shape[0]})"
        )
    qh, kh, vh = (seq_to_head(t, lengths, rank, group) for t in (q, k, v))
    # Query head group r (heads r*H/D...) uses key/value head group r (the same contiguous slice).
    repeat = heads // kv_heads
    kh, vh = kh.repeat_interleave(repeat, dim=1), vh.repeat_interleave(repeat, dim=1)
    out = F.scaled_dot_product_attention(
        qh.transpose(0, 1), kh.transpose(0, 1), vh.transpose(0, 1), is_causal=causal
    ).transpose(0, 1)
    return head_to_seq(out.contiguous(), lengths, rank, group)


def alltoall_bytes_per_rank(
    lengths: list[int], rank: int, heads: int, kv_heads: int, head_dim: int, elem_bytes: int = 4
) -> dict:
    """Bytes rank ``rank`` sends over links in one forward (backward: the same again)."""
    d_group, s_total, s_local = len(lengths), sum(lengths), lengths[rank]
    row = head_dim * elem_bytes
    seq_to_head_bytes = s_local * (d_group - 1) * (heads + 2 * kv_heads) // d_group * row
    head_to_seq_bytes = (s_total - s_local) * heads // d_group * row
    return {"seq_to_head_bytes": seq_to_head_bytes, "head_to_seq_bytes": head_to_seq_bytes}
