"""xmoe-fig19: all-to-all time of the MoE training workload vs GPU count, 8-1024 (X-MoE App. D).

X-MoE profiles the dispatch all-to-all on Frontier from 8 to 1024 GCDs and reports three regions
(App. D text; the plotted values are not in the text): (i) the time rises from 8 to 32 GPUs,
(ii) stays roughly flat from 32 to 256, (iii) rises sharply beyond 256, which the authors
attribute to cross-rack traffic (a rack holds 256 GCDs) meeting congestion from other jobs.

Ours is simulated: components/network/simulator.py replays the shared ``flat_schedule`` (X-MoE's
dispatch is one all-to-all-v) on the Frontier profile, with the expected routing of uniform
top-k over the model's experts placed contiguously (EP = GPU count). Expected routing: no
sampling, so no seeds.

The paper prints no values, so the three regions are graded as claims on our simulated times
(:func:`region_claims`, one reading for all three, stated there).
"""

from __future__ import annotations

from moe_repro.components.network import simulator as ns
from moe_repro.components.alltoall import simulated
from moe_repro.components.network.platform import load_builtin
from moe_repro.components.model.zoo import get_model
from moe_repro.reproductions.suite_runs import csv_param
from moe_repro.records.grading import PREDICTION_TOLERANCE, comparable
from moe_repro.reproductions.spec import Figure, PaperClaim, Reproduction, Result

COL = "dispatch all-to-all (simulated)"
_SRC = "X-MoE App. D, text on Fig. 19"
# The three regions as printed (App. D); region (i)'s upper end is missing in the text ("from 8 to
# GPUs"): region (ii) starts at 32, so (i) is read as 8 to 32.
REGIONS = {
    "region (i): 8 to 32 GPUs": ("(i) latency increases from 8 to GPUs", 8, 32),
    "region (ii): 32 to 256 GPUs": (
        "(ii) latency remains relatively stable from 32 to 256 GPUs",
        32,
        256,
    ),
    "region (iii): beyond 256 GPUs": ("(3) it rises sharply beyond 256 GPUs", 256, None),
}
CLAIM_COL = "all-to-all time (simulated)"
PAPER_CLAIMS = [PaperClaim(row, CLAIM_COL, quote, _SRC) for row, (quote, _, _) in REGIONS.items()]


