"""Shared helpers for the analytic reproductions built on the resource model (issue 3)."""

from __future__ import annotations

import dataclasses
from decimal import Decimal

from moe_repro.components.model.zoo import get_model
from moe_repro.components.network.platform import load_builtin
from moe_repro.components.resources.perf_model import Estimate, estimate
from moe_repro.components.resources.planner import Plan, plan

B = 1e9

# Candidate peaks per MI250X GCD for the MFU printed beside a TFLOPS value: 191.5 TFLOPS bf16 (the
# MI250X data sheet's 383 TFLOPS per package, halved; X-MoE Sec. 5.1) and the same truncated to 191.
MFU_PEAK_CANDIDATES = (191.5, 191.0)
# The peak Piper divides by: all five (TFLOPS, MFU) pairs of its Fig. 12 follow from 191, none from
# 191.5 (piper-fig12 derives it with ``mfu_peak``; tests check the two agree).
PIPER_MFU_PEAK_TFLOPS = 191.0


def best_plan(
    model_key: str,
    platform: str,
    nodes: int,
    seq: int,
    alpha: int = 4,
    zero_stage: int = 0,
    allow_checkpointing: bool = True,
) -> Plan:
    return plan(
        get_model(model_key),
        load_builtin(platform),
        nodes,
        seq=seq,
        alpha=alpha,
        zero_stage=zero_stage,
        allow_checkpointing=allow_checkpointing,
    )


def min_feasible_plan(
    model_key: str, platform: str, seq: int, alpha: int = 4, max_nodes: int = 1024
) -> Plan | None:
    """The plan at the smallest power-of-two node count with a memory-feasible candidate."""
    nodes = 1
    while nodes <= max_nodes:
        pl = best_plan(model_key, platform, nodes, seq, alpha)
        if pl.best is not None:
            return pl
        nodes *= 2
    return None


def smallest_fit(
    model_key: str,
    platform: str,
    seq: int,
    alpha: int = 4,
    checkpointing: bool = True,
    max_nodes: int = 128,
) -> Plan | None:
    """The plan at the smallest node count n = 1, 2, 3, ... (not only powers of two) with a
    memory-feasible layout; ``checkpointing=False`` admits only layouts that fit without activation
    checkpointing, True lets the planner checkpoint where a layout needs it. None if no n up to
    ``max_nodes`` fits."""
    for nodes in range(1, max_nodes + 1):
        pl = best_plan(model_key, platform, nodes, seq, alpha, allow_checkpointing=checkpointing)
        if pl.best is not None:
            return pl
    return None


def single_layer_estimate(
    model_key: str, platform: str, seq: int, micro_batch: int = 1
) -> Estimate:
    """One MoE layer under expert-data parallelism on one node (EP = g, PP = 1, no embeddings): the
    setting of Piper Fig. 11, the single-layer ceiling (as piper-fig11 computes it)."""
    p = load_builtin(platform)
    layer = dataclasses.replace(get_model(model_key), layers=1, moe_layers=None, vocab=None)
    return estimate(layer, p, PP=1, EP=p.gpus_per_node, micro_batch=micro_batch, seq=seq, M=1)


def without_output_head(model_key: str, platform: str, pl: Plan) -> Estimate | None:
    """The best layout of ``pl`` re-estimated with the model's vocabulary removed: the output head
    (and its FLOPs) left out of the last stage. A diagnostic, not a result."""
    c = pl.best
    m = get_model(model_key)
    if c is None or not m.vocab:
        return None
    return estimate(
        dataclasses.replace(m, vocab=None),
        load_builtin(platform),
        c.pp,
        c.ep,
        c.micro_batch,
        pl.seq,
        c.micro_batches,
        checkpointing=c.checkpointing,
    )


def mfu_peak(
    pairs: list[tuple[str, str]], candidates: tuple[float, ...] = MFU_PEAK_CANDIDATES
) -> tuple[float | None, dict[float, int]]:
    """Which peak (TFLOPS) a paper divides by: ``pairs`` are (TFLOPS, MFU %) as printed. Returns the
    first candidate that reproduces every printed MFU within its printed precision (or None), and
    for each candidate how many of the pairs it reproduces."""
    hits = {}
    for peak in candidates:
        n = 0
        for tflops, mfu in pairs:
            half = 0.5 * 10.0 ** Decimal(mfu).as_tuple().exponent
            n += abs(100 * float(tflops) / peak - float(mfu)) <= half + 1e-12
        hits[peak] = n
    return next((peak for peak in candidates if hits[peak] == len(pairs)), None), hits


def half_unit_of_words(printed: str) -> float:
    """Half a unit of the last significant digit of a number stated in words: '3.6' -> 0.05,
    '2' -> 0.5, and trailing zeros of a whole number are not significant: '20' -> 5."""
    exponent = Decimal(printed).normalize().as_tuple().exponent
    return 0.5 * 10.0 ** int(exponent)


def words_interval(low: str, high: str) -> tuple[float, float]:
    """[lo, hi): what a range stated in words ('20-50%', '2-3.6X') covers, each end read at the
    precision it is written in (as a printed number's 'match'): '20-50' -> [15, 55),
    '2-3.6' -> [1.5, 3.65). A single value is ``words_interval(v, v)``."""
    return float(low) - half_unit_of_words(low), float(high) + half_unit_of_words(high)


def estimate_span(
    model_key: str, platform: str, nodes: int, seqs=(2048, 4096), alphas=(1, 2, 4, 8)
) -> dict[tuple[int, int], float | None]:
    """TFLOPS per GPU of the planner's best layout for each (sequence, alpha) the paper leaves
    unstated: how far the estimate moves with inputs we had to choose."""
    out = {}
    for seq in seqs:
        for alpha in alphas:
            c = best_plan(model_key, platform, nodes, seq, alpha).best
            out[(seq, alpha)] = c.estimate.tflops_per_gpu if c else None
    return out


def describe(pl: Plan) -> str:
    c = pl.best
    if c is None:
        return f"{pl.nodes} nodes: no feasible layout"
    e = c.estimate
    return (
        f"{pl.gpus} GPUs, PP={c.pp} x EP={c.ep}, M={c.micro_batches}, {c.micro_batch:g} seq/GPU/micro-batch, "
        f"{'activation checkpointing, ' if c.checkpointing else ''}peak {c.peak_bytes / B:.1f} GB (stage "
        f"{c.peak_stage}), bubble {e.bubble:.1%}, all-to-all {e.alltoall_s * 1e3:.0f} ms and compute "
        f"{e.compute_s * 1e3:.0f} ms per micro-batch slot"
    )


def planner_assumptions(pl: Plan) -> list[str]:
    return [f"planner ({pl.platform}): {a}" for a in pl.assumptions]
