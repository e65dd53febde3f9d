"""Replay a routing trace through the balancers and measure FEPLB's straggler metrics.

For every layer and micro-batch of a :class:`RoutingTrace` whose sources are the EP ranks:
- ``Before LB``: experts at their contiguous homes (standard EP);
- ``FasterMoE``: shadows chosen from the previous micro-batch's counts (components/balance/fastermoe_shadow.py);
- ``FEPLB``: dynamic experts re-picked from the previous micro-batch's counts (the periodic
  "Router Predictor" step), then the greedy balancer on the *actual* counts (components/balance/feplb.py);
- ``LLEP``: the least-loaded plan on the actual counts (components/balance/least_loaded_ep.py).
Token straggler = max - mean rows per device; GEMM straggler = max - mean of the per-device
grouped-GEMM time from a :class:`GemmTimeModel` (a roofline *model*, not a measurement).
Micro-batch 0 has no history and is left out of every method's mean, so all average over the
same micro-batches (FEPLB Sec. 3.1: "averaged over the full training run").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moe_repro.components.balance.fastermoe_shadow import choose_shadows, shadow_gemm_groups, shadow_loads
from moe_repro.components.balance.feplb import ExpertPartition, greedy_balance
from moe_repro.components.balance.least_loaded_ep import least_loaded_plan
from moe_repro.components.moe.moe_layer import ExpertPlacement
from moe_repro.components.balance.routing_trace import (GemmTimeModel, RoutingTrace, device_loads,
                                                gemm_straggler, token_straggler)

METHODS = ("Before LB", "FasterMoE", "FEPLB", "LLEP")


@dataclass
class MethodStats:
    token_straggler: float
    gemm_straggler_s: float | None
    samples: int
    gemm_makespan_s: float | None = None   # mean of the slowest device's modelled GEMM time


def evaluate_trace(trace: RoutingTrace, *, dyn: int = 4, tau: int = 0, max_num_dyn: int = 8,
                   max_shadows: int = 8, gemm_model: GemmTimeModel | None = None,
                   methods=METHODS) -> dict[str, MethodStats]:
    world, num_experts = trace.num_sources, trace.num_experts
    placement = ExpertPlacement.contiguous(num_experts, world)
    home = placement.rank_of_expert()
    token = {m: [] for m in methods}
    gemm = {m: [] for m in methods}
    makespan = {m: [] for m in methods}
    for layer in range(trace.num_layers):
        for mb in range(1, trace.num_micro_batches):
            src = trace.counts[layer, mb]
            counts = src.sum(0)
            prev_src = trace.counts[layer, mb - 1]
            prev = prev_src.sum(0)
            for method in methods:
                if method == "Before LB":
                    loads = device_loads(counts, home, world)
                    groups = [[int(counts[e]) for e in ex] for ex in placement.experts_of_rank]
                elif method == "FEPLB":
                    partition = ExpertPartition.choose(placement, dyn, history=prev)
                    plan = greedy_balance(counts, partition, tau, max_num_dyn)
                    ranks = plan.rank_of_expert(placement)
                    loads = torch.tensor(plan.loads_after)
                    groups = [[int(counts[e]) for e in range(num_experts) if ranks[e] == d]
                              for d in range(world)]
                elif method == "FasterMoE":
                    shadows = choose_shadows(prev, home, world, max_shadows, prev_src)
                    loads = shadow_loads(counts, home, world, shadows, src)
                    groups = shadow_gemm_groups(src, home, world, shadows)
                elif method == "LLEP":
                    plan = least_loaded_plan(counts, placement)
                    loads = torch.tensor(plan.loads_after)
                    groups = [[s.rows for segs in plan.segments for s in segs if s.rank == d]
                              for d in range(world)]
                else:
                    raise ValueError(f"unknown method {method!r}; known: {', '.join(METHODS)}")
                token[method].append(token_straggler(loads))
                if gemm_model is not None:
                    times = gemm_model.device_times_s(groups)
                    gemm[method].append(gemm_straggler(times))
                    makespan[method].append(max(times))
    out = {}
    for m in methods:
        n = len(token[m])
        has = gemm_model is not None
        out[m] = MethodStats(sum(token[m]) / n, sum(gemm[m]) / n if has else None, n,
                             sum(makespan[m]) / n if has else None)
    return out
