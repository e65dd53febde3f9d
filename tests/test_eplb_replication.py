"""EPLB-style replica plans: replicas go to the heaviest experts, never two replicas of one
expert on a GPU, every slot used, and relabelling against the previous plan only saves moves."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moe_repro.components.balance.eplb_replication import plan_replicas, replicate


def test_replicate_by_hand():
    # extra slots go to the largest load per replica: 90 -> 45 -> 30 (ties: lower id)
    assert replicate([90, 30, 10], 5) == [3, 1, 1]  # 90 -> 45 -> 30 (tie with e1: lower id)
    assert replicate([90, 30, 10], 6) == [4, 1, 1]  # 30 (e0) ties 30 (e1): lower id
    assert replicate([90, 30, 10], 7) == [4, 2, 1]  # 22.5 < 30


def test_replica_cap_by_hand():
    # capped at 2: 90 -> 45 and e0 is full, so the next slot goes to e1 (30 > 10)
    assert replicate([90, 30, 10], 5, max_replicas=2) == [2, 2, 1]
    assert replicate([90, 30, 10], 6, max_replicas=2) == [2, 2, 2]
    with pytest.raises(ValueError, match="more than 2 replicas"):
        replicate([90, 30, 10], 7, max_replicas=2)
    # uncapped, expert 0 wants 3 replicas on 2 GPUs: refused; capped at 2 the plan exists.
    with pytest.raises(ValueError, match="replicas"):
        plan_replicas([100, 1, 1, 1], 2, 3)
    p = plan_replicas([100, 1, 1, 1], 2, 3, max_replicas=2)
    # replicas [2, 2, 1, 1]; items 50 e0, 50 e0, 1 e2, 1 e3, 0.5 e1, 0.5 e1, each to the
    # lightest GPU lacking the expert (ties: lower GPU)
    assert p.replicas == [2, 2, 1, 1]
    assert p.experts_of_gpu == [[0, 2, 1], [0, 3, 1]] and p.gpu_loads == [51.5, 51.5]
    with pytest.raises(ValueError, match="max_replicas"):
        plan_replicas([1, 1], 2, 1, max_replicas=3)


@st.composite
def cases(draw):
    gpus = draw(st.integers(1, 5))
    slots = draw(st.integers(1, 4))
    experts = draw(st.integers(1, gpus * slots))
    loads = draw(st.lists(st.integers(0, 1000), min_size=experts, max_size=experts))
    return loads, gpus, slots


@settings(max_examples=200, deadline=None)
@given(cases(), st.randoms(use_true_random=False))
def test_invariants(case, rnd):
    loads, gpus, slots = case
    try:
        p = plan_replicas(loads, gpus, slots)
    except ValueError as err:  # only when an expert would need more replicas than GPUs
        assert "replicas" in str(err) and max(replicate(loads, gpus * slots)) > gpus
        return
    assert all(len(b) == slots for b in p.experts_of_gpu)
    assert all(len(set(b)) == len(b) for b in p.experts_of_gpu)  # no co-located replicas
    for e, r in enumerate(p.replicas):
        assert sum(b.count(e) for b in p.experts_of_gpu) == r >= 1
    assert sum(p.gpu_loads) == pytest.approx(sum(loads))
    # the same plan with shuffled GPU labels as "previous": matching finds zero moves
    shuffled = list(p.experts_of_gpu)
    rnd.shuffle(shuffled)
    again = plan_replicas(loads, gpus, slots, previous=shuffled, expert_bytes=7)
    assert again.moved_replicas == 0 and again.moved_bytes == 0
    # against an arbitrary previous layout, relabelling never moves more than keeping labels
    prev = [list(range(g, g + slots)) for g in range(gpus)]
    kept = sum(1 for g in range(gpus) for e in set(p.experts_of_gpu[g]) if e not in prev[g])
    assert plan_replicas(loads, gpus, slots, previous=prev).moved_replicas <= kept
