"""Dispatch and combine in chunks, pipelined with the expert GEMMs (Tutel's pipelined all-to-all).

The unpipelined layer waits for the whole dispatch before its first GEMM and computes every
expert before the first row goes back. Here each rank's local experts are split into ``chunks``
contiguous groups (local expert i of n is in chunk i * chunks // n); chunk c's rows are one
uneven all-to-all. Every chunk's rows are issued at once, asynchronously; then, chunk by
chunk, the rank waits for chunk c, runs its experts and issues chunk c's way back, so chunk c's
return and chunk c+1's arrival overlap the GEMMs of the chunk in hand (Tutel's pipelined
all-to-all, Comet's fine-grained overlap along the expert dimension). The combine weights stay
on the token's rank: returned rows are weighted there as they are summed into their tokens.

The counts exchange (one all-gather of every rank's tokens per expert, X-MoE App. B.3) is issued
first and read only for the receive sizes; the send order and the rows' gather run meanwhile.

Autograd: the exchanges and the experts between them are one Function, keeping each chunk's
expert graph (received rows and the chunk's expert-weight slices as leaves). Its backward
issues every chunk's combine gradient at once, then chunk by chunk runs that chunk's expert
backward and issues its dispatch gradient, which travels under the next chunk's GEMMs.

Exact up to the order of sums (fp32 sums for bf16/fp16, as pft.scatter_combine); every rank
issues the same collectives in the same order, empty chunks included. Once differentiable. The
exchanges run on the dispatcher's communicator (flat all-to-all-v); ``auto`` pipelines only
where the layer's algorithm is the flat one. Design notes: docs/moe-kernels.md.
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


def chunks_for(
    overlap: str | int,
    expert_parallel: bool,
    all_to_all: str,
    fewest: int,
    device_type: str = "cpu",
) -> int:
    """The chunks a layer pipelines into (1: not pipelined). ``auto``: AUTO_CHUNKS under
    expert parallelism with the flat all-to-all on a GPU when every rank holds at least that
    many experts (``fewest``), else 1; one rank never pipelines (it exchanges nothing).

    Not on a CPU: there the all-to-all progresses on threads of the same cores the GEMMs keep
    busy, so nothing runs beside the GEMMs to hide it, and chunking adds collectives and
    permutes (the moe-layer suite's ``--overlap auto,off`` on the machine at hand measures it;
    docs/moe-kernels.md). A GPU's collectives run beside its GEMMs."""
    asked = parse_overlap(overlap)
    if not expert_parallel:
        return 1
    if asked is not None:
        return asked
    pipelines = all_to_all == "flat" and fewest >= AUTO_CHUNKS and device_type == "cuda"
    return AUTO_CHUNKS if pipelines else 1


class _ChunkPlan:
    """What the pipelined exchange needs besides tensors: the communicator, each chunk's send
    and receive counts per rank ([C, W]), each source's rows per local expert ([W, E_local]),
    the chunk of each local expert, and the layer whose experts compute."""

    def __init__(self, layer, comm, send, recv, from_source, my_chunk):
        self.layer, self.comm = layer, comm
        self.send, self.recv = send, recv
        self.from_source, self.my_chunk = from_source, my_chunk
        self.chunks = int(send.shape[0])
        self.build_graph = torch.is_grad_enabled()  # at the call: keep graphs for backward

    def local_range(self, c: int) -> tuple[int, int]:
        """Chunk c's local experts: a contiguous range [lo, hi) of this rank's."""
        held = (self.my_chunk == c).nonzero().flatten().tolist()
        return (held[0], held[-1] + 1) if held else (0, 0)

    def experts_of_chunk(self, rows, c: int, weights: dict):
        """Chunk c's received rows (source-major) through its experts (``weights``: the expert
        MLP's parameters restricted to chunk c's experts), in the same order."""
        lo, hi = self.local_range(c)
        if hi == lo:  # a chunk with no expert here (more chunks than experts): receives nothing
            return rows.new_zeros(rows.shape)
        world = self.from_source.shape[0]
        in_chunk = self.from_source[:, lo:hi]  # [W, hi - lo]
        local_expert_of_row = torch.repeat_interleave(
            torch.arange(hi - lo).repeat(world), in_chunk.reshape(-1)
        )
        expert_order = torch.argsort(local_expert_of_row, stable=True).to(rows.device)
        y = torch.func.functional_call(
            self.layer.experts, weights, (rows.index_select(0, expert_order), in_chunk.sum(0))
        )
        return y.index_select(0, inverse_permutation(expert_order))


