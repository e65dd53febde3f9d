"""The simulator's fabrics, checked against times written by hand from each fabric's formula.

Every case uses a machine whose numbers make the max-min fair rates easy to derive on paper;
the derivation is in each test's comment, and the expected time is computed here from that
formula, never from the simulator.
"""

from __future__ import annotations

import pytest

from moe_repro.components.network import simulator as ns
from moe_repro.components.alltoall import simulated
from moe_repro.components.network.platform import from_dict

GB = 1e9
MiB = 1 << 20


def machine(
    gpus: int,
    nics: int,
    nic_GBps: float,
    fabric: dict | None = None,
    intra: dict | None = None,
    latency_us: float = 0.0,
    per_message_us: float = 0.0,
    window: int = 0,
    latency_model: str = "overlapped",
    group: int = 1024,
):
    node = {
        "gpus": gpus,
        "nics": nics,
        "nic_GBps": nic_GBps,
        "gpu_nic_affinity": [
            [g for g in range(gpus) if g * nics // gpus == i] for i in range(nics)
        ],
        "intra_node_alltoall_GBps_per_gpu": 50.0,
    }
    if intra:
        node["intra_node"] = intra
    network = {
        "switch_group_nodes": group,
        "rack_nodes": group,
        "per_message_us": per_message_us,
        "window": window,
        "latency_model": latency_model,
    }
    if fabric:
        network["fabric"] = fabric
    return from_dict(
        {
            "name": "hand",
            "gpu": {
                "peak_tflops": 1,
                "hbm_GB": 1,
                "hbm_GBps": 1,
                "achievable_gemm_tflops": 1,
                "achievable_attention_tflops": 1,
            },
            "node": node,
            "network": network,
            "links": [
                {"class": "intra_node", "GBps": 50.0, "latency_us": latency_us},
                {"class": "nic_injection", "GBps": nic_GBps, "latency_us": latency_us},
            ],
        }
    )


def uniform(algo, p, nodes, size, model=None):
    return simulated.simulate_uniform(
        algo, ns.topology_for(p, nodes), p, size, latency_model=model
    ).time_s


# --- rail-optimised ---------------------------------------------------------------------------

RAIL_4_TO_1 = {"kind": "rail", "rail_group_nodes": 32, "spine_taper": 0.25}
NVSWITCH = {"kind": "switch", "GBps_per_gpu": 450.0}


def test_rail_4_to_1_hierarchical_is_clearly_faster_than_flat_at_16_nodes():
    # 16 nodes x 8 GPUs, NIC k of every node on rail switch k, 50 GB/s per NIC; the rail
    # switches' spine uplinks carry 1/4 of their downlink rate. S bytes to every peer.
    p = machine(8, 8, 50.0, RAIL_4_TO_1, NVSWITCH)
    S, nodes = MiB, 16
    # Flat: of a GPU's 120 remote peers, 105 sit on other rails, so their bytes cross the spine.
    # Rail k's uplink: 0.25 x 50 GB/s x 16 nodes = 200 GB/s for 16 x 105 flows; the uplink is
    # the bottleneck, so the last byte leaves after 16 x 105 x S / 200 GB/s.
    flat = 16 * 105 * S / (0.25 * 50 * GB * 16)
    # HALO: phase II sends 15 messages of 8 S to the same local rank (same rail) of every other
    # node: 120 S through the 50 GB/s NIC, no spine; phase III forwards 105 S to the 7 local
    # peers through the 450 GB/s NVSwitch port; phase I (7 S over NVSwitch) runs beside phase II.
    halo = 120 * S / (50 * GB) + 105 * S / (450 * GB)
    assert uniform("flat", p, nodes, S) == pytest.approx(flat, rel=1e-9)
    assert uniform("halo", p, nodes, S) == pytest.approx(halo, rel=1e-9)
    assert flat / halo > 3.0  # 8.4 / 2.63: clearly faster, for a reason other than message count


def test_non_blocking_rail_with_overlapped_latency_keeps_flat_at_least_as_fast():
    # Taper 1, 1 us per message overlapped with transfers, 2 us link latency, window 32.
    p = machine(
        8,
        8,
        50.0,
        {"kind": "rail", "rail_group_nodes": 32, "spine_taper": 1.0},
        NVSWITCH,
        latency_us=2.0,
        per_message_us=1.0,
        window=32,
    )
    S, nodes = MiB, 16
    # Flat: 120 remote flows per GPU share its NIC (fair share 50/120 GB/s is below the spine's
    # 800/1680), so: first issue (1 us) + latency (2 us) + 120 S / 50 GB/s. Issuing the other
    # 126 messages takes 126 us, well inside the 2.5 ms transfer.
    flat = 1e-6 + 2e-6 + 120 * S / (50 * GB)
    # HALO pays the same NIC time in phase II, then phase III after it.
    halo_at_least = flat + 1e-6 + 2e-6 + 105 * S / (450 * GB)
    got_flat, got_halo = uniform("flat", p, nodes, S), uniform("halo", p, nodes, S)
    assert got_flat == pytest.approx(flat, rel=1e-9)
    assert got_halo >= halo_at_least * (1 - 1e-9)
    assert got_flat <= got_halo


# --- fat tree with a taper at each level ------------------------------------------------------


def test_fat_tree_tapers_at_two_levels():
    # 32 nodes, 1 GPU and one NIC of B each; leaves of 4 nodes with taper 1/2, pods of 16 with
    # taper 1/4. Each node sends S to 31 peers: 3 in its leaf, 12 in its pod, 16 outside it.
    # Pod uplink: 0.25 B x 16 nodes for 16 x 16 flows = B/64 each: the slowest, so the exchange
    # ends when 16 S have crossed at B/64 each: 64 S / B (= 16 S / (1/4 B) per node).
    B = 10.0
    p = machine(
        1,
        1,
        B,
        {
            "kind": "fat_tree",
            "levels": [
                {"name": "leaf", "nodes": 4, "taper": 0.5},
                {"name": "pod", "nodes": 16, "taper": 0.25},
            ],
        },
    )
    S = MiB
    assert uniform("flat", p, 32, S) == pytest.approx(64 * S / (B * GB), rel=1e-9)
    # Only the leaf tapered (1/4), pods non-blocking: 28 S leave each leaf per node: 28 S / (B/4).
    p = machine(
        1,
        1,
        B,
        {
            "kind": "fat_tree",
            "levels": [
                {"name": "leaf", "nodes": 4, "taper": 0.25},
                {"name": "pod", "nodes": 16, "taper": 1.0},
            ],
        },
    )
    assert uniform("flat", p, 32, S) == pytest.approx(28 * S / (0.25 * B * GB), rel=1e-9)


# --- Dragonfly --------------------------------------------------------------------------------


def test_dragonfly_global_taper():
    # 2 groups of 4 nodes (switches of 2 nodes), 1 GPU and one NIC of B per node, global links
    # at half the group's injection rate. A node sends S to 7 peers, 4 of them in the other group.
    # Global uplink: 0.5 B x 4 nodes for 4 x 4 flows = B/8 each, the first resource to fill; the
    # exchange ends when 4 S have crossed at B/8: 8 S / B (= 4 S / (1/2 B)).
    B = 10.0
    p = machine(
        1,
        1,
        B,
        {
            "kind": "dragonfly",
            "switch_nodes": 2,
            "group_nodes": 4,
            "intra_group_taper": 1.0,
            "global_taper": 0.5,
        },
    )
    S = MiB
    assert uniform("flat", p, 8, S) == pytest.approx(8 * S / (B * GB), rel=1e-9)
    # Non-blocking global links: the NIC is the bottleneck: 7 S / B.
    p = machine(
        1,
        1,
        B,
        {
            "kind": "dragonfly",
            "switch_nodes": 2,
            "group_nodes": 4,
            "intra_group_taper": 1.0,
            "global_taper": 1.0,
        },
    )
    assert uniform("flat", p, 8, S) == pytest.approx(7 * S / (B * GB), rel=1e-9)


# --- intra-node links -------------------------------------------------------------------------


def test_intra_node_link_graph_against_one_port_per_gpu():
    # One node of 8 GCDs: package pairs (0,1), (2,3), ... linked at 200 GB/s, every other pair at
    # 50 GB/s. Each GCD sends S to each of 7 peers; every pair has its own link, so the exchange
    # ends when the 50 GB/s links have carried S: S / 50 GB/s.
    graph = {
        "kind": "graph",
        "pairs": [[0, 1, 200.0], [2, 3, 200.0], [4, 5, 200.0], [6, 7, 200.0]],
        "other_pairs_GBps": 50.0,
    }
    S = MiB
    assert uniform("flat", machine(8, 4, 25.0, intra=graph), 1, S) == pytest.approx(
        S / (50 * GB), rel=1e-9
    )
    # The one-port model (50 GB/s per GPU for all its intra-node bytes): 7 S / 50 GB/s.
    assert uniform("flat", machine(8, 4, 25.0), 1, S) == pytest.approx(7 * S / (50 * GB), rel=1e-9)
    # NVSwitch: one 450 GB/s port per GPU, any peer: 7 S / 450 GB/s.
    assert uniform("flat", machine(8, 4, 25.0, intra=NVSWITCH), 1, S) == pytest.approx(
        7 * S / (450 * GB), rel=1e-9
    )


# --- latency models ---------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["serial", "overlapped"])
def test_latency_models_on_small_messages(model):
    # 4 nodes x 1 GPU, o = 1 us per message, L = 2 us, 4 KiB to each of 3 peers at 10 GB/s.
    p = machine(1, 1, 10.0, latency_us=2.0, per_message_us=1.0)
    S = 4096
    bytes_time = 3 * S / (10 * GB)  # 1.2 us: the NIC pushes 3 S
    if model == "serial":  # 3 issues, then the latency, then the bytes
        expected = 3e-6 + 2e-6 + bytes_time
    else:  # 1 issue + latency, then max(2 more issues, the bytes): the issue rate binds
        expected = 1e-6 + 2e-6 + max(2e-6, bytes_time)
    assert uniform("flat", p, 4, S, model) == pytest.approx(expected, rel=1e-9)


def test_window_caps_the_rate_of_a_latency_bound_rank():
    # 2 nodes x 1 GPU, no issue cost, L = 10 us, window 1: one message in flight, so a rank
    # sending one 1 MiB message ... is not limited (one message); with 2 nodes of 2 GPUs each GPU
    # sends 3 messages of S, window 1: rate <= 1 x S / 10 us.
    p = machine(
        2, 2, 1000.0, latency_us=10.0, window=1, intra={"kind": "switch", "GBps_per_gpu": 1000.0}
    )
    S = 64 * 1024
    got = uniform("flat", p, 2, S)
    # 3 S at S / 10 us = 30 us after the first latency (10 us); the links (1000 GB/s) never bind.
    assert got == pytest.approx(10e-6 + 3 * S / (S / 10e-6), rel=1e-9)


def test_every_simulated_result_lists_its_assumptions():
    p = machine(8, 8, 50.0, RAIL_4_TO_1, NVSWITCH, per_message_us=1.0, window=32)
    r = simulated.simulate_uniform("flat", ns.topology_for(p, 4), p, 4096)
    text = " | ".join(r.assumptions)
    assert r.latency_model == "overlapped"
    for needle in (
        "overlapped",
        "rail-optimised",
        "taper 0.25",
        "non-blocking switch",
        "max-min fair",
        "background traffic",
    ):
        assert needle in text, needle


@pytest.mark.parametrize(
    "fabric",
    [
        RAIL_4_TO_1,
        {"kind": "rail", "rail_group_nodes": 2, "spine_taper": 0.5},
        {"kind": "dragonfly", "switch_nodes": 1, "group_nodes": 2, "global_taper": 0.5},
        {"kind": "fat_tree", "levels": [{"name": "leaf", "nodes": 2, "taper": 0.5}]},
    ],
)
@pytest.mark.parametrize("algo", ["flat", "halo"])
@pytest.mark.parametrize("model", ["serial", "overlapped"])
def test_aggregated_equals_per_message_on_every_fabric(fabric, algo, model):
    # The aggregated simulation (one representative node) must agree with simulating every
    # message when the traffic is node-symmetric, whatever the fabric and latency model.
    p = machine(4, 4, 25.0, fabric, NVSWITCH, latency_us=2.0, per_message_us=1.0, window=8)
    topo = ns.topology_for(p, 4)
    fn, deps = simulated.expected_schedule(algo, topo, 4096)
    rows_to = [3, 0, 5, 1] * 4
    agg = ns.simulate_expected(fn, rows_to, topo, p, deps, model)
    full = ns.simulate_messages(
        fn([rows_to] * topo.world_size, range(topo.world_size)), topo, p, deps, model
    )
    assert agg.time_s == pytest.approx(full.time_s, rel=1e-9)


def test_unmeasured_network_values_are_the_approximate_fields_a_network_simulation_reads():
    import copy

    from moe_repro.components.network.platform import (
        from_dict,
        load_builtin,
        unmeasured_network_values,
    )

    raw = copy.deepcopy(load_builtin("dgx-h100").raw)
    raw["approximate"] = [
        "gpu.achievable_gemm_tflops",
        "network.per_message_us",
        "links[*].latency_us",
        "framework_overhead_GB",
        "efficiency.network",
    ]
    raw["network"]["per_message_us"] = 2.5
    raw["efficiency"]["network"] = 0.75
    assert unmeasured_network_values(from_dict(raw)) == [
        "network.per_message_us = 2.5",
        "links[*].latency_us",
        "efficiency.network = 0.75",
    ]
    raw["approximate"] = ["gpu.sm_count"]
    assert unmeasured_network_values(from_dict(raw)) == []
