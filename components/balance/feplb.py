"""FEPLB (FEPLB Sec. 2): static/dynamic experts, the greedy per-micro-batch balancer, buffer
accounting, and Two-Phase Dispatch as an exact MoE layer over real ranks.

Partition: of the E/W experts a device hosts, ``dyn`` are dynamic (eligible to be copied to
another device for one micro-batch), chosen periodically from history ("Router Predictor",
Fig. 3). Balancer: repeatedly copy the busiest dynamic expert (at least tau tokens) of the most
loaded device to the least loaded one, while the copy makes things better; each expert moves at
most once, a device receives at most ``max_num_dyn`` copies, ties break deterministically so
every rank derives the same plan without coordination. ``next_if_unfit=True`` is an alternative
reading kept as a diagnostic (feplb-table3). Buffer: max_num_dyn x W_expert per device.

Two-Phase Dispatch (Sec. 2, Fig. 2): Phase 1 is the unchanged EP all-to-all; after one
all-reduce of the per-expert counts every rank runs the balancer, and Phase 2 sends each moved
expert's rows to its target while its weights are copied asynchronously. Outputs and gradients
equal plain EP (tests/test_feplb.py).

Why: per-micro-batch copies of whole experts even the straggler that a static placement leaves.
Our reading of each rule the text leaves open, stated so it can be checked: see
docs/balancers.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import torch
import torch.distributed as dist

from moe_repro.components.alltoall.flat import all_to_all_v
from moe_repro.components.balance.registry import register_balancer
from moe_repro.components.balance.base import Balancer, BalanceStep, DeviceWork
from moe_repro.components.balance.expert_copy import (
    ExpertCopy,
    ffn_with_weights,
    local_stacks,
    pack_experts,
    unpack_experts,
)
from moe_repro.components.moe.moe_layer import ExpertPlacement, MoELayer
from moe_repro.components.moe.pft import inverse_permutation


@dataclass(frozen=True)
class ExpertPartition:
    """Home placement plus the dynamic experts of each device."""

    placement: ExpertPlacement
    dynamic_of_rank: tuple[tuple[int, ...], ...]

    def __post_init__(self):
        for rank, dyn in enumerate(self.dynamic_of_rank):
            if not set(dyn) <= set(self.placement.experts_of_rank[rank]):
                raise ValueError(f"dynamic experts {dyn} are not all hosted by rank {rank}")

    @classmethod
    def choose(cls, placement: ExpertPlacement, dyn: int, history=None) -> "ExpertPartition":
        """dyn dynamic experts per device: the hottest by ``history`` counts [E], else the last."""
        if dyn < 0:
            raise ValueError(f"dyn must be >= 0, got {dyn}")
        out = []
        for experts in placement.experts_of_rank:
            if dyn > len(experts):
                raise ValueError(f"dyn={dyn} > {len(experts)} experts per device")
            if history is None:
                chosen = list(experts[len(experts) - dyn :])
            else:
                h = torch.as_tensor(history, dtype=torch.float64)
                chosen = sorted(experts, key=lambda e: (-float(h[e]), e))[:dyn]
            out.append(tuple(sorted(chosen)))
        return cls(placement, tuple(out))

    @cached_property
    def layout(self) -> tuple:
        """(E, per-rank (start, stop) spans when every rank holds consecutive experts else None,
        experts per rank, dynamic experts per rank): what greedy_balance needs besides the
        counts, computed once per partition."""
        experts_of_rank = self.placement.experts_of_rank
        consecutive = all(
            experts and list(experts) == list(range(experts[0], experts[-1] + 1))
            for experts in experts_of_rank
        )
        spans = [(e[0], e[-1] + 1) for e in experts_of_rank] if consecutive else None
        dynamic = tuple(tuple(sorted(d)) for d in self.dynamic_of_rank)  # ties: lower id first
        return (self.placement.num_experts, spans, experts_of_rank, dynamic)

    @property
    def dynamic(self) -> set[int]:
        return {e for dyn in self.dynamic_of_rank for e in dyn}


class Move(NamedTuple):
    """One copy: ``expert`` (with its ``tokens`` rows) from device ``src`` to ``dst``. A named
    tuple rather than a frozen dataclass: it is built inside the timed decision, and a frozen
    dataclass's __init__ costs about a microsecond more per move."""

    expert: int
    src: int
    dst: int
    tokens: int


