"""Dispatch and combine in chunks, pipelined with the expert GEMMs (Tutel's pipelined all-to-all).

The unpipelined layer waits for the whole dispatch before its first GEMM and computes every
expert before the first row goes back. Here each rank's local experts are split into ``chunks``
contiguous groups (local expert i of n is in chunk i * chunks // n); chunk c's rows are one
uneven all-to-all. Every chunk's rows (and their combine weights) are issued at once,
asynchronously; then, chunk by chunk, the rank waits for chunk c, runs its experts (the grouped
GEMM with zero rows for the other chunks' experts) and issues chunk c's way back, so chunk c's
return and chunk c+1's arrival overlap the GEMMs of the chunk in hand. This is Tutel's
pipelined all-to-all / Comet's fine-grained overlap along the expert dimension, and what
Megatron-core's EP A2A overlap does across micro-batches, here within one.

The counts exchange (one all-gather of every rank's tokens per expert, X-MoE App. B.3) is issued
before anything else and read only when the receive sizes are needed: the send order, the send
sizes and the gather of the outgoing rows need none of it, and run while it is in flight.

Exactness: the same rows meet the same expert weights; only the order of the per-token sums
differs (sums in fp32 for bf16/fp16, as pft.scatter_combine). Every rank issues the same
collectives in the same order, empty chunks included; no other metadata exchange is needed.

Autograd: each exchange is a Function whose forward issues the all-to-all and returns the
buffer being filled (waited on before its first read) and whose backward is the reverse
exchange (blocking); the backward is exact, and not pipelined.

The exchanges run on the dispatcher's communicator (flat all-to-all-v), whatever algorithm
the layer holds; ``auto`` pipelines only where that algorithm is the flat one.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

from moe_repro.components.lazy_import import lazy_module
from moe_repro.components.moe.pft import inverse_permutation

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())

AUTO_CHUNKS = 2  # what ``auto`` pipelines into, where it pipelines


def parse_overlap(overlap: str | int) -> int | None:
    """``off`` -> 1, ``auto`` -> None (the layer decides), ``N`` -> N chunks (N >= 1)."""
    if overlap == "auto":
        return None
    if overlap == "off":
        return 1
    try:
        n = int(overlap)
    except (TypeError, ValueError):
        raise ValueError(f"overlap must be auto, off or a chunk count, got {overlap!r}") from None
    if n < 1:
        raise ValueError(f"overlap chunks must be >= 1, got {n}")
    return n


def chunks_for(overlap: str | int, expert_parallel: bool, all_to_all: str, fewest: int) -> int:
    """The chunks a layer pipelines into (1: not pipelined). ``auto``: AUTO_CHUNKS under
    expert parallelism with the flat all-to-all when every rank holds at least that many
    experts (``fewest``), else 1; one rank never pipelines (it exchanges nothing)."""
    asked = parse_overlap(overlap)
    if not expert_parallel:
        return 1
    if asked is not None:
        return asked
    return AUTO_CHUNKS if all_to_all == "flat" and fewest >= AUTO_CHUNKS else 1


@cache
def _async_exchange():
    class AsyncExchange(torch.autograd.Function):
        """Issue ``comm.alltoallv_async``; the handle goes to ``pending``; backward reverses."""

        @staticmethod
        def forward(ctx, x, comm, send_counts, recv_counts, phase, pending):
            ctx.comm, ctx.counts, ctx.phase = comm, (send_counts, recv_counts), phase
            out, handle = comm.alltoallv_async(x.detach(), send_counts, recv_counts, phase)
            pending.append(handle)
            return out

        @staticmethod
        def backward(ctx, grad):
            send_counts, recv_counts = ctx.counts
            back = ctx.comm.alltoallv(grad.contiguous(), recv_counts, send_counts, ctx.phase)
            return back, None, None, None, None, None

    return AsyncExchange


def _exchange(x, comm, send_counts, recv_counts, phase):
    pending: list = []
    out = _async_exchange().apply(x, comm, list(send_counts), list(recv_counts), phase, pending)
    return out, pending[0]


def pipelined_routed(layer, x: "torch.Tensor", pft, chunks: int) -> "torch.Tensor":
    """The layer's routed output [S, H] for ``pft``, dispatch and combine in ``chunks`` chunks
    pipelined with the expert GEMMs (see the module docstring). Expert parallel only."""
    comm = layer.dispatcher.comm()
    world, experts = comm.size, layer.num_experts
    # The one counts exchange (every rank's tokens per expert), issued first and read only when
    # the receive sizes are needed: the send side and the rows' gather need none of it.
    counts_of_ranks = comm.allgather_ints_async([int(c) for c in pft.tokens_per_expert.tolist()])
    rank_of = layer.placement.rank_of_expert()
    chunk_of = torch.empty(experts, dtype=torch.int64)
    for held in layer.placement.experts_of_rank:
        for i, e in enumerate(held):
            chunk_of[e] = i * chunks // len(held)
    pair_expert = pft.expert_ids.cpu()
    key = chunk_of[pair_expert] * world + rank_of[pair_expert]  # chunk-major, then destination
    order = torch.argsort(key, stable=True)
    send = torch.bincount(key, minlength=chunks * world).reshape(chunks, world)
    device = x.device
    order_dev = order.to(device)
    rows_out = torch.split(
        x.index_select(0, pft.token_ids.index_select(0, order_dev)), send.sum(1).tolist()
    )
    weights_out = torch.split(pft.combine_weights.index_select(0, order_dev), send.sum(1).tolist())

    mine = torch.tensor(layer.local_experts, dtype=torch.int64)
    from_source = torch.tensor(counts_of_ranks(), dtype=torch.int64)[:, mine]  # [W, E_local]
    my_chunk = chunk_of[mine]
    recv = torch.stack([from_source[:, my_chunk == c].sum(1) for c in range(chunks)])  # [C, W]
    arriving = []
    for c in range(chunks):  # every chunk in flight at once
        rows = _exchange(rows_out[c], comm, send[c].tolist(), recv[c].tolist(), "dispatch")
        wts = _exchange(
            weights_out[c].reshape(-1, 1), comm, send[c].tolist(), recv[c].tolist(), "weights"
        )
        arriving.append((rows, wts))

    returning = []
    for c, ((rows, rows_done), (wts, wts_done)) in enumerate(arriving):
        rows_done.wait()
        wts_done.wait()
        in_chunk = from_source * (my_chunk == c)  # [W, E_local], zero outside chunk c
        local_expert_of_row = torch.repeat_interleave(
            torch.arange(len(mine)).repeat(world), in_chunk.reshape(-1)
        )
        expert_order = torch.argsort(local_expert_of_row, stable=True).to(device)
        y = layer.experts(rows.index_select(0, expert_order), in_chunk.sum(0))
        y = y.index_select(0, inverse_permutation(expert_order))
        y = y * wts.reshape(-1).to(y.dtype).unsqueeze(1)
        returning.append(_exchange(y, comm, recv[c].tolist(), send[c].tolist(), "combine"))

    for _, done in returning:
        done.wait()
    back = torch.cat([b for b, _ in returning]) if returning else x.new_zeros(0, x.shape[1])
    low = x.dtype in (torch.bfloat16, torch.float16)
    acc = torch.float32 if low and layer.combine_accumulate == "float32" else x.dtype
    out = torch.zeros(pft.num_tokens, x.shape[1], dtype=acc, device=device)
    out = out.index_add(0, pft.token_ids.index_select(0, order_dev), back.to(acc))
    return out.to(x.dtype)
