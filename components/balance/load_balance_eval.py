"""Replay a routing trace through the registered balancers and measure FEPLB's straggler metrics.

For every layer and micro-batch of a :class:`RoutingTrace` whose sources are the EP ranks, each
balancer of the registry (components/balance/__init__.py; "Before LB" is plain EP with experts
at their contiguous homes) gets the micro-batch's counts and the previous micro-batch's
(:class:`.base.BalanceStep`) and returns the rows and expert GEMM groups of every device:
- ``FasterMoE``: shadows chosen from the previous micro-batch's counts (fastermoe_shadow.py);
- ``FEPLB``: dynamic experts re-picked from the previous micro-batch's counts (the periodic
  "Router Predictor" step), then the greedy balancer on the *actual* counts (feplb.py);
- ``LLEP``: the least-loaded plan on the actual counts (least_loaded_ep.py);
- ``EPLB``, ``Piper migration``: a replica plan / Alg. 2 swaps chosen from the previous
  micro-batch, applied to the actual counts (eplb_replication.py, expert_migration.py).
Token straggler = max - mean rows per device; GEMM straggler = max - mean of the per-device
grouped-GEMM time from a :class:`GemmTimeModel` (a roofline *model*, not a measurement).
Micro-batch 0 has no history and is left out of every method's mean, so all average over the
same micro-batches (FEPLB Sec. 3.1: "averaged over the full training run").
"""

from __future__ import annotations

from dataclasses import dataclass

from moe_repro.components.provenance import produced
from moe_repro.components.balance import balancer_names, check_knobs, get_balancer
from moe_repro.components.balance.base import BalanceStep
from moe_repro.components.balance.routing_trace import (
    GemmTimeModel,
    RoutingTrace,
    gemm_straggler,
    token_straggler,
)
from moe_repro.components.moe.moe_layer import ExpertPlacement


@dataclass
class MethodStats:
    token_straggler: float
    gemm_straggler_s: float | None
    samples: int
    gemm_makespan_s: float | None = None  # mean of the slowest device's modelled GEMM time


def evaluate_trace(
    trace: RoutingTrace, *, gemm_model: GemmTimeModel | None = None, methods=None, **knobs
) -> dict[str, MethodStats]:
    """Mean stragglers per balancer. ``methods``: balancer names (default: every registered
    one, in registry order); ``knobs``: balancer knobs by name (e.g. dyn, tau, max_num_dyn,
    max_shadows), each balancer taking the ones it declares and its defaults for the rest."""
    produced("simulated")  # a replay of each balancer on the trace, not a training run
    names = balancer_names() if methods is None else tuple(methods)
    balancers = [get_balancer(name) for name in names]
    check_knobs(knobs)
    placement = ExpertPlacement.contiguous(trace.num_experts, trace.num_sources)
    token: dict[str, list[float]] = {name: [] for name in names}
    gemm: dict[str, list[float]] = {name: [] for name in names}
    makespan: dict[str, list[float]] = {name: [] for name in names}
    for layer in range(trace.num_layers):
        for mb in range(1, trace.num_micro_batches):
            step = BalanceStep(placement, trace.counts[layer, mb], trace.counts[layer, mb - 1])
            for balancer in balancers:
                work = balancer.run(step, knobs)
                token[balancer.name].append(token_straggler(work.loads))
                if gemm_model is not None:
                    times = gemm_model.device_times_s(work.gemm_groups)
                    gemm[balancer.name].append(gemm_straggler(times))
                    makespan[balancer.name].append(max(times))
    out = {}
    for name in names:
        n = len(token[name])
        has = gemm_model is not None
        out[name] = MethodStats(
            sum(token[name]) / n,
            sum(gemm[name]) / n if has else None,
            n,
            sum(makespan[name]) / n if has else None,
        )
    return out