def simulate_point(m, platform, gpus: int, tokens: int, algo: str = "flat") -> ns.SimResult:
    g = min(gpus, platform.gpus_per_node)
    if gpus % g:
        raise ValueError(f"{gpus} GPUs do not fill whole {g}-GPU nodes")
    topo = ns.topology_for(platform, gpus // g, g)
    N, E = topo.world_size, m.n_experts
    per_rank = [0] * N
    for e in range(E):
        per_rank[e * N // E] += 1
    rows_to = [round(tokens * m.top_k * c / E) for c in per_rank]
    fn, deps = simulated.expected_schedule(algo, topo, m.d_model * 2)  # bf16 rows
    return ns.simulate_expected(fn, rows_to, topo, platform, deps)


def region_claims(repro: Reproduction, times: dict[int, float]) -> list:
    """App. D's three regions, graded on our simulated times. One reading for all three: "stable"
    is the policy's "comparable" (every point of the region within the prediction tolerance of
    every other, grading.comparable); "increases" / "rises" is a rise the policy can tell from
    stable: higher, and not comparable. Region (iii) ("beyond 256") must rise at every point past
    256, from the 256-GPU time. A region whose points we did not simulate is not reproduced."""
    tol = f"{PREDICTION_TOLERANCE:.0%}"
    cells = []
    for row, (_, lo, hi) in REGIONS.items():
        ns_ = sorted(n for n in times if n >= lo and (hi is None or n <= hi))
        if lo not in times or len(ns_) < 2:
            cells.append(
                repro.claim(
                    row,
                    CLAIM_COL,
                    None,
                    None,
                    "x",
                    note=f"needs the {lo}-GPU point and one beyond it",
                )
            )
            continue
        if row.startswith("region (ii)"):
            low, high = min(times[n] for n in ns_), max(times[n] for n in ns_)
            holds = comparable(low, high)
            ours = high / low
            what = (
                f"max / min over {ns_[0]}-{ns_[-1]} GPUs {ours:.3f}x; holds if within {tol} "
                "(comparable)"
            )
        elif hi is not None:
            ours = times[hi] / times[lo]
            holds = ours > 1 and not comparable(times[lo], times[hi])
            what = f"time({hi}) / time({lo}) = {ours:.3f}x; holds if a rise beyond {tol}"
        else:
            past = [n for n in ns_ if n > lo]
            rises = {n: times[n] / times[lo] for n in past}
            holds = all(r > 1 and not comparable(times[lo], times[n]) for n, r in rises.items())
            ours = rises[past[0]]
            what = (
                "; ".join(f"time({n}) / time({lo}) = {r:.3f}x" for n, r in rises.items())
                + f"; holds if every point past {lo} rises beyond {tol}"
            )
        cell = repro.claim(row, CLAIM_COL, holds, ours, "x", note=f"simulated: {what}")
        if cell.verdict == "claim-fails" and row.startswith("region (iii)"):
            cell.blame(
                "network simulator (components/network/simulator.py)",
                "it has no other jobs' traffic, X-MoE's explanation of region (iii)",
            )
            cell.detail = REGION_III_DETAIL
        elif cell.verdict == "claim-fails" and row.startswith("region (ii)"):
            steps = [f"{b}/{a}: {times[b] / times[a]:.3f}x" for a, b in zip(ns_, ns_[1:])]
            cell.detail = (
                "Read as a region: every point within the tolerance of every other, so "
                "the region's max / min. Per doubling the simulated time rises by "
                + ", ".join(steps)
                + "; the rise accumulates over the region."
            )
        cells.append(cell)
    return cells


REGION_III_DETAIL = (
    "X-MoE attributes the sharp rise beyond 256 GCDs to cross-rack traffic (a Frontier rack holds "
    "256 GCDs) meeting congestion from other concurrently running jobs. The simulator has no other "
    "jobs and no global-link taper, so past 256 GCDs it adds only per-message costs: 512 GCDs "
    "takes about what 256 takes. The rise it shows at 1024 comes from the experts: 256 experts on "
    "1024 GCDs put experts on 2 of every 8 GCDs per node (2 of 4 NICs), so fewer NICs receive all "
    "the rows; the Eq. 6 NIC bound rises the same way. That is not the paper's mechanism."
)


def compute(repro: Reproduction, params: dict) -> Result:
    m = get_model(str(params["model"]))
    platform = load_builtin(str(params["platform"]))
    tokens = int(params["tokens"])
    counts = csv_param(params["gpus"], int)
    times, bounds, cells, points = {}, {}, [], []
    for n in counts:
        r = simulate_point(m, platform, n, tokens)
        times[n], bounds[n] = r.time_s * 1e3, r.eq6_bound_s * 1e3
        points.append(
            {
                "gpus": n,
                "time_ms": times[n],
                "eq6_bound_ms": bounds[n],
                "inter_node_bytes": r.link_bytes["inter_node"],
                "simulated": True,
            }
        )
        cells.append(
            repro.compare(
                f"{n} GPUs",
                COL,
                times[n],
                "ms",
                note=f"simulated; Eq. 6 NIC bound {bounds[n]:.4g} ms",
            )
        )

    cells += region_claims(repro, times)
    fig = Figure(
        name="xmoe-fig19",
        title=f"All-to-all time vs GPUs, {m.name} dispatch on {platform.name} (simulated)",
        xlabel="GPUs (GCDs)",
        ylabel="all-to-all time (ms, simulated)",
        xscale="log",
        series=[
            {
                "label": "flat all-to-all (simulated)",
                "x": counts,
                "y": [times[n] for n in counts],
                "kind": "ours",
            },
            {
                "label": "Eq. 6 NIC bound",
                "x": counts,
                "y": [bounds[n] for n in counts],
                "kind": "ours",
            },
        ],
    )
    assumptions = [
        f"{m.name}: H = {m.d_model} (bf16 rows), {m.n_experts} experts placed contiguously over the "
        f"GPUs, top-{m.top_k}, {tokens} tokens per GPU (X-MoE does not state the batch of this "
        "profile); expected (uniform) routing; EP = GPU count.",
        "Simulated by components/network/simulator.py on the profile; nodes consecutive, switch groups "
        "and racks filled in order (a Frontier rack: 32 nodes = 256 GCDs).",
        "Left out: background traffic from other jobs (X-MoE's explanation of region iii and of "
        "the > 500 ms outliers of Fig. 18), job placement, adaptive routing, global-link taper, "
        "kernel costs, the count exchange.",
    ]
    return Result(cells=cells, assumptions=assumptions, figures=[fig], extra={"points": points})


REPRODUCTION = Reproduction(
    id="xmoe-fig19",
    paper_values=[],
    compute=compute,
    paper_claims=PAPER_CLAIMS,
    grade_class="prediction",  # simulated times (the paper prints none: its claims are graded)
    defaults={
        "model": "xmoe-large",
        "platform": "frontier",
        "tokens": 4096,
        "gpus": "8,16,32,64,128,256,512,1024",
    },
)
