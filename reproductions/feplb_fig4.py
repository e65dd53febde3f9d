"""feplb-fig4: EP communication per method at EP = 8 (FEPLB Fig. 4, Sec. 3.3).

FEPLB measures dispatch/combine *time* on H100s with DeepEP and prints FasterMoE pipe = 2's
extra time over Before LB (46.8% dispatch, 40.2% combine). Ours, in two steps:

1. Volume, counted exactly from per-token routing: the rows each method puts on the EP path,
   per (stage, source rank, destination rank), with a deduplicating bulk dispatch
   (components/balance/fastermoe_shadow.py's model):
   - Before LB: one row per (token, remote destination rank);
   - FasterMoE pipe = 1: shadowed experts' rows stay local; pipe = 2: two expert-group stages,
     each deduplicated on its own, so a token can cross to one rank twice (the added volume the
     paper names);
   - FEPLB: Phase 1 is the unchanged EP dispatch, so its EP volume equals Before LB by
     construction; Phase 2 moves rows and weights on the intra-node copy path, reported apart.
2. Time, the paper's quantity: those per-pair bytes replayed on the flow-level simulator
   (components/network/simulator.py) on one dgx-h100 node (EP = 8 is one NVSwitch node), the
   stages of pipe = 2 one after the other. That is our model's dispatch time; it knows
   bandwidth, per-message and link latencies, and nothing of DeepEP's per-stage kernel launch,
   count exchange and synchronisation (the simulator's assumptions list them as left out).
   Each stage waits for its own busiest port, so pipe = 2 costs more time than volume: the
   busiest port's rows summed over the stages are shown beside the extra rows.

The cells compared with the paper are the modelled "(EP time)" ones; the "(EP volume)" cells are
ours alone (the paper prints no volume).
"""

from __future__ import annotations

import torch

from moe_repro.components.balance import get_balancer
from moe_repro.components.balance.base import BalanceStep
from moe_repro.components.balance.feplb import phase2_bytes
from moe_repro.components.model.zoo import get_model
from moe_repro.components.moe.moe_layer import ExpertPlacement
from moe_repro.components.network.platform import load_builtin
from moe_repro.components.network.simulator import simulate_messages, topology_for
from moe_repro.records import grading
from moe_repro.reproductions import _feplb_traces as ft
from moe_repro.reproductions.spec import Figure, PaperClaim, PaperValue, Reproduction, Result

_SRC = "FEPLB Fig. 4 / Sec. 3.3 text"
PAPER_VALUES = [  # % extra EP time over Before LB
    PaperValue("Dispatch", "FasterMoE pipe=2 (EP time)", "46.8", "%", _SRC),
    PaperValue("Combine", "FasterMoE pipe=2 (EP time)", "40.2", "%", _SRC),
]
PAPER_CLAIMS = [
    PaperClaim(
        phase,
        "FasterMoE pipe=1 (EP time)",
        "FasterMoE with pipe = 1 shows negligible overhead, matching FEPLB",
        "FEPLB Sec. 3.3",
    )
    for phase in ("Dispatch", "Combine")
]
EP = 8
NEGLIGIBLE_WORDS = "<1%"  # FEPLB Sec. 3.3: FEPLB's overhead "below 1%", "no measurable overhead"
NEGLIGIBLE = 1.0
PLATFORM = "dgx-h100"


