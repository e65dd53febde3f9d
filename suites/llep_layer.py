"""llep-layer: least-loaded EP vs plain EP, one MoE layer forward+backward on skewed routing
over real ranks (MoP Sec. 3.3, LLEP by Nguyen et al.).

Every rank builds both layers with the same weights (the full expert set drawn from ``seed``,
each layer keeping its own rank's experts) and ``tokens`` tokens of its own. The routing skew is
synthetic and fixed: feature 0 of every token is 1 and the gate's row 0 rises linearly from 0 to
``skew`` over the experts, so later experts are preferred.

The measured call is one forward+backward of the ``layer`` under test (``plain`` or ``llep``).
Set-up runs both layers once on the same inputs and keeps
- the rows each rank computes: the per-rank loads before (plain EP) and after (LLEP) the plan;
  ``rows_busiest`` is the busiest rank's, ``straggler_rows`` its excess over the mean;
- ``max_abs_diff``: the largest |LLEP - plain EP| over outputs and input gradients, max over
  ranks (LLEP moves compute, not the assignment of tokens to experts, so only fp32 summation
  order differs).
#wrong: output and input-gradient elements where LLEP and plain EP differ by more than
1e-5 + 1e-4 |plain|.
"""

from __future__ import annotations

import torch

from moe_repro.suites.base import (
    SEED,
    Metric,
    Param,
    Suite,
    divides,
    fits_in_memory,
    one_of,
    top_k_within_experts,
    whole,
)

LAYERS = ("plain", "llep")
RTOL, ATOL = 1e-4, 1e-5


def _build_layers(params: dict) -> dict:
    """Both layers with identical weights on this rank (rank-independent draws from ``seed``)."""
    from moe_repro.components.balance.least_loaded_ep import LeastLoadedMoELayer
    from moe_repro.components.moe.moe_layer import MoELayer

    d_model, d_ffn = int(params["d_model"]), int(params["d_ffn"])
    experts, top_k, seed = int(params["experts"]), int(params["top_k"]), int(params["seed"])
    g = torch.Generator().manual_seed(seed)
    gate = torch.randn(d_model, experts, generator=g) * d_model**-0.5
    gate[0] = torch.linspace(
        0.0, float(params["skew"]), experts
    )  # feature 0 is constant: a fixed skew
    layers = {
        "plain": MoELayer(d_model, d_ffn, experts, top_k, expert_parallel=True),
        "llep": LeastLoadedMoELayer(d_model, d_ffn, experts, top_k, expert_parallel=True),
    }
    full = {
        n: torch.randn(experts, *p.shape[1:], generator=g) * p.shape[1] ** -0.5
        for n, p in layers["llep"].experts.named_parameters()
    }
    for layer in layers.values():
        with torch.no_grad():
            layer.gate.weight.copy_(gate)
            for n, p in layer.experts.named_parameters():
                p.copy_(full[n][layer.local_experts])
    return layers


def _forward_backward(layer, x: torch.Tensor, grad_out: torch.Tensor):
    xi = x.clone().requires_grad_(True)
    y = layer(xi)
    (y * grad_out).sum().backward()
    return y.detach(), xi.grad


