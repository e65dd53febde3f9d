"""Shared by the feplb-* reproductions: the PP/EP configurations, the routing traces they replay,
and the replay through the balancers (components/balance/load_balance_eval.py), cached per process.

GLM-5 routing traces are not public. Every number here comes from a *synthetic* trace
(components/balance/routing_trace.py: log-normal expert popularity with skew, random-walk drift,
per-micro-batch noise, seeded), shaped like FEPLB's setting: 128 experts, top-8, the EP ranks
as token sources, ``tokens`` tokens per EP rank and micro-batch (an assumption: FEPLB does not
print its micro-batch size). PP changes which layers a stage holds, not one layer's balance, so
a PP/EP row differs from another only through EP (and its own trace seed).
"""

from __future__ import annotations

from functools import lru_cache

from moe_repro.components.balance.load_balance_eval import evaluate_trace
from moe_repro.components.network.platform import load_builtin
from moe_repro.components.balance.routing_trace import GemmTimeModel, synthetic_trace
from moe_repro.components.model.zoo import get_model

CONFIGS = (("4/2", 2), ("4/4", 4), ("2/8", 8))   # FEPLB Sec. 3.1: PP=4/EP=2, 4/4, 2/8

DEFAULTS = {"tokens": 4096, "layers": 2, "micro_batches": 8, "skew": 1.0, "drift": 0.05,
            "noise": 0.3, "seed": 0, "dyn": 4, "tau": 0, "max_num_dyn": 8}


def check(params: dict) -> None:
    for key in ("tokens", "layers", "micro_batches", "dyn", "max_num_dyn"):
        if int(params[key]) <= 0:
            raise ValueError(f"{key} must be positive, got {params[key]}")
    if int(params["micro_batches"]) < 2:
        raise ValueError("micro_batches must be >= 2 (the first one only seeds the history)")
    for key in ("skew", "drift", "noise"):
        if float(params[key]) < 0:
            raise ValueError(f"{key} must be >= 0")


def trace_for(params: dict, ep: int, keep_tokens: bool = False):
    m = get_model("glm5-moe")
    return _trace(int(params["layers"]), int(params["micro_batches"]), m.n_experts, m.top_k,
                  int(params["tokens"]), ep, float(params["skew"]), float(params["drift"]),
                  float(params["noise"]), int(params["seed"]) * 1000 + ep, keep_tokens)


@lru_cache(maxsize=16)
def _trace(layers, mbs, experts, top_k, tokens, ep, skew, drift, noise, seed, keep_tokens):
    return synthetic_trace(layers, mbs, experts, top_k, tokens, ep, skew=skew, drift=drift,
                           noise=noise, seed=seed, keep_tokens=keep_tokens)


def gemm_model() -> GemmTimeModel:
    """Roofline time of one GLM-5 expert on an H100 (dgx-h100 profile: achievable bf16 GEMM
    rate and HBM bandwidth). A model, not a measurement."""
    m, p = get_model("glm5-moe"), load_builtin("dgx-h100")
    return GemmTimeModel(m.d_model, m.d_ffn, p.gemm_flops, p.hbm_bytes_per_s, n_mat=m.n_mat)


def balancer_knobs(params: dict, dyn: int | None = None) -> dict:
    """The knobs of the registered balancers these reproductions use (FasterMoE gets the same
    weight-buffer budget, max_num_dyn, as FEPLB)."""
    return {"dyn": dyn or int(params["dyn"]), "tau": int(params["tau"]),
            "max_num_dyn": int(params["max_num_dyn"]), "max_shadows": int(params["max_num_dyn"])}


def evaluate(params: dict, ep: int, dyn: int | None = None, with_gemm: bool = False,
             methods=("Before LB", "FasterMoE", "FEPLB")):
    key = tuple(sorted((k, params[k]) for k in DEFAULTS)) + (ep, dyn, with_gemm, tuple(methods))
    if key not in _CACHE:
        _CACHE[key] = evaluate_trace(trace_for(params, ep), methods=methods,
                                     gemm_model=gemm_model() if with_gemm else None,
                                     **balancer_knobs(params, dyn))
    return _CACHE[key]


_CACHE: dict = {}


def trace_note(params: dict, ep: int) -> str:
    """Which trace a cell's number comes from (short; the full description is in assumptions)."""
    return f"synthetic trace, EP={ep}, seed={int(params['seed']) * 1000 + ep}"


def trace_assumption(params: dict) -> str:
    return (f"Trace: synthetic, 128 experts, top-8, EP sources x {params['tokens']} tokens per "
            f"micro-batch, {params['layers']} layers x {params['micro_batches']} micro-batches, "
            f"skew={params['skew']}, drift={params['drift']}, noise={params['noise']}; GLM-5 "
            f"routing is not public, so no cell can be expected to match the paper's numbers.")


def printed_percentage_note(value: str, base: str, printed_pct: str) -> str | None:
    """Check a printed '(-55%)' against the printed values it relates (paper self-consistency)."""
    v, b = float(value.replace(",", "")), float(base.replace(",", ""))
    implied = 100.0 * (v - b) / b
    if round(implied) == float(printed_pct):
        return None
    return (f"paper: {value} vs {base} is {implied:+.1f}%, printed {printed_pct}% "
            f"(rounding differs from the table's own values)")


ASSUMPTIONS = [
    "Routing: synthetic (components/routing_trace.synthetic_trace); GLM-5 traces are not public.",
    "FasterMoE: shadows predicted from the previous micro-batch, greedy while the predicted "
    "maximum load drops, at most max_num_dyn shadows (components/balance/fastermoe_shadow.py).",
    "FEPLB: dynamic experts re-picked from the previous micro-batch (the Router Predictor), "
    "greedy balancer on the actual counts with tau and max_num_dyn (components/balance/feplb.py).",
    "Micro-batch 0 only seeds the history; every method is averaged over the same micro-batches.",
]
