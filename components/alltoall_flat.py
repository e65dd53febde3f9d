"""Flat all-to-all-v: every rank exchanges rows directly with every other rank.

Interface (the MoE layer of issue 6 builds on it):

    all_to_all_v(x, send_counts, recv_counts=None, group=None) -> Tensor

Rows of ``x`` (dim 0) are split by ``send_counts`` (one chunk per rank of ``group``, in rank
order); the result is the received rows concatenated in rank order. When ``recv_counts`` is
None it is learnt with a small all_to_all_single of the counts. The call is differentiable:
its backward is the reverse all-to-all-v (gradients travel back along the same rows).

On gloo, uneven splits go through ``dist.all_to_all_single`` with ``input_split_sizes`` /
``output_split_sizes``; the list form ``dist.all_to_all`` rejects unequal sizes.

Byte count (nccl-tests conventions for alltoall): rank r sends
``sum_{d != r} send_counts[d] * row_bytes``; the chunk to itself is a local copy and is not
counted on any link. algbw = total bytes a rank sends (incl. its own chunk) / time, busbw =
algbw * (n - 1) / n.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _world(group) -> int:
    return dist.get_world_size(group)


def exchange_counts(send_counts: list[int], group=None) -> list[int]:
    """Each rank tells each peer how many rows it will send: one int64 per peer."""
    n = _world(group)
    if len(send_counts) != n:
        raise ValueError(f"send_counts has {len(send_counts)} entries, group has {n} ranks")
    send = torch.tensor([int(c) for c in send_counts], dtype=torch.int64)
    recv = torch.empty(n, dtype=torch.int64)
    dist.all_to_all_single(recv, send, group=group)
    return [int(c) for c in recv.tolist()]


def _all_to_all_v_raw(x: torch.Tensor, send_counts: list[int], recv_counts: list[int],
                      group=None) -> torch.Tensor:
    x = x.contiguous()
    out = x.new_empty((sum(recv_counts), *x.shape[1:]))
    dist.all_to_all_single(out, x, output_split_sizes=list(recv_counts),
                           input_split_sizes=list(send_counts), group=group)
    return out


class _AllToAllV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, send_counts, recv_counts, group):
        ctx.send_counts, ctx.recv_counts, ctx.group = send_counts, recv_counts, group
        return _all_to_all_v_raw(x, send_counts, recv_counts, group)

    @staticmethod
    def backward(ctx, grad):
        # The reverse exchange: what I received from d goes back to d.
        return _all_to_all_v_raw(grad, ctx.recv_counts, ctx.send_counts, ctx.group), None, None, None


def all_to_all_v(x: torch.Tensor, send_counts: list[int], recv_counts: list[int] | None = None,
                 group=None) -> torch.Tensor:
    """Differentiable all-to-all-v over ``group`` (torch.distributed); see the module docstring."""
    n = _world(group)
    send_counts = [int(c) for c in send_counts]
    if len(send_counts) != n:
        raise ValueError(f"send_counts has {len(send_counts)} entries, group has {n} ranks")
    if any(c < 0 for c in send_counts):
        raise ValueError(f"send_counts must be >= 0, got {send_counts}")
    if sum(send_counts) != x.shape[0]:
        raise ValueError(f"send_counts sum to {sum(send_counts)} but x has {x.shape[0]} rows")
    if recv_counts is None:
        recv_counts = exchange_counts(send_counts, group)
    else:
        recv_counts = [int(c) for c in recv_counts]
        if len(recv_counts) != n:
            raise ValueError(f"recv_counts has {len(recv_counts)} entries, group has {n} ranks")
    return _AllToAllV.apply(x, send_counts, recv_counts, group)