@dataclass
class BalancePlan:
    moves: list[Move]
    loads_before: list[int]
    loads_after: list[int]

    def rank_of_expert(self, placement: ExpertPlacement) -> list[int]:
        ranks = placement.rank_of_expert().tolist()
        for m in self.moves:
            ranks[m.expert] = m.dst
        return ranks


def greedy_balance(
    expert_counts,
    partition: ExpertPartition,
    tau: int = 0,
    max_num_dyn: int | None = None,
    next_if_unfit: bool = False,
) -> BalancePlan:
    """FEPLB's per-micro-batch greedy balancer; see docs/balancers.md for its exact rules
    (``next_if_unfit``: when the busiest dynamic expert does not fit the gap, try the next
    busiest instead of stopping; not the paper's rule, a diagnostic)."""
    # Plain Python on small lists: this runs on the CPU once per micro-batch and layer, and
    # FEPLB Sec. 2 budgets ~50 us for it (suites/feplb_balancer.py and suites/imbalance.py
    # measure it). What does not depend on the counts (the ranks' expert spans, the dynamic
    # lists) is prepared once per partition (ExpertPartition.layout); a device's candidates
    # are sorted only when it is the most loaded one.
    if isinstance(expert_counts, torch.Tensor):
        counts = expert_counts.tolist()
    elif type(expert_counts) is list and set(map(type, expert_counts)) <= {int}:
        counts = expert_counts
    else:
        counts = [int(c) for c in expert_counts]
    num_experts, spans, experts_of_rank, dynamic_of_rank = partition.layout
    if len(counts) != num_experts:
        raise ValueError(f"{len(counts)} counts for {num_experts} experts")
    world = len(dynamic_of_rank)
    if spans is not None:
        loads = [sum(counts[a:b]) for a, b in spans]
    else:
        loads = [sum([counts[e] for e in experts]) for experts in experts_of_rank]
    before = list(loads)
    floor = max(tau, 1)
    candidates: list[list[int] | None] = [None] * world
    received = [0] * world
    cap = max_num_dyn if max_num_dyn is not None else world * num_experts
    moves: list[Move] = []
    while True:
        top = max(loads)
        d_max = loads.index(top)  # lowest index among the most loaded
        low = min(loads)
        d_min = loads.index(low)  # lowest index among the least loaded
        if d_min == d_max:  # every device equal: nothing to gain
            break
        if received[d_min] >= cap:  # the least loaded is full: next one
            d_min, low = -1, None
            for d in range(world):
                if d != d_max and received[d] < cap and (low is None or loads[d] < low):
                    d_min, low = d, loads[d]
            if d_min < 0:
                break
        gap = top - low
        mine = candidates[d_max]
        if mine is None:
            # busiest first; ties: lower expert id (the dynamic tuple is ascending and the sort
            # is stable under reverse=True)
            mine = candidates[d_max] = sorted(
                [e for e in dynamic_of_rank[d_max] if counts[e] >= floor],
                key=counts.__getitem__,
                reverse=True,
            )
        pick = None
        for e in mine:
            if counts[e] < gap:
                pick = e
                break
            if not next_if_unfit:  # Sec. 2 selects the busiest dynamic expert, no other
                break
        if pick is None:
            break
        mine.remove(pick)
        c = counts[pick]
        loads[d_max] -= c
        loads[d_min] += c
        received[d_min] += 1
        moves.append(Move(pick, d_max, d_min, c))
    return BalancePlan(moves, before, loads)


