"""piper-fig8: HALO vs flat (torch.dist.all_to_all) latency, 1-512 Frontier nodes (Piper Fig. 8).

Simulated, not measured: components/network/simulator.py replays the messages of the shared
``flat_schedule`` and ``halo_schedule`` (the code the real collectives run) on the Frontier
profile, with equal splits as in Piper Alg. 1 (every GCD sends the same bytes to every GCD).
The paper states a range, not per-point values: "1.1x - 9x lower latency for configurations of
16 nodes or more", and parity below 16 nodes; its plotted points are not in the text.

The gain depends on one assumption above all: what a message costs beyond its bytes. So every
point is simulated under four cost models, side by side (COST_MODELS): the profile's
overlapped model (0.454 us of issue time per message, overlapped with transfers, at most 64
messages in flight: HPE's published osu_mbw_mr message rate on Slingshot-11, see the Frontier
profile's sources), the serial model
(all issue costs paid before any byte moves), a window of messages in flight with no issue
cost, and pure alpha-beta (latency and bandwidth per link, nothing else). The cells graded
against the paper use the profile's model; the others show what the gain rests on.
"""

from __future__ import annotations

from moe_repro.components.network import simulator as ns
from moe_repro.components.alltoall import simulated
from moe_repro.components.network.platform import from_dict, load_builtin
from moe_repro.reproductions.suite_runs import csv_param
from moe_repro.records import grading
from moe_repro.reproductions.spec import Figure, PaperClaim, PaperValue, Reproduction, Result

RANGE = "HALO speedup over flat, >= 16 nodes"
BELOW = "HALO speedup over flat, < 16 nodes"
_SRC = "Piper Sec. V-D text (Fig. 8's points are not in the text)"

RANGE_WORDS = "1.1-9x"  # one range claim, read by the policy (records/grading.read_claim)
PAPER_VALUES: list[PaperValue] = []
PAPER_CLAIMS = [
    PaperClaim(
        RANGE,
        "range",
        "1.1x - 9x lower latency for configurations of 16 nodes or more",
        _SRC,
    ),
    PaperClaim(
        BELOW,
        "comparable",
        "At smaller scales, where all GPUs fit within a single switch "
        "group, both algorithms perform comparably",
        "Piper Sec. V-D text on Fig. 8",
    ),
]
# "Comparable" is read by the policy's one rule (records/grading.comparable: within the prediction
# tolerance of each other): for a latency ratio r = flat / HALO that is 1 - tol <= r <= 1 / (1 - tol).
COMPARABLE_LOW, COMPARABLE_HIGH = (
    1 - grading.PREDICTION_TOLERANCE,
    1 / (1 - grading.PREDICTION_TOLERANCE),
)

LEFT_OUT = (
    "Left out of the model (so it cannot reproduce what they cause): job placement (nodes are "
    "consecutive, switch groups and racks filled in order; HALO's rack-aware allocation and "
    "the scattered placement a batch scheduler gives flat runs are not modelled), background "
    "traffic from other jobs on the shared Dragonfly (the paper attributes the crossover at 16 "
    "nodes to inter-rack communication, which in a model without other jobs costs no more than "
    "intra-rack), adaptive routing and congestion trees, a global-link taper (no source for "
    "Frontier's, so taper 1), RCCL's internal channels and proxy threads, and kernel-launch and "
    "packing costs. What the model does contain: NIC injection per GCD pair with GPU-NIC "
    "affinity for both algorithms, max-min sharing of every link class, link-class latencies, "
    "and a per-message cost (network.per_message_us) with a window of messages in flight "
    "(network.window), both from HPE's published osu_mbw_mr run on Slingshot-11 (host-initiated MPI "
    "from CPU memory, not RCCL from GPU memory; see the Frontier profile's sources)."
)


# name -> (latency model, per-message cost kept?, window kept?) and what it assumes, in words
COST_MODELS = {
    "overlapped": (
        "overlapped",
        True,
        True,
        "per_message_us of issue time per message, overlapped with the transfers of "
        "earlier messages, at most `window` messages in flight per rank (the profile's model)",
    ),
    "serial": (
        "serial",
        True,
        True,
        "per_message_us per message, all paid before the rank's first byte moves (LogP "
        "without overlap)",
    ),
    "window only": (
        "overlapped",
        False,
        True,
        "per_message_us = 0, but at most `window` messages in flight per rank, each "
        "holding its slot for a link latency",
    ),
    "alpha-beta": (
        "overlapped",
        False,
        False,
        "per_message_us = 0 and no window: each message pays its link latency (alpha) "
        "and its bytes at the link rate (beta), nothing else",
    ),
}


def _variant(platform, keep_message_cost: bool, keep_window: bool):
    network = dict(platform.raw.get("network", {}))
    if not keep_message_cost:
        network["per_message_us"] = 0.0
    if not keep_window:
        network["window"] = 0
    return from_dict({**platform.raw, "network": network})


