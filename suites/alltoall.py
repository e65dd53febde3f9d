"""MoE dispatch all-to-all over real ranks: flat, HALO (Piper Alg. 1) and RBD (X-MoE Sec. 4.2).

``algo`` is any registered all-to-all (components/alltoall); the suite builds its dispatcher,
schedule and phases from the registry and asks its facts, not its name, how to simulate it.
Every algorithm does the same job, so their times compare: each rank holds ``tokens`` rows of
``hidden`` float32 values and a random top-``top_k`` routing over ``experts`` experts (placed on
ranks by ``placement``); the measured call turns (x, PFT) into each rank's expert inputs, in the
flat all-to-all's layout, including the count/metadata exchange each algorithm needs.

``path``: ``dispatch`` (the default) or ``combine``, ``megatron-dispatch`` / ``megatron-combine``
(Megatron-core's own token dispatcher on the same routing and ranks; every registered peer
dispatcher gets its two paths), ``collective`` (the bare flat all-to-all-v, nccl-tests' floor)
and ``node`` (flat on each emulated node's own communicator at once). Nodes are emulated:
``gpus_per_node`` consecutive ranks form one node; ``inter_node_bytes`` is what the ranks sent
to other nodes in one call, counted by the communicators.

Message size (``--sizes``, nccl-tests' alltoall meaning: the bytes each rank sends in total) is
the logical dispatch payload, size = tokens * top_k * hidden * 4, the same for every algorithm;
algbw = size / time_s and busbw = algbw * (n - 1) / n (nccl-tests doc/PERFORMANCE.md).
``#wrong`` (--check) compares rows and combine with a single-process reference.

Worlds that are not real here (a ``--platform`` other than ``local``, or more than
MAX_LOCAL_RANKS ranks) are simulated by the flow-level simulator (components/network/simulator.py)
on the platform's profile, recorded ``simulated: true`` beside the Piper Eq. 6 bound
``eq6_bound_s``. Under torchrun/mpirun/srun the launched world is used.

Why: the algorithms are compared at the same logical payload on real ranks, and at cluster
scale on the same schedules. The paths, the size rules and the simulated worlds in full: see
docs/alltoall-suite.md.
"""

from __future__ import annotations

import math
import os
import signal
import statistics
import time

import numpy as np

from moe_repro.runtime.timing import host_seconds, timer_for
from moe_repro.components.alltoall import algorithm_names, get_algorithm
from moe_repro.components.alltoall.base import RoutedPairs
from moe_repro.components.torch_cpu_random import TorchCPUGenerator
from moe_repro.components.lazy_import import lazy_module
from moe_repro.components.moe.peer_dispatchers import get_peer_dispatcher, peer_dispatcher_names
from moe_repro.suites.base import (
    SEED,
    Metric,
    Param,
    Suite,
    fits_in_memory,
    one_of,
    registered,
    top_k_within_experts,
    whole,
)

torch = lazy_module("torch", globals())  # a simulated grid point needs no tensor

PLACEMENTS = ("contiguous", "strided", "random")
CALLS = ("dispatch", "combine")  # what a dispatcher's path times
# A peer's own dispatcher (components/moe/peer_dispatchers.py) on the same routing, rows and
# ranks as ours: path "<peer>-dispatch" / "<peer>-combine" -> (peer, call)
PEER_PATHS = {f"{name}-{call}": (name, call) for name in peer_dispatcher_names() for call in CALLS}
# node: flat dispatch on each emulated node's own communicator, every node at once (the
# intra-node exchange HALO and RBD run, in the same world: it tells a phase's per-message
# cost from its synchronisation, which world-wide flat runs alone cannot)
PATHS = (*CALLS, "collective", "node", *PEER_PATHS)
LATENCY_MODELS = ("profile", "overlapped", "serial")
MAX_LOCAL_RANKS = 16
MAX_PER_MESSAGE_RANKS = 256  # algorithms simulated message by message (their routing decides)
# --backend auto: MPI where it is installed (faster than gloo locally: AUTO_BACKEND_WHY; the
# comparison reruns with `repro bench alltoall --path dispatch,collective --backend gloo,mpi`);
# gloo otherwise, and under torchrun.
AUTO_BACKEND_WHY = (
    "MPI ran the local all-to-all faster than gloo at every size measured (1-16 MiB, 2 and 4 ranks)"
)
IMPL = {
    "gloo": "torch.distributed gloo all_to_all_single + isend/irecv",
    "nccl": "torch.distributed nccl all_to_all_single + isend/irecv",
    "mpi": "mpi4py Alltoallv/Ialltoallv + Isend/Irecv",
}

_COMMS: dict[tuple, object] = {}  # communicators per (backend, nodes, ranks_per_node), per world


# The platform a world that does not fit here is simulated on, unless --platform names one: the
# GPU cluster most users of this harness train on (8 GPUs per node, one 400 Gb/s NIC per GPU,
# rail-optimised InfiniBand, NVIDIA's DGX SuperPOD reference design).
DEFAULT_PLATFORM = "dgx-h100"
LOCAL_GPUS_PER_NODE = 2  # "auto" for real local ranks: 2 ranks per emulated node


def launched_defaults() -> dict[str, list]:
    """Under torchrun/mpirun/srun: nodes and GPUs per node of the launched world."""
    from moe_repro.components.network.topology import Topology
    from moe_repro.runtime.launch import launched_world_size

    if not launched_world_size():
        return {}
    topo = Topology.from_environment()
    return {
        "nodes": [topo.nodes],
        "gpus_per_node": [str(topo.ranks_per_node)],
    }  # a str param ("auto")