def _replay_plan(step: BalanceStep, knobs: dict) -> DeviceWork:
    """FEPLB on a recorded micro-batch: the dynamic experts re-picked from the previous
    micro-batch's counts (the periodic Router Predictor step, Fig. 3), then the greedy balancer
    on the actual counts; ``decision`` is the BalancePlan."""
    counts = step.counts
    partition = ExpertPartition.choose(step.placement, knobs["dyn"], history=step.previous_counts)
    plan = greedy_balance(
        counts, partition, knobs["tau"], knobs["max_num_dyn"], bool(knobs["next_if_unfit"])
    )
    ranks = plan.rank_of_expert(step.placement)
    groups = [
        [int(counts[e]) for e in range(len(ranks)) if ranks[e] == d]
        for d in range(step.placement.world_size)
    ]
    return DeviceWork(list(plan.loads_after), groups, decision=plan)


register_balancer(
    Balancer(
        name="FEPLB",
        paper="FEPLB Sec. 2",
        description="whole dynamic experts copied from the most to the least loaded device, greedily",
        needs_history=True,
        knobs={"dyn": 4, "tau": 0, "max_num_dyn": 8, "next_if_unfit": 0},  # 0: Sec. 2's rule
        plan=_replay_plan,
    )
)


def weight_buffer_bytes(
    max_num_dyn: int, d_model: int, d_ffn: int, n_mat: int = 3, itemsize: int = 2
) -> int:
    """FEPLB Sec. 2: max_num_dyn x W_expert per device (W_expert = n_mat H F itemsize)."""
    if max_num_dyn < 0:
        raise ValueError("max_num_dyn must be >= 0")
    return max_num_dyn * n_mat * d_model * d_ffn * itemsize


def phase2_bytes(
    plan: BalancePlan, d_model: int, d_ffn: int, n_mat: int = 3, itemsize: int = 2
) -> dict[str, int]:
    """Intra-node bytes of Phase 2 (forward): moved rows there and back, copied weights."""
    rows = sum(m.tokens for m in plan.moves)
    return {
        "token_bytes": 2 * rows * d_model * itemsize,
        "weight_bytes": len(plan.moves) * n_mat * d_model * d_ffn * itemsize,
    }


# --- the layer ----------------------------------------------------------------------------------


@dataclass
class FEPLBStats:
    plan: BalancePlan | None = None
    balance_s: float = 0.0
    copy: ExpertCopy | None = None  # the last Phase 2 weight copy; .overlap() measures it


