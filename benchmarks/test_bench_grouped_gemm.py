"""Each registered grouped GEMM kernel vs the dense GEMM of equal FLOPs, at one shape (256 tokens
per expert).

Compare the medians: the issue's goal is the best variant >= 80% of dense (time_dense / time_variant).
The sweep over shapes and tokens per expert is `repro bench expert-gemm`.
"""

import pytest
import torch

from moe_repro.components.moe.grouped_gemm import grouped_gemm, grouped_gemm_names

TOKENS_PER_EXPERT, LOCAL_EXPERTS, K, M = 256, 4, 512, 1024  # xmoe-small-like K, M = 2 x 512


@pytest.fixture(scope="module")
def operands():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(TOKENS_PER_EXPERT * LOCAL_EXPERTS, K, generator=g)
    w = torch.randn(LOCAL_EXPERTS, K, M, generator=g) * K**-0.5
    counts = torch.full((LOCAL_EXPERTS,), TOKENS_PER_EXPERT, dtype=torch.int64)
    return x, w, counts


def _reference(x, w, counts):
    chunks = torch.split(x.double(), counts.tolist())
    return torch.cat([c @ w[g].double() for g, c in enumerate(chunks)])


@pytest.mark.parametrize("variant", grouped_gemm_names())
def test_grouped_gemm(benchmark, operands, variant):
    x, w, counts = operands
    benchmark.extra_info["flops"] = 2 * x.shape[0] * K * M
    with torch.no_grad():
        y = benchmark(grouped_gemm, x, w, counts, variant)
    assert torch.allclose(
        y.double(), _reference(x, w, counts), atol=8 * torch.finfo(x.dtype).eps * K
    )


def test_dense_equal_flops(benchmark, operands):
    x, w, _ = operands
    w0 = w[0].contiguous()
    benchmark.extra_info["flops"] = 2 * x.shape[0] * K * M
    with torch.no_grad():
        y = benchmark(torch.mm, x, w0)
    assert torch.allclose(
        y.double(), x.double() @ w0.double(), atol=8 * torch.finfo(x.dtype).eps * K
    )
