"""bf16 as a first-class path: every grouped-GEMM kernel (``auto`` included) and the MoE layer,
forward and backward, against float64 loop references on the bf16-rounded operands, fresh
random inputs, uneven groups and empty experts; one rank here, 2 real gloo ranks below.

Tolerance: |error| <= 2e-2 of the reference's largest value (bf16 keeps 8 mantissa bits; the
layer's sums run over H, F <= 32 terms). Each test also checks that a wrong answer (one group's
rows sent through its neighbour's weight) exceeds the tolerance: the check can fail.
"""

import pytest
import torch

from _moe_targets import load_local, make_tokens, make_weights, max_err, reference_grads
from moe_repro.components.moe.grouped_gemm import gemm_choices, grouped_gemm
from moe_repro.components.moe.moe_layer import MoELayer
from moe_repro.runtime.launch import run_ranks

BF16_TOL = 2e-2
BF16 = torch.bfloat16


def _loop(x, w, counts):
    return torch.cat([c @ w[g] for g, c in enumerate(torch.split(x, counts))])


@pytest.mark.parametrize("kernel", gemm_choices())
@pytest.mark.parametrize("seed", [0, 1])
def test_every_kernel_bf16_forward_and_backward(kernel, seed):
    g = torch.Generator().manual_seed(100 + seed)
    counts = [5, 0, 17, 1, 0, 9][: 4 + seed * 2]  # uneven, with empty groups
    k, m = 24, 20 + seed  # an odd width on seed 1 (grouped_mm pads to 16-byte rows)
    x = torch.randn(sum(counts), k, generator=g).to(BF16).requires_grad_()
    w = (torch.randn(len(counts), k, m, generator=g) * k**-0.5).to(BF16).requires_grad_()
    dy = torch.randn(sum(counts), m, generator=g).to(BF16)
    y = grouped_gemm(x, w, torch.tensor(counts), kernel)
    assert y.dtype == BF16
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    ref = _loop(x64, w64, counts)
    rdx, rdw = torch.autograd.grad(ref, (x64, w64), dy.double())
    errs = {"y": max_err(y, ref.detach()), "dx": max_err(dx, rdx), "dw": max_err(dw, rdw)}
    assert max(errs.values()) < BF16_TOL, errs
    wrong = _loop(x64, w64.roll(1, 0), counts)  # the check can fail
    assert max_err(wrong.detach(), ref.detach()) > BF16_TOL


def _bf16_weights(seed, h, f, e, dead, shared):
    """make_weights rounded to bf16 (what the layer holds), kept as float for the reference."""
    return {n: t.to(BF16).float() for n, t in make_weights(seed, h, f, e, dead, shared).items()}


@pytest.mark.parametrize("gemm", gemm_choices())
@pytest.mark.parametrize("seed", [0, 1])
def test_layer_bf16_equals_reference(gemm, seed):
    h, f, e, k = 16, 12, 6, 2
    w = _bf16_weights(seed, h, f, e, (1, 4), seed)
    x, grad_out = make_tokens(seed + 7, 29, h)
    x, grad_out = x.to(BF16), grad_out.to(BF16)
    layer = MoELayer(h, f, e, k, num_shared=seed, gemm=gemm, dtype=BF16)
    load_local(layer, w)
    counts = layer.make_pft(layer.route(x)).tokens_per_expert.tolist()
    assert counts[1] == counts[4] == 0 and len(set(counts)) > 2, counts  # uneven, empty
    x.requires_grad_(True)
    out = layer(x)
    assert out.dtype == BF16
    (out * grad_out).sum().backward()
    ref_out, ref_dx, ref_grads = reference_grads(x.detach().float(), grad_out.float(), w, k)
    errs = {"out": max_err(out.detach(), ref_out), "dx": max_err(x.grad, ref_dx)}
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.dtype == BF16, name
        errs[name] = max_err(p.grad, ref_grads[name])
    assert max(errs.values()) < BF16_TOL, errs
    assert max_err(torch.zeros_like(ref_out), ref_out) > BF16_TOL  # the check can fail


@pytest.mark.multiprocess
def test_layer_bf16_two_gloo_ranks(targets_on_path):
    base = dict(d_model=16, d_ffn=12, top_k=2, dtype="bfloat16")
    cases = [
        dict(base, seed=21, experts=4, tokens=[19, 7], dead=(1,), gemm="auto"),
        dict(base, seed=22, experts=4, tokens=[0, 13], dead=(2, 3), gemm="padded_bmm", shared=1),
        dict(base, seed=23, experts=6, tokens=[11, 14], rank_of_expert=[1, 0, 1, 1, 0, 0]),
    ]
    results = run_ranks(
        "_moe_targets:layer_vs_reference", {"cases": cases}, world_size=2, timeout_s=120
    )
    for rank_results in results:
        for r in rank_results:
            assert max(r["errs"].values()) < BF16_TOL, r
