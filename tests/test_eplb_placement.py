"""EPLB-style replica placement: replicas go to the heaviest experts, never two replicas of one
expert on a GPU, every slot used, and relabelling against the previous placement only saves moves."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moe_repro.components.balance.eplb_placement import place_replicas, replicate


def test_replicate_by_hand():
    # extra slots go to the largest load per replica: 90 -> 45 -> 30 (ties: lower id)
    assert replicate([90, 30, 10], 5) == [3, 1, 1]      # 90 -> 45 -> 30 (tie with e1: lower id)
    assert replicate([90, 30, 10], 6) == [4, 1, 1]      # 30 (e0) ties 30 (e1): lower id
    assert replicate([90, 30, 10], 7) == [4, 2, 1]      # 22.5 < 30


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
        p = place_replicas(loads, gpus, slots)
    except ValueError as err:       # only when an expert would need more replicas than GPUs
        assert "replicas" in str(err) and max(replicate(loads, gpus * slots)) > gpus
        return
    assert all(len(b) == slots for b in p.experts_of_gpu)
    assert all(len(set(b)) == len(b) for b in p.experts_of_gpu)          # no co-located replicas
    for e, r in enumerate(p.replicas):
        assert sum(b.count(e) for b in p.experts_of_gpu) == r >= 1
    assert sum(p.gpu_loads) == pytest.approx(sum(loads))
    # the same placement with shuffled GPU labels as "previous": matching finds zero moves
    shuffled = list(p.experts_of_gpu)
    rnd.shuffle(shuffled)
    again = place_replicas(loads, gpus, slots, previous=shuffled, expert_bytes=7)
    assert again.moved_replicas == 0 and again.moved_bytes == 0
    # against an arbitrary previous layout, relabelling never moves more than keeping labels
    prev = [list(range(g, g + slots)) for g in range(gpus)]
    kept = sum(1 for g in range(gpus) for e in set(p.experts_of_gpu[g]) if e not in prev[g])
    assert place_replicas(loads, gpus, slots, previous=prev).moved_replicas <= kept