def pair_rows(
    top_experts: torch.Tensor,
    source_of_token: torch.Tensor,
    rank_of_expert,
    world: int,
    pipe: int = 1,
    shadows=(),
) -> torch.Tensor:
    """Rows per (stage, source rank, destination rank), int64 [pipe, world, world]: the rule of
    the component's ``dispatch_rows_per_pair`` (a token goes once to each (destination, stage)
    holding one of its non-shadowed remote experts), computed by marking each token's
    (destination, stage) slots instead of sorting every (token, slot) key; the sort was most of
    this reproduction's time. tests/test_feplb_grading.py checks both agree."""
    ranks = torch.as_tensor(rank_of_expert, dtype=torch.int64)
    per = ranks.numel() // world
    local_index = torch.zeros(ranks.numel(), dtype=torch.int64)
    for r in range(world):
        members = (ranks == r).nonzero().flatten()
        local_index[members] = torch.arange(members.numel())
    source = source_of_token.to(torch.int64)
    slot = ranks[top_experts] * pipe + (local_index * pipe // per)[top_experts]  # [S, k]
    keep = ranks[top_experts] != source.unsqueeze(1)
    if shadows:
        keep &= ~torch.isin(top_experts, torch.as_tensor(list(shadows), dtype=torch.int64))
    slots = world * pipe
    hit = torch.zeros(top_experts.shape[0], slots + 1, dtype=torch.int64)  # last: dropped
    hit.scatter_(1, slot.masked_fill(~keep, slots), 1)
    rows = torch.zeros(world, slots, dtype=torch.int64).index_add_(0, source, hit[:, :slots])
    return rows.reshape(world, world, pipe).permute(2, 0, 1).contiguous()


def messages_of(rows: torch.Tensor, row_bytes: int, phase: str = "a2a") -> tuple[list, dict]:
    """Simulator messages and phase dependencies for per-(stage, src, dst) rows: the stages run
    one after the other (stage s waits for stage s - 1), as pipelined dispatch sends them."""
    msgs, deps = [], {}
    for s in range(rows.shape[0]):
        name = f"{phase}{s}"
        deps[name] = [f"{phase}{s - 1}"] if s else []
        for i in range(rows.shape[1]):
            for j in range(rows.shape[2]):
                if i != j and int(rows[s, i, j]):
                    msgs.append((name, i, j, int(rows[s, i, j]) * row_bytes))
    return msgs, deps


def busiest_port_rows(rows: torch.Tensor) -> int:
    """Sum over stages of the busiest port's rows, a port being a rank's sending or its
    receiving side: the rows that bound a stage's time on a non-blocking switch."""
    sent, received = rows.sum(2), rows.sum(1)  # [stage, rank]
    return int(torch.maximum(sent, received).max(1).values.sum())


def seed_numbers(params: dict) -> dict:
    """One seed's trace at EP = 8: rows each method puts on the EP path, the busiest port's rows,
    the modelled EP time per layer, and the copy-path bytes."""
    trace = ft.trace_for(params, EP, keep_tokens=True)
    m = get_model("glm5-moe")
    platform = load_builtin(PLATFORM)
    topo = topology_for(platform, 1, EP)
    placement = ExpertPlacement.contiguous(trace.num_experts, EP)
    home = placement.rank_of_expert()
    tokens = int(params["tokens"])
    source_of_token = torch.arange(tokens * EP) // tokens
    row_bytes = m.d_model * 2  # bf16 rows of d_model
    rows = dict.fromkeys(METHODS, 0)
    busiest = dict.fromkeys(METHODS, 0)  # busiest port's rows, summed over stages
    layer_time = {method: [0.0] * trace.num_layers for method in METHODS}
    copy_bytes = {"FasterMoE": 0, "FEPLB": 0}
    expert_bytes = m.n_mat * m.d_model * m.d_ffn * 2
    fastermoe, feplb = get_balancer("FasterMoE"), get_balancer("FEPLB")
    knobs = ft.balancer_knobs(params)
    sim_assumptions: tuple = ()
    for layer in range(trace.num_layers):
        for mb in range(1, trace.num_micro_batches):
            top = trace.top_experts[layer][mb]
            step = BalanceStep(placement, trace.counts[layer, mb], trace.counts[layer, mb - 1])
            shadows = fastermoe.run(step, knobs).decision  # the shadowed experts
            per_pair = {
                "Before LB": pair_rows(top, source_of_token, home, EP),
                "FasterMoE pipe=1": pair_rows(top, source_of_token, home, EP, 1, shadows),
                "FasterMoE pipe=2": pair_rows(top, source_of_token, home, EP, 2, shadows),
            }
            for method, pr in per_pair.items():
                rows[method] += int(pr.sum())
                busiest[method] += busiest_port_rows(pr)
                msgs, deps = messages_of(pr, row_bytes)
                res = simulate_messages(msgs, topo, platform, deps)
                layer_time[method][layer] += res.time_s
                sim_assumptions = res.assumptions
            copy_bytes["FasterMoE"] += len(shadows) * (EP - 1) * expert_bytes
            plan = feplb.run(step, knobs).decision  # FEPLB's moves (a BalancePlan)
            p2 = phase2_bytes(plan, m.d_model, m.d_ffn, m.n_mat)
            copy_bytes["FEPLB"] += p2["weight_bytes"] + p2["token_bytes"]
    for key in (rows, busiest, layer_time):  # FEPLB: Phase 1 is the unchanged EP dispatch
        key["FEPLB"] = key["Before LB"]
    time_s = {method: sum(layer_time[method]) for method in METHODS}
    n_mb = trace.num_layers * (trace.num_micro_batches - 1)
    shown = METHODS[1:]
    return {
        "extra_time": {k: ft.change_pct(time_s[k], time_s["Before LB"]) for k in shown},
        "extra_rows": {k: ft.change_pct(rows[k], rows["Before LB"]) for k in shown},
        "extra_port": {k: ft.change_pct(busiest[k], busiest["Before LB"]) for k in shown},
        "before_ms": time_s["Before LB"] / n_mb * 1e3,
        "copy_pct": {k: b / rows["Before LB"] / row_bytes * 100.0 for k, b in copy_bytes.items()},
        "time_s_per_micro_batch": {k: v / n_mb for k, v in time_s.items()},
        "sim_assumptions": sim_assumptions,
        "row_bytes": row_bytes,
    }


METHODS = ("Before LB", "FasterMoE pipe=1", "FasterMoE pipe=2", "FEPLB")
PERTURBED_SHADOWS = (0, 1, 2, 4, 8, 16, 32, 64, 128)  # sizes of the shadow sets tried


def pipe1_counterfactual(params: dict):
    """The input the pipe = 1 claim depends on, perturbed: shadow sets of every size (drawn at
    random from all experts) on the first seed's first replayed micro-batch of layer 0, and the
    claim's test on each (pipe = 1's extra EP time over Before LB read as NEGLIGIBLE_WORDS).
    Returns (test, perturbed shadow sets, what) for the policy (grading.can_fail)."""
    trace = ft.trace_for(ft.at_seed(params, ft.seeds(params)[0]), EP, keep_tokens=True)
    m = get_model("glm5-moe")
    platform = load_builtin(PLATFORM)
    topo = topology_for(platform, 1, EP)
    home = ExpertPlacement.contiguous(trace.num_experts, EP).rank_of_expert()
    source = torch.arange(int(params["tokens"]) * EP) // int(params["tokens"])
    top = trace.top_experts[0][1]

    def time_s(rows):
        msgs, deps = messages_of(rows, m.d_model * 2)
        return simulate_messages(msgs, topo, platform, deps).time_s

    before = time_s(pair_rows(top, source, home, EP))
    reading = grading.read_claim(NEGLIGIBLE_WORDS)
    gen = torch.Generator().manual_seed(int(params["seed"]))
    perturbed = [
        tuple(torch.randperm(trace.num_experts, generator=gen)[:n].tolist())
        for n in PERTURBED_SHADOWS
    ]

    def test(shadows) -> bool:
        extra = ft.change_pct(time_s(pair_rows(top, source, home, EP, 1, shadows)), before)
        return reading.holds(extra)

    return test, perturbed, "the shadow set"


SIMULATOR = "flow simulator (network/simulator.py) and our pipe = 2 stage model"


def compute(repro: Reproduction, params: dict) -> Result:
    ft.check(params)
    per_seed = ft.over_seeds(params, seed_numbers)

    def over(key: str, method: str) -> list[float]:
        return [x[key][method] for x in per_seed]

    note = f"{ft.seeds_note(params, EP)}; modelled on the flow simulator ({PLATFORM}, one node)"
    cells = []
    counterfactual = pipe1_counterfactual(params)
    for phase in ("Dispatch", "Combine"):  # combine returns the same rows: same volume, time
        for method in METHODS[1:]:
            extra = over("extra_time", method)
            if method == "FasterMoE pipe=1":
                cells.append(
                    repro.claim(
                        phase,
                        f"{method} (EP time)",
                        None,
                        ft.median(extra),
                        "%",
                        reading=NEGLIGIBLE_WORDS,
                        seeds_hold=ft.read_per_seed(NEGLIGIBLE_WORDS, extra),
                        counterfactual=counterfactual,
                        note=(
                            f"{note}; 'negligible' read as FEPLB's own bound, "
                            f"'{NEGLIGIBLE_WORDS}' (Sec. 3.3), on each seed: shadowed experts' rows "
                            f"stay on their source"
                        ),
                    )
                )
            elif method == "FEPLB":
                cells.append(
                    ft.sampled(
                        repro,
                        phase,
                        f"{method} (EP time)",
                        extra,
                        "%",
                        f"{note}; paper: '<1%'; Phase 1 is the unchanged EP dispatch, so 0 by "
                        f"construction",
                    )
                )
            else:
                cell = ft.sampled(
                    repro,
                    phase,
                    f"{method} (EP time)",
                    extra,
                    "%",
                    f"{note}; rows in all "
                    f"{ft.span(over('extra_rows', method), '%')}, "
                    f"busiest port's rows over the two stages "
                    f"{ft.span(over('extra_port', method), '%')} over Before LB's",
                    quantity="change",
                    without=[0.0] * len(extra),
                )
                if cell.verdict == "deviates":
                    cell.blame(
                        SIMULATOR,
                        "our model of pipe = 2's stages on our simulator; the "
                        "rest of the gap is not shown (see details)",
                    )
                cell.detail = (
                    "Each stage waits for its own busiest port, so pipe = 2 costs more time than "
                    "volume. The simulator leaves out DeepEP's per-stage kernel launch, count "
                    "exchange and synchronisation; the stage split is our reading of 'splitting "
                    "communication into stages'; and the busiest port depends on the trace, whose "
                    "EP = 8 imbalance is about twice GLM-5's (feplb-table3). Any may be the gap; "
                    "none was shown to be by a recomputation."
                )
                cells.append(cell)
        for method in METHODS[1:]:
            cells.append(
                ft.sampled(
                    repro,
                    phase,
                    f"{method} (EP volume)",
                    over("extra_rows", method),
                    "% extra EP rows vs Before LB",
                    f"{ft.seeds_note(params, EP)}; rows counted from per-token routing (the paper "
                    f"prints no volume)",
                )
            )
    for method in ("FasterMoE", "FEPLB"):
        cells.append(
            ft.sampled(
                repro,
                "Copy path (intra-node)",
                method,
                over("copy_pct", method),
                "% of Before LB EP bytes",
                f"{ft.seeds_note(params, EP)}; weights (+ FEPLB Phase 2 rows), "
                f"bf16, off the EP path",
            )
        )
    m = get_model("glm5-moe")
    assumptions = [
        ft.trace_assumption(params),
        *ft.ASSUMPTIONS,
        "Dedup: a bulk backend sends a token once per destination rank (DeepEP intranode); "
        "pipe = 2 splits each rank's experts into two stages deduplicated separately "
        "(our model of FEPLB Sec. 3.3's 'splitting communication into stages').",
        f"EP = {EP} (the paper's Fig. 4 setting), bf16 rows of d_model = {m.d_model}.",
        f"Time: per micro-batch, the per-pair bytes of each method on the flow-level "
        f"simulator ({PLATFORM}, 1 node x {EP} GPUs); pipe = 2's stages in sequence; "
        f"combine sends the same rows back, so its time equals dispatch's; "
        f"{ft.median([x['before_ms'] for x in per_seed]):.3f} ms Before LB per "
        f"micro-batch (median over seeds).",
        *per_seed[0]["sim_assumptions"],
    ]
    # Fig. 4's form: extra EP time over Before LB per method, dispatch and combine, with the
    # paper's printed pipe = 2 values as markers and FEPLB's "<1%" (Sec. 3.3, caption "<<1%") as a
    # range from 0 (its pipe = 1 bar is given only in words, "negligible").
    shown = METHODS[1:]
    extra = [ft.median(over("extra_time", k)) for k in shown]
    paper_at = [shown.index("FasterMoE pipe=2")]
    figure = Figure(
        name="feplb-fig4",
        title=f"Extra EP communication time over Before LB, EP = {EP} (modelled)",
        xlabel="method",
        ylabel="extra dispatch / combine time vs Before LB (%)",
        series=[
            {
                "label": "dispatch = combine (ours, modelled; median over seeds)",
                "x": shown,
                "y": extra,
                "kind": "ours",
                "line": False,
            },
            {
                "label": "FEPLB Fig. 4 dispatch",
                "x": [shown[i] for i in paper_at],
                "y": [repro.paper_value("Dispatch", "FasterMoE pipe=2 (EP time)").value],
                "kind": "paper",
            },
            {
                "label": "FEPLB Fig. 4 combine",
                "x": [shown[i] for i in paper_at],
                "y": [repro.paper_value("Combine", "FasterMoE pipe=2 (EP time)").value],
                "kind": "paper",
            },
            {
                "label": "FEPLB Sec. 3.3: FEPLB < 1%",
                "x": ["FEPLB"],
                "y": [NEGLIGIBLE],
                "lo": 0.0,
                "hi": NEGLIGIBLE,
                "kind": "paper-range",
            },
        ],
    )
    return Result(
        cells=cells,
        assumptions=assumptions,
        figures=[figure],
        extra={
            "seeds": ft.seeds(params),
            "time_s_per_micro_batch": [x["time_s_per_micro_batch"] for x in per_seed],
        },
    )


REPRODUCTION = Reproduction(
    id="feplb-fig4",
    paper_values=PAPER_VALUES,
    paper_claims=PAPER_CLAIMS,
    compute=compute,
    grade_class="sampled",
    defaults=dict(ft.DEFAULTS),
)
