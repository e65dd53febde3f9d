"""All-reduce latency and bandwidth over real ranks (gloo via torch.distributed, or MPI).

Byte count and bandwidth formulas, as nccl-tests declares them for all_reduce:
    algbw = bytes / time_s
    busbw = algbw * 2 (n - 1) / n     (each rank sends and receives 2 (n-1)/n of the buffer
                                       in a bandwidth-optimal ring; busbw compares to link speed)
"""

from __future__ import annotations

import numpy as np

from moe_repro.components.lazy_import import lazy_module

from moe_repro.suites.base import Metric, Suite, fits_in_memory, one_of, whole

torch = lazy_module("torch", globals())  # imported by the ranks; the parent only validates the grid


def setup(params: dict, ctx) -> dict:
    nbytes = int(params["bytes"])
    if nbytes < 4 or nbytes % 4:
        raise ValueError(f"bytes must be a positive multiple of 4 (float32), got {nbytes}")
    n = nbytes // 4
    state = {"ctx": ctx, "n": n, "backend": params["backend"]}
    if params["backend"] == "mpi":
        # Zeros keep repeated in-place sums finite; the check uses its own buffer.
        state.update(send=np.zeros(n, np.float32), recv=np.empty(n, np.float32))
    else:
        state["buf"] = torch.zeros(n, device=ctx.device)  # nccl: this rank's GPU
    return state


def run(state: dict) -> None:
    if state["backend"] == "mpi":
        state["ctx"].comm.Allreduce(state["send"], state["recv"])
    else:
        import torch.distributed as dist

        dist.all_reduce(state["buf"])


def check(state: dict) -> int:
    """Every rank contributes rank+1 (+ a per-element offset); count elements != the exact sum."""
    ctx, n = state["ctx"], state["n"]
    w = ctx.world_size
    offsets = np.arange(n, dtype=np.float32) % 7
    mine = (ctx.rank + 1 + offsets).astype(np.float32)
    expected = (w * (w + 1) / 2 + w * offsets).astype(np.float32)
    if state["backend"] == "mpi":
        out = np.empty_like(mine)
        ctx.comm.Allreduce(mine, out)
    else:
        import torch.distributed as dist

        t = torch.from_numpy(mine.copy()).to(ctx.device)
        dist.all_reduce(t)
        out = t.cpu().numpy()
    return int((out != expected).sum())


def derive(params: dict, state: dict, time_s: float) -> dict:
    nbytes, w = int(params["bytes"]), int(params["ranks"])
    algbw = nbytes / time_s
    return {
        "latency_us": time_s * 1e6,
        "algbw_GBps": algbw / 1e9,
        "busbw_GBps": algbw * 2 * (w - 1) / w / 1e9,
    }


SUITE = Suite(
    name="allreduce",
    # A rank holds the buffer and, for the check, three more of its size (numpy).
    schema={
        "ranks": whole(1, 65536),
        "backend": one_of("gloo", "mpi"),
        "bytes": whole(4, 2**40, multiple_of=4),
    },
    rules=(
        fits_in_memory(
            lambda p: 4 * int(p["bytes"]) * int(p["ranks"]), {"bytes": str(2**38), "ranks": "2"}
        ),
    ),
    params={"ranks": [2, 4], "backend": ["gloo", "mpi"], "bytes": [8, 4096, 262144, 4194304]},
    quick={"bytes": [8, 65536]},
    world_params=("ranks", "backend"),
    setup=setup,
    run=run,
    derive=derive,
    check=check,
    metrics=[
        Metric("latency_us", "us", "lower"),
        Metric("algbw_GBps", "GB/s", "higher", description="bytes / time_s"),
        Metric("busbw_GBps", "GB/s", "higher", description="algbw * 2(n-1)/n"),
    ],
    param_help={
        "ranks": "world size (real processes on this machine)",
        "backend": "gloo (torch.distributed), nccl (GPUs: cuda:LOCAL_RANK) or mpi (mpi4py "
        "under mpiexec)",
        "bytes": "buffer size in bytes (multiple of 4)",
    },
)
