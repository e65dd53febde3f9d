"""FEPLB: the greedy balancer's rules, buffer accounting, and Two-Phase Dispatch equal to plain
EP and to a loop-over-tokens reference over 2 and 4 real gloo ranks (FEPLB Sec. 2)."""

import pytest
import torch

from moe_repro.components.balance.feplb import (
    ExpertPartition,
    greedy_balance,
    phase2_bytes,
    weight_buffer_bytes,
)
from moe_repro.components.moe.moe_layer import ExpertPlacement
from moe_repro.runtime.launch import run_ranks

from _balance_targets import assert_exact_vs_plain

TOL = 1e-5


def _brute_loads(counts, placement, moves):
    ranks = placement.rank_of_expert().tolist()
    for e, _, d in moves:
        ranks[e] = d
    out = [0] * placement.world_size
    for e, r in enumerate(ranks):
        out[r] += counts[e]
    return out


def test_greedy_moves_busiest_dynamic_expert_of_most_loaded_device():
    # 2 devices x 4 experts; device 0 loaded. Dynamic: last 2 of each device (2, 3 and 6, 7).
    placement = ExpertPlacement.contiguous(8, 2)
    part = ExpertPartition.choose(placement, dyn=2)
    assert part.dynamic_of_rank == ((2, 3), (6, 7))
    counts = [50, 10, 30, 20, 5, 5, 5, 5]  # loads 110 vs 20, gap 90
    plan = greedy_balance(counts, part)
    # busiest dynamic on device 0 is expert 2 (30 < 90): move; loads 80 vs 50, gap 30;
    # next: expert 3 (20 < 30): move; loads 60 vs 70 -> device 1 is max, its dynamic 6, 7
    # have 5 < 10: move 6 -> loads 65/65. Then gap 0: stop.
    assert [(m.expert, m.src, m.dst) for m in plan.moves] == [(2, 0, 1), (3, 0, 1), (6, 1, 0)]
    assert plan.loads_after == [65, 65]
    assert plan.loads_after == _brute_loads(counts, placement, [(2, 0, 1), (3, 0, 1), (6, 1, 0)])


def test_threshold_whole_experts_and_cap():
    placement = ExpertPlacement.contiguous(4, 2)
    part = ExpertPartition.choose(placement, dyn=2)
    counts = [40, 3, 20, 2]
    # loads 43 vs 22, gap 21. tau = 5: expert 0 (40) would overshoot (40 !< 21), expert 1 (3)
    # is under tau: nothing moves.
    assert greedy_balance(counts, part, tau=5).moves == []
    # tau = 0: Sec. 2 selects the busiest dynamic expert, 0, which overshoots: nothing moves
    assert greedy_balance(counts, part, tau=0).moves == []
    # the diagnostic variant tries the next busiest, 1 (3 < 21); then 40 vs 25: 0 still overshoots
    plan = greedy_balance(counts, part, tau=0, next_if_unfit=True)
    assert [m.expert for m in plan.moves] == [1]
    assert plan.loads_after == [40, 25]
    assert greedy_balance(counts, part, tau=0, max_num_dyn=0, next_if_unfit=True).moves == []


def test_greedy_stops_at_the_busiest_dynamic_expert_that_does_not_fit():
    # FEPLB Sec. 2: "repeatedly selects the busiest dynamic expert on the most overloaded device".
    # 3 devices x 3 experts, all dynamic. Loads 60 | 20 | 10, gap 50: expert 0 (30) moves to
    # device 2: 30 | 20 | 40. Device 2 is now the busiest; its busiest dynamic expert, 6 (6),
    # fits (6 < 20): 30 | 26 | 34. Busiest: device 2 again; expert 7 (3 < 8): 30 | 29 | 31.
    # Then device 2's expert 8 (1 < 2): 30 | 30 | 30.
    placement = ExpertPlacement.contiguous(9, 3)
    part = ExpertPartition.choose(placement, dyn=3)
    counts = [30, 20, 10, 10, 5, 5, 6, 3, 1]
    plan = greedy_balance(counts, part)
    assert [(m.expert, m.src, m.dst) for m in plan.moves] == [
        (0, 0, 2),
        (6, 2, 1),
        (7, 2, 1),
        (8, 2, 1),
    ]
    assert plan.loads_after == [30, 30, 30]
    # the busiest dynamic expert of the most loaded device does not fit the gap: the balancer
    # stops, although smaller ones would; the diagnostic variant moves them
    placement = ExpertPlacement.contiguous(6, 2)
    part = ExpertPartition.choose(placement, dyn=3)
    counts = [12, 3, 1, 4, 0, 0]  # 16 | 4, gap 12: expert 0 (12) is not < 12
    assert greedy_balance(counts, part).moves == []
    plan = greedy_balance(counts, part, next_if_unfit=True)
    assert [(m.expert, m.src, m.dst) for m in plan.moves] == [(1, 0, 1), (2, 0, 1)]
    assert plan.loads_after == [12, 8]


