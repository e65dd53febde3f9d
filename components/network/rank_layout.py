"""EP-first vs DP-first rank layouts (where EP and DP groups sit) and the bytes each puts on each
link class (X-MoE App. C.1). A rank layout is not a placement: a placement maps experts to ranks.

A world of W = nodes x gpus_per_node ranks runs expert parallelism of degree EP and data
parallelism of degree DP = W / EP (each expert shard replicated DP times).

- EP-first ("EP-then-DP", DeepSpeed-MoE's choice): EP groups are blocks of EP consecutive
  ranks, so with EP <= gpus_per_node the token all-to-all stays inside a node, and the DP group
  of an expert shard (one rank per EP block) spans nodes: gradient all-reduce crosses nodes.
- DP-first ("DP-then-EP", X-MoE's choice on Frontier): DP groups are blocks of DP consecutive
  ranks, so replicas of one expert shard sit in one node and the gradient all-reduce stays
  inside it, while the EP group (one rank per DP block) spans nodes.

Traffic per MoE layer and step, counted per link class (components.network.topology):
- all-to-all (dispatch + combine, forward + backward = 4 exchanges): each rank sends
  T k H e bytes per exchange, split over its EP peers by the routing; with uniform routing a
  fraction (EP - 1)/EP leaves the rank and each peer gets 1/EP of it.
- gradient all-reduce of the rank's expert parameters (P_r elements of g bytes) over its DP
  group with a ring (reduce-scatter + all-gather, nccl-tests busbw convention): each rank sends
  2 (DP - 1)/DP P_r g bytes, all of it to its ring successor, so the link class of the pair
  (rank, successor) decides where they go.

:func:`traffic_model` gives these counts from the formula for any size; :func:`ring_all_reduce`
is a real ring all-reduce over P2P messages that logs what it sends, so small runs count the
same quantities from the messages actually sent.
"""

from __future__ import annotations

import torch

from moe_repro.components.network.topology import LINK_CLASSES, Topology, bytes_by_link_class

ORDERS = ("ep-first", "dp-first")


def even_split_bounds(total: int, parts: int) -> list[tuple[int, int]]:
    """[lo, hi) of ``parts`` contiguous pieces of ``total`` items, as even as possible (the first
    total mod parts pieces take one more): how a vocabulary or a sequence is split over ranks."""
    if parts < 1:
        raise ValueError(f"need at least one part, got {parts}")
    base, extra = divmod(total, parts)
    bounds, lo = [], 0
    for p in range(parts):
        hi = lo + base + (1 if p < extra else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def rank_layout_groups(world: int, ep: int, order: str) -> tuple[list[list[int]], list[list[int]]]:
    """(EP groups, DP groups) as lists of global ranks; an EP group lists ranks by EP index."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    if ep < 1 or world % ep:
        raise ValueError(f"EP degree {ep} must divide the world size {world}")
    dp = world // ep
    if order == "ep-first":
        ep_groups = [[g * ep + i for i in range(ep)] for g in range(dp)]
        dp_groups = [[g * ep + i for g in range(dp)] for i in range(ep)]
    else:
        dp_groups = [[j * dp + i for i in range(dp)] for j in range(ep)]
        ep_groups = [[j * dp + i for j in range(ep)] for i in range(dp)]
    return ep_groups, dp_groups


def group_of(rank: int, groups: list[list[int]]) -> list[int]:
    return next(g for g in groups if rank in g)


def ring_all_reduce(comm, tensor: torch.Tensor, phase: str = "grad-allreduce") -> torch.Tensor:
    """Sum ``tensor`` over ``comm``'s ranks with a ring: reduce-scatter then all-gather.

    ``comm`` is a components.alltoall.flat communicator (its ``p2p`` logs every send). Chunks
    follow torch.tensor_split, so sizes not divisible by the group are fine. Returns a new tensor.
    """
    n, me = comm.size, comm.rank
    flat = tensor.detach().reshape(-1).clone()
    if n == 1:
        return flat.reshape(tensor.shape)
    chunks = list(torch.tensor_split(flat, n))  # views into flat
    nxt, prv = (me + 1) % n, (me - 1) % n
    for step in range(n - 1):  # reduce-scatter: after it, chunk (me + 1) % n is complete here
        send_idx, recv_idx = (me - step) % n, (me - step - 1) % n
        incoming = torch.empty_like(chunks[recv_idx])
        comm.p2p([(nxt, chunks[send_idx].clone())], [(prv, incoming)], phase).wait()
        chunks[recv_idx] += incoming
    for step in range(n - 1):  # all-gather the completed chunks around the ring
        send_idx, recv_idx = (me + 1 - step) % n, (me - step) % n
        incoming = torch.empty_like(chunks[recv_idx])
        comm.p2p([(nxt, chunks[send_idx].clone())], [(prv, incoming)], phase).wait()
        chunks[recv_idx].copy_(incoming)
    return flat.reshape(tensor.shape)


def traffic_model(
    nodes: int,
    gpus_per_node: int,
    ep: int,
    order: str,
    tokens_per_rank: int,
    top_k: int,
    hidden: int,
    expert_params_per_rank: int,
    act_bytes: int = 2,
    grad_bytes: int = 2,
    a2a_exchanges: int = 4,
) -> dict:
    """Bytes per link class summed over all ranks, for one MoE layer and step (formula).

    Uniform routing: each of a rank's T k assignments goes to each EP index with probability
    1/EP. Returns {"alltoall": {class: bytes}, "allreduce": {class: bytes}} with ``inter_node``.
    """
    topo = Topology(nodes=nodes, ranks_per_node=gpus_per_node)
    world = nodes * gpus_per_node
    ep_groups, dp_groups = rank_layout_groups(world, ep, order)
    dp = world // ep
    a2a_msgs, ar_msgs = [], []
    per_peer = tokens_per_rank * top_k * hidden * act_bytes * a2a_exchanges / ep
    for g in ep_groups:
        for src in g:
            for dst in g:
                a2a_msgs.append(("a2a", src, dst, per_peer))
    ring_bytes = 2 * (dp - 1) / dp * expert_params_per_rank * grad_bytes if dp > 1 else 0
    for g in dp_groups:
        for i, src in enumerate(g):
            ar_msgs.append(("ar", src, g[(i + 1) % len(g)], ring_bytes))
    return {"alltoall": _float_classes(a2a_msgs, topo), "allreduce": _float_classes(ar_msgs, topo)}


def _float_classes(messages, topo: Topology) -> dict:
    # bytes_by_link_class takes int bytes; the uniform-routing formula gives fractions.
    out = {c: 0.0 for c in LINK_CLASSES}
    for _, src, dst, nbytes in messages:
        if src != dst:
            out[topo.link_class(src, dst)] += nbytes
    out["inter_node"] = sum(v for c, v in out.items() if c != "intra_node")
    return out


def measured_bytes(log, topo: Topology, phase_prefix: str) -> dict[str, int]:
    """Per-link-class bytes of the logged messages whose phase starts with ``phase_prefix``."""
    return bytes_by_link_class([m for m in log if m[0].startswith(phase_prefix)], topo)


def comm_time_s(traffic: dict, intra_bw: float, inter_bw: float, world: int) -> float:
    """Per-rank time if each rank's share of a class's bytes moves at that class's bandwidth
    (bytes/s), classes one after the other: (intra / intra_bw + inter_node / inter_bw) / W."""
    return (
        sum(t["intra_node"] / intra_bw + t["inter_node"] / inter_bw for t in traffic.values())
        / world
    )