def setup(params: dict, ctx) -> dict:
    if params["layer"] not in LAYERS:
        raise ValueError(f"layer must be one of {', '.join(LAYERS)}, got {params['layer']!r}")
    ranks, experts = int(params["ranks"]), int(params["experts"])
    if ranks < 2 or experts % ranks:
        raise ValueError(f"need ranks >= 2 dividing experts, got ranks={ranks}, experts={experts}")
    torch.set_num_threads(1)
    layers = {name: layer.to(ctx.device) for name, layer in _build_layers(params).items()}
    gx = torch.Generator().manual_seed(int(params["seed"]) * 100 + ctx.rank)
    x = torch.randn(int(params["tokens"]), int(params["d_model"]), generator=gx)
    x[:, 0] = 1.0
    grad_out = torch.randn(x.shape, generator=gx)
    x, grad_out = x.to(ctx.device), grad_out.to(ctx.device)  # the rank's device (runtime rule)

    # One instrumented pass of both layers on the same inputs: plan loads and exactness.
    y_plain, dx_plain = _forward_backward(layers["plain"], x, grad_out)
    y_llep, dx_llep = _forward_backward(layers["llep"], x, grad_out)
    plan = layers["llep"].last_plan  # derived from all-gathered counts: the same on every rank
    diff = max(float((y_llep - y_plain).abs().max()), float((dx_llep - dx_plain).abs().max()))
    wrong = sum(
        int((~torch.isclose(got, want, rtol=RTOL, atol=ATOL)).sum())
        for got, want in ((y_llep, y_plain), (dx_llep, dx_plain))
    )
    rows = plan.loads_before if params["layer"] == "plain" else plan.loads_after
    return {
        "layer": layers[params["layer"]],
        "x": x,
        "grad_out": grad_out,
        "rows": list(rows),
        "mean_rows": sum(plan.loads_before) / len(plan.loads_before),
        "max_abs_diff": ctx.all_reduce_max(diff),
        "wrong": wrong,
    }


def run(state: dict) -> None:
    _forward_backward(state["layer"], state["x"], state["grad_out"])


def derive(params: dict, state: dict, time_s: float) -> dict:
    busiest = max(state["rows"])
    return {
        "rows_busiest": busiest,
        "straggler_rows": busiest - state["mean_rows"],
        "max_abs_diff": state["max_abs_diff"],
    }


def check(state: dict) -> int:
    return state["wrong"]


SUITE = Suite(
    name="llep-layer",
    schema={
        "layer": one_of(*LAYERS),
        "ranks": whole(2, 65536),
        "backend": one_of("gloo"),
        "tokens": whole(1),
        "d_model": whole(1, 2**16),
        "d_ffn": whole(1, 2**16),
        "experts": whole(1, 2**16),
        "top_k": whole(1, 2**10),
        "skew": Param(float, -1e6, 1e6),
        "seed": SEED,
    },
    rules=(
        top_k_within_experts(),
        divides("ranks", "experts", {"ranks": "3", "experts": "8"}),
        # every rank holds all experts' weights once while building, and its tokens' rows
        # and the router's scores, probabilities and their gradient per token and expert
        fits_in_memory(
            lambda p: (
                4
                * int(p["ranks"])
                * (
                    2 * int(p["experts"]) * int(p["d_model"]) * int(p["d_ffn"])
                    + 8 * int(p["tokens"]) * int(p["top_k"]) * int(p["d_model"])
                    + 3 * int(p["tokens"]) * int(p["experts"])
                )
            ),
            {"d_model": str(2**16), "d_ffn": str(2**16)},
        ),
    ),
    choices={"layer": LAYERS},
    params={
        "layer": list(LAYERS),
        "ranks": [2],
        "backend": ["gloo"],
        "tokens": [512],
        "d_model": [64],
        "d_ffn": [256],
        "experts": [8],
        "top_k": [2],
        "skew": [4.0],
        "seed": [0],
    },
    quick={"tokens": [64], "d_model": [16], "d_ffn": [32]},
    setup=setup,
    run=run,
    derive=derive,
    check=check,
    world_params=("ranks", "backend"),
    table_metrics=("time_s", "rows_busiest", "straggler_rows"),
    metrics=[
        Metric(
            "rows_busiest",
            "rows",
            "lower",
            description="(token, expert) rows computed on the busiest rank",
        ),
        Metric(
            "straggler_rows",
            "rows",
            "lower",
            description="busiest rank's rows minus the mean over ranks",
        ),
        Metric(
            "max_abs_diff",
            "abs",
            "lower",
            description="largest |LLEP - plain EP| over outputs and input gradients, all ranks",
        ),
    ],
    param_help={
        "layer": "plain (standard EP) or llep (least-loaded EP)",
        "ranks": "EP ranks (real processes; >= 2, dividing experts)",
        "backend": "gloo",
        "tokens": "tokens per rank",
        "d_model": "H",
        "d_ffn": "expert width",
        "experts": "E",
        "top_k": "k",
        "skew": "gate weight of the constant feature on the last expert (0 on the first)",
        "seed": "weight and input seed",
    },
)
