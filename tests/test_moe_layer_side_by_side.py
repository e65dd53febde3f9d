"""The moe-layer suite's side-by-side: each implementation's expert kernel (ours: auto's choice;
a peer on a capacity buffer: its fixed bmm), overlap chunks only where our pipelining applies,
the ratio to the best peer, the expert GEMMs' achieved rate and its fraction of the machine's
measured grouped-GEMM ceiling (the kernel table's rate at the shape, scaled to the cores)."""

import os

import torch

from moe_repro.components.moe import kernel_choice as kc
from moe_repro.suites.moe_layer import expert_flops, gemm_ceiling, gemm_used, side_by_side

POINT = dict(
    stage="layer",
    ranks=2,
    dtype="float32",
    backward=1,
    tokens=64,
    d_model=32,
    d_ffn=16,
    experts=8,
    top_k=2,
    device="cpu",
    gemm="auto",
    overlap="auto",
)


def _measured_fp32_rate(tflops: float) -> None:
    """A kernel table with one fp32 grouped_mm entry at the layer's shape (32 rows per expert,
    K 32, M 16), measured at one thread."""
    kc.write_table(
        [
            dict(
                device="cpu",
                dtype="float32",
                tokens_per_expert=32,
                K=32,
                M=16,
                kernel="grouped_mm",
                tflops=tflops,
                threads=1,
            )
        ]
    )


def test_peers_say_their_own_kernel_and_do_not_pipeline():
    ds = gemm_used(dict(POINT, impl="deepspeed"))
    assert ds == {"gemm_used": "bmm", "gemm_rule": "fixed", "overlap_chunks": 1}
    mg = gemm_used(dict(POINT, impl="megatron"))  # our experts on its rows: auto's choice
    assert mg["gemm_used"] == kc.fallback_kernel("cpu", torch.float32)
    assert mg["overlap_chunks"] == 1
    assert gemm_used(dict(POINT, impl="pft", overlap="2"))["overlap_chunks"] == 2
    assert gemm_used(dict(POINT, impl="pft"))["overlap_chunks"] == 1  # auto on a CPU
    assert gemm_used(dict(POINT, impl="pft", stage="expert"))["overlap_chunks"] == 1


def test_expert_flops_counts_three_matrices_and_the_backward():
    fwd = expert_flops(dict(POINT, backward=0))
    assert fwd == 2 * (2 * 64 * 2) * 32 * 16 * 3  # ranks*tokens*top_k rows, 3 H x F matrices
    assert expert_flops(POINT) == 3 * fwd


def test_ceiling_from_the_table_scaled_to_the_cores():
    assert gemm_ceiling(POINT) is None  # no measurement near the shape: no roofline
    # the layer's rows per expert: 64 * 2 * 2 / 8 = 32
    _measured_fp32_rate(0.05)
    cores = min(2, os.cpu_count() or 1)
    assert gemm_ceiling(dict(POINT, threads=1)) == 0.05e12 * cores
    assert gemm_ceiling(dict(POINT, dtype="bfloat16")) is None  # another dtype's rate: none


def test_side_by_side_ratio_to_the_best_peer_and_roofline():
    _measured_fp32_rate(1e-3)
    recs = [
        dict(POINT, impl="pft", time_s=0.5, threads=1, gemm_used="grouped_mm", overlap_chunks=2),
        dict(POINT, impl="megatron", time_s=1.0, threads=1, gemm_used="grouped_mm"),
        dict(POINT, impl="deepspeed", time_s=0.8, threads=1, gemm_used="bmm"),
        dict(POINT, impl="pft", stage="expert", time_s=0.1),  # not a whole layer: left out
    ]
    lines = side_by_side(recs)
    assert len(lines) == 4
    pft, megatron, deepspeed = lines[1:]
    assert "x best peer 0.62" in pft and "x best peer 1.00" in deepspeed
    assert "x best peer 1.25" in megatron
    assert "bmm" in deepspeed and "chunks 2" in pft
    rate = expert_flops(POINT) / 0.5
    cores = min(2, os.cpu_count() or 1)
    assert f"{rate / (1e-3 * 1e12 * cores):.0%}" in pft
    assert side_by_side([recs[0]]) == []  # one implementation: nothing side by side
