"""Backend-neutral communicators: what every all-to-all algorithm is written against.

HALO and RBD (components/alltoall) are written once against these two adapters: TorchComm
(torch.distributed: gloo on CPU, NCCL on GPU) and MPIComm (mpi4py). Each call appends what it
actually put on the wire to ``log`` as (phase, src_global_rank, dst_global_rank, nbytes) when a
log list is attached, so byte accounting per link class is measured, not modelled.
Self-messages are logged too (they are local copies; topology.bytes_by_link_class counts them
on no link). :func:`topology.build_communicators` builds one of each kind per rank (Piper Sec.
V-A); they sit in the network layer, below the algorithms, so that the topology needs nothing
from components/alltoall. :class:`NodeP2PComm` is my node's members of a process group over
the group's point-to-point messages (network/groups.py builds it for HALO and RBD on EP groups).

This is the one place that calls the backends' all-to-all: every all-to-all-v of the project
(the dispatchers, flat.all_to_all_v, the balancers' expert copies and migrations) runs on a
communicator from here; :meth:`TorchComm.of_group` gives one for any process group and
:func:`alltoallv_autograd` makes the exchange differentiable (backward: the reverse exchange).
"""

from __future__ import annotations

from functools import cache
from itertools import accumulate
from typing import TYPE_CHECKING, Callable

from moe_repro.runtime.device import group_device
from moe_repro.components.lazy_import import lazy_module

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist
else:
    torch = lazy_module("torch", globals())  # imported on first use
    dist = lazy_module("torch.distributed", globals(), "dist")

# Every call of a communicator that goes to the wire (a blocking all-to-all is its async call and
# a wait): what a profiler of the host work takes out, or a test counts.
COLLECTIVE_CALLS = ("alltoallv_async", "p2p", "allgather_ints", "allgather_ints_async")


def row_bytes_of(x: torch.Tensor) -> int:
    """Bytes per row (dim 0) of ``x``."""
    n = 1
    for s in x.shape[1:]:
        n *= int(s)
    return n * x.element_size()


