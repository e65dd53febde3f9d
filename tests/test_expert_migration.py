"""Piper Alg. 2 (hill-climbing swaps): never increases the max-min gap, terminates, matches a
brute-force best swap; the scheduler's cost; and a swap on a live layer changes nothing."""

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moe_repro.components.balance.expert_migration import (
    MigrationScheduler,
    hill_climb_swaps,
    swap_expert_slots,
    swaps_to_moves,
)
from moe_repro.components.balance.migration_cost import expert_state_bytes
from moe_repro.components.moe.moe_layer import MoELayer
from moe_repro.components.balance.routing_trace import max_min_gap

ATOL, RTOL = 1e-6, 1e-5


def _sums(groups, loads):
    return [sum(loads[e] for e in g) for g in groups]


@st.composite
def groups_and_loads(draw):
    k = draw(st.integers(1, 5))
    per = draw(st.integers(1, 4))
    loads = draw(st.lists(st.integers(0, 1000), min_size=k * per, max_size=k * per))
    perm = draw(st.permutations(list(range(k * per))))
    return [perm[i * per : (i + 1) * per] for i in range(k)], loads


@settings(max_examples=300, deadline=None)
@given(groups_and_loads(), st.integers(0, 100))
def test_gap_never_increases_and_terminates(case, max_iters):
    groups, loads = case
    out, swaps = hill_climb_swaps(groups, loads, max_iters=max_iters)
    assert len(swaps) <= max_iters
    assert sorted(e for g in out for e in g) == sorted(e for g in groups for e in g)
    assert [len(g) for g in out] == [len(g) for g in groups]
    # replay swap by swap: the global max-min gap never grows, sum of squares strictly drops
    cur = [list(g) for g in groups]
    for s in swaps:
        before_gap, before_sq = (
            max_min_gap(_sums(cur, loads)),
            sum(x * x for x in _sums(cur, loads)),
        )
        i, j = cur[s.group_a].index(s.expert_a), cur[s.group_b].index(s.expert_b)
        cur[s.group_a][i], cur[s.group_b][j] = s.expert_b, s.expert_a
        assert max_min_gap(_sums(cur, loads)) <= before_gap
        assert sum(x * x for x in _sums(cur, loads)) < before_sq
    assert cur == out
    # it stopped because no swap between the extreme groups helps (or it ran out of iterations)
    if len(swaps) < max_iters and len(groups) > 1:
        s = _sums(out, loads)
        hi = max(range(len(s)), key=lambda k: (s[k], -k))
        lo = min(range(len(s)), key=lambda k: (s[k], k))
        delta = s[hi] - s[lo]
        assert all(
            abs((s[hi] - loads[a] + loads[b]) - (s[lo] - loads[b] + loads[a])) >= delta
            for a in out[hi]
            for b in out[lo]
        )


def test_hand_case_one_swap():
    # GPU0 = {0: 9, 1: 1} = 10, GPU1 = {2: 2, 3: 2} = 4, gap 6. Swaps: 9<->2 gives |3 - 11| = 8,
    # 1<->2 gives |11 - 3| = 8: none is below 6, so Alg. 2 stops at once.
    out, swaps = hill_climb_swaps([[0, 1], [2, 3]], [9, 1, 2, 2])
    assert swaps == [] and out == [[0, 1], [2, 3]]
    out, swaps = hill_climb_swaps([[0, 1], [2, 3]], [9, 5, 1, 2])  # 14 vs 3
    # candidates: 9<->1: |6-11|=5, 9<->2: |7-10|=3, 5<->1: |10-7|=3, 5<->2: |11-6|=5 -> first best 9<->2
    assert [(s.expert_a, s.expert_b) for s in swaps][0] == (0, 3)
    assert max_min_gap(_sums(out, [9, 5, 1, 2])) <= 3