class FEPLBMoELayer(MoELayer):
    """MoELayer with Two-Phase Dispatch (EP only). ``copy_group``: the process group the weight
    copy runs on (default: a new group over the EP ranks, made collectively in __init__)."""

    def __init__(
        self,
        d_model: int,
        d_ffn: int,
        num_experts: int,
        top_k: int,
        *,
        dyn: int,
        tau: int = 0,
        max_num_dyn: int | None = None,
        copy_group=None,
        **kw,
    ):
        if not kw.get("expert_parallel"):
            raise ValueError("FEPLB balances across EP ranks: expert_parallel=True is required")
        super().__init__(d_model, d_ffn, num_experts, top_k, **kw)
        self.tau, self.max_num_dyn = tau, max_num_dyn
        self.partition = ExpertPartition.choose(self.placement, dyn)
        if copy_group is None:
            ranks = (
                dist.get_process_group_ranks(self.ep_group)
                if self.ep_group is not None
                else list(range(dist.get_world_size()))
            )
            copy_group = dist.new_group(ranks=ranks)
        self.copy_group = copy_group
        self.stats = FEPLBStats()

    def set_dynamic(self, history) -> None:
        """Re-pick the dynamic experts from historical counts (the paper's periodic step)."""
        self.partition = ExpertPartition.choose(
            self.placement, len(self.partition.dynamic_of_rank[0]), history
        )

    def routed(self, x: torch.Tensor, gate_out) -> torch.Tensor:
        pft = self.make_pft(gate_out)
        # Phase 1: the unchanged EP dispatch; rows arrive grouped by local expert.
        expert_in, plan = self.dispatch(x, pft)
        global_counts = pft.tokens_per_expert.clone()
        dist.all_reduce(global_counts, group=self.ep_group)
        t0 = time.perf_counter()
        balance = greedy_balance(global_counts.cpu(), self.partition, self.tau, self.max_num_dyn)
        self.stats.balance_s = time.perf_counter() - t0
        self.stats.plan = balance
        expert_out = self._two_phase_compute(
            expert_in, plan.tokens_per_local_expert.tolist(), global_counts.cpu().tolist(), balance
        )
        return self.combine(expert_out, plan, pft)

    def _two_phase_compute(
        self,
        expert_in: torch.Tensor,
        local_counts: list[int],
        global_counts: list[int],
        balance: BalancePlan,
    ) -> torch.Tensor:
        if not balance.moves:  # the same decision on every rank: all skip Phase 2 together
            self.stats.copy = None
            return self.experts(expert_in, torch.tensor(local_counts))
        me, world = self.ep_rank, self.placement.world_size
        local = self.local_experts
        slot = {e: i for i, e in enumerate(local)}
        starts = [sum(local_counts[:i]) for i in range(len(local))]
        outgoing = sorted(
            (m for m in balance.moves if m.src == me), key=lambda m: (m.dst, m.expert)
        )
        incoming = sorted(
            (m for m in balance.moves if m.dst == me), key=lambda m: (m.src, m.expert)
        )
        moved_out = {m.expert for m in outgoing}

        # Weight copy first, asynchronously on the copy group (overlaps the static compute).
        w_send = [sum(1 for m in outgoing if m.dst == d) for d in range(world)]
        w_recv = [sum(1 for m in incoming if m.src == s) for s in range(world)]
        copy = ExpertCopy(
            pack_experts(self.experts, [slot[m.expert] for m in outgoing]),
            w_send,
            w_recv,
            self.copy_group,
        )

        # Phase 2 tokens: rows of each moved expert from its home to the target.
        def rows_of(e):
            i = slot[e]
            return torch.arange(starts[i], starts[i] + local_counts[i])

        kept_experts = [e for e in local if e not in moved_out]
        kept_idx = torch.cat(
            [rows_of(e) for e in kept_experts] + [torch.zeros(0, dtype=torch.int64)]
        )
        moved_idx = torch.cat(
            [rows_of(m.expert) for m in outgoing] + [torch.zeros(0, dtype=torch.int64)]
        )
        t_send = [
            sum(global_counts[m.expert] for m in outgoing if m.dst == d) for d in range(world)
        ]
        t_recv = [
            sum(global_counts[m.expert] for m in incoming if m.src == s) for s in range(world)
        ]
        device = expert_in.device
        dyn_in = all_to_all_v(
            expert_in.index_select(0, moved_idx.to(device)), t_send, t_recv, group=self.ep_group
        )

        # Static (kept) experts compute while the copy is in flight.
        copy.compute_started()
        kept_out = ffn_with_weights(
            self.experts,
            expert_in.index_select(0, kept_idx.to(device)),
            [local_counts[slot[e]] for e in kept_experts],
            local_stacks(self.experts, [slot[e] for e in kept_experts]),
        )
        copy.compute_finished()
        self.stats.copy = copy
        # Dynamic experts: copied weights, rows from their homes (source-major, expert-sorted).
        copied = copy.wait()
        dyn_out = ffn_with_weights(
            self.experts,
            dyn_in,
            [global_counts[m.expert] for m in incoming],
            unpack_experts(self.experts, copied),
        )
        back = all_to_all_v(dyn_out, t_recv, t_send, group=self.ep_group)
        order = torch.cat([kept_idx, moved_idx]).to(device)
        return torch.cat([kept_out, back]).index_select(0, inverse_permutation(order))
