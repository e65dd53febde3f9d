"""The routing workloads: the eight standard ones reproduce the statistics their definitions
give (written out here from the definitions, not read from the generator), every workload is
deterministic in (seed, step) and the same at every EP layout, and the real-count ones follow
the real counts."""

from __future__ import annotations

import math

import pytest
import torch

from moe_repro.components.balance.workloads import (
    STANDARD,
    get_workload,
    max_over_mean,
    real_count_names,
    real_popularity,
    workload_names,
)

E, K, T = 8, 2, 128  # the published defaults


def expected_share(name: str, step: int = 0) -> list[float]:
    """Expected rows per expert over T * k at the defaults, from the definitions: hot = max(k,
    E // 4) = 2 experts; 3 tokens in 4 draw from the hot pool, 1 in 4 from all E; a token
    takes k distinct experts uniformly from its pool."""
    uniform = [K / E] * E  # chance a uniform token picks an expert

    def pool_mix(pool, frac):
        return [
            frac * (K / len(pool) if e in pool else 0.0) + (1 - frac) * uniform[e] for e in range(E)
        ]

    if name in ("hot-set", "hot-rank"):
        chance = pool_mix({0, 1}, 0.75)
    elif name == "rotating-hotspot":
        start = ((step // 3) * 2) % E
        chance = pool_mix({start, start + 1}, 0.75)
    elif name == "spread":
        chance = pool_mix({0, 2, 4, 6}, 0.75)
    elif name == "zero-expert-rank":
        chance = pool_mix({4, 5, 6, 7}, 1.0)
    elif name == "burst":
        chance = pool_mix({0, 1}, 0.5) if step % 4 == 3 else uniform
    else:  # balanced, ragged-source: uniform
        chance = uniform
    return [c / K for c in chance]


DEFINED_MAX_OVER_MEAN = {
    "balanced": 1.0,
    "hot-set": 3.25,
    "hot-rank": 3.25,
    "spread": 1.75,
    "zero-expert-rank": 2.0,
    "rotating-hotspot": 3.25,
}


@pytest.mark.parametrize("name", list(DEFINED_MAX_OVER_MEAN))
def test_expected_max_over_mean_at_the_defaults(name):
    share = expected_share(name)
    assert math.isclose(max(share) * E, DEFINED_MAX_OVER_MEAN[name])
    # many steps of the default size: the busiest expert's mean share converges to it
    w = get_workload(name)
    counts = sum(w.routing(seed, 0, 4).expert_counts(E) for seed in range(200)).double()
    assert abs(max_over_mean(counts) - DEFINED_MAX_OVER_MEAN[name]) < 0.03


@pytest.mark.parametrize("name", STANDARD)
@pytest.mark.parametrize("step", [0, 3, 4])
def test_each_expert_gets_its_defined_share_at_the_default_size(name, step):
    """One step of 128 tokens: every expert's rows within 4.5 binomial sd of T k share."""
    counts = get_workload(name).routing(1234, step, 2).expert_counts(E).double()
    for e, s in enumerate(expected_share(name, step)):
        mean, sd = T * K * s, math.sqrt(T * K * s * (1 - s))
        assert abs(float(counts[e]) - mean) <= 4.5 * sd + 1e-9, (name, e, float(counts[e]), mean)


def test_balanced_is_exact_and_burst_bursts_every_fourth_step():
    assert get_workload("balanced").routing(0, 0, 8).expert_counts(E).tolist() == [T * K // E] * E
    burst = [
        max_over_mean(get_workload("burst", tokens=20000).routing(0, s).expert_counts(E))
        for s in range(8)
    ]
    assert all(abs(b - 2.5) < 0.05 for b in burst[3::4])  # 0.5 * 1 + 0.5 * 0.25 over 0.25
    assert all(b < 1.05 for i, b in enumerate(burst) if i % 4 != 3)


def test_rotating_hotspot_moves_every_three_steps():
    w = get_workload("rotating-hotspot", tokens=4000)
    busiest = [int(w.routing(0, s).expert_counts(E).argmax()) // 2 for s in range(9)]
    assert busiest == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_ragged_source_skews_the_sources_not_the_experts():
    r = get_workload("ragged-source", tokens=40000).routing(0, 0)
    for world in (2, 4, 8):
        per_rank = r.source_counts(E, world).sum(1).double()
        share0 = float(per_rank[0] / per_rank.sum())
        assert abs(share0 - (2 / world - 1 / world**2)) < 0.01  # density 2 (1 - x)
    assert max_over_mean(r.expert_counts(E)) < 1.03


@pytest.mark.parametrize(
    "name",
    [*STANDARD, "synthetic", "olmoe-c4-L7", "mixtral-github-L15", "olmoe-switch", "olmoe-layers"],
)
def test_a_routing_is_well_formed_deterministic_and_layout_free(name):
    w = get_workload(name)
    a = w.routing(3, 5, 2, layer=w.num_layers - 1)
    b = w.routing(3, 5, 8, layer=w.num_layers - 1)
    assert torch.equal(a.expert_ids, b.expert_ids) and torch.equal(a.gates, b.gates)
    ids = a.expert_ids
    assert ids.shape == (w.tokens, w.top_k) and ids.min() >= 0 and ids.max() < w.num_experts
    assert all(len(set(row)) == w.top_k for row in ids.tolist())  # k distinct experts
    assert torch.allclose(a.gates.sum(1), torch.ones(w.tokens), atol=1e-6)
    # a layout of 2 ranks sees the 8-rank sources merged pairwise
    c8 = a.source_counts(w.num_experts, 8)
    assert torch.equal(c8.reshape(2, 4, -1).sum(1), a.source_counts(w.num_experts, 2))
    assert int(c8.sum()) == w.tokens * w.top_k
    if name != "balanced":
        other = w.routing(4, 5, layer=w.num_layers - 1)
        assert not torch.equal(other.expert_ids, a.expert_ids), "the seed had no effect"


@pytest.mark.parametrize(
    "name,model,domain,layer",
    [("olmoe-c4-L7", "olmoe", "c4", 7), ("mixtral-arxiv-L0", "mixtral", "arxiv", 0)],
)
def test_real_count_workloads_follow_the_real_counts(name, model, domain, layer):
    w = get_workload(name, tokens=20000)
    got = w.routing(0, 0).expert_counts(w.num_experts).double()
    real = real_popularity(model, domain, layer)
    assert torch.corrcoef(torch.stack([got, real]))[0, 1] > 0.95
    assert float((got / got.sum() - real / real.sum()).abs().max()) < 0.01


def test_domain_switch_and_cross_layer_chain_use_the_real_counts():
    w = get_workload("olmoe-switch", tokens=20000)
    before, after = (w.routing(0, s).expert_counts(64).double() for s in (3, 4))
    for got, domain in ((before, "c4"), (after, "github")):
        real = real_popularity("olmoe", domain, 7)
        assert torch.corrcoef(torch.stack([got, real]))[0, 1] > 0.99
    chain = get_workload("olmoe-layers", tokens=20000)
    for index, layer in enumerate((0, 7, 15)):
        got = chain.routing(0, 0, layer=index).expert_counts(64).double()
        assert (
            torch.corrcoef(torch.stack([got, real_popularity("olmoe", "c4", layer)]))[0, 1] > 0.98
        )


def test_bad_names_and_sizes_are_refused():
    with pytest.raises(ValueError, match="unknown workload"):
        get_workload("hotset")
    with pytest.raises(ValueError, match="64 experts"):
        get_workload("olmoe-c4-L7", num_experts=8)
    with pytest.raises(ValueError, match="do not divide"):
        get_workload("hot-set").routing(0, 0, 3)
    assert len(workload_names()) == 8 + 1 + len(real_count_names())
