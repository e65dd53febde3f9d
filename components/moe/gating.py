"""Top-k gating without a dense [S, E, C] mask (X-MoE Listing 1 lines 1-8, App. B.3 "Gating").

The gate projects tokens [S, H] to logits [S, E], scores them and keeps each token's k best
experts. It returns only ``top_experts`` and ``combine_weights`` (both [S, k]); the PFT
(components/moe/pft.py) is built from them, so no [S, E, C] dispatch mask ever exists on this path.

Scores
- ``softmax``: probabilities over all E experts, then top-k (GShard / DeepSpeed-MoE / X-MoE).
  The top-k weights are used as they are unless ``normalize`` is set.
- ``sigmoid``: independent per-expert affinities, then top-k, normalised to sum to 1 over the
  chosen k (DeepSeek-V3's router).

Shared experts (DeepSeek-MoE) see every token and need no routing; the MoE layer adds them as a
dense FFN beside the routed experts (components/moe/moe_layer.py), so the gate does not list them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

SCORE_FUNCTIONS = ("softmax", "sigmoid")


@dataclass
class GateOutput:
    top_experts: torch.Tensor  # int64 [S, k], each token's experts, best first
    combine_weights: torch.Tensor  # float [S, k], the matching weights (differentiable)
    scores: torch.Tensor  # float [S, E], all scores (for load-balancing losses)


def top_k_gating(
    logits: torch.Tensor, top_k: int, score: str = "softmax", normalize: bool | None = None
) -> GateOutput:
    """Score [S, E] logits and keep the top-k experts per token.

    ``normalize`` (rescale the k weights to sum to 1) defaults to False for softmax and True for
    sigmoid, the conventions of GShard and DeepSeek-V3 respectively.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [S, E], got shape {tuple(logits.shape)}")
    num_experts = logits.shape[1]
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must be in [1, {num_experts}], got {top_k}")
    if score not in SCORE_FUNCTIONS:
        raise ValueError(f"score must be one of {SCORE_FUNCTIONS}, got {score!r}")
    if normalize is None:
        normalize = score == "sigmoid"
    # Score in fp32 whatever the activations' dtype: the routing decision should not depend on
    # bf16 rounding of the logits' exponentials.
    logits32 = logits.float()
    scores = torch.softmax(logits32, dim=-1) if score == "softmax" else torch.sigmoid(logits32)
    weights, experts = torch.topk(scores, top_k, dim=-1, sorted=True)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return GateOutput(top_experts=experts, combine_weights=weights, scores=scores)


class TopKGate(nn.Module):
    """Linear router W_g [H, E] followed by :func:`top_k_gating`."""

    def __init__(
        self,
        d_model: int,
        num_experts: int,
        top_k: int,
        score: str = "softmax",
        normalize: bool | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        if score not in SCORE_FUNCTIONS:
            raise ValueError(f"score must be one of {SCORE_FUNCTIONS}, got {score!r}")
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k must be in [1, {num_experts}], got {top_k}")
        self.num_experts, self.top_k, self.score, self.normalize = (
            num_experts,
            top_k,
            score,
            normalize,
        )
        self.weight = nn.Parameter(torch.empty(d_model, num_experts, dtype=dtype, device=device))
        nn.init.normal_(self.weight, std=d_model**-0.5)

    def forward(self, x: torch.Tensor) -> GateOutput:
        return top_k_gating(x @ self.weight, self.top_k, self.score, self.normalize)
