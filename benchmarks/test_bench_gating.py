"""Top-k gating: router GEMM, softmax scores, top-k (no dense [S, E, C] mask)."""

import torch

from _shapes import EXPERTS, HIDDEN, TOP_K
from moe_repro.components.moe.gating import TopKGate


def test_gating(benchmark, routing):
    x, _, _ = routing
    torch.manual_seed(0)
    gate = TopKGate(HIDDEN, EXPERTS, TOP_K)
    with torch.no_grad():
        out = benchmark(gate, x)
    # Reference: float64 scores, the k largest per token by sorting each row in Python.
    scores = torch.softmax(x.double() @ gate.weight.detach().double(), -1)
    for t in range(0, x.shape[0], 97):
        best = sorted(range(EXPERTS), key=lambda e: -float(scores[t, e]))[:TOP_K]
        assert out.top_experts[t].tolist() == best
        assert torch.allclose(out.combine_weights[t].double(), scores[t, best], atol=1e-6)
