"""FasterMoE shadow experts (He et al., PPoPP'22), as FEPLB re-implements it as a baseline
(FEPLB Sec. 1, 3.1): hot experts, *predicted from history*, are replicated ("shadowed") on every
device of the EP group, so each device computes its own tokens of a shadowed expert locally;
pipe = 1 dispatches in one bulk all-to-all, pipe = 2 pipelines dispatch with compute in stages.

What we implement (our reading, stated so it can be checked; FEPLB gives no algorithm):
- prediction: the previous micro-batch's per-expert counts of the same layer (history);
- selection: shadow the predicted-hottest experts one by one while that makes the *predicted*
  most loaded device lighter, at most ``max_shadows`` (the same weight-buffer budget as FEPLB's
  max_num_dyn), then evaluate on the *actual* counts;
- a shadowed expert's rows are split over all devices (its GEMM becomes W small GEMMs, the
  grouped-GEMM cost FEPLB Sec. 1 names).

EP volume (feplb-fig4): a bulk backend (DeepEP) sends each token once to each destination rank
that holds any of its experts (deduplicated). Pipelining with ``pipe`` stages dispatches each
rank's experts in ``pipe`` groups, one stage at a time, so a token whose experts on one rank lie
in different groups is sent once per group: that is the "additional communication volume on top
of DeepEP" of FEPLB Sec. 3.3, counted here row by row from the per-token routing. A shadowed
expert's rows stay on their source (no EP traffic); its weights move on the copy path instead
(n_mat H F itemsize bytes to each of W - 1 devices).
"""

from __future__ import annotations

import torch

from moe_repro.components.balance.registry import register_balancer
from moe_repro.components.balance.base import Balancer, BalanceStep, DeviceWork


def choose_shadows(
    predicted_counts, rank_of_expert, world: int, max_shadows: int, predicted_source_counts=None
) -> list[int]:
    """Greedy history-based shadow selection (see the module docstring)."""
    pred = torch.as_tensor(predicted_counts, dtype=torch.int64)
    ranks = torch.as_tensor(rank_of_expert, dtype=torch.int64)
    if predicted_source_counts is None:  # tokens assumed to come evenly from every source
        per_source = pred.unsqueeze(0).double().expand(world, -1) / world
    else:
        per_source = torch.as_tensor(predicted_source_counts, dtype=torch.float64)
    shadows: list[int] = []
    best = float(shadow_loads(pred, ranks, world, shadows, per_source).max())
    for e in sorted(range(pred.numel()), key=lambda e: (-int(pred[e]), e)):
        if len(shadows) >= max_shadows or pred[e] == 0:
            break
        trial = float(shadow_loads(pred, ranks, world, shadows + [e], per_source).max())
        if trial >= best:
            break
        shadows.append(e)
        best = trial
    return sorted(shadows)


def shadow_loads(
    expert_counts, rank_of_expert, world: int, shadows: list[int], source_counts
) -> torch.Tensor:
    """Rows per device: home experts that are not shadowed, plus each source's own rows of the
    shadowed ones. ``source_counts`` [W, E]."""
    counts = torch.as_tensor(expert_counts).double()
    src = torch.as_tensor(source_counts).double()
    mask = torch.ones(counts.numel(), dtype=torch.bool)
    mask[list(shadows)] = False
    ranks = torch.as_tensor(rank_of_expert, dtype=torch.int64)
    loads = torch.zeros(world, dtype=torch.float64).index_add_(0, ranks[mask], counts[mask])
    if shadows:
        loads += src[:, list(shadows)].sum(1)
    return loads


def shadow_gemm_groups(
    source_counts, rank_of_expert, world: int, shadows: list[int]
) -> list[list[int]]:
    """Row counts of the expert GEMMs each device runs (a shadow is one small group per device)."""
    src = torch.as_tensor(source_counts, dtype=torch.int64)
    totals = src.sum(0)
    groups: list[list[int]] = [[] for _ in range(world)]
    shadow_set = set(shadows)
    for e, r in enumerate(torch.as_tensor(rank_of_expert).tolist()):
        if e in shadow_set:
            for d in range(world):
                groups[d].append(int(src[d, e]))
        else:
            groups[r].append(int(totals[e]))
    return groups


