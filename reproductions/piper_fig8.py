"""piper-fig8: HALO vs flat (torch.dist.all_to_all) latency, 1-512 Frontier nodes (Piper Fig. 8).

Simulated, not measured: components/network/simulator.py replays the messages of the shared
``flat_schedule`` and ``halo_schedule`` (the code the real collectives run) on the Frontier
profile, with equal splits as in Piper Alg. 1 (every GCD sends the same bytes to every GCD).
The paper states a range, not per-point values: "1.1x - 9x lower latency for configurations of
16 nodes or more", and parity below 16 nodes; its plotted points are not in the text.
"""

from __future__ import annotations

from moe_repro.components.network import simulator as ns
from moe_repro.components.network.platform import load_builtin
from moe_repro.reproductions._suite_runs import csv_param
from moe_repro.reproductions.spec import Figure, PaperValue, Reproduction, Result, Tolerance

RANGE = "HALO speedup over flat, >= 16 nodes"
BELOW = "HALO speedup over flat, < 16 nodes"
_SRC = "Piper Sec. V-D text (Fig. 8's points are not in the text)"

PAPER_VALUES = [
    PaperValue(RANGE, "lowest", "1.1", "x", _SRC),
    PaperValue(RANGE, "highest", "9", "x", _SRC),
]

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
    "and a per-message cost (network.per_message_us, an assumption of 1 us).")


def _size_label(b: int) -> str:
    return f"{b // 1024} KiB" if b >= 1024 else f"{b} B"


def compute(repro: Reproduction, params: dict) -> Result:
    platform = load_builtin(str(params["platform"]))
    node_counts = csv_param(params["nodes"], int)
    sizes = csv_param(params["bytes_per_peer"], int)
    if not node_counts or not sizes or min(node_counts) < 1 or min(sizes) < 1:
        raise ValueError("nodes and bytes_per_peer must be positive integers")
    cells, rows, series, speed_series = [], [], [], []
    above, below = [], []
    for b in sizes:
        xs, flat_t, halo_t, speed = [], [], [], []
        for n in node_counts:
            topo = ns.topology_for(platform, n)
            flat = ns.simulate_uniform("flat", topo, platform, b)
            halo = ns.simulate_uniform("halo", topo, platform, b)
            s = flat.time_s / halo.time_s
            xs.append(n)
            flat_t.append(flat.time_s * 1e3)
            halo_t.append(halo.time_s * 1e3)
            speed.append(s)
            (above if n >= 16 else below).append(s)
            rows.append({"nodes": n, "gpus": topo.world_size, "bytes_per_peer": b,
                         "flat_ms": flat.time_s * 1e3, "halo_ms": halo.time_s * 1e3,
                         "eq6_bound_ms": flat.eq6_bound_s * 1e3, "speedup": s,
                         "inter_node_bytes": flat.link_bytes["inter_node"], "simulated": True})
            cells.append(repro.compare(f"{n} nodes", f"speedup @ {_size_label(b)}/peer", s, "x",
                                       note=f"simulated: flat {flat.time_s * 1e3:.4g} ms, HALO "
                                            f"{halo.time_s * 1e3:.4g} ms, Eq. 6 NIC bound "
                                            f"{flat.eq6_bound_s * 1e3:.4g} ms"))
        series += [{"label": f"flat, {_size_label(b)}/peer (simulated)", "x": xs, "y": flat_t, "kind": "ours"},
                   {"label": f"HALO, {_size_label(b)}/peer (simulated)", "x": xs, "y": halo_t, "kind": "ours"}]
        speed_series.append({"label": f"{_size_label(b)}/peer (simulated)", "x": xs, "y": speed, "kind": "ours"})
    wide = [n for n in node_counts if n >= 16]
    if above:
        cells.append(repro.compare(RANGE, "lowest", min(above), "x",
                                   note="simulated; lowest flat/HALO ratio at >= 16 nodes. Below 1 "
                                        "at large messages: flat already runs at the NIC (Eq. 6) bound "
                                        "in a model without background traffic or placement effects, "
                                        "and HALO's Phase III moves the remote bytes again over Infinity "
                                        "Fabric after Phase II (Eq. 13). The paper's >= 1.1x there needs "
                                        "effects the model leaves out (see assumptions)"))
        cells.append(repro.compare(RANGE, "highest", max(above), "x",
                                   note="simulated; reached at the smallest messages, where per-message "
                                        "cost dominates: HALO issues one message per remote node instead "
                                        "of one per remote GCD, so the ceiling is about R = 8"))
    if below:
        cells.append(repro.compare(BELOW, "range", None if not below else max(below), "x",
                                   note=f"simulated; highest shown, lowest {min(below):.3g}x. The paper "
                                        "says 'comparable' (no number); the model already favours HALO "
                                        "at 2-8 nodes for small messages (per-message cost), so it does "
                                        "not reproduce a crossover at 16 nodes"))
    if wide:
        speed_series.append({"label": "Piper: 1.1x - 9x at >= 16 nodes (text)", "x": [min(wide), max(wide)],
                             "y": [1.1, 1.1], "kind": "paper"})
        speed_series.append({"label": "", "x": [min(wide), max(wide)], "y": [9.0, 9.0], "kind": "paper"})
    figures = [
        Figure(name="piper-fig8", title="All-to-all latency, flat vs HALO on Frontier (simulated)",
               xlabel="nodes (8 GCDs each)", ylabel="latency (ms, simulated)", series=series,
               xscale="log", yscale="log"),
        Figure(name="piper-fig8-speedup", title="HALO speedup over flat (simulated) vs the paper's range",
               xlabel="nodes", ylabel="flat / HALO latency", series=speed_series, xscale="log"),
    ]
    assumptions = [
        f"Simulated on the {platform.name} profile by components/network/simulator.py (flow-level, max-min "
        "fair); every number in this reproduction is simulated.",
        "Equal splits as in Piper Alg. 1: every GCD sends bytes_per_peer to every GCD; counts are "
        "known in advance (no count exchange), as in Alg. 1 and torch.dist.all_to_all.",
        "Flat = torch.dist.all_to_all over RCCL modelled as one message per peer, each GCD "
        "injecting through its own affinity NIC (RCCL uses the nearest NIC).",
        LEFT_OUT,
    ]
    return Result(cells=cells, assumptions=assumptions, figures=figures, extra={"points": rows})


REPRODUCTION = Reproduction(
    id="piper-fig8",
    paper_values=PAPER_VALUES, compute=compute, tolerance=Tolerance(),
    defaults={"platform": "frontier", "nodes": "1,2,4,8,16,32,64,128,256,512",
              "bytes_per_peer": "256,4096,65536"},
)
