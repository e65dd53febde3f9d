"""The planner's HBM-bound kernels: non-GEMM traffic and materialised attention scores."""

import pytest

from moe_repro.components.network.platform import load_builtin
from moe_repro.components.resources import formulas as F
from moe_repro.components.resources.parallel_planner import plan_parallel
from moe_repro.components.model.zoo import megatron_gpt


def test_elementwise_bytes_counted_kernel_by_kernel():
    # GPT-3 175B, TP 8 without SP, materialised scores, dropout. Forward values of 2 B per token:
    # 2 layer norms read + write h (4 h), 2 bias-dropout-adds read 2 h write h (6 h), bias + GeLU
    # read + write 4h / 8, softmax read + write a s / 8, attention dropout read + write a s / 8;
    # 1-byte masks: 2 hidden dropouts (h each) and the attention dropout (a s / 8).
    h, a, s = 12288, 96, 2048
    values = 4 * h + 6 * h + 2 * 4 * h / 8 + 2 * a * s / 8 + 2 * a * s / 8
    masks = 2 * h + a * s / 8
    got = F.elementwise_bytes_per_token(
        h, a, s, 4 * h, n_mat=2, t=8, sp=False, flash=False, dropout=True
    )
    assert got == 2 * values + masks
    # FlashAttention keeps the scores out of HBM; no dropout, no masks
    assert F.elementwise_bytes_per_token(h, a, s, 4 * h, 2, 8, False, True, False) == 2 * (
        10 * h + h
    )


def test_materialised_scores_make_a_small_head_model_hbm_bound():
    # Narayanan et al.'s 1.7B GPT (24 heads of 96, s = 2048) on one A100: QK^T and AV per token
    # and layer, 2 s a (96 + 96) = 18.9 MFLOP unhalved, take 70 ns at 267.9 TFLOPS while their
    # 4 a s bytes of scores (196,608 B) take 109 ns at 1800 GB/s (the profile's measured HBM rate):
    # the scores bind. The profile's rates alone (without its measured layer's kernel-time factor,
    # which would scale every term here alike).
    from moe_repro.components.resources.time_model import uncalibrated

    m = megatron_gpt(24, 2304, 24, 51200)
    p = uncalibrated(load_builtin("dgx-a100"))
    kw = dict(
        seq=2048,
        tp=1,
        pp=1,
        global_batch=32,
        micro_batches=1,
        recompute=("none",),
        zero=(0,),
        precision="megatron",
        dropout=False,
    )
    flash = plan_parallel(m, p, 4, flash_attention=True, **kw).candidates[0]
    plain = plan_parallel(m, p, 4, flash_attention=False, **kw).candidates[0]
    tokens = 2048 * flash.micro_batch
    scores = 3 * 24 * 4 * 24 * 2048 / 1800e9 * tokens  # forward + backward (2x), 24 layers
    softmax = 2.5 * 24 * 2 * 24 * 2048 * 2 / 1800e9 * tokens  # softmax read + write, 2.5 passes
    flash_core = 3 * 24 * (2 * 2048 * 24 * 192 / 2) / 267.9e12 * tokens
    assert plain.parts["compute"] - flash.parts["compute"] == pytest.approx(
        scores + softmax - flash_core, rel=1e-9
    )


def test_gradient_all_reduce_exposed_when_not_overlapped():
    # Megatron-LM of 2021 all-reduces gradients after the last micro-batch's backward: the whole
    # ring all-reduce adds to the step. 1.7B GPT on 4 DGX A100 nodes, DP 32, fp32 main gradients
    # (preset megatron, 4 B): parameters = 24 layers x (12 h^2 + 2 h norms) + V h (tied head) + h
    # (final norm); ring: 2 (n - 1) / n of the bytes at the per-GPU NIC rate, 25 GB/s.
    m = megatron_gpt(24, 2304, 24, 51200)
    p = load_builtin("dgx-a100")
    kw = dict(
        seq=2048,
        tp=1,
        pp=1,
        global_batch=512,
        micro_batches=16,
        recompute=("full",),
        zero=(0,),
        precision="megatron",
        flash_attention=False,
    )
    hidden = plan_parallel(m, p, 4, overlap_dp=True, **kw).candidates[0]
    exposed = plan_parallel(m, p, 4, overlap_dp=False, **kw).candidates[0]
    n_params = 24 * (12 * 2304**2 + 2 * 2304) + 51200 * 2304 + 2304
    ring = 2 * 31 / 32 * 4 * n_params / 25e9
    assert exposed.parts["dp"] == pytest.approx(ring, rel=1e-9)
    assert hidden.parts["dp"] < exposed.parts["dp"]
    assert exposed.step_s - exposed.parts["dp"] == pytest.approx(
        hidden.step_s - hidden.parts["dp"], rel=1e-12
    )
