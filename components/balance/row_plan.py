"""Where each row is computed under a balancer's decision, and the exact oracle on it.

A balancer's :class:`.base.DeviceWork` gives each device's row total and GEMM groups; its
``decision`` (FEPLB's moves, FasterMoE's shadows, LLEP's segments, EPLB's replica plan, Piper's
swaps) says which rows go where. :func:`rows_to_devices` turns the decision into one tensor,

    rows[s, e, d] = rows of expert e from source rank s computed on device d   (int64 [W, E, W])

the dispatch plan a real all-to-all executes (suites/imbalance.py runs it over real ranks).
Splits of one expert's rows follow the order the method states: source-major (all of rank 0's
rows of e, then rank 1's, ...) over the expert's segments (LLEP) or its replicas in GPU order
(EPLB's split_rows: c // r each, the first c % r replicas one more).

:func:`count_wrong` is the exact oracle (every token-expert row computed once, on a device the
balancer's own work accounts for): it counts (source, expert) pairs whose rows are not computed
exactly once, devices whose rows differ from ``work.loads``, and devices whose expert GEMM
groups differ from ``work.gemm_groups``. 0 means the decision and the work agree.
"""

from __future__ import annotations

import torch

from moe_repro.components.balance.base import BalanceStep, DeviceWork
from moe_repro.components.balance.eplb_replication import ReplicaPlan
from moe_repro.components.balance.feplb import BalancePlan
from moe_repro.components.balance.least_loaded_ep import LLEPPlan


def _split_in_order(
    source_rows: list[int], pieces: list[tuple[int, int]], world: int
) -> list[list[int]]:
    """Rows of one expert from each source, laid source-major, cut into ``pieces`` (device,
    rows) in order: [W_src][W_dst]."""
    out = [[0] * world for _ in source_rows]
    s, left = 0, (source_rows[0] if source_rows else 0)
    for device, rows in pieces:
        while rows:
            while left == 0:
                s += 1
                left = source_rows[s]
            take = min(rows, left)
            out[s][device] += take
            rows -= take
            left -= take
    return out


def rows_to_devices(balancer: str, step: BalanceStep, work: DeviceWork) -> torch.Tensor:
    """``rows[s, e, d]`` (module docstring) for a registered balancer's decision."""
    placement = step.placement
    world, experts = placement.world_size, placement.num_experts
    src = step.source_counts
    home = placement.rank_of_expert().tolist()
    rows = torch.zeros(world, experts, world, dtype=torch.int64)
    decision = work.decision

    def whole(rank_of_expert):
        for e, d in enumerate(rank_of_expert):
            rows[:, e, d] = src[:, e]

    if balancer == "Before LB":
        whole(home)
    elif balancer == "FEPLB":
        if not isinstance(decision, BalancePlan):
            raise TypeError("FEPLB's decision must be a BalancePlan")
        whole(decision.rank_of_expert(placement))
    elif balancer == "Piper migration":
        ranks = list(home)
        for swap in decision:  # Alg. 2's swaps, in order
            ranks[swap.expert_a], ranks[swap.expert_b] = swap.group_b, swap.group_a
        whole(ranks)
    elif balancer == "FasterMoE":
        whole(home)
        for e in decision:  # a shadowed expert's rows stay on their source
            rows[:, e, :] = 0
            rows[torch.arange(world), e, torch.arange(world)] = src[:, e]
    elif balancer == "LLEP":
        if not isinstance(decision, LLEPPlan):
            raise TypeError("LLEP's decision must be an LLEPPlan")
        for e, segs in enumerate(decision.segments):
            pieces = [(sg.rank, sg.rows) for sg in sorted(segs, key=lambda sg: sg.start)]
            rows[:, e, :] = torch.tensor(_split_in_order(src[:, e].tolist(), pieces, world))
    elif balancer == "EPLB":
        if not isinstance(decision, ReplicaPlan):
            raise TypeError("EPLB's decision must be a ReplicaPlan")
        counts = src.sum(0).tolist()
        replica_rows: list[list[tuple[int, int]]] = [[] for _ in range(experts)]
        seen = [0] * experts
        for gpu, slots in enumerate(decision.experts_of_gpu):
            for e in slots:
                r = decision.replicas[e]
                replica_rows[e].append(
                    (gpu, counts[e] // r + (1 if seen[e] < counts[e] % r else 0))
                )
                seen[e] += 1
        for e in range(experts):
            rows[:, e, :] = torch.tensor(
                _split_in_order(src[:, e].tolist(), replica_rows[e], world)
            )
    else:
        raise ValueError(
            f"no row plan for balancer {balancer!r}: add its decision to row_plan.rows_to_devices"
        )
    return rows


def count_wrong(step: BalanceStep, work: DeviceWork, rows: torch.Tensor) -> int:
    """The exact oracle (module docstring): 0 when every row is computed once and the work
    the balancer reported is the work its decision makes."""
    wrong = int((rows.sum(2) != step.source_counts).sum())
    per_device = rows.sum((0, 1)).tolist()
    wrong += sum(int(a != b) for a, b in zip(per_device, work.loads))
    per_expert = rows.sum(0)  # [E, W]
    for d, groups in enumerate(work.gemm_groups):
        mine = sorted(int(r) for r in per_expert[:, d].tolist() if r)
        wrong += int(mine != sorted(int(g) for g in groups if g))
    return wrong


def weight_copies(rows: torch.Tensor, home: list[int]) -> int:
    """(expert, device) pairs where a device computes rows of an expert it is not home to:
    the expert weights that must be on that device besides its home."""
    computes = rows.sum(0) > 0  # [E, W]
    return sum(
        int(computes[e, d])
        for e in range(rows.shape[1])
        for d in range(rows.shape[2])
        if d != home[e]
    )