def choose_backend(
    requested: str, ranks_per_node: int = LOCAL_GPUS_PER_NODE, device: str = "auto"
) -> tuple[str, str | None]:
    """(backend, why) for ``--backend``; auto picks nccl when every rank sees a GPU (and the
    device asked for is not the CPU), else MPI when it can run here (or when an MPI launcher
    started the world), else gloo; why is None when the user named one."""
    from moe_repro.runtime.device import auto_backend
    from moe_repro.runtime.launch import launched_by_mpi, launched_world_size, mpi_unavailable

    if requested != "auto":
        return requested, None
    gpu_backend, gpu_why = auto_backend(ranks_per_node)
    if gpu_backend and str(device).partition(":")[0] != "cpu":
        return gpu_backend, f"backend {gpu_backend} (auto: {gpu_why})"
    if launched_world_size():
        if launched_by_mpi():
            return "mpi", "backend mpi (auto: the world was started by an MPI launcher)"
        return "gloo", "backend gloo (auto: the world was started by a non-MPI launcher)"
    why_not = mpi_unavailable()
    if why_not is None:
        return "mpi", f"backend mpi (auto: {AUTO_BACKEND_WHY}; --backend gloo to compare)"
    return "gloo", f"backend gloo (auto: no MPI here: {why_not})"


def local_ranks_here() -> int:
    """Real local ranks this suite runs before it simulates instead: MAX_LOCAL_RANKS, or fewer
    where the machine's local-rank limit (runtime.launch.local_rank_limit) is lower."""
    from moe_repro.runtime.launch import local_rank_limit

    return min(MAX_LOCAL_RANKS, local_rank_limit()[0])


def _positive(p: dict, key: str) -> int:
    try:
        value = int(p[key])
    except (TypeError, ValueError):
        raise ValueError(f"{key} must be a positive whole number or auto, got {p[key]!r}") from None
    if value < 1:
        raise ValueError(f"{key} must be >= 1, got {value}")
    return value


def derived_params(p: dict) -> dict:
    """Validate a grid point and decide where it runs: real local ranks, the launcher's world,
    or the simulator (a named --platform, or a world too big for this machine)."""
    from moe_repro.runtime.launch import launched_world_size

    nodes = _positive(p, "nodes")
    if p["algo"] not in algorithm_names():
        raise ValueError(f"algo must be one of {', '.join(algorithm_names())}, got {p['algo']!r}")
    if p["placement"] not in PLACEMENTS:
        raise ValueError(
            f"placement must be one of {', '.join(PLACEMENTS)}, got {p['placement']!r}"
        )
    if p["backend"] != "auto" and p["backend"] not in IMPL:
        raise ValueError(f"backend must be auto or one of {', '.join(IMPL)}, got {p['backend']!r}")
    path = p.get("path", "dispatch")
    if path not in PATHS:
        raise ValueError(f"path must be one of {', '.join(PATHS)}, got {path!r}")
    if path in ("collective", "node") and p["algo"] != "flat":
        raise ValueError(
            f"path {path} times the flat all-to-all-v (every algorithm's "
            f"baseline); use it with --algo flat, not {p['algo']}"
        )
    peer = _peer_of(path)
    if peer is not None:
        check_peer_point(peer, f"path {path}", p)
    if p.get("latency_model", "profile") not in LATENCY_MODELS:
        raise ValueError(
            f"latency_model must be one of {', '.join(LATENCY_MODELS)}, got {p['latency_model']!r}"
        )
    _parse_fault(p["fault"])
    for key in ("tokens", "hidden", "experts", "top_k"):
        if int(p[key]) < (0 if key == "tokens" else 1):
            raise ValueError(f"{key} must be positive, got {p[key]}")
    if int(p["top_k"]) > int(p["experts"]):
        raise ValueError(f"top_k={p['top_k']} exceeds experts={p['experts']}")
    rows = rows_for_size(
        int(p.get("sizes", 0)), int(p["tokens"]), int(p["hidden"]), int(p["top_k"])
    )
    auto_gpn = str(p["gpus_per_node"]) == "auto"
    gpn = LOCAL_GPUS_PER_NODE if auto_gpn else _positive(p, "gpus_per_node")
    platform = str(p.get("platform", "local"))
    launched = launched_world_size()
    why = None
    if platform != "local":
        why = f"--platform {platform}"
    elif nodes * gpn > local_ranks_here() and not launched:
        platform = DEFAULT_PLATFORM
        why = (
            f"{nodes} nodes need {nodes * gpn} local ranks at {gpn} per node, more than this "
            f"machine runs ({local_ranks_here()}), and no launcher started a world; {DEFAULT_PLATFORM} "
            f"is the default platform (see repro bench --help)"
        )
    kind, fault_rank = _parse_fault(p["fault"])
    if kind != "none" and not 0 <= fault_rank < nodes * gpn:
        raise ValueError(
            f"fault {p['fault']}: rank {fault_rank} is not in the world of {nodes * gpn} ranks"
        )
    if why is None:
        backend, chosen_because = choose_backend(p["backend"], gpn, str(p.get("device", "auto")))
        if peer is not None and peer.torch_groups_only and backend == "mpi":
            raise ValueError(
                f"path {path} runs {peer.label} on torch.distributed groups: use "
                f"--backend gloo (or nccl), not mpi"
            )
        impl = f"{peer.label if peer else p['algo']} over {IMPL[backend]}"
        real = {
            **rows,
            "gpus_per_node": gpn,
            "ranks": nodes * gpn,
            "ranks_per_node": gpn,
            "backend": backend,
            "simulated": False,
            "impl": impl,
        }
        return {**real, "backend_chosen": chosen_because} if chosen_because else real
    if peer is not None or path == "node":
        raise ValueError(
            f"path {path} runs {peer.label if peer else 'on each node'} over real ranks only; "
            f"this point would be simulated ({why})"
        )
    profile = _simulated_platform(platform, None if auto_gpn else gpn)
    if auto_gpn:
        gpn = profile.gpus_per_node
    ranks = nodes * gpn
    # The grid simulated comes first: with gpus_per_node auto it is the platform's, not the
    # local 2 per node the reason above counts with.
    why = f"{nodes} nodes x {gpn} GPUs = {ranks} ranks; {why}"
    if not get_algorithm(p["algo"]).facts.schedule_from_counts and ranks > MAX_PER_MESSAGE_RANKS:
        raise ValueError(
            f"{p['algo']} is simulated per message, up to {MAX_PER_MESSAGE_RANKS} "
            f"ranks; got {ranks}"
        )
    return {
        **rows,
        "gpus_per_node": gpn,
        "platform": platform,
        "ranks": ranks,
        "ranks_per_node": gpn,
        "simulated": True,
        "simulated_because": why,
        "backend": "none (simulated)",
        "impl": f"{p['algo']} simulated on {profile.name} (components/network/simulator.py)",
    }


