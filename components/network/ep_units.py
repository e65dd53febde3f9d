"""What each expert-parallel library prints, and how a predicted kernel time becomes it.

The EP libraries (DeepEP's normal and low-latency kernels, DeepEP V2, Hybrid-EP, UCCL-EP) print
per-GPU dispatch and combine figures in their own units: a "bandwidth" is some byte count of
theirs divided by the kernel time, and which bytes they count differs (the rows one rank
receives over NVLink, local ones included; the token copies one rank sends to other nodes,
counted once per destination node with its own node included; every top-k selection, local
ones included). Each definition is written down once here (:data:`DEFINITIONS`, with the
library file that computes it) and :func:`to_printed` / :func:`to_time` turn a time into the
printed number and back. The byte counts are expectations under the routing the library's
benchmark draws (uniform over experts, or DeepSeek-V3's node-limited routing: top groups of
nodes first, then top-k experts inside them), from :func:`hit_probability`.

Why: a predicted time compared with a printed "GB/s" is only meaningful when both count the
same bytes; without the definitions a logical bandwidth that counts local traffic reads as a
NIC running above line rate.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb

GB = 1e9


@dataclass(frozen=True)
class Routing:
    """Expected routing of one rank's ``tokens`` over ``ep`` ranks of ``gpus_per_node``:
    ``top_k`` of ``experts`` experts per token, uniformly, within ``node_limit`` nodes drawn
    uniformly when given (DeepSeek-V3 node-limited routing; None: every node)."""

    ep: int
    gpus_per_node: int
    tokens: int
    top_k: int
    experts: int
    node_limit: int | None = None

    def __post_init__(self):
        if self.ep % self.gpus_per_node and self.ep > self.gpus_per_node:
            raise ValueError(f"EP {self.ep} is not whole nodes of {self.gpus_per_node} GPUs")
        if self.experts % self.ep or self.top_k > self.experts or self.top_k < 1:
            raise ValueError(f"{self.experts} experts over EP {self.ep}, top-{self.top_k}")

    @property
    def nodes(self) -> int:
        return max(1, self.ep // self.gpus_per_node)

    @property
    def local(self) -> int:
        return min(self.ep, self.gpus_per_node)

    @property
    def groups(self) -> int:
        """Nodes a token may reach: the node limit where it binds, else all nodes."""
        return min(self.node_limit or self.nodes, self.nodes)


def _miss(pool: int, target: int, k: int) -> float:
    """P(none of k distinct experts drawn from ``pool`` is among ``target`` of them)."""
    return comb(pool - target, k) / comb(pool, k) if pool - target >= k else 0.0


def hit_probability(r: Routing, what: str) -> float:
    """P(one token reaches a given ``what`` ("rank" or "node")) under :class:`Routing`: the
    token picks ``groups`` of the nodes uniformly, then top_k distinct experts uniformly among
    theirs (a node it picked and then reached with no expert counts as not reached)."""
    per_node = r.experts // r.nodes
    pool = r.groups * per_node
    target = per_node if what == "node" else r.experts // r.ep
    if what not in ("rank", "node"):
        raise ValueError(f"what must be 'rank' or 'node', got {what!r}")
    return r.groups / r.nodes * (1.0 - _miss(pool, target, r.top_k))


def expected_rows(r: Routing, what: str) -> float:
    """Rows one rank sends to one destination ``what`` ("rank", "node": deduplicated, once per
    destination; "selection": one per top-k selection that lands on a given rank)."""
    if what == "selection":
        return r.tokens * r.top_k / r.ep
    return r.tokens * hit_probability(r, what)


@dataclass(frozen=True)
class Definition:
    """One library's printed figure: ``counts`` names the rows it divides by the time
    ("nvl_recv": rows one rank receives, from every rank, itself included; "rdma_nodes": one
    rank's tokens times the nodes each reaches, its own included; "selections": one rank's
    tokens times their top-k selections); bytes per row by ``row_bytes``; ``unit``: "GB/s"
    (bytes / 1e9 / seconds) or "us" (the time itself)."""

    key: str
    counts: str
    row_bytes: str
    unit: str
    source: str


DEFINITIONS = {
    d.key: d
    for d in (
        Definition(
            "deepep-v1-nvl",
            "nvl_recv",
            "v1",
            "GB/s",
            "deepseek-ai/DeepEP tests/legacy/test_intranode.py: nvl_recv_bytes = recv_x.numel() "
            "x 2 (x fp8_factor (1 + 4/128) / 2 for FP8) / kernel time (bench_kineto)",
        ),
        Definition(
            "deepep-v1-rdma",
            "rdma_nodes",
            "v1",
            "GB/s",
            "deepseek-ai/DeepEP tests/legacy/test_internode.py: rdma_send_bytes = "
            "num_rdma_token_sent (tokens x distinct destination nodes, own node included) x "
            "hidden x 2 (x fp8_factor for FP8) / kernel time (bench_kineto)",
        ),
        Definition(
            "deepep-v1-ll-latency",
            "selections",
            "ll",
            "us",
            "deepseek-ai/DeepEP tests/legacy/test_low_latency.py: avg_t of the dispatch or "
            "combine kernel (bench_kineto), in us; its bandwidth divides num_selections x "
            "(hidden + hidden/128 x 4 + 16) (FP8) or hidden x 2 (BF16) bytes by it",
        ),
        Definition(
            "deepep-v1-ll-bandwidth",
            "selections",
            "ll",
            "GB/s",
            "deepseek-ai/DeepEP tests/legacy/test_low_latency.py: num_dispatch_comm_bytes or "
            "num_combine_comm_bytes / avg_t",
        ),
        Definition(
            "deepep-v2-scaleout",
            "rdma_nodes",
            "v2",
            "GB/s",
            "deepseek-ai/DeepEP tests/elastic/test_ep.py: num_scaleout_send_tokens (tokens x "
            "distinct scale-out ranks reached, own included unless --ignore-local-traffic) x "
            "count_bytes(recv_x, recv_topk_idx, recv_topk_weights) per token / kernel time",
        ),
        Definition(
            "hybrid-ep-rdma",
            "rdma_nodes",
            "v1",
            "GB/s",
            "deepseek-ai/DeepEP branch hybrid-ep tests/test_hybrid_ep.py and tests/utils.py "
            "count_rdma_send_from_routing_map: tokens x distinct nodes (local node kept 'to "
            "align with the implementation in the DeepEP') x hidden x 2 (x fp8_factor) / time",
        ),
    )
}
# UCCL-EP's ep/bench/test_{intranode,internode,low_latency}.py compute the same numbers as
# DeepEP V1's tests (they are forks of them): the UCCL cells use the deepep-v1-* definitions.


def row_bytes(style: str, hidden: int, dtype: str, top_k: int) -> float:
    """Bytes per row a library counts: "v1" (FP8: hidden x (1 + 4/128), the per-128 scales;
    BF16: 2 x hidden), "ll" (FP8: hidden + hidden/128 x 4 + 16; BF16: 2 x hidden), "v2" (the
    row, its top-k int64 indices and fp32 weights for a dispatch; row and weights for a
    combine)."""
    if dtype not in ("fp8", "bf16"):
        raise ValueError(f"dtype must be fp8 or bf16, got {dtype!r}")
    if style == "v1":
        return hidden * (1 + 4 / 128) if dtype == "fp8" else 2.0 * hidden
    if style == "ll":
        return hidden + hidden / 128 * 4 + 16 if dtype == "fp8" else 2.0 * hidden
    if style == "v2":
        if dtype == "fp8":
            return hidden * (1 + 4 / 128) + top_k * (8 + 4)
        return 2.0 * hidden + top_k * 4
    raise ValueError(f"unknown row style {style!r}")


def counted_bytes(key: str, r: Routing, hidden: int, dtype: str) -> float:
    """The bytes definition ``key`` divides by the time, expected under routing ``r``."""
    d = DEFINITIONS[key]
    if d.counts == "nvl_recv":  # every rank (itself included) sends this rank its rows
        rows = r.ep * expected_rows(r, "rank")
    elif d.counts == "rdma_nodes":
        rows = r.nodes * expected_rows(r, "node")
    elif d.counts == "selections":
        rows = r.tokens * r.top_k
    else:
        raise ValueError(f"unknown count {d.counts!r}")
    return rows * row_bytes(d.row_bytes, hidden, dtype, r.top_k)


def to_printed(key: str, time_s: float, r: Routing, hidden: int, dtype: str) -> float:
    """The number the library prints for a kernel that took ``time_s``."""
    if not time_s > 0:
        raise ValueError(f"time must be positive, got {time_s}")
    d = DEFINITIONS[key]
    if d.unit == "us":
        return time_s * 1e6
    return counted_bytes(key, r, hidden, dtype) / GB / time_s


def to_time(key: str, printed: float, r: Routing, hidden: int, dtype: str) -> float:
    """The kernel time (s) behind a printed number: the inverse of :func:`to_printed`."""
    if not printed > 0:
        raise ValueError(f"printed value must be positive, got {printed}")
    d = DEFINITIONS[key]
    if d.unit == "us":
        return printed * 1e-6
    return counted_bytes(key, r, hidden, dtype) / GB / printed
