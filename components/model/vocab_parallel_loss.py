"""Sharded ("data-tensor-parallel") vocabulary projection with an exact cross-entropy loss.

MoP Sec. 3.4, Eq. 5: with the local batch X (N x H) and the projection W_voc (H x V),
``loss_n = logsumexp_v (X W)_{n,v} - (X W)_{n,t_n}``. Column-wise tensor parallelism would shard
W but needs the same X on every rank; MoP keeps the data-parallel invariant (every rank its own
batch, possibly of different length) and shards W over a P-rank group instead.

How it works here (one rank's view; rank p owns the vocabulary columns [lo_p, hi_p)):

- forward: for each shard b = 0..P-1, the owner broadcasts its weight shard W_b (H x V_b) to the
  group (the next shard's broadcast is in flight while this one is used); every rank multiplies
  its own X by W_b, giving an N x V_b logit block, and folds it into an online log-sum-exp
  (running max m and rescaled sum s, Milakov & Gimelshein 2018) and picks the target logit if
  the target falls in the block. Only the N-vector lse is saved for backward, never the logits.
- backward: the blocks are recomputed; with p = softmax block = exp(logits_b - lse) and
  p[n, t_n - lo_b] -= 1, scaled by the incoming per-token gradient g_n:
  dX += p W_b^T and dW_b = X^T p is summed over the group onto its owner (reduce).

Per-rank resident activation is one N x V_b block (plus the N-vectors): O(N V / P) instead of
O(N V); splitting each shard further (``block_cols``) lowers it more. Communication per step:
every shard is broadcast twice (forward, backward recompute) and its gradient reduced once, i.e.
about 3 H V elements per rank per step, independent of the number of tokens N (MoP: "essentially
independent of context length").

Bytes (nccl-tests style) per call, per rank, with element size e:
  forward  broadcast: sum_b H V_b e = H V e      backward broadcast: H V e
  backward reduce:    H V e
Vocabularies not divisible by P are split as evenly as possible (the first V mod P ranks own
one column more). Ranks with zero tokens take part in the collectives and contribute nothing.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from moe_repro.components.network.rank_layout import even_split_bounds


def shard_bounds(vocab_size: int, n_shards: int) -> list[tuple[int, int]]:
    """[lo, hi) vocabulary columns of each shard; the first V mod P shards get one more column."""
    if n_shards < 1:
        raise ValueError(f"n_shards must be >= 1, got {n_shards}")
    if vocab_size < n_shards:
        raise ValueError(
            f"vocab_size={vocab_size} must be >= the group size {n_shards} "
            "(every rank owns at least one vocabulary column)"
        )
    return even_split_bounds(vocab_size, n_shards)


def _group_info(group) -> tuple[int, int, list[int]]:
    size = dist.get_world_size(group)
    rank = dist.get_rank(group)
    global_ranks = [dist.get_global_rank(group, r) if group is not None else r for r in range(size)]
    return rank, size, global_ranks


def _column_blocks(bounds: list[tuple[int, int]], block_cols: int | None):
    """(shard, lo, hi) column blocks: each shard split into pieces of at most block_cols."""
    for b, (lo, hi) in enumerate(bounds):
        step = block_cols or max(hi - lo, 1)
        for start in range(lo, hi, step):
            yield b, start, min(start + step, hi)


class _ShardFetcher:
    """Broadcast the weight shards in order, one ahead, so the next transfer overlaps compute."""

    def __init__(self, w_local: torch.Tensor, bounds, global_ranks, my_rank, group):
        self.w_local, self.bounds, self.global_ranks = w_local, bounds, global_ranks
        self.my_rank, self.group = my_rank, group
        self.pending = None

    def _start(self, b: int):
        lo, hi = self.bounds[b]
        if b == self.my_rank:
            buf = self.w_local.detach().contiguous()
        else:
            buf = self.w_local.new_empty((self.w_local.shape[0], hi - lo))
        work = dist.broadcast(buf, src=self.global_ranks[b], group=self.group, async_op=True)
        return b, buf, work

    def shards(self):
        n = len(self.bounds)
        self.pending = self._start(0)
        for b in range(n):
            _, buf, work = self.pending
            work.wait()
            self.pending = self._start(b + 1) if b + 1 < n else None
            yield b, buf


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w_local, targets, vocab_size, group, block_cols):
        rank, size, global_ranks = _group_info(group)
        bounds = shard_bounds(vocab_size, size)
        lo_me, hi_me = bounds[rank]
        if w_local.shape[1] != hi_me - lo_me:
            raise ValueError(
                f"rank {rank}: local weight has {w_local.shape[1]} columns, shard "
                f"[{lo_me}, {hi_me}) of V={vocab_size} over {size} ranks needs {hi_me - lo_me}"
            )
        if x.shape[1] != w_local.shape[0]:
            raise ValueError(f"x has hidden size {x.shape[1]}, weight has {w_local.shape[0]}")
        n = x.shape[0]
        running_max = x.new_full((n,), float("-inf"))
        running_sum = x.new_zeros(n)
        target_logit = x.new_zeros(n)
        for b, w_b in _ShardFetcher(w_local, bounds, global_ranks, rank, group).shards():
            lo_b = bounds[b][0]
            for _, lo, hi in _column_blocks([bounds[b]], block_cols):
                logits = x @ w_b[:, lo - lo_b : hi - lo_b]
                inside = (targets >= lo) & (targets < hi)
                idx = (targets - lo).clamp(0, hi - lo - 1)
                picked = logits.gather(1, idx[:, None]).squeeze(1)
                target_logit = torch.where(inside, picked, target_logit)
                new_max = torch.maximum(running_max, logits.max(dim=1).values)
                # In place: the block is the only N x V_b buffer alive (no exp temporary).
                block_sum = logits.sub_(new_max[:, None]).exp_().sum(dim=1)
                running_sum = running_sum * torch.exp(running_max - new_max) + block_sum
                running_max = new_max
                del logits
        lse = running_max + torch.log(running_sum)
        ctx.save_for_backward(x, w_local, targets, lse)
        ctx.vocab_size, ctx.group, ctx.block_cols = vocab_size, group, block_cols
        return lse - target_logit

    @staticmethod
    def backward(ctx, grad_loss):
        x, w_local, targets, lse = ctx.saved_tensors
        group, block_cols = ctx.group, ctx.block_cols
        rank, size, global_ranks = _group_info(group)
        bounds = shard_bounds(ctx.vocab_size, size)
        grad_x = torch.zeros_like(x)
        grad_w_local = None
        for b, w_b in _ShardFetcher(w_local, bounds, global_ranks, rank, group).shards():
            lo_b, hi_b = bounds[b]
            grad_w_b = w_b.new_empty(w_b.shape) if block_cols else None
            for _, lo, hi in _column_blocks([bounds[b]], block_cols):
                w_blk = w_b[:, lo - lo_b : hi - lo_b]
                probs = (x @ w_blk).sub_(lse[:, None]).exp_()  # softmax block, recomputed in place
                inside = (targets >= lo) & (targets < hi)
                rows = inside.nonzero().squeeze(1)
                probs[rows, targets[rows] - lo] -= 1.0
                probs *= grad_loss[:, None]
                grad_x.addmm_(probs, w_blk.T)
                if hi - lo == hi_b - lo_b:  # one block per shard: write the gradient directly
                    grad_w_b = torch.mm(x.T, probs)
                else:
                    grad_w_b[:, lo - lo_b : hi - lo_b] = x.T @ probs
                del probs
            # Sum every rank's contribution to shard b onto its owner (MoP: each rank keeps its
            # own batch, so each holds a partial gradient of every shard).
            dist.reduce(grad_w_b, dst=global_ranks[b], group=group)
            if b == rank:
                grad_w_local = grad_w_b
            del grad_w_b
        return grad_x, grad_w_local, None, None, None, None


def vocab_parallel_cross_entropy(
    x: torch.Tensor,
    w_local: torch.Tensor,
    targets: torch.Tensor,
    vocab_size: int,
    group=None,
    block_cols: int | None = None,
) -> torch.Tensor:
    """Per-token cross-entropy of ``x @ W_voc`` with W_voc sharded by columns over ``group``.

    x: this rank's own tokens (N x H, N may differ per rank, may be 0); w_local: this rank's
    shard of W_voc (H x V_p, see :func:`shard_bounds`); targets: (N,) int64 in [0, V).
    Returns the per-token loss (N,), differentiable w.r.t. x and w_local. ``block_cols`` splits
    each shard into column blocks of at most that many columns (lower peak, same result).
    """
    if targets.dtype != torch.int64 or targets.shape != (x.shape[0],):
        raise ValueError(
            f"targets must be int64 of shape ({x.shape[0]},), got {targets.dtype} "
            f"{tuple(targets.shape)}"
        )
    if x.shape[0] and (int(targets.min()) < 0 or int(targets.max()) >= vocab_size):
        raise ValueError(f"targets must lie in [0, {vocab_size})")
    if block_cols is not None and block_cols < 1:
        raise ValueError(f"block_cols must be >= 1, got {block_cols}")
    return _VocabParallelCrossEntropy.apply(x, w_local, targets, vocab_size, group, block_cols)


def shard_bytes_per_rank(hidden: int, vocab_size: int, n_shards: int, elem_bytes: int = 4) -> dict:
    """Communication bytes one rank moves per forward+backward (see module docstring)."""
    hv = hidden * vocab_size * elem_bytes
    return {
        "forward_broadcast_bytes": hv,
        "backward_broadcast_bytes": hv,
        "backward_reduce_bytes": hv if n_shards > 1 else 0,
    }


def peak_activation_model_bytes(
    tokens: int, hidden: int, vocab_size: int, n_shards: int, elem_bytes: int = 4
) -> dict:
    """Resident-tensor model of the peak (bytes) for the dense loss and for the sharded one.

    dense (F.cross_entropy on X W): forward keeps the log-softmax output N V (saved for its
    backward); in backward the nll gradient N V and the logits gradient N V are live beside it:
    ~3 N V. sharded (one block per shard, in-place exp): one logit/probability block N V_b, two
    weight shards H V_b (in use + prefetched), the shard gradient H V_b and, while it is being
    reduced, gloo's copy of it: ~N V_b + 4 H V_b.
    """
    v_b = -(-vocab_size // n_shards)
    e = elem_bytes
    return {
        "dense_bytes": 3 * tokens * vocab_size * e,
        "sharded_bytes": (tokens * v_b + 4 * hidden * v_b) * e,
    }
