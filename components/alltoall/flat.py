"""Flat all-to-all-v: every rank exchanges rows directly with every other rank.

A differentiable all-to-all-v for callers that move rows other than an MoE dispatch (Ulysses
attention, expert weights); the MoE dispatch itself is :class:`FlatDispatcher`:

    all_to_all_v(x, send_counts, recv_counts=None, group=None) -> Tensor

Rows of ``x`` (dim 0) are split by ``send_counts`` (one chunk per rank of ``group``, in rank
order); the result is the received rows concatenated in rank order. When ``recv_counts`` is
None it is learnt with a small exchange of the counts. The call is differentiable: its
backward is the reverse all-to-all-v (gradients travel back along the same rows). Like every
all-to-all-v here it runs through the group's communicator (network/comm.py), the one place
that calls the backend's collective.

Byte count (nccl-tests conventions for alltoall): rank r sends
``sum_{d != r} send_counts[d] * row_bytes``; the chunk to itself is a local copy and is not
counted on any link. algbw = total bytes a rank sends (incl. its own chunk) / time, busbw =
algbw * (n - 1) / n.

Registered as ``flat`` (:class:`FlatAlgorithm`); :func:`flat_send_layout` is the send order every
algorithm's MoE dispatch delivers its rows in, and :class:`FlatDispatcher` the dispatch/combine
over real ranks built on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from moe_repro.components.alltoall.base import (
    AllToAll,
    AllToAllFacts,
    Dispatcher,
    FlatLayout,
    ReusedBuffers,
    register,
)
from moe_repro.components.lazy_import import lazy_module

# The backend-neutral communicators live in the network layer (topology builds them); the names
# stay importable from here, where HALO, RBD and the tests have always found them.
from moe_repro.components.network.comm import Comm, TorchComm, alltoallv_autograd

# Imported on first use: the simulator reads this module's schedules without tensors.
if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())


def all_to_all_v(
    x: torch.Tensor, send_counts: list[int], recv_counts: list[int] | None = None, group=None
) -> torch.Tensor:
    """Differentiable all-to-all-v over ``group`` (torch.distributed; None = world), through
    its :class:`TorchComm` (comm.alltoallv_autograd); see the module docstring."""
    comm = TorchComm.of_group(group)
    send_counts = [int(c) for c in send_counts]
    if len(send_counts) != comm.size:
        raise ValueError(f"send_counts has {len(send_counts)} entries, group has {comm.size} ranks")
    if any(c < 0 for c in send_counts):
        raise ValueError(f"send_counts must be >= 0, got {send_counts}")
    if sum(send_counts) != x.shape[0]:
        raise ValueError(f"send_counts sum to {sum(send_counts)} but x has {x.shape[0]} rows")
    if recv_counts is None:
        recv_counts = comm.exchange_counts(send_counts)
    else:
        recv_counts = [int(c) for c in recv_counts]
        if len(recv_counts) != comm.size:
            raise ValueError(
                f"recv_counts has {len(recv_counts)} entries, group has {comm.size} ranks"
            )
    return alltoallv_autograd(comm, x, send_counts, recv_counts)


def flat_all_to_all_v(
    comm: Comm,
    x: torch.Tensor,
    send_counts: list[int],
    recv_counts: list[int] | None = None,
    phase: str = "a2a",
) -> torch.Tensor:
    """Flat all-to-all-v over a TorchComm or MPIComm (not differentiable; see all_to_all_v)."""
    send_counts = [int(c) for c in send_counts]
    if recv_counts is None:
        recv_counts = comm.exchange_counts(send_counts)
    return comm.alltoallv(x, send_counts, recv_counts, phase)


# --- The schedule as data (replayed by the flow-level simulator) ------------------------------

PHASE_DEPENDENCIES = {"counts": [], "a2a": ["counts"]}


def flat_schedule(
    count_matrix, row_bytes: int, with_counts: bool = True, ranks=None
) -> list[tuple[str, int, int, int]]:
    """Messages of one flat all-to-all-v: ``count_matrix[s][d]`` rows from rank s to rank d.

    Returns (phase, src, dst, nbytes) for every non-empty pair, self-copies included (they
    travel on no link), after the counts exchange (one int64 to every rank) unless
    ``with_counts`` is False (recv_counts given). Per-rank bytes on the wire =
    sum_{d != s} count_matrix[s][d] * row_bytes. ``ranks`` limits the source ranks (the
    topology simulator builds only representative ranks of a symmetric world).
    """
    n = len(count_matrix)
    sources = range(n) if ranks is None else ranks
    msgs = [("counts", s, d, 8) for s in sources for d in range(n)] if with_counts else []
    for s in sources:
        for d, c in enumerate(count_matrix[s]):
            if int(c):
                msgs.append(("a2a", s, d, int(c) * int(row_bytes)))
    return msgs


# --- MoE dispatch in the flat layout, and the registry entry ----------------------------------


def expert_rank_map(expert_to_rank, num_experts: int, world_size: int) -> torch.Tensor:
    """``expert_to_rank`` (one rank per expert, any shape) as a checked int64 vector."""
    placement = torch.as_tensor(expert_to_rank, dtype=torch.int64).reshape(-1)
    if placement.numel() != num_experts:
        raise ValueError(
            f"expert_to_rank has {placement.numel()} entries, PFT has {num_experts} experts"
        )
    if placement.numel() and (int(placement.min()) < 0 or int(placement.max()) >= world_size):
        raise ValueError(f"expert_to_rank entries must lie in [0, {world_size})")
    return placement


def flat_send_layout(pft, expert_to_rank, world_size: int) -> tuple[torch.Tensor, list[int]]:
    """The flat dispatch's send buffer: (rows of the PFT in send order, rows per rank).

    Send row j is PFT row order[j]; rows are grouped by destination rank (stable, so inside a
    rank they keep PFT order). This is the layout every algorithm's dispatch delivers.
    """
    dest = expert_rank_map(expert_to_rank, pft.num_experts, world_size)[pft.expert_ids]
    order = torch.argsort(dest, stable=True)
    counts = torch.bincount(dest, minlength=world_size).tolist()
    return order, [int(c) for c in counts]


@dataclass
class FlatPlan:
    layout: FlatLayout
    token_order: torch.Tensor  # token of each send row
    weights: torch.Tensor  # PFT combine weight of each send row (detached)
    known_counts: object = None  # what else the counts exchange learnt (HALO's KnownCounts)


class FlatDispatcher(Dispatcher):
    """Plan: the send layout (computed once per PFT) and the counts exchange. Way out: gather
    the PFT's rows in flat send order, one all-to-all-v. Way back: the reverse all-to-all-v, then
    each row (scaled by its combine weight) added into its token. Subclasses change only the two
    exchanges (:class:`halo.HaloDispatcher`). The send, receive and returned rows live in
    reused buffers (:class:`ReusedBuffers`)."""

    def __init__(self, comm: Comm, expert_to_rank):
        self._comm, self.expert_to_rank = comm, expert_to_rank
        self.buffers = ReusedBuffers()
        self._pft = None  # the PFT the layout below was computed for
        self._layout = None

    def comm(self) -> Comm:
        return self._comm

    def _layout_of(self, pft):
        # The layout is a pure function of the PFT and the placement: computed once per PFT,
        # outside the exchange (the alltoall suite times dispatch of one PFT again and again).
        if pft is not self._pft:
            order, send_counts = flat_send_layout(pft, self.expert_to_rank, self._comm.size)
            self._layout = (
                order,
                send_counts,
                pft.token_ids[order],
                pft.combine_weights.detach()[order],
            )
            self._pft = pft
        return self._layout

    def receive_counts(self, send_counts: list[int]):
        """(rows received from each rank, what the exchange needs besides): the counts exchange."""
        return self._comm.exchange_counts(send_counts), None

    def plan(self, pft) -> FlatPlan:
        order, send_counts, token_order, weights = self._layout_of(pft)
        t = self._clock()
        recv_counts, known = self.receive_counts(send_counts)
        self._lap("counts exchange", t)
        return FlatPlan(FlatLayout(order, send_counts, recv_counts), token_order, weights, known)

    def exchange(self, rows: torch.Tensor, state: FlatPlan) -> torch.Tensor:
        """The received rows of one all-to-all-v (counts known on both sides)."""
        recv_counts = state.layout.recv_counts
        return self._comm.alltoallv(
            rows,
            state.layout.send_counts,
            recv_counts,
            "a2a",
            out=self.buffers.get("received", sum(recv_counts), rows),
        )

    def reverse(
        self, rows: torch.Tensor, send_counts: list[int], recv_counts: list[int]
    ) -> torch.Tensor:
        """The exchange back (counts known on both sides)."""
        return self._comm.alltoallv(
            rows,
            send_counts,
            recv_counts,
            "a2a",
            out=self.buffers.get("returned", sum(recv_counts), rows),
        )

    def send_rows(self, x: torch.Tensor, state: FlatPlan) -> torch.Tensor:
        t = self._clock()
        rows = torch.index_select(
            x, 0, state.token_order, out=self.buffers.get("send", state.token_order.numel(), x)
        )
        t = self._lap("buffer gather", t)
        out = self.exchange(rows, state)
        self._lap("all-to-all", t)
        return out

    def return_rows(
        self, y: torch.Tensor, state: FlatPlan, num_tokens: int, weighted: bool
    ) -> torch.Tensor:
        back = self.reverse(y, state.layout.recv_counts, state.layout.send_counts)
        if weighted:
            back = back * state.weights.to(y.dtype).unsqueeze(1)
        out = y.new_zeros((num_tokens, y.shape[1]))
        return out.index_add_(0, state.token_order, back)


class FlatAlgorithm(AllToAll):
    """Flat all-to-all-v (the baseline every other algorithm is checked against)."""

    facts = AllToAllFacts(
        name="flat",
        label="flat",
        paper_section="Piper Sec. V-D (the torch.dist.all_to_all baseline)",
        description="every rank exchanges rows directly with every other rank (all-to-all-v)",
        equal_ranks_per_node=False,
        schedule_from_counts=True,
        stages=("counts exchange", "buffer gather", "all-to-all"),
    )
    phase_dependencies = PHASE_DEPENDENCIES

    def dispatcher(self, comms, expert_to_rank, generator=None) -> FlatDispatcher:
        return FlatDispatcher(comms.world, expert_to_rank)

    def group_dispatcher(
        self, expert_to_rank, group=None, topo=None, generator=None
    ) -> FlatDispatcher:
        return FlatDispatcher(TorchComm.of_group(group), expert_to_rank)

    def counts_schedule(self, counts_matrix, topo, row_bytes, with_counts=True, ranks=None):
        return flat_schedule(counts_matrix, row_bytes, with_counts, ranks=ranks)

    def routed_schedule(
        self, pfts, expert_to_rank, topo, row_bytes, generators=None, with_counts=True
    ):
        n = topo.world_size
        if len(pfts) != n:
            raise ValueError(f"need one PFT per rank ({n}), got {len(pfts)}")
        counts = [flat_send_layout(pft, expert_to_rank, n)[1] for pft in pfts]
        return flat_schedule(counts, row_bytes, with_counts)


register(FlatAlgorithm())
