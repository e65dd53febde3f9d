"""Gating semantics that name the peers they reproduce: exact integer capacity, the drop
policies and renormalisation of build_pft against plain loops over tokens, fp32 accumulation of
the combine against an fp64 reference.
"""

from __future__ import annotations

import decimal
import itertools

import pytest
import torch

from moe_repro.components.moe.moe_layer import expert_capacity, float_expert_capacity
from moe_repro.components.moe.pft import build_pft, gather_tokens, scatter_combine

# --- capacity --------------------------------------------------------------------------------

FACTORS = ("0.5", "0.8", "0.9", "1.0", "1.1", "1.2", "1.25", "1.3", "1.5", "2.0")


def decimal_ceiling(tokens: int, experts: int, top_k: int, factor: str) -> int:
    """ceil(c * S * k / E) in decimal arithmetic with 50 digits: exact for these inputs."""
    with decimal.localcontext() as ctx:
        ctx.prec = 50
        value = decimal.Decimal(factor) * tokens * top_k / experts
        return int(value.to_integral_value(rounding=decimal.ROUND_CEILING))


def test_capacity_is_exact_over_a_grid_that_holds_the_float_off_by_one_cases():
    cases = off_by_one = 0
    for tokens, experts, top_k, factor in itertools.product(
        range(1, 2000, 7), (4, 8, 16, 64, 128, 256), (1, 2, 4, 6, 8), FACTORS
    ):
        exact = max(1, decimal_ceiling(tokens, experts, top_k, factor))
        assert expert_capacity(tokens, experts, top_k, float(factor)) == exact, (
            tokens,
            experts,
            top_k,
            factor,
        )
        off_by_one += float_expert_capacity(tokens, experts, top_k, float(factor)) != exact
        cases += 1
    assert cases == 286 * 6 * 5 * 10
    # The grid holds cases where float arithmetic (DeepSpeed, Megatron) lands one above.
    assert off_by_one > 0


def test_the_reported_off_by_one_case():
    # S=400, E=8, k=1, c=1.1: 1.1 * 400 / 8 = 55 exactly; in floats 55.000000000000007.
    assert expert_capacity(400, 8, 1, 1.1) == 55
    assert float_expert_capacity(400, 8, 1, 1.1) == 56


# --- drop policies, against loops over tokens -----------------------------------------------


def skewed_routing(tokens: int, experts: int, top_k: int, empty: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, experts, generator=g) + torch.linspace(2, 0, experts)
    if empty:
        logits[:, experts - empty :] = -60.0
    weights, chosen = torch.topk(torch.softmax(logits, -1), top_k, dim=-1)
    return chosen, weights


def kept_pairs_by_loop(chosen, weights, experts: int, capacity: int, policy: str, rand=None):
    """{(token, expert)} kept, by walking the pairs in the policy's priority order."""
    tokens, top_k = chosen.shape
    pairs = [(t, j) for t in range(tokens) for j in range(top_k)]
    if policy == "probs":  # largest weight first, ties to the earlier pair
        pairs.sort(key=lambda tj: (-float(weights[tj]), tj[0] * top_k + tj[1]))
    elif policy == "slot":  # all first choices, then all second choices, ...
        pairs.sort(key=lambda tj: (tj[1], tj[0]))
    elif policy == "random":  # DeepSpeed RTS: a uniform priority per (token, expert)
        pairs.sort(key=lambda tj: -float(rand[tj[0], int(chosen[tj])]))
    filled = [0] * experts
    kept = set()
    for t, j in pairs:
        e = int(chosen[t, j])
        if filled[e] < capacity:
            kept.add((t, e))
        filled[e] += 1
    return kept


@pytest.mark.parametrize("policy", ["probs", "position", "slot", "random"])
def test_drop_policies_match_a_loop_over_tokens(policy):
    for (tokens, experts, top_k, empty), capacity, seed in itertools.product(
        [(1, 4, 1, 0), (37, 8, 2, 2), (200, 16, 4, 3), (96, 6, 6, 0)], (0, 1, 5, 40), (0, 1)
    ):
        chosen, weights = skewed_routing(tokens, experts, top_k, empty, seed)
        g = torch.Generator().manual_seed(seed)
        rand = torch.rand((tokens, experts), generator=torch.Generator().manual_seed(seed))
        pft = build_pft(chosen, weights, experts, capacity, drop_policy=policy, generator=g)
        got = set(zip(pft.token_ids.tolist(), pft.expert_ids.tolist()))
        assert got == kept_pairs_by_loop(chosen, weights, experts, capacity, policy, rand), (
            policy,
            tokens,
            experts,
            top_k,
            capacity,
            seed,
        )
        assert pft.tokens_per_expert.sum() == len(got)


