"""imbalance: every registered balancer on every routing workload, at EP 2-16.

A grid point is (``mode``, ``balancer``, ``workload``, ``ep``, ``seed``). The workload
(components/balance/workloads.py) gives the routing of ``steps`` steps, the same at every EP;
step 0 is history only, the balancer plans steps 1..steps-1 under the contiguous home
placement, and every metric is the mean over those steps (and layers).

Modes: ``stats`` (routing statistics in one process; the measured call is one balancer
decision), ``real`` (the plan executed on ``ep`` real local gloo ranks at a small exact size:
dispatch, experts, combine; the measured call is one step) and ``simulated`` (the statistics at
scale, no process started, recorded ``simulated: true``; EP beyond 8 spans nodes of 8 GPUs).

Metrics: analytic ``max_over_mean``, ``token_straggler`` (FEPLB Sec. 3.1), ``token_bytes``,
``inter_node_bytes`` and ``weight_bytes`` (GLM-5 expert sizes); simulated
``gemm_straggler_us`` (a roofline model, not a measurement); measured ``time_s`` and
``decide_us``. #wrong: the exact oracle of components/balance/row_plan.py and, in ``real``
mode, output elements that differ from the dense reference (exact arithmetic).

Why: one grid puts every balancer on the same routings, so their balance, traffic and cost
compare. The modes and metrics in full: see docs/balance-workloads.md.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from moe_repro.runtime.timing import host_seconds
from moe_repro.components.alltoall import get_algorithm
from moe_repro.components.balance import balancer_names, get_balancer
from moe_repro.components.balance.base import BalanceStep
from moe_repro.components.balance.row_plan import count_wrong, rows_to_devices, weight_copies
from moe_repro.components.balance.routing_trace import (
    GemmTimeModel,
    gemm_straggler,
    token_straggler,
)
from moe_repro.components.balance.workloads import STANDARD, get_workload, workload_names
from moe_repro.components.moe.moe_layer import ExpertPlacement
from moe_repro.suites.base import (
    SEED,
    Metric,
    Suite,
    divides,
    fits_in_memory,
    one_of,
    registered,
    top_k_within_experts,
    whole,
)

MODES = ("stats", "real", "simulated")
GPUS_PER_NODE = 8
# the real-count workload whose Before-LB device imbalance at EP=2 is nearest FEPLB Table 3's
# (reproductions/feplb_table3.py picks it; listed here so the grid holds it)
WORKLOADS = (
    *STANDARD,
    "synthetic",
    "olmoe-c4-L7",
    "olmoe-arxiv-L0",
    "olmoe-switch",
    "olmoe-layers",
)
REAL_SIZE = {"d_model": 16, "d_ffn": 32}


@lru_cache(maxsize=1)
def glm5_scale() -> tuple[GemmTimeModel, int, int]:
    """(GEMM time model, bytes of one token row, bytes of one expert's weights) at GLM-5's
    shape on an H100 (the dgx-h100 profile), as feplb-table4 uses."""
    from moe_repro.components.model.zoo import get_model
    from moe_repro.components.network.platform import load_builtin

    m, p = get_model("glm5-moe"), load_builtin("dgx-h100")
    model = GemmTimeModel(m.d_model, m.d_ffn, p.gemm_flops, p.hbm_bytes_per_s, n_mat=m.n_mat)
    return model, m.d_model * 2, m.n_mat * m.d_model * m.d_ffn * 2


def derived_params(p: dict) -> dict:
    ep = int(p["ep"])
    if ep < 1:
        raise ValueError(f"ep must be >= 1, got {ep}")
    if int(p["steps"]) < 2:
        raise ValueError(f"steps must be >= 2 (step 0 is history), got {p['steps']}")
    experts = _workload(p).num_experts
    if experts % ep:
        raise ValueError(f"{p['workload']}: {experts} experts do not divide over EP={ep}")
    out = {
        "ranks": ep if p["mode"] == "real" else 1,
        "simulated": p["mode"] == "simulated",
        "nodes": -(-ep // GPUS_PER_NODE),
    }
    if out["simulated"]:
        out.update(
            platform=f"{out['nodes']} node(s) of {GPUS_PER_NODE} GPUs",
            simulated_because="the balancers' plans replayed on the workload's counts, "
            "GEMM time from the roofline model",
        )
    return out


def _workload(p: dict):
    name = p["workload"]
    if name in STANDARD or name == "synthetic":
        return get_workload(name, int(p["experts"]), int(p["top_k"]), int(p["tokens"]))
    return get_workload(name, tokens=int(p["tokens"]))


def memory_bytes(p: dict) -> float:
    """What a point holds at its largest, in every mode (the simulated one plans in this
    process too): for every layer and step, the routing (int64 expert ids, float32 gates, the
    tokens' source ranks), the plan's counts and its [ep, experts, ep] int64 rows; the draw's
    transient [tokens, experts] scores; in real mode, on every rank, the steps' inputs and
    every expert's weights (float64)."""
    w, ep, steps = _workload(p), int(p["ep"]), int(p["steps"])
    tokens, top_k, experts = w.tokens, w.top_k, w.num_experts
    per_step = tokens * (12 * top_k + 8) + 8 * ep * experts * (2 + ep)
    need = w.num_layers * steps * per_step + 16 * tokens * experts
    if p["mode"] == "real":
        h, f = REAL_SIZE["d_model"], REAL_SIZE["d_ffn"]
        need += ep * (
            2 * 8 * experts * h * f + w.num_layers * steps * tokens * (8 * h + 12 * top_k)
        )
    return need


def point_seconds(p: dict) -> float:
    """Seconds one point takes on a 2-core CPU machine (the estimate before a long run): the
    plans and statistics grow with the routed rows (steps x tokens x top_k x layers, here
    relative to the default grid's) and a little with ep; a real point adds every step run
    once on ep ranks beside its dense reference."""
    w, ep = _workload(p), int(p["ep"])
    rows = int(p["steps"]) * w.tokens * w.top_k * w.num_layers / (4 * 4096 * 8)
    seconds = (0.4 + 0.07 * ep) * rows
    if p["mode"] == "real":
        seconds += (0.1 + 0.12 * ep) * rows
    return seconds


def plan_steps(p: dict) -> dict:
    """Every measured step's BalanceStep, decision, row plan and oracle count."""
    w, ep = _workload(p), int(p["ep"])
    placement = ExpertPlacement.contiguous(w.num_experts, ep)
    balancer = get_balancer(p["balancer"])
    steps = []
    for layer in range(w.num_layers):
        routings = [w.routing(int(p["seed"]), s, ep, layer) for s in range(int(p["steps"]))]
        for s in range(1, len(routings)):
            step = BalanceStep(
                placement,
                routings[s].source_counts(w.num_experts, ep),
                routings[s - 1].source_counts(w.num_experts, ep),
            )
            work = balancer.run(step)
            rows = rows_to_devices(balancer.name, step, work)
            steps.append(
                {
                    "step": step,
                    "work": work,
                    "rows": rows,
                    "routing": routings[s],
                    "wrong": count_wrong(step, work, rows),
                }
            )
    return {"workload": w, "placement": placement, "balancer": balancer, "steps": steps}


def routing_stats(p: dict, plan: dict) -> dict:
    """The analytic and modelled metrics, means over the measured steps."""
    model, row_bytes, expert_bytes = glm5_scale()
    ep = int(p["ep"])
    node = torch.arange(ep) // GPUS_PER_NODE
    home = plan["placement"].rank_of_expert().tolist()
    sums = {
        "max_over_mean": 0.0,
        "token_straggler": 0.0,
        "gemm_straggler_us": 0.0,
        "token_bytes": 0.0,
        "inter_node_bytes": 0.0,
        "weight_bytes": 0.0,
    }
    for s in plan["steps"]:
        loads, rows = s["work"].loads, s["rows"]
        mean = sum(loads) / len(loads)
        sums["max_over_mean"] += max(loads) / mean if mean else 1.0
        sums["token_straggler"] += token_straggler(loads)
        sums["gemm_straggler_us"] += (
            gemm_straggler(model.device_times_s(s["work"].gemm_groups)) * 1e6
        )
        per_pair = rows.sum(1)  # [W_src, W_dst]
        away = per_pair.sum() - per_pair.diagonal().sum()
        sums["token_bytes"] += float(away) * row_bytes
        crossing = per_pair[node.unsqueeze(1) != node.unsqueeze(0)].sum()
        sums["inter_node_bytes"] += float(crossing) * row_bytes
        sums["weight_bytes"] += weight_copies(rows, home) * expert_bytes
    n = len(plan["steps"])
    return {k: v / n for k, v in sums.items()}


# --- real mode: the plan executed over real ranks --------------------------------------------------


def _expert_weights(p: dict, experts: int):
    """Integer weights of every expert, the same on every rank (drawn from the seed alone)."""
    g = torch.Generator().manual_seed(1000 + int(p["seed"]))
    h, f = REAL_SIZE["d_model"], REAL_SIZE["d_ffn"]
    w1 = torch.randint(-2, 3, (experts, h, f), generator=g).double()
    w2 = torch.randint(-2, 3, (experts, f, h), generator=g).double()
    return w1, w2


def _ffn(x, w1, w2):
    return torch.relu(x @ w1) @ w2


def _real_step(state: dict, s: dict) -> torch.Tensor:
    """One step on this rank: counts all-gathered, decision, dispatch, experts, combine.

    The plan cuts each expert's rows over devices, so the dispatch routes (token, slot) pairs
    to *device slots*: slot e * W + d is expert e's share on device d, placed on rank d. The
    registry's flat dispatcher moves them (PFT order: slot, then pair; grouped by destination,
    so each source's rows arrive expert-major), and its combine (weights 1) returns every pair's
    output to its pair: the gates are applied here in slot order, as the reference does."""
    from moe_repro.components.moe.pft import PFT

    me, world, experts = state["rank"], state["ep"], state["experts"]
    dispatcher = state["dispatcher"]
    ids, gates, x = s["ids"], s["gates"], s["x"]
    local = torch.bincount(ids.reshape(-1), minlength=experts)
    gathered = torch.tensor(dispatcher.comm().allgather_ints(local.tolist()), dtype=torch.int64)
    t0 = host_seconds()  # the balancer's decision is host-only planning: the host clock times it
    step = BalanceStep(state["placement"], gathered, s["previous"])
    work = state["balancer"].run(step)
    rows = rows_to_devices(state["balancer"].name, step, work)
    state["decide_s"].append(host_seconds() - t0)
    # this rank's token-expert pairs, expert-major, each expert's rows cut over devices in order
    flat_e = ids.reshape(-1)
    pairs = flat_e.numel()
    pair_index = torch.arange(pairs)
    order = torch.argsort(flat_e * pairs + pair_index)  # by expert, then pair
    dest = torch.empty(pairs, dtype=torch.int64)
    start = 0
    mine = rows[me]  # [E, W]
    for e in range(experts):
        for d in range(world):
            n = int(mine[e, d])
            dest[order[start : start + n]] = d
            start += n
    device_slot = flat_e * world + dest
    by_slot = torch.argsort(device_slot * pairs + pair_index)
    pft = PFT(
        token_ids=by_slot,  # one "token" per pair
        expert_ids=device_slot[by_slot],
        tokens_per_expert=torch.bincount(device_slot, minlength=experts * world),
        combine_weights=torch.ones(pairs, dtype=x.dtype),
        num_tokens=pairs,
    )
    tokens = torch.arange(ids.shape[0]).repeat_interleave(ids.shape[1])
    received = dispatcher.dispatch(x[tokens], pft)
    # rows from source r arrive expert-major: their experts are known from the plan
    recv_experts = torch.cat(
        [torch.arange(experts).repeat_interleave(rows[r, :, me]) for r in range(world)]
    )
    out = torch.empty_like(received)
    for e in torch.unique(recv_experts).tolist():
        sel = (recv_experts == e).nonzero().flatten()
        out[sel] = _ffn(received[sel], state["w1"][e], state["w2"][e])
    pair_out = dispatcher.combine(out, pairs).reshape(ids.shape[0], ids.shape[1], -1)
    y = torch.zeros(ids.shape[0], x.shape[1], dtype=x.dtype)
    for j in range(ids.shape[1]):  # gate, then sum in slot order
        y += gates[:, j : j + 1].double() * pair_out[:, j]
    return y


def _reference(state: dict, s: dict) -> torch.Tensor:
    ids, gates, x = s["ids"], s["gates"], s["x"]
    pair_out = torch.empty(ids.shape[0], ids.shape[1], x.shape[1], dtype=x.dtype)
    for e in torch.unique(ids).tolist():
        t, j = (ids == e).nonzero(as_tuple=True)
        pair_out[t, j] = _ffn(x[t], state["w1"][e], state["w2"][e])
    y = torch.zeros(ids.shape[0], x.shape[1], dtype=x.dtype)
    for j in range(ids.shape[1]):
        y += gates[:, j : j + 1].double() * pair_out[:, j]
    return y


def _setup_real(p: dict, plan: dict, ctx) -> dict:
    torch.set_num_threads(1)
    w = plan["workload"]
    state = {
        "rank": ctx.rank,
        "ep": int(p["ep"]),
        "experts": w.num_experts,
        "placement": plan["placement"],
        "balancer": plan["balancer"],
        "decide_s": [],
        "i": 0,
    }
    state["w1"], state["w2"] = _expert_weights(p, w.num_experts)
    # the EP dispatch: the registry's flat dispatcher over device slots (see _real_step)
    slot_rank = [slot % state["ep"] for slot in range(w.num_experts * state["ep"])]
    state["dispatcher"] = get_algorithm("flat").group_dispatcher(slot_rank)
    g = torch.Generator().manual_seed(2000 + int(p["seed"]))
    local_steps = []
    for s in plan["steps"]:
        r = s["routing"]
        mask = r.source_ranks(state["ep"]) == ctx.rank
        x_all = torch.randint(-3, 4, (r.tokens, REAL_SIZE["d_model"]), generator=g).double()
        local_steps.append(
            {
                "ids": r.expert_ids[mask],
                "gates": r.gates[mask],
                "x": x_all[mask],
                "previous": s["step"].previous_source_counts,
            }
        )
    state["local_steps"] = local_steps
    wrong = 0
    for s in local_steps:  # one pass of every step against the dense reference
        wrong += int((_real_step(state, s) != _reference(state, s)).sum())
    state["output_wrong"] = wrong
    state["decide_s"].clear()
    return state


def setup(params: dict, ctx=None) -> dict:
    if params["mode"] not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {params['mode']!r}")
    plan = plan_steps(params)
    state = {
        "mode": params["mode"],
        "plan": plan,
        "stats": routing_stats(params, plan),
        "plan_wrong": sum(s["wrong"] for s in plan["steps"]),
        "i": 0,
        "decide_s": [],
    }
    if params["mode"] == "real":
        state["real"] = _setup_real(params, plan, ctx)
    return state


def run(state: dict):
    if state["mode"] == "real":
        real = state["real"]
        s = real["local_steps"][real["i"] % len(real["local_steps"])]
        real["i"] += 1
        return _real_step(real, s)
    steps = state["plan"]["steps"]
    s = steps[state["i"] % len(steps)]
    state["i"] += 1
    return state["plan"]["balancer"].run(s["step"])


def derive(params: dict, state: dict, time_s: float) -> dict:
    if state["mode"] == "real":
        times = state["real"]["decide_s"]
        decide = sorted(times)[len(times) // 2] if times else float("nan")
        times.clear()
    else:
        decide = time_s
    return {"decide_us": decide * 1e6, **state["stats"]}


def check(state: dict) -> int:
    return state["plan_wrong"] + (state["real"]["output_wrong"] if state["mode"] == "real" else 0)


def simulate(params: dict) -> dict:
    plan = plan_steps(params)
    wrong = sum(s["wrong"] for s in plan["steps"])
    return {**routing_stats(params, plan), "wrong": wrong, "correct": wrong == 0}


SUITE = Suite(
    name="imbalance",
    schema={
        "mode": one_of(*MODES),
        "balancer": registered("balancer", balancer_names),
        "workload": registered("workload", workload_names),
        "ep": whole(1, 4096),
        "seed": SEED,
        "steps": whole(1, 10000),
        "experts": whole(1, 2**16),
        "top_k": whole(1, 2**10),
        "tokens": whole(1, 2**24),
        "backend": one_of("gloo"),
    },
    rules=(
        top_k_within_experts(),
        divides("ep", "experts", {"ep": "3", "experts": "64"}),
        fits_in_memory(
            memory_bytes,
            {"tokens": str(2**24), "experts": str(2**16)},
            what="its routings and plans",
            simulated_too=True,
        ),
    ),
    params={
        "mode": ["stats", "real"],
        "balancer": list(balancer_names()),
        "workload": list(WORKLOADS),
        "ep": [2, 4, 8, 16],
        "seed": [0, 1, 2, 3, 4],
        "steps": [4],
        "experts": [64],
        "top_k": [8],
        "tokens": [4096],
        "backend": ["gloo"],
    },
    quick={"mode": ["stats"], "ep": [2, 8], "seed": [0], "steps": [3], "tokens": [1024]},
    choices={"mode": MODES, "workload": workload_names()},
    setup=setup,
    run=run,
    derive=derive,
    check=check,
    simulate=simulate,
    derived_params=derived_params,
    point_seconds=point_seconds,
    world_params=("ranks", "backend"),
    table_keys=("mode", "balancer", "workload", "ep", "seed"),
    table_metrics=("max_over_mean", "token_straggler", "decide_us"),
    metrics=[
        Metric(
            "decide_us",
            "us",
            "lower",
            description="one balancer decision (FEPLB Sec. 2 budgets ~50 us)",
        ),
        Metric(
            "max_over_mean",
            "x",
            "lower",
            kind="analytic",
            description="busiest device's token-expert rows over the mean, mean over steps",
        ),
        Metric(
            "token_straggler",
            "rows",
            "lower",
            kind="analytic",
            description="FEPLB Sec. 3.1: max - mean rows per device, mean over steps",
        ),
        Metric(
            "gemm_straggler_us",
            "us",
            "lower",
            kind="simulated",
            description="max - mean grouped-GEMM time per device, roofline model of a GLM-5 "
            "expert on an H100",
        ),
        Metric(
            "token_bytes",
            "B",
            "lower",
            kind="analytic",
            description="rows computed away from their source x 6144 x 2 B, per step",
        ),
        Metric(
            "inter_node_bytes",
            "B",
            "lower",
            kind="analytic",
            description="the part of token_bytes crossing nodes of 8 GPUs",
        ),
        Metric(
            "weight_bytes",
            "B",
            "lower",
            kind="analytic",
            description="experts computed away from their home x one GLM-5 expert's weights",
        ),
    ],
    param_help={
        "mode": "stats (one process), real (gloo ranks), simulated (no run)",
        "balancer": "a registered balancer",
        "workload": "a routing workload",
        "ep": "EP degree",
        "seed": "workload seed",
        "steps": "steps (step 0 is history)",
        "experts": "E (standard and synthetic workloads; real-count ones fix their own)",
        "top_k": "k (as experts)",
        "tokens": "tokens per step, all ranks together",
        "backend": "gloo",
    },
)