@cache
def _pipelined_experts():
    class PipelinedExperts(torch.autograd.Function):
        """send rows [N, H] -> their expert outputs, back in send order; dispatch, expert GEMMs
        and combine pipelined in chunks forward, and their gradients pipelined the same way
        backward (module docstring)."""

        @staticmethod
        def forward(ctx, send_rows, plan, names, *params):
            comm, send, recv = plan.comm, plan.send, plan.recv
            build = plan.build_graph and any(ctx.needs_input_grad)
            rows_out = torch.split(send_rows, send.sum(1).tolist())
            arriving = [  # every chunk in flight at once
                comm.alltoallv_async(rows_out[c], send[c].tolist(), recv[c].tolist(), "dispatch")
                for c in range(plan.chunks)
            ]
            returning, graphs = [], []
            for c, (rows, done) in enumerate(arriving):
                done.wait()
                lo, hi = plan.local_range(c)
                # chunk c's slices of the expert weights, as leaves: its backward gives their
                # gradients alone (the whole [E_local, ...] gradient per chunk, mostly zeros,
                # summed over chunks, cost more than the GEMMs it follows)
                weights = {
                    n: p[lo:hi].detach().requires_grad_(build and p.requires_grad)
                    for n, p in zip(names, params)
                }
                with torch.enable_grad() if build else torch.no_grad():
                    rows_in = rows.requires_grad_(build and ctx.needs_input_grad[0])
                    y = plan.experts_of_chunk(rows_in, c, weights)
                graphs.append((rows_in, weights, y))
                s, r = recv[c].tolist(), send[c].tolist()
                returning.append(comm.alltoallv_async(y.detach(), s, r, "combine"))
            for _, done in returning:
                done.wait()
            ctx.plan, ctx.graphs, ctx.params = plan, graphs, params
            ctx.rows_shape = send_rows.shape
            if returning:
                return torch.cat([b for b, _ in returning])
            return send_rows.new_zeros(0, send_rows.shape[1])

        @staticmethod
        def backward(ctx, grad_back):
            plan, comm = ctx.plan, ctx.plan.comm
            send, recv, params = plan.send, plan.recv, ctx.params
            grads = torch.split(grad_back.contiguous(), send.sum(1).tolist())
            # combine's gradient: every chunk's rows back to the experts' ranks at once
            arriving = [
                comm.alltoallv_async(grads[c], send[c].tolist(), recv[c].tolist(), "combine")
                for c in range(plan.chunks)
            ]
            # every local expert is in exactly one chunk: each chunk fills its rows
            param_grads = [torch.empty_like(p) if p.requires_grad else None for p in params]
            returning = []
            for c, (g_y, done) in enumerate(arriving):
                done.wait()
                rows_in, weights, y = ctx.graphs[c]
                slices = list(weights.values())
                wanted = [t for t in (rows_in, *slices) if t.requires_grad]
                got = (
                    dict(
                        zip(map(id, wanted), torch.autograd.grad(y, wanted, g_y, allow_unused=True))
                    )
                    if y.requires_grad and wanted
                    else {}
                )
                g_rows = got.get(id(rows_in))
                if g_rows is None:
                    g_rows = torch.zeros_like(rows_in)
                lo, hi = plan.local_range(c)
                for full, part in zip(param_grads, slices):
                    g = got.get(id(part))
                    if full is not None:
                        full[lo:hi] = 0 if g is None else g
                # dispatch's gradient for chunk c travels while chunk c+1's backward GEMMs run
                s, r = recv[c].tolist(), send[c].tolist()
                returning.append(comm.alltoallv_async(g_rows, s, r, "dispatch"))
                ctx.graphs[c] = None  # free chunk c's saved activations
            for _, done in returning:
                done.wait()
            g_send_rows = (
                torch.cat([g for g, _ in returning])
                if returning
                else grad_back.new_zeros(ctx.rows_shape)
            )
            return (g_send_rows, None, None, *param_grads)

    return PipelinedExperts


def pipelined_routed(layer, x: "torch.Tensor", pft, chunks: int) -> "torch.Tensor":
    """The layer's routed output [S, H] for ``pft``, dispatch and combine in ``chunks`` chunks
    pipelined with the expert GEMMs, forward and backward (see the module docstring). Expert
    parallel only."""
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
    token_of_row = pft.token_ids.index_select(0, order_dev)
    send_rows = x.index_select(0, token_of_row)

    mine = torch.tensor(layer.local_experts, dtype=torch.int64)
    from_source = torch.tensor(counts_of_ranks(), dtype=torch.int64)[:, mine]  # [W, E_local]
    my_chunk = chunk_of[mine]
    recv = torch.stack([from_source[:, my_chunk == c].sum(1) for c in range(chunks)])  # [C, W]
    plan = _ChunkPlan(layer, comm, send, recv, from_source, my_chunk)
    names, params = zip(*layer.experts.named_parameters())
    back = _pipelined_experts().apply(send_rows, plan, names, *params)

    # each returned row weighted on its token's rank and summed into its token (fp32 sums for
    # bf16/fp16 with combine_accumulate float32, as pft.scatter_combine)
    low = x.dtype in (torch.bfloat16, torch.float16)
    acc = torch.float32 if low and layer.combine_accumulate == "float32" else x.dtype
    weights = pft.combine_weights.index_select(0, order_dev).to(acc).unsqueeze(1)
    out = torch.zeros(pft.num_tokens, x.shape[1], dtype=acc, device=device)
    out = out.index_add(0, token_of_row, back.to(acc) * weights)
    return out.to(x.dtype)
