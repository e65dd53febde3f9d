"""``repro calibrate``: measure this machine's GEMM, attention and memory-copy ceilings and write a
``local`` platform profile (components.platform.local_profile) the planner can use."""

from __future__ import annotations

import os
import statistics
import time

import click

from moe_repro.cli.errors import BadInput


def _median_time(fn, repeats: int) -> tuple[float, float]:
    fn()  # warm-up
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples), (max(samples) - min(samples))


def measure_gemm_tflops(sizes: list[int], repeats: int) -> dict:
    """GEMM ceiling with suites/gemm.py (float32, CPU), one thread: the best median over sizes."""
    from moe_repro.suites.gemm import SUITE
    from moe_repro.suites.runner import RunConfig, run_point

    best = {}
    for n in sizes:
        rec = run_point(SUITE, {"n": n, "dtype": "float32", "device": "cpu"},
                        RunConfig(warmup=1, repeats=repeats, min_sample_s=0.05, check=n <= 512))
        best[n] = {"tflops": rec["tflops"], "tflops_iqr": rec.get("tflops_iqr"), "correct": rec.get("correct")}
    return best


def measure_copy_GBps(mbytes: int, repeats: int) -> tuple[float, float]:
    """Memory bandwidth of a large tensor copy: read + write = 2 x bytes per copy."""
    import torch

    n = mbytes * 2 ** 20 // 4
    src, dst = torch.ones(n), torch.empty(n)
    t, spread = _median_time(lambda: dst.copy_(src), repeats)
    return 2 * n * 4 / t / 1e9, spread


def measure_attention_tflops(seq: int, repeats: int) -> tuple[float, float]:
    """torch scaled_dot_product_attention, causal, float32: FLOPs 2 x 2 s^2 H d / 2 (causal)."""
    import torch
    import torch.nn.functional as F

    H, d = 4, 64
    q, k, v = (torch.randn(1, H, seq, d) for _ in range(3))
    t, spread = _median_time(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), repeats)
    return 2 * 2 * seq * seq * H * d / 2 / t / 1e12, spread


@click.command("calibrate")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default="local-platform.json",
              show_default=True, help="Where to write the profile (use it as --platform FILE).")
@click.option("--ranks", type=int, default=None, help="Ranks ('GPUs') per node (default: CPU cores).")
@click.option("--quick", is_flag=True, help="Smaller sizes and fewer repeats (seconds).")
def command(out_path, ranks, quick) -> None:
    """Measure GEMM, attention and memory-copy ceilings on this machine (one thread = one rank)
    and write a `local` platform profile for `repro plan --platform FILE`."""
    import torch

    from moe_repro.results.atomic import atomic_write_json
    from moe_repro.components.network.platform import from_dict, local_profile
    from moe_repro.results.environment import collect_environment

    cores = os.cpu_count() or 1
    ranks = ranks if ranks is not None else cores
    if ranks <= 0:
        raise BadInput(f"--ranks must be positive, got {ranks}")
    repeats = 3 if quick else 7
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gemm = measure_gemm_tflops([256, 512] if quick else [256, 512, 1024], repeats)
        copy, copy_spread = measure_copy_GBps(64 if quick else 256, repeats)
        attn, attn_spread = measure_attention_tflops(512 if quick else 1024, repeats)
    finally:
        torch.set_num_threads(threads)
    peak = max(v["tflops"] for v in gemm.values())
    try:
        mem_total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError):
        mem_total = 8.0
    env = collect_environment(["repro", "calibrate"])
    measured = {"gemm_float32_1thread": gemm, "copy_GBps": copy, "copy_spread_s": copy_spread,
                "attention_tflops": attn, "attention_spread_s": attn_spread, "cpu_count": cores,
                "memory_total_GB": mem_total, "cpu": env.get("cpu_model"), "when": env.get("timestamp")}
    doc = local_profile(peak, attn, copy, ranks, mem_total / ranks,
                        f"this machine ({env.get('cpu_model') or 'CPU'}), {ranks} ranks of one thread", measured)
    from_dict(doc)  # validate before writing
    atomic_write_json(out_path, doc)
    click.echo(f"GEMM ceiling (1 thread, fp32): {peak * 1e3:.1f} GFLOPS  "
               + " ".join(f"n={n}: {v['tflops'] * 1e3:.1f}" for n, v in gemm.items()))
    click.echo(f"attention (sdpa, causal): {attn * 1e3:.1f} GFLOPS; memory copy: {copy:.1f} GB/s")
    click.echo(f"wrote {out_path} (use: repro plan --platform {out_path} ...)")
