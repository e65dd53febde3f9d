"""Differentiable HALO all-to-all-v on any torch.distributed group (e.g. one stage's EP group).

    halo_all_to_all_v(x, send_counts, recv_counts=None, group=None) -> Tensor

Same contract as :func:`moe_repro.components.alltoall.flat.all_to_all_v`: a plain collective for
callers that move rows other than an MoE dispatch; the MoE layer and the trainer hold
:class:`HaloDispatcher` (``HaloAlgorithm.group_dispatcher``) instead. The exchange is HALO (Piper
Sec. V, Alg. 1; :class:`moe_repro.components.alltoall.halo.HaloAllToAll`); its backward is HALO
again with the transposed counts matrix.

The group's topology is the launcher's (emulated) one restricted to the group's ranks; the group
must have the same number of members on every node, node by node, or a ValueError is raised.
Phases I and III are batched isend/irecv between the group's members on my node, not process
groups of their own: ``new_group`` is collective over the whole world while an EP group's
members build their MoE layers without the other pipeline stages, so creating groups here could
deadlock. Phase I is still issued before Phase II and waited on last (Eq. 13). The counts HALO's
plan needs are exchanged once per call, forward and backward.

HALO's registry entry (``halo``, :class:`HaloAlgorithm`) lives here because this module
completes it: the world collective and its schedule come from the halo module, the dispatcher on
any EP group from this one. See docs/halo-rbd.md.
"""

from __future__ import annotations

from collections import Counter
from itertools import accumulate

from functools import cache

from moe_repro.components.alltoall.base import AllToAll, AllToAllFacts, register
from moe_repro.components.alltoall.flat import Comm, FlatDispatcher, TorchComm, flat_send_layout
from moe_repro.components.alltoall.halo import PHASE_DEPENDENCIES, HaloAllToAll, halo_schedule
from moe_repro.components.lazy_import import lazy_module
from moe_repro.components.network.topology import Communicators, Topology

# Imported on first use: the simulator reads this module's schedules without tensors.
torch = lazy_module("torch", globals())
dist = lazy_module("torch.distributed", globals(), "dist")


