"""Measure one GPU's bf16 GEMM rate across the shapes a transformer layer runs, for checking the
planner's shape-dependent GEMM rate (components/resources/time_model.gemm_efficiency: tile and
wave quantization under a measured ceiling) against a real device.

    python benchmarks/gemm_shape_curve.py --out gemm_shapes.json     # needs a CUDA GPU

A training step keeps the GPU busy for seconds, and a busy GPU lowers its clock to stay within
its power limit, so a GEMM timed on a cold GPU (a burst) overstates what a step gets. The script
therefore measures in three phases: the burst rate of an 8192^3 product on the cold GPU; the
sustained rate of the same product over ``--heat-s`` seconds of back-to-back work (its median is
the ceiling a planner should use); then every shape, in a shuffled order, on the hot GPU. A
device-to-device copy gives the HBM rate. Each sample is timed with CUDA events around
``--inner`` back-to-back products; medians and spreads are written with the device, the library
versions and the SM clock and power read along the way (measured numbers, never modelled: the
file says so).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

# rows = tokens a GEMM sees (a micro-batch's tokens, or one expert's), n = the output width of
# one TP shard; k = the model width. Wave boundaries of a 132- or 108-SM GPU are crossed on purpose.
ROWS = (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
NS = (1024, 1536, 2304, 3072, 4096, 6144, 12800)
KS = (4096,)
CUBES = (1024, 2048, 4096, 8192)


def smi_clock() -> str:
    try:
        return subprocess.run(
            ["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,power.draw", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def time_gemm(
    torch, rows: int, k: int, n: int, inner: int, repeats: int, batch: int = 0, graph: bool = False
) -> list[float]:
    """Seconds per product of [rows x k] @ [k x n] (``batch`` > 0: a batched product of that
    many, torch.bmm, as an attention core's QK^T and AV). ``graph``: the ``inner`` products are
    captured once in a CUDA graph and replayed, so the GPU never waits for the host to launch
    the next one (as in a training step, where the host runs ahead): eager launches from Python
    cost microseconds each, more than a thin GEMM's kernel."""
    lead = (batch,) if batch else ()
    a = torch.randn(*lead, rows, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(*lead, k, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(*lead, rows, n, device="cuda", dtype=torch.bfloat16)
    mm = torch.bmm if batch else torch.mm
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as graph capture asks
        for _ in range(3):
            mm(a, b, out=c)
    torch.cuda.current_stream().wait_stream(side)
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(inner):
                mm(a, b, out=c)

        def products():
            g.replay()
    else:

        def products():
            for _ in range(inner):
                mm(a, b, out=c)

    products()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        products()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) / 1e3 / inner)
    return samples


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--inner", type=int, default=20, help="products per timed sample")
    ap.add_argument("--repeats", type=int, default=5, help="timed samples per shape and pass")
    ap.add_argument("--passes", type=int, default=2, help="passes over the shuffled shapes")
    ap.add_argument("--heat-s", type=float, default=20.0, help="seconds of sustained 8192^3 work")
    ap.add_argument(
        "--graph",
        action="store_true",
        help="replay each shape's products from a CUDA graph (the kernels' time, no launch gaps)",
    )
    ap.add_argument(
        "--shapes",
        help="JSON file with 'gemm' ([rows, k, n] lists) and 'bmm' ([batch, rows, "
        "k, n]) to measure instead of the built-in curve",
    )
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gemm_shape_curve: needs a CUDA GPU", file=sys.stderr)
        return 2
    import random
    import time

    if args.shapes:
        with open(args.shapes) as f:
            given = json.load(f)
        shapes = [(0, *map(int, g)) for g in given.get("gemm", [])] + [
            tuple(map(int, g)) for g in given.get("bmm", [])
        ]
    else:
        shapes = [(0, m, k, n) for k in KS for n in NS for m in ROWS] + [
            (0, c, c, c) for c in CUBES
        ]
    shapes = list(dict.fromkeys(shapes))  # a cube can also be a curve point (4096^3): timed once
    props = torch.cuda.get_device_properties(0)
    out = {
        "how": "measured",
        "device": props.name,
        "sm_count": props.multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "launch": "CUDA graph replay" if args.graph else "eager (one Python call per product)",
        "method": f"CUDA events around {args.inner} back-to-back torch.mm (bf16 in, bf16 out, "
        f"fp32 accumulate), {'replayed from a CUDA graph' if args.graph else 'launched eagerly'}; burst on the cold GPU, sustained over {args.heat_s} s, then "
        f"{args.passes} shuffled passes of {args.repeats} samples per shape on the hot GPU",
        "clock_cold": smi_clock(),
    }
    big = 8192
    burst = time_gemm(torch, big, big, big, 5, 3)
    out["burst_tflops"] = 2 * big**3 / statistics.median(burst) / 1e12
    print(f"burst 8192^3: {out['burst_tflops']:.1f} TFLOP/s", flush=True)
    heat, clocks, t0 = [], [], time.monotonic()
    while time.monotonic() - t0 < args.heat_s:
        heat += time_gemm(torch, big, big, big, args.inner, 1)
        if len(heat) % 10 == 0:
            clocks.append(smi_clock())
    out["sustained_tflops"] = 2 * big**3 / statistics.median(heat[len(heat) // 2 :]) / 1e12
    out["sustained_samples_tflops"] = [2 * big**3 / s / 1e12 for s in heat]
    out["clock_sustained"] = clocks
    print(
        f"sustained 8192^3 (second half of {args.heat_s} s): {out['sustained_tflops']:.1f} TFLOP/s; "
        f"clocks {clocks[-1:]}",
        flush=True,
    )
    samples: dict = {s: [] for s in shapes}
    order = list(shapes)
    for p in range(args.passes):
        random.Random(p).shuffle(order)
        for bt, m, k, n in order:
            samples[(bt, m, k, n)] += time_gemm(
                torch, m, k, n, args.inner, args.repeats, bt, args.graph
            )
        print(f"pass {p + 1}/{args.passes} done; clock {smi_clock()}", flush=True)
    out["points"] = []
    for (bt, m, k, n), s in samples.items():
        med = statistics.median(s)
        out["points"].append(
            {
                **({"batch": bt} if bt else {}),
                "rows": m,
                "k": k,
                "n": n,
                "median_s": med,
                "min_s": min(s),
                "max_s": max(s),
                "tflops": 2 * max(bt, 1) * m * k * n / med / 1e12,
            }
        )
    x = torch.empty(2**30, device="cuda", dtype=torch.float32)  # 4 GiB
    y = torch.empty_like(x)
    copy = []
    for _ in range(6):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        y.copy_(x)
        stop.record()
        stop.synchronize()
        copy.append(start.elapsed_time(stop) / 1e3)
    out["copy_GBps_read_plus_write"] = 2 * x.numel() * 4 / statistics.median(copy[1:]) / 1e9
    print(f"device copy: {out['copy_GBps_read_plus_write']:.0f} GB/s (read + write)", flush=True)
    out["clock_end"] = smi_clock()
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(args.out)) or ".")
    with os.fdopen(fd, "w") as f:
        json.dump(out, f, indent=1)
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
