"""ssmb-memory: activation bytes of the MoE block per rank, with and without sequence sharding
(SSMB, X-MoE Sec. 4.3, Fig. 13), over G real ranks (G = TP degree = EP degree of the block).

Every rank builds the same model from ``seed`` (a TP-sharded dense MLP of width ``dense_ffn``
and an MoE block of ``experts`` GELU experts of width ``expert_ffn``, top-``top_k``) and the same
full sequence of ``seq`` tokens of width ``hidden`` (components/moe/ssmb.SSMBLayer). ``variant``:
  tp_ep  every TP rank feeds the MoE block the whole, duplicated sequence
  ssmb   each rank keeps its 1/G chunk of the sequence for the MoE block
The measured call is one forward+backward of the layer. Set-up makes one instrumented forward:
``moe_saved_bytes`` are the bytes autograd keeps for backward inside the MoE block at the end of
forward (components/training/pp_ep_trainer.SavedActivationMeter: distinct storages), max over
ranks; ``max_abs_diff`` is the largest difference between this variant's output and the other
variant's on the same inputs, max over ranks.
#wrong: output elements off from the other variant's by more than 1e-5 + 1e-4 |other|.
"""

from __future__ import annotations

import torch

from moe_repro.suites.base import (
    SEED,
    Metric,
    Suite,
    divides,
    fits_in_memory,
    one_of,
    top_k_within_experts,
    whole,
)

VARIANTS = ("tp_ep", "ssmb")
RTOL, ATOL = 1e-4, 1e-5


def setup(params: dict, ctx) -> dict:
    from moe_repro.components.moe.moe_layer import MoELayer
    from moe_repro.components.moe.ssmb import SSMBLayer
    from moe_repro.components.training.pp_ep_trainer import SavedActivationMeter

    if params["variant"] not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {params['variant']!r}")
    seq, hidden, dense_ffn = int(params["seq"]), int(params["hidden"]), int(params["dense_ffn"])
    experts, expert_ffn, top_k = (
        int(params["experts"]),
        int(params["expert_ffn"]),
        int(params["top_k"]),
    )
    g = ctx.world_size
    if experts % g or dense_ffn % g:
        raise ValueError(
            f"TP degree {g} must divide experts ({experts}) and dense_ffn ({dense_ffn})"
        )
    torch.manual_seed(int(params["seed"]))  # the same model and sequence on every rank
    w1 = torch.randn(hidden, dense_ffn) * hidden**-0.5
    w2 = torch.randn(dense_ffn, hidden) * dense_ffn**-0.5
    b2 = torch.zeros(hidden)
    moe_full = MoELayer(hidden, expert_ffn, experts, top_k, activation="gelu")
    x = torch.randn(seq, hidden)
    layers = {v: SSMBLayer(w1, w2, b2, moe_full, sequence_sharded=v == "ssmb") for v in VARIANTS}
    layer = layers[params["variant"]]
    other = layers["tp_ep" if params["variant"] == "ssmb" else "ssmb"]

    meter = SavedActivationMeter(layer.parameters())
    y = layer(x.clone().requires_grad_(True), moe_activation_probe=meter.hooks())
    saved = meter.peak  # held for backward at the end of forward
    y.sum().backward()
    with torch.no_grad():
        y_other = other(x)
    y = y.detach()
    return {
        "layer": layer,
        "x": x,
        "moe_saved_bytes": ctx.all_reduce_max(float(saved)),
        "max_abs_diff": ctx.all_reduce_max(float((y - y_other).abs().max())),
        "wrong": int((~torch.isclose(y, y_other, rtol=RTOL, atol=ATOL)).sum()),
    }


def run(state: dict) -> None:
    y = state["layer"](state["x"].clone().requires_grad_(True))
    y.sum().backward()


def derive(params: dict, state: dict, time_s: float) -> dict:
    return {"moe_saved_bytes": state["moe_saved_bytes"], "max_abs_diff": state["max_abs_diff"]}


def check(state: dict) -> int:
    return state["wrong"]


SUITE = Suite(
    name="ssmb-memory",
    schema={
        "variant": one_of(*VARIANTS),
        "ranks": whole(1, 65536),
        "backend": one_of("gloo"),
        "seq": whole(1),
        "hidden": whole(1, 2**16),
        "dense_ffn": whole(1, 2**16),
        "experts": whole(1, 2**16),
        "expert_ffn": whole(1, 2**16),
        "top_k": whole(1, 2**10),
        "seed": SEED,
    },
    rules=(
        top_k_within_experts(),
        divides("ranks", "experts", {"ranks": "3"}),
        divides("ranks", "dense_ffn", {"ranks": "4", "dense_ffn": "6", "experts": "16"}),
        # every rank builds the whole model and sequence (float32), activations kept for backward
        fits_in_memory(
            lambda p: (
                4
                * int(p["ranks"])
                * (
                    2 * int(p["hidden"]) * int(p["dense_ffn"])
                    + 2 * int(p["experts"]) * int(p["hidden"]) * int(p["expert_ffn"])
                    + 8
                    * int(p["seq"])
                    * int(p["top_k"])
                    * max(int(p["hidden"]), int(p["expert_ffn"]))
                    # the router's scores per token and expert
                    + 3 * int(p["seq"]) * int(p["experts"])
                )
            ),
            {"seq": str(2**20), "hidden": str(2**16)},
        ),
    ),
    choices={"variant": VARIANTS, "backend": ("gloo",)},
    params={
        "variant": list(VARIANTS),
        "ranks": [1, 2, 4],
        "backend": ["gloo"],
        "seq": [1024],
        "hidden": [64],
        "dense_ffn": [128],
        "experts": [16],
        "expert_ffn": [32],
        "top_k": [4],
        "seed": [0],
    },
    quick={"ranks": [2], "seq": [128]},
    setup=setup,
    run=run,
    derive=derive,
    check=check,
    world_params=("ranks", "backend"),
    table_metrics=("time_s", "moe_saved_bytes", "max_abs_diff"),
    metrics=[
        Metric(
            "moe_saved_bytes",
            "B",
            "lower",
            description="bytes autograd keeps for backward inside the MoE block, max over ranks",
        ),
        Metric(
            "max_abs_diff",
            "abs",
            "lower",
            description="largest |output - other variant's output|, all ranks",
        ),
    ],
    param_help={
        "variant": "tp_ep (whole sequence on every rank) or ssmb (sequence-sharded MoE block)",
        "ranks": "G: TP degree = EP degree (real processes)",
        "backend": "gloo",
        "seq": "S, tokens of the sequence",
        "hidden": "H",
        "dense_ffn": "dense MLP width (TP-sharded; divisible by ranks)",
        "experts": "experts (divisible by ranks)",
        "expert_ffn": "expert width",
        "top_k": "experts per token",
        "seed": "weight and input seed",
    },
)
