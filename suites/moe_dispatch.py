"""moe-dispatch: padding-free (PFT) vs capacity-padded dispatch, time and peak memory per stage.

Single process, forward, no experts (X-MoE Sec. 5.4.1: gating, buffer dispatch, buffer combine).
``stage=total`` chains the three. Default shapes are DeepSeek-like, the X-MoE Small layer
(H = 2048, E = 64, k = 6, 4096 tokens, capacity factor 1.25).

Work per call (S tokens, k, E, C = ceil(1.25 S k / E), H):
  pft    gather/scatter move S*k*H elements each; PFT build sorts S*k keys.
  padded dispatch/combine einsums are [E*C, S] x [S, H] matmuls: 2*E*C*S*H FLOPs each, and the
         mask and combine tensors hold S*E*C elements each (X-MoE App. B.5).
The check (#wrong) runs gating -> dispatch -> combine with identity experts and compares with
x[t] * (sum of t's kept weights), the kept pairs found by a plain Python pass over the routing
(PFT: per expert the C largest weights; padded: GShard position < C).

Peers (``[peers]`` extra, components/moe/peers.py): Megatron-core's permute/unpermute with and
without token dropping and DeepSpeed's sparse and einsum paths, each with its own gating, on
the same router weight. Each record's ``peer`` names the package and version that ran. Their
check uses their semantics: Megatron keeps the gate's weights, DeepSpeed renormalises the
surviving weights to sum to 1; both compute C in floating point (moe_layer.float_expert_capacity).
"""

from __future__ import annotations

import torch

from moe_repro.components.moe.gating import top_k_gating
from moe_repro.components.moe.impls import get_impl
from moe_repro.suites._moe_stages import (
    IMPLS,
    MEMORY_RULES,
    derive_stage,
    peer_params,
    run_stage,
    setup_stage,
)
from moe_repro.suites.base import (
    DEVICE,
    THREADS,
    Metric,
    Param,
    Suite,
    one_of,
    top_k_within_experts,
    whole,
)


