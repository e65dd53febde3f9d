"""expert-gemm: expert GEMM throughput vs tokens per expert and expert shape (Piper Fig. 4).

One grouped GEMM x [T*E_l, K] times E_l weights [K, M] (an expert's up-projection, K = d_model,
M = d_ffn, both divided by ``shape_div`` to fit the device), T tokens per expert, for each kernel
registered in components/moe/grouped_gemm.py, plus ``dense``: one torch.mm of the same
[T*E_l, K] x [K, M] shape, i.e. equal FLOPs on a single weight, the ceiling a grouped GEMM can
reach.

FLOPs per call: 2 * T * E_l * K * M (the padded variant computes exactly these too, because the
groups are balanced here; it pays the scatter/gather copies). TFLOP/s = FLOPs / time_s.
#wrong: elements off from a per-expert float64 matmul by more than 8 eps K.

ratio_to_dense: after every timed sample of a grouped variant, the dense GEMM of equal FLOPs is
timed right away with the same number of calls, and the sample's ratio is
time(dense) / time(variant) = TFLOP/s(variant) / TFLOP/s(dense). Pairing the two in time makes
the ratio robust to load that comes and goes on a shared machine (its median and IQR are what
the issue's ">= 80% of dense at >= 256 tokens per expert" goal is judged on).

Kernel table: after a run, the fastest correct kernel per (device, dtype, T, K, M) is merged into
this machine's cached table (components/moe/kernel_choice.py), which the ``auto`` kernel of the
layer, the trainer and the suites reads; the run's summary says where it went.
"""

from __future__ import annotations

import torch

from moe_repro.components.moe.grouped_gemm import grouped_gemm, grouped_gemm_names
from moe_repro.components.model.zoo import get_model
from moe_repro.runtime.device import resolve_device
from moe_repro.runtime.timing import timer_for
from moe_repro.suites._moe_stages import set_threads
from moe_repro.suites.base import (
    DEVICE,
    THREADS,
    Metric,
    Param,
    Suite,
    fits_in_memory,
    one_of,
    registered,
    whole,
)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def variants() -> tuple[str, ...]:
    """Every registered grouped-GEMM kernel, then the equal-FLOPs dense GEMM (the ceiling)."""
    return (*grouped_gemm_names(), "dense")


def shape_of(params: dict) -> tuple[int, int]:
    """(K, M) = (d_model, d_ffn) of the zoo model divided by shape_div (at least 16)."""
    try:
        model = get_model(params["model"])
    except KeyError as e:
        raise ValueError(str(e).strip("'\"")) from None
    div = int(params["shape_div"])
    if div < 1:
        raise ValueError(f"shape_div must be >= 1, got {div}")
    return max(16, model.d_model // div), max(16, model.d_ffn // div)


def setup(params: dict, ctx=None) -> dict:
    variant = params["variant"]
    if variant not in variants():
        raise ValueError(f"variant must be one of {', '.join(variants())}")
    if params["dtype"] not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}")
    tokens, experts = int(params["tokens_per_expert"]), int(params["local_experts"])
    if tokens < 1 or experts < 1:
        raise ValueError("tokens_per_expert and local_experts must be >= 1")
    k, m = shape_of(params)
    set_threads(params, ctx)
    device, dtype = resolve_device(params["device"], ctx), _DTYPES[params["dtype"]]
    g = torch.Generator().manual_seed(tokens * 7 + experts)
    x = torch.randn(tokens * experts, k, generator=g).to(device=device, dtype=dtype)
    w = (torch.randn(experts, k, m, generator=g) * k**-0.5).to(device=device, dtype=dtype)
    counts = torch.full((experts,), tokens, dtype=torch.int64)
    return {
        "x": x,
        "w": w,
        "w_dense": w[0].contiguous(),
        "counts": counts,
        "variant": variant,
        "flops": 2 * tokens * experts * k * m,
        "k": k,
        "m": m,
    }


def run(state: dict):
    with torch.no_grad():
        if state["variant"] == "dense":
            return torch.mm(state["x"], state["w_dense"])
        return grouped_gemm(state["x"], state["w"], state["counts"], state["variant"])


def _dense_time_s(state: dict, min_s: float = 0.01) -> float:
    """Mean seconds of one equal-FLOPs dense GEMM, over enough calls to last ``min_s``."""
    x, w = state["x"], state["w_dense"]
    timer = timer_for(x.device)  # CUDA events on a GPU (runtime/timing.py)
    calls, elapsed = 0, 0.0
    with torch.no_grad():
        while elapsed < min_s:
            timer.start()
            torch.mm(x, w)
            elapsed += timer.stop()
            calls += 1
    return elapsed / calls


