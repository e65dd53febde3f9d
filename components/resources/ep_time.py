"""Time of one expert-parallel dispatch (or combine) per token dispatcher, for the planners.

The planner's EP term is the network simulator's model of the same kernels in closed form, so
planner and simulator answer alike on one fabric (tests/test_planner_ep_term.py checks it):

- "alltoall" (Megatron-core --moe-token-dispatcher-type alltoall): one NCCL all-to-all of every
  top-k copy, flat: a token with two experts on one node crosses the network twice. The
  simulator's flows are ep_kernel_messages(..., "low_latency") on the profile as NCCL sees it;
  its closed form is time_model.alltoall_time (NIC at line rate x efficiency.network).
- "deepep" / "hybrid-ep" (the flex dispatcher with DeepEP's normal kernels or Hybrid-EP): node
  deduplicated, as simulate_ep_kernel(..., "normal"): a token crosses the network once per node
  it reaches, then NVLink forwards it to that node's ranks; the two phases run at once.
- "deepep-ll" (DeepEP's low-latency kernels): every copy sent to its expert's rank directly,
  as simulate_ep_kernel(..., "low_latency").

The kernels run at the rates and latencies a GPU-initiated put reaches (simulator.
ep_kernel_platform: the profile's ep_kernels section; the low-latency kernels' one-row messages
also at most the NIC's message rate). Rows per destination are ep_units' expectations under uniform
top-k routing, or node-limited routing where the model limits the nodes a token reaches
(:data:`ROUTING_GROUPS`). A phase takes its link latency, the first message's issue cost and its
bytes at the slowest of its link, issue and in-flight-window rates, as the simulator caps them;
fabric tapers above the NIC are not in the closed form.

Why: the planner's flat copy-per-expert term overstates a deduplicating dispatcher's network
bytes by up to top-k times; taking the simulator's model keeps the two from drifting apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from moe_repro.components.network.ep_units import Routing, expected_rows
from moe_repro.components.network.platform import Platform
from moe_repro.components.network.simulator import (
    Machine,
    ep_kernel_platform,
    topology_for,
)
from moe_repro.components.resources import time_model as T

DISPATCHERS = {
    "alltoall": "Megatron-core's alltoall token dispatcher (default): NCCL all-to-all of every "
    "top-k copy, flat (no per-node deduplication), profile link rates x efficiency",
    "deepep": "flex dispatcher, DeepEP normal kernels: a token crosses the network once per "
    "destination node, then NVLink forwarding (node-deduplicated), GPU-initiated put rates",
    "hybrid-ep": "flex dispatcher, Hybrid-EP: node-deduplicated like deepep (the same model)",
    "deepep-ll": "DeepEP low-latency kernels: every top-k copy sent directly to its expert's "
    "rank (no deduplication), GPU-initiated put rates",
}
_KERNEL = {"deepep": "normal", "hybrid-ep": "normal", "deepep-ll": "low_latency"}

# Group-limited routers: (expert groups, groups a token may pick). DeepSeek-V3 (and V3.2):
# config.json n_group 8, topk_group 4; the technical report (Sec. 2.1.2, "Node-Limited
# Routing") lays the 8 groups on 8 nodes, so a token reaches at most 4 of them.
ROUTING_GROUPS = {"deepseek-v3": (8, 4), "deepseek-v3.2": (8, 4)}


@dataclass(frozen=True)
class Dispatch:
    """One dispatch's time and the bytes one rank sends (NVLink and network together)."""

    seconds: float
    bytes: float


@dataclass(frozen=True)
class _Rates:
    nvl: float  # bytes/s of a GPU's NVLink port
    nic: float  # bytes/s of a GPU's share of its NICs
    on_latency: float
    off_latency: float  # mean over the destination nodes of one rank
    per_message: float
    window: int


def _pair_rate(m: Machine, local: int) -> float:
    """The slowest link between two of a node's first ``local`` GPUs (inf: a switch, no pair
    links); every pair carries the same bytes, so it bounds the phase."""
    kind = m.intra["kind"]
    if kind == "switch" or local < 2:
        return math.inf
    rates = []
    for a in range(local):
        for b in range(local):
            if a == b:
                continue
            if kind == "graph":
                rates.append(m.intra["pairs"].get((a, b), m.intra["other_bytes_per_s"]))
            else:
                same = m.package_of[a] == m.package_of[b] and "intra_package" in m.link_bytes_per_s
                rates.append(m.pair_capacity("intra_package" if same else "intra_node"))
    return min(rates)


def _rates(p: Platform, nodes: int, local: int) -> _Rates:
    m = Machine.from_platform(p)
    topo = topology_for(p, nodes, gpus_per_node=local)
    kind = m.intra["kind"]
    port = {"switch": m.intra.get("bytes_per_s"), "port": p.intra_node_a2a_bytes_per_s}
    # a GPU's port (switch, port) and its pair links (port, graph) both cap its on-node bytes
    nvl = min(port.get(kind) or math.inf, _pair_rate(m, local) * max(1, local - 1))
    nic = min(p.nic_bytes_per_s, p.nic_bytes_per_s_per_gpu)
    on = max((m.latency(m.profile_class(topo, 0, k)) for k in range(1, local)), default=0.0)
    off = [m.latency(m.profile_class(topo, 0, n * local)) for n in range(1, nodes)]
    return _Rates(nvl, nic, on, sum(off) / len(off) if off else 0.0, m.per_message_s, m.window)


