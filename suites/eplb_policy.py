"""eplb-policy: DeepSeek EPLB's global vs hierarchical replica policy, the bytes one MoE layer's
dispatch puts across nodes and the balance each leaves, on routing traces (analytic).

A machine of ``nodes`` x ``gpus_per_node`` GPUs holds ``experts`` routed experts, E / GPUs per
GPU plus ``redundant_slots`` spare slots per GPU (DeepSeek-V3's prefill deployment: 32 GPUs, 256
experts, 32 redundant ones, i.e. one per GPU; V3 Sec. 3.4.1). For each micro-batch after the
first, a replica plan is made from the previous micro-batch's expert counts
(components/balance/eplb_replication.plan_replicas, as the registered EPLB balancer does), then
the micro-batch's tokens are dispatched to it (``dispatch_traffic``: a token uses a replica on
its own node when its expert has one there, and crosses to each remote node once). ``policy``:
- ``global``: replicas anywhere (EPLB's global policy), at most one per GPU;
- ``hierarchical``: ``groups`` expert groups packed onto nodes, replicas kept on their group's
  node (EPLB's ``rebalance_experts_hierarchical``), at most one per GPU of the node;
- ``none``: the baseline, no replicas: expert e on GPU e // (E / GPUs), the contiguous placement.
``trace``: ``synthetic`` is the project's synthetic_trace (every token picks its top-k among all
experts); ``group-limited`` is DeepSeek-V3's node-limited routing (group_limited_trace: top
``top_groups`` of ``groups`` groups by the sum of each group's top-2 affinities, then the top-k
experts in them). Both share ``skew`` (log-normal expert popularity) and ``seed``.

Metrics, means over the measured micro-batches: ``inter_node_bytes`` (dispatch bytes crossing
nodes per micro-batch, all GPUs, ``hidden`` x ``itemsize`` per token row; the combine sends as
many back), ``max_over_mean_load`` (busiest GPU's rows over the mean, under that dispatch),
``remote_nodes_per_token``. ``time_s`` is one plan_replicas call. #wrong: plans that break a
rule (an expert without a replica, a slot left empty or over-full, two replicas of one expert on
a GPU, a hierarchical replica off its group's node) plus dispatches that lose or add rows.
"""

from __future__ import annotations

from functools import lru_cache

from moe_repro.components.balance.eplb_replication import (
    ReplicaPlan,
    dispatch_traffic,
    plan_replicas,
)
from moe_repro.components.balance.routing_trace import (
    RoutingTrace,
    group_limited_trace,
    synthetic_trace,
)
from moe_repro.suites.base import (
    SEED,
    Metric,
    Param,
    Rule,
    Suite,
    fits_in_memory,
    one_of,
    top_k_within_experts,
    whole,
)

POLICIES = ("none", "global", "hierarchical")
TRACES = ("synthetic", "group-limited")


def derived_params(p: dict) -> dict:
    nodes, gpus_per_node, experts = int(p["nodes"]), int(p["gpus_per_node"]), int(p["experts"])
    if nodes < 1 or gpus_per_node < 1:
        raise ValueError(f"nodes and gpus_per_node must be >= 1, got {nodes}, {gpus_per_node}")
    gpus = nodes * gpus_per_node
    if experts % gpus:
        raise ValueError(f"{experts} experts do not divide over {gpus} GPUs")
    if int(p["groups"]) < 1 or experts % int(p["groups"]):
        raise ValueError(f"{p['groups']} groups do not divide the {experts} experts")
    if p["policy"] == "hierarchical" and int(p["groups"]) % nodes:
        raise ValueError(f"hierarchical: {nodes} nodes do not divide the {p['groups']} groups")
    slots = experts // gpus + (0 if p["policy"] == "none" else int(p["redundant_slots"]))
    return {
        "gpus": gpus,
        "slots_per_gpu": slots,
        "row_bytes": int(p["hidden"]) * int(p["itemsize"]),
    }


