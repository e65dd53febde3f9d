"""rank-layout-traffic: EP-first vs DP-first rank layout, the bytes one MoE layer step puts on
each link class, over real ranks with emulated nodes (X-MoE App. C.1).

A world of ``nodes`` x ``gpus_per_node`` gloo ranks is split into EP groups of ``ep`` ranks and
DP groups of the rest, in the rank ``order`` (components/network/rank_layout.py). The measured
call is one MoE layer's communication for one step:
- the token all-to-all, 4 exchanges (dispatch and combine, forward and backward) inside the EP
  group: each rank sends ``tokens`` x ``top_k`` rows of ``hidden`` float32 values, routed at
  random (or evenly, ``uniform``) over its EP peers;
- a ring all-reduce (reduce-scatter + all-gather over P2P messages) of ``expert_params`` float32
  gradient elements over the DP group.
Set-up makes one logged call and counts the bytes every message put on each link class, summed
over all ranks (the counts exchange is metadata and not counted). The formula for the same
sizes is components.network.rank_layout.traffic_model.
#wrong: elements of the 4-exchange round trip that do not come back as sent, plus elements of
the ring all-reduce that differ from torch.distributed's all-reduce of the same (integer-valued,
so exactly summed) gradient.
"""

from __future__ import annotations

import torch

from moe_repro.suites.base import (
    SEED,
    Metric,
    Param,
    Rule,
    Suite,
    fits_in_memory,
    one_of,
    whole,
)

KINDS = {"alltoall": "a2a", "allreduce": "grad-allreduce"}  # metric prefix -> logged phase prefix
CLASSES = ("intra_node", "inter_node")


def derived_params(p: dict) -> dict:
    nodes, gpn, ep = int(p["nodes"]), int(p["gpus_per_node"]), int(p["ep"])
    if nodes < 1 or gpn < 1:
        raise ValueError(f"nodes and gpus_per_node must be >= 1, got {nodes}, {gpn}")
    if ep < 1 or (nodes * gpn) % ep:
        raise ValueError(f"EP degree {ep} must divide the {nodes * gpn} ranks")
    return {"ranks": nodes * gpn, "ranks_per_node": gpn}