def _peer_of(path: str):
    """The peer dispatcher a path runs (components/moe/peer_dispatchers.py), None for ours."""
    return get_peer_dispatcher(PEER_PATHS[path][0]) if path in PEER_PATHS else None


def _call_of(path: str) -> str:
    """What a path times: dispatch, combine or collective."""
    return PEER_PATHS[path][1] if path in PEER_PATHS else path


def check_peer_point(peer, what: str, p: dict) -> None:
    """Refuse, in one line, a point ``p`` that ``peer``'s dispatcher cannot run; ``what`` names
    the choice that asked for it (e.g. "path megatron-dispatch")."""
    peer.require()  # PeerUnavailable (a ValueError): the package and the install hint
    if p["algo"] != peer.alltoall:
        raise ValueError(
            f"{what} runs {peer.label}, a {peer.alltoall} all-to-all: use it with "
            f"--algo {peer.alltoall}, not {p['algo']}"
        )
    if peer.contiguous_experts_only and p["placement"] != "contiguous":
        raise ValueError(
            f"{what}: {peer.label} needs each rank's experts consecutive "
            f"(--placement contiguous), got {p['placement']}"
        )


def rows_for_size(size: int, tokens: int, hidden: int, top_k: int) -> dict:
    """The effective tokens, hidden, sizes and size of a grid point (see the module docstring:
    size = tokens * top_k * hidden * 4 bytes sent per rank)."""
    if size < 0:
        raise ValueError(f"sizes must be >= 0, got {size}")
    if size:
        per_token = top_k * hidden * 4
        if size < per_token:  # one token, a narrower row
            tokens, hidden, step = 1, size // (top_k * 4), top_k * 4
        else:
            tokens, step = size // per_token, per_token
        if hidden < 1 or tokens * top_k * hidden * 4 != size:
            raise ValueError(
                f"size {size} B is not tokens x top_k x hidden x 4 B (top_k {top_k}, "
                f"hidden {int(per_token / top_k / 4)}): pick a multiple of {step} B"
            )
    size = tokens * top_k * hidden * 4
    return {"tokens": tokens, "hidden": hidden, "sizes": size, "size": size}


def bus_bandwidth(algbw: float, ranks: int) -> float:
    """nccl-tests' all-to-all bus bandwidth: busbw = algbw * (n - 1) / n."""
    return algbw * (ranks - 1) / ranks


def _simulated_platform(name: str, gpus_per_node: int | None):
    from moe_repro.components.network.platform import load_platform

    platform = load_platform(name)  # ValueError naming the known profiles or the file's problem
    if gpus_per_node is not None and gpus_per_node > platform.gpus_per_node:
        raise ValueError(
            f"{platform.name} has {platform.gpus_per_node} GPUs per node, got "
            f"gpus_per_node {gpus_per_node}"
        )
    return platform


def simulate(params: dict) -> dict:
    """Predicted metrics of one dispatch on ``params['platform']`` (all simulated)."""
    import sys

    from moe_repro.components.network import simulator as ns
    from moe_repro.components.alltoall import simulated

    platform = _simulated_platform(str(params["platform"]), int(params["gpus_per_node"]))
    model = None if params.get("latency_model", "profile") == "profile" else params["latency_model"]
    topo = ns.topology_for(platform, int(params["nodes"]), int(params["gpus_per_node"]))
    N = topo.world_size
    S, H, E, k = (int(params[n]) for n in ("tokens", "hidden", "experts", "top_k"))
    row_bytes = H * 4
    placement = _placement(params["placement"], E, N, int(params["seed"]))
    algo = get_algorithm(params["algo"])
    if algo.facts.schedule_from_counts:  # expected routing, aggregated over alike nodes
        per_rank = [0] * N
        for rank in placement:
            per_rank[rank] += 1
        rows_to = [round(S * k * e / E) for e in per_rank]
        fn, deps = simulated.expected_schedule(params["algo"], topo, row_bytes, with_counts=False)
        res = ns.simulate_expected(fn, rows_to, topo, platform, deps, model)
        payload = sum(rows_to) * row_bytes
    else:  # every rank's real routing, message by message
        # The same draws as the real run's ranks (their inputs' and pilots' generators), by
        # numpy twins of torch's generator: no torch to import.
        routes = [_rank_routing(params, r) for r in range(N)]
        gens = [TorchCPUGenerator(_rank_generator_seed(r)) for r in range(N)]
        msgs = algo.routed_schedule(routes, placement, topo, row_bytes, gens, with_counts=False)
        res = ns.simulate_messages(
            msgs,
            topo,
            platform,
            algo.phase_dependencies,
            model,
            progress=_flow_progress(f"simulating {params['algo']}"),
        )
        payload = sum(route.num_rows for route in routes) * row_bytes / N
    t = res.time_s
    algbw = payload / t if t > 0 else 0.0
    print(
        f"simulated {params['algo']} on {platform.name} {params['nodes']}x{params['gpus_per_node']}: "
        f"{t * 1e3:.4g} ms, Piper Eq. 6 NIC bound {res.eq6_bound_s * 1e3:.4g} ms "
        f"({res.flows} flow records)",
        file=sys.stderr,
    )
    return {
        "time_s": t,
        "latency_s": t,
        "inter_node_bytes": res.link_bytes["inter_node"],
        "intra_node_bytes": res.link_bytes["intra_node"],
        "algbw_GBps": algbw / 1e9,
        "busbw_GBps": bus_bandwidth(algbw, N) / 1e9,
        "bytes": payload,
        "eq6_bound_s": res.eq6_bound_s,
        "phase_end_s": res.phase_end_s,
        "latency_model_used": res.latency_model,
        "assumptions": list(res.assumptions),
    }