def dispatch_rows_per_pair(
    top_experts: torch.Tensor,
    source_of_token: torch.Tensor,
    rank_of_expert,
    world: int,
    pipe: int = 1,
    shadows=(),
    experts_per_rank: int | None = None,
) -> torch.Tensor:
    """Rows a deduplicating bulk dispatch with ``pipe`` stages sends, per (stage, source rank,
    destination rank): int64 [pipe, world, world], zero on the diagonal (a row for a local
    expert does not travel).

    A token goes once to each (destination rank, stage) holding one of its non-shadowed
    experts, where stage = (local index of the expert on its rank) * pipe // experts_per_rank.
    Combine sends the same rows back, so its volume is the same.
    """
    if pipe < 1:
        raise ValueError(f"pipe must be >= 1, got {pipe}")
    ranks = torch.as_tensor(rank_of_expert, dtype=torch.int64)
    num_experts = ranks.numel()
    per = experts_per_rank or num_experts // world
    local_index = torch.zeros(num_experts, dtype=torch.int64)
    for r in range(world):
        members = (ranks == r).nonzero().flatten()
        local_index[members] = torch.arange(members.numel())
    stage = (local_index * pipe // per)[top_experts]
    dest = ranks[top_experts]
    src = source_of_token.to(torch.int64).unsqueeze(1).expand_as(top_experts)
    keep = dest != src
    if shadows:
        keep &= ~torch.isin(top_experts, torch.as_tensor(list(shadows), dtype=torch.int64))
    token = torch.arange(top_experts.shape[0]).unsqueeze(1).expand_as(top_experts)
    unique = torch.unique(((token * world + dest) * pipe + stage)[keep])
    u_stage = unique % pipe
    u_dest = (unique // pipe) % world
    u_src = source_of_token.to(torch.int64)[unique // pipe // world]
    flat = (u_stage * world + u_src) * world + u_dest
    return torch.bincount(flat, minlength=pipe * world * world).reshape(pipe, world, world)


def dispatch_rows(
    top_experts: torch.Tensor,
    source_of_token: torch.Tensor,
    rank_of_expert,
    world: int,
    pipe: int = 1,
    shadows=(),
    experts_per_rank: int | None = None,
) -> int:
    """Rows sent to *remote* ranks by a deduplicating bulk dispatch with ``pipe`` stages: the
    sum of :func:`dispatch_rows_per_pair` (its docstring states the rule)."""
    return int(
        dispatch_rows_per_pair(
            top_experts, source_of_token, rank_of_expert, world, pipe, shadows, experts_per_rank
        ).sum()
    )


def _replay_plan(step: BalanceStep, knobs: dict) -> DeviceWork:
    """Shadows chosen from the previous micro-batch, then each device's rows and GEMM groups on
    the actual counts; ``decision`` is the shadow list."""
    home = step.placement.rank_of_expert()
    world = step.placement.world_size
    shadows = choose_shadows(
        step.previous_counts, home, world, knobs["max_shadows"], step.previous_source_counts
    )
    loads = shadow_loads(step.counts, home, world, shadows, step.source_counts)
    groups = shadow_gemm_groups(step.source_counts, home, world, shadows)
    return DeviceWork([int(v) for v in loads.tolist()], groups, decision=shadows)


register_balancer(
    Balancer(
        name="FasterMoE",
        paper="FasterMoE (PPoPP'22), as FEPLB Sec. 3.1 re-implements it",
        description="hot experts, predicted from the previous micro-batch, shadowed on every device",
        needs_history=True,
        knobs={"max_shadows": 8},
        plan=_replay_plan,
    )
)
