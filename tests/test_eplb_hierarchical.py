"""DeepSeek EPLB's hierarchical replica policy (groups packed onto nodes, replicas kept on their
group's node), the inter-node bytes of a plan's dispatch, and the group-limited routing trace
(DeepSeek-V3 Sec. 2.1.2)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moe_repro.components.balance.eplb_replication import (
    ReplicaPlan,
    balanced_packing,
    dispatch_traffic,
    max_over_mean,
    plan_replicas,
)
from moe_repro.components.balance.routing_trace import group_limited_trace
from moe_repro.suites import all_suites
from moe_repro.suites.runner import RunConfig, run_point


# --- the hierarchical plan ----------------------------------------------------------------------


def test_hierarchical_plan_by_hand():
    # 8 experts in 4 groups of 2; 2 nodes x 2 GPUs x 3 slots; at most 2 replicas (one per GPU).
    loads = [10, 0, 1, 1, 40, 2, 3, 3]
    p = plan_replicas(
        loads, 4, 3, max_replicas=2, policy="hierarchical", num_groups=4, gpus_per_node=2
    )
    # a. group loads 10, 2, 42, 6, two per node, heaviest first to the lightest node with room:
    #    g2 -> node 0, g0 -> node 1, g3 -> node 1 (10 < 42), g1 -> node 0 (node 1 is full)
    assert p.node_of_group == [1, 0, 0, 1]
    # b. node 0 holds experts 2, 3, 4, 5 (loads 1, 1, 40, 2) in 6 slots: e4 -> 2 (capped), then
    #    e5 (2 > 1); node 1 holds 0, 1, 6, 7 (10, 0, 3, 3): e0 -> 2 (capped), then e6 (tie e7: lower id)
    assert p.replicas == [2, 1, 1, 1, 2, 2, 2, 1]
    # c. node 0 items 20 e4, 20 e4, 1 e2, 1 e3, 1 e5, 1 e5: e4 on both, e2 -> GPU 0, e3 -> GPU 1,
    #    e5 -> GPU 0 (tie 21), e5 -> GPU 1 (GPU 0 has it); node 1 items 5 e0, 5 e0, 3 e7, 1.5 e6,
    #    1.5 e6, 0 e1: e0 on both, e7 -> GPU 2, e6 -> GPU 3 (5 < 8), e6 -> GPU 2, e1 -> GPU 3
    assert p.experts_of_gpu == [[4, 2, 5], [4, 3, 5], [0, 7, 6], [0, 6, 1]]
    assert p.gpu_loads == [22.0, 22.0, 9.5, 6.5]


def test_balanced_packing_by_hand():
    # 2 items per pack, heaviest first to the lightest pack with room: 6 -> p0, 5 -> p1, 4 -> p2,
    # 3 -> p2 (4 < 5 < 6), 2 -> p1 (5 < 6; p2 is full), 1 -> p0
    assert balanced_packing([5, 1, 4, 3, 2, 6], 3) == [1, 0, 2, 2, 1, 0]
    with pytest.raises(ValueError, match="do not pack evenly"):
        balanced_packing([1, 2, 3], 2)


def test_global_policy_is_unchanged_by_the_option():
    loads = [10, 0, 1, 1, 40, 2, 3, 3]
    assert plan_replicas(loads, 4, 3, max_replicas=4) == plan_replicas(
        loads, 4, 3, max_replicas=4, policy="global", num_groups=4, gpus_per_node=2
    )


def test_packing_swaps_when_every_free_gpu_holds_the_expert():
    # Capped at 2 every expert has 2 replicas. Heaviest first: e1 on GPUs 0, 1; e0 on 2, 0; the
    # zero-load e2, e3, e4 fill GPUs 2 and 1; e5 -> GPU 0, then its second replica finds only
    # GPU 0 free, which holds e5: e2 (the lightest, lowest id that GPU 0 lacks) moves from GPU 2
    # (the lighter full GPU lacking e5) to GPU 0, and e5 takes its slot on GPU 2.
    p = plan_replicas([300, 338, 0, 0, 0, 0], 3, 4, max_replicas=2)
    assert p.replicas == [2] * 6
    assert p.experts_of_gpu == [[1, 0, 5, 2], [1, 2, 3, 4], [0, 3, 4, 5]]
    assert p.gpu_loads == [319.0, 169.0, 150.0]


@st.composite
def hierarchical_cases(draw):
    nodes = draw(st.integers(1, 3))
    gpus_per_node = draw(st.integers(1, 3))
    num_groups = nodes * draw(st.integers(1, 3))
    group_size = draw(st.integers(1, 3))
    experts = num_groups * group_size
    experts_per_node = experts // nodes
    # enough slots per node for its experts, at most one replica of an expert per GPU
    slots = draw(st.integers(-(-experts_per_node // gpus_per_node), experts_per_node))
    load = st.one_of(st.just(0), st.integers(0, 10), st.integers(0, 10_000))  # empties, uneven
    loads = draw(st.lists(load, min_size=experts, max_size=experts))
    capped = draw(st.booleans())
    return loads, nodes, gpus_per_node, num_groups, slots, capped


@settings(max_examples=300, deadline=None)
@given(hierarchical_cases(), st.randoms(use_true_random=False))
def test_hierarchical_invariants(case, rnd):
    loads, nodes, gpus_per_node, num_groups, slots, capped = case
    gpus, group_size = nodes * gpus_per_node, len(loads) // num_groups
    kwargs = dict(
        policy="hierarchical",
        num_groups=num_groups,
        gpus_per_node=gpus_per_node,
        max_replicas=gpus_per_node if capped else None,
    )
    try:
        p = plan_replicas(loads, gpus, slots, **kwargs)
    except ValueError as err:  # uncapped, an expert would need more replicas than its node has GPUs
        assert not capped and "replicas" in str(err)
        return
    # every group on one node, the same number per node
    assert sorted(p.node_of_group) == sorted(list(range(nodes)) * (num_groups // nodes))
    assert all(len(b) == slots for b in p.experts_of_gpu)  # every slot used
    assert all(len(set(b)) == len(b) for b in p.experts_of_gpu)  # no co-located replicas
    for g, held in enumerate(p.experts_of_gpu):
        for e in held:  # on its group's node
            assert p.node_of_group[e // group_size] == g // gpus_per_node
    for e, r in enumerate(p.replicas):
        assert sum(b.count(e) for b in p.experts_of_gpu) == r >= 1
    for held, load in zip(p.experts_of_gpu, p.gpu_loads):
        assert load == pytest.approx(sum(loads[e] / p.replicas[e] for e in held))
    # the same plan with nodes and GPUs within nodes shuffled, as "previous": nothing moves
    node_order = list(range(nodes))
    rnd.shuffle(node_order)
    previous = []
    for node in node_order:
        block = p.experts_of_gpu[node * gpus_per_node : (node + 1) * gpus_per_node]
        rnd.shuffle(block)
        previous += block
    again = plan_replicas(loads, gpus, slots, previous=previous, expert_bytes=5, **kwargs)
    assert again.moved_replicas == 0 and again.moved_bytes == 0
    assert sorted(map(sorted, again.experts_of_gpu)) == sorted(map(sorted, p.experts_of_gpu))
    for g, held in enumerate(again.experts_of_gpu):  # relabelling kept groups on one node
        assert all(again.node_of_group[e // group_size] == g // gpus_per_node for e in held)


@pytest.mark.parametrize(
    "kwargs,gpus,slots,experts,message",
    [
        (
            dict(num_groups=4, gpus_per_node=2),
            6,
            2,
            12,
            "3 nodes do not divide the 4 expert groups",
        ),
        (
            dict(num_groups=4, gpus_per_node=2),
            4,
            3,
            10,
            "4 expert groups do not divide the 10 experts",
        ),
        (
            dict(num_groups=2, gpus_per_node=1),
            2,
            3,
            8,
            "3 slots per node cannot hold the 4 experts",
        ),
        (
            dict(num_groups=2, gpus_per_node=3),
            4,
            2,
            8,
            "gpus_per_node=3 does not divide the 4 GPUs",
        ),
        (dict(num_groups=2), 4, 2, 8, "needs num_groups and gpus_per_node"),
        (
            dict(num_groups=2, gpus_per_node=2, max_replicas=3),
            4,
            3,
            8,
            "max_replicas must be in 1..2",
        ),
        # one GPU per node and a spare slot: a second replica would share its GPU
        (
            dict(num_groups=2, gpus_per_node=1),
            2,
            5,
            8,
            "5 slots per node need more than 1 replicas",
        ),
    ],
)
def test_hierarchical_refuses_shapes_that_do_not_divide(kwargs, gpus, slots, experts, message):
    with pytest.raises(ValueError, match=message):
        plan_replicas([1] * experts, gpus, slots, policy="hierarchical", **kwargs)


def test_unknown_policy():
    with pytest.raises(ValueError, match="policy must be one of global, hierarchical"):
        plan_replicas([1, 1], 2, 1, policy="nodal")


# --- inter-node traffic -------------------------------------------------------------------------


def test_dispatch_traffic_by_hand():
    # 2 nodes x 2 GPUs. Expert 0 on GPUs 0 and 2, expert 4 on GPUs 2 and 3, the others once.
    plan = ReplicaPlan([[0, 1], [2, 3], [0, 4], [5, 4]], [2, 1, 1, 1, 2, 1], [0.0] * 4)
    tokens = [[0, 1], [0, 3], [0, 2], [4, 5], [4, 3], [4, 1], [2, 3]]
    sources = [0, 1, 2, 0, 1, 3, 3]
    # t0 (node 0): e0 -> GPU 0 (local), e1 -> GPU 0: nothing crosses
    # t1 (node 0): e0 -> GPU 0 (local, though GPU 2's replica has fewer rows), e3 -> GPU 1: nothing
    # t2 (node 1): e0 -> GPU 2 (local), e2 -> GPU 1: node 0, 1 row
    # t3 (node 0): e4 has no replica on node 0: GPU 2 (both 0 rows, lower GPU); e5 -> GPU 3:
    #              both on node 1, sent once: 1 row
    # t4 (node 0): e4 -> GPU 3 (GPU 2 has 1 row), e3 -> GPU 1 (local): 1 row
    # t5 (node 1): e4 local on GPUs 2 and 3 (1 row each): GPU 2; e1 -> GPU 0: 1 row
    # t6 (node 1): e2, e3 both on GPU 1: 1 row
    t = dispatch_traffic(plan, tokens, sources, gpus_per_node=2, row_bytes=100)
    assert t.inter_node_rows == 5 and t.inter_node_bytes == 500 and t.tokens == 7
    # GPU 0: t0 e0, t0 e1, t1 e0, t5 e1; GPU 1: t1 e3, t2 e2, t4 e3, t6 e2, t6 e3;
    # GPU 2: t2 e0, t3 e4, t5 e4; GPU 3: t3 e5, t4 e4
    assert t.gpu_rows == [4, 5, 3, 2]
    assert t.max_over_mean_load == pytest.approx(5 / 3.5)
    assert t.remote_nodes_per_token == pytest.approx(5 / 7)
    # one node: nothing crosses, whatever the routing
    assert (
        dispatch_traffic(plan, tokens, sources, gpus_per_node=4, row_bytes=100).inter_node_bytes
        == 0
    )


def test_dispatch_traffic_refuses_bad_input():
    plan = ReplicaPlan([[0], [1]], [1, 1], [0.0, 0.0])
    with pytest.raises(ValueError, match="does not divide"):
        dispatch_traffic(plan, [[0]], [0], gpus_per_node=3, row_bytes=1)
    with pytest.raises(ValueError, match="2 source GPUs for 1 tokens"):
        dispatch_traffic(plan, [[0]], [0, 1], gpus_per_node=1, row_bytes=1)
    with pytest.raises(ValueError, match="expert 2 has no replica"):
        dispatch_traffic(plan, [[2]], [0], gpus_per_node=1, row_bytes=1)


def test_max_over_mean():
    assert max_over_mean([4, 4, 3, 3]) == pytest.approx(4 / 3.5)
    assert max_over_mean([0, 0]) == 1.0


def test_group_limited_tokens_cross_to_at_most_their_groups_nodes():
    # Hierarchical plan on a group-limited trace: a token's experts lie in <= 2 groups, each
    # group on one node, so it is sent to at most 2 other nodes, and exactly to the nodes of its
    # groups other than its own (counted per token here, from the plan's node_of_group).
    trace = group_limited_trace(1, 2, 32, 4, 16, 8, num_groups=8, top_groups=2, seed=1)
    plan = plan_replicas(
        trace.expert_counts(0, 0).tolist(),
        8,
        5,
        max_replicas=2,
        policy="hierarchical",
        num_groups=8,
        gpus_per_node=2,
    )
    top = trace.top_experts[0][1].tolist()
    sources = [t // 16 for t in range(len(top))]
    expected = 0
    for source, experts in zip(sources, top):
        nodes = {plan.node_of_group[e // 4] for e in experts} - {source // 2}
        assert len(nodes) <= 2
        expected += len(nodes)
    assert dispatch_traffic(plan, top, sources, 2, 1).inter_node_rows == expected


# --- the group-limited trace --------------------------------------------------------------------


def test_group_limited_trace():
    trace = group_limited_trace(2, 3, 64, 8, 32, 4, num_groups=8, top_groups=4, skew=1.0, seed=3)
    assert trace.counts.shape == (2, 3, 4, 64) and trace.top_k == 8
    for layer in range(2):
        for mb in range(3):
            top = trace.top_experts[layer][mb]
            assert top.shape == (128, 8)
            assert all(len(set(row)) == 8 for row in top.tolist())  # distinct experts
            assert all(len({e // 8 for e in row}) <= 4 for row in top.tolist())  # <= 4 groups
            assert int(trace.counts[layer, mb].sum()) == 128 * 8
            # each source's counts come from its own 32 tokens
            assert (
                trace.counts[layer, mb, 1].tolist()
                == torch.bincount(top[32:64].reshape(-1), minlength=64).tolist()
            )
    again = group_limited_trace(2, 3, 64, 8, 32, 4, num_groups=8, top_groups=4, skew=1.0, seed=3)
    assert torch.equal(again.counts, trace.counts)
    assert not torch.equal(group_limited_trace(2, 3, 64, 8, 32, 4, seed=4).counts, trace.counts)
    # skewed popularity: the busiest expert gets well over its share (replication matters)
    skewed = group_limited_trace(1, 1, 64, 8, 256, 4, skew=1.0, seed=0).expert_counts(0, 0).double()
    assert float(skewed.max() / skewed.mean()) > 2.0
    with pytest.raises(ValueError, match="groups do not divide"):
        group_limited_trace(1, 1, 60, 8, 4, 1, num_groups=8)
    with pytest.raises(ValueError, match="top_groups=9 > num_groups=8"):
        group_limited_trace(1, 1, 64, 8, 4, 1, top_groups=9)


# --- the suite ----------------------------------------------------------------------------------


def test_eplb_policy_suite_runs_and_hierarchical_saves_inter_node_bytes():
    suite = all_suites()["eplb-policy"]
    grid = suite.grid(
        {
            "policy": ["global", "hierarchical"],
            "trace": ["group-limited"],
            "nodes": [8],
            "gpus_per_node": [2],
            "experts": [64],
            "tokens": [64],
            "micro_batches": [1],
            "hidden": [16],
        }
    )
    records = [
        run_point(suite, point, RunConfig(warmup=0, repeats=1, min_sample_s=0.0)) for point in grid
    ]
    for r in records:
        assert r["correct"] and r["wrong"] == 0 and r["slots_per_gpu"] == 5 and r["row_bytes"] == 32
    by_policy = {r["policy"]: r for r in records}
    # a token reaches at most 4 groups, i.e. at most 4 nodes, under the hierarchical plan
    assert by_policy["hierarchical"]["remote_nodes_per_token"] <= 4
    assert by_policy["hierarchical"]["inter_node_bytes"] < by_policy["global"]["inter_node_bytes"]
    with pytest.raises(ValueError, match="3 nodes do not divide the 8 groups"):
        suite.grid({"policy": ["hierarchical"], "nodes": [3], "experts": [96]})
