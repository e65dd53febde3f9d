"""Top-k gating against a per-token Python reference."""

import math

import pytest
import torch

from moe_repro.components.moe.gating import TopKGate, top_k_gating


def _reference(logits_row, k, score, normalize):
    vals = [float(v) for v in logits_row]
    if score == "softmax":
        m = max(vals)
        z = sum(math.exp(v - m) for v in vals)
        scores = [math.exp(v - m) / z for v in vals]
    else:
        scores = [1 / (1 + math.exp(-v)) for v in vals]
    chosen = sorted(range(len(vals)), key=lambda e: -scores[e])[:k]
    total = sum(scores[e] for e in chosen)
    return chosen, [scores[e] / total if normalize else scores[e] for e in chosen]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(
    "score,normalize", [("softmax", False), ("softmax", True), ("sigmoid", None)]
)
def test_top_k_matches_reference(seed, score, normalize):
    logits = torch.randn(13, 9, generator=torch.Generator().manual_seed(seed))
    out = top_k_gating(logits, 3, score, normalize)
    assert out.top_experts.shape == (13, 3) and out.combine_weights.shape == (13, 3)
    assert out.scores.shape == (13, 9)  # [S, E], never [S, E, C]
    for s in range(13):
        experts, weights = _reference(
            logits[s], 3, score, score == "sigmoid" if normalize is None else normalize
        )
        assert out.top_experts[s].tolist() == experts
        assert out.combine_weights[s].tolist() == pytest.approx(weights, rel=1e-5)


def test_gate_module_differentiates_through_weights():
    gate = TopKGate(6, 5, 2, score="sigmoid")
    x = torch.randn(8, 6)
    gate(x).combine_weights.sum().backward()
    assert gate.weight.grad is not None and gate.weight.grad.shape == (6, 5)


def test_bad_input():
    with pytest.raises(ValueError):
        top_k_gating(torch.randn(4, 3), 4)
    with pytest.raises(ValueError):
        top_k_gating(torch.randn(4, 3), 1, score="relu")
    with pytest.raises(ValueError):
        TopKGate(4, 3, 0)
