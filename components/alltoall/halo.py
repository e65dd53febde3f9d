"""HALO all-to-all (Piper Sec. V, Alg. 1), generalised to uneven rows per destination.

Three phases on a world of ``nodes x R`` ranks (rank = node * R + local_rank):

  Phase I   intra-node all-to-all of the rows for my own node's ranks        (intra links)
  Phase II  batched isend/irecv with the same-local-rank rank of every other node: all my rows
            for node n go to rank n*R + local_rank (Alg. 1 lines 12-16)      (inter-node links)
  Phase III intra-node all-to-all that hands each local rank the remote rows meant for it
                                                                             (intra links)

Dependencies (Eq. 13): Phase I || (Phase II -> Phase III); Phase I is issued first on its own
communicator and waited on last. On one node Phase I is the whole exchange. Buffers persist in
:class:`HaloAllToAll` (Alg. 1 lines 2-5): the returned tensor is overwritten by the next call.
Rank s sends ``C[s][d] >= 0`` rows to rank d (Alg. 1 sends exactly one); every node must have
the same number of ranks. The counts a rank's plan needs are exchanged per call, 8 * (N +
(nodes - 1) * (R - 1)) bytes per rank instead of an N x N all-gather (:class:`KnownCounts`).

Registered as ``halo`` (:class:`HaloAlgorithm`): its :class:`HaloDispatcher` runs the MoE
dispatch and combine (differentiable) on topology.Communicators or on any EP process group,
whose topology and node communicator come from network/groups.py (Phases I and III are then
batched isend/irecv among my node's members of the group, no process group of their own).

Why: HALO puts the same bytes on inter-node links as flat but through R parallel NIC-affine
peers (one message per remote node instead of R), paying extra intra-node bytes in Phase III.
The generalisation, the byte counts and the counts exchange: see docs/halo-rbd.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING

from moe_repro.components.alltoall.base import AllToAll, AllToAllFacts, ReusedBuffers, register
from moe_repro.components.alltoall.flat import FlatDispatcher, flat_send_layout
from moe_repro.components.lazy_import import lazy_module
from moe_repro.components.network.groups import group_communicators, group_topology
from moe_repro.components.network.topology import Topology

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())  # first use; the simulator needs only the schedule

PHASE_DEPENDENCIES = {"counts": [], "I": ["counts"], "II": ["counts"], "III": ["II"]}  # Eq. 13


def counts_sent(topo: Topology, src: int, dst: int) -> list[int]:
    """Destinations d' whose count C[src][d'] rank ``src`` sends rank ``dst`` in the counts
    exchange: all of dst's node when dst is src's Phase-II peer, else dst alone."""
    if topo.node_of(src) != topo.node_of(dst) and topo.local_rank(src) == topo.local_rank(dst):
        return topo.node_ranks(topo.node_of(dst))
    return [dst]


class _KnownRow:
    def __init__(self, n: int, entries: dict[int, int]):
        self.n, self.entries = n, entries

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, d: int) -> int:
        return self.entries[d]  # KeyError: an entry this rank was not sent


class KnownCounts:
    """The entries of the N x N counts matrix one rank learnt from the counts exchange: its own
    row in full, its column, and its Phase-II peers' counts to its node. Indexes as C[s][d]."""

    def __init__(self, n: int, rank: int, my_row: list[int], received: dict[int, dict[int, int]]):
        self.n, self.rank = n, rank
        self.rows = [my_row if s == rank else _KnownRow(n, received[s]) for s in range(n)]
        self.key = (
            rank,
            tuple(my_row),
            tuple(sorted((s, tuple(sorted(e.items()))) for s, e in received.items())),
        )

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, s: int):
        return self.rows[s]

    def __iter__(self):
        return iter(self.rows)


@dataclass
class HaloPlan:
    """All sizes and indices one rank needs for one counts matrix (pure function of C, topo)."""

    rank: int
    local_start: int  # first row of x for my node's ranks (Alg. 1 line 1, in rows)
    local_stop: int
    remote_nodes: list[int]  # N_ in Alg. 1: other nodes, ascending
    p1_send: list[int]  # rows to each local rank (Phase I)
    p1_recv: list[int]
    p2_send: list[int]  # rows to the peer on each remote node (Phase II)
    p2_recv: list[int]
    p3_send: list[int]  # rows to each local rank (Phase III)
    p3_recv: list[int]
    out_local: tuple[int, int]  # output rows filled by Phase I (line 20)
    total_recv: int
    # Row indices; None in a plan built for its sizes only (indices=False: the simulator's).
    pack_index: torch.Tensor | None = (
        None  # rows of x for Phase II, remote nodes in order (line 10)
    )
    p3_index: torch.Tensor | None = None  # rows of F2r in Phase III send order (line 18)
    out_remote_index: torch.Tensor | None = None  # output row of each F3r row (lines 21-23)