def test_renormalise_after_drop_makes_each_surviving_token_sum_to_one():
    chosen, weights = skewed_routing(300, 16, 4, 3, seed=5)
    weights = weights.clone().requires_grad_()
    pft = build_pft(chosen, weights, 16, capacity=30, renormalize=True)
    sums = torch.zeros(300).index_add(0, pft.token_ids, pft.combine_weights.detach())
    survivors = torch.bincount(pft.token_ids, minlength=300) > 0
    assert (~survivors).any() and survivors.any()  # some tokens lost every pair, some kept one
    torch.testing.assert_close(sums[survivors], torch.ones(int(survivors.sum())))
    assert (sums[~survivors] == 0).all()
    # each kept weight is its gate weight over the token's kept sum, computed here by loop
    for i in range(0, pft.num_rows, 17):
        t, e = int(pft.token_ids[i]), int(pft.expert_ids[i])
        kept = [
            float(weights[t, j].detach())
            for j in range(4)
            if ((pft.token_ids == t) & (pft.expert_ids == int(chosen[t, j]))).any()
        ]
        own = float(weights[t, (chosen[t] == e).nonzero()[0, 0]].detach())
        assert float(pft.combine_weights[i].detach()) == pytest.approx(own / sum(kept), rel=1e-6)
    pft.combine_weights.sum().backward()  # differentiable back to the gate
    assert weights.grad is not None


def test_unknown_drop_policy_is_a_clear_error():
    chosen, weights = skewed_routing(8, 4, 2, 0, seed=0)
    with pytest.raises(
        ValueError, match="drop_policy must be one of probs, position, slot, random"
    ):
        build_pft(chosen, weights, 4, 2, drop_policy="first")


# --- combine accumulation -------------------------------------------------------------------


def combine_error(accumulate: str, seed: int) -> tuple[float, float]:
    """(relative RMS error, max error over its bound) of a bf16 top-8 combine vs fp64. The bound
    for fp32 sums rounded once to bf16 (unit roundoff u = 2^-8): u |ref| for the final rounding
    plus k * 2^-24 * sum |y w| for the k fp32 products and adds (Higham, Accuracy and Stability
    of Numerical Algorithms, Sec. 3.1), which matters only where the terms nearly cancel."""
    chosen, weights = skewed_routing(512, 64, 8, 0, seed)
    pft = build_pft(chosen, weights, 64)
    g = torch.Generator().manual_seed(seed)
    y = torch.randn(pft.num_rows, 256, generator=g).to(torch.bfloat16)
    out = scatter_combine(y, pft, accumulate).double()
    # fp64 reference by a loop over the 8 pairs of each token: out[t] = sum_j y[row] * w[row]
    ref = torch.zeros(512, 256, dtype=torch.float64)
    magnitude = torch.zeros(512, 256, dtype=torch.float64)
    for i in range(pft.num_rows):
        term = y[i].double() * float(pft.combine_weights[i])
        ref[pft.token_ids[i]] += term
        magnitude[pft.token_ids[i]] += term.abs()
    rel_rms = float(((out - ref).pow(2).mean() / ref.pow(2).mean()).sqrt())
    bound = ref.abs() * 2.0**-8 + 8 * 2.0**-24 * magnitude + 1e-30
    worst = float(((out - ref).abs() / bound).max())
    return rel_rms, worst


def test_bf16_combine_accumulates_in_fp32_to_within_one_final_rounding():
    for seed in (0, 1):
        rel_rms, worst = combine_error("float32", seed)
        # fp32 sums then one rounding to bf16 (unit roundoff u = 2^-8): |out - ref| <= u |ref|
        # up to the fp32 sum's own error (~8 * 2^-24 relative).
        assert worst <= 1.0 + 1e-3, worst
        rms_input, _ = combine_error("input", seed)
        assert rel_rms < rms_input  # summing in bf16 rounds at every add and loses accuracy


def test_fp32_accumulation_gradients_match_fp64():
    chosen, weights = skewed_routing(64, 8, 4, 1, seed=3)
    pft = build_pft(chosen, weights.clone().requires_grad_(), 8)
    g = torch.Generator().manual_seed(3)
    y = torch.randn(pft.num_rows, 32, generator=g).to(torch.bfloat16).requires_grad_()
    grad_out = torch.randn(64, 32, generator=g).to(torch.bfloat16)
    scatter_combine(y, pft).backward(grad_out)
    # by hand: dy[i] = grad_out[t_i] * w_i, rounded once to bf16
    expected = grad_out.double()[pft.token_ids] * pft.combine_weights.detach().double()[:, None]
    err = (y.grad.double() - expected).abs() / (expected.abs() * 2.0**-8 + 1e-30)
    assert float(err.max()) <= 1.0 + 1e-3


def test_gather_then_fp32_combine_of_fp32_inputs_is_unchanged():
    chosen, weights = skewed_routing(40, 8, 2, 0, seed=9)
    pft = build_pft(chosen, weights, 8)
    x = torch.randn(40, 16)
    assert torch.equal(
        scatter_combine(gather_tokens(x, pft), pft, "float32"),
        scatter_combine(gather_tokens(x, pft), pft, "input"),
    )
