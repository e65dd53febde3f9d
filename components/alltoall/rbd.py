"""Redundancy-bypassing dispatch and its reversed combine (X-MoE Sec. 4.2, Fig. 7).

With top-k routing a token often picks several experts on one node. Flat dispatch sends one
copy of the token per (token, expert) pair, so the same activation crosses the inter-node links
several times. RBD sends one *pilot* per (token, destination node) across nodes and rebuilds the
other copies (*local replicas*) on the destination node, where links are fast:

  S0  pilot selection: one of the token's pairs on each destination node, uniformly at random
      (so pilots spread over the node's ranks), plus a metadata row per pair;
  S1  inter-node exchange of pilots only, then local replica reconstruction;
  S2  intra-node all-to-all of the replicas and expert-input reconstruction.
  Combine reverses it, scaling each pair's output by its combine weight and summing into its
  pilot before the pilots cross the nodes back.

:meth:`RBDDispatcher.dispatch` returns bit-for-bit the flat all-to-all's output for the same PFT
(same row order), so the same expert computation runs on either. Any placement map works,
replicated experts included; the EP group need not be the world (:meth:`RBDDispatcher.for_group`,
no process group created inside; the group's ranks must come node by node, the same number per
node). All metadata is exchanged in the plan, before any row moves, so the rows' way out can run
again on a gradient with the same pilots. Registered as ``rbd`` (:class:`RBDAlgorithm`),
differentiable like every dispatcher; the simulator replays it from every rank's routing.

Why: inter-node rows per source drop from one per (token, expert) pair to one per unique
(token, remote node) pair. The stages, byte counts and group rules: see docs/halo-rbd.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from moe_repro.components.alltoall.base import (
    AllToAll,
    AllToAllFacts,
    Dispatcher,
    FlatLayout,
    ReusedBuffers,
    register,
)
from moe_repro.components.alltoall.flat import expert_rank_map, flat_send_layout
from moe_repro.components.lazy_import import lazy_module
from moe_repro.components.network.groups import group_communicators, group_topology
from moe_repro.components.network.topology import Topology
from moe_repro.components.provenance import produced
from moe_repro.components.torch_cpu_random import TorchCPUGenerator

# ``PFT`` in the annotations is components/moe/pft.py's; not imported: moe sits above alltoall
# in components/ (tests/test_layers.py), and annotations are never evaluated here.

PFT = Any  # components/moe/pft.py's PFT, by name only (see above)

# Imported on first use: the registry (read by the simulator) imports this module.
if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())

# replica_counts: how many replicas each rank of the node builds for me, known only once the
# metadata has arrived (the replicas are read off it).
PHASE_DEPENDENCIES = {
    "counts": [],
    "meta": ["counts"],
    "pilot": ["counts"],
    "replica": ["pilot", "meta"],
    "replica_counts": ["meta"],
    "replica_meta": ["replica_counts"],
}
COMBINE_PHASE_DEPENDENCIES = {"combine_replica": [], "combine_pilot": ["combine_replica"]}
# RBDDispatcher.dispatch's six blocking calls in program order (the plan's counts, meta, replica
# counts and replica metadata, then the pilots and the replicas): what its measured time
# follows, not the overlap PHASE_DEPENDENCIES allows.
DISPATCHER_DEPENDENCIES = {
    "counts": [],
    "meta": ["counts"],
    "replica_counts": ["meta"],
    "replica_meta": ["replica_counts"],
    "pilot": ["replica_meta"],
    "replica": ["pilot"],
}
# Why RBD needs the same number of group ranks on every node (worded in group_topology's error).
RBD_WHY_EQUAL = "node = group rank // ranks per node"
META_BYTES_PER_PAIR = 32
REPLICA_META_BYTES = 16


def _pilot_groups(
    group_key: torch.Tensor, priority: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(pilot pair of every group, groups in key order; group number of every pair): each
    group's pilot is its pair of lowest priority, ties left to torch's (unstable) argsort."""
    n_pairs = group_key.numel()
    by_priority = torch.argsort(priority)
    by_group = by_priority[torch.argsort(group_key[by_priority], stable=True)]
    sorted_keys = group_key[by_group]
    first = torch.ones(n_pairs, dtype=torch.bool)
    first[1:] = sorted_keys[1:] != sorted_keys[:-1]
    group_of_sorted = torch.cumsum(first.long(), 0) - 1  # group number, groups in key order
    pilot_pairs = by_group[first]  # one pair per group, groups in (token, node) order
    pilot_of_pair = torch.empty(n_pairs, dtype=torch.int64)
    pilot_of_pair[by_group] = group_of_sorted  # group (== pilot) number of every pair
    return pilot_pairs, pilot_of_pair