@pytest.mark.parametrize("seed", range(4))
def test_greedy_properties_random(seed):
    g = torch.Generator().manual_seed(seed)
    world, per, dyn = 4, 8, 3
    placement = ExpertPlacement.contiguous(world * per, world)
    counts = (torch.rand(world * per, generator=g) ** 3 * 500).long().tolist()
    part = ExpertPartition.choose(placement, dyn, history=counts)
    plan = greedy_balance(counts, part, tau=10, max_num_dyn=2)
    moved = [m.expert for m in plan.moves]
    assert len(moved) == len(set(moved))  # each at most once
    assert all(
        m.expert in part.dynamic_of_rank[m.src] for m in plan.moves
    )  # only dynamic, from home
    assert all(counts[m.expert] >= 10 for m in plan.moves)  # tau
    assert all(sum(m.dst == d for m in plan.moves) <= 2 for d in range(world))  # buffer cap
    assert plan.loads_after == _brute_loads(
        counts, placement, [(m.expert, m.src, m.dst) for m in plan.moves]
    )
    assert max(plan.loads_after) <= max(plan.loads_before)
    assert greedy_balance(counts, part, tau=10, max_num_dyn=2).moves == plan.moves  # deterministic


def _greedy_as_written(counts, part, tau, cap, next_if_unfit):
    """FEPLB Sec. 2's greedy loop written the plain way (rescan everything every round), the
    reference the fast greedy_balance must equal move for move."""
    placement = part.placement
    world = placement.world_size
    loads = [sum(counts[e] for e in ex) for ex in placement.experts_of_rank]
    moved, received, moves = set(), [0] * world, []
    while True:
        d_max = max(range(world), key=lambda d: (loads[d], -d))
        others = [d for d in range(world) if d != d_max and received[d] < cap]
        if not others:
            break
        d_min = min(others, key=lambda d: (loads[d], d))
        gap = loads[d_max] - loads[d_min]
        busiest_first = sorted(
            (e for e in part.dynamic_of_rank[d_max] if e not in moved and counts[e] >= max(tau, 1)),
            key=lambda e: (-counts[e], e),
        )
        fits = [e for e in busiest_first if counts[e] < gap]
        if not fits or (not next_if_unfit and fits[0] != busiest_first[0]):
            break
        e = fits[0]
        moved.add(e)
        loads[d_max] -= counts[e]
        loads[d_min] += counts[e]
        received[d_min] += 1
        moves.append((e, d_max, d_min, counts[e]))
    return moves, loads


@pytest.mark.parametrize("seed", range(40))
def test_greedy_equals_the_plain_loop_on_fresh_inputs(seed):
    """Uneven splits (a permuted, non-contiguous placement), empty experts, ties, tau, caps."""
    g = torch.Generator().manual_seed(100 + seed)
    world = int(torch.randint(2, 9, (1,), generator=g))
    per = int(torch.randint(1, 9, (1,), generator=g))
    experts = world * per
    if seed % 2:
        placement = ExpertPlacement.contiguous(experts, world)
    else:  # experts scattered over ranks, uneven counts per rank
        ranks = torch.randint(0, world, (experts,), generator=g).tolist()
        ranks[:world] = list(range(world))
        placement = ExpertPlacement.from_ranks(ranks, world)
    raw = (torch.rand(experts, generator=g) ** 3 * 300).long()
    raw[torch.rand(experts, generator=g) < 0.25] = 0  # empty experts
    if seed % 3 == 0:
        raw = raw // 50 * 50  # many ties
    counts = raw.tolist()
    dyn = min(len(ex) for ex in placement.experts_of_rank)
    dyn = int(torch.randint(0, dyn + 1, (1,), generator=g))
    part = ExpertPartition(
        placement,
        tuple(tuple(ex[len(ex) - dyn :]) if dyn else () for ex in placement.experts_of_rank),
    )
    tau = int(torch.randint(0, 40, (1,), generator=g))
    for cap in (None, 0, 1, 2):
        for unfit in (False, True):
            want_moves, want_loads = _greedy_as_written(
                counts, part, tau, world * experts if cap is None else cap, unfit
            )
            for given in (counts, torch.tensor(counts), [float(c) for c in counts]):
                plan = greedy_balance(given, part, tau, cap, unfit)
                assert [tuple(m) for m in plan.moves] == want_moves
                assert plan.loads_after == want_loads
                assert all(type(v) is int for v in plan.loads_after)