def halo_plan(C: list[list[int]], topo: Topology, rank: int, indices: bool = True) -> HaloPlan:
    """Sizes (and with ``indices``, the row index tensors) of ``rank``'s three phases."""
    N, R = topo.world_size, topo.ranks_per_node
    if len(C) != N or any(len(row) != N for row in C):
        raise ValueError(f"counts matrix must be {N}x{N}")
    node, l = topo.node_of(rank), topo.local_rank(rank)
    mine = [int(c) for c in C[rank]]
    starts = [0, *accumulate(mine)]  # prefix sums (O(N); the simulator calls this at N = 8192)
    local = topo.node_ranks(node)
    remote_nodes = [n for n in range(topo.nodes) if n != node]
    p1_send = [mine[d] for d in local]
    p1_recv = [int(C[s][rank]) for s in local]
    p2_send = [sum(mine[d] for d in topo.node_ranks(n)) for n in remote_nodes]
    peers = [n * R + l for n in remote_nodes]
    p2_recv = [sum(int(C[p][d]) for d in local) for p in peers]

    pack = (
        [i for n in remote_nodes for i in range(starts[n * R], starts[(n + 1) * R])]
        if indices
        else []
    )

    # F2r holds, per remote node i (peer p_i), blocks for local ranks l' = 0..R-1 in order.
    f2_offset = {}
    pos = 0
    for p in peers:
        for lp, d in enumerate(local):
            f2_offset[(p, lp)] = (pos, int(C[p][d]))
            pos += int(C[p][d])
    # Phase III sends, to each local l', the blocks of every remote node in node order.
    p3_index: list[int] = []
    p3_send = []
    for lp in range(R):
        n_rows = 0
        for p in peers:
            start, cnt = f2_offset[(p, lp)]
            if indices:
                p3_index.extend(range(start, start + cnt))
            n_rows += cnt
        p3_send.append(n_rows)
    # I receive from local l'' the rows of sources (n, l'') for remote n, in node order.
    recv_from = [int(C[s][rank]) for s in range(N)]
    out_start = [0, *accumulate(recv_from)]
    p3_recv = []
    out_remote: list[int] = []
    for lpp in range(R):
        cnt = 0
        for n in remote_nodes:
            s = n * R + lpp
            if indices:
                out_remote.extend(range(out_start[s], out_start[s + 1]))
            cnt += recv_from[s]
        p3_recv.append(cnt)
    plan = HaloPlan(
        rank=rank,
        local_start=starts[local[0]],
        local_stop=starts[local[-1] + 1],
        remote_nodes=remote_nodes,
        p1_send=p1_send,
        p1_recv=p1_recv,
        p2_send=p2_send,
        p2_recv=p2_recv,
        p3_send=p3_send,
        p3_recv=p3_recv,
        out_local=(out_start[local[0]], out_start[local[-1] + 1]),
        total_recv=out_start[N],
    )
    if indices:
        plan.pack_index = torch.tensor(pack, dtype=torch.int64)
        plan.p3_index = torch.tensor(p3_index, dtype=torch.int64)
        plan.out_remote_index = torch.tensor(out_remote, dtype=torch.int64)
    return plan


def halo_schedule(
    C: list[list[int]], topo: Topology, row_bytes: int, with_counts: bool = True, ranks=None
) -> list[tuple[str, int, int, int]]:
    """(phase, src, dst, nbytes) of every message HALO sends for counts matrix C; built from
    the same :func:`halo_plan` the collective executes. Self-messages are local copies. The
    counts exchange (:func:`counts_sent`: int64s to every rank, itself included) is left out
    when C was given. ``ranks``
    limits the source ranks (the topology simulator builds representative ranks only)."""
    N, R = topo.world_size, topo.ranks_per_node
    sources = range(N) if ranks is None else ranks
    msgs = (
        [("counts", s, d, 8 * len(counts_sent(topo, s, d))) for s in sources for d in range(N)]
        if with_counts
        else []
    )
    for r in sources:
        plan = halo_plan(C, topo, r, indices=False)  # sizes only: no row index tensors
        local = topo.node_ranks(topo.node_of(r))
        for d, c in zip(local, plan.p1_send):
            if c:
                msgs.append(("I", r, d, c * row_bytes))
        for n, c in zip(plan.remote_nodes, plan.p2_send):
            if c:
                msgs.append(("II", r, n * R + topo.local_rank(r), c * row_bytes))
        for d, c in zip(local, plan.p3_send):
            if c:
                msgs.append(("III", r, d, c * row_bytes))
    return msgs


