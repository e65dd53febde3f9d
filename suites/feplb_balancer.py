"""FEPLB's greedy balancer: decision time per micro-batch (FEPLB Sec. 2: "completes in
approximately 50 us on a single CPU core"; our goal: <= 20 us median for 128 experts, EP = 8,
dyn = 4).

One ``run`` = one micro-batch decision: ``greedy_balance`` on the next micro-batch's counts of
a synthetic GLM-5-shaped trace (128 experts, top-8), cycling through its micro-batches. The
dynamic set is fixed per micro-batch beforehand (the paper's periodic Router Predictor step,
not per-micro-batch work). ``check`` counts plans whose loads differ from a recount of the
moves, that move a non-dynamic expert, or that raise the maximum load (#wrong = 0: correct).
"""

from __future__ import annotations

from moe_repro.components.balance.feplb import ExpertPartition, greedy_balance
from moe_repro.components.moe.moe_layer import ExpertPlacement
from moe_repro.components.balance.routing_trace import synthetic_trace
from moe_repro.suites.base import Metric, Rule, Suite, divides, fits_in_memory, whole

MICRO_BATCHES, TOKENS_PER_SOURCE = 33, 512  # the synthetic trace every point draws


def memory_bytes(p: dict) -> float:
    """The trace's int64 counts [micro-batches, ep, experts] and, while one micro-batch is
    drawn, its float64 Gumbel scores [ep, tokens per source, experts] and their temporaries."""
    ep, experts = int(p["ep"]), int(p["experts"])
    return 8 * ep * experts * (MICRO_BATCHES + 4 * TOKENS_PER_SOURCE)


def setup(params: dict, ctx=None) -> dict:
    experts, ep, dyn = int(params["experts"]), int(params["ep"]), int(params["dyn"])
    trace = synthetic_trace(1, MICRO_BATCHES, experts, 8, TOKENS_PER_SOURCE, ep, seed=experts + ep)
    placement = ExpertPlacement.contiguous(experts, ep)
    counts = [trace.expert_counts(0, mb).tolist() for mb in range(trace.num_micro_batches)]
    partitions = [
        ExpertPartition.choose(placement, dyn, counts[mb - 1]) for mb in range(1, len(counts))
    ]
    return {
        "counts": counts[1:],
        "partitions": partitions,
        "i": 0,
        "tau": int(params["tau"]),
        "max_num_dyn": 8,
        "placement": placement,
    }


def run(state: dict):
    i = state["i"] % len(state["counts"])
    state["i"] += 1
    return greedy_balance(
        state["counts"][i], state["partitions"][i], state["tau"], state["max_num_dyn"]
    )


def derive(params: dict, state: dict, time_s: float) -> dict:
    return {"decide_us": time_s * 1e6}


def check(state: dict) -> int:
    wrong = 0
    ranks0 = state["placement"].rank_of_expert().tolist()
    for counts, part in zip(state["counts"], state["partitions"]):
        plan = greedy_balance(counts, part, state["tau"], state["max_num_dyn"])
        ranks = list(ranks0)
        for m in plan.moves:
            wrong += m.expert not in part.dynamic_of_rank[m.src]
            ranks[m.expert] = m.dst
        recount = [
            sum(c for c, r in zip(counts, ranks) if r == d) for d in range(len(plan.loads_after))
        ]
        wrong += recount != plan.loads_after
        wrong += max(plan.loads_after) > max(plan.loads_before)
    return wrong


SUITE = Suite(
    name="feplb-balancer",
    schema={
        "experts": whole(1, 2**16),
        "ep": whole(1, 4096),
        "dyn": whole(1, 2**16),
        "tau": whole(0, 2**30),
    },
    rules=(
        divides("ep", "experts", {"ep": "3", "experts": "128"}),
        Rule(
            lambda p: int(p["dyn"]) <= int(p["experts"]) // int(p["ep"]),
            "dyn={dyn} exceeds the experts per device (experts={experts} / ep={ep})",
            {"dyn": "64", "ep": "4", "experts": "128"},
        ),
        fits_in_memory(
            memory_bytes, {"ep": "4096", "experts": str(2**16)}, what="its routing trace"
        ),
    ),
    params={"experts": [128], "ep": [2, 4, 8], "dyn": [2, 4, 8], "tau": [0]},
    quick={"ep": [8], "dyn": [4]},
    setup=setup,
    run=run,
    derive=derive,
    check=check,
    metrics=[Metric("decide_us", "us", "lower", description="time_s * 1e6, one micro-batch")],
    param_help={
        "experts": "routed experts",
        "ep": "EP degree (devices balanced over)",
        "dyn": "dynamic experts per device",
        "tau": "minimum tokens to copy an expert",
    },
)
