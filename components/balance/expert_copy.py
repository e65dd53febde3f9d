"""Shipping whole experts between EP ranks, differentiably, and running an FFN on given weights.

Used by the balancers that compute an expert on a rank other than its home (FEPLB Phase 2,
least-loaded EP, FasterMoE shadows). One expert's weights travel as one flat row
[w_in | w_gate | w_out] (n_mat * H * F values). The forward copy is an all-to-all-v issued
*asynchronously* on its own process group (on CPU gloo runs it on its own worker thread; with
NCCL a separate group runs on its own CUDA stream, FEPLB's copy-engine path), so the caller can
compute its static experts meanwhile and ``wait()`` before the dynamic ones. Gradients of a
copy flow back to the home rank's parameters: the backward is the reverse all-to-all-v on the
same group, so the home expert's gradient is the sum over every rank that computed it, exactly
as if it had computed all those rows itself.

Bytes per copied expert: n_mat * H * F * itemsize (forward) and the same for its gradient.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from moe_repro.components.alltoall.flat import exchange_rows
from moe_repro.components.moe.expert_mlp import ExpertMLP, grouped_gemm


def expert_matrices(mlp: ExpertMLP) -> list[torch.Tensor]:
    return [p for p in (mlp.w_in, mlp.w_gate, mlp.w_out) if p is not None]


def pack_experts(mlp: ExpertMLP, local_slots: list[int]) -> torch.Tensor:
    """[len(slots), n_mat * H * F] rows of the given local experts (differentiable)."""
    # index_select even for no slots: the (empty) result stays attached to the parameters, so
    # every rank takes part in the copy's backward collective.
    mats = expert_matrices(mlp)
    idx = torch.tensor(local_slots, dtype=torch.int64, device=mats[0].device)
    return torch.cat([m.index_select(0, idx).reshape(len(local_slots), _matrix_numel(m))
                      for m in mats], dim=1)


def _matrix_numel(m: torch.Tensor) -> int:
    n = 1
    for d in m.shape[1:]:
        n *= d
    return n


def unpack_experts(mlp: ExpertMLP, rows: torch.Tensor) -> list[torch.Tensor]:
    """Inverse of pack_experts: per-matrix stacks [n, *matrix shape]."""
    out, start = [], 0
    for m in expert_matrices(mlp):
        size = _matrix_numel(m)
        out.append(rows[:, start:start + size].reshape(rows.shape[0], *m.shape[1:]))
        start += size
    return out


def local_stacks(mlp: ExpertMLP, local_slots: list[int]) -> list[torch.Tensor]:
    """Per-matrix stacks of the given local experts (differentiable index_select)."""
    idx = torch.tensor(local_slots, dtype=torch.int64, device=mlp.w_in.device)
    return [m.index_select(0, idx) for m in expert_matrices(mlp)]


def ffn_with_weights(mlp: ExpertMLP, x: torch.Tensor, tokens_per_group, stacks: list[torch.Tensor],
                     gemm: str | None = None) -> torch.Tensor:
    """The same FFN as ``mlp.forward`` on rows grouped by expert, with the given weight stacks."""
    variant = gemm or mlp.gemm
    counts = torch.as_tensor(tokens_per_group, dtype=torch.int64)
    if counts.numel() == 0:
        # No groups: an empty result that still depends on the (empty) weights and rows, so the
        # collectives behind them run their backward on this rank like on the others.
        anchor = sum(w.sum() for w in stacks) * 0 + x.sum() * 0
        return x.new_zeros(0, mlp.d_model) + anchor
    if mlp.w_gate is not None:
        w_in, w_gate, w_out = stacks
        gate = grouped_gemm(x, w_gate, counts, variant)
    else:
        (w_in, w_out), gate = stacks, None
    up = grouped_gemm(x, w_in, counts, variant)
    return grouped_gemm(mlp.hidden_activation(up, gate), w_out, counts, variant)


class _AttachCopyGrad(torch.autograd.Function):
    """Identity from ``sent`` to the already-received rows; backward returns the gradient of
    the received rows to their senders with the reverse all-to-all-v on the copy group."""

    @staticmethod
    def forward(ctx, sent, received, send_counts, recv_counts, group):
        ctx.send_counts, ctx.recv_counts, ctx.group = send_counts, recv_counts, group
        return received.view_as(received)

    @staticmethod
    def backward(ctx, grad):
        back = exchange_rows(grad.contiguous(), ctx.recv_counts, ctx.send_counts, ctx.group)
        return back, None, None, None, None


class ExpertCopy:
    """One asynchronous, differentiable all-to-all-v of packed expert rows on ``group``."""

    def __init__(self, sent: torch.Tensor, send_counts: list[int], recv_counts: list[int], group):
        self.sent, self.send_counts, self.recv_counts, self.group = sent, send_counts, recv_counts, group
        self.received = sent.new_empty(sum(recv_counts), sent.shape[1])
        self.work = dist.all_to_all_single(self.received, sent.detach().contiguous(),
                                           output_split_sizes=list(recv_counts),
                                           input_split_sizes=list(send_counts),
                                           group=group, async_op=True)

    def wait(self) -> torch.Tensor:
        self.work.wait()
        if not (self.sent.requires_grad and torch.is_grad_enabled()):
            return self.received
        return _AttachCopyGrad.apply(self.sent, self.received, self.send_counts,
                                     self.recv_counts, self.group)