PROGRESS_EVERY_S = 2.0  # a long simulation prints a line at most this often (stderr)


def _flow_progress(what: str):
    """A ``progress(finished, total)`` for the simulator: after PROGRESS_EVERY_S, plain lines on
    stderr with the flows finished, the time elapsed and an estimate of the time left."""
    import sys

    started = last = host_seconds()  # the simulator's own progress: host-only work

    def report(finished: int, total: int) -> None:
        nonlocal last
        now = host_seconds()
        if now - last < PROGRESS_EVERY_S or not finished or finished >= total:
            return
        last = now
        elapsed = now - started
        print(
            f"{what}: {finished}/{total} flows finished, {elapsed:.0f} s elapsed, about "
            f"{elapsed / finished * (total - finished):.0f} s left",
            file=sys.stderr,
            flush=True,
        )

    return report


def _parse_fault(fault: str) -> tuple[str, int]:
    kind, _, rank = str(fault).partition(":")
    if kind == "none" and not rank:
        return "none", -1
    if kind in ("kill", "hang") and rank.isdigit():
        return kind, int(rank)
    raise ValueError(f"fault must be none, kill:RANK or hang:RANK, got {fault!r}")


def _placement(kind: str, experts: int, ranks: int, seed: int) -> list[int]:
    if kind == "contiguous":
        return [e * ranks // experts for e in range(experts)]
    if kind == "strided":
        return [e % ranks for e in range(experts)]
    # torch.randint(0, ranks, (experts,), generator=torch.Generator().manual_seed(seed))
    return TorchCPUGenerator(seed).randint(0, ranks, (experts,)).tolist()


def _rank_generator_seed(rank: int) -> int:
    return 104729 + rank


def _rank_generator(rank: int) -> torch.Generator:
    """The generator of an algorithm's random choices on ``rank`` (RBD's pilots)."""
    return torch.Generator().manual_seed(_rank_generator_seed(rank))


def _rank_inputs_seed(params: dict, rank: int) -> int:
    return 7919 * int(params["seed"]) + rank


def _rank_inputs(params: dict, rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [tokens, hidden] (small integers: sums stay exact), top experts, dyadic weights."""
    S, H, E, k = (int(params[n]) for n in ("tokens", "hidden", "experts", "top_k"))
    g = torch.Generator().manual_seed(_rank_inputs_seed(params, rank))
    x = torch.randint(-64, 64, (S, H), generator=g).float()
    top = torch.argsort(torch.rand(S, E, generator=g), dim=1)[:, :k]
    weights = torch.randint(1, 9, (S, k), generator=g).float() / 8
    return x, top, weights


def _rank_routing(params: dict, rank: int) -> RoutedPairs:
    """The (token, expert) pairs of ``rank``'s :func:`_rank_inputs` in PFT order (build_pft's:
    expert ascending, then token), drawn by the numpy twin of its generator. A token whose
    k-th and (k+1)-th scores tie has its top-k set chosen by torch's sort; then, rarely (the
    scores are 24-bit draws), this rank is routed by torch itself."""
    S, H, E, k = (int(params[n]) for n in ("tokens", "hidden", "experts", "top_k"))
    g = TorchCPUGenerator(_rank_inputs_seed(params, rank))
    g.skip(S * H)  # x's draws
    scores = g.rand(S, E)
    by_score = np.argsort(scores, axis=1, kind="stable")
    kth = np.take_along_axis(scores, by_score[:, k - 1 : k + 1], axis=1)  # k-th and (k+1)-th lowest
    if k < E and (kth[:, 0] == kth[:, 1]).any():
        from moe_repro.components.moe.pft import build_pft

        _, top, weights = _rank_inputs(params, rank)
        pft = build_pft(top, weights, E)
        return RoutedPairs(pft.token_ids.numpy(), pft.expert_ids.numpy(), E)
    experts = by_score[:, :k].reshape(-1)
    order = np.argsort(experts, kind="stable")  # build_pft's stable sort by expert
    return RoutedPairs(token_ids=order // k, expert_ids=experts[order], num_experts=E)


def rank_workload(params: dict, rank: int, world: int, device=None) -> dict:
    """One rank's inputs for a grid point: x, its PFT, the expert -> rank map and the flat send
    order (PFT rows grouped by destination rank) with its counts; on ``device`` (the rank's,
    runtime/device.py; drawn on the CPU first so every device sees the same numbers)."""
    from moe_repro.components.alltoall.flat import flat_send_layout
    from moe_repro.components.moe.pft import build_pft

    placement = _placement(params["placement"], int(params["experts"]), world, int(params["seed"]))
    x, top, weights = (t.to(device) for t in _rank_inputs(params, rank))
    pft = build_pft(top, weights, int(params["experts"]))
    order, send_counts = flat_send_layout(pft, placement, world)
    return {
        "x": x,
        "pft": pft,
        "placement": placement,
        "token_order": pft.token_ids[order],
        "send_counts": send_counts,
    }


def setup(params: dict, ctx) -> dict:
    from moe_repro.components.network.topology import (
        Topology,
        build_communicators,
        bytes_by_link_class,
    )

    nodes, gpn = int(params["nodes"]), int(params["gpus_per_node"])
    if nodes * gpn != ctx.world_size:
        raise ValueError(
            f"this world has {ctx.world_size} ranks but --nodes {nodes} "
            f"--gpus-per-node {gpn} asks for {nodes * gpn}"
        )
    key = (ctx.backend, nodes, gpn)
    if key not in _COMMS:
        topo = Topology(nodes=nodes, ranks_per_node=gpn)
        _COMMS[key] = build_communicators(topo, ctx.rank, ctx.backend, ctx.comm)
    comms = _COMMS[key]
    path = params.get("path", "dispatch")
    # path node: every node's ranks are a world of their own (the same routing on every node)
    me, world = (
        (comms.topo.local_rank(ctx.rank), gpn) if path == "node" else (ctx.rank, ctx.world_size)
    )
    state = {
        "ctx": ctx,
        "params": params,
        "comms": comms,
        "algo": params["algo"],
        **rank_workload(params, me, world, ctx.device),
        "reference_rank": (me, world),
        "fault": _parse_fault(params["fault"]),
        "calls": 0,
    }
    pft = state["pft"]
    peer = _peer_of(path)
    if path == "node":
        from moe_repro.components.alltoall.flat import FlatDispatcher

        state["dispatcher"] = FlatDispatcher(comms.intra, state["placement"])
    elif peer is not None:  # the peer's own dispatcher on the same EP group, routing and rows
        state["dispatcher"] = peer.build(
            comms.world, state["placement"], int(params["hidden"]), int(params["top_k"])
        )
    else:
        state["dispatcher"] = get_algorithm(params["algo"]).dispatcher(
            comms, state["placement"], _rank_generator(ctx.rank)
        )
    if _call_of(path) == "collective":
        from moe_repro.components.alltoall.flat import flat_send_layout

        order, send_counts = flat_send_layout(pft, state["placement"], ctx.world_size)
        rows = state["x"].index_select(0, pft.token_ids[order])  # packed once, outside the timing
        recv_counts = comms.world.exchange_counts(send_counts)
        state["collective"] = (
            rows,
            send_counts,
            recv_counts,
            rows.new_empty((sum(recv_counts), rows.shape[1])),
        )

    if _call_of(path) == "combine":  # expert outputs of one dispatch, combined again and again
        state["combine_y"] = 2 * _dispatch(state).clone() + 1
    state["memcpy_s"] = ctx.all_reduce_max(_memcpy_seconds(state["x"], int(params["top_k"])))

    # One logged call: bytes per link class as actually sent, summed over the world, and the
    # host work of the call (aten ops and the bytes they write; count_host_work). The call
    # counted is a warm one, like every timed call: the first dispatch allocates the reused
    # buffers (14 more ops and twice the payload in fresh bytes for flat), the later ones do not.
    _dispatch(state)
    log: list = []
    comms.set_log(log)
    work = count_host_work(lambda: _dispatch(state))
    comms.set_log(None)
    work["python_ops"] = count_python_work(lambda: _dispatch(state))
    keys = ("ops", "bytes", "fresh_bytes", "sort_work", "python_ops")
    if peer is None:  # a peer's collectives bypass our communicators: they cannot be taken out
        # the same call's host work profiled in CPU time (integer ns: allgather_ints)
        work["cpu_ns"] = round(1e9 * host_cpu_seconds(lambda: _dispatch(state), comms))
        keys += ("cpu_ns",)
    counted = comms.world.allgather_ints([work[k] for k in keys])
    # The busiest rank's counts (each maximised on its own: an upper bound when ranks differ).
    state["host_work"] = {k: max(r[i] for r in counted) for i, k in enumerate(keys)}
    mine = bytes_by_link_class(log, comms.topo)
    names = ("intra_node", "intra_group", "inter_group", "inter_rack", "inter_node")
    totals = [sum(col) for col in zip(*comms.world.allgather_ints([mine[n] for n in names]))]
    # a peer's collectives are its own library's calls: our communicators do not see them, so
    # its bytes per link class are not counted (left out of its record, not reported as 0)
    state["link_bytes"] = dict(zip(names, totals)) if peer is None else None
    pairs = sum(comms.world.allgather_ints([pft.num_rows])[r][0] for r in range(ctx.world_size))
    state["payload_bytes"] = pairs * int(params["hidden"]) * 4 / ctx.world_size
    return state


def _memcpy_seconds(x: torch.Tensor, top_k: int, repeats: int = 5) -> float:
    """Median seconds of one copy of a rank's routed rows (tokens * top_k rows like x's) from
    one buffer into another, every rank copying at the same time: the memory bandwidth a
    dispatch on this host can use. A dispatch must move every routed row at least once."""
    src = x.new_ones((max(1, x.shape[0] * top_k), x.shape[1]))
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch: page faults outside the timing
    times = []
    timer = timer_for(dst.device)  # CUDA events on a GPU: the copy is queued, not done, on return
    for _ in range(repeats):
        timer.start()
        dst.copy_(src)
        times.append(timer.stop())
    return sorted(times)[len(times) // 2] if x.shape[0] else 0.0


# aten ops left out of the host work: the collectives themselves (their cost is the network
# model's) and ops that only look at a tensor.
_NOT_HOST_WORK_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")
# Sorting ops (argsort is aten sort): their cost grows as n log n in the elements they order,
# faster than the bytes they write.
_SORT_OPS = ("sort", "topk", "_unique2", "unique_dim", "unique_consecutive")


def count_host_work(fn) -> dict:
    """Run ``fn`` once and count the host (CPU) work it does outside the collectives: ``ops``,
    the aten ops it dispatches (each pays the framework's per-op cost); ``bytes``, what the
    non-view ones write into existing tensors (an out= op its outputs, an in-place op as much as
    its largest other tensor argument, e.g. index_copy_'s source); and ``fresh_bytes``, the
    outputs of out-of-place ops, written into fresh memory (a large one is page-faulted in on
    first touch: ReusedBuffers); ``sort_work``, n log2 n summed over the sorting ops (n: the
    elements of the tensor each orders). Collectives (c10d ops) and views are not counted. These are counts read off the
    real call, not times, kept in the run's record to describe its host work (whose time is
    profiled: host_cpu_seconds)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    work = {"ops": 0, "bytes": 0, "fresh_bytes": 0, "sort_work": 0}

    def nbytes(t) -> int:
        return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0

    class Counter(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.namespace in _NOT_HOST_WORK_NAMESPACES:
                return out
            work["ops"] += 1
            if not func.is_view:
                name = func.overloadpacket.__name__
                if (
                    name in _SORT_OPS
                    and args
                    and isinstance(args[0], torch.Tensor)
                    and args[0].numel() > 1
                ):
                    n = args[0].numel()
                    work["sort_work"] += round(n * math.log2(n))
                if name.endswith("_") and args and isinstance(args[0], torch.Tensor):
                    others = [nbytes(a) for a in tree_flatten((args[1:], kwargs or {}))[0]]
                    work["bytes"] += max(others, default=0) or nbytes(args[0])
                elif "out" in (kwargs or {}) or func._overloadname.startswith("out"):
                    work["bytes"] += sum(nbytes(o) for o in tree_flatten(out)[0])  # a reused buffer
                else:  # a fresh output: its pages are touched for the first time
                    work["fresh_bytes"] += sum(nbytes(o) for o in tree_flatten(out)[0])
            return out

    with Counter():
        fn()
    return work


def host_cpu_seconds(fn, comms, calls: int = 5) -> float:
    """Run ``fn`` ``calls`` times and return the median thread-CPU seconds of one call spent
    outside its collectives: the host work as profiled (planning, packing, reconstruction, the
    interpreter between them), with the CPU time inside the communicators' calls -- issuing
    them, and waiting on them (MPI busy-polls) -- taken out. vTrain and ASTRA-sim predict the
    same way: the computation profiled, the communication simulated. Thread CPU time leaves
    out the time other processes hold the core; the cores' sharing is the run's cpu_stretch.
    Every communicator of ``comms`` is watched, and left as it was."""
    from moe_repro.components.network.comm import COLLECTIVE_CALLS
    from moe_repro.runtime.timing import thread_cpu_seconds

    inside = [0.0]

    def watched(method, name):
        def call(*args, **kwargs):
            t0 = thread_cpu_seconds()
            result = method(*args, **kwargs)
            inside[0] += thread_cpu_seconds() - t0
            if name == "alltoallv_async":  # (out, handle): its wait is collective time too
                return result[0], watched_handle(result[1])
            return watched_handle(result) if name == "p2p" else result

        return call

    def watched_handle(handle):
        handle.wait = watched(handle.wait, "wait")
        return handle

    watching = list(comms.by_name().values())
    for c in watching:
        for name in COLLECTIVE_CALLS:
            setattr(
                c, name, watched(getattr(c, name), name)
            )  # an instance attribute, removed below
    samples = []
    try:
        for _ in range(calls):
            inside[0] = 0.0
            t0 = thread_cpu_seconds()
            fn()
            samples.append(max(thread_cpu_seconds() - t0 - inside[0], 0.0))
    finally:
        for c in watching:
            for name in COLLECTIVE_CALLS:
                vars(c).pop(name, None)
    return statistics.median(samples)


def count_python_work(fn) -> int:
    """Run ``fn`` once and count the Python bytecode instructions it executes on this thread:
    the interpreter's work between the aten ops (argument checks, list building, the
    communicators' bookkeeping), which count_host_work's ops leave out. A count read off the
    real call, kept in the run's record beside count_host_work's. The tracer slows this one
    call down; only its count is kept."""
    import sys

    executed = 0

    def trace(frame, event, arg):
        nonlocal executed
        frame.f_trace_opcodes = True
        if event == "opcode":
            executed += 1
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        fn()
    finally:
        sys.settrace(previous)
    return executed


def _dispatch(state: dict) -> torch.Tensor:
    """The measured call: the MoE dispatch, or with path collective the bare flat collective."""
    if "collective" in state:
        rows, send_counts, recv_counts, out = state["collective"]
        return state["comms"].world.alltoallv(rows, send_counts, recv_counts, "a2a", out=out)
    return state["dispatcher"].dispatch(state["x"], state["pft"])


def run(state: dict) -> None:
    state["calls"] += 1
    if "combine_y" in state:  # path combine: the reverse of the dispatch set up once
        state["dispatcher"].combine(state["combine_y"], int(state["params"]["tokens"]))
        return
    kind, victim = state["fault"]
    if kind != "none" and victim == state["ctx"].rank and state["calls"] == 3:
        # Fault injection for the failure tests: the peers are already inside this call's
        # collective when the victim dies or stops.
        time.sleep(0.2)
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(3600)
    _dispatch(state)


def _reference(params: dict, placement: list[int], world: int, me: int):
    """Single process, no communication: every rank's inputs from their seeds, a loop over
    tokens. Returns (expected dispatch rows on rank ``me``, expected combine of y = 2*rows+1)."""
    E = int(params["experts"])
    rows = []
    for s in range(world):  # flat layout: by source, then expert ascending, then token ascending
        x, top, _ = _rank_inputs(params, s)
        per_expert: dict[int, list] = {e: [] for e in range(E) if placement[e] == me}
        for t, experts in enumerate(top.tolist()):
            for e in experts:
                if e in per_expert:
                    per_expert[e].append(x[t])
        for e in sorted(per_expert):
            rows += per_expert[e]
    expected = torch.stack(rows) if rows else torch.zeros(0, int(params["hidden"]))
    x, top, w = _rank_inputs(params, me)
    combined = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(top.shape[1]):
            combined[t] += w[t, j] * (2 * x[t] + 1)  # every expert computes y = 2x + 1
    return expected, combined


def check(state: dict) -> int:
    params = state["params"]
    out = _dispatch(state)
    me, world = state["reference_rank"]
    expected, combined = _reference(params, state["placement"], world, me)
    wrong = _count_wrong(out, expected)  # before combine: the rows live in a reused buffer
    if "collective" in state:  # the bare collective has no combine
        return wrong
    y = state["dispatcher"].combine(2 * out + 1, int(params["tokens"]))
    return wrong + _count_wrong(y, combined)


def _count_wrong(got: torch.Tensor, expected: torch.Tensor) -> int:
    if got.shape != expected.shape:
        return max(got.numel(), expected.numel(), 1)
    return int((got != expected).sum())


def derive(params: dict, state: dict, time_s: float) -> dict:
    # the ranks of one all-to-all (a node's, for path node)
    n = int(params["gpus_per_node"]) if params.get("path") == "node" else int(params["ranks"])
    algbw = state["payload_bytes"] / time_s
    lb = state["link_bytes"]
    # The physical floor on this host: every routed row copied once at the memcpy bandwidth
    # measured in this run (same ranks copying at once), whatever the algorithm.
    bound = state["memcpy_s"]
    limit = {
        "memcpy_GBps": state["payload_bytes"] / bound / 1e9 if bound else float("nan"),
        "bound_s": bound,
        "time_over_bound": time_s / bound if bound else float("nan"),
    }
    links = (
        {}
        if lb is None
        else {"inter_node_bytes": lb["inter_node"], "intra_node_bytes": lb["intra_node"]}
    )
    return {
        **limit,
        "latency_s": time_s,
        **links,
        "algbw_GBps": algbw / 1e9,
        "busbw_GBps": bus_bandwidth(algbw, n) / 1e9,
        "bytes": state["payload_bytes"],
        "host_ops": state["host_work"]["ops"],
        "host_bytes": state["host_work"]["bytes"],
        "host_fresh_bytes": state["host_work"]["fresh_bytes"],
        "host_sort_work": state["host_work"]["sort_work"],
        "host_python_ops": state["host_work"]["python_ops"],
        **(
            {"host_cpu_s": state["host_work"]["cpu_ns"] * 1e-9}
            if "cpu_ns" in state["host_work"]
            else {}
        ),
    }


# What one dispatch over real ranks yields (also the alltoall-validation suite's measured side).
DISPATCH_METRICS = [
    Metric(
        "inter_node_bytes",
        "B",
        "lower",
        description="bytes sent to other nodes in one call, all ranks, metadata included",
    ),
    Metric("busbw_GBps", "GB/s", "higher", description="algbw * (n-1)/n (nccl-tests alltoall)"),
    Metric("algbw_GBps", "GB/s", "higher", description="size / time_s"),
    Metric("latency_s", "s", "lower", description="wall time of one dispatch (= time_s)"),
    Metric(
        "intra_node_bytes",
        "B",
        "none",
        description="bytes sent to other ranks of the same node in one call, all ranks",
    ),
    Metric("bytes", "B", "none", description="mean per-rank dispatch payload as routed (= size)"),
    Metric(
        "host_ops",
        "ops",
        "none",
        description="aten ops one dispatch runs on the busiest rank, collectives left out (counted)",
    ),
    Metric(
        "host_bytes",
        "B",
        "none",
        description="bytes those ops write into existing buffers on the busiest rank (counted)",
    ),
    Metric(
        "host_fresh_bytes",
        "B",
        "none",
        description="bytes those ops write into fresh tensors on the busiest rank (counted)",
    ),
    Metric(
        "host_sort_work",
        "n log2 n",
        "none",
        description="n log2 n summed over the sorts one dispatch runs on the busiest rank (counted)",
    ),
    Metric(
        "host_python_ops",
        "instructions",
        "none",
        description="Python bytecode instructions one dispatch executes on the busiest rank (counted)",
    ),
    Metric(
        "host_cpu_s",
        "s",
        "none",
        description="CPU seconds one dispatch spends outside its collectives on the busiest rank "
        "(profiled: host_cpu_seconds)",
    ),
]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def side_by_side(records: list[dict]) -> list[str]:
    """Under the table, where one run timed our dispatch or combine beside the bare collective
    or a peer's dispatcher (same point, same ranks): each one's median time and time / bound,
    and ours over each of them. One bound per point: the fastest of the memory copies its
    paths measured (each path measures its own, a few seconds apart), so every row of a point
    is divided by the same floor. Nothing where there is nothing beside ours."""
    groups: dict[tuple, dict[str, dict]] = {}
    for r in records:
        if not r.get("simulated") and "path" in r:
            key = tuple(str(r.get(k)) for k in SUITE.params if k != "path")
            groups.setdefault(key, {})[r["path"]] = r
    lines = []
    for by_path in groups.values():
        bound = min((r["bound_s"] for r in by_path.values() if r.get("bound_s")), default=None)
        for call in CALLS:
            ours = by_path.get(call)
            beside = [(peer, by_path.get(f"{peer}-{call}")) for peer in peer_dispatcher_names()]
            beside = [
                (name, r) for name, r in [*beside, ("collective", by_path.get("collective"))] if r
            ]
            if ours is None or not beside or not bound:
                continue
            cells = [
                f"{name} {_ms(r['time_s'])} ({r['time_s'] / bound:.3g}x bound)"
                for name, r in [("ours", ours), *beside]
            ]
            cells += [f"ours/{name} {ours['time_s'] / r['time_s']:.2f}" for name, r in beside]
            lines.append(
                f"  {_size(ours['size'])} {call} (bound {_ms(bound)}): " + " | ".join(cells)
            )
    if not lines:
        return []
    return [
        "side by side, measured in this run (median times; bound: the routed bytes per rank "
        "at this run's fastest memcpy bandwidth for the point):",
        *lines,
    ]


# The largest world the simulator is asked for: 4096 nodes (32768 GPUs at 8 per node, the
# largest MoE training clusters reported), predicted in seconds; 100000 nodes ran for over ten
# minutes with no end in sight.
MAX_NODES = 4096


def _gpus_per_node(value: str) -> None:
    if value != "auto":
        _positive({"gpus_per_node": value}, "gpus_per_node")
        if int(value) > 1024:
            raise ValueError(f"gpus_per_node must be <= 1024, got {value}")


def _platform_name(value: str) -> None:
    """local, or a platform profile that loads (a shipped name or a JSON file)."""
    if value != "local":
        from moe_repro.components.network.platform import load_platform

        load_platform(value)


SUITE = Suite(
    name="alltoall",
    schema={
        "nodes": whole(1, MAX_NODES, why_max="the simulator's largest fabric"),
        "gpus_per_node": Param(str, check=_gpus_per_node, bad=("0", "-2", "x", "1e400")),
        "algo": registered("algo", algorithm_names),
        "platform": Param(str, check=_platform_name, bad=("nosuch", "/nonexistent/p.json")),
        "backend": one_of("auto", *IMPL),
        "latency_model": one_of(*LATENCY_MODELS),
        "sizes": whole(0, 2**34),
        "tokens": whole(0),
        "hidden": whole(1, 2**16),
        "experts": whole(1, 2**16),
        "top_k": whole(1, 2**10),
        "placement": one_of(*PLACEMENTS),
        "seed": SEED,
        "fault": Param(str, check=_parse_fault, bad=("kill", "kill:x", "boom:1")),
        "path": one_of(*PATHS),
    },
    rules=(
        top_k_within_experts(),
        # every rank's send and receive rows, the combine output and the input (float32)
        # and each rank's routing draw: a score per token and expert, and their argsort
        fits_in_memory(
            lambda p: (
                4
                * int(p["ranks"])
                * int(p["tokens"])
                * (4 * int(p["top_k"]) * int(p["hidden"]) + 4 * int(p["experts"]))
            ),
            {"tokens": str(2**20), "hidden": str(2**16)},
        ),
    ),
    params={
        "nodes": [1, 2],
        "gpus_per_node": ["auto"],
        "algo": algorithm_names(),
        "platform": ["local"],
        "backend": ["auto"],
        "latency_model": ["profile"],
        "sizes": [0],
        "tokens": [256],
        "hidden": [256],
        "experts": [16],
        "top_k": [4],
        "placement": ["contiguous"],
        "seed": [0],
        "fault": ["none"],
        "path": ["dispatch"],
    },
    quick={"nodes": [2], "tokens": [16], "hidden": [64]},  # 16 KiB per rank
    table_keys=("nodes", "gpus_per_node", "algo", "path", "backend", "platform", "size"),
    table_metrics=("time_s", "algbw_GBps", "busbw_GBps", "inter_node_bytes"),
    summary=side_by_side,
    world_params=("ranks", "backend", "ranks_per_node"),
    derived_params=derived_params,
    launched_defaults=launched_defaults,
    setup=setup,
    run=run,
    derive=derive,
    check=check,
    simulate=simulate,
    metrics=[
        *DISPATCH_METRICS,
        Metric(
            "memcpy_GBps",
            "GB/s",
            "none",
            description="real runs: one rank's routed rows copied buffer to buffer, all ranks "
            "at once, measured in the same run (slowest rank)",
        ),
        Metric(
            "bound_s",
            "s",
            "none",
            description="real runs: routed bytes per rank / memcpy bandwidth: the least a "
            "dispatch or combine on this host can take",
        ),
        Metric(
            "time_over_bound",
            "x",
            "lower",
            description="real runs: time_s / bound_s (1 = at the memory-copy limit)",
        ),
        Metric(
            "eq6_bound_s",
            "s",
            "none",
            kind="simulated",
            description="simulated records only: Piper Eq. 6 NIC-injection lower bound "
            "(busiest NIC's bytes / B_NIC)",
        ),
    ],
    param_help={
        "nodes": "nodes (emulated by groups of local ranks when real here); under a launcher "
        "the launched world's",
        "gpus_per_node": "ranks per node; auto: 2 for real local ranks, the platform's GPUs "
        "per node when simulated, the launcher's ranks per node under one",
        "algo": "a registered all-to-all: " + ", ".join(algorithm_names()),
        "platform": "local (real ranks here; a world of more than 16 ranks is simulated on "
        "dgx-h100) or a profile to simulate: frontier, dgx-h100, h200, or a "
        "profile file path (.json)",
        "latency_model": "simulated only: profile (the profile's), overlapped or serial "
        "(see components/network/simulator.py)",
        "backend": "auto (MPI where mpi4py and mpiexec are installed: faster than gloo "
        "at every local size measured; else gloo; the choice is printed "
        "first), gloo, nccl (GPUs) or mpi",
        "sizes": "bytes each rank sends (tokens x top_k x hidden x 4), e.g. 1K:64M; "
        "0: from tokens and hidden; given, it sets tokens (and hidden below one "
        "token's payload)",
        "tokens": "tokens per rank (ignored when sizes > 0)",
        "hidden": "hidden size (float32 elements per row)",
        "experts": "experts in total",
        "top_k": "experts per token",
        "placement": "expert -> rank map: contiguous, strided or random",
        "seed": "input and routing seed",
        "path": "dispatch (the MoE dispatch: pack rows, exchange counts, all-to-all-v), "
        "combine (its reverse: rows back, weighted sum per token), "
        "collective (flat only: the bare all-to-all-v of packed rows, counts known, "
        "buffers reused; the floor a dispatch can reach), node (flat only: the "
        "dispatch on each emulated node's own communicator, every node at once) "
        "or a peer's own dispatcher "
        "on the same routing and rows: " + ", ".join(PEER_PATHS) + " (flat, contiguous "
        "placement, gloo or nccl; the peers extra)",
        "fault": "none, or kill:R / hang:R to stop rank R during its 3rd call (tests)",
    },
)
