"""Padding-Free Token buffer (PFT), X-MoE Sec. 4.1 and App. B.2, Listing 1.

The gate gives every token k (expert, weight) pairs. Instead of a dense [S, E, C] dispatch
mask, X-MoE keeps three "ERI" arrays over the N <= S*k retained (token, expert) pairs, sorted by
expert so that each expert's tokens form one contiguous segment:

    token_ids[i]          which input row feeds dispatch row i         (int64 [N])
    expert_ids[i]         which expert processes dispatch row i        (int64 [N], ascending)
    tokens_per_expert[e]  length of expert e's segment                 (int64 [E], histogram)
    combine_weights[i]    gate probability applied when row i returns  (float [N])

gather:  dispatch_in[i, :] = x[token_ids[i], :]                         (App. B.4)
scatter: out[token_ids[i], :] += y[i, :] * combine_weights[i]           (App. B.4)

Bytes moved (no padding anywhere): gather reads and writes N*H elements, scatter the same,
against E*C*H for the capacity-padded buffer (components/moe/padded_moe.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PFT:
    """ERI-arrays of one MoE layer's retained (token, expert) pairs, sorted by expert."""

    token_ids: torch.Tensor  # int64 [N]
    expert_ids: torch.Tensor  # int64 [N], ascending
    tokens_per_expert: torch.Tensor  # int64 [E]
    combine_weights: torch.Tensor  # float [N], keeps autograd to the gate
    num_tokens: int  # S, rows of the layer input

    @property
    def num_experts(self) -> int:
        return int(self.tokens_per_expert.numel())

    @property
    def num_rows(self) -> int:
        return int(self.token_ids.numel())


# How a full expert chooses which pairs to keep (the name of each peer semantics it reproduces).
DROP_POLICIES = {
    "probs": "the C largest combine weights per expert, ties to the earlier token (X-MoE App. B.2; "
    "DeepSpeed topkgating drop_policy='probs'; Megatron moe_token_drop_policy='probs')",
    "position": "the first C tokens per expert in token order (DeepSpeed topkgating "
    "drop_policy='position'; Megatron 'position')",
    "slot": "every token's first choice in token order, then second choices, ... (GShard; "
    "DeepSpeed top2gating; this project's padded layer)",
    "random": "C tokens per expert by a uniform random priority torch.rand(S, E) (DeepSpeed "
    "top1gating use_rts=True, 'Random Token Selection')",
}


def build_pft(
    top_experts: torch.Tensor,
    combine_weights: torch.Tensor,
    num_experts: int,
    capacity: int | None = None,
    *,
    drop_policy: str = "probs",
    renormalize: bool = False,
    generator: torch.Generator | None = None,
) -> PFT:
    """Build the PFT from the gate's [S, k] outputs (X-MoE Listing 1, PFT_construction).

    Step 1 flattens top_experts and stable-sorts by expert, so within an expert rows keep
    token order. Step 2 (only when ``capacity`` is given) keeps, per expert, ``capacity`` pairs
    chosen by ``drop_policy`` (DROP_POLICIES). The default "probs" is X-MoE's (App. B.2:
    "select the top max_token_count tokens per expert ... ranked by their respective
    combine_weights"; Listing 1's bare argsort is ascending, which would keep the *lowest*
    weights, so we follow the prose). The cumsum over a one-hot matrix of Listing 1 is replaced
    by the equivalent "position inside the expert's segment" after a priority-ordered stable
    sort: O(S*k) memory instead of O(S*k*E).

    ``renormalize``: divide each token's surviving weights by their sum (clamped at the dtype's
    eps), as DeepSpeed's top2gating and topkgating do after dropping; off by default (X-MoE,
    Megatron, DeepSpeed top1gating keep the gate's weights). ``generator``: for the "random"
    policy; None draws from torch's global generator, as DeepSpeed does.
    """
    if top_experts.dim() != 2:
        raise ValueError(f"top_experts must be [S, k], got shape {tuple(top_experts.shape)}")
    if combine_weights.shape != top_experts.shape:
        raise ValueError(
            f"combine_weights shape {tuple(combine_weights.shape)} != "
            f"top_experts shape {tuple(top_experts.shape)}"
        )
    if num_experts <= 0:
        raise ValueError(f"num_experts must be positive, got {num_experts}")
    if capacity is not None and capacity < 0:
        raise ValueError(f"capacity must be >= 0 or None, got {capacity}")
    if drop_policy not in DROP_POLICIES:
        raise ValueError(
            f"drop_policy must be one of {', '.join(DROP_POLICIES)}, got {drop_policy!r}"
        )
    num_tokens, top_k = top_experts.shape
    flat_experts = top_experts.reshape(-1).long()
    flat_weights = combine_weights.reshape(-1)
    if flat_experts.numel() and (
        int(flat_experts.min()) < 0 or int(flat_experts.max()) >= num_experts
    ):
        raise ValueError(
            f"expert ids must lie in [0, {num_experts}), got range "
            f"[{int(flat_experts.min())}, {int(flat_experts.max())}]"
        )

    if capacity is not None:
        priority = _pairs_by_priority(
            drop_policy, top_experts, flat_weights.detach(), num_experts, generator
        )
        keep = _capacity_keep_mask(flat_experts, priority, num_experts, capacity)
        flat_index = torch.nonzero(keep, as_tuple=False).reshape(-1)
    else:
        flat_index = torch.arange(flat_experts.numel(), device=flat_experts.device)

    # Step 1 (Listing 1 lines 20-22): stable sort of the retained pairs by expert.
    order = torch.argsort(flat_experts[flat_index], stable=True)
    flat_index = flat_index[order]
    expert_ids = flat_experts[flat_index]
    token_ids = torch.div(flat_index, top_k, rounding_mode="floor") if top_k else flat_index
    tokens_per_expert = torch.bincount(expert_ids, minlength=num_experts)
    weights = flat_weights[flat_index]
    if renormalize:
        kept_sum = torch.zeros(num_tokens, dtype=weights.dtype, device=weights.device)
        kept_sum = kept_sum.index_add(0, token_ids, weights)
        denom = torch.clamp(kept_sum, min=torch.finfo(weights.dtype).eps)
        weights = weights / denom.index_select(0, token_ids)
    return PFT(
        token_ids=token_ids,
        expert_ids=expert_ids,
        tokens_per_expert=tokens_per_expert,
        combine_weights=weights,
        num_tokens=int(num_tokens),
    )


