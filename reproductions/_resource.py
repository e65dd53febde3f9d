"""Shared helpers for the analytic reproductions built on the resource model (issue 3)."""

from __future__ import annotations

from moe_repro.components.resources.planner import Plan, plan
from moe_repro.components.network.platform import load_builtin
from moe_repro.components.model.zoo import get_model

B = 1e9


def best_plan(model_key: str, platform: str, nodes: int, seq: int, alpha: int = 4,
              zero_stage: int = 0) -> Plan:
    return plan(get_model(model_key), load_builtin(platform), nodes, seq=seq, alpha=alpha,
                zero_stage=zero_stage)


def min_feasible_plan(model_key: str, platform: str, seq: int, alpha: int = 4,
                      max_nodes: int = 1024) -> Plan | None:
    """The plan at the smallest power-of-two node count with a memory-feasible candidate."""
    nodes = 1
    while nodes <= max_nodes:
        pl = best_plan(model_key, platform, nodes, seq, alpha)
        if pl.best is not None:
            return pl
        nodes *= 2
    return None


def describe(pl: Plan) -> str:
    c = pl.best
    if c is None:
        return f"{pl.nodes} nodes: no feasible layout"
    e = c.estimate
    return (f"{pl.gpus} GPUs, PP={c.pp} x EP={c.ep}, M={c.micro_batches}, {c.micro_batch:g} seq/GPU/micro-batch, "
            f"{'activation checkpointing, ' if c.checkpointing else ''}peak {c.peak_bytes / B:.1f} GB (stage "
            f"{c.peak_stage}), bubble {e.bubble:.1%}, all-to-all {e.alltoall_s * 1e3:.0f} ms and compute "
            f"{e.compute_s * 1e3:.0f} ms per micro-batch slot")


def planner_assumptions(pl: Plan) -> list[str]:
    return [f"planner ({pl.platform}): {a}" for a in pl.assumptions]