class HaloAllToAll:
    """HALO all-to-all-v for one rank; keep one instance per layer (it owns the buffers)."""

    def __init__(self, comms):
        self.comms = comms  # topology.Communicators
        self.topo: Topology = comms.topo
        self._buffers = ReusedBuffers()  # persistent phase buffers (Piper Alg. 1 lines 2-4)
        self._plans: dict[tuple, HaloPlan] = {}

    def _buf(self, name: str, rows: int, like: torch.Tensor) -> torch.Tensor:
        return self._buffers.get(name, rows, like)

    def plan(self, C, device: torch.device | None = None) -> HaloPlan:
        rows = (
            C.key if isinstance(C, KnownCounts) else tuple(tuple(int(c) for c in row) for row in C)
        )
        key = (rows, device)
        if key not in self._plans:
            if len(self._plans) > 64:
                self._plans.clear()
            # Ranks of the topology are ranks of the world communicator (a sub-group's own ranks).
            p = halo_plan(C, self.topo, self.comms.world.rank)
            if device is not None:  # index tensors where the rows are (index_select on a GPU)
                for name in ("pack_index", "p3_index", "out_remote_index"):
                    setattr(p, name, getattr(p, name).to(device))
            self._plans[key] = p
        return self._plans[key]

    def known_counts(self, send_counts: list[int]) -> KnownCounts:
        """The counts this rank's plan needs, by one all-to-all of counts (module docstring)."""
        world, topo = self.comms.world, self.topo
        me, N = world.rank, world.size
        send, send_sizes, recv_sizes = [], [], []
        for d in range(N):
            dests = counts_sent(topo, me, d)
            send += [int(send_counts[dd]) for dd in dests]
            send_sizes.append(len(dests))
            recv_sizes.append(len(counts_sent(topo, d, me)))
        got = world.alltoallv(
            torch.tensor(send, dtype=torch.int64), send_sizes, recv_sizes, "counts"
        ).tolist()
        received, pos = {}, 0
        for s in range(N):
            dests = counts_sent(topo, s, me)
            received[s] = dict(zip(dests, got[pos : pos + len(dests)]))
            pos += len(dests)
        return KnownCounts(N, me, [int(c) for c in send_counts], received)

    def __call__(
        self,
        x: torch.Tensor,
        send_counts: list[int],
        counts_matrix: list[list[int]] | None = None,
        out_buffer: str = "O",
    ) -> torch.Tensor:
        """The received rows, in the flat all-to-all-v's order, in the persistent buffer named
        ``out_buffer`` (overwritten by the next call that names it)."""
        send_counts = [int(c) for c in send_counts]
        N = self.topo.world_size
        if (
            len(send_counts) != N
            or sum(send_counts) != x.shape[0]
            or min(send_counts, default=0) < 0
        ):
            raise ValueError(f"send_counts must be {N} non-negative ints summing to {x.shape[0]}")
        C = counts_matrix if counts_matrix is not None else self.known_counts(send_counts)
        if [int(c) for c in C[self.comms.world.rank]] != send_counts:
            raise ValueError("counts_matrix row of this rank differs from send_counts")
        x = x.contiguous()
        p = self.plan(C, x.device)
        R = self.topo.ranks_per_node
        my_local = self.topo.local_rank(self.comms.world.rank)

        if not p.remote_nodes:
            # One node: no remote node, so Phase I is the whole exchange (Alg. 1's loops over
            # N_ are empty). Phases II and III would be empty collectives, each a
            # synchronisation of its own, and there is nothing for Phase I to overlap with: it
            # runs blocking, straight into the output.
            O = self._buf(out_buffer, p.total_recv, x)
            self.comms.intra.alltoallv(x, p.p1_send, p.p1_recv, "I", out=O)
            return O

        pack_index, p3_index, out_remote_index = p.pack_index, p.p3_index, p.out_remote_index
        if pack_index is None or p3_index is None or out_remote_index is None:
            raise RuntimeError("a HALO plan built for its sizes only (indices=False) cannot run")

        # Phase I: issued async on its own communicator; overlaps Phases II and III (Eq. 13).
        P1 = self._buf("P1", sum(p.p1_recv), x)
        L = x[p.local_start : p.local_stop]  # line 7: contiguous, no copy
        _, phase1 = self.comms.intra_overlap.alltoallv_async(L, p.p1_send, p.p1_recv, "I", out=P1)

        # Phase II: one index_select packs every remote-destined row (line 11), then one
        # batched isend/irecv per remote node with its same-local-rank peer (lines 12-16).
        F2s = self._buf("F2s", pack_index.numel(), x)
        torch.index_select(x, 0, pack_index, out=F2s)
        F2r = self._buf("F2r", sum(p.p2_recv), x)
        sends, recvs, so, ro = [], [], 0, 0
        for n, cs, cr in zip(p.remote_nodes, p.p2_send, p.p2_recv):
            peer = n * R + my_local
            sends.append((peer, F2s[so : so + cs]))
            recvs.append((peer, F2r[ro : ro + cr]))
            so, ro = so + cs, ro + cr
        self.comms.world.p2p(sends, recvs, "II").wait()

        # Phase III: regroup F2r by local destination (line 18) and redistribute (line 19).
        F3s = self._buf("F3s", p3_index.numel(), x)
        torch.index_select(F2r, 0, p3_index, out=F3s)
        F3r = self._buf("F3r", sum(p.p3_recv), x)
        self.comms.intra.alltoallv(F3s, p.p3_send, p.p3_recv, "III", out=F3r)

        # Output (lines 20-23): Phase I rows are one contiguous block, Phase III rows scatter.
        O = self._buf(out_buffer, p.total_recv, x)
        O.index_copy_(0, out_remote_index, F3r)
        phase1.wait()
        O[p.out_local[0] : p.out_local[1]] = P1
        return O


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
        return HaloDispatcher(HaloAllToAll(group_communicators(group, topo)), expert_to_rank)

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
