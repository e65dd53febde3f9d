"""Least-Loaded Expert Parallelism (LLEP; MoP Sec. 3.3, recapping Nguyen et al.).

MoP Sec. 3.3: "at every MoE call it measures per-rank token load, migrates excess tokens from
overloaded ranks to underloaded ones, and ships the corresponding expert parameters along with
the migrated tokens so that the receiving rank can compute the expert feed-forward locally.
LLEP preserves model semantics (it permutes the placement of compute, not the assignment of
tokens to experts), supports backward gradient propagation." Unlike FEPLB it splits an
expert's tokens (token-level), so one expert may run on several ranks in one call.

The plan (our reading; MoP does not print the algorithm): capacity C = ceil(alpha * N / W) rows
per rank (N rows in the EP group). Ranks at or under C keep all their experts. Each overloaded
rank, busiest first, keeps its experts (busiest first) up to C and sends each expert's excess to
the currently least-loaded other rank, filling it up to C; a remainder smaller than
``min_chunk`` rows, or with no rank left under C, stays home. Deterministic (ties: lowest
index), so every rank derives it from the all-gathered counts.

Execution: one all-to-all-v sends every (token, expert) row straight from its source to the
rank that computes it (segments of an expert's rows are taken in source-major order), the
weights of every shipped expert go home -> helper with expert_copy.ExpertCopy (gradients return
home), and the reverse all-to-all-v brings results back. Plain EP is the special case where
every expert has one segment on its home.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

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
class Segment:
    expert: int
    rank: int  # where these rows are computed
    start: int  # first row (of the expert's rows, source-major over the EP group)
    rows: int


@dataclass
class LLEPPlan:
    segments: list[list[Segment]]  # per expert, home's segment first
    home: list[int]
    loads_before: list[int]
    loads_after: list[int]

    def foreign_segments(self) -> list[Segment]:
        return [s for segs in self.segments for s in segs if s.rank != self.home[s.expert]]


def least_loaded_plan(
    expert_counts, placement: ExpertPlacement, alpha: float = 1.0, min_chunk: int = 1
) -> LLEPPlan:
    counts = [int(c) for c in torch.as_tensor(expert_counts).tolist()]
    if len(counts) != placement.num_experts:
        raise ValueError(f"{len(counts)} counts for {placement.num_experts} experts")
    if alpha < 1.0 or min_chunk < 1:
        raise ValueError("need alpha >= 1 and min_chunk >= 1")
    world = placement.world_size
    home = placement.rank_of_expert().tolist()
    before = [sum(counts[e] for e in ex) for ex in placement.experts_of_rank]
    cap = math.ceil(alpha * sum(counts) / world)
    assigned = [b if b <= cap else 0 for b in before]
    share: list[dict[int, int]] = [
        {home[e]: counts[e]} if counts[e] else {} for e in range(len(counts))
    ]
    overloaded = sorted((d for d in range(world) if before[d] > cap), key=lambda d: (-before[d], d))
    for d in overloaded:
        for e in sorted(placement.experts_of_rank[d], key=lambda e: (-counts[e], e)):
            keep = min(counts[e], max(0, cap - assigned[d]))
            rest, parts = counts[e] - keep, {d: keep} if keep else {}
            assigned[d] += keep
            while rest:
                t = min(
                    (r for r in range(world) if r != d),
                    key=lambda r: (assigned[r], r),
                    default=None,
                )
                room = 0 if t is None else cap - assigned[t]
                if t is None or rest < min_chunk or room < min(min_chunk, rest):
                    parts[d] = parts.get(d, 0) + rest  # nobody can take it: it stays home
                    assigned[d] += rest
                    break
                chunk = min(rest, room)
                parts[t] = parts.get(t, 0) + chunk
                assigned[t] += chunk
                rest -= chunk
            share[e] = parts
    segments = []
    for e, parts in enumerate(share):
        order = sorted(parts, key=lambda r: (r != home[e], r))
        segs, start = [], 0
        for r in order:
            if parts[r]:
                segs.append(Segment(e, r, start, parts[r]))
                start += parts[r]
        segments.append(segs)
    after = [0] * world
    for segs in segments:
        for s in segs:
            after[s.rank] += s.rows
    return LLEPPlan(segments, home, before, after)


def _replay_plan(step: BalanceStep, knobs: dict) -> DeviceWork:
    """The least-loaded plan on the actual counts: each segment of an expert is one GEMM group
    on the rank computing it; ``decision`` is the LLEPPlan."""
    plan = least_loaded_plan(step.counts, step.placement, knobs["alpha"], knobs["min_chunk"])
    groups = [
        [s.rows for segs in plan.segments for s in segs if s.rank == d]
        for d in range(step.placement.world_size)
    ]
    return DeviceWork(list(plan.loads_after), groups, decision=plan)


register_balancer(
    Balancer(
        name="LLEP",
        paper="MoP Sec. 3.3 (least-loaded EP, Nguyen et al.)",
        description="each overloaded rank's excess rows, split token-level, to the least-loaded ranks",
        needs_history=False,
        knobs={"alpha": 1.0, "min_chunk": 1},
        plan=_replay_plan,
    )
)


def _overlap(a0: int, a1: int, b0: int, b1: int) -> int:
    return max(0, min(a1, b1) - max(a0, b0))


class LeastLoadedMoELayer(MoELayer):
    """MoELayer whose experts run where LLEP's plan puts them (EP only)."""

    def __init__(
        self,
        d_model: int,
        d_ffn: int,
        num_experts: int,
        top_k: int,
        *,
        alpha: float = 1.0,
        min_chunk: int = 1,
        copy_group=None,
        **kw,
    ):
        if not kw.get("expert_parallel"):
            raise ValueError("least-loaded EP needs expert_parallel=True")
        super().__init__(d_model, d_ffn, num_experts, top_k, **kw)
        self.alpha, self.min_chunk, self.copy_group = alpha, min_chunk, copy_group
        self.last_plan: LLEPPlan | None = None

    def routed(self, x: torch.Tensor, gate_out) -> torch.Tensor:
        pft = self.make_pft(gate_out)
        rows = self.buffer_dispatch(x, pft)
        world, me, E = self.placement.world_size, self.ep_rank, self.num_experts
        c = self.dispatcher.expert_counts_from_each_rank(pft.tokens_per_expert)  # [W][E]
        totals = [sum(c[s][e] for s in range(world)) for e in range(E)]
        plan = least_loaded_plan(totals, self.placement, self.alpha, self.min_chunk)
        self.last_plan = plan
        offset = [[sum(c[q][e] for q in range(s)) for e in range(E)] for s in range(world)]

        # Destination of each of my rows: the segment holding its source-major position.
        dest = torch.empty(pft.num_rows, dtype=torch.int64)
        start = 0
        for e in range(E):
            n = c[me][e]
            pos = torch.arange(n) + offset[me][e]
            for s in plan.segments[e]:
                dest[start : start + n][(pos >= s.start) & (pos < s.start + s.rows)] = s.rank
            start += n
        send_order = torch.argsort(dest, stable=True)
        send_counts = torch.bincount(dest, minlength=world).tolist()
        # What I receive: from each source, its rows of each expert inside my segments.
        mine = {s.expert: s for segs in plan.segments for s in segs if s.rank == me}
        work = sorted(mine)
        expert_of_row, recv_counts = [], []
        for src in range(world):
            got = 0
            for e in work:
                n = _overlap(
                    offset[src][e],
                    offset[src][e] + c[src][e],
                    mine[e].start,
                    mine[e].start + mine[e].rows,
                )
                expert_of_row += [e] * n
                got += n
            recv_counts.append(got)
        device = rows.device
        received = all_to_all_v(
            rows.index_select(0, send_order.to(device)),
            send_counts,
            recv_counts,
            group=self.ep_group,
        )
        expert_order = torch.argsort(torch.tensor(expert_of_row, dtype=torch.int64), stable=True)

        # Weights of shipped experts: home -> helper (gradients come back home).
        outgoing = sorted(
            ((s.rank, s.expert) for s in plan.foreign_segments() if plan.home[s.expert] == me)
        )
        incoming = sorted(
            ((plan.home[s.expert], s.expert) for s in plan.foreign_segments() if s.rank == me)
        )
        slot = {e: i for i, e in enumerate(self.local_experts)}
        group = self.copy_group if self.copy_group is not None else self.ep_group
        copy = ExpertCopy(
            pack_experts(self.experts, [slot[e] for _, e in outgoing]),
            [sum(1 for d, _ in outgoing if d == r) for r in range(world)],
            [sum(1 for s, _ in incoming if s == r) for r in range(world)],
            group,
        )
        own = [e for e in work if plan.home[e] == me]
        own_stacks = local_stacks(self.experts, [slot[e] for e in own])
        foreign_stacks = unpack_experts(self.experts, copy.wait())
        # Stacks in work order (ascending expert id): own experts, then foreign by (home, id).
        listed = own + [e for _, e in incoming]
        pick = torch.tensor([listed.index(e) for e in work], dtype=torch.int64)
        stacks = [
            torch.cat([a, b]).index_select(0, pick.to(a.device))
            for a, b in zip(own_stacks, foreign_stacks)
        ]
        out = ffn_with_weights(
            self.experts,
            received.index_select(0, expert_order.to(device)),
            [mine[e].rows for e in work],
            stacks,
        )
        out = out.index_select(0, inverse_permutation(expert_order).to(device))
        back = all_to_all_v(out, recv_counts, send_counts, group=self.ep_group)
        back = back.index_select(0, inverse_permutation(send_order).to(device))
        return self.buffer_combine(back, pft)