@lru_cache(maxsize=4)
def _trace(
    kind: str,
    micro_batches: int,
    experts: int,
    top_k: int,
    tokens: int,
    gpus: int,
    groups: int,
    top_groups: int,
    skew: float,
    seed: int,
) -> RoutingTrace:
    """One layer, ``micro_batches`` + 1 micro-batches (the first is only history); shared by the
    policies of one grid (traces are not modified)."""
    if kind == "synthetic":
        return synthetic_trace(
            1,
            micro_batches + 1,
            experts,
            top_k,
            tokens,
            gpus,
            skew=skew,
            seed=seed,
            keep_tokens=True,
        )
    return group_limited_trace(
        1,
        micro_batches + 1,
        experts,
        top_k,
        tokens,
        gpus,
        num_groups=groups,
        top_groups=top_groups,
        skew=skew,
        seed=seed,
    )


def _plan(state: dict, history: list[int]) -> ReplicaPlan:
    p = state["params"]
    gpus, gpus_per_node, experts = p["gpus"], int(p["gpus_per_node"]), int(p["experts"])
    if p["policy"] == "none":
        per_gpu = experts // gpus
        return ReplicaPlan(
            [list(range(g * per_gpu, (g + 1) * per_gpu)) for g in range(gpus)],
            [1] * experts,
            [float(sum(history[g * per_gpu : (g + 1) * per_gpu])) for g in range(gpus)],
        )
    # as many replicas of one expert as there are GPUs it may use (one per GPU)
    cap = gpus_per_node if p["policy"] == "hierarchical" else gpus
    return plan_replicas(
        history,
        gpus,
        p["slots_per_gpu"],
        max_replicas=cap,
        policy=p["policy"],
        num_groups=int(p["groups"]),
        gpus_per_node=gpus_per_node,
    )