def derive(params: dict, state: dict, time_s: float) -> dict:
    # For variant=dense the ratio is dense against itself: the pairing's own noise floor.
    return {
        "tflops": state["flops"] / time_s / 1e12,
        "ratio_to_dense": _dense_time_s(state) / time_s,
        "K": state["k"],
        "M": state["m"],
    }


def check(state: dict) -> int:
    y = run(state).double()
    x, counts = state["x"].double(), state["counts"].tolist()
    weights = (
        [state["w_dense"].double()] * len(counts)
        if state["variant"] == "dense"
        else state["w"].double()
    )
    ref = torch.cat([chunk @ weights[e] for e, chunk in enumerate(torch.split(x, counts))])
    tol = 8 * torch.finfo(state["x"].dtype).eps * state["k"]
    return int(((y - ref).abs() > tol).sum())


def kernel_table(records: list[dict]) -> list[str]:
    """Write the run's fastest correct kernels into this machine's table for ``auto``."""
    from moe_repro.components.moe.kernel_choice import table_from_records, write_table

    by_device: dict[str, list[dict]] = {}
    for r in records:
        device = str(r.get("device_used", r.get("device", "cpu"))).split(":")[0]
        by_device.setdefault(device, []).append({**r, "device_type": device})
    lines = []
    for device, recs in by_device.items():
        entries = table_from_records(recs)
        if entries:
            path = write_table(entries, device)
            lines.append(f"auto kernel table: {len(entries)} shape(s) for {device} -> {path}")
    return lines


def _known_model(key: str) -> None:
    from moe_repro.components.model.zoo import get_model

    try:
        get_model(key)
    except KeyError as e:
        raise ValueError(str(e).strip("'\"")) from None


SUITE = Suite(
    name="expert-gemm",
    schema={
        "variant": registered("variant", variants),
        "tokens_per_expert": whole(1),
        "model": Param(str, check=_known_model, bad=("nosuch",)),
        "shape_div": whole(1, 2**16),
        "local_experts": whole(1, 2**12),
        "dtype": one_of(*_DTYPES),
        "device": DEVICE,
        "threads": THREADS,
    },
    # inputs, outputs and weights at the largest zoo width (float32; 32768 bounds d_model, d_ffn)
    rules=(
        fits_in_memory(
            lambda p: (
                4
                * int(p["local_experts"])
                * (2 * int(p["tokens_per_expert"]) + 32768)
                * 32768
                / int(p["shape_div"]) ** 2
            ),
            {"tokens_per_expert": str(2**20), "local_experts": "4096"},
        ),
    ),
    choices={"dtype": tuple(_DTYPES)},
    params={
        "variant": list(variants()),
        "tokens_per_expert": [16, 64, 256, 1024],
        "model": ["mixtral-8x7b", "xmoe-small", "deepseek-v3"],
        "shape_div": [4],
        "local_experts": [4],
        "dtype": ["float32"],
        "device": ["auto"],
        "threads": [1],
    },
    quick={"tokens_per_expert": [16, 128], "model": ["xmoe-small"], "shape_div": [8]},
    setup=setup,
    run=run,
    derive=derive,
    summary=kernel_table,
    check=check,
    metrics=[
        Metric("tflops", "TFLOP/s", "higher", description="2 T E_l K M / time_s"),
        Metric(
            "ratio_to_dense",
            "",
            "higher",
            description="time(dense) / time(variant), dense timed right after each sample",
        ),
        Metric("K", "", "none", kind="analytic", description="d_model / shape_div"),
        Metric("M", "", "none", kind="analytic", description="d_ffn / shape_div"),
    ],
    param_help={
        "variant": f"{', '.join(grouped_gemm_names())} (grouped GEMM kernels), or dense "
        "(equal-FLOPs ceiling)",
        "tokens_per_expert": "T, rows per expert",
        "model": "zoo key giving d_model, d_ffn",
        "shape_div": "divide d_model and d_ffn by this to fit the device",
        "local_experts": "E_l, experts on this device",
        "dtype": "float32 or bfloat16",
        "device": "auto (cuda if present), cpu or cuda",
        "threads": "CPU intra-op threads (0: torch's default)",
    },
)