def _kernel_rates(
    p: Platform, nodes: int, local: int, message_bytes: float | None = None
) -> _Rates:
    """The EP kernels' rates on ``p`` for messages of ``message_bytes`` (None: chunked, no
    message-rate cap), cached beside the frozen profile, as time_model does."""
    cache = p.__dict__.get("_ep_kernel_rates")
    if cache is None:
        cache = {}
        object.__setattr__(p, "_ep_kernel_rates", cache)
    key = (nodes, local, message_bytes)
    if key not in cache:
        cache[key] = _rates(ep_kernel_platform(p, message_bytes), nodes, local)
    return cache[key]


def _phase(parts: list[tuple[float, float, float, int]], r: _Rates) -> float:
    """One rank's phase of concurrent flows: ``parts`` (bytes, link rate, latency, messages).
    Each part's bytes at its link rate after its latency; the rank's issue cost (one message
    up front, the rest a rate cap) and window cap all its bytes (simulator._add_issue_limits)."""
    parts = [x for x in parts if x[0] > 0 and x[3] > 0]
    if not parts:
        return 0.0
    total = sum(b for b, _, _, _ in parts)
    msgs = sum(n for _, _, _, n in parts)
    mean_lat = sum(lat * n for _, _, lat, n in parts) / msgs
    caps = []
    if r.per_message > 0 and msgs > 1:
        caps.append(total / ((msgs - 1) * r.per_message))
    if r.window and mean_lat > 0:
        caps.append(r.window * (total / msgs) / mean_lat)
    t = max(lat + b / rate for b, rate, lat, _ in parts)
    if caps:
        t = max(t, min(lat for _, _, lat, _ in parts) + total / min(caps))
    return t + (r.per_message if msgs else 0.0)


def dispatch_time(
    p: Platform,
    dispatcher: str,
    ep: int,
    ep_per_node: int,
    tokens: float,
    top_k: int,
    experts: int,
    row_bytes: float,
    node_limit: int | None = None,
) -> Dispatch:
    """One dispatch (a combine moves the same rows back) of ``tokens`` rows of ``row_bytes``
    per rank over ``ep`` ranks, ``ep_per_node`` of them on each node (module docstring)."""
    if dispatcher not in DISPATCHERS:
        raise ValueError(f"dispatcher must be one of {', '.join(DISPATCHERS)}, got {dispatcher!r}")
    if ep <= 1 or tokens <= 0:
        return Dispatch(0.0, 0.0)
    local = min(ep, ep_per_node)
    if ep % local:  # an EP group that is not whole nodes: the largest even split of its ranks
        local = math.gcd(ep, local)
    nodes = max(1, ep // local)
    copy = tokens * top_k / ep * row_bytes  # one rank's copies for one other rank
    if dispatcher == "alltoall":
        on, off = copy * (local - 1), copy * (ep - local)
        return Dispatch(T.alltoall_time(p, on, off, messages=1), on + off)
    low_latency = _KERNEL[dispatcher] == "low_latency"
    # the low-latency kernels put one row per message (simulate_ep_kernel)
    r = _kernel_rates(p, nodes, local, row_bytes if low_latency else None)
    if low_latency:
        on, off = copy * (local - 1), copy * (ep - local)
        t = _phase(
            [(on, r.nvl, r.on_latency, local - 1), (off, r.nic, r.off_latency, ep - local)], r
        )
        return Dispatch(t, on + off)
    route = Routing(ep, local, 1, top_k, experts, node_limit)
    per_rank = tokens * expected_rows(route, "rank") * row_bytes
    per_node = tokens * expected_rows(route, "node") * row_bytes
    rdma = per_node * (nodes - 1)  # to the same local rank of every other node
    nvl = nodes * per_rank * (local - 1)  # own rows and forwarded ones, to the node's others
    t = max(
        _phase([(rdma, r.nic, r.off_latency, nodes - 1)], r),
        _phase([(nvl, r.nvl, r.on_latency, local - 1)], r),
    )
    return Dispatch(t, rdma + nvl)


def node_limit(model_key: str, nodes: int) -> int | None:
    """Nodes a token of this model may reach on an EP group of ``nodes`` nodes (None: any).
    With at least as many nodes as expert groups, each group is nodes / groups whole nodes and a
    token picks its groups' nodes; with fewer, a group lies inside one node and the limit is the
    groups picked (an upper bound: two picked groups may share a node)."""
    if model_key not in ROUTING_GROUPS:
        return None
    groups, picked = ROUTING_GROUPS[model_key]
    return picked * nodes // groups if nodes >= groups else picked