def setup(params: dict, ctx=None) -> dict:
    if int(params["micro_batches"]) < 1:
        raise ValueError("micro_batches must be >= 1")
    trace = _trace(
        params["trace"],
        int(params["micro_batches"]),
        int(params["experts"]),
        int(params["top_k"]),
        int(params["tokens"]),
        params["gpus"],
        int(params["groups"]),
        int(params["top_groups"]),
        float(params["skew"]),
        int(params["seed"]),
    )
    tokens_per_gpu = int(params["tokens"])
    state = {
        "params": params,
        "trace": trace,
        "i": 0,
        "histories": [
            trace.expert_counts(0, mb - 1).tolist() for mb in range(1, trace.num_micro_batches)
        ],
    }
    state["plans"] = [_plan(state, history) for history in state["histories"]]
    source_gpus = [t // tokens_per_gpu for t in range(tokens_per_gpu * params["gpus"])]
    state["traffic"] = [
        dispatch_traffic(
            plan,
            trace.top_experts[0][mb],
            source_gpus,
            int(params["gpus_per_node"]),
            params["row_bytes"],
        )
        for mb, plan in enumerate(state["plans"], start=1)
    ]
    steps = len(state["traffic"])
    state["metrics"] = {
        "inter_node_bytes": sum(t.inter_node_bytes for t in state["traffic"]) / steps,
        "max_over_mean_load": sum(t.max_over_mean_load for t in state["traffic"]) / steps,
        "remote_nodes_per_token": sum(t.remote_nodes_per_token for t in state["traffic"]) / steps,
    }
    return state


def run(state: dict) -> ReplicaPlan:
    history = state["histories"][state["i"] % len(state["histories"])]
    state["i"] += 1
    return _plan(state, history)


def derive(params: dict, state: dict, time_s: float) -> dict:
    return dict(state["metrics"])


def check(state: dict) -> int:
    p = state["params"]
    gpus_per_node, experts = int(p["gpus_per_node"]), int(p["experts"])
    group_size = experts // int(p["groups"])
    wrong = 0
    for plan, traffic in zip(state["plans"], state["traffic"]):
        held = [e for gpu in plan.experts_of_gpu for e in gpu]
        wrong += any(len(gpu) != p["slots_per_gpu"] for gpu in plan.experts_of_gpu)
        wrong += any(len(set(gpu)) != len(gpu) for gpu in plan.experts_of_gpu)
        wrong += any(
            held.count(e) != plan.replicas[e] or plan.replicas[e] < 1 for e in range(experts)
        )
        if p["policy"] == "hierarchical":
            wrong += any(
                plan.node_of_group[e // group_size] != g // gpus_per_node
                for g, gpu in enumerate(plan.experts_of_gpu)
                for e in gpu
            )
        wrong += sum(traffic.gpu_rows) != traffic.tokens * state["trace"].top_k
    return wrong


SUITE = Suite(
    name="eplb-policy",
    schema={
        "policy": one_of(*POLICIES),
        "trace": one_of(*TRACES),
        "nodes": whole(1, 1024),
        "gpus_per_node": whole(1, 64),
        "groups": whole(1, 2**16),
        "top_groups": whole(1, 2**16),
        "experts": whole(1, 2**16),
        "top_k": whole(1, 2**10),
        "redundant_slots": whole(0, 64),
        "tokens": whole(1),
        "micro_batches": whole(1, 1024),
        "hidden": whole(1, 2**16),
        "itemsize": whole(1, 8),
        "skew": Param(float, 0.0, 100.0),
        "seed": SEED,
    },
    rules=(
        top_k_within_experts(),
        Rule(
            lambda p: int(p["top_groups"]) <= int(p["groups"]),
            "top_groups={top_groups} exceeds groups={groups}",
            {"top_groups": "9", "groups": "8"},
        ),
        # the trace's expert choices: micro-batches x tokens on every GPU x top_k (int64),
        # its counts per GPU and expert (int64), and while one micro-batch is drawn its float64
        # Gumbel scores per token and expert with their temporaries
        fits_in_memory(
            lambda p: (
                8
                * int(p["nodes"])
                * int(p["gpus_per_node"])
                * (
                    (int(p["micro_batches"]) + 1)
                    * (2 * int(p["tokens"]) * int(p["top_k"]) + int(p["experts"]))
                    + 4 * int(p["tokens"]) * int(p["experts"])
                )
            ),
            {"tokens": str(2**20), "micro_batches": "1024"},
        ),
    ),
    params={
        "policy": list(POLICIES),
        "trace": list(TRACES),
        "nodes": [4],
        "gpus_per_node": [8],
        "groups": [8],
        "top_groups": [4],
        "experts": [256],
        "top_k": [8],
        "redundant_slots": [1],
        "tokens": [512],
        "micro_batches": [4],
        "hidden": [7168],
        "itemsize": [2],
        "skew": [1.0],
        "seed": [0],
    },
    quick={"tokens": [128], "micro_batches": [2]},
    derived_params=derived_params,
    setup=setup,
    run=run,
    derive=derive,
    check=check,
    choices={"policy": POLICIES, "trace": TRACES},
    table_keys=("trace", "policy", "nodes", "gpus_per_node", "groups"),
    table_metrics=("inter_node_bytes", "max_over_mean_load", "remote_nodes_per_token"),
    metrics=[
        Metric(
            "inter_node_bytes",
            "B",
            "lower",
            kind="analytic",
            description="dispatch bytes crossing nodes per micro-batch, all GPUs",
        ),
        Metric(
            "max_over_mean_load",
            "",
            "lower",
            kind="analytic",
            description="busiest GPU's rows / mean GPU rows under that dispatch",
        ),
        Metric(
            "remote_nodes_per_token",
            "",
            "lower",
            kind="analytic",
            description="distinct other nodes a token is sent to, mean",
        ),
    ],
    param_help={
        "policy": "none (no replicas), global or hierarchical (DeepSeek EPLB)",
        "trace": "synthetic (top-k of all experts) or group-limited (DeepSeek-V3 Sec. 2.1.2)",
        "nodes": "nodes",
        "gpus_per_node": "GPUs per node",
        "groups": "expert groups (consecutive ids); hierarchical needs nodes | groups",
        "top_groups": "groups a token may use (group-limited trace; V3: 4)",
        "experts": "routed experts",
        "top_k": "experts per token",
        "redundant_slots": "spare slots per GPU for replicas",
        "tokens": "tokens per GPU per micro-batch",
        "micro_batches": "measured micro-batches (each planned from the one before)",
        "hidden": "values per token row (V3: 7168)",
        "itemsize": "bytes per value",
        "skew": "std of log expert popularity",
        "seed": "trace seed",
    },
)