def setup(params: dict, ctx) -> dict:
    import torch.distributed as dist

    from moe_repro.components.alltoall.flat import TorchComm
    from moe_repro.components.network.rank_layout import (
        group_of,
        measured_bytes,
        rank_layout_groups,
    )
    from moe_repro.components.network.topology import Topology

    ep, tokens, top_k = int(params["ep"]), int(params["tokens"]), int(params["top_k"])
    hidden, expert_params = int(params["hidden"]), int(params["expert_params"])
    if min(tokens, top_k, hidden, expert_params) < 1:
        raise ValueError("tokens, top_k, hidden and expert_params must be >= 1")
    ep_groups, dp_groups = rank_layout_groups(ctx.world_size, ep, params["order"])
    handles = {tuple(g): dist.new_group(g) for g in ep_groups + dp_groups}  # all ranks, same order
    my_ep, my_dp = group_of(ctx.rank, ep_groups), group_of(ctx.rank, dp_groups)

    g = torch.Generator().manual_seed(int(params["seed"]) * 7919 + ctx.rank)
    assignments = tokens * top_k
    if params["uniform"]:
        if assignments % ep:
            raise ValueError("uniform routing needs tokens * top_k divisible by EP")
        send_counts = [assignments // ep] * ep
    else:
        dest = torch.randint(0, ep, (assignments,), generator=g)
        send_counts = torch.bincount(dest, minlength=ep).tolist()
    state = {
        "ep_comm": TorchComm(handles[tuple(my_ep)], my_ep),
        "dp_comm": TorchComm(handles[tuple(my_dp)], my_dp),
        "dp_group": handles[tuple(my_dp)],
        "send_counts": send_counts,
        "rows": torch.randn(assignments, hidden, generator=g),
        "grad": torch.randint(-1000, 1000, (expert_params,), generator=g).float(),
    }
    state["recv_counts"] = state["ep_comm"].exchange_counts(send_counts)  # metadata: not logged

    # One logged call: bytes per link class, summed over the world.
    log: list = []
    state["ep_comm"].log = state["dp_comm"].log = log
    _step(state)
    state["ep_comm"].log = state["dp_comm"].log = None
    topo = Topology(nodes=int(params["nodes"]), ranks_per_node=int(params["gpus_per_node"]))
    mine = [measured_bytes(log, topo, phase)[cls] for phase in KINDS.values() for cls in CLASSES]
    totals = torch.tensor(mine, dtype=torch.int64)
    dist.all_reduce(totals)
    names = [f"{kind}_{cls}_bytes" for kind in KINDS for cls in CLASSES]
    state["link_bytes"] = dict(zip(names, (float(v) for v in totals.tolist())))
    return state


def _step(state: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The 4 all-to-all exchanges and the ring all-reduce; (round trip result, reduced gradient)."""
    from moe_repro.components.network.rank_layout import ring_all_reduce

    comm, send, recv = state["ep_comm"], state["send_counts"], state["recv_counts"]
    dispatched = comm.alltoallv(state["rows"], send, recv, "a2a-dispatch")
    combined = comm.alltoallv(dispatched, recv, send, "a2a-combine")
    grad_dispatched = comm.alltoallv(combined, send, recv, "a2a-combine-bwd")
    back = comm.alltoallv(grad_dispatched, recv, send, "a2a-dispatch-bwd")
    return back, ring_all_reduce(state["dp_comm"], state["grad"])


def run(state: dict) -> None:
    _step(state)


def derive(params: dict, state: dict, time_s: float) -> dict:
    return dict(state["link_bytes"])


def check(state: dict) -> int:
    import torch.distributed as dist

    back, ring = _step(state)
    reference = state["grad"].clone()
    dist.all_reduce(reference, group=state["dp_group"])
    return int((back != state["rows"]).sum()) + int((ring != reference).sum())


SUITE = Suite(
    name="rank-layout-traffic",
    schema={
        "order": one_of("ep-first", "dp-first"),
        "nodes": whole(1, 64),
        "gpus_per_node": whole(1, 64),
        "ep": whole(1, 4096),
        "tokens": whole(1),
        "top_k": whole(1, 2**10),
        "hidden": whole(1, 2**16),
        "expert_params": whole(1, 2**34),
        "seed": SEED,
        "uniform": Param(bool),
    },
    rules=(
        Rule(
            lambda p: not p["uniform"] or int(p["tokens"]) * int(p["top_k"]) % int(p["ep"]) == 0,
            "uniform routing needs tokens * top_k ({tokens} * {top_k}) divisible by ep={ep}",
            {"uniform": "true", "tokens": "3", "top_k": "1", "ep": "2", "nodes": "1"},
        ),
        fits_in_memory(
            lambda p: (
                4
                * int(p["ranks"])
                * (
                    2 * int(p["tokens"]) * int(p["top_k"]) * int(p["hidden"])
                    + 2 * int(p["expert_params"])
                )
            ),
            {"expert_params": str(2**34)},
        ),
    ),
    params={
        "order": ["ep-first", "dp-first"],
        "nodes": [2],
        "gpus_per_node": [2],
        "ep": [2],
        "tokens": [64],
        "top_k": [2],
        "hidden": [32],
        "expert_params": [4096],
        "seed": [0],
        "uniform": [False],
    },
    quick={"tokens": [16], "expert_params": [1024]},
    derived_params=derived_params,
    setup=setup,
    run=run,
    derive=derive,
    check=check,
    world_params=("ranks", "ranks_per_node"),
    table_keys=("order", "nodes", "gpus_per_node", "ep"),
    table_metrics=("time_s", "alltoall_inter_node_bytes", "allreduce_inter_node_bytes"),
    metrics=[
        Metric(
            f"{kind}_{cls}_bytes",
            "B",
            "none",
            description=f"bytes the {kind} step sent on {cls.replace('_', '-')} links, all ranks",
        )
        for kind in KINDS
        for cls in CLASSES
    ],
    param_help={
        "order": "ep-first (EP groups inside nodes) or dp-first (DP groups inside nodes)",
        "nodes": "emulated nodes",
        "gpus_per_node": "ranks per emulated node",
        "ep": "EP degree (divides the ranks)",
        "tokens": "tokens per rank",
        "top_k": "experts per token",
        "hidden": "float32 values per row",
        "expert_params": "expert gradient elements per rank (float32)",
        "seed": "routing and data seed",
        "uniform": "even routing (tokens * top_k divisible by ep) instead of random",
    },
)