def _size_label(b: int) -> str:
    return f"{b // 1024} KiB" if b >= 1024 else f"{b} B"


def compute(repro: Reproduction, params: dict) -> Result:
    platform = load_builtin(str(params["platform"]))
    node_counts = csv_param(params["nodes"], int)
    sizes = csv_param(params["bytes_per_peer"], int)
    if not node_counts or not sizes or min(node_counts) < 1 or min(sizes) < 1:
        raise ValueError("nodes and bytes_per_peer must be positive integers")
    variants = {
        name: (model, _variant(platform, keep_cost, keep_window))
        for name, (model, keep_cost, keep_window, _) in COST_MODELS.items()
    }
    cells, rows, series, speed_series, model_series = [], [], [], [], []
    above, below, below_pairs = [], [], []
    per_model = {name: {"above": [], "below": []} for name in COST_MODELS}
    for b in sizes:
        xs, flat_t, halo_t, speed = [], [], [], []
        model_speed = {name: [] for name in COST_MODELS}
        for n in node_counts:
            topo = ns.topology_for(platform, n)
            speedups = {}
            for name, (model, machine) in variants.items():
                f = simulated.simulate_uniform("flat", topo, machine, b, latency_model=model)
                h = simulated.simulate_uniform("halo", topo, machine, b, latency_model=model)
                speedups[name] = (f, h, f.time_s / h.time_s)
                model_speed[name].append(f.time_s / h.time_s)
                per_model[name]["above" if n >= 16 else "below"].append(f.time_s / h.time_s)
            flat, halo, s = speedups["overlapped"]
            xs.append(n)
            flat_t.append(flat.time_s * 1e3)
            halo_t.append(halo.time_s * 1e3)
            speed.append(s)
            (above if n >= 16 else below).append(s)
            if n < 16:
                below_pairs.append((flat.time_s, halo.time_s))
            rows.append(
                {
                    "nodes": n,
                    "gpus": topo.world_size,
                    "bytes_per_peer": b,
                    "flat_ms": flat.time_s * 1e3,
                    "halo_ms": halo.time_s * 1e3,
                    "eq6_bound_ms": flat.eq6_bound_s * 1e3,
                    "speedup": s,
                    **{f"speedup ({name})": v[2] for name, v in speedups.items()},
                    "inter_node_bytes": flat.link_bytes["inter_node"],
                    "simulated": True,
                }
            )
            cells.append(
                repro.compare(
                    f"{n} nodes",
                    f"speedup @ {_size_label(b)}/peer",
                    s,
                    "x",
                    note=f"simulated, overlapped per-message cost: flat "
                    f"{flat.time_s * 1e3:.4g} ms, HALO {halo.time_s * 1e3:.4g} ms, "
                    f"Eq. 6 NIC bound {flat.eq6_bound_s * 1e3:.4g} ms; serial cost "
                    f"{speedups['serial'][2]:.3g}x, window only "
                    f"{speedups['window only'][2]:.3g}x, alpha-beta "
                    f"{speedups['alpha-beta'][2]:.3g}x",
                )
            )
        # Fig. 8's legend: HALO ("Neighborhood-all_to_all") against torch.dist.all_to_all (caption).
        series += [
            {
                "label": f"torch.dist.all_to_all (flat), {_size_label(b)}/peer",
                "x": xs,
                "y": flat_t,
                "kind": "ours",
            },
            {"label": f"HALO, {_size_label(b)}/peer", "x": xs, "y": halo_t, "kind": "ours"},
        ]
        speed_series.append(
            {"label": f"{_size_label(b)}/peer (simulated)", "x": xs, "y": speed, "kind": "ours"}
        )
        model_series += [
            {
                "label": f"{name}, {_size_label(b)}/peer",
                "x": xs,
                "y": model_speed[name],
                "kind": "ours",
            }
            for name in COST_MODELS
        ]
    for name, (_, _, _, words) in COST_MODELS.items():
        got = per_model[name]["above"]
        if got:
            cells.append(
                repro.compare(
                    f"{RANGE} [{name}]",
                    "range",
                    max(got),
                    "x",
                    note=f"simulated under this cost model only ({words}): "
                    f"highest {max(got):.3g}x, lowest {min(got):.3g}x at >= 16 "
                    f"nodes; not graded against the paper (the graded cells "
                    f"use the profile's overlapped model)",
                )
            )
    wide = [n for n in node_counts if n >= 16]
    # The paper's three statements first (the graded cells), then the simulated points behind them.
    graded = []
    if above:
        # One claim, one reading: every simulated point at >= 16 nodes must read inside the range.
        lowest = repro.claim(
            RANGE,
            "range",
            None,
            min(above),
            "x",
            reading=RANGE_WORDS,
            values=above,
            note=f"simulated; flat/HALO ratio at >= 16 nodes from {min(above):.3g}x to "
            f"{max(above):.3g}x; holds if every point reads inside the range"
            + (" (below 1: HALO slower than flat at some)" if min(above) < 1 else ""),
        )
        lowest.detail = (
            "Below 1 at large messages: flat already runs at the NIC (Eq. 6) bound in a model without "
            "background traffic or placement effects, and HALO's Phase III moves the remote bytes again over "
            "Infinity Fabric after Phase II (Eq. 13). The paper's >= 1.1x there needs effects the model leaves "
            "out (see assumptions)"
        )
        lowest.detail += (
            ". The highest is reached at the smallest messages, where per-message cost dominates: HALO "
            "issues one message per remote node instead of one per remote GCD, so the ceiling is about "
            "R = 8. Under the alpha-beta model alone the gain is gone (see the cost-model rows)"
        )
        graded.append(lowest)
    if below:
        # "Comparable" read by the policy's rule (grading.comparable) on every point below 16 nodes.
        holds = all(grading.comparable(f, h) for f, h in below_pairs)
        claim = repro.claim(
            BELOW,
            "comparable",
            holds,
            max(below),
            "x",
            note=f"simulated; flat/HALO between {min(below):.3g}x and {max(below):.3g}x at "
            f"1-8 nodes; comparable: within {grading.PREDICTION_TOLERANCE:.0%} of each "
            "other (the policy's rule) at every point",
        )
        claim.detail = (
            "The model favours HALO at 2-8 nodes for small messages (per-message cost), so it does "
            "not reproduce a crossover at 16 nodes"
        )
        graded.append(claim)
    cells = graded + cells
    if wide:
        speed_series.append(
            {
                "label": "Piper: 1.1x - 9x at >= 16 nodes (text)",
                "x": [min(wide), max(wide)],
                "y": [1.1, 9.0],
                "lo": 1.1,
                "hi": 9.0,
                "kind": "paper-range",
            }
        )
    narrow = [n for n in node_counts if n < 16]
    if len(narrow) > 1:  # "comparable" below 16 nodes, read as the claim cell reads it
        speed_series.append(
            {
                "label": f"Piper: comparable below 16 nodes (text; within "
                f"{grading.PREDICTION_TOLERANCE:.0%})",
                "x": [min(narrow), max(narrow)],
                "y": [COMPARABLE_LOW, COMPARABLE_HIGH],
                "lo": COMPARABLE_LOW,
                "hi": COMPARABLE_HIGH,
                "kind": "paper-range",
            }
        )
    figures = [
        Figure(
            name="piper-fig8",
            title="All-to-all latency, torch.dist.all_to_all vs HALO on Frontier (simulated)",
            xlabel="nodes (8 GCDs each)",
            ylabel="latency (ms, simulated)",
            series=series,
            xscale="log",
            yscale="log",
        ),
        Figure(
            name="piper-fig8-speedup",
            title="HALO speedup over flat (simulated) vs the paper's range",
            xlabel="nodes (8 GCDs each)",
            ylabel="flat (torch.dist.all_to_all) / HALO latency",
            series=speed_series,
            xscale="log",
        ),
        Figure(
            name="piper-fig8-cost-models",
            title="HALO speedup under each per-message cost model (simulated)",
            xlabel="nodes (8 GCDs each)",
            ylabel="flat (torch.dist.all_to_all) / HALO latency",
            series=model_series,
            xscale="log",
        ),
    ]
    assumptions = [
        f"Simulated on the {platform.name} profile by components/network/simulator.py (flow-level, max-min "
        "fair); every number in this reproduction is simulated.",
        "Equal splits as in Piper Alg. 1: every GCD sends bytes_per_peer to every GCD; counts are "
        "known in advance (no count exchange), as in Alg. 1 and torch.dist.all_to_all.",
        "Flat = torch.dist.all_to_all over RCCL modelled as one message per peer, each GCD "
        "injecting through its own affinity NIC (RCCL uses the nearest NIC).",
        LEFT_OUT,
        *(f"Cost model '{name}': {words}." for name, (_, _, _, words) in COST_MODELS.items()),
        "Every modelling assumption of the simulator, as it reports them: "
        + "; ".join(ns.Machine.from_platform(platform).assumptions())
        + ".",
    ]
    return Result(cells=cells, assumptions=assumptions, figures=figures, extra={"points": rows})


REPRODUCTION = Reproduction(
    id="piper-fig8",
    paper_values=PAPER_VALUES,
    paper_claims=PAPER_CLAIMS,
    compute=compute,
    # our flow simulator predicting latencies Piper measured on Frontier; it samples nothing (every
    # split is equal, Alg. 1), so one run is the result and there is no seed
    grade_class="prediction",
    defaults={
        "platform": "frontier",
        "nodes": "1,2,4,8,16,32,64,128,256,512",
        "bytes_per_peer": "256,4096,65536",
    },
)
