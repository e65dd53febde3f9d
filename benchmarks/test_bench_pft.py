"""PFT construction, gather (buffer dispatch) and weighted scatter (buffer combine), X-MoE App. B.2/B.4."""

import torch

from _shapes import EXPERTS, TOKENS
from moe_repro.components.moe.pft import build_pft, gather_tokens, scatter_combine


def test_build_pft(benchmark, routing):
    _, experts, weights = routing
    pft = benchmark(build_pft, experts, weights, EXPERTS)
    # Reference: pairs sorted by (expert, token) with a plain Python sort.
    pairs = sorted((e, t) for t, row in enumerate(experts.tolist()) for e in row)
    assert list(zip(pft.expert_ids.tolist(), pft.token_ids.tolist())) == pairs
    assert pft.tokens_per_expert[10] == pft.tokens_per_expert[11] == 0


def test_gather(benchmark, routing):
    x, experts, weights = routing
    pft = build_pft(experts, weights, EXPERTS)
    rows = benchmark(gather_tokens, x, pft)
    assert torch.equal(rows, torch.stack([x[t] for t in pft.token_ids.tolist()]))


def test_scatter_combine(benchmark, routing):
    x, experts, weights = routing
    pft = build_pft(experts, weights, EXPERTS)
    y = torch.randn(pft.num_rows, x.shape[1], generator=torch.Generator().manual_seed(1))
    out = benchmark(scatter_combine, y, pft)
    # Reference: a dense [S, N] combine matrix in float64.
    combine = torch.zeros(TOKENS, pft.num_rows, dtype=torch.float64)
    combine[pft.token_ids, torch.arange(pft.num_rows)] = pft.combine_weights.double()
    assert torch.allclose(out.double(), combine @ y.double(), atol=1e-5)
