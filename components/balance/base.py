"""The load-balancer interface: what one balancing method makes of one micro-batch of one layer.

A balancer is given a :class:`BalanceStep` (the home placement, i.e. the ExpertPlacement mapping
each expert to its EP rank; the micro-batch's rows per source rank and expert; and, for methods
that plan from history, the previous micro-batch's) and its knobs, and returns
:class:`DeviceWork`: the rows each device computes and the row counts of the expert GEMMs each
device runs. Those two are what FEPLB's straggler metrics need (FEPLB Sec. 3.1: the token
straggler from the rows, the GEMM straggler from the groups through a GEMM time model), so
components/balance/load_balance_eval.py replays a trace through every registered balancer alike.

Two kinds of method share this one interface:
- per-micro-batch balancers decide on the actual counts, possibly helped by history: FEPLB
  (dynamic experts picked from history, greedy moves on the actual counts), FasterMoE (shadows
  predicted from history), LLEP (actual counts only);
- placement-changing balancers (EPLB replication, Piper Alg. 2 migration) choose a new
  placement from history alone; their work for a micro-batch is that placement's work on the
  actual counts. In a replay they re-plan from the previous micro-batch at every micro-batch.

Moving weights is not charged in DeviceWork for any method (FEPLB's and FasterMoE's copies,
EPLB's and Piper's moves alike): it measures balance, not cost. The costs have their own models
(feplb.phase2_bytes, expert_migration.MigrationScheduler, migration_cost).

``Before LB`` (plain EP: every expert on its home, no balancing) is defined here, with the
interface, as the baseline every table compares against.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from moe_repro.components.moe.moe_layer import ExpertPlacement


@dataclass(frozen=True)
class BalanceStep:
    """One micro-batch of one layer, as a balancer sees it. The sources are the EP ranks."""

    placement: ExpertPlacement  # home: expert -> EP rank
    source_counts: torch.Tensor  # int64 [W, E] rows per (source rank, expert)
    previous_source_counts: torch.Tensor | None = None  # the same for the previous micro-batch

    def __post_init__(self):
        shape = [self.placement.world_size, self.placement.num_experts]
        for name in ("source_counts", "previous_source_counts"):
            value = getattr(self, name)
            if value is None:
                continue
            counts = torch.as_tensor(value, dtype=torch.int64)
            if list(counts.shape) != shape:
                raise ValueError(
                    f"{name} must be [ranks, experts] = {shape}, got {list(counts.shape)}"
                )
            object.__setattr__(self, name, counts)

    @property
    def counts(self) -> torch.Tensor:
        """Rows per expert in this micro-batch, int64 [E]."""
        return self.source_counts.sum(0)

    @property
    def previous_counts(self) -> torch.Tensor | None:
        if self.previous_source_counts is None:
            return None
        return self.previous_source_counts.sum(0)


@dataclass
class DeviceWork:
    """What each device computes in one micro-batch under a balancer's plan."""

    loads: list[int]  # rows computed per device [W]
    gemm_groups: list[list[int]]  # per device: the row count of each expert GEMM it runs
    decision: Any = None  # the method's own plan (moves, shadows, segments, ...)


@dataclass(frozen=True)
class Balancer:
    """One load-balancing method. ``plan(step, knobs)`` gets every knob this balancer declares
    (its default unless the caller gave one by that name) and returns the step's DeviceWork."""

    name: str  # the label tables and the CLI show, e.g. "FEPLB"
    paper: str  # where the algorithm comes from, e.g. "FEPLB Sec. 2"
    description: str  # one line
    needs_history: bool  # plans from the previous micro-batch's counts
    plan: Callable[[BalanceStep, dict], DeviceWork]
    knobs: Mapping[str, int | float] = field(default_factory=dict)  # knob name -> default

    def run(self, step: BalanceStep, knobs: Mapping[str, Any] | None = None) -> DeviceWork:
        """``plan`` with this balancer's knobs taken from ``knobs`` (names it does not declare
        are ignored, so one set of knobs can drive several balancers)."""
        if self.needs_history and step.previous_source_counts is None:
            raise ValueError(
                f"{self.name} plans from history: give the previous micro-batch's counts"
            )
        given = knobs or {}
        work = self.plan(step, {k: given.get(k, default) for k, default in self.knobs.items()})
        world = step.placement.world_size
        if len(work.loads) != world or len(work.gemm_groups) != world:
            raise ValueError(
                f"{self.name} returned work for {len(work.loads)} devices, not {world}"
            )
        return work


def work_of_placement(counts, experts_of_rank) -> DeviceWork:
    """Every expert computed whole on the one device that holds it: each device's rows and its
    GEMM groups in the order it lists its experts."""
    rows = [int(c) for c in torch.as_tensor(counts).tolist()]
    groups = [[rows[e] for e in experts] for experts in experts_of_rank]
    return DeviceWork([sum(g) for g in groups], groups)


def _plain_ep(step: BalanceStep, knobs: dict) -> DeviceWork:
    return work_of_placement(step.counts, step.placement.experts_of_rank)


PLAIN_EP = Balancer(
    name="Before LB",
    paper="FEPLB Sec. 3.1 (baseline)",
    description="plain expert parallelism: every expert on its home rank, no balancing",
    needs_history=False,
    plan=_plain_ep,
)