def _pilot_groups_numpy(
    group_key: np.ndarray, priority: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_pilot_groups` on numpy arrays, the same pilots: sorted by (group, priority),
    each group's first pair is its pilot; where two pairs tie for a group's lowest priority the
    pilot is whichever torch's unstable sort puts first, so those ask torch (rare: priorities
    are 24-bit draws)."""
    order = np.lexsort((priority, group_key))
    sorted_keys, sorted_priority = group_key[order], priority[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = sorted_keys[1:] != sorted_keys[:-1]
    tied = ~first[1:] & first[:-1] & (sorted_priority[1:] == sorted_priority[:-1])
    if tied.any():
        pilots, groups = _pilot_groups(torch.from_numpy(group_key), torch.from_numpy(priority))
        return pilots.numpy(), groups.numpy()
    pilot_of_pair = np.empty(len(order), dtype=np.int64)
    pilot_of_pair[order] = np.cumsum(first) - 1
    return order[first], pilot_of_pair


@dataclass
class Stage0:
    """Pilot selection of one source rank (pure: PFT, placement, topology, random generator)."""

    pilot_token: torch.Tensor  # token row of each pilot, in send order (grouped by pilot rank)
    pilot_counts: list[int]  # pilots per destination rank
    meta: torch.Tensor  # int64 [pairs, 4]: pilot index in its chunk, dst rank, slot, weight bits
    meta_counts: list[int]  # pairs per pilot rank
    pilot_dest_rank: torch.Tensor  # pilot rank of each pilot (send order)
    pair_dest_rank: torch.Tensor  # destination rank of each pair, PFT order
    send_rows: torch.Tensor  # the flat send order (PFT row of each flat send row)
    send_counts: list[int]  # the flat layout's rows per destination rank


def select_pilots(
    pft: PFT, expert_to_rank, topo: Topology, generator: torch.Generator | None = None
) -> Stage0:
    """Stage 0 on one source rank (X-MoE Sec. 4.2 S0)."""
    N = topo.world_size
    n_pairs = pft.num_rows
    dest = expert_rank_map(expert_to_rank, pft.num_experts, N)[pft.expert_ids]
    dest_node = torch.div(dest, topo.ranks_per_node, rounding_mode="floor")
    # Slot of each pair inside the flat chunk for its destination rank.
    order, counts = flat_send_layout(pft, expert_to_rank, N)
    chunk_start = torch.tensor([sum(counts[:d]) for d in range(N)], dtype=torch.int64)
    slot = torch.empty(n_pairs, dtype=torch.int64)
    slot[order] = torch.arange(n_pairs) - chunk_start[dest[order]]

    # Group pairs by (token, destination node); a random priority picks each group's pilot.
    group_key = pft.token_ids * topo.nodes + dest_node
    priority = torch.rand(n_pairs, generator=generator)
    pilot_pairs, pilot_of_pair = _pilot_groups(group_key, priority)

    # Pilots travel to their own expert's rank, grouped by that rank (stable).
    pilot_rank = dest[pilot_pairs]
    send = torch.argsort(pilot_rank, stable=True)
    pilot_counts = torch.bincount(pilot_rank, minlength=N).tolist()
    pilot_start = torch.tensor([sum(pilot_counts[:r]) for r in range(N)], dtype=torch.int64)
    position = torch.empty_like(send)
    position[send] = torch.arange(send.numel())
    pilot_index = position - pilot_start[pilot_rank]  # index inside the chunk to its rank

    # Metadata: one row per pair, sent to its pilot's rank, grouped by that rank.
    pair_pilot_rank = pilot_rank[pilot_of_pair]
    meta_order = torch.argsort(pair_pilot_rank, stable=True)
    weights = pft.combine_weights.detach().to(torch.float64).contiguous()
    meta = torch.stack([pilot_index[pilot_of_pair], dest, slot, weights.view(torch.int64)], 1)
    return Stage0(
        pilot_token=pft.token_ids[pilot_pairs][send],
        pilot_counts=[int(c) for c in pilot_counts],
        meta=meta[meta_order].contiguous(),
        meta_counts=[int(c) for c in torch.bincount(pair_pilot_rank, minlength=N).tolist()],
        pilot_dest_rank=pilot_rank[send],
        pair_dest_rank=dest,
        send_rows=order,
        send_counts=[int(c) for c in counts],
    )


@dataclass
class RBDPlan:
    """Everything one dispatch's rows need, learnt before any row moves (stage 0, the counts
    and metadata exchanges and the index arithmetic); the ways out and back read only this."""

    layout: FlatLayout
    s0: Stage0
    pilot_recv: list[int]  # pilots from each rank
    direct_pilot: torch.Tensor  # pilot row (received buffer) of pairs whose expert is here
    direct_out: torch.Tensor  # output row of those pairs
    direct_weight: torch.Tensor
    replica_pilot: torch.Tensor  # pilot row of each replica I build, in replica send order
    replica_weight: torch.Tensor
    replica_send: list[int]  # per local rank
    replica_recv: list[int]
    replica_out: torch.Tensor  # output row of each replica I receive
    total_out: int

    @property
    def n_pilots_in(self) -> int:
        return sum(self.pilot_recv)


class RBDDispatcher(Dispatcher):
    """RBD dispatch/combine for one rank over topology.Communicators (``comms.world`` is the EP
    group, ``comms.intra`` my node's members of it, ``comms.topo`` the group's topology).
    ``generator`` draws the pilots when a dispatch call passes none."""

    def __init__(self, comms, expert_to_rank, generator: torch.Generator | None = None):
        self.comms = comms
        self.topo: Topology = comms.topo
        if comms.world.size != self.topo.world_size:
            raise ValueError(
                f"the EP communicator has {comms.world.size} ranks, its topology "
                f"{self.topo.world_size}"
            )
        self.expert_to_rank = torch.as_tensor(expert_to_rank, dtype=torch.int64)
        self.generator = generator
        self.rank = comms.world.rank  # my rank in the EP group (= global rank on the world)
        self.state: RBDPlan | None = None
        # The rows' way out and back live in reused buffers, as flat's and HALO's do (the
        # Dispatcher contract: without grad the next dispatch overwrites them): a fresh
        # multi-MiB tensor per call is page-faulted in on first touch.
        self.buffers = ReusedBuffers()

    def comm(self):
        return self.comms.world

    @classmethod
    def for_group(
        cls,
        expert_to_rank,
        group=None,
        topo: Topology | None = None,
        generator: torch.Generator | None = None,
    ) -> "RBDDispatcher":
        """RBD over the torch.distributed process group ``group`` (None = world), with
        ``expert_to_rank`` in group ranks and ``topo`` (default: the launcher's emulated node
        layout) restricted to the group. Not collective: no process group is created."""
        # RBD uses only ``world`` (S1) and ``intra`` (S2).
        comms = group_communicators(group, topo, "RBD", RBD_WHY_EQUAL)
        return cls(comms, expert_to_rank, generator)

    def dispatch(
        self, x: torch.Tensor, pft: PFT, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Expert inputs on this rank, in the flat all-to-all's output layout; ``generator``
        (default: the dispatcher's) draws the pilots."""
        if x.dim() != 2 or x.shape[0] != pft.num_tokens:
            raise ValueError(f"x must be [{pft.num_tokens}, H], got {tuple(x.shape)}")
        self.state = self.plan(pft, generator)
        return self._send(x, self.state)

    def plan(self, pft: PFT, generator: torch.Generator | None = None) -> RBDPlan:
        """S0, the S1 counts and metadata exchange and the S2 replica metadata exchange."""
        topo, world, intra = self.topo, self.comms.world, self.comms.intra
        N, me = topo.world_size, self.rank
        generator = self.generator if generator is None else generator
        t = self._clock()
        s0 = select_pilots(pft, self.expert_to_rank, topo, generator)
        t = self._lap("pilot selection", t)

        # S1 metadata: counts, and one row per pair (with its combine weight) to its pilot's rank.
        counts = torch.tensor([s0.pilot_counts, s0.meta_counts], dtype=torch.int64).t().contiguous()
        got = world.alltoallv(counts, [1] * N, [1] * N, "counts")
        pilot_recv, meta_recv = got[:, 0].tolist(), got[:, 1].tolist()
        meta = world.alltoallv(s0.meta, s0.meta_counts, meta_recv, "meta")

        # Re-encode relative pilot indices to rows of the received pilot buffer.
        src_of_meta = torch.repeat_interleave(
            torch.arange(N), torch.tensor(meta_recv, dtype=torch.int64)
        )
        pilot_base = torch.tensor([sum(pilot_recv[:s]) for s in range(N)], dtype=torch.int64)
        pilot_row = pilot_base[src_of_meta] + meta[:, 0]
        dst, slot = meta[:, 1], meta[:, 2]
        weight = meta[:, 3].contiguous().view(torch.float64)
        direct = dst == me
        if bool(((dst // topo.ranks_per_node) != topo.node_of(me)).any()):
            raise RuntimeError(
                "RBD metadata names a destination outside this node (placement maps differ?)"
            )
        # Local replicas: one copy of the pilot per other pair on this node, ordered by
        # destination rank so the intra-node exchange buffer is contiguous.
        rep = torch.nonzero(~direct).reshape(-1)
        rep = rep[torch.argsort(dst[rep], stable=True)]
        local_of_dst = dst[rep] - topo.node_ranks(topo.node_of(me))[0]
        replica_send = [
            int(c) for c in torch.bincount(local_of_dst, minlength=topo.ranks_per_node).tolist()
        ]
        replica_meta = torch.stack([src_of_meta[rep], slot[rep]], 1).contiguous()
        # S2 metadata: each replica's (source, slot) to its destination.
        replica_recv = intra.exchange_counts(replica_send, "replica_counts")
        got_meta = intra.alltoallv(replica_meta, replica_send, replica_recv, "replica_meta")
        # Expert input rows in the flat layout: row = start[source] + slot.
        src_all = torch.cat([src_of_meta[direct], got_meta[:, 0]])
        per_source = torch.bincount(src_all, minlength=N)
        start = torch.cumsum(per_source, 0) - per_source
        self._lap("metadata exchange", t)
        return RBDPlan(
            layout=FlatLayout(s0.send_rows, s0.send_counts, [int(c) for c in per_source.tolist()]),
            s0=s0,
            pilot_recv=pilot_recv,
            direct_pilot=pilot_row[direct],
            direct_out=start[src_of_meta[direct]] + slot[direct],
            direct_weight=weight[direct],
            replica_pilot=pilot_row[rep],
            replica_weight=weight[rep],
            replica_send=replica_send,
            replica_recv=replica_recv,
            replica_out=start[got_meta[:, 0]] + got_meta[:, 1],
            total_out=int(per_source.sum()),
        )

    def send_rows(self, x: torch.Tensor, st: RBDPlan) -> torch.Tensor:
        """S1 pilots across nodes, replicas rebuilt and exchanged inside the node (S2)."""
        world, intra, buf = self.comms.world, self.comms.intra, self.buffers.get
        t = self._clock()
        pilot_rows = torch.index_select(
            x, 0, st.s0.pilot_token, out=buf("pilot_send", st.s0.pilot_token.numel(), x)
        )
        t = self._lap("pilot gather", t)
        pilots = world.alltoallv(
            pilot_rows,
            st.s0.pilot_counts,
            st.pilot_recv,
            "pilot",
            out=buf("pilot_recv", st.n_pilots_in, x),
        )
        t = self._lap("pilot all-to-all (inter-node)", t)
        replica_rows = torch.index_select(
            pilots, 0, st.replica_pilot, out=buf("replica_send", st.replica_pilot.numel(), x)
        )
        t = self._lap("replica reconstruction", t)
        got_rows = intra.alltoallv(
            replica_rows,
            st.replica_send,
            st.replica_recv,
            "replica",
            out=buf("replica_recv", sum(st.replica_recv), x),
        )
        t = self._lap("replica all-to-all (intra-node)", t)
        out = buf("expert_input", st.total_out, x)
        direct = torch.index_select(
            pilots, 0, st.direct_pilot, out=buf("direct", st.direct_pilot.numel(), x)
        )
        out.index_copy_(0, st.direct_out, direct)
        out.index_copy_(0, st.replica_out, got_rows)
        self._lap("expert input reconstruction", t)
        return out

    def return_rows(
        self, y: torch.Tensor, st: RBDPlan, num_tokens: int, weighted: bool
    ) -> torch.Tensor:
        """Reverse of send_rows: y (expert outputs, flat layout) -> [num_tokens, H], each token
        the (combine-weighted when ``weighted``) sum of its experts' outputs."""
        world, intra = self.comms.world, self.comms.intra
        # Reverse S2: replicas' outputs go back to their pilot's rank (same order as sent).
        buf = self.buffers.get
        replica_out = torch.index_select(
            y, 0, st.replica_out, out=buf("combine_replica_send", st.replica_out.numel(), y)
        )
        back = intra.alltoallv(
            replica_out,
            st.replica_recv,
            st.replica_send,
            "combine_replica",
            out=buf("combine_replica_recv", sum(st.replica_send), y),
        )
        direct = y.index_select(0, st.direct_out)
        if weighted:  # weight scaling in stage 1
            direct = direct * st.direct_weight.to(y.dtype).unsqueeze(1)
            back = back * st.replica_weight.to(y.dtype).unsqueeze(1)
        # Merge replicas into their pilots.
        acc = y.new_zeros((st.n_pilots_in, y.shape[1]))
        acc.index_add_(0, st.direct_pilot, direct)
        acc.index_add_(0, st.replica_pilot, back)
        # Reverse S1: one row per (token, node) back to the source, summed into the token.
        returned = world.alltoallv(
            acc,
            st.pilot_recv,
            st.s0.pilot_counts,
            "combine_pilot",
            out=buf("combine_pilot_recv", sum(st.s0.pilot_counts), y),
        )
        out = y.new_zeros((num_tokens, y.shape[1]))
        return out.index_add_(0, st.s0.pilot_token, returned)


def rbd_schedule(
    pfts: list, expert_to_rank, topo: Topology, row_bytes: int, generators: list | None = None
) -> list[tuple[str, int, int, int]]:
    """(phase, src, dst, nbytes) of RBD's dispatch for every source rank's PFT, with the pilots
    :func:`select_pilots` draws (pass generators seeded as the ranks' were).
    Phases: counts, meta (per-pair metadata), pilot (rows), replica (rows), replica_counts and
    replica_meta (the intra-node exchange's counts and metadata). The combine
    sends the reverse: combine_replica = replica reversed, combine_pilot = pilot reversed.
    For an EP sub-group pass its topology (``RBDDispatcher.topo``) and group-local placement:
    ranks in the messages are then group ranks (map them through the group's rank list).
    ``pfts`` may be base.RoutedPairs and ``generators`` TorchCPUGenerator twins (the same
    draws in numpy): the messages are then built without torch."""
    N = topo.world_size
    if len(pfts) != N:
        raise ValueError(f"need one PFT per rank ({N}), got {len(pfts)}")
    generators = generators or [None] * N
    pilots = np.zeros((N, N), dtype=np.int64)  # [source, pilot rank]
    metas = np.zeros((N, N), dtype=np.int64)  # [source, pilot rank]: metadata rows
    replicas = np.zeros(N * N, dtype=np.int64)  # [pilot rank * N + destination rank]
    for s, (pft, g) in enumerate(zip(pfts, generators)):
        # S0 as select_pilots does it, counted: the same draws, the same pilots.
        token_ids, expert_ids = np.asarray(pft.token_ids), np.asarray(pft.expert_ids)
        dest = _placement_vector(expert_to_rank, pft.num_experts, N)[expert_ids]
        priority = (
            g.rand(len(token_ids))
            if isinstance(g, TorchCPUGenerator)
            else torch.rand(len(token_ids), generator=g).numpy()
        )
        pilot_pairs, group_of_pair = _pilot_groups_numpy(
            token_ids * topo.nodes + dest // topo.ranks_per_node, priority
        )
        pilot_rank = dest[pilot_pairs]
        pair_pilot_rank = pilot_rank[group_of_pair]
        pilots[s] = np.bincount(pilot_rank, minlength=N)
        metas[s] = np.bincount(pair_pilot_rank, minlength=N)
        # Replicas: each pair whose destination is not its pilot's rank.
        away = dest != pair_pilot_rank
        replicas += np.bincount(pair_pilot_rank[away] * N + dest[away], minlength=N * N)
    msgs = []
    # python ints (numpy's would leak into the messages)
    pilot_rows, meta_rows = pilots.tolist(), metas.tolist()
    replica_rows = replicas.reshape(N, N).tolist()
    for s in range(N):
        for p in range(N):
            msgs.append(("counts", s, p, 16))
            if topo.node_of(p) == topo.node_of(s):
                msgs.append(("replica_counts", s, p, 8))
            if meta_rows[s][p]:
                msgs.append(("meta", s, p, meta_rows[s][p] * META_BYTES_PER_PAIR))
            if pilot_rows[s][p]:
                msgs.append(("pilot", s, p, pilot_rows[s][p] * row_bytes))
    for p in range(N):
        for d in range(N):
            if replica_rows[p][d]:
                msgs.append(("replica", p, d, replica_rows[p][d] * row_bytes))
                msgs.append(("replica_meta", p, d, replica_rows[p][d] * REPLICA_META_BYTES))
    return msgs


def _placement_vector(expert_to_rank, num_experts: int, world_size: int) -> np.ndarray:
    """flat.expert_rank_map's checks, as a numpy vector (no tensor needed)."""
    placement = np.asarray(expert_to_rank, dtype=np.int64).reshape(-1)
    if placement.size != num_experts:
        raise ValueError(
            f"expert_to_rank has {placement.size} entries, PFT has {num_experts} experts"
        )
    if placement.size and (placement.min() < 0 or placement.max() >= world_size):
        raise ValueError(f"expert_to_rank entries must lie in [0, {world_size})")
    return placement


# --- Redundancy of dispatched rows (X-MoE Fig. 4) ----------------------------------------------


def inter_node_redundancy(
    pft: PFT,
    expert_to_rank,
    topo: Topology,
    source_rank: int,
    generator: torch.Generator | None = None,
) -> tuple[int, int]:
    """(rows flat sends to other nodes, rows RBD sends to other nodes) for one source rank.

    The redundancy rate is 1 - rbd / flat: the share of inter-node copies that only repeat a
    token already going to that node. Counted from :func:`select_pilots` itself.
    """
    s0 = select_pilots(pft, expert_to_rank, topo, generator)
    me = topo.node_of(source_rank)
    flat = int(
        (torch.div(s0.pair_dest_rank, topo.ranks_per_node, rounding_mode="floor") != me).sum()
    )
    rbd = int(
        (torch.div(s0.pilot_dest_rank, topo.ranks_per_node, rounding_mode="floor") != me).sum()
    )
    return flat, rbd


def sampled_redundancy_rate(
    pft: PFT,
    expert_to_rank,
    topo: Topology,
    source_rank: int,
    generator: torch.Generator | None = None,
) -> float:
    """Monte Carlo estimate of the expected redundancy rate: 1 - rbd / flat counted on one
    source rank's sampled routing ``pft`` (X-MoE Fig. 4); 0 when nothing leaves the node."""
    produced("monte-carlo")
    flat, rbd = inter_node_redundancy(pft, expert_to_rank, topo, source_rank, generator)
    return 1 - rbd / flat if flat else 0.0


def expected_redundancy_uniform(num_experts: int, top_k: int, nodes: int) -> float:
    """Expected inter-node redundancy rate for uniform top-k routing (k distinct experts drawn
    uniformly) with the experts spread evenly over ``nodes`` nodes.

    From a source on node a, each of the other nodes holds m = E / nodes experts; a token
    reaches one of them with probability 1 - C(E - m, k) / C(E, k) and sends k (nodes-1)/nodes
    copies there on average, so redundancy = 1 - (nodes-1)(1 - C(E-m,k)/C(E,k)) / (k (nodes-1)/nodes).
    """
    from math import comb

    if nodes < 2:
        raise ValueError("redundancy across nodes needs at least 2 nodes")
    if num_experts % nodes:
        raise ValueError(f"{num_experts} experts do not spread evenly over {nodes} nodes")
    m = num_experts // nodes
    hit = 1 - comb(num_experts - m, top_k) / comb(num_experts, top_k)
    return 1 - (nodes - 1) * hit / (top_k * (nodes - 1) / nodes)


# --- the registry entry -----------------------------------------------------------------------


class RBDAlgorithm(AllToAll):
    """RBD (X-MoE Sec. 4.2): pilots across nodes, local replicas inside them."""

    facts = AllToAllFacts(
        name="rbd",
        label="RBD",
        paper_section="X-MoE Sec. 4.2, Fig. 7",
        description="redundancy-bypassing dispatch: one pilot per (token, remote node) across "
        "nodes, its replicas rebuilt and exchanged inside the node",
        equal_ranks_per_node=True,
        schedule_from_counts=False,
        stages=(
            "pilot selection",
            "metadata exchange",
            "pilot gather",
            "pilot all-to-all (inter-node)",
            "replica reconstruction",
            "replica all-to-all (intra-node)",
            "expert input reconstruction",
        ),
    )
    phase_dependencies = PHASE_DEPENDENCIES
    dispatcher_dependencies = DISPATCHER_DEPENDENCIES

    def dispatcher(self, comms, expert_to_rank, generator=None) -> RBDDispatcher:
        return RBDDispatcher(comms, expert_to_rank, generator)

    def group_dispatcher(
        self, expert_to_rank, group=None, topo=None, generator=None
    ) -> RBDDispatcher:
        return RBDDispatcher.for_group(expert_to_rank, group, topo, generator)

    def check_group(self, group_ranks, topo) -> None:
        group_topology(group_ranks, topo, "RBD", RBD_WHY_EQUAL)

    def routed_schedule(
        self, pfts, expert_to_rank, topo, row_bytes, generators=None, with_counts=True
    ):
        msgs = rbd_schedule(pfts, expert_to_rank, topo, row_bytes, generators)
        return (
            msgs if with_counts else [m for m in msgs if m[0] not in ("counts", "replica_counts")]
        )


register(RBDAlgorithm())
