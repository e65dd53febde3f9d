"""dispatch-stages: per-stage time of one MoE dispatch, flat vs redundancy-bypassing (RBD), over real
ranks with emulated nodes (X-MoE Sec. 5.4.2, Fig. 12).

Inputs are the alltoall suite's (suites/alltoall.rank_workload: same seeds, placement and
routing): each rank holds ``tokens`` rows of ``hidden`` float32 values and a random top-``top_k``
routing over ``experts`` experts. The measured call is one dispatch by ``algo``, any registered
all-to-all whose dispatcher times its stages (``facts.stages``, components/alltoall/base.py):
flat times buffer gather, counts exchange and the all-to-all-v; RBD its seven stages from pilot
selection to expert input reconstruction. ``dispatcher`` names whose dispatcher: ours (the
algorithm's) or a peer's own (components/moe/peer_dispatchers.py; megatron: Megatron-core's
MoEAlltoAllTokenDispatcher, its stages "permute and counts" and "all-to-all" of the rows and
their probs), on the same inputs; a peer's collectives are not counted in the bytes below.
The stages of one call cannot be separate grid points, so each stage is a metric: its time in
the sample's last call, the slowest rank's (a stage includes waiting for peers); median over
repeats like every metric. ``time_s`` is the whole dispatch.
Set-up makes one logged call and counts the bytes sent to other nodes (``inter_node_bytes``)
and to other ranks of the node (``intra_node_bytes``), metadata included, summed over ranks.
#wrong: elements of the dispatched rows that differ from a plain flat all-to-all-v of the
same inputs (the rows are small integers: exact).
"""

from __future__ import annotations

import re

import torch

from moe_repro.components.alltoall import algorithm_names, get_algorithm
from moe_repro.components.moe.peer_dispatchers import (
    PEER_DISPATCHERS,
    get_peer_dispatcher,
    peer_dispatcher_names,
)
from moe_repro.suites.base import (
    SEED,
    Metric,
    Suite,
    fits_in_memory,
    one_of,
    registered,
    top_k_within_experts,
    whole,
)


def timed_algorithms() -> list[str]:
    """The registered all-to-alls whose dispatcher times its stages."""
    return [name for name in algorithm_names() if get_algorithm(name).facts.stages]


def stages_of(algo: str) -> tuple[str, ...]:
    return get_algorithm(algo).facts.stages


def _peer(params: dict):
    """The peer dispatcher a point runs, None for ours."""
    name = params.get("dispatcher", "ours")
    return None if name == "ours" else get_peer_dispatcher(name)


def point_stages(params: dict) -> tuple[str, ...]:
    peer = _peer(params)
    return peer.stages if peer else stages_of(params["algo"])


def _stage_owners() -> list[tuple[str, tuple[str, ...]]]:
    """(algorithm or peer dispatcher, its stages) for every dispatcher that times its stages."""
    return [
        *((a, stages_of(a)) for a in timed_algorithms()),
        *((p.name, p.stages) for p in PEER_DISPATCHERS.values()),
    ]


_COMMS: dict[tuple, object] = {}  # communicators per (backend, nodes, ranks_per_node), per world


def stage_metric(stage: str) -> str:
    """The record key of a stage's time, e.g. 'pilot all-to-all (inter-node)' ->
    'pilot_all_to_all_inter_node_s'."""
    return re.sub(r"[^a-z0-9]+", "_", stage.lower()).strip("_") + "_s"


def derived_params(p: dict) -> dict:
    nodes, gpn = int(p["nodes"]), int(p["gpus_per_node"])
    if nodes < 1 or gpn < 1:
        raise ValueError(f"nodes and gpus_per_node must be >= 1, got {nodes}, {gpn}")
    if p["algo"] not in timed_algorithms():
        raise ValueError(
            f"algo must be one of {', '.join(timed_algorithms())} (the all-to-alls "
            f"that time their stages), got {p['algo']!r}"
        )
    peer = _peer(p)
    if peer is not None:
        from moe_repro.suites.alltoall import check_peer_point

        check_peer_point(peer, f"dispatcher {peer.name}", p)
        if peer.torch_groups_only and p["backend"] == "mpi":
            raise ValueError(
                f"dispatcher {peer.name} runs on torch.distributed groups: use "
                f"--backend gloo, not mpi"
            )
    return {"ranks": nodes * gpn, "ranks_per_node": gpn}


