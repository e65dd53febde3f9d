"""Hierarchical all-to-alls on any EP process group: its topology and its communicators.

HALO and RBD (components/alltoall) split an exchange into intra- and inter-node phases, so on
a torch.distributed group that is not the world (e.g. one pipeline stage's EP group) they need
the group's own node layout and a communicator among its members on my node. This module gives
both, once for every such algorithm:

- :func:`world_topology`: the launcher's emulated node layout of the world;
- :func:`group_topology`: that layout restricted to a group (ranks node by node, the same number
  on every node, or a ValueError naming the algorithm and why it needs that);
- comm.NodeP2PComm: my node's members of a group, reached with batched isend/irecv over the
  group's communicator;
- :func:`group_communicators`: all of it as topology.Communicators for one group.

Nothing here creates a process group: ``new_group`` is collective over the whole world while an
EP group's members build their MoE layers without the other pipeline stages, so creating groups
here could deadlock. See docs/halo-rbd.md.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from moe_repro.components.lazy_import import lazy_module
from moe_repro.components.network.comm import NodeP2PComm, TorchComm
from moe_repro.components.network.topology import Communicators, Topology

if TYPE_CHECKING:
    import torch.distributed as dist
else:
    dist = lazy_module("torch.distributed", globals(), "dist")


def world_topology() -> Topology:
    """The launcher's emulated topology (one node of the whole world when none is set)."""
    world = dist.get_world_size()
    try:
        topo = Topology.from_environment()
    except ValueError:
        return Topology(nodes=1, ranks_per_node=world)
    if topo.world_size != world:
        raise ValueError(
            f"the environment describes {topo.world_size} ranks, the "
            f"torch.distributed world has {world}"
        )
    return topo


def group_topology(
    group_ranks: list[int],
    topo: Topology,
    algorithm: str = "HALO",
    why_equal: str = "Alg. 1 pairs equal local ranks",
) -> Topology:
    """``topo`` restricted to ``group_ranks`` (global ranks in group order): one node per
    node that holds members, ranks_per_node = members per node (which must be equal).
    ``algorithm`` and ``why_equal`` only word the ValueError."""
    nodes: list[int] = []  # node of each run of consecutive group ranks
    for r in group_ranks:
        if not nodes or nodes[-1] != topo.node_of(r):
            nodes.append(topo.node_of(r))
    if len(set(nodes)) != len(nodes):
        raise ValueError(
            f"{algorithm} needs the group's ranks node by node; {group_ranks} "
            f"interleave nodes {nodes}"
        )
    per_node = Counter(topo.node_of(r) for r in group_ranks)
    if len(set(per_node.values())) != 1:
        raise ValueError(
            f"{algorithm} needs the same number of group ranks on every node "
            f"({why_equal}); group {group_ranks} has {dict(per_node)}"
        )
    return Topology(nodes=len(nodes), ranks_per_node=len(group_ranks) // len(nodes))


def group_communicators(
    group=None,
    topo: Topology | None = None,
    algorithm: str = "HALO",
    why_equal: str = "Alg. 1 pairs equal local ranks",
) -> Communicators:
    """Communicators of process group ``group`` (None = world) on ``topo`` (default: the
    launcher's) restricted to it: ``world`` the group, ``intra`` and ``intra_overlap`` my node's
    members of it (comm.NodeP2PComm); ``inter`` (GPUs sharing a NIC) is the group itself,
    which HALO and RBD do not use. Not collective: no process group is created."""
    comm = TorchComm.of_group(group)
    sub = group_topology(
        comm.ranks, world_topology() if topo is None else topo, algorithm, why_equal
    )
    intra = NodeP2PComm(comm, sub.node_ranks(sub.node_of(comm.rank)))
    return Communicators(topo=sub, world=comm, intra=intra, intra_overlap=intra, inter=comm)
