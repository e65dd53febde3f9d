"""Dense GEMM throughput vs size: the device's compute ceiling that later suites compare against.

FLOPs of C = A B with A [n, n], B [n, n]: 2 n^3 (one multiply and one add per inner-product term).
"""

from __future__ import annotations

import torch

from moe_repro.runtime.device import resolve_device
from moe_repro.suites.base import DEVICE, Metric, Suite, fits_in_memory, one_of, whole

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def setup(params: dict, ctx=None) -> dict:
    n, dtype = int(params["n"]), _DTYPES[params["dtype"]]
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    gen = torch.Generator().manual_seed(n)
    device = resolve_device(params["device"], ctx)
    a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    return {"a": a, "b": b, "c": torch.empty(n, n, device=device, dtype=dtype), "n": n}


def run(state: dict) -> None:
    torch.mm(state["a"], state["b"], out=state["c"])


def derive(params: dict, state: dict, time_s: float) -> dict:
    return {"tflops": 2 * state["n"] ** 3 / time_s / 1e12}


def check(state: dict) -> int:
    """Wrong elements vs a float64 product of the same (rounded) inputs."""
    run(state)
    ref = state["a"].double() @ state["b"].double()
    eps = torch.finfo(state["a"].dtype).eps
    # Rounding error of an n-term dot product of unit-variance terms grows ~ eps * n at worst.
    tol = 8 * eps * state["n"]
    return int(((state["c"].double() - ref).abs() > tol).sum())


SUITE = Suite(
    name="gemm",
    schema={"n": whole(1, 2**17), "dtype": one_of(*_DTYPES), "device": DEVICE},
    # A, B, C and the check's float64 A, B and product
    rules=(fits_in_memory(lambda p: 3 * (4 + 8) * int(p["n"]) ** 2, {"n": str(2**17)}),),
    choices={"dtype": tuple(_DTYPES)},
    params={"n": [256, 512, 1024, 2048], "dtype": ["float32"], "device": ["auto"]},
    quick={"n": [128, 256]},
    setup=setup,
    run=run,
    derive=derive,
    check=check,
    metrics=[Metric("tflops", "TFLOP/s", "higher", description="2 n^3 / time_s")],
    param_help={
        "n": "matrix size (A, B, C are n x n)",
        "dtype": "float32, bfloat16 or float16",
        "device": "auto (cuda if present), cpu or cuda",
    },
)