class NodeP2PComm(Comm):
    """My node's members of a group, reached with batched isend/irecv over the group."""

    def __init__(self, group_comm: TorchComm, members: list[int]):
        # members: the group ranks on my node, ascending; self.ranks are their global ranks.
        super().__init__([group_comm.ranks[m] for m in members], group_comm.global_rank)
        self.group_comm, self.members = group_comm, list(members)

    def _record(self, phase, counts_bytes) -> None:
        pass  # the group communicator's p2p logs what actually goes on the wire

    def alltoallv_async(self, x, send_counts, recv_counts, phase="a2a", out=None):
        """Uneven all-to-all among my node's members; returns (out, handle)."""
        x, out, sc, rc, _ = self._prepare(x, send_counts, recv_counts, phase, out)
        so, ro = [0, *accumulate(sc)], [0, *accumulate(rc)]
        me = self.rank
        out[ro[me] : ro[me + 1]] = x[so[me] : so[me + 1]]  # my own chunk: a local copy
        peers = [i for i in range(self.size) if i != me]
        sends = [(self.members[i], x[so[i] : so[i + 1]]) for i in peers]
        recvs = [(self.members[i], out[ro[i] : ro[i + 1]]) for i in peers]
        return out, self.group_comm.p2p(sends, recvs, phase)


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
    ``algorithm`` and ``why_equal`` only word the ValueError (RBD uses this too)."""
    nodes = []  # node of each run of consecutive group ranks
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


def build_group_halo(group=None, topo: Topology | None = None) -> HaloAllToAll:
    """A HaloAllToAll over ``group`` (None = world), with ``topo`` (default: the launcher's)
    restricted to it. Not collective: no process group is created."""
    group = dist.group.WORLD if group is None else group
    ranks = dist.get_process_group_ranks(group)
    full = world_topology() if topo is None else topo
    sub = group_topology(ranks, full)
    comm = TorchComm(group, ranks)
    node = sub.node_of(comm.rank)
    intra = NodeP2PComm(comm, sub.node_ranks(node))
    # ``inter`` (GPUs sharing a NIC) is not used by HALO; the group stands in for it.
    return HaloAllToAll(
        Communicators(topo=sub, world=comm, intra=intra, intra_overlap=intra, inter=comm)
    )


_HALO_OF_GROUP: dict = {}  # (group, topology) -> HaloAllToAll, built once (plans, buffers)


def halo_for_group(group=None, topo: Topology | None = None) -> HaloAllToAll:
    group = dist.group.WORLD if group is None else group
    topo = world_topology() if topo is None else topo
    key = (group, topo)
    if key not in _HALO_OF_GROUP:
        _HALO_OF_GROUP[key] = build_group_halo(group, topo)
    return _HALO_OF_GROUP[key]


@cache
def _halo_all_to_all_v_function():
    """The autograd Function, defined on first use (torch itself is imported on first use)."""

    class HaloAllToAllV(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, send_counts, recv_counts, counts, halo):
            ctx.recv_counts, ctx.halo = recv_counts, halo
            # HALO returns its persistent output buffer, which the next call overwrites: copy it.
            return halo(x, send_counts, counts_matrix=counts).clone()

        @staticmethod
        def backward(ctx, grad):
            # The reverse exchange: what I received from s goes back to s, by HALO again (its own
            # counts exchange learns the transposed counts it needs).
            return ctx.halo(grad, ctx.recv_counts).clone(), None, None, None, None

    return HaloAllToAllV


def halo_all_to_all_v(
    x: torch.Tensor, send_counts: list[int], recv_counts: list[int] | None = None, group=None
) -> torch.Tensor:
    """Differentiable HALO all-to-all-v over ``group``; see the module docstring."""
    halo = halo_for_group(group)
    comm = halo.comms.world
    send_counts = [int(c) for c in send_counts]
    if len(send_counts) != comm.size:
        raise ValueError(f"send_counts has {len(send_counts)} entries, group has {comm.size} ranks")
    if any(c < 0 for c in send_counts):
        raise ValueError(f"send_counts must be >= 0, got {send_counts}")
    if sum(send_counts) != x.shape[0]:
        raise ValueError(f"send_counts sum to {sum(send_counts)} but x has {x.shape[0]} rows")
    counts = halo.known_counts(send_counts)  # my row, my column, my Phase-II peers' counts
    received = [int(counts[s][comm.rank]) for s in range(comm.size)]
    if recv_counts is not None and [int(c) for c in recv_counts] != received:
        raise ValueError(
            f"recv_counts {list(recv_counts)} differ from what the group sends "
            f"this rank: {received}"
        )
    return _halo_all_to_all_v_function().apply(x, send_counts, received, counts, halo)


# --- the registry entry -----------------------------------------------------------------------


class HaloDispatcher(FlatDispatcher):
    """MoE dispatch/combine in the flat layout with HALO's three phases in place of the flat
    all-to-all-v (same rows, same order). Without grad the dispatched rows are HALO's persistent
    output buffer: the next call overwrites them."""

    def __init__(self, halo: HaloAllToAll, expert_to_rank):
        super().__init__(halo.comms.world, expert_to_rank)
        self.halo = halo

    def receive_counts(self, send_counts):
        counts = self.halo.known_counts(send_counts)  # what HALO's own call would exchange
        me = self.comm().rank
        return [int(counts[s][me]) for s in range(self.comm().size)], counts

    def exchange(self, rows, state):
        return self.halo(rows, state.layout.send_counts, counts_matrix=state.known_counts)

    def reverse(self, rows, send_counts, recv_counts):
        # its own counts exchange learns the transposed counts; its own output buffer, so that
        # the way back leaves the dispatched rows alone (as flat's and RBD's do)
        return self.halo(rows, send_counts, out_buffer="O_back")


class HaloAlgorithm(AllToAll):
    """HALO (Piper Sec. V, Alg. 1): intra-node, then NIC-affine inter-node, then intra-node."""

    facts = AllToAllFacts(
        name="halo",
        label="HALO",
        paper_section="Piper Sec. V, Alg. 1",
        description="hierarchical all-to-all: one message per remote node through same-local-rank "
        "peers, regrouped inside the node",
        equal_ranks_per_node=True,
        schedule_from_counts=True,
        stages=("counts exchange", "buffer gather", "all-to-all"),
    )
    phase_dependencies = PHASE_DEPENDENCIES

    def dispatcher(self, comms, expert_to_rank, generator=None) -> HaloDispatcher:
        return HaloDispatcher(HaloAllToAll(comms), expert_to_rank)

    def group_dispatcher(
        self, expert_to_rank, group=None, topo=None, generator=None
    ) -> HaloDispatcher:
        return HaloDispatcher(build_group_halo(group, topo), expert_to_rank)

    def check_group(self, group_ranks, topo) -> None:
        group_topology(group_ranks, topo)

    def counts_schedule(self, counts_matrix, topo, row_bytes, with_counts=True, ranks=None):
        return halo_schedule(counts_matrix, topo, row_bytes, with_counts, ranks=ranks)

    def routed_schedule(
        self, pfts, expert_to_rank, topo, row_bytes, generators=None, with_counts=True
    ):
        n = topo.world_size
        if len(pfts) != n:
            raise ValueError(f"need one PFT per rank ({n}), got {len(pfts)}")
        counts = [flat_send_layout(pft, expert_to_rank, n)[1] for pft in pfts]
        return halo_schedule(counts, topo, row_bytes, with_counts)


register(HaloAlgorithm())
