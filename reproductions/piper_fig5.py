"""piper-fig5: all-to-all bandwidth vs message size, 2-64 GPUs on 1-8 nodes (Piper Sec. IV-B, Fig. 5).

The paper's text gives no plotted values, only the finding: "Bandwidth drops significantly as
soon as all-to-all involves inter-node communication".

Two parts:
- S (simulated, Frontier profile): components/network_sim.py replays the shared flat schedule
  (equal splits) for 2, 4, 8 GCDs on one node and 16, 32, 64 GCDs on 2, 4, 8 nodes; busbw =
  (bytes per GCD / time) x (n - 1) / n (nccl-tests).
- R (real, this machine) with calibration: the alltoall suite runs flat for real on emulated
  nodes (1x2, 2x1, 2x2 ranks); a latency/bandwidth profile is fitted on two sizes of the 2x1
  world (components.network_sim.fit_latency_bandwidth), and the simulator
  with that calibrated profile predicts every real point, shown beside the measurement.
"""

from __future__ import annotations

from moe_repro.components import network_sim as ns
from moe_repro.components.platform import load_builtin
from moe_repro.reproductions._suite_runs import csv_param, device_words, run_grid, without_samples
from moe_repro.reproductions.spec import Figure, Reproduction, Result

SIM_LAYOUTS = [(1, 2), (1, 4), (1, 8), (2, 8), (4, 8), (8, 8)]  # (nodes, GCDs per node)
REAL_LAYOUTS = [(1, 2), (2, 1), (2, 2)]


