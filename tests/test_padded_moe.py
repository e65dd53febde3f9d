"""The capacity-padded baseline: dispatch mask positions, capacity, drops (GShard priority)."""

import pytest
import torch

from moe_repro.components.moe.gating import GateOutput
from moe_repro.components.moe.moe_layer import expert_capacity
from moe_repro.components.moe.padded_moe import capacity_positions, dispatch_and_combine_masks


def _gate(seed, s, e, k):
    g = torch.Generator().manual_seed(seed)
    experts = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(s)])
    return GateOutput(experts, torch.rand(s, k, generator=g), torch.zeros(s, e))


@pytest.mark.parametrize("seed", [0, 1])
def test_positions_follow_gshard_priority(seed):
    gate = _gate(seed, 15, 4, 2)
    pos = capacity_positions(gate.top_experts, 4)
    seen = [0] * 4
    for j in range(2):  # all first choices, then all second choices
        for t in range(15):
            e = int(gate.top_experts[t, j])
            assert int(pos[t, j]) == seen[e]
            seen[e] += 1


@pytest.mark.parametrize("capacity", [1, 3, 30])
def test_masks(capacity):
    gate = _gate(2, 15, 4, 2)
    dispatch, combine = dispatch_and_combine_masks(gate, 4, capacity)
    assert dispatch.shape == combine.shape == (15, 4, capacity)
    pos = capacity_positions(gate.top_experts, 4)
    for t in range(15):
        for j in range(2):
            e, p = int(gate.top_experts[t, j]), int(pos[t, j])
            if p < capacity:
                assert dispatch[t, e, p] == 1 and combine[t, e, p] == gate.combine_weights[t, j]
    assert int(dispatch.sum()) == int((pos < capacity).sum())  # nothing else is set
    assert bool((dispatch.sum(0) <= 1).all())  # one token per slot


def test_capacity_formula():
    assert expert_capacity(4096, 64, 6, 1.25) == 480  # ceil(1.25 * 4096 * 6 / 64)
    assert expert_capacity(0, 8, 2, 1.25) == 1  # never zero slots
    with pytest.raises(ValueError):
        expert_capacity(8, 8, 2, 0.0)
