"""PFT construction, gather and scatter against plain Python loops (X-MoE Listing 1)."""

import pytest
import torch

from moe_repro.components.moe.pft import build_pft, gather_tokens, scatter_combine


def _routing(seed, s, e, k, dead=()):
    g = torch.Generator().manual_seed(seed)
    live = [x for x in range(e) if x not in dead]
    experts = (
        torch.stack(
            [torch.tensor(live)[torch.randperm(len(live), generator=g)[:k]] for _ in range(s)]
        )
        if s
        else torch.zeros(0, k, dtype=torch.int64)
    )
    weights = torch.rand(s, k, generator=g)
    return experts, weights


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pairs_sorted_by_expert_then_token(seed):
    experts, weights = _routing(seed, 19, 7, 3, dead=(2, 5))
    pft = build_pft(experts, weights, 7)
    expected = sorted(
        (int(experts[t, j]), t, float(weights[t, j])) for t in range(19) for j in range(3)
    )
    got = list(zip(pft.expert_ids.tolist(), pft.token_ids.tolist()))
    assert got == [x[:2] for x in expected]
    assert pft.combine_weights.tolist() == pytest.approx([x[2] for x in expected])
    assert pft.tokens_per_expert.tolist() == [
        sum(1 for x in expected if x[0] == ex) for ex in range(7)
    ]
    assert pft.tokens_per_expert[2] == pft.tokens_per_expert[5] == 0


@pytest.mark.parametrize("seed,capacity", [(0, 0), (1, 2), (2, 5), (3, 100)])
def test_capacity_keeps_highest_weights(seed, capacity):
    experts, weights = _routing(seed, 30, 5, 2)
    pft = build_pft(experts, weights, 5, capacity=capacity)
    for ex in range(5):
        pairs = sorted(
            (
                (float(weights[t, j]), t)
                for t in range(30)
                for j in range(2)
                if int(experts[t, j]) == ex
            ),
            key=lambda p: -p[0],
        )[:capacity]
        rows = pft.expert_ids == ex
        assert pft.token_ids[rows].tolist() == sorted(t for _, t in pairs)  # token order kept
        assert int(pft.tokens_per_expert[ex]) == len(pairs)


def test_gather_and_scatter_match_loops_and_differentiate():
    experts, weights = _routing(4, 11, 6, 2, dead=(0,))
    weights.requires_grad_(True)
    x = torch.randn(11, 5, requires_grad=True)
    pft = build_pft(experts, weights, 6, capacity=3)
    rows = gather_tokens(x, pft)
    for i, t in enumerate(pft.token_ids.tolist()):
        assert torch.equal(rows[i], x[t])
    y = torch.randn(pft.num_rows, 5, requires_grad=True)
    out = scatter_combine(y, pft)
    ref = torch.zeros(11, 5)
    for i, t in enumerate(pft.token_ids.tolist()):
        ref[t] += y[i].detach() * float(pft.combine_weights[i].detach())
    assert torch.allclose(out, ref, atol=1e-6)
    g = torch.randn(11, 5)
    (out * g).sum().backward()
    for i, t in enumerate(pft.token_ids.tolist()):
        assert torch.allclose(y.grad[i], g[t] * float(pft.combine_weights[i].detach()), atol=1e-6)
    # d out / d weight(t, j) = <g[t], y[row of (t, j)]> for kept pairs, 0 for dropped ones
    assert weights.grad is not None and torch.count_nonzero(weights.grad) <= pft.num_rows


def test_zero_tokens():
    pft = build_pft(torch.zeros(0, 2, dtype=torch.int64), torch.zeros(0, 2), 4, capacity=3)
    assert pft.num_rows == 0 and pft.tokens_per_expert.tolist() == [0, 0, 0, 0]
    x = torch.zeros(0, 3, requires_grad=True)
    out = scatter_combine(gather_tokens(x, pft) * 2, pft)
    out.sum().backward()
    assert out.shape == (0, 3) and x.grad.shape == (0, 3)


def test_bad_input():
    with pytest.raises(ValueError):
        build_pft(torch.tensor([[0, 4]]), torch.ones(1, 2), 4)
    with pytest.raises(ValueError):
        build_pft(torch.tensor([0, 1]), torch.ones(2), 4)
    with pytest.raises(ValueError):
        build_pft(torch.tensor([[0, 1]]), torch.ones(1, 2), 4, capacity=-1)