def _pairs_by_priority(
    drop_policy: str,
    top_experts: torch.Tensor,
    flat_weights: torch.Tensor,
    num_experts: int,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """Flat pair indices (t * k + j), highest keeping priority first (ties: earlier pair)."""
    num_tokens, top_k = top_experts.shape
    device = top_experts.device
    if drop_policy == "probs":
        return torch.argsort(flat_weights, descending=True, stable=True)
    if drop_policy == "position":  # token order; a token's k pairs go to k different experts
        return torch.arange(num_tokens * top_k, device=device)
    if drop_policy == "slot":  # slot-major: (j, t) order
        return (
            torch.arange(num_tokens * top_k, device=device)
            .reshape(num_tokens, top_k)
            .t()
            .reshape(-1)
        )
    # "random": DeepSpeed draws one uniform per (token, expert) of the [S, E] mask.
    uniform = torch.rand((num_tokens, num_experts), generator=generator).to(device)
    pair_priority = uniform.gather(1, top_experts.long()).reshape(-1)
    return torch.argsort(pair_priority, descending=True, stable=True)


def _capacity_keep_mask(
    flat_experts: torch.Tensor, by_priority: torch.Tensor, num_experts: int, capacity: int
) -> torch.Tensor:
    """True for the pairs that survive: the first ``capacity`` of each expert in priority order."""
    n = flat_experts.numel()
    by_expert_then_priority = by_priority[torch.argsort(flat_experts[by_priority], stable=True)]
    counts = torch.bincount(flat_experts, minlength=num_experts)
    segment_start = torch.cumsum(counts, 0) - counts
    sorted_experts = flat_experts[by_expert_then_priority]
    rank_in_expert = torch.arange(n, device=flat_experts.device) - segment_start[sorted_experts]
    keep = torch.zeros(n, dtype=torch.bool, device=flat_experts.device)
    keep[by_expert_then_priority] = rank_in_expert < capacity
    return keep


# Implementations of the permute (gather) and combine (weighted scatter): "torch" is this
# module's PyTorch ops; "triton" the fused kernels of components/moe/triton_kernels.py (X-MoE
# App. B.4), offered where Triton can run (components/moe/triton_support.py).
PERMUTE_IMPLS = ("torch", "triton")


def _check_impl(impl: str) -> None:
    if impl not in PERMUTE_IMPLS:
        raise ValueError(f"impl must be one of {', '.join(PERMUTE_IMPLS)}, got {impl!r}")


def gather_tokens(x: torch.Tensor, pft: PFT, impl: str = "torch") -> torch.Tensor:
    """dispatch_in[i, :] = x[token_ids[i], :] -> [N, H]; differentiable (index_select)."""
    _check_impl(impl)
    if x.dim() != 2 or x.shape[0] != pft.num_tokens:
        raise ValueError(f"x must be [{pft.num_tokens}, H], got shape {tuple(x.shape)}")
    if impl == "triton":
        from moe_repro.components.moe import triton_support

        triton_support.require_triton(x)  # one line before the kernels' module imports Triton
        from moe_repro.components.moe import triton_kernels

        return triton_kernels.gather_rows(x, pft.token_ids, pft.num_tokens)
    return x.index_select(0, pft.token_ids)


COMBINE_ACCUMULATE = ("float32", "input")


def scatter_combine(
    y: torch.Tensor, pft: PFT, accumulate: str = "float32", impl: str = "torch"
) -> torch.Tensor:
    """out[token_ids[i], :] += y[i, :] * combine_weights[i] -> [S, H].

    Differentiable in y and in combine_weights (so the gate receives its gradient). Tokens
    with every pair dropped come out as zero rows, as in GShard's capacity-padded combine.

    ``accumulate``: "float32" (default) weights and sums bf16/fp16 rows in fp32 and rounds once
    at the end, as Megatron's ``unpermute`` (fp32 router probs promote the product) and
    DeepSpeed's ``_sparse_decode`` do; "input" sums in y's dtype (rounds at every add: 0.46%
    vs 0.33% relative RMS error in bf16 for top-8, issue 19). fp32/fp64 inputs are unaffected.
    ``impl="triton"`` (fused kernel, always fp32 sums) takes accumulate="float32" only.
    """
    _check_impl(impl)
    if y.dim() != 2 or y.shape[0] != pft.num_rows:
        raise ValueError(f"y must be [{pft.num_rows}, H], got shape {tuple(y.shape)}")
    if accumulate not in COMBINE_ACCUMULATE:
        raise ValueError(f"accumulate must be one of {COMBINE_ACCUMULATE}, got {accumulate!r}")
    if impl == "triton":
        if accumulate != "float32":
            raise ValueError("the triton combine sums in float32 (accumulate='float32' only)")
        from moe_repro.components.moe import triton_support

        triton_support.require_triton(y)  # one line before the kernels' module imports Triton
        from moe_repro.components.moe import triton_kernels

        return triton_kernels.combine_rows(y, pft.combine_weights, pft.token_ids, pft.num_tokens)
    low_precision = y.dtype in (torch.bfloat16, torch.float16)
    acc_dtype = torch.float32 if accumulate == "float32" and low_precision else y.dtype
    return _WeightedScatter.apply(y, pft.combine_weights, pft.token_ids, pft.num_tokens, acc_dtype)


# The combine weights rows in chunks of about this many bytes: its transient buffer.
_COMBINE_CHUNK_BYTES = 1 << 20


class _WeightedScatter(torch.autograd.Function):
    """out[token_ids[i]] += y[i] * w[i], keeping only y, w and token_ids for backward.

    Why not ``zeros.index_add(0, ids, y * w[:, None])``: autograd then also saves the weighted
    product (index_add keeps its source), a second [N, H] buffer on top of A_combine = y, and
    the forward materialises it whole. X-MoE fuses the weighting into its scatter kernel
    (App. B.4); here the weighting is done in row chunks, so the combine holds A_combine once
    (X-MoE Table 2) and its transient is about _COMBINE_CHUNK_BYTES (plus, for fp32
    accumulation of bf16 rows, one [S, H] fp32 sum).
    Products and sums are taken in ``acc_dtype``; the result and dy come back in y's dtype, dw
    in the weights' dtype. Backward: g = grad_out[token_ids]; dy = g * w; dw = rowwise <g, y>."""

    @staticmethod
    def forward(ctx, y, weights, token_ids, num_tokens, acc_dtype):
        out = torch.zeros((num_tokens, y.shape[1]), dtype=acc_dtype, device=y.device)
        itemsize = max(y.element_size(), out.element_size())
        chunk = max(1, _COMBINE_CHUNK_BYTES // max(1, y.shape[1] * itemsize))
        for start in range(0, y.shape[0], chunk):
            rows = slice(start, start + chunk)
            out.index_add_(
                0, token_ids[rows], y[rows].to(acc_dtype) * weights[rows].to(acc_dtype).unsqueeze(1)
            )
        ctx.save_for_backward(y, weights, token_ids)
        ctx.acc_dtype = acc_dtype
        return out.to(y.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        y, weights, token_ids = ctx.saved_tensors
        acc = ctx.acc_dtype
        g = grad_out.index_select(0, token_ids).to(acc)
        grad_y = (g * weights.to(acc).unsqueeze(1)).to(y.dtype) if ctx.needs_input_grad[0] else None
        grad_w = (g * y.to(acc)).sum(1).to(weights.dtype) if ctx.needs_input_grad[1] else None
        return grad_y, grad_w, None, None, None


def inverse_permutation(order: torch.Tensor) -> torch.Tensor:
    """``inverse[order[i]] = i``: undoes ``index_select(0, order)`` (rows back where they were)."""
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return inverse
