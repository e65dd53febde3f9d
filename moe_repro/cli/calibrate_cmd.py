"""``repro calibrate``: measure this machine's GEMM, attention and memory-copy ceilings and write a
``local`` platform profile (components.network.platform.local_profile) the planner can use."""

from __future__ import annotations

import os

import click

from moe_repro.cli.errors import BadInput, RunFailure


def _run(suite_name: str, point: dict, repeats: int, check: bool = True) -> dict:
    """The record of one grid point of a local suite, measured by the runner (warm-up,
    calibrated repeats, median and spread)."""
    from moe_repro.suites import all_suites
    from moe_repro.suites.runner import RunConfig, run_suite

    config = RunConfig(warmup=1, repeats=repeats, min_sample_s=0.05, check=check)
    [record] = run_suite(all_suites()[suite_name], [point], config)
    return record


def require_correct(record: dict) -> None:
    if record.get("correct") is False:
        raise RunFailure(f"suite {record['suite']} computed {record['wrong']} wrong elements; "
                         "its time is not a ceiling")


def measure_gemm_tflops(sizes: list[int], repeats: int) -> dict:
    """GEMM ceiling with suites/gemm.py (float32, CPU, the caller's threads): median TFLOP/s
    per size."""
    best = {}
    for n in sizes:
        rec = _run("gemm", {"n": n, "dtype": "float32", "device": "cpu"}, repeats, check=n <= 512)
        best[n] = {"tflops": rec["tflops"], "tflops_iqr": rec.get("tflops_iqr"), "correct": rec.get("correct")}
    return best


def measure_copy_GBps(mbytes: int, repeats: int) -> tuple[float, float]:
    """Memory bandwidth of a large tensor copy (suites/memcopy.py, one thread): median GB/s and
    the spread of the copy time (max - min sample, seconds)."""
    rec = _run("memcopy", {"mbytes": mbytes, "device": "cpu", "threads": 1}, repeats)
    require_correct(rec)
    return rec["GBps"], rec["time_s_max"] - rec["time_s_min"]


def measure_attention_tflops(seq: int, repeats: int) -> tuple[float, float]:
    """Causal SDPA (suites/attention.py, one thread, float32, batch 1) with 4 heads of 64, no
    GQA (switch-base's head shape): median TFLOP/s and the time spread (max - min, seconds)."""
    point = {"model": "switch-base", "seq_len": seq, "batch": 1, "heads": 4, "backward": False,
             "dtype": "float32", "device": "cpu", "threads": 1}
    rec = _run("attention", point, repeats)
    require_correct(rec)
    return rec["tflops"], rec["time_s_max"] - rec["time_s_min"]


@click.command("calibrate")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default="local-platform.json",
              show_default=True, help="Where to write the profile (use it as --platform FILE).")
@click.option("--ranks", type=int, default=None, help="Ranks ('GPUs') per node (default: CPU cores).")
@click.option("--quick", is_flag=True, help="Smaller sizes and fewer repeats (seconds).")
def command(out_path, ranks, quick) -> None:
    """Measure GEMM, attention and memory-copy ceilings on this machine (one thread = one rank)
    and write a `local` platform profile for `repro plan --platform FILE`."""
    import torch

    from moe_repro.records.atomic import atomic_write_json
    from moe_repro.components.network.platform import from_dict, local_profile
    from moe_repro.records.environment import collect_environment

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
