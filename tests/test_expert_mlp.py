"""Every grouped GEMM variant equals a per-expert matmul, forward and backward, empty groups included."""

import pytest
import torch
import torch.nn.functional as F

from moe_repro.components.moe.expert_mlp import ExpertMLP, grouped_gemm, grouped_gemm_names


def _per_expert(x, w, counts):
    out, start = [], 0
    for g, c in enumerate(counts):
        for row in range(start, start + c):
            out.append(x[row] @ w[g])
        start += c
    return torch.stack(out) if out else x.new_zeros(0, w.shape[2])


@pytest.mark.parametrize("variant", grouped_gemm_names())
@pytest.mark.parametrize(
    "counts,k,m", [([5, 0, 7, 1], 8, 12), ([0, 0, 3], 7, 5), ([0, 0], 4, 4), ([9], 6, 3)]
)
def test_variant_equals_per_expert_matmul(variant, counts, k, m):
    g = torch.Generator().manual_seed(sum(counts) + k)
    x = torch.randn(sum(counts), k, generator=g, requires_grad=True)
    w = torch.randn(len(counts), k, m, generator=g, requires_grad=True)
    grad = torch.randn(sum(counts), m, generator=g)
    y = grouped_gemm(x, w, torch.tensor(counts), variant)
    (y * grad).sum().backward()
    xr, wr = x.detach().double().requires_grad_(True), w.detach().double().requires_grad_(True)
    ref = _per_expert(xr, wr, counts)
    if ref.requires_grad:
        (ref * grad.double()).sum().backward()
    assert torch.allclose(y.double(), ref, atol=1e-5)
    if sum(counts):
        assert torch.allclose(x.grad.double(), xr.grad, atol=1e-5)
    ref_wgrad = wr.grad if wr.grad is not None else torch.zeros_like(wr)
    assert torch.allclose(w.grad.double(), ref_wgrad, atol=1e-5)
    for e, c in enumerate(counts):  # an expert without tokens gets exactly zero gradient
        if c == 0:
            assert torch.count_nonzero(w.grad[e]) == 0


@pytest.mark.parametrize("variant", grouped_gemm_names())
def test_sum_loss_backward(variant):
    """An expanded (stride-0) incoming gradient: _grouped_mm's backward needs it contiguous."""
    x = torch.randn(10, 8, requires_grad=True)
    w = torch.randn(3, 8, 16, requires_grad=True)
    grouped_gemm(x, w, torch.tensor([4, 0, 6]), variant).sum().backward()
    assert torch.allclose(w.grad[2], x[4:].detach().sum(0)[:, None].expand(8, 16), atol=1e-5)


@pytest.mark.parametrize("activation", ["swiglu", "gelu"])
def test_expert_mlp_matches_per_token_ffn(activation):
    torch.manual_seed(5)
    mlp = ExpertMLP(4, 8, 6, activation=activation)
    counts = [3, 0, 5, 2]
    x = torch.randn(10, 8)
    ys = {v: mlp(x, torch.tensor(counts), gemm=v) for v in grouped_gemm_names()}
    rows, start = [], 0
    for e, c in enumerate(counts):
        for t in range(start, start + c):
            up = x[t] @ mlp.w_in[e]
            h = F.silu(x[t] @ mlp.w_gate[e]) * up if activation == "swiglu" else F.gelu(up)
            rows.append(h @ mlp.w_out[e])
        start += c
    ref = torch.stack(rows)
    for v, y in ys.items():
        assert torch.allclose(y, ref, atol=1e-5), v
    padded = torch.zeros(4, 5, 8)
    start = 0
    for e, c in enumerate(counts):
        padded[e, :c] = x[start : start + c]
        start += c
    out = mlp.forward_padded(padded)
    assert torch.allclose(out[2, :5], ref[3:8], atol=1e-5)


def test_bad_input():
    with pytest.raises(ValueError):
        grouped_gemm(torch.randn(4, 3), torch.randn(2, 3, 3), torch.tensor([1, 2]))
    with pytest.raises(ValueError):
        grouped_gemm(torch.randn(3, 3), torch.randn(2, 3, 3), torch.tensor([1, 2]), "cublas")
    with pytest.raises(ValueError):
        ExpertMLP(2, 4, 4, activation="tanh")