def test_scheduler_threshold_cost_and_amortisation():
    sched = MigrationScheduler(
        groups=[[0, 1], [2, 3]],
        d_model=64,
        d_ffn=128,
        threshold=0.5,
        check_every=2,
        bandwidth_bytes_per_s=1e9,
    )
    assert sched.observe([10, 10, 10, 10]) is None
    assert sched.observe([10, 10, 10, 10]) is None  # balanced: no migration
    sched.observe([30, 20, 1, 1])
    event = sched.observe([30, 20, 1, 1])  # 100 vs 4: imbalance 1.92 > 0.5
    assert event is not None and event.swaps
    per_expert = expert_state_bytes(64, 128)
    assert event.send_bytes_per_gpu == [per_expert * len(event.swaps)] * 2
    assert event.latency_s == pytest.approx(per_expert * len(event.swaps) / 1e9)
    assert len(swaps_to_moves(event.swaps)) == 2 * len(event.swaps)
    assert event.gap_after < event.gap_before
    assert sched.amortised_overhead(step_time_s=1.0) == pytest.approx(event.latency_s / 4)
    assert sorted(e for g in sched.groups for e in g) == [0, 1, 2, 3]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_swap_on_live_layer_changes_nothing(seed):
    """Swap two expert slots (weights, Adam state, router columns): output, gradients and the
    optimizer state are the same up to the permutation, before and after an optimizer step.
    Parameters and optimizer state must match bit for bit; outputs and gradients to ATOL, because
    the gate scores in float32 (components/moe/gating.py) and a permuted softmax sums in another
    order."""
    torch.manual_seed(seed)
    E, a, b = 6, 1, 4
    layer = MoELayer(8, 12, E, 2, dtype=torch.float64)
    x = torch.randn(20, 8, dtype=torch.float64)
    grad_out = torch.randn(20, 8, dtype=torch.float64)
    opt = torch.optim.Adam(layer.parameters(), lr=1e-2)
    for _ in range(2):  # build up real optimizer state
        opt.zero_grad()
        (layer(x) * grad_out).sum().backward()
        opt.step()
    ref = {n: p.detach().clone() for n, p in layer.named_parameters()}
    ref_state = {
        n: {k: v.clone() for k, v in opt.state[p].items() if torch.is_tensor(v)}
        for n, p in layer.named_parameters()
    }
    out_before = layer(x).detach()
    twin, twin_opt = copy.deepcopy((layer, opt))  # the unswapped layer, state and all

    swap_expert_slots(layer, opt, a, b)
    perm = list(range(E))
    perm[a], perm[b] = b, a
    dim_of = {"gate.weight": 1}
    for n, p in layer.named_parameters():
        d = dim_of.get(n, 0)
        assert torch.equal(p.detach(), ref[n].index_select(d, torch.tensor(perm))), n
        for k, v in ref_state[n].items():
            if v.shape == p.shape:
                assert torch.equal(opt.state[p][k], v.index_select(d, torch.tensor(perm))), (n, k)
    assert torch.allclose(layer(x).detach(), out_before, atol=ATOL, rtol=0)

    # gradients and one more step: the swapped layer tracks the unswapped one exactly
    for _ in range(2):
        for m, o in ((layer, opt), (twin, twin_opt)):
            o.zero_grad()
            (m(x) * grad_out).sum().backward()
        for (n, p), (_, q) in zip(layer.named_parameters(), twin.named_parameters()):
            d = dim_of.get(n, 0)
            assert torch.allclose(
                p.grad, q.grad.index_select(d, torch.tensor(perm)), atol=ATOL, rtol=RTOL
            ), n
        opt.step()
        twin_opt.step()
    for (n, p), (_, q) in zip(layer.named_parameters(), twin.named_parameters()):
        d = dim_of.get(n, 0)
        assert torch.allclose(
            p.detach(), q.detach().index_select(d, torch.tensor(perm)), atol=ATOL, rtol=RTOL
        ), n
    assert torch.allclose(layer(x), twin(x), atol=ATOL, rtol=RTOL)


@pytest.mark.multiprocess
def test_ep_migration_over_ranks_changes_nothing(targets_on_path):
    """Alg. 2 swaps applied across 2 real gloo ranks: same output and input gradient, and every
    logical expert's weights, gradient and Adam moments equal wherever it now lives."""
    from moe_repro.runtime.launch import run_ranks

    res = run_ranks(
        "_balance_targets:migration_unchanged",
        {"seed": 3, "tokens": [13, 0], "experts": 6, "swaps": [[0, 4], [2, 3]]},
        world_size=2,
        timeout_s=120,
    )
    assert res[0]["local"] == [1, 3, 4] and res[1]["local"] == [0, 2, 5]
    before, after = {}, {}
    for r in res:
        assert r["out"] < 1e-6 and r["dx"] < 1e-6, r
        before.update(r["before"])
        after.update(r["after"])
    assert before.keys() == after.keys() and len(after) == 3 * 6
    for key in before:
        for b, a in zip(before[key], after[key]):
            assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-6, rtol=1e-5), key
    # two swaps across ranks: each rank sends 2 experts x (3 weights + 2 Adam moments)
    per_expert = 3 * 12 * 10 * 4
    assert res[0]["sent"] == res[1]["sent"] == 2 * per_expert * 3
