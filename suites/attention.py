"""attention: causal attention (SDPA) throughput vs sequence length per model shape (Piper Fig. 3).

Per zoo model: its head_dim and GQA ratio, ``heads`` query heads (0: the model's own; fewer to
fit a CPU: throughput per head does not depend on the head count once the device is busy,
which is what Fig. 3 compares), batch b, sequence length s. Forward only by default
(``backward=true`` times forward + backward).

TFLOP/s = attention_flops / time_s with attention_flops = 4 b H s^2 d / 2 (causal), x3.5 with
backward (components/model/attention.py). #wrong: elements of the output off from a float64
explicit softmax(QK^T/sqrt d + mask) V by more than 1e-4 (fp32) / 2e-2 (bf16).
"""

from __future__ import annotations

import torch

from moe_repro.runtime.device import resolve_device
from moe_repro.components.model.attention import (
    attention_flops,
    causal_attention,
    reference_attention,
    shape_from_model,
)
from moe_repro.components.model.zoo import get_model
from moe_repro.suites._moe_stages import set_threads
from moe_repro.suites.base import (
    DEVICE,
    THREADS,
    Metric,
    Param,
    Suite,
    fits_in_memory,
    one_of,
    whole,
)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def setup(params: dict, ctx=None) -> dict:
    try:
        model = get_model(params["model"])
    except KeyError as e:
        raise ValueError(str(e).strip("'\"")) from None
    if params["dtype"] not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}")
    batch, seq, heads = int(params["batch"]), int(params["seq_len"]), int(params["heads"])
    if batch < 1 or seq < 1 or heads < 0:
        raise ValueError("batch and seq_len must be >= 1, heads >= 0")
    set_threads(params, ctx)
    shape = shape_from_model(model, heads or None)
    device = resolve_device(params["device"], ctx)
    dtype = _DTYPES[params["dtype"]]
    g = torch.Generator().manual_seed(seq)
    q = torch.randn(batch, shape.heads, seq, shape.head_dim, generator=g).to(
        device=device, dtype=dtype
    )
    k = torch.randn(batch, shape.kv_heads, seq, shape.head_dim, generator=g).to(
        device=device, dtype=dtype
    )
    v = torch.randn(batch, shape.kv_heads, seq, shape.head_dim, generator=g).to(
        device=device, dtype=dtype
    )
    backward = bool(params["backward"])
    if backward:
        q.requires_grad_(True), k.requires_grad_(True), v.requires_grad_(True)
    return {
        "q": q,
        "k": k,
        "v": v,
        "backward": backward,
        "shape": shape,
        "flops": attention_flops(batch, seq, shape, causal=True, backward=backward),
        "grad": torch.randn(q.shape, generator=g).to(device=device, dtype=dtype),
    }


def run(state: dict) -> None:
    if state["backward"]:
        out = causal_attention(state["q"], state["k"], state["v"])
        out.backward(state["grad"])
        state["q"].grad = state["k"].grad = state["v"].grad = None
    else:
        with torch.no_grad():
            causal_attention(state["q"], state["k"], state["v"])


def derive(params: dict, state: dict, time_s: float) -> dict:
    shape = state["shape"]
    return {
        "tflops": state["flops"] / time_s / 1e12,
        "heads_used": shape.heads,
        "kv_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
    }


def check(state: dict) -> int:
    q, k, v = (state[n].detach() for n in "qkv")
    if q.shape[2] > 4096:  # the float64 reference holds s^2 scores per head: check a prefix
        q, k, v = (t[:, :, :4096] for t in (q, k, v))
    with torch.no_grad():
        out = causal_attention(q, k, v).double()
    tol = 1e-4 if q.dtype == torch.float32 else 2e-2
    return int(((out - reference_attention(q, k, v)).abs() > tol).sum())


def _known_model(key: str) -> None:
    from moe_repro.components.model.zoo import get_model

    try:
        get_model(key)
    except KeyError as e:
        raise ValueError(str(e).strip("'\"")) from None


SUITE = Suite(
    name="attention",
    schema={
        "model": Param(str, check=_known_model, bad=("nosuch",)),
        "seq_len": whole(1, 2**20),
        "batch": whole(1, 2**16),
        "heads": whole(0, 1024),
        "backward": Param(bool),
        "dtype": one_of(*_DTYPES),
        "device": DEVICE,
        "threads": THREADS,
    },
    # the score matrix [batch, heads, seq, seq] and its softmax, the reference's float64 copy
    rules=(
        fits_in_memory(
            lambda p: 3 * 8 * int(p["batch"]) * (int(p["heads"]) or 128) * int(p["seq_len"]) ** 2,
            {"seq_len": str(2**20)},
        ),
    ),
    choices={"dtype": tuple(_DTYPES)},
    params={
        "model": ["mixtral-8x7b", "qwen3-30b-a3b", "xmoe-small", "deepseek-v3"],
        "seq_len": [256, 512, 1024, 2048],
        "batch": [1],
        "heads": [8],
        "backward": [False],
        "dtype": ["float32"],
        "device": ["auto"],
        "threads": [1],
    },
    quick={"model": ["tiny-moe", "mixtral-8x7b"], "seq_len": [128, 256], "heads": [4]},
    setup=setup,
    run=run,
    derive=derive,
    check=check,
    metrics=[
        Metric("tflops", "TFLOP/s", "higher", description="causal attention FLOPs / time_s"),
        Metric("heads_used", "", "none", kind="analytic", description="query heads run"),
        Metric("kv_heads", "", "none", kind="analytic", description="key/value heads run"),
        Metric("head_dim", "", "none", kind="analytic", description="head size d"),
    ],
    param_help={
        "model": "zoo key (head_dim, GQA ratio)",
        "seq_len": "s",
        "batch": "b",
        "heads": "query heads to run (0: the model's own)",
        "backward": "time forward + backward",
        "dtype": "float32, bfloat16 or float16",
        "device": "auto (cuda if present), cpu or cuda",
        "threads": "CPU intra-op threads (0: torch's default)",
    },
)
