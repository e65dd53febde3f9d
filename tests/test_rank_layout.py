"""EP-first vs DP-first placement (X-MoE App. C.1): groups, a real ring all-reduce, and bytes per
link class counted from real messages vs the formula."""

import pytest

from moe_repro.components.network.rank_layout import rank_layout_groups, traffic_model
from moe_repro.components.network.topology import Topology


def test_groups_partition_the_world_and_localise_the_right_collective():
    topo = Topology(nodes=8, ranks_per_node=8)
    for order in ("ep-first", "dp-first"):
        ep_groups, dp_groups = rank_layout_groups(64, 8, order)
        for groups, size in ((ep_groups, 8), (dp_groups, 8)):
            assert sorted(r for g in groups for r in g) == list(range(64))
            assert all(len(g) == size for g in groups)
        # every EP group meets every DP group in exactly one rank
        assert all(len(set(e) & set(d)) == 1 for e in ep_groups for d in dp_groups)
        inside = ep_groups if order == "ep-first" else dp_groups
        across = dp_groups if order == "ep-first" else ep_groups
        assert all(len({topo.node_of(r) for r in g}) == 1 for g in inside)
        assert all(len({topo.node_of(r) for r in g}) == 8 for g in across)
    with pytest.raises(ValueError, match="divide"):
        rank_layout_groups(12, 5, "ep-first")


def test_formula_extremes():
    # EP-first with EP = GPUs per node: no inter-node all-to-all; DP-first: no inter-node all-reduce.
    ep_first = traffic_model(4, 4, 4, "ep-first", 16, 2, 8, 100)
    dp_first = traffic_model(4, 4, 4, "dp-first", 16, 2, 8, 100)
    assert ep_first["alltoall"]["inter_node"] == 0 and ep_first["allreduce"]["inter_node"] > 0
    assert dp_first["allreduce"]["inter_node"] == 0 and dp_first["alltoall"]["inter_node"] > 0


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "nodes,gpn,ep,params",
    [
        (2, 2, 2, 1001),  # gradient size not divisible by the DP degree
        (2, 4, 4, 37),  # 8 ranks: EP-first keeps the all-to-all in a node, DP-first the all-reduce
    ],
)
def test_real_run_bytes_equal_formula_under_uniform_routing(nodes, gpn, ep, params):
    from moe_repro.reproductions.xmoe_appc1 import run_small

    tokens, top_k, hidden = 6, 2, 5
    orders = ("ep-first", "dp-first")
    runs = run_small(orders, nodes, gpn, ep, tokens, top_k, hidden, params, seed=3, uniform=True)
    for order in orders:
        real = runs[order]
        assert real["correct"], order
        model = traffic_model(
            nodes, gpn, ep, order, tokens, top_k, hidden, params, act_bytes=4, grad_bytes=4
        )
        dp = nodes * gpn // ep
        for cls in ("intra_node", "inter_node"):
            assert real["alltoall"][cls] == pytest.approx(model["alltoall"][cls], abs=1e-9), (
                order,
                cls,
            )
            # ring: each rank sends 2 (n-1) chunks of ~params/n elements; tensor_split chunk
            # sizes differ by at most one element, so allow that per message
            slack = 2 * (dp - 1) * 4 * nodes * gpn
            assert abs(real["allreduce"][cls] - model["allreduce"][cls]) <= slack, (order, cls)
        assert real["allreduce"]["intra_node" if order == "dp-first" else "inter_node"] > 0


def test_communicators_by_name_gives_each_object_once_and_set_log_reaches_each():
    """A double whose intra-node communicator is also its overlap one is walked once, under the
    first name; a missing one is skipped; set_log reaches every communicator there is."""
    from types import SimpleNamespace

    from moe_repro.components.network.topology import Communicators, Topology

    world, intra = SimpleNamespace(), SimpleNamespace()
    comms = Communicators(
        Topology(nodes=1, ranks_per_node=2),
        world=world,
        intra=intra,
        intra_overlap=intra,
        inter=None,
    )
    assert comms.by_name() == {"world": world, "intra": intra}
    log: list = []
    comms.set_log(log)
    assert world.log is log and intra.log is log
