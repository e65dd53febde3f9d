"""Flow-level network simulator for all-to-all schedules (Piper Sec. V, X-MoE Sec. 4.2, App. D).

It replays a communication *schedule* -- the (phase, src, dst, nbytes) messages that the real
collectives send, produced by the schedule methods of the registered all-to-all algorithms
(components/alltoall: ``counts_schedule``, ``routed_schedule``) -- on a model of a machine
built from a platform profile (components/network/platforms/*.json). Every number it returns is
a prediction, not a measurement.

The model: one resource per link instance (intra-node switch ports, GPU-pair links or ports;
NICs by GPU affinity; fat-tree, Dragonfly or rail-optimised fabric levels; the host on a local
profile); concurrent flows share them max-min fairly, recomputed whenever a flow starts or ends
(event-driven fluid model); a per-message cost (``network.latency_model``: overlapped LogGP-style
with a window of messages in flight, or serial) and each link class's latency; phases start when
the phases they depend on finish (HALO, Eq. 13: Phase I || (Phase II -> Phase III)). Self
messages are free on a GPU, priced as copies where the profile sets ``network.self_copies``.
Node-symmetric schedules are aggregated over classes of interchangeable nodes, so 1024 nodes x 8
GPUs simulate in seconds. :class:`Machine` ``.assumptions`` lists, with every result, what the
model assumes and leaves out (placement, background traffic, adaptive routing, packet-level
effects, kernel and packing costs, the count exchange).

Why: the all-to-all algorithms are compared on clusters no one here can run; the same schedules
the real collectives send are replayed on the clusters' profiles. The lower bound beside each
prediction is Piper Eq. 6 (the busiest NIC's bytes / B_NIC). The full network model, contention,
per-message cost, aggregation and what is left out: see docs/simulator.md.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from moe_repro.components.provenance import produced
from moe_repro.components.network.platform import (
    ON_NODE_CLASSES,
    Platform,
    fabric_of,
    intra_node_of,
    link_bytes_per_s,
)
from moe_repro.components.network.topology import Topology

GB = 1e9

# topology link class -> profile link classes to read (first present wins)
_PROFILE_CLASS = {
    "intra_node": ("intra_node",),
    "intra_group": ("switch_group", "nic_injection"),
    "inter_group": ("intra_rack", "inter_group", "switch_group", "nic_injection"),
    "inter_rack": ("inter_rack", "inter_group", "intra_rack", "switch_group", "nic_injection"),
}


# --- machine -------------------------------------------------------------------------------


def topology_for(platform: Platform, nodes: int, gpus_per_node: int | None = None) -> Topology:
    """Rank placement for ``nodes`` nodes of ``platform``; ``gpus_per_node`` below the node's
    GPU count uses local GPUs 0..g-1 (their NIC affinity kept). Nodes fill switch groups and
    racks in order (no job-placement effects)."""
    g = int(gpus_per_node or platform.gpus_per_node)
    if not 1 <= g <= platform.gpus_per_node:
        raise ValueError(
            f"gpus_per_node must be in [1, {platform.gpus_per_node}] on {platform.name}, got {g}"
        )
    affinity = platform.raw.get("node", {}).get("gpu_nic_affinity") or []
    nic_of = {}
    for nic, gpus in enumerate(affinity):
        for gpu in gpus:
            nic_of[int(gpu)] = nic
    group = platform.switch_group_nodes
    groups_per_rack = platform.rack_nodes // group if platform.rack_nodes >= group else 0
    return Topology(
        nodes=int(nodes),
        ranks_per_node=g,
        nodes_per_group=group,
        groups_per_rack=groups_per_rack,
        nics_per_node=platform.nics_per_node,
        nic_of_local_rank=tuple(
            nic_of.get(l, l * platform.nics_per_node // platform.gpus_per_node) for l in range(g)
        ),
    )


@dataclass(frozen=True)
class Machine:
    """What the simulator reads from a profile (bytes/s, seconds); see platform.fabric_of and
    platform.intra_node_of for the fabric and intra-node models and their defaults."""

    platform: Platform
    per_message_s: float
    link_latency_s: dict
    link_bytes_per_s: dict
    package_of: tuple
    host_bytes_per_s: float | None
    self_copies: bool  # self-messages are flows on the rank's own port (the local profile)
    latency_model: str  # "overlapped" (default) or "serial"
    window: int  # messages in flight per rank (0: no limit)
    intra: dict  # intra-node model: {"kind": "port" | "switch" | "graph", ...}
    fabric: dict  # {"kind": "fat_tree" | "dragonfly", "levels": [...]} or {"kind": "rail", ...}

    @classmethod
    def from_platform(cls, p: Platform, latency_model: str | None = None) -> "Machine":
        links = {lk["class"]: lk for lk in p.links}
        package_of = {}
        for i, gpus in enumerate(p.raw.get("node", {}).get("gpu_packages") or []):
            for gpu in gpus:
                package_of[int(gpu)] = i
        net = p.raw.get("network", {})
        host = net.get("host_GBps")
        model = latency_model or net.get("latency_model", "overlapped")
        if model not in LATENCY_MODELS:
            raise ValueError(
                f"latency model must be one of {', '.join(LATENCY_MODELS)}, got {model!r}"
            )
        return cls(
            platform=p,
            per_message_s=float(net.get("per_message_us", 0.0)) * 1e-6,
            link_latency_s={c: float(lk.get("latency_us", 0.0)) * 1e-6 for c, lk in links.items()},
            link_bytes_per_s={
                c: link_bytes_per_s(float(lk["GBps"]), c in ON_NODE_CLASSES, p.nvlink_efficiency)
                for c, lk in links.items()
                if "GBps" in lk
            },
            package_of=tuple(package_of.get(l, -1 - l) for l in range(p.gpus_per_node)),
            host_bytes_per_s=float(host) * GB if host else None,
            self_copies=bool(net.get("self_copies", False)),
            latency_model=model,
            window=int(net.get("window", DEFAULT_WINDOW)),
            intra=intra_node_of(p),
            fabric=fabric_of(p),
        )

    def profile_class(self, topo: Topology, src: int, dst: int) -> str:
        """The profile link class a message between two ranks travels on (for its latency)."""
        cls = topo.link_class(src, dst)
        if cls == "intra_node":
            same_pkg = (
                self.package_of[topo.local_rank(src)] == self.package_of[topo.local_rank(dst)]
            )
            if same_pkg and "intra_package" in self.link_latency_s:
                return "intra_package"
        for name in _PROFILE_CLASS[cls]:
            if name in self.link_latency_s:
                return name
        return cls

    def latency(self, pclass: str) -> float:
        return self.link_latency_s.get(pclass, 0.0)

    def pair_capacity(self, pclass: str) -> float:
        p = self.platform
        return self.link_bytes_per_s.get(pclass, p.intra_node_a2a_bytes_per_s)

    def assumptions(self) -> list[str]:
        """Every modelling assumption a number from this machine rests on, in words."""
        p, o_us = self.platform, self.per_message_s * 1e6
        out = [f"platform {p.name}: link bandwidths and latencies as in its profile"]
        if self.latency_model == "serial":
            out.append(
                f"latency model serial: a rank issuing m messages in a phase starts them all "
                f"after m x {o_us:g} us (per_message_us), not overlapped with transfers"
            )
        else:
            window = (
                f"at most {self.window} messages in flight per rank" if self.window else "no window"
            )
            out.append(
                f"latency model overlapped (LogGP-style): each message costs its sender "
                f"{o_us:g} us of issue time (per_message_us), overlapped with the transfers of "
                f"earlier messages; {window}, modelled as a rate cap window x mean message "
                f"size / link latency"
            )
        out.append("each message waits the latency of its link class before its first byte moves")
        if self.self_copies:
            out.append(
                "a rank's rows for itself are copied through its own port and the host at the "
                "link rate, after the link latency like its other bytes, with no issue cost "
                "(network.self_copies)"
            )
        out.append(INTRA_DESCRIPTION[self.intra["kind"]])
        out.append(fabric_description(self.fabric))
        out += LEFT_OUT
        return out


LATENCY_MODELS = ("overlapped", "serial")
# MPICH's MPIR_CVAR_ALLTOALL_THROTTLE default: "max no. of irecvs/isends posted at a time in
# some alltoall algorithms" (src/mpi/coll/alltoall/alltoall.c).
DEFAULT_WINDOW = 32
INTRA_DESCRIPTION = {
    "port": "intra-node: one port per GPU (node.intra_node_alltoall_GBps_per_gpu) shared by all "
    "its intra-node bytes, plus a per-pair link",
    "switch": "intra-node: a non-blocking switch (NVSwitch); each GPU's port carries its own bytes "
    "at full rate to any peer",
    "graph": "intra-node: direct links between GPU pairs (node.intra_node.pairs); pairs without a "
    "listed link use other_pairs_GBps (multi-hop routing through a third GPU not modelled)",
}
LEFT_OUT = [
    "contention is max-min fair between concurrent flows (fluid model; no packets, no congestion "
    "control, no head-of-line blocking)",
    "traffic inside one fabric level is non-blocking; tapers apply only at the levels named",
    "a partly used switch domain keeps taper x the line rate of the job's nodes in it (other jobs "
    "use the rest); job placement: nodes consecutive, domains filled in order",
    "no background traffic from other jobs, no adaptive or non-minimal routing",
    "no kernel-launch, packing or copy costs, no CPU work of the algorithms; the count exchange "
    "before the data phases is left out",
    "issue cost and window are rate caps on a rank's whole phase (its average message size), so a "
    "rank mixing small and large messages is capped by the average; the window cap uses latency "
    "alone (optimistic near the latency-bandwidth knee)",
    "the NIC efficiency of the profile (efficiency.network) is not applied: links run at line rate",
    "expected-routing runs aggregate alike nodes: exact for node-symmetric traffic, group-level "
    "loads averaged otherwise",
]


def fabric_description(f: dict) -> str:
    if f["kind"] == "rail":
        return (
            f"fabric rail-optimised: NIC k of every node on rail switch k of its group of "
            f"{f['rail_group_nodes']} nodes; same-rail traffic inside a group crosses one switch, "
            f"every other inter-node byte goes up to the spine, whose uplinks carry taper "
            f"{f['spine_taper']:g} x the rail switch's downlink rate (no PXN rerouting over NVLink)"
        )
    levels = ", ".join(
        f"{lv['name']} of {lv['nodes']} nodes taper {lv['taper']:g}" for lv in f["levels"]
    )
    if f["kind"] == "dragonfly":
        return (
            f"fabric Dragonfly ({levels}): global links pooled per group, so uniform traffic "
            f"spreads evenly over them (per-arc limits and non-minimal routing not modelled)"
        )
    return f"fabric fat tree ({levels or 'one switch'}): a byte leaving a domain uses its uplinks"


# --- flows and the fluid engine --------------------------------------------------------------


@dataclass
class Flow:
    """``count`` identical flows of ``nbytes`` each (the rate is per flow); ``uses`` maps a
    resource key to the load coefficient on one instance of it (flows per instance)."""

    phase: str
    src: int
    nbytes: float
    count: float
    pclass: str
    uses: dict = field(default_factory=dict)
    release_delay: float = 0.0  # link-class latency before the first byte moves
    release: float = 0.0
    finish: float = 0.0


def max_min_rates(flows: list[Flow], capacity: dict) -> list[float]:
    """Max-min fair rate of each flow (progressive filling; see :class:`_FlowTable`)."""
    if not flows:
        return []
    table = _FlowTable(flows, capacity)
    return table.max_min(np.arange(len(flows))).tolist()


# Shares within this relative distance of each other count as one level (rounding).
_LEVEL_TOLERANCE = 1e-12


def _implied_resources(
    use_flow: np.ndarray,
    use_res: np.ndarray,
    use_coef: np.ndarray,
    families: np.ndarray,
    capacity: np.ndarray,
) -> np.ndarray:
    """Resources that can never be the bottleneck (a mask): every flow on resource r also uses
    a resource of one family (same key kind, e.g. the destination NICs under a spine switch)
    with at least the same coefficient, and those resources' capacities sum to at most r's.
    Then r's load is at most their total load, at most their total capacity, so r never fills
    before them and the max-min rates are the same without it. Dropping such resources (a rail
    spine with spine_taper 1 over its NICs, a fat-tree level with taper 1) keeps them from
    chaining every flow into one sequence of fairness levels. Only a resource with a smaller
    (capacity, index) may stand for another, so no two resources drop each other."""
    R = len(capacity)
    implied = np.zeros(R, dtype=bool)
    n_flows = int(use_flow.max()) + 1 if use_flow.size else 0
    for family in np.unique(families):
        # The flow's first resource of this family stands for the flow's other resources.
        mine = np.flatnonzero(families == family)[::-1]  # reversed: the first use wins below
        pick = np.full(n_flows, -1, dtype=np.int64)
        pick_coef = np.zeros(n_flows)
        pick[use_flow[mine]] = use_res[mine]
        pick_coef[use_flow[mine]] = use_coef[mine]
        q = pick[use_flow]
        lower = (capacity[q] < capacity[use_res]) | (
            (capacity[q] == capacity[use_res]) & (q < use_res)
        )
        ok = (q >= 0) & (q != use_res) & (pick_coef[use_flow] >= use_coef) & lower
        fails = np.zeros(R, dtype=bool)
        fails[use_res[~ok]] = True
        pairs = np.unique(use_res[ok] * R + q[ok])  # (resource, covering resource), once each
        cover = np.bincount(pairs // R, weights=capacity[pairs % R], minlength=R)
        implied |= ~fails & (cover > 0) & (cover <= capacity * (1 + _LEVEL_TOLERANCE))
    return implied


class _FlowTable:
    """Flows and the resources they load, as arrays (one row per (flow, resource) use, in flow
    order), so that each event of :func:`run_flows` solves max-min fairness with a few array
    operations per fairness level instead of rebuilding the problem from Python objects."""

    def __init__(self, flows: list[Flow], capacity: dict):
        keys = {k: i for i, k in enumerate(capacity)}
        flow_list: list[int] = []
        res_list: list[int] = []
        coef_list: list[float] = []
        for i, f in enumerate(flows):
            for k, c in f.uses.items():
                flow_list.append(i)
                res_list.append(keys[k])
                coef_list.append(c)
        self.capacity = np.array([capacity[k] for k in keys], dtype=float)
        family_of: dict = {}
        families = np.array(
            [
                family_of.setdefault(k[0] if isinstance(k, tuple) else k, len(family_of))
                for k in keys
            ],
            dtype=np.int64,
        )
        use_flow = np.array(flow_list, dtype=np.int64)
        use_res = np.array(res_list, dtype=np.int64)
        use_coef = np.array(coef_list, dtype=float)
        kept = ~_implied_resources(use_flow, use_res, use_coef, families[use_res], self.capacity)[
            use_res
        ]
        self.use_flow, self.use_res, self.use_coef = use_flow[kept], use_res[kept], use_coef[kept]
        self.n_flows = len(flows)

    def max_min(self, flows: np.ndarray) -> np.ndarray:
        """Max-min fair rates of the flows ``flows`` (sorted indices), by progressive filling:
        every unfixed flow's rate rises together; a resource whose load (sum of coefficient x
        rate) reaches its capacity fixes its flows at its fair share. Shares only grow as flows
        are fixed (a flow is fixed at the lowest share, at most any other resource's), so every
        resource whose share is the lowest among all resources its unfixed flows use can fix its
        flows in the same round as the global minimum: the rates are those of filling one level
        at a time, in fewer rounds. Flows that use no resource get rate inf."""
        R, A = len(self.capacity), len(flows)
        local = np.full(self.n_flows, -1, dtype=np.int64)
        local[flows] = np.arange(A)
        fl = local[self.use_flow]  # each use's flow, as a position in ``flows``
        use = np.flatnonzero(fl >= 0)  # an index array: cheaper than a boolean mask to apply thrice
        fl, res, coef = fl[use], self.use_res[use], self.use_coef[use]
        rate = np.full(A, math.inf)
        remaining = self.capacity.copy()
        tol = 1 + _LEVEL_TOLERANCE
        with np.errstate(divide="ignore", invalid="ignore"):
            while fl.size:
                load = np.bincount(res, weights=coef, minlength=R)
                share = np.maximum(remaining, 0.0) / load  # inf where a resource has no live use
                use_share = share[res]
                flow_min = np.full(A, math.inf)
                np.minimum.at(flow_min, fl, use_share)
                if not np.isfinite(flow_min).any():
                    break  # only unlimited resources left
                # A resource is ready when no flow on it has a lower share elsewhere; a flow on a
                # ready resource has its lowest share there (to within tol) and is fixed at it.
                not_ready = (
                    np.bincount(res, weights=flow_min[fl] * tol < use_share, minlength=R) > 0
                )
                fixed = np.bincount(fl, weights=~not_ready[res], minlength=A) > 0
                rate[fixed] = flow_min[fixed]
                done = fixed[fl]
                # zeros for the unfixed flows' uses: the sums are those over the fixed ones
                remaining -= np.bincount(
                    res, weights=np.where(done, coef * rate[fl], 0.0), minlength=R
                )
                keep = np.flatnonzero(~done)  # indices, as above
                fl, res, coef = fl[keep], res[keep], coef[keep]
        return rate


def run_flows(
    flows: list[Flow],
    capacity: dict,
    dependencies: dict[str, list[str]],
    rank_messages: dict,
    per_message_s: float = 0.0,
    progress=None,
) -> dict:
    """Event-driven fluid run. ``rank_messages[(rank, phase)]`` = messages that rank issues in
    the phase (per-message overhead). Returns phase start/end times and the total time.

    Between two events (a flow ends, or a released flow starts) every active flow moves at its
    max-min fair rate; the rates are recomputed at each event. Sets each flow's ``release`` and
    ``finish``. ``progress(finished, total)``, when given, is called after every event (flows
    finished so far, of all)."""
    produced("simulated")
    phases = list(dict.fromkeys([*dependencies, *(f.phase for f in flows)]))
    n = len(flows)
    table = _FlowTable(flows, capacity)
    nbytes = np.array([float(f.nbytes) for f in flows], dtype=float)
    delay = np.array(
        [per_message_s * rank_messages.get((f.src, f.phase), 0) + f.release_delay for f in flows],
        dtype=float,
    )
    listed: dict[str, list[int]] = {ph: [] for ph in phases}
    for i, f in enumerate(flows):
        listed[f.phase].append(i)
    of_phase = {ph: np.array(ix, dtype=np.int64) for ph, ix in listed.items()}
    phase_number = {ph: i for i, ph in enumerate(phases)}
    phase_of = np.array([phase_number[f.phase] for f in flows], dtype=np.int64)
    unfinished = [len(of_phase[ph]) for ph in phases]  # flows of each phase not finished yet
    end_within = np.maximum(1e-9 * nbytes, 1e-12)  # bytes left that count as finished (rounding)
    remaining = nbytes.copy()
    release = np.full(n, math.inf)
    finish = np.zeros(n)
    waiting = np.zeros(n, dtype=bool)  # released, not yet moving
    active = np.zeros(n, dtype=bool)
    start: dict[str, float] = {}
    end: dict[str, float] = {}
    pending = list(phases)
    now = 0.0
    n_waiting = n_done = 0

    def release_ready():
        nonlocal n_waiting
        progress = True
        while progress:  # an empty phase ends as it starts and may release its dependents
            progress = False
            for ph in list(pending):
                deps = dependencies.get(ph, [])
                if ph in start or not all(d in end for d in deps):
                    continue
                t0 = max([end[d] for d in deps], default=0.0)
                start[ph] = t0
                ix = of_phase[ph]
                release[ix] = t0 + delay[ix]
                waiting[ix] = True
                n_waiting += ix.size
                if not ix.size:
                    end[ph] = t0
                    pending.remove(ph)
                    progress = True

    def close_phases():
        changed = False
        for ph in list(pending):
            ix = of_phase[ph]
            if ph in start and ph not in end and not unfinished[phase_number[ph]]:
                end[ph] = float(finish[ix].max()) if ix.size else start[ph]
                pending.remove(ph)
                changed = True
        return changed

    release_ready()
    while pending:
        if n_waiting:
            moving = waiting & (release <= now + 1e-18)
            active |= moving
            waiting &= ~moving
            n_waiting -= int(np.count_nonzero(moving))
        if not active.any():
            if n_waiting:
                now = float(release[waiting].min())
                continue
            if close_phases():
                release_ready()
                continue
            raise RuntimeError(f"phases {sorted(pending)} can never start (dependency cycle?)")
        idx = np.flatnonzero(active)
        rates = table.max_min(idx)
        horizon = float(release[waiting].min()) - now if n_waiting else math.inf
        left = remaining[idx]
        with np.errstate(divide="ignore", invalid="ignore"):
            to_end = np.where(rates > 0, left / rates, math.inf)
        dt = min(float(to_end.min()), horizon)
        if not math.isfinite(dt):
            raise RuntimeError("a flow has no bandwidth (zero-capacity resource)")
        now += dt
        left = np.where(np.isfinite(rates), left - rates * dt, 0.0)
        ended = left <= end_within[idx]
        left[ended] = 0.0
        remaining[idx] = left
        finished = idx[ended]
        finish[finished] = now
        active[finished] = False
        n_done += finished.size
        for ph, count in enumerate(np.bincount(phase_of[finished], minlength=len(phases)).tolist()):
            unfinished[ph] -= count
        if progress is not None:
            progress(n_done, n)
        if close_phases():
            release_ready()
    for i, f in enumerate(flows):
        f.release, f.finish = float(release[i]), float(finish[i])
    return {"time_s": max(end.values(), default=0.0), "phase_start_s": start, "phase_end_s": end}


# --- building flows from a schedule ----------------------------------------------------------


@dataclass
class SimResult:
    """One simulated collective. All times in seconds; every number is simulated."""

    time_s: float
    eq6_bound_s: float
    phase_end_s: dict
    link_bytes: dict  # bytes per topology link class, whole world
    flows: int  # flow records simulated (after aggregation)
    latency_model: str = "overlapped"
    assumptions: tuple[str, ...] = ()  # every modelling assumption the time rests on
    simulated: bool = True

    def to_dict(self) -> dict:
        return {
            "time_s": self.time_s,
            "eq6_bound_s": self.eq6_bound_s,
            "phase_end_s": self.phase_end_s,
            "link_bytes": self.link_bytes,
            "flows": self.flows,
            "simulated": True,
            "latency_model": self.latency_model,
            "assumptions": list(self.assumptions),
        }


def _flow_uses(
    m: Machine,
    topo: Topology,
    src_key,
    dst_key,
    src: int,
    dst: int,
    out_coef: float,
    in_coef: float,
    per_node_share: bool,
    host_coef: float | None = None,
) -> dict:
    """Resources of one message class and its coefficients. ``src_key``/``dst_key`` name the
    node instance (a node id, or a node class in aggregated mode, where fabric uplinks are
    per-node shares)."""
    uses: dict[tuple, float] = {}
    ls, ld = topo.local_rank(src), topo.local_rank(dst)
    a, b = topo.node_of(src), topo.node_of(dst)
    if a == b:
        if m.intra["kind"] in ("port", "switch"):
            uses[("gpu_tx", src_key, ls)] = out_coef
            uses[("gpu_rx", dst_key, ld)] = in_coef
        if m.intra["kind"] in ("port", "graph"):
            uses[("pair", src_key, ls, ld)] = out_coef
    else:
        i, j = topo.nic_of(src), topo.nic_of(dst)
        uses[("nic_tx", src_key, i)] = out_coef
        uses[("nic_rx", dst_key, j)] = in_coef
        f = m.fabric
        if f["kind"] == "rail":
            # One rail switch per NIC index and group: only same-rail traffic inside a group
            # stays below the spine.
            size = f["rail_group_nodes"]
            if i != j or a // size != b // size:
                uses[("spine_up", src_key if per_node_share else a // size, i)] = out_coef
                uses[("spine_down", dst_key if per_node_share else b // size, j)] = in_coef
        else:
            for level, lv in enumerate(f["levels"]):
                if a // lv["nodes"] != b // lv["nodes"]:
                    uses[("up", level, src_key if per_node_share else a // lv["nodes"])] = out_coef
                    uses[("down", level, dst_key if per_node_share else b // lv["nodes"])] = in_coef
    if m.host_bytes_per_s:
        # One shared machine: every byte moved, by every node, counts once on it.
        uses[("host",)] = out_coef if host_coef is None else host_coef
    return uses


def _route(m: Machine, topo: Topology, src: int, dst: int) -> int:
    """Which fabric resources a message crosses beyond its NICs, as a number: for a tree, how
    many levels it leaves (levels nest); for rails, 1 if it goes through the spine. Messages
    merged into one aggregated flow must agree on it."""
    a, b = topo.node_of(src), topo.node_of(dst)
    if a == b:
        return 0
    f = m.fabric
    if f["kind"] == "rail":
        size = f["rail_group_nodes"]
        return int(topo.nic_of(src) != topo.nic_of(dst) or a // size != b // size)
    return sum(a // lv["nodes"] != b // lv["nodes"] for lv in f["levels"])


def _nodes_in(domain: int, size: int, nodes: int) -> int:
    """Nodes of the job in one domain of ``size`` consecutive nodes (the last may be partial)."""
    return min(size, nodes - domain * size)


def _capacity(m: Machine, topo: Topology, keys, per_node_share: bool) -> dict:
    p = m.platform
    nic = p.nic_bytes_per_s
    node_line = p.nics_per_node * nic
    cap = {}
    for k in keys:
        kind = k[0]
        if kind in ("gpu_tx", "gpu_rx"):
            cap[k] = (
                m.intra["bytes_per_s"]
                if m.intra["kind"] == "switch"
                else p.intra_node_a2a_bytes_per_s
            )
        elif kind == "pair":
            if m.intra["kind"] == "graph":
                cap[k] = m.intra["pairs"].get((k[2], k[3]), m.intra["other_bytes_per_s"])
            else:
                pkg = m.package_of
                same = pkg[k[2]] == pkg[k[3]] and "intra_package" in m.link_bytes_per_s
                cap[k] = m.pair_capacity("intra_package" if same else "intra_node")
        elif kind in ("nic_tx", "nic_rx"):
            cap[k] = nic
        elif kind in ("up", "down"):
            lv = m.fabric["levels"][k[1]]
            nodes = 1 if per_node_share else _nodes_in(k[2], lv["nodes"], topo.nodes)
            cap[k] = lv["taper"] * node_line * nodes
        elif kind in ("spine_up", "spine_down"):
            size = m.fabric["rail_group_nodes"]
            nodes = 1 if per_node_share else _nodes_in(k[1], size, topo.nodes)
            cap[k] = m.fabric["spine_taper"] * nic * nodes
        elif kind == "host":
            cap[k] = m.host_bytes_per_s
        else:
            raise KeyError(k)
    return cap


def _add_issue_limits(m: Machine, flows: list, cap: dict) -> None:
    """Overlapped latency model: each rank's sending in a phase is capped by its issue rate
    (bytes / (messages x per_message_s): issuing m messages takes m x o, overlapped with the
    transfers) and by its window (window x mean message size / mean latency: at most ``window``
    messages in flight, each holding its slot for at least one latency; Little's law)."""
    if m.latency_model != "overlapped":
        return
    stats: defaultdict[tuple, list[float]] = defaultdict(
        lambda: [0.0, 0.0, 0.0]
    )  # (src, phase) -> bytes, messages, latency sum
    for f in flows:
        st = stats[(f.src, f.phase)]
        st[0] += f.nbytes * f.count
        st[1] += f.count
        st[2] += f.release_delay * f.count
    for (src, phase), (nbytes, msgs, latency) in stats.items():
        limits = []
        if m.per_message_s > 0 and msgs > 1:  # the first message's issue delays the start
            limits.append(nbytes / ((msgs - 1) * m.per_message_s))
        if m.window and latency > 0:
            limits.append(m.window * (nbytes / msgs) / (latency / msgs))
        if limits:
            cap[("issue", src, phase)] = min(limits)
    for f in flows:
        if ("issue", f.src, f.phase) in cap:
            f.uses[("issue", f.src, f.phase)] = f.count


def _eq6_bound(nic_bytes: dict, p: Platform) -> float:
    return max(nic_bytes.values(), default=0.0) / p.nic_bytes_per_s


def _issue_counts(m: Machine, counts: dict) -> dict:
    """Messages whose issue cost a rank pays before its first byte moves: all of them in the
    serial model; in the overlapped model only the first (the rest overlap with transfers and
    are charged by the issue-rate cap), so one message costs o + L + bytes/B in both."""
    return counts if m.latency_model == "serial" else {k: min(v, 1) for k, v in counts.items()}


def simulate_messages(
    messages,
    topo: Topology,
    platform: Platform,
    dependencies: dict[str, list[str]],
    latency_model: str | None = None,
    progress=None,
) -> SimResult:
    """Per-message simulation of an explicit schedule: every (phase, src, dst, nbytes) message
    is one flow on the resources of its own nodes. Self-messages are local copies (no link), or,
    where the profile sets ``network.self_copies``, flows on the rank's own port and the host.
    ``progress(finished, total)``: see :func:`run_flows`."""
    from moe_repro.components.network.topology import bytes_by_link_class

    m = Machine.from_platform(platform, latency_model)
    flows: list[Flow] = []
    counts: defaultdict[tuple, int] = defaultdict(int)
    nic_bytes: defaultdict[tuple, float] = defaultdict(float)
    for phase, src, dst, nbytes in messages:
        if nbytes <= 0 or (src == dst and not m.self_copies):
            continue
        pclass = m.profile_class(topo, src, dst)
        f = Flow(
            phase=phase,
            src=src,
            nbytes=float(nbytes),
            count=1.0,
            pclass=pclass,
            uses=_flow_uses(
                m, topo, topo.node_of(src), topo.node_of(dst), src, dst, 1.0, 1.0, False
            ),
            release_delay=m.latency(pclass),
        )
        flows.append(f)
        if (
            src == dst
        ):  # network.self_copies: a copy on the rank's own port and the host, no message
            continue
        counts[(src, phase)] += 1
        if topo.is_inter_node(src, dst):
            nic_bytes[("tx", topo.node_of(src), topo.nic_of(src))] += nbytes
            nic_bytes[("rx", topo.node_of(dst), topo.nic_of(dst))] += nbytes
    keys = {k for f in flows for k in f.uses}
    cap = _capacity(m, topo, keys, per_node_share=False)
    _add_issue_limits(m, flows, cap)
    run = run_flows(flows, cap, dependencies, _issue_counts(m, counts), m.per_message_s, progress)
    return SimResult(
        time_s=run["time_s"],
        eq6_bound_s=_eq6_bound(nic_bytes, platform),
        phase_end_s=run["phase_end_s"],
        link_bytes=bytes_by_link_class(messages, topo),
        flows=len(flows),
        latency_model=m.latency_model,
        assumptions=tuple(m.assumptions()),
    )


# --- aggregated simulation of expected routing ------------------------------------------------


def node_classes(rows_to: Sequence[float], topo: Topology) -> tuple[list[int], list[int]]:
    """(class of every node, representative node of every class): nodes whose ranks receive the
    same rows, local rank by local rank, are interchangeable."""
    R = topo.ranks_per_node
    pattern_class: dict[tuple, int] = {}
    cls_of: list[int] = []
    reps: list[int] = []
    for n in range(topo.nodes):
        key = tuple(rows_to[n * R : (n + 1) * R])
        if key not in pattern_class:
            pattern_class[key] = len(reps)
            reps.append(n)
        cls_of.append(pattern_class[key])
    return cls_of, reps


def simulate_expected(
    schedule_fn,
    rows_to: list[int],
    topo: Topology,
    platform: Platform,
    dependencies: dict[str, list[str]],
    latency_model: str | None = None,
) -> SimResult:
    """Aggregated simulation when every source rank sends ``rows_to[d]`` rows to rank d.

    ``schedule_fn(C, ranks)`` must return the algorithm's (phase, src, dst, nbytes) messages of
    the source ranks ``ranks`` for counts matrix C (the shared schedule functions with
    ``ranks=``). It is called once, for the ranks of one representative node per class; their
    messages are explicit (one per destination), and identical ones merge into one flow record.
    """
    N = topo.world_size
    if len(rows_to) != N:
        raise ValueError(f"rows_to has {len(rows_to)} entries, world has {N} ranks")
    rows_to = [int(r) for r in rows_to]
    C = [rows_to] * N  # every row the same list: O(N) memory for an N x N matrix
    m = Machine.from_platform(platform, latency_model)
    cls_of, reps = node_classes(rows_to, topo)
    size: defaultdict[int, int] = defaultdict(int)
    for c in cls_of:
        size[c] += 1
    messages = schedule_fn(C, [r for n in reps for r in topo.node_ranks(n)])

    merged: dict[tuple, list] = {}
    for phase, src, dst, nbytes in messages:
        if nbytes <= 0 or (src == dst and not m.self_copies):
            continue
        key = (
            phase,
            src,
            cls_of[topo.node_of(dst)],
            topo.local_rank(dst),
            "self" if src == dst else topo.link_class(src, dst),
            m.profile_class(topo, src, dst),
            _route(m, topo, src, dst),
            float(nbytes),
        )
        rec = merged.setdefault(key, [0, dst])
        rec[0] += 1

    flows = []
    counts: defaultdict[tuple, float] = defaultdict(float)
    link_bytes: defaultdict[str, float] = defaultdict(float)
    nic_bytes: defaultdict[tuple, float] = defaultdict(float)
    for (phase, src, B, _ld, lclass, pclass, _route_key, nbytes), (count, dst) in merged.items():
        A = cls_of[topo.node_of(src)]
        # ``count`` flows leave one node of class A; one node of class B receives, on average,
        # count * |A| / |B| of them (every node of A sends the same).
        in_coef = count * size[A] / size[B]
        f = Flow(
            phase=phase,
            src=src,
            nbytes=nbytes,
            count=count,
            pclass=pclass,
            uses=_flow_uses(
                m,
                topo,
                ("c", A),
                ("c", B),
                src,
                dst,
                count,
                in_coef,
                True,
                host_coef=count * size[A],
            ),
            release_delay=m.latency(pclass),
        )
        flows.append(f)
        if lclass == "self":  # network.self_copies: a copy, on no link, issued as no message
            continue
        counts[(src, phase)] += count
        link_bytes[lclass] += nbytes * count * size[A]
        if lclass != "intra_node":
            nic_bytes[("tx", A, topo.nic_of(src))] += nbytes * count
            nic_bytes[("rx", B, topo.nic_of(dst))] += nbytes * in_coef
    keys = {k for f in flows for k in f.uses}
    cap = _capacity(m, topo, keys, per_node_share=True)
    _add_issue_limits(m, flows, cap)
    run = run_flows(flows, cap, dependencies, _issue_counts(m, counts), m.per_message_s)
    lb = {
        c: int(round(link_bytes.get(c, 0.0)))
        for c in ("intra_node", "intra_group", "inter_group", "inter_rack")
    }
    lb["inter_node"] = lb["intra_group"] + lb["inter_group"] + lb["inter_rack"]
    return SimResult(
        time_s=run["time_s"],
        eq6_bound_s=_eq6_bound(nic_bytes, platform),
        phase_end_s=run["phase_end_s"],
        link_bytes=lb,
        flows=len(flows),
        latency_model=m.latency_model,
        assumptions=tuple(m.assumptions()),
    )


# --- calibration (local profile) -------------------------------------------------------------


def calibrated_profile(
    alpha_s: float, beta_bytes_per_s: float, gpus_per_node: int = 1, host_cores: int | None = None
) -> Platform:
    """A local profile from a Hockney fit of real runs (t = alpha + bytes / beta:
    :func:`fit_alltoall_terms` of runs that each send one message, terms (0, 1, bytes)):
    per-message cost alpha, every link (port, pair, NIC) at bandwidth beta. Emulated nodes are
    processes of one machine, so no link class is faster than another. ``host_cores``: the
    fit's ranks each had a core, so the machine moves at most ``host_cores * beta`` in total
    (more ranks than cores share them: the ``host`` resource)."""
    from moe_repro.components.network.platform import from_dict

    g = int(gpus_per_node)
    bw = beta_bytes_per_s / GB
    return from_dict(
        {
            "name": "local (calibrated)",
            "gpu": {
                "peak_tflops": 1,
                "hbm_GB": 1,
                "hbm_GBps": bw,
                "achievable_gemm_tflops": 1,
                "achievable_attention_tflops": 1,
            },
            "node": {
                "gpus": g,
                "nics": g,
                "nic_GBps": bw,
                "gpu_nic_affinity": [[i] for i in range(g)],
                "intra_node_alltoall_GBps_per_gpu": bw,
            },
            "network": {
                "switch_group_nodes": 1,
                "rack_nodes": 1,
                "per_message_us": alpha_s * 1e6,
                **({"host_GBps": host_cores * bw} if host_cores else {}),
            },
            "links": [
                {"class": "intra_node", "GBps": bw, "latency_us": 0.0},
                {"class": "nic_injection", "GBps": bw, "latency_us": 0.0},
            ],
        }
    )


# --- calibration: the local all-to-all's latency, per-message cost and bandwidth from real runs ---
# (repro calibrate, the alltoall-validation suite, and piper-fig5's Hockney line, the case of one
# message per run): the simulator's own serial latency model fitted to real runs of several
# ranks counts and sizes, so that a profile built from the fit reproduces the fit set.

ALLTOALL_FIT_FORM = (
    "serial latency model, fitted by least squares on relative error: a rank issuing m messages "
    "in a phase starts moving bytes after m x o + L (o = network.per_message_us, L = the link's "
    "latency_us) and then moves them at beta (every link, port and NIC; the machine as a whole at "
    "host_cores x beta); a run's time t = n_L x L + n_o x o + B / beta, where n_L (latencies on the "
    "critical path), n_o (messages issued on it) and B (bytes, host sharing included) are read off "
    "the simulator for the run's real messages (a rank's copies to itself included: "
    "network.self_copies)"
)
_UNBOUNDED_Bps = 1e18  # bandwidth so high that bytes take no time (reads off the latency terms)


def local_alltoall_profile(
    latency_s: float,
    per_message_s: float,
    bytes_per_s: float,
    gpus_per_node: int,
    host_cores: int | None = None,
) -> dict:
    """A local profile document (ranks of this machine as "GPUs", emulated nodes of
    ``gpus_per_node`` ranks) whose all-to-all costs are those of an all-to-all fit; see
    :func:`apply_alltoall_fit` for what is set."""
    g = int(gpus_per_node)
    doc = {
        "name": "local (calibrated all-to-all)",
        "gpu": {
            "peak_tflops": 1,
            "hbm_GB": 1,
            "hbm_GBps": 1,
            "achievable_gemm_tflops": 1,
            "achievable_attention_tflops": 1,
        },
        "node": {
            "gpus": g,
            "nics": 1,
            "nic_GBps": 1,
            "gpu_nic_affinity": [list(range(g))],
            "intra_node_alltoall_GBps_per_gpu": 1,
        },
        "network": {"switch_group_nodes": 1, "rack_nodes": 1},
        "links": [
            {"class": "intra_node", "GBps": 1, "latency_us": 0.0},
            {"class": "nic_injection", "GBps": 1, "latency_us": 0.0},
        ],
    }
    return apply_alltoall_fit(
        doc,
        {"latency_s": latency_s, "per_message_s": per_message_s, "bytes_per_s": bytes_per_s},
        host_cores,
    )


def apply_alltoall_fit(doc: dict, fit: dict, host_cores: int | None = None) -> dict:
    """Write an all-to-all fit (``latency_s``, ``per_message_s``, ``bytes_per_s``) into a profile
    document, in place, and return it. Every rank gets its own port and NIC at beta (one process
    sends its own bytes whichever emulated node the peer is on), every link class beta and
    latency L, network.per_message_us o, the serial latency model (the form that was fitted),
    ``host_GBps`` = host_cores x beta: ranks beyond the cores share them, and
    ``network.self_copies``: a rank's rows for itself move through its port like a peer's."""
    g = int(doc["node"]["gpus"])
    bw = fit["bytes_per_s"] / GB
    doc["node"].update(
        nics=g,
        nic_GBps=bw,
        gpu_nic_affinity=[[i] for i in range(g)],
        intra_node_alltoall_GBps_per_gpu=bw,
    )
    doc["node"].pop("intra_node", None)  # the per-GPU port model is what was fitted
    net = doc.setdefault("network", {})
    net.update(per_message_us=fit["per_message_s"] * 1e6, latency_model="serial")
    net.pop("fabric", None)
    if host_cores:
        net["host_GBps"] = host_cores * bw
    # A CPU rank's all-to-all copies its rows for itself as it copies a peer's (MPI and gloo
    # alike): free on a GPU, not here. Without them one fitted bandwidth cannot serve runs whose
    # own share differs (node-wide runs keep half their bytes, world-wide ones 1/ranks).
    net["self_copies"] = True
    for link in doc["links"]:
        link.update(GBps=bw, latency_us=fit["latency_s"] * 1e6)
    return doc


def chained(dependencies: dict[str, list[str]]) -> dict[str, list[str]]:
    """The same phases one after another, in the order they are listed (the order a dispatcher
    issues them): what a rank's phases become where running two at once gains nothing (a host
    whose cores the ranks already fill: alltoall-validation measures how much two collectives
    at once overlap there). A chain stays the same chain."""
    names = list(dependencies)
    return {name: names[i - 1 : i] for i, name in enumerate(names)}


def blend_overlap(overlapped_s: float, chained_s: float, overlap: float) -> float:
    """A schedule's time where its concurrent phases overlap by the fraction ``overlap`` (1: as
    the dependencies allow, 0: one after another): overlap x overlapped + (1 - overlap) x
    chained, linear between the two dependency models (an assumption: the fraction is measured
    on two exchanges at once, not on the schedule's own phases)."""
    if not 0.0 <= overlap <= 1.0:
        raise ValueError(f"overlap must lie in [0, 1], got {overlap}")
    return overlap * overlapped_s + (1.0 - overlap) * chained_s


def alltoall_time_terms(
    messages, topo: Topology, dependencies: dict[str, list[str]], host_cores: int | None = None
) -> tuple[float, float, float]:
    """(n_L, n_o, B) of a schedule on a local profile (see ALLTOALL_FIT_FORM): the simulated time
    with L = 1 s alone, with o = 1 s alone, and x 1 B/s with beta alone. The serial model's time
    is their sum t = n_L L + n_o o + B / beta exactly when one chain of phases and one rank decide
    it for every (L, o, beta) (a flat all-to-all: counts, then data); otherwise the sum is an
    upper bound, and the fit's residuals, simulated at the fitted values, say how far off."""
    from moe_repro.components.network.platform import from_dict

    g = topo.ranks_per_node

    def time(latency_s, per_message_s, bytes_per_s):
        p = from_dict(local_alltoall_profile(latency_s, per_message_s, bytes_per_s, g, host_cores))
        return simulate_messages(messages, topo, p, dependencies, latency_model="serial").time_s

    n_latency = time(1.0, 0.0, _UNBOUNDED_Bps)
    n_messages = time(0.0, 1.0, _UNBOUNDED_Bps)
    nbytes = time(0.0, 0.0, GB) * GB  # seconds at 1 GB/s -> bytes
    return n_latency, n_messages, nbytes


def fit_alltoall_terms(
    terms: list[tuple[float, float, float]],
    times_s: list[float],
    known_s: list[float] | None = None,
    groups: list | None = None,
    per_message_by_group: bool = False,
) -> dict:
    """Non-negative least squares of t = n_L L + n_o o + B / beta + k on relative error (each run
    weighs the same whatever its size: 1 KiB and 16 MiB runs differ by 10^4 in time), where k is
    a known part of each run's time (``known_s``, default 0: the run's host work, profiled
    apart). With ``groups`` (one label per run, e.g. its ranks count) each group gets
    its own latency L_g: the cost of a phase's synchronisation, which on a shared machine grows
    with the ranks that must all be scheduled (ranks past the cores wait for a time slice); with
    ``per_message_by_group`` too, its own per-message cost o_g (a group's runs must then differ
    in messages per phase, e.g. world-wide and node-wide exchanges, or L_g and o_g cannot be told
    apart: o_g is then held at 0, L_g pricing the whole phase).
    Returns latency_s (the runs' median L when grouped), latency_s_by_group, per_message_s (the
    runs' median o when grouped per message), per_message_s_by_group, bytes_per_s and residuals
    (t_fit / t_measured - 1 per run, k included). An L or o may come out 0 (the runs cannot tell
    them apart, or they are negligible); beta never does."""
    from itertools import combinations

    if len(terms) != len(times_s) or len(terms) < 2:
        raise ValueError("need at least two runs (terms and times of equal length)")
    A3 = np.asarray(terms, float)
    t = np.asarray(times_s, float)
    k = np.zeros_like(t) if known_s is None else np.asarray(known_s, float)
    if (
        A3.ndim != 2
        or A3.shape[1] != 3
        or not np.all(np.isfinite(A3))
        or not np.all(t > 0)
        or k.shape != t.shape
        or not np.all(k >= 0)
    ):
        raise ValueError("terms must be (n_L, n_o, B) triples, times positive, known parts >= 0")
    labels = [None] * len(t) if groups is None else list(groups)
    if len(labels) != len(t):
        raise ValueError("one group label per run")
    names = sorted(set(labels), key=str)
    G, n_o_cols = len(names), len(names) if per_message_by_group else 1
    # columns: one n_L per group, then one n_o per group (or one shared), then B
    A = np.zeros((len(t), G + n_o_cols + 1))
    for i, g in enumerate(labels):
        A[i, names.index(g)] = A3[i, 0]
        A[i, G + (names.index(g) if per_message_by_group else 0)] = A3[i, 1]
    A[:, -1] = A3[:, 2]
    # A group whose runs all issue as many messages per phase (n_o / n_L the same: a world of one
    # node) cannot tell o_g from L_g: its o_g is held at 0 and L_g prices the whole phase (any
    # split predicts the same for such runs).
    untold = [
        g
        for g in names
        if per_message_by_group
        and np.linalg.matrix_rank(A3[[i for i, lab in enumerate(labels) if lab == g]][:, :2]) < 2
    ]
    for g in untold:
        A[:, G + names.index(g)] = 0.0
    W = A / t[:, None]  # relative residual: (A x + k - t) / t
    target = 1.0 - k / t
    best = None
    # Every subset of the unknowns that keeps the bandwidth; the feasible (non-negative) solution
    # with the smallest residual is the NNLS optimum (a handful of unknowns: few subsets).
    others = [j for j in range(A.shape[1] - 1) if A[:, j].any()]
    for size in range(len(others), -1, -1):
        for chosen in combinations(others, size):
            keep = [*chosen, A.shape[1] - 1]
            x_sub, *_ = np.linalg.lstsq(W[:, keep], target, rcond=None)
            if np.any(x_sub < 0):
                continue
            x = np.zeros(A.shape[1])
            x[keep] = x_sub
            ssr = float(np.sum((W @ x - target) ** 2))
            if best is None or ssr < best[0] - 1e-15:
                best = (ssr, x)
    if best is None or best[1][-1] <= 0:
        raise ValueError("time does not grow with bytes: cannot fit a bandwidth")
    x = best[1]
    by_group = {g: float(x[i]) for i, g in enumerate(names)}
    o_by_group = {g: float(x[G + (i if per_message_by_group else 0)]) for i, g in enumerate(names)}
    latency = float(np.median([by_group[g] for g in labels]))
    per_message = float(np.median([o_by_group[g] for g in labels]))
    return {
        "latency_s": latency,
        "latency_s_by_group": by_group,
        "per_message_s": per_message,
        "per_message_s_by_group": o_by_group,
        "bytes_per_s": 1.0 / float(x[-1]),
        "residuals": [float(r) for r in (A @ x + k) / t - 1.0],
    }


# --- expert-parallel dispatch / combine kernels ----------------------------------------------
# The kernels of the EP libraries (DeepEP, Hybrid-EP, UCCL-EP): GPU-initiated, each rank's
# bytes to one peer move as one pipelined stream of chunks, so a (source, destination) pair is
# one flow here; the routing's expected rows come from ep_units (uniform or node-limited).

EP_KERNELS = ("normal", "low_latency")


def ep_kernel_messages(r, kernel: str, row_bytes: float) -> tuple[list, dict]:
    """The (phase, src, dst, nbytes) flows of one EP dispatch (a combine moves the same rows
    back) for routing ``r`` (ep_units.Routing), and the phases' dependencies.

    ``normal`` (DeepEP normal kernels, Hybrid-EP, UCCL-EP; HALO's node-level send): a token
    crosses the network once per destination node it reaches, to the rank of the same local
    index there (phase "rdma"), which forwards it over NVLink to the node's ranks that hold its
    experts (phase "nvl", with the ranks' own rows for their node); the kernels forward chunks
    as they arrive, so the two phases run at once. On one node only "nvl" runs.
    ``low_latency`` (DeepEP low-latency kernels): every top-k selection is sent to its expert's
    rank directly, NVLink inside the node and the NIC across (no node deduplication)."""
    from moe_repro.components.network.ep_units import expected_rows

    if kernel not in EP_KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(EP_KERNELS)}, got {kernel!r}")
    g, nodes = r.local, r.nodes
    out = []
    if kernel == "low_latency":
        nbytes = expected_rows(r, "selection") * row_bytes
        for s in range(r.ep):
            out += [("ll", s, d, nbytes) for d in range(r.ep) if d != s]
        return out, {"ll": []}
    per_rank = expected_rows(r, "rank") * row_bytes
    per_node = expected_rows(r, "node") * row_bytes
    for n in range(nodes):
        for l in range(g):
            s = n * g + l
            out += [("rdma", s, m * g + l, per_node) for m in range(nodes) if m != n]
            # rows for the node's other ranks: this rank's own and those it forwards for the
            # same local index of every other node
            out += [("nvl", s, n * g + k, nodes * per_rank) for k in range(g) if k != l]
    return out, {"rdma": [], "nvl": []}


def ep_nic_rate_GBps(platform: Platform, message_bytes: float | None = None) -> float | None:
    """What one GPU's EP-kernel traffic reaches on its NIC (GB/s), or None where the profile's
    ``ep_kernels`` section sets neither a put rate nor a message rate: ``nic_GBps`` (a
    GPU-initiated put's rate on large messages), capped, for messages of ``message_bytes``, by
    ``nic_message_rate_Mps`` x message size (a NIC that processes at most that many messages a
    second, whatever their size)."""
    ep = platform.raw.get("ep_kernels", {})
    rates = [float(ep["nic_GBps"])] if "nic_GBps" in ep else []
    if message_bytes and "nic_message_rate_Mps" in ep:
        rates.append(float(ep["nic_message_rate_Mps"]) * 1e6 * message_bytes / GB)
    return min(rates) if rates else None


def ep_kernel_platform(platform: Platform, message_bytes: float | None = None) -> Platform:
    """The profile as the EP kernels see it: where the profile's ``ep_kernels`` section gives
    what a GPU-initiated put reaches (``nic_GBps``: a NIC, capped for messages of
    ``message_bytes`` by ``nic_message_rate_Mps``, :func:`ep_nic_rate_GBps`; ``nvlink_GBps``: a
    GPU's NVLink, at application level, so efficiency.nvlink is not applied again), those rates
    replace the NIC's and the NVSwitch port's line rates; ``put_latency_us`` (``nvlink``,
    ``network``: one put's one-way latency, from a put ping-pong micro-benchmark) replaces the
    links' latencies; the per-flow issue cost is ``per_message_us`` (0 when absent) and there is
    no in-flight window (network.window is a host all-to-all's throttle). Every value the
    section sets says its source in the profile."""
    import copy

    from moe_repro.components.network.platform import from_dict

    doc = copy.deepcopy(platform.raw)
    ep = doc.get("ep_kernels", {})
    net = doc.setdefault("network", {})
    net.update(per_message_us=float(ep.get("per_message_us", 0.0)), window=0)
    nic = ep_nic_rate_GBps(platform, message_bytes)
    if nic is not None:
        doc["node"]["nic_GBps"] = min(float(doc["node"]["nic_GBps"]), nic)
        for link in doc.get("links", []):
            if link["class"] not in ("intra_node", "intra_package") and "GBps" in link:
                link["GBps"] = min(float(link["GBps"]), nic)
    lat = ep.get("put_latency_us", {})
    for link in doc.get("links", []):
        on_node = link["class"] in ("intra_node", "intra_package")
        key = "nvlink" if on_node else "network"
        if key in lat:
            link["latency_us"] = float(lat[key])
    if "nvlink_GBps" in ep:
        rate = float(ep["nvlink_GBps"])
        doc["node"]["intra_node"] = {"kind": "switch", "GBps_per_gpu": rate}
        doc["node"]["intra_node_alltoall_GBps_per_gpu"] = rate
        doc.setdefault("efficiency", {})["nvlink"] = 1.0
        for link in doc.get("links", []):
            if link["class"] == "intra_node":
                link["GBps"] = rate
    return from_dict(doc)


def simulate_ep_kernel(platform: Platform, r, kernel: str, row_bytes: float) -> SimResult:
    """Simulated time of one EP dispatch or combine kernel (:func:`ep_kernel_messages`) on
    ``platform`` as the kernels see it (:func:`ep_kernel_platform`): the flows on the NVLink
    ports, NICs and fabric, max-min fair, each after its link class's latency. The kernel is
    timed on the GPU (what the libraries' kineto timings measure), so no launch cost is added.
    Every number it returns is simulated."""
    import dataclasses

    topo = topology_for(platform, r.nodes, gpus_per_node=r.local)
    messages, deps = ep_kernel_messages(r, kernel, row_bytes)
    # the low-latency kernels put one token row per message (DeepEP internode_ll.cu, UCCL-EP
    # ep/src/internode_ll.cu); the normal kernels put chunks of many rows, whose count per
    # message is not modelled, so no message-rate cap applies to them
    message_bytes = row_bytes if kernel == "low_latency" else None
    p = ep_kernel_platform(platform, message_bytes)
    res = simulate_messages(messages, topo, p, deps)
    ep = platform.raw.get("ep_kernels", {})
    keys = ("nic_GBps", "nic_message_rate_Mps", "nvlink_GBps", "put_latency_us")
    given = ", ".join(f"{k} {ep[k]}" for k in keys if k in ep)
    note = (
        f"EP {kernel} kernel: expected routing rows as flows (one per rank pair); "
        f"GPU-initiated put rates and latencies {given or 'not given: line rates'} "
        f"(ep_kernels); NIC at {p.nic_bytes_per_s / GB:g} GB/s for this kernel's messages; "
        f"{p.raw['network']['per_message_us']:g} us issue cost per flow, no in-flight window, "
        f"no launch cost (kernel-timed), no SM limit"
    )
    return dataclasses.replace(res, assumptions=(note, *res.assumptions))