def setup(params: dict, ctx) -> dict:
    from moe_repro.components.network.topology import (
        Topology,
        build_communicators,
        bytes_by_link_class,
    )
    from moe_repro.suites.alltoall import rank_workload

    nodes, gpn = int(params["nodes"]), int(params["gpus_per_node"])
    key = (ctx.backend, nodes, gpn)
    if key not in _COMMS:  # every grid point of a world shares its communicators
        _COMMS[key] = build_communicators(
            Topology(nodes=nodes, ranks_per_node=gpn), ctx.rank, ctx.backend, ctx.comm
        )
    comms = _COMMS[key]
    state = {
        "ctx": ctx,
        "algo": params["algo"],
        "comms": comms,
        "laps": {},
        **rank_workload(params, ctx.rank, ctx.world_size, ctx.device),
    }
    peer = _peer(params)
    state["stages"] = point_stages(params)
    if peer is not None:  # the peer's own dispatcher on the same EP group and inputs
        state["dispatcher"] = peer.build(
            comms.world, state["placement"], int(params["hidden"]), int(params["top_k"])
        )
    else:  # the same pilot generator as the alltoall suite's ranks (algorithms that draw at random)
        state["dispatcher"] = get_algorithm(params["algo"]).dispatcher(
            comms, state["placement"], torch.Generator().manual_seed(104729 + ctx.rank)
        )

    log: list = []
    comms.set_log(log)
    _dispatch(state)
    comms.set_log(None)
    mine = bytes_by_link_class(log, comms.topo)
    names = ("intra_node", "inter_node")
    totals = [sum(col) for col in zip(*comms.world.allgather_ints([mine[n] for n in names]))]
    state["link_bytes"] = dict(zip(names, totals)) if peer is None else None  # not ours to count
    return state


def _dispatch(state: dict) -> torch.Tensor:
    """One dispatch; each stage's seconds on this rank go to state["laps"] (replaced each call)."""
    dispatcher, laps = state["dispatcher"], {}
    dispatcher.timings = laps
    dispatcher.timing_device = state["x"].device
    out = dispatcher.dispatch(state["x"], state["pft"])
    dispatcher.timings = None
    state["laps"] = laps
    return out


def run(state: dict) -> None:
    _dispatch(state)


def derive(params: dict, state: dict, time_s: float) -> dict:
    # Every rank reaches this point after the same samples, so the reductions line up.
    ctx, laps = state["ctx"], state["laps"]
    out = {stage_metric(s): ctx.all_reduce_max(laps.get(s, 0.0)) for s in state["stages"]}
    lb = state["link_bytes"]
    if lb is None:
        return out
    return {**out, "inter_node_bytes": lb["inter_node"], "intra_node_bytes": lb["intra_node"]}


def check(state: dict) -> int:
    from moe_repro.components.alltoall.flat import flat_all_to_all_v

    got = _dispatch(state)
    send = state["x"].index_select(0, state["token_order"])
    want = flat_all_to_all_v(state["comms"].world, send, state["send_counts"])
    if got.shape != want.shape:
        return max(got.numel(), want.numel(), 1)
    return int((got != want).sum())


SUITE = Suite(
    name="dispatch-stages",
    schema={
        "algo": registered("algo", timed_algorithms),
        "nodes": whole(1, 64),
        "gpus_per_node": whole(1, 64),
        "backend": one_of("gloo", "mpi"),
        "tokens": whole(0),
        "hidden": whole(1, 2**16),
        "experts": whole(1, 2**16),
        "top_k": whole(1, 2**10),
        "placement": one_of("contiguous", "strided", "random"),
        "seed": SEED,
        "dispatcher": one_of("ours", *peer_dispatcher_names()),
    },
    rules=(
        top_k_within_experts(),
        # rows sent and received per rank, and each rank's routing draw (the alltoall suite's:
        # a score per token and expert, and their argsort)
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
        "algo": timed_algorithms(),
        "nodes": [2],
        "gpus_per_node": [2],
        "backend": ["gloo"],
        "tokens": [512],
        "hidden": [1024],
        "experts": [256],
        "top_k": [8],
        "placement": ["contiguous"],
        "seed": [0],
        "dispatcher": ["ours"],
    },
    quick={"tokens": [32], "hidden": [64]},
    derived_params=derived_params,
    setup=setup,
    run=run,
    derive=derive,
    check=check,
    world_params=("ranks", "backend", "ranks_per_node"),
    table_keys=("algo", "dispatcher", "nodes", "gpus_per_node", "tokens", "hidden"),
    table_metrics=("time_s", "inter_node_bytes"),
    metrics=[
        Metric(
            "inter_node_bytes",
            "B",
            "lower",
            description="bytes sent to other nodes in one call, all ranks, metadata included",
        ),
        Metric(
            "intra_node_bytes",
            "B",
            "none",
            description="bytes sent to other ranks of the same node in one call, all ranks",
        ),
        # one metric per stage name (flat and HALO share theirs: their dispatchers differ
        # only in the exchange)
        *(
            Metric(
                stage_metric(s),
                "s",
                "lower",
                description=f"{', '.join(n for n, st in _stage_owners() if s in st)}: "
                f"{s}, slowest rank",
            )
            for s in dict.fromkeys(s for _, stages in _stage_owners() for s in stages)
        ),
    ],
    param_help={
        "algo": "an all-to-all that times its stages: " + ", ".join(timed_algorithms()),
        "nodes": "emulated nodes",
        "gpus_per_node": "ranks per emulated node",
        "backend": "gloo or mpi",
        "tokens": "tokens per rank",
        "hidden": "float32 values per row",
        "experts": "experts in total",
        "top_k": "experts per token",
        "placement": "expert -> rank map: contiguous, strided or random",
        "seed": "input and routing seed",
        "dispatcher": "ours (the algorithm's) or a peer's own, on the same inputs: "
        + ", ".join(peer_dispatcher_names())
        + " (with --algo flat; the peers extra)",
    },
)
