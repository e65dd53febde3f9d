"""memcopy: memory bandwidth of one large tensor copy (the ``repro calibrate`` copy ceiling).

The measured call copies a float32 buffer of ``mbytes`` MiB into another one. A copy reads the
source and writes the destination, so it moves 2 x bytes through memory (the STREAM "copy"
convention):
    GBps = 2 * bytes / time_s / 1e9
#wrong: elements of the destination that differ from the source after one copy.
"""

from __future__ import annotations

import torch

from moe_repro.suites._moe_stages import device_for, set_threads
from moe_repro.suites.base import DEVICE, THREADS, Metric, Suite, fits_in_memory, whole

MIB = 2**20


def setup(params: dict, ctx=None) -> dict:
    mbytes = int(params["mbytes"])
    if mbytes < 1:
        raise ValueError(f"mbytes must be >= 1, got {mbytes}")
    set_threads(params, ctx)
    device = device_for(params["device"], ctx)
    n = mbytes * MIB // 4
    # Varying values (not a constant), so a copy that skips or shifts a block is caught.
    src = torch.arange(n, dtype=torch.float32, device=device)
    return {"src": src, "dst": torch.empty_like(src), "bytes": n * 4}


def run(state: dict) -> None:
    state["dst"].copy_(state["src"])


def derive(params: dict, state: dict, time_s: float) -> dict:
    return {"GBps": 2 * state["bytes"] / time_s / 1e9}


def check(state: dict) -> int:
    state["dst"].fill_(-1.0)
    run(state)
    return int((state["dst"] != state["src"]).sum())


SUITE = Suite(
    name="memcopy",
    schema={"mbytes": whole(1, 2**30), "device": DEVICE, "threads": THREADS},
    rules=(fits_in_memory(lambda p: 2 * int(p["mbytes"]) * MIB, {"mbytes": str(2**30)}),),
    params={"mbytes": [64, 256], "device": ["cpu"], "threads": [1]},
    quick={"mbytes": [16]},
    setup=setup,
    run=run,
    derive=derive,
    check=check,
    metrics=[
        Metric("GBps", "GB/s", "higher", description="2 x bytes copied / time_s (read + write)")
    ],
    param_help={
        "mbytes": "buffer size in MiB (float32)",
        "device": "cpu, cuda or auto",
        "threads": "CPU intra-op threads (0: torch's default)",
    },
)
