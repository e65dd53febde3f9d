"""The registered all-to-alls on the flow-level network simulator: the glue between the two.

components/network/simulator.py replays messages and knows no algorithm; the algorithms
(components/alltoall) produce their messages as data (``counts_schedule``, ``routed_schedule``).
This module joins them by name, so the network layer imports nothing from the algorithms above
it (tests/test_layers.py checks the order inside components/). Every number it returns is a
prediction of the simulator, not a measurement.
"""

from __future__ import annotations

from moe_repro.components.alltoall.base import get_algorithm
from moe_repro.components.network.platform import Platform
from moe_repro.components.network.simulator import SimResult, simulate_expected
from moe_repro.components.network.topology import Topology


def expected_schedule(algo: str, topo: Topology, row_bytes: int, with_counts: bool = False):
    """(schedule_fn(C, ranks), phase dependencies) of the registered all-to-all ``algo``, for
    :func:`simulator.simulate_expected`. Only algorithms whose messages follow from a counts
    matrix (``facts.schedule_from_counts``); the others need every rank's routing: replay their
    ``routed_schedule`` with :func:`simulator.simulate_messages`."""
    algorithm = get_algorithm(algo)
    if not algorithm.facts.schedule_from_counts:
        raise ValueError(
            f"{algo} cannot be simulated from expected counts (its messages depend on "
            f"every rank's routing): use simulate_messages with its routed_schedule"
        )

    def schedule_fn(C, ranks):
        return algorithm.counts_schedule(C, topo, row_bytes, with_counts, ranks=ranks)

    return schedule_fn, algorithm.phase_dependencies


def simulate_uniform(
    algo: str,
    topo: Topology,
    platform: Platform,
    bytes_per_peer: int,
    with_counts: bool = False,
    latency_model: str | None = None,
) -> SimResult:
    """Equal splits (Piper Alg. 1, Fig. 8): every rank sends ``bytes_per_peer`` to every rank,
    by the registered all-to-all ``algo``."""
    fn, deps = expected_schedule(algo, topo, int(bytes_per_peer), with_counts)
    return simulate_expected(fn, [1] * topo.world_size, topo, platform, deps, latency_model)
