"""Sequence-sharded MoE block (SSMB, X-MoE Sec. 4.3, Fig. 8) after a tensor-parallel dense block.

Layer = TP dense block (Megatron MLP: column-parallel W1, row-parallel W2, all-reduce; every TP
rank ends with the same full sequence) followed by an MoE block whose experts are spread over the
same ranks acting as EP ranks (components.moe.moe_layer.MoELayer, padding-free, all-to-all-v).

- without SSMB (TP + EP, "TED"-like): every rank feeds the MoE block the full, duplicated
  sequence, so A_dispatch / A_combine / expert intermediates are duplicated G times;
- with SSMB: (1) each rank keeps only its chunk of the sequence (drop), (2) gating, dispatch,
  experts and combine run on that chunk, (3) an all-gather restores the replicated sequence for
  the next TP block. Backward mirrored: the incoming (replicated) gradient is cut to the chunk,
  and an all-gather rebuilds the full input gradient for the TP block (X-MoE Sec. 4.3).
  Activations of the MoE block shrink by the TP degree G (App. C.2 Eq. 1 saves 4 c k S H (G-1)/G
  bytes per layer in half precision for dispatch + combine).

Sequences not divisible by G are split as evenly as possible (first S mod G ranks one token more).
Gradients of replicated parameters: with SSMB each rank's router saw only its chunk, so router
gradients are summed over the group (like sequence-parallel LayerNorm in Megatron-SP); without
SSMB every token reaches its expert G times, so expert gradients are divided by G
(:meth:`SSMBLayer.sync_grads`).

Extra traffic of SSMB per layer and rank (App. C.2): the forward all-gather and the backward
all-gather each receive (S - S_r) H e bytes; the all-to-all volume per rank shrinks by G.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from moe_repro.components.moe.moe_layer import ExpertPlacement, MoELayer
from moe_repro.components.network.rank_layout import even_split_bounds


def sequence_bounds(seq_len: int, degree: int) -> list[tuple[int, int]]:
    """[lo, hi) of each rank's chunk; the first S mod G ranks get one token more."""
    return even_split_bounds(seq_len, degree)


def _all_gather_rows(x: torch.Tensor, bounds, group) -> torch.Tensor:
    """Concatenate every rank's chunk (uneven row counts) in rank order."""
    longest = max(hi - lo for lo, hi in bounds)
    padded = x.new_zeros((longest, *x.shape[1:]))
    padded[: x.shape[0]] = x
    parts = [torch.empty_like(padded) for _ in bounds]
    dist.all_gather(parts, padded.contiguous(), group=group)
    return torch.cat([p[: hi - lo] for p, (lo, hi) in zip(parts, bounds)])


class _DropToChunk(torch.autograd.Function):
    """Forward: keep this rank's rows (SSMB step 1). Backward: all-gather the chunks' gradients
    into the full, replicated input gradient (SSMB backward, last step)."""

    @staticmethod
    def forward(ctx, x, bounds, rank, group):
        ctx.bounds, ctx.group = bounds, group
        lo, hi = bounds[rank]
        return x[lo:hi].clone()

    @staticmethod
    def backward(ctx, grad):
        return _all_gather_rows(grad.contiguous(), ctx.bounds, ctx.group), None, None, None


class _GatherChunks(torch.autograd.Function):
    """Forward: all-gather the chunks into the replicated sequence (SSMB step 3). Backward: the
    replicated gradient is the same on every rank; keep this rank's rows ("drops the gradients")."""

    @staticmethod
    def forward(ctx, x, bounds, rank, group):
        ctx.lo, ctx.hi = bounds[rank]
        return _all_gather_rows(x.contiguous(), bounds, group)

    @staticmethod
    def backward(ctx, grad):
        return grad[ctx.lo : ctx.hi].clone(), None, None, None


class _CopyToTP(torch.autograd.Function):
    """Megatron's f: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """Megatron's g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class TPDenseMLP(nn.Module):
    """Residual MLP x + gelu(x W1) W2 + b2 with W1 column- and W2 row-sharded over ``group``."""

    def __init__(self, w1_full: torch.Tensor, w2_full: torch.Tensor, b2: torch.Tensor, group=None):
        super().__init__()
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        d_ffn = w1_full.shape[1]
        if d_ffn % size:
            raise ValueError(f"dense FFN width {d_ffn} must divide over the TP degree {size}")
        per = d_ffn // size
        self.group = group
        self.w1 = nn.Parameter(w1_full[:, rank * per : (rank + 1) * per].clone())
        self.w2 = nn.Parameter(w2_full[rank * per : (rank + 1) * per].clone())
        self.b2 = nn.Parameter(b2.clone())

    def forward(self, x):
        partial = F.gelu(_CopyToTP.apply(x, self.group) @ self.w1) @ self.w2
        return x + _ReduceFromTP.apply(partial, self.group) + self.b2


class SSMBLayer(nn.Module):
    """TP dense block + MoE block over the same G ranks; ``sequence_sharded`` switches SSMB on.

    Built from full (unsharded) weights so that every variant, and a single-process reference,
    holds the same model: ``moe_full`` is a non-EP MoELayer with all experts; this rank copies
    the router and its own experts (contiguous placement) into an EP MoELayer.
    """

    def __init__(
        self, w1_full, w2_full, b2, moe_full: MoELayer, group=None, sequence_sharded: bool = True
    ):
        super().__init__()
        self.group, self.sequence_sharded = group, sequence_sharded
        self.degree, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.dense = TPDenseMLP(w1_full, w2_full, b2, group)
        E = moe_full.num_experts
        placement = ExpertPlacement.contiguous(E, self.degree)
        activation = moe_full.experts.activation
        self.moe = MoELayer(
            moe_full.d_model,
            moe_full.d_ffn,
            E,
            moe_full.top_k,
            score=moe_full.gate.score,
            normalize=moe_full.gate.normalize,
            activation=activation,
            expert_parallel=True,
            ep_group=group,
            placement=placement,
        )
        mine = list(placement.experts_of_rank[self.rank])
        with torch.no_grad():
            self.moe.gate.weight.copy_(moe_full.gate.weight)
            for name in ("w_in", "w_gate", "w_out"):
                full = getattr(moe_full.experts, name)
                if full is not None:
                    getattr(self.moe.experts, name).copy_(full[mine])

    def forward(self, x: torch.Tensor, moe_activation_probe=None) -> torch.Tensor:
        """x: the full sequence, replicated on every rank (S, H) -> (S, H), replicated."""
        h = self.dense(x)
        probe = moe_activation_probe if moe_activation_probe is not None else _NoProbe()
        if not self.sequence_sharded:
            with probe:
                return h + self.moe(h)
        bounds = sequence_bounds(h.shape[0], self.degree)
        with probe:
            chunk = _DropToChunk.apply(h, bounds, self.rank, self.group)
            out_chunk = chunk + self.moe(chunk)
            return _GatherChunks.apply(out_chunk, bounds, self.rank, self.group)

    def sync_grads(self) -> None:
        """Make replicated-parameter gradients those of the unsharded layer (module docstring)."""
        if self.sequence_sharded:
            if self.moe.gate.weight.grad is not None:
                dist.all_reduce(self.moe.gate.weight.grad, group=self.group)
        else:
            for p in self.moe.experts.parameters():
                if p.grad is not None:
                    p.grad /= self.degree


class _NoProbe:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