class Works:
    """The handle of an issued exchange: waits on a list of torch Work handles or mpi4py
    Requests, keeping the buffers alive until then."""

    def __init__(self, works, keep=(), then=None):
        self.works, self.keep, self.then = [w for w in works if w is not None], keep, then

    def wait(self) -> None:
        for w in self.works:
            if hasattr(w, "Wait"):
                w.Wait()
            else:
                w.wait()
        if self.then is not None:  # e.g. copy a staged result back to the host
            self.then()
        self.works, self.keep, self.then = [], (), None

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` (on the backend's thread) once every torch Work is done; raises
        AttributeError for handles without a future (mpi4py Requests, old torch backends)."""
        futures = [w.get_future() for w in self.works]
        torch.futures.collect_all(futures).add_done_callback(lambda _: callback())


class Comm:
    """Common part: group ranks <-> global ranks, and the message log."""

    def __init__(self, ranks: list[int], my_global_rank: int):
        self.ranks = list(ranks)  # global rank of each group rank
        self.size = len(self.ranks)
        self.global_rank = my_global_rank
        self.rank = self.ranks.index(my_global_rank)
        self.log: list | None = None

    def _record(self, phase: str, counts_bytes) -> None:
        if self.log is not None:
            for peer, nbytes in enumerate(counts_bytes):
                if nbytes:
                    self.log.append((phase, self.global_rank, self.ranks[peer], int(nbytes)))

    def _prepare(self, x, send_counts, recv_counts, phase, out):
        """Validate, make contiguous, allocate the output, log the sends; -> (x, out, sc, rc, row bytes)."""
        send_counts, recv_counts = [int(c) for c in send_counts], [int(c) for c in recv_counts]
        if len(send_counts) != self.size or len(recv_counts) != self.size:
            raise ValueError(
                f"need {self.size} send and recv counts, got {len(send_counts)}, {len(recv_counts)}"
            )
        if sum(send_counts) != x.shape[0]:
            raise ValueError(f"send_counts sum to {sum(send_counts)} but x has {x.shape[0]} rows")
        x = x.contiguous()
        if out is None:
            out = x.new_empty((sum(recv_counts), *x.shape[1:]))
        rb = row_bytes_of(x)
        self._record(phase, [c * rb for c in send_counts])
        return x, out, send_counts, recv_counts, rb

    def alltoallv_async(self, x, send_counts, recv_counts, phase="a2a", out=None):
        """Uneven all-to-all: ``x``'s rows split by ``send_counts`` (one chunk per group rank),
        the received rows in group-rank order; returns (out, :class:`Works`). ``out`` may be a
        preallocated buffer."""
        raise NotImplementedError

    def p2p(self, sends, recvs, phase="p2p") -> Works:
        """Batched isend/irecv: ``sends``/``recvs`` are (peer group rank, tensor) lists."""
        raise NotImplementedError

    def allgather_ints(self, values: list[int]) -> list[list[int]]:
        """Every group rank's ``values``, in group-rank order."""
        raise NotImplementedError

    def allgather_ints_async(self, values: list[int]) -> Callable[[], list[list[int]]]:
        """:meth:`allgather_ints` issued now, its result read later: returns a call that waits
        and gives it (the MoE layer's pipelined path gathers its rows meanwhile). Default:
        blocking now; TorchComm issues it asynchronously."""
        result = self.allgather_ints(values)
        return lambda: result

    def alltoallv(self, x, send_counts, recv_counts, phase="a2a", out=None):
        """Blocking uneven all-to-all (see alltoallv_async)."""
        out, handle = self.alltoallv_async(x, send_counts, recv_counts, phase, out)
        handle.wait()
        return out

    device = "cpu"  # where this communicator's tensors live (NCCL: the GPU)

    def exchange_counts(self, send_counts: list[int], phase: str = "counts") -> list[int]:
        """How many rows each peer will send me: one int64 to and from every peer."""
        send = torch.tensor([int(c) for c in send_counts], dtype=torch.int64, device=self.device)
        recv = self.alltoallv(send, [1] * self.size, [1] * self.size, phase)
        return [int(c) for c in recv.tolist()]


class TorchComm(Comm):
    """torch.distributed process group (None = world) with its global ranks."""

    def __init__(self, group, ranks: list[int]):
        super().__init__(ranks, dist.get_rank())
        self.group = group
        self.device = group_device(group)  # the runtime's rule: NCCL moves CUDA tensors only

    @classmethod
    def of_group(cls, group=None) -> "TorchComm":
        """The communicator of process group ``group`` (None = world). Not collective."""
        group = dist.group.WORLD if group is None else group
        return cls(group, dist.get_process_group_ranks(group))

    def alltoallv_async(self, x, send_counts, recv_counts, phase="a2a", out=None):
        """Uneven all-to-all; returns (out, handle). ``out`` may be a preallocated buffer."""
        x, out, send_counts, recv_counts, _ = self._prepare(x, send_counts, recv_counts, phase, out)
        if x.device != torch.device(self.device):
            # Host-side metadata (counts, plans) on an NCCL group: staged through the GPU, since
            # NCCL moves CUDA tensors only; the rows themselves already live on the GPU.
            x_dev, out_dev = x.to(self.device), out.to(self.device)
            work = dist.all_to_all_single(
                out_dev,
                x_dev,
                output_split_sizes=recv_counts,
                input_split_sizes=send_counts,
                group=self.group,
                async_op=True,
            )
            return out, Works([work], keep=(x_dev, out_dev), then=lambda: out.copy_(out_dev))
        work = dist.all_to_all_single(
            out,
            x,
            output_split_sizes=recv_counts,
            input_split_sizes=send_counts,
            group=self.group,
            async_op=True,
        )
        return out, Works([work], keep=(x,))

    def p2p(self, sends, recvs, phase="p2p"):
        """Batched isend/irecv: ``sends``/``recvs`` are (peer group rank, tensor) lists."""
        ops = []
        for peer, t in recvs:
            if t.numel():
                ops.append(dist.P2POp(dist.irecv, t, self.ranks[peer], self.group))
        for peer, t in sends:
            if t.numel():
                if self.log is not None:
                    self.log.append(
                        (phase, self.global_rank, self.ranks[peer], t.numel() * t.element_size())
                    )
                ops.append(dist.P2POp(dist.isend, t, self.ranks[peer], self.group))
        works = dist.batch_isend_irecv(ops) if ops else []
        return Works(works, keep=tuple(t for _, t in sends))

    def allgather_ints(self, values: list[int]) -> list[list[int]]:
        t = torch.tensor([int(v) for v in values], dtype=torch.int64, device=self.device)
        out = [torch.empty_like(t) for _ in range(self.size)]
        dist.all_gather(out, t, group=self.group)
        return [o.tolist() for o in out]

    def allgather_ints_async(self, values: list[int]) -> Callable[[], list[list[int]]]:
        t = torch.tensor([int(v) for v in values], dtype=torch.int64, device=self.device)
        out = [torch.empty_like(t) for _ in range(self.size)]
        handle = Works([dist.all_gather(out, t, group=self.group, async_op=True)], keep=(t,))

        def result() -> list[list[int]]:
            handle.wait()
            return [o.tolist() for o in out]

        return result


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
        handle: Works = self.group_comm.p2p(sends, recvs, phase)
        return out, handle


def alltoallv_autograd(
    comm: Comm, x: torch.Tensor, send_counts, recv_counts, phase: str = "a2a"
) -> torch.Tensor:
    """``comm.alltoallv`` as a differentiable call: its backward is the reverse exchange on the
    same communicator (what I received from s goes back to s), logged under the same phase."""
    return _alltoallv_function().apply(x, comm, list(send_counts), list(recv_counts), phase)


@cache
def _alltoallv_function():
    """The autograd Function, defined on first use (torch itself is imported on first use)."""

    class AllToAllV(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, comm, send_counts, recv_counts, phase):
            ctx.comm, ctx.counts, ctx.phase = comm, (send_counts, recv_counts), phase
            return comm.alltoallv(x.detach(), send_counts, recv_counts, phase)

        @staticmethod
        def backward(ctx, grad):
            send_counts, recv_counts = ctx.counts
            back = ctx.comm.alltoallv(grad.contiguous(), recv_counts, send_counts, ctx.phase)
            return back, None, None, None, None

    return AllToAllV


def _as_bytes(t: torch.Tensor):
    """A uint8 numpy view of a contiguous tensor (any dtype, zero rows included)."""
    return t.contiguous().reshape(-1).view(torch.uint8).numpy()


class MPIComm(Comm):
    """mpi4py communicator with the global rank of each of its ranks."""

    def __init__(self, comm, ranks: list[int]):
        super().__init__(ranks, ranks[comm.Get_rank()])
        self.comm = comm

    def alltoallv_async(self, x, send_counts, recv_counts, phase="a2a", out=None):
        from mpi4py import MPI

        x, out, send_counts, recv_counts, rb = self._prepare(
            x, send_counts, recv_counts, phase, out
        )
        sb = [c * rb for c in send_counts]
        rbytes = [c * rb for c in recv_counts]
        sdis = [sum(sb[:i]) for i in range(self.size)]
        rdis = [sum(rbytes[:i]) for i in range(self.size)]
        send_np, recv_np = _as_bytes(x), out.reshape(-1).view(torch.uint8).numpy()
        req = self.comm.Ialltoallv(
            [send_np, (sb, sdis), MPI.BYTE], [recv_np, (rbytes, rdis), MPI.BYTE]
        )
        return out, Works([req], keep=(x, send_np, recv_np))

    def p2p(self, sends, recvs, phase="p2p"):
        reqs, keep = [], []
        for peer, t in recvs:
            if t.numel():
                buf = (
                    t.reshape(-1).view(torch.uint8).numpy()
                )  # t must be contiguous: filled in place
                reqs.append(self.comm.Irecv(buf, source=peer, tag=11))
                keep.append(buf)
        for peer, t in sends:
            if t.numel():
                buf = _as_bytes(t)
                if self.log is not None:
                    self.log.append((phase, self.global_rank, self.ranks[peer], buf.nbytes))
                reqs.append(self.comm.Isend(buf, dest=peer, tag=11))
                keep.append(buf)
        return Works(reqs, keep=tuple(keep))

    def allgather_ints(self, values: list[int]) -> list[list[int]]:
        return [list(v) for v in self.comm.allgather([int(v) for v in values])]
