"""The padding-free MoE layer equals a loop-over-tokens reference, with and without EP.

Outputs and gradients (input, gate, experts, shared experts), fp32 layer vs float64 reference,
several seeds, uneven routing with empty experts, zero-token ranks, 2 and 4 real gloo ranks.
"""

import pytest
import torch

from _moe_targets import load_local, make_tokens, make_weights, max_err, reference_grads
from moe_repro.components.moe.moe_layer import ExpertPlacement, MoELayer, expert_capacity
from moe_repro.components.moe.padded_moe import PaddedMoELayer
from moe_repro.runtime.launch import run_ranks

TOL = 1e-5  # fp32 vs float64 on O(1) values with H, F <= 32


def _single(layer_cls, seed, tokens=23, h=12, f=10, e=6, k=2, dead=(1, 4), shared=0, **kw):
    w = make_weights(seed, h, f, e, dead, shared)
    x, grad_out = make_tokens(seed + 7, tokens, h)
    layer = layer_cls(h, f, e, k, num_shared=shared, **kw)
    load_local(layer, w)
    x.requires_grad_(True)
    out = layer(x)
    (out * grad_out).sum().backward()
    ref_out, ref_dx, ref_grads = reference_grads(x.detach(), grad_out, w, k)
    errs = {"out": max_err(out.detach(), ref_out), "dx": max_err(x.grad, ref_dx)}
    for name, p in layer.named_parameters():
        errs[name] = max_err(p.grad if p.grad is not None else torch.zeros_like(p), ref_grads[name])
    return errs, layer


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("gemm", ["sequential", "padded_bmm", "grouped_mm"])
def test_pft_layer_equals_reference(seed, gemm):
    errs, layer = _single(MoELayer, seed, gemm=gemm, shared=1 if seed == 2 else 0)
    assert max(errs.values()) < TOL, errs


def test_routing_is_uneven_with_empty_experts():
    """Guard the test inputs themselves: the dead experts get nothing, the rest are uneven."""
    w = make_weights(0, 12, 10, 6, dead_experts=(1, 4))
    x, _ = make_tokens(7, 23, 12)
    layer = MoELayer(12, 10, 6, 2)
    load_local(layer, w)
    counts = layer.make_pft(layer.route(x)).tokens_per_expert.tolist()
    assert counts[1] == counts[4] == 0 and sum(counts) == 46
    assert len(set(c for i, c in enumerate(counts) if i not in (1, 4))) > 1, counts


@pytest.mark.parametrize("seed", [0, 1])
def test_padded_layer_equals_reference_when_nothing_dropped(seed):
    # capacity_factor = E/k gives C = S: no expert can overflow.
    errs, _ = _single(PaddedMoELayer, seed, capacity_factor=3.0, shared=seed)
    assert max(errs.values()) < TOL, errs


def test_zero_tokens_single_process():
    for cls, kw in ((MoELayer, {}), (PaddedMoELayer, {"capacity_factor": 1.25})):
        errs, _ = _single(cls, 0, tokens=0, **kw)
        assert max(errs.values()) == 0.0


def test_capacity_drops_lowest_weights_per_expert():
    """With a capacity, each expert keeps its C highest-weight pairs; output = reference on those."""
    torch.manual_seed(3)
    h, f, e, k, s = 8, 6, 4, 2, 40
    layer = MoELayer(h, f, e, k, capacity_factor=0.5)
    x = torch.randn(s, h)
    gate = layer.route(x)
    pft = layer.make_pft(gate)
    cap = expert_capacity(s, e, k, 0.5)
    for expert in range(e):
        pairs = [
            (float(gate.combine_weights[t, j].detach()), t)
            for t in range(s)
            for j in range(k)
            if int(gate.top_experts[t, j]) == expert
        ]
        kept = sorted(pairs, key=lambda p: -p[0])[:cap]
        got = pft.token_ids[pft.expert_ids == expert].tolist()
        assert sorted(got) == sorted(t for _, t in kept)


def test_bad_placement_is_rejected():
    with pytest.raises(ValueError):
        ExpertPlacement(((0, 1), (1, 2)))
    with pytest.raises(ValueError):
        ExpertPlacement.contiguous(6, 4)
    with pytest.raises(ValueError):
        MoELayer(8, 4, 4, 2, placement=ExpertPlacement.contiguous(4, 2))
    with pytest.raises(ValueError, match="all_to_all"):
        MoELayer(8, 4, 4, 2, all_to_all="ring")


def _check_ranks(results):
    for rank_results in results:
        for r in rank_results:
            assert max(r["errs"].values()) < TOL, r


_BASE = dict(d_model=12, d_ffn=10, top_k=2)


@pytest.mark.multiprocess
def test_ep_two_ranks(targets_on_path):
    cases = [
        dict(_BASE, seed=1, experts=4, tokens=[17, 9], dead=(1,)),
        dict(_BASE, seed=2, experts=4, tokens=[0, 13], dead=(2, 3), shared=1),  # zero-token rank 0,
        # and rank 1 receives nothing (its experts 2, 3 are dead)
        dict(
            _BASE,
            seed=3,
            experts=6,
            tokens=[11, 14],
            rank_of_expert=[1, 0, 1, 1, 0, 0],
            gemm="grouped_mm",
        ),
        dict(_BASE, seed=4, experts=4, tokens=[15, 6], dead=(0,), impl="padded"),
        dict(_BASE, seed=5, experts=4, tokens=[0, 10], impl="padded"),
    ]
    results = run_ranks(
        "_moe_targets:layer_vs_reference", {"cases": cases}, world_size=2, timeout_s=120
    )
    _check_ranks(results)
    assert results[1][1]["local_experts"] == [2, 3]


@pytest.mark.multiprocess
def test_ep_four_ranks(targets_on_path):
    cases = [
        dict(_BASE, seed=6, experts=8, tokens=[9, 0, 14, 5], dead=(2, 3, 6)),
        dict(
            _BASE,
            seed=7,
            experts=8,
            tokens=[7, 12, 0, 0],
            rank_of_expert=[3, 0, 2, 1, 1, 3, 0, 2],
            dead=(5,),
            gemm="padded_bmm",
            shared=1,
        ),
        dict(_BASE, seed=8, experts=8, tokens=[6, 0, 9, 4], dead=(0, 1), impl="padded"),
    ]
    results = run_ranks(
        "_moe_targets:layer_vs_reference", {"cases": cases}, world_size=4, timeout_s=150
    )
    _check_ranks(results)


@pytest.mark.multiprocess
def test_halo_all_to_all_gives_the_flat_layer_bit_for_bit_on_four_ranks(targets_on_path):
    """MoELayer(all_to_all="halo") on 4 ranks over 2 emulated nodes (HALO's three phases all
    carry rows) equals the flat layer exactly (outputs and every gradient) and the reference."""
    cases = [
        dict(_BASE, seed=11, experts=8, tokens=[9, 0, 14, 5], dead=(2, 3, 6)),  # zero-token rank
        dict(
            _BASE,
            seed=12,
            experts=8,
            tokens=[7, 12, 3, 0],
            rank_of_expert=[3, 0, 2, 1, 1, 3, 0, 0],
            dead=(2,),
            shared=1,
        ),  # rank 2 owns only a dead expert: receives nothing
    ]
    results = run_ranks(
        "_moe_targets:halo_layer_vs_flat_layer",
        {"cases": cases},
        world_size=4,
        ranks_per_node=2,
        timeout_s=150,
    )
    for rank_results in results:
        for r in rank_results:
            assert all(r["identical"].values()), r
            assert max(r["errs"].values()) < TOL, r