def _size_label(b: int) -> str:
    for unit, scale in (("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if b >= scale:
            return f"{b / scale:g} {unit}"
    return f"{b} B"


def _simulated_part(repro, platform, sizes):
    cells, series, points = [], [], []
    at_largest = {}
    for nodes, g in SIM_LAYOUTS:
        topo = ns.topology_for(platform, nodes, g)
        n = topo.world_size
        ys = []
        for size in sizes:
            r = ns.simulate_uniform("flat", topo, platform, max(1, size // n))
            busbw = size / r.time_s * (n - 1) / n / 1e9
            ys.append(busbw)
            points.append({"nodes": nodes, "gpus": n, "bytes_per_gpu": size, "time_s": r.time_s,
                           "busbw_GBps": busbw, "eq6_bound_s": r.eq6_bound_s, "simulated": True})
        at_largest[n] = ys[-1]
        series.append({"label": f"{n} GCDs on {nodes} node{'s' if nodes > 1 else ''} (simulated)",
                       "x": sizes, "y": ys, "kind": "ours"})
        cells.append(repro.compare(f"{n} GCDs / {nodes} node(s)", f"busbw @ {_size_label(sizes[-1])} (simulated)",
                                   ys[-1], "GB/s", note=f"simulated on {platform.name}"))
    if 8 in at_largest and 16 in at_largest:
        cells.append(repro.compare("8 -> 16 GCDs (1 -> 2 nodes)", "busbw ratio (simulated)",
                                   at_largest[16] / at_largest[8], "x",
                                   note="simulated; the paper: bandwidth drops significantly as soon as "
                                        "the all-to-all leaves the node (no number in the text). In the "
                                        "model the drop is the ratio of NIC injection (4 x 25 GB/s per 8 "
                                        "GCDs) to Infinity Fabric (50 GB/s per GCD)"))
    return cells, series, points


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _real_part(repro, params):
    tokens = csv_param(params["real_tokens"], int)
    hidden, repeats = int(params["real_hidden"]), int(params["repeats"])
    points = [{"nodes": nodes, "gpus_per_node": g, "algo": "flat", "platform": "local", "backend": "gloo",
               "tokens": t, "hidden": hidden, "experts": 16, "top_k": 4, "placement": "contiguous",
               "seed": 0, "fault": "none", "ranks": nodes * g, "ranks_per_node": g, "simulated": False,
               "impl": "flat over gloo"} for nodes, g in REAL_LAYOUTS for t in tokens]
    records = run_grid("alltoall", points, repeats=repeats, check=False)
    # Calibrate on the 2x1 world: bytes one rank puts on the wire vs the minimum time of the
    # repeats (the sample least disturbed by other processes on a shared machine).
    fit_tokens = csv_param(params["fit_tokens"], int)
    fit = [r for r in records if (r["nodes"], r["gpus_per_node"]) == (2, 1) and r["tokens"] in fit_tokens]
    if len(fit) != 2:
        raise ValueError("fit_tokens must name two of real_tokens")
    alpha, beta = ns.fit_latency_bandwidth([r["inter_node_bytes"] / 2 for r in fit],
                                           [r["time_s_min"] for r in fit])
    cells, series = [], {}
    for r in records:
        nodes, g = r["nodes"], r["gpus_per_node"]
        local = ns.calibrated_profile(alpha, beta, gpus_per_node=g, host_cores=_cores())
        topo = ns.topology_for(local, nodes, g)
        N = topo.world_size
        per_rank = [0] * N
        for e in range(16):
            per_rank[e * N // 16] += 1
        rows_to = [round(r["tokens"] * 4 * c / 16) for c in per_rank]
        fn, deps = ns.expected_schedule("flat", topo, hidden * 4)
        predicted = ns.simulate_expected(fn, rows_to, topo, local, deps).time_s
        measured = r["time_s_min"]
        dev = (predicted - measured) / measured
        used = " (used for the fit)" if r in fit else ""
        row = f"local {nodes}x{g}, {r['tokens']} tokens ({_size_label(int(r['bytes']))}/rank)"
        cells.append(repro.compare(row, "measured time (min of repeats)", measured * 1e3, "ms",
                                   note=f"real, {device_words()}, median {r['time_s'] * 1e3:.4g} ms{used}"))
        cells.append(repro.compare(row, "simulated time (calibrated local profile)", predicted * 1e3, "ms",
                                   note=f"simulated; {dev:+.1%} vs the measurement"))
        s = series.setdefault((nodes, g), {"x": [], "m": [], "p": []})
        s["x"].append(r["bytes"])
        s["m"].append(measured * 1e3)
        s["p"].append(predicted * 1e3)
    fig_series = []
    for (nodes, g), s in series.items():
        fig_series.append({"label": f"local {nodes}x{g} measured", "x": s["x"], "y": s["m"], "kind": "ours"})
        fig_series.append({"label": f"local {nodes}x{g} simulated (calibrated)", "x": s["x"], "y": s["p"],
                           "kind": "ours"})
    fig = Figure(name="piper-fig5-local", title="Real flat all-to-all here vs the calibrated simulator",
                 xlabel="payload per rank (bytes)", ylabel="time (ms)", series=fig_series,
                 xscale="log", yscale="log")
    calib = {"alpha_s": alpha, "beta_GBps": beta / 1e9}
    return cells, fig, without_samples(records), calib


def compute(repro: Reproduction, params: dict) -> Result:
    platform = load_builtin(str(params["platform"]))
    sizes = csv_param(params["bytes_per_gpu"], int)
    if not sizes or min(sizes) < 1:
        raise ValueError("bytes_per_gpu must be positive integers")
    cells, series, points = _simulated_part(repro, platform, sizes)
    figures = [Figure(name="piper-fig5", title=f"Flat all-to-all busbw vs message size on {platform.name} (simulated)",
                      xlabel="bytes per GCD", ylabel="busbw (GB/s, simulated)", series=series,
                      xscale="log", yscale="log")]
    extra = {"simulated_points": points}
    assumptions = [
        f"S: simulated on the {platform.name} profile by components/network_sim.py; equal splits, "
        "counts known; per-message cost network.per_message_us (an assumption). Left out: job "
        "placement, background traffic, adaptive routing, RCCL channel/protocol effects.",
    ]
    if int(params["real"]):
        real_cells, fig, records, calib = _real_part(repro, params)
        cells += real_cells
        figures.append(fig)
        extra.update(real_records=records, calibration=calib)
        assumptions.append(
            f"R: real flat all-to-all (gloo) over emulated nodes on this machine; calibrated "
            f"profile: {calib['alpha_s'] * 1e6:.1f} us per message, {calib['beta_GBps']:.3g} GB/s "
            "per link, fitted on the 2x1 world at fit_tokens; the machine as a whole "
            f"moves at most {_cores()} cores x that bandwidth (the simulator's host resource: the "
            "2x2 world runs 4 ranks on the cores). Above a few MB per rank copies leave the cache "
            "and the one-bandwidth profile stops holding; other processes on a shared machine add noise.")
    return Result(cells=cells, assumptions=assumptions, figures=figures, extra=extra)


REPRODUCTION = Reproduction(
    id="piper-fig5", title="All-to-all bandwidth vs message size, 2-64 GPUs on 1-8 nodes",
    paper="piper", element="Fig. 5", how="R+S",
    description="Simulated flat all-to-all busbw on the Frontier profile for 2-64 GCDs, and real "
                "runs here beside the simulator calibrated on them.",
    paper_values=[], compute=compute,
    defaults={"platform": "frontier", "bytes_per_gpu": "65536,1048576,16777216,268435456",
              "real": 1, "real_tokens": "32,128,256,512,1024", "fit_tokens": "32,256", "real_hidden": 1024, "repeats": 5},
)