def _kept_weight_per_token(
    policy: str,
    experts: list[list[int]],
    weights: list[list[float]],
    num_experts: int,
    capacity: int | None,
    renormalize: bool = False,
) -> list[float]:
    """Sum of each token's kept weights, by a plain pass over the routing. ``policy`` "probs":
    per expert the ``capacity`` largest weights (pft, Megatron, DeepSpeed topkgating); "slot":
    GShard position < C, first choices before second (padded). ``renormalize``: kept weights
    divided by their sum (DeepSpeed), so a token with any pair kept gets 1."""
    tokens, top_k = len(experts), len(experts[0]) if experts else 0
    kept = [0.0] * tokens
    if policy == "probs":
        per_expert: dict[int, list[tuple[float, int]]] = {}
        for t in range(tokens):
            for j in range(top_k):
                per_expert.setdefault(experts[t][j], []).append((-weights[t][j], t * top_k + j))
        for pairs in per_expert.values():
            for neg_w, flat in sorted(pairs)[:capacity]:
                kept[flat // top_k] += -neg_w
    else:
        filled = [0] * num_experts
        for j in range(top_k):
            for t in range(tokens):
                e = experts[t][j]
                if filled[e] < capacity:
                    kept[t] += weights[t][j]
                filled[e] += 1
    if renormalize:
        kept = [1.0 if w > 0 else 0.0 for w in kept]
    return kept


def check(state: dict) -> int:
    """Output elements of gating + buffer dispatch + buffer combine (experts: identity) that
    differ from a plain pass over the routing with the implementation's own drop policy,
    capacity arithmetic and renormalisation, as the registry declares them (impls.py)."""
    layer, x = state["layer"], state["x"]
    impl = get_impl(state["impl"])
    tokens = x.shape[0]
    with torch.no_grad():
        if impl.form == "peer":
            peer = state["peer"]
            routing = peer.route(x)
            out = peer.combine(peer.dispatch(x, routing), routing)
        elif impl.form == "pft":
            pft = layer.make_pft(layer.route(x))
            out = layer.buffer_combine(layer.buffer_dispatch(x, pft), pft)
        else:
            mask, combine = layer.make_masks(layer.route(x))
            out = layer.buffer_combine_padded(layer.buffer_dispatch_padded(x, mask), combine)
        gate = (
            top_k_gating(x.float() @ layer.gate.weight.float(), layer.top_k)
            if impl.routes_on_fp32_logits
            else layer.route(x)
        )
    capacity = impl.capacity(tokens, layer.num_experts, layer.top_k, layer.capacity_factor)
    kept = _kept_weight_per_token(
        impl.drop_policy or "probs",
        gate.top_experts.tolist(),
        gate.combine_weights.tolist(),
        layer.num_experts,
        capacity,
        impl.renormalize_after_drop,
    )
    expected = x.float() * torch.tensor(kept, dtype=torch.float32, device=x.device).unsqueeze(1)
    tol = 1e-4 if x.dtype == torch.float32 else 2e-2
    return int(((out.float() - expected).abs() > tol * (1 + expected.abs())).sum())


def setup(params: dict, ctx=None) -> dict:
    if params["stage"] not in ("gating", "buffer_dispatch", "buffer_combine", "total"):
        raise ValueError("moe-dispatch stages: gating, buffer_dispatch, buffer_combine, total")
    return setup_stage(params, ctx)


SUITE = Suite(
    name="moe-dispatch",
    schema={
        "impl": one_of(*IMPLS),
        "stage": one_of("gating", "buffer_dispatch", "buffer_combine", "total"),
        "tokens": whole(0),
        "d_model": whole(1, 2**16),
        "experts": whole(1, 2**16),
        "top_k": whole(1, 2**10),
        "capacity_factor": Param(float, 0.01, 1000.0),
        "d_ffn": whole(1, 2**16),
        "dtype": one_of("float32", "bfloat16"),
        "device": DEVICE,
        "threads": THREADS,
    },
    rules=(top_k_within_experts(), *MEMORY_RULES),
    params={
        "impl": ["pft", "padded"],
        "stage": ["gating", "buffer_dispatch", "buffer_combine", "total"],
        "tokens": [4096],
        "d_model": [2048],
        "experts": [64],
        "top_k": [6],
        "capacity_factor": [1.25],
        "d_ffn": [64],
        "dtype": ["float32"],
        "device": ["auto"],
        "threads": [1],
    },
    quick={"stage": ["total"], "tokens": [512], "d_model": [256], "experts": [16], "top_k": [4]},
    setup=setup,
    run=run_stage,
    derive=derive_stage,
    check=check,
    choices={"impl": IMPLS},
    derived_params=peer_params,
    metrics=[
        Metric(
            "peak_bytes",
            "B",
            "lower",
            description="peak memory of one call above the memory held before it",
        ),
        Metric(
            "buffer_rows",
            "rows",
            "lower",
            kind="analytic",
            description="rows of the dispatch buffer: S*k retained (pft) or E*C (padded)",
        ),
    ],
    param_help={
        "impl": "pft (X-MoE padding-free), padded (GShard capacity-padded); with "
        "pip install -e \".[peers]\": megatron, megatron-nodrop (Megatron-core "
        "permute/unpermute), deepspeed (its sparse MOELayer path), deepspeed-einsum",
        "stage": "gating, buffer_dispatch, buffer_combine, or total (all three)",
        "tokens": "S, tokens in the layer's input",
        "d_model": "H",
        "experts": "E",
        "top_k": "k",
        "capacity_factor": "C = ceil(capacity_factor * S * k / E)",
        "d_ffn": "expert width (experts are not run in this suite)",
        "dtype": "float32 or bfloat16",
        "device": "auto (cuda if present), cpu or cuda",
        "threads": "CPU intra-op threads (0: torch's default); 1 keeps timings steady "
        "on a shared machine",
    },
)