def test_buffer_bytes_glm5():
    # FEPLB Sec. 2: one GLM-5 expert is 72 MiB; max_num_dyn = 8 -> 576 MiB.
    assert weight_buffer_bytes(8, 6144, 2048) == 576 * 2**20
    placement = ExpertPlacement.contiguous(4, 2)
    plan = greedy_balance([9, 1, 0, 0], ExpertPartition.choose(placement, 2))
    # loads 10 vs 0: the busiest dynamic expert, 0 (9 < 10), moves; its 9 rows go and return.
    assert phase2_bytes(plan, 4, 8, itemsize=4) == {
        "token_bytes": 2 * 9 * 4 * 4,
        "weight_bytes": 3 * 4 * 8 * 4,
    }


_BASE = dict(d_model=12, d_ffn=10, top_k=2, impl="feplb")


@pytest.mark.multiprocess
def test_two_phase_dispatch_exact_two_ranks(targets_on_path):
    cases = [
        dict(_BASE, seed=1, experts=4, tokens=[17, 9], dyn=2),
        dict(_BASE, seed=2, experts=8, tokens=[0, 13], dyn=2, dead=(6,)),  # zero-token rank
        dict(_BASE, seed=3, experts=8, tokens=[11, 14], dyn=4, gemm="grouped_mm", max_num_dyn=1),
    ]
    results = run_ranks(
        "_balance_targets:balanced_vs_reference", {"cases": cases}, world_size=2, timeout_s=120
    )
    assert_exact_vs_plain(results, TOL)
    assert all(results[0][i]["moves"] for i in range(3)), "the inputs must make FEPLB move experts"
    # the copy-engine path ran (on CPU: gloo's worker thread, and it says so) and was measured
    from moe_repro.components.balance.expert_copy import CPU_PATH

    for rank in results:
        for case in rank:
            o = case["overlap"]
            assert o is not None and o["path"] == CPU_PATH and o["clock"] == "host perf_counter"
            assert o["copy_s"] > 0 and o["compute_s"] > 0
            assert 0 <= o["hidden_s"] <= min(o["copy_s"], o["compute_s"]) + 1e-9


@pytest.mark.multiprocess
def test_two_phase_dispatch_exact_four_ranks(targets_on_path):
    cases = [
        dict(_BASE, seed=6, experts=8, tokens=[9, 0, 14, 5], dyn=1, dead=(2,)),
        dict(_BASE, seed=7, experts=16, tokens=[7, 12, 0, 3], dyn=2, tau=2),
    ]
    results = run_ranks(
        "_balance_targets:balanced_vs_reference", {"cases": cases}, world_size=4, timeout_s=150
    )
    assert_exact_vs_plain(results, TOL)
    assert all(results[0][i]["moves"] for i in range(2))


@pytest.mark.parametrize(
    "stamps,hidden",
    [
        ((0.0, 10.0, 4.0, 20.0), 6.0),  # compute starts while the copy runs
        ((0.0, 10.0, 12.0, 20.0), 0.0),  # the copy ended before the compute began: nothing hidden
        ((2.0, 5.0, 0.0, 20.0), 3.0),  # the compute covers the whole copy
        ((0.0, 30.0, 5.0, 9.0), 4.0),  # the copy outlasts the compute
    ],
)
def test_hidden_part_of_a_copy_is_the_intersection(stamps, hidden):
    from moe_repro.components.balance.expert_copy import CPU_PATH, overlap_of

    t = dict(zip(("copy_start", "copy_end", "compute_start", "compute_end"), stamps))
    o = overlap_of(t, CPU_PATH, "test")
    assert o.hidden_s == hidden
    assert o.copy_s == stamps[1] - stamps[0] and o.compute_s == stamps[3] - stamps[2]
    assert o.hidden_fraction == hidden / o.copy_s
