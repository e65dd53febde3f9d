"""The all-to-all simulator against real local runs: measured vs predicted time per cell.

Every grid point is one real MoE dispatch all-to-all of suites/alltoall.py (``ranks`` real local
ranks in emulated nodes of ``gpus_per_node``), and beside its measured time the time the
flow-level simulator (components/network/simulator.py; Piper Sec. V, X-MoE Sec. 4.2) predicts for
the very messages that run sends, on a local profile calibrated from *other* runs:

- ``calibration=fit`` (default): flat runs at ``fit_sizes`` x ``fit_ranks`` (world-wide and
  node-wide), measured in the same worlds as the scored cells and in turn with them, round by
  round; the simulator's serial latency model (simulator.ALLTOALL_FIT_FORM) is fitted to them.
  HALO and RBD are never fitted, and no validated size is: every cell is a prediction.
- ``calibration=FILE``: the ``calibration`` block ``repro calibrate`` wrote into a profile.

The prediction adds the CPU work around the messages (gathering rows, HALO's reorder, RBD's
pilots), profiled on the run's own dispatch (host_cpu_seconds) and stretched by what the ranks'
own work costs in the run's world (cpu_stretch); HALO's Phase I overlap is measured per world on
flat exchanges (phase_overlap) and applied with simulator.blend_overlap.

Per cell: ``time_s`` (measured), ``predicted_time_s`` (simulated), ``error_pct``, bytes per link
class, ``calibration_used`` and ``how``; the summary gives each backend's and algorithm's median
|error|, its 90% bootstrap interval over the rounds and the verdict against the 15% goal.

Why: the simulator predicts clusters no one here can run, so its model is checked where real
runs exist. The method, the model's assumptions and what it still leaves out: see
docs/alltoall-validation.md.
"""

from __future__ import annotations

import os
import random
import statistics
import sys

from moe_repro.components.alltoall import algorithm_names, get_algorithm
from moe_repro.suites import alltoall
from moe_repro.suites.base import (
    SEED,
    Metric,
    Param,
    Rule,
    Suite,
    fits_in_memory,
    one_of,
    parse_size,
    registered,
    top_k_within_experts,
    whole,
)

FIT_SEPARATOR = "+"  # inside one grid value ("2K+16K"): a comma would split it into grid values


def load_average() -> list[float] | None:
    """The machine's 1, 5 and 15 minute load averages, kept beside every calibration and
    validation measurement (on a shared machine they say how much other work ran); None where
    the platform has none."""
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def host_cores() -> int:
    """Cores this process may run on: the machine's limit on concurrent ranks."""
    return (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )


def alltoall_point(p: dict) -> dict:
    """The suites/alltoall.py grid point of a validation point, its derived params included
    (ValueError for a point that suite refuses, or that does not run here for real)."""
    ranks, gpn = int(p["ranks"]), int(p["gpus_per_node"])
    if ranks < 2 or gpn < 1 or ranks % gpn:
        raise ValueError(
            f"ranks must be >= 2 and a multiple of gpus_per_node; got ranks {ranks}, "
            f"gpus_per_node {gpn}"
        )
    if int(p["sizes"]) <= 0:
        raise ValueError(f"sizes must be positive (bytes each rank sends), got {p['sizes']}")
    if p["backend"] == "mpi":
        from moe_repro.runtime.launch import mpi_unavailable

        why_not = mpi_unavailable()
        if why_not:
            raise ValueError(f"backend mpi does not run here ({why_not}): pass --backend gloo")
    # The alltoall suite's defaults first: a parameter it gains later gets its default here.
    point = {
        **{k: v[0] for k, v in alltoall.SUITE.params.items()},
        "nodes": ranks // gpn,
        "gpus_per_node": gpn,
        "algo": p["algo"],
        "platform": "local",
        "backend": p["backend"],
        "sizes": int(p["sizes"]),
        "tokens": 1,
        "hidden": int(p["hidden"]),
        "experts": int(p["experts"]),
        "top_k": int(p["top_k"]),
        "placement": p["placement"],
        "seed": int(p["seed"]),
        "fault": "none",
        "path": p.get("path", "dispatch"),
    }
    point.update(alltoall.derived_params(point))
    if point.get("simulated"):
        raise ValueError(
            f"{ranks} ranks do not run here for real (at most {alltoall.MAX_LOCAL_RANKS})"
        )
    return point


def routed_messages(point: dict):
    """(messages, topology, phase dependencies) of one real dispatch of an alltoall point: every
    rank's routing rebuilt from its seed (suites/alltoall.rank_workload), the algorithm's
    ``routed_schedule`` with the count exchange, and the phase order its dispatcher runs them in
    (``dispatcher_dependencies``)."""
    from moe_repro.components.network.topology import Topology

    N = int(point["ranks"])
    topo = Topology(nodes=int(point["nodes"]), ranks_per_node=int(point["gpus_per_node"]))
    algo = get_algorithm(point["algo"])
    if point.get("path") == "node":  # every node's own flat dispatch, the same on every node
        g = topo.ranks_per_node
        work = [alltoall.rank_workload(point, r, g) for r in range(g)]
        one = algo.routed_schedule(
            [w["pft"] for w in work],
            work[0]["placement"],
            Topology(1, g),
            int(point["hidden"]) * 4,
            None,
            with_counts=True,
        )
        msgs = [
            (phase, n * g + src, n * g + dst, nbytes)
            for n in range(topo.nodes)
            for phase, src, dst, nbytes in one
        ]
        return msgs, topo, algo.dispatcher_dependencies
    work = [alltoall.rank_workload(point, r, N) for r in range(N)]
    # RBD's pilot choice is random; without the ranks' generators its bytes may differ a little
    # from the run's (the record keeps both byte counts).
    msgs = algo.routed_schedule(
        [w["pft"] for w in work],
        work[0]["placement"],
        topo,
        int(point["hidden"]) * 4,
        None,
        with_counts=True,
    )
    # the order the measured dispatcher's blocking calls impose (RBD: one call after another)
    return msgs, topo, algo.dispatcher_dependencies


def predict(point: dict, fit: dict, cores: int) -> dict:
    """Simulated time and bytes per link class of one alltoall point on the local profile of an
    all-to-all fit (``latency_us`` and ``per_message_us``, or ``latency_us_by_ranks`` and
    ``per_message_us_by_ranks`` at the point's ranks count, ``GBps``)."""
    from moe_repro.components.network import simulator as ns
    from moe_repro.components.network.platform import from_dict
    from moe_repro.components.network.topology import bytes_by_link_class

    msgs, topo, deps = routed_messages(point)
    # the latency fitted at this ranks count where the fit had one (else its median)
    ranks = str(int(point["ranks"]))
    latency_us = (fit.get("latency_us_by_ranks") or {}).get(ranks, fit["latency_us"])
    per_message_us = (fit.get("per_message_us_by_ranks") or {}).get(ranks, fit["per_message_us"])
    doc = ns.local_alltoall_profile(
        latency_us * 1e-6, per_message_us * 1e-6, fit["GBps"] * 1e9, topo.ranks_per_node, cores
    )
    profile = from_dict(doc)
    time_s = ns.simulate_messages(msgs, topo, profile, deps).time_s
    # phases the dependencies let run at once overlap by the fraction measured in this ranks
    # count's world (phase_overlap); a profile file has none: as the dependencies allow
    overlap = (fit.get("overlap_by_ranks") or {}).get(ranks)
    if overlap is not None and ns.chained(deps) != deps:
        chained_s = ns.simulate_messages(msgs, topo, profile, ns.chained(deps)).time_s
        time_s = ns.blend_overlap(time_s, chained_s, float(overlap))
    lb = bytes_by_link_class(msgs, topo)
    return {
        "predicted_time_s": time_s,
        "predicted_inter_node_bytes": lb["inter_node"],
        "predicted_intra_node_bytes": lb["intra_node"],
    }


def split_list(text: str, what: str, convert) -> list:
    items = [t for t in str(text).replace(",", FIT_SEPARATOR).split(FIT_SEPARATOR) if t.strip()]
    try:
        values = [convert(t) for t in items]
    except ValueError:
        raise ValueError(
            f"{what}: cannot read {text!r} (values joined by '{FIT_SEPARATOR}', e.g. "
            f"2K{FIT_SEPARATOR}16K)"
        ) from None
    if not values:
        raise ValueError(f"{what} is empty")
    return values


def _python_bookkeeping(n: int = 64) -> int:
    """Pure Python of the kind a dispatch runs between its ops (count lists, prefix sums,
    per-peer dicts): no tensor."""
    counts = [(7 * i) % 11 for i in range(n)]
    starts = [sum(counts[:d]) for d in range(n)]
    peers = {d: c for d, c in enumerate(counts) if c}
    return sum(int(c) for c in starts) + len(peers)


def host_s(record: dict, block: dict, cores: int) -> float:
    """The host-work part of one run's prediction: the CPU seconds its dispatch spends outside
    its collectives (``host_cpu_s``; calibration=fit: profiled after each sample,
    profile_host_cpu; a profile file: in setup, suites/alltoall.host_cpu_seconds),
    stretched by the cores' sharing (the run's cpu_stretch, else ranks / cores). 0 for a record
    without the profile, and for a block whose fit did not take the host work off (a fit that
    could not separate it): there the fitted terms carry it."""
    if not host_work_taken_off(block) or record.get("host_cpu_s") is None:
        return 0.0
    share = record.get("cpu_stretch") or max(1.0, int(record["ranks"]) / cores)
    return float(record["host_cpu_s"]) * share


HOST_TAKEN_OFF = "profiled on each run and taken off before the fit"


def host_work_taken_off(block: dict) -> bool:
    """Whether a calibration block's fit had each run's host work taken off first (then a
    prediction adds it back). ``host_op_us``: how a block written before this marker says so."""
    return block.get("host_work") == HOST_TAKEN_OFF or "host_op_us" in block


def cpu_stretch(ctx, segment_s: float = 1e-3, segments: int = 20) -> float:
    """Wall seconds per CPU second of host work as a dispatch runs it: ``segments`` pieces of
    Python work (_python_bookkeeping, ``segment_s`` of CPU each) on every rank at once, each
    ended by a tiny collective of the world (the next phase's sync), less as many tiny
    collectives back to back, the slowest rank's. A rank shares the cores with the other ranks
    and with whatever else the machine runs then, and a sync waits for the rank that was
    preempted last. 1 ms pieces: between the host work per sync of RBD's dispatch at the
    smallest and the largest default size; much shorter pieces are lost in the syncs' own
    spread (docs/alltoall-validation.md)."""
    from moe_repro.runtime.timing import host_seconds, thread_cpu_seconds

    def timed(work: bool) -> tuple[float, float]:
        ctx.barrier()
        start, cpu = host_seconds(), 0.0
        for _ in range(segments):
            if work:
                begin = thread_cpu_seconds()
                while thread_cpu_seconds() - begin < segment_s:
                    _python_bookkeeping()
                cpu += thread_cpu_seconds() - begin
            ctx.all_reduce_max(0.0)  # a tiny collective of the world
        return host_seconds() - start, cpu

    synced, _ = timed(False)
    wall, cpu = timed(True)
    return ctx.all_reduce_max(max(wall - synced, cpu) / max(cpu, 1e-9))


OVERLAP_CALLS = 10  # back-to-back calls per timing of phase_overlap (each well under a millisecond)
OVERLAP_TURNS = 10  # timings of each of the four kinds, taken in turn


def overlap_fraction(
    alone_a: float, alone_b: float, one_after_other: float, at_once: float
) -> float:
    """How much of the shorter of two exchanges is hidden when both run at once: (t(b; a) -
    t(b || a)) / min(t(a), t(b)), clipped to [0, 1] (two at once slower than one after the
    other hides nothing)."""
    shorter = min(alone_a, alone_b)
    if not shorter > 0:
        raise ValueError(f"exchange times must be positive, got {alone_a}, {alone_b}")
    return min(1.0, max(0.0, (one_after_other - at_once) / shorter))


def phase_overlap(ctx, comms, hidden: int = 256, calls: int = OVERLAP_CALLS) -> float:
    """How much two exchanges overlap on this host when a rank runs them at once, as HALO runs
    Phase I beside Phases II and III (Piper Eq. 13): a one-row all-to-all on the node's second
    communicator issued async, then one on the world blocking, then a wait; against the same
    two one after the other and each alone (``calls`` back to back, slowest rank; flat
    exchanges only, no scored cell). On GPUs the two run on separate engines; here every
    exchange is CPU work of the ranks' threads on shared cores. overlap_fraction of the four
    times."""
    import torch

    from moe_repro.runtime.timing import host_seconds

    world, node = comms.world, comms.intra_overlap
    xa, xb = torch.zeros(world.size, hidden), torch.zeros(node.size, hidden)
    oa, ob = torch.empty_like(xa), torch.empty_like(xb)
    ones_a, ones_b = [1] * world.size, [1] * node.size

    def a():
        world.alltoallv(xa, ones_a, ones_a, "overlap", out=oa)

    def b():
        node.alltoallv(xb, ones_b, ones_b, "overlap", out=ob)

    def one_after_other():
        b()
        a()

    def at_once():
        _, handle = node.alltoallv_async(xb, ones_b, ones_b, "overlap", out=ob)
        a()
        handle.wait()

    kinds = (a, b, one_after_other, at_once)
    for fn in kinds:
        fn()  # warm
    totals = [0.0] * len(kinds)
    for _ in range(OVERLAP_TURNS):  # the four in turn: load that drifts moves them together
        for i, fn in enumerate(kinds):
            ctx.barrier()
            start = host_seconds()
            for _ in range(calls):
                fn()
            totals[i] += ctx.all_reduce_max(host_seconds() - start)
    return overlap_fraction(*totals)


HOST_COUNTS = ("host_cpu_s", "cpu_stretch")  # the host work a fit run's record lists
FIT_SHAPE = {"hidden": 256, "experts": 16, "top_k": 4, "placement": "contiguous", "seed": 0}


def node_wide_ranks(ranks_list: list[int], gpus_per_node: int = 2) -> list[int]:
    """The ranks counts of a fit set whose worlds have two emulated nodes or more: there the fit
    set also runs node-wide (flat_fit_points)."""
    return [n for n in ranks_list if n > min(gpus_per_node, n)]


def flat_fit_points(
    backend: str,
    ranks_list: list[int],
    sizes: list[int],
    gpus_per_node: int = 2,
    shape: dict | None = None,
) -> list[dict]:
    """The alltoall points of a fit set: flat dispatches at ``ranks_list`` x ``sizes``, over the
    world and, where the world has more than one emulated node, over every node's own
    communicator at once (path node). A world-wide phase issues a message to every peer, a
    node-wide one to the node's few: the two tell a phase's per-message cost o from its
    synchronisation L at each ranks count, which world-wide runs alone cannot (they issue the
    same messages per phase at a given ranks count). HALO and RBD run node-wide phases."""
    shape = {**FIT_SHAPE, **(shape or {})}
    node_wide = node_wide_ranks(ranks_list, gpus_per_node)
    points = []
    for n in ranks_list:
        g = min(gpus_per_node, n)
        for path in ("dispatch", "node") if n in node_wide else ("dispatch",):
            points += [
                alltoall_point(
                    {
                        **shape,
                        "ranks": n,
                        "gpus_per_node": g,
                        "algo": "flat",
                        "backend": backend,
                        "sizes": s,
                        "path": path,
                    }
                )
                for s in sizes
            ]
    return points


def measure_and_fit_flat(
    backend: str,
    ranks_list: list[int],
    sizes: list[int],
    gpus_per_node: int = 2,
    repeats: int = 5,
    shape: dict | None = None,
    timeout_s: float = 600.0,
    done=None,
) -> dict:
    """Measure flat dispatches over real local ranks (suites/alltoall.py: ``ranks_list`` x
    ``sizes``, emulated nodes of ``gpus_per_node``, ``repeats`` samples, median) and fit the
    simulator's serial model to them (fit_flat). ``done``, when given, is called with each
    measured point's record (progress)."""
    from moe_repro.suites.runner import RunConfig, measure

    points = flat_fit_points(backend, ranks_list, sizes, gpus_per_node, shape)
    config = RunConfig(
        warmup=1, repeats=repeats, min_sample_s=0.01, check=False, timeout_s=timeout_s
    )
    load_before = load_average()
    records = measure(alltoall.SUITE, points, config, done=done)  # done(record) per point
    return fit_flat(
        points,
        records,
        backend,
        load_before,
        f"flat over {backend}, ranks {ranks_list}, sizes {sizes} B per rank, emulated "
        f"nodes of {gpus_per_node} ranks, median of {repeats} repeats",
    )


def fit_flat(
    points: list[dict],
    records: list[dict],
    backend: str,
    load_before: list | None,
    fitted_on: str,
) -> dict:
    """Fit the simulator's serial model (simulator.fit_alltoall_terms) to measured flat
    dispatches (``records`` of ``points``), each run's profiled host work (host_s) taken off
    first. Returns the calibration block a profile stores
    per backend: latency_us (L), per_message_us (o), GBps (beta), the form, the residuals of
    the fit simulated at the fitted values, and the runs."""
    from moe_repro.components.network import simulator as ns

    cores = host_cores()
    load_after = load_average()
    overlap = {
        str(p["ranks"]): r["phase_overlap"] for p, r in zip(points, records) if "phase_overlap" in r
    }
    taken_off = {"host_work": HOST_TAKEN_OFF}
    terms, times, known = [], [], []
    for point, rec in zip(points, records):
        msgs, topo, deps = routed_messages(point)
        terms.append(ns.alltoall_time_terms(msgs, topo, deps, cores))
        times.append(rec["time_s"])
        known.append(host_s({**rec, "ranks": point["ranks"]}, taken_off, cores))
    # One latency and one per-message cost per ranks count: a phase's synchronisation of n
    # ranks, and each message's issue and completion, both of which grow once the ranks
    # outnumber the cores the machine gives them (the count exchange is such a phase); the
    # node-wide runs tell the two apart (flat_fit_points).
    groups = [int(p["ranks"]) for p in points]
    try:
        fit = ns.fit_alltoall_terms(terms, times, known, groups=groups, per_message_by_group=True)
        separated = True
    except ValueError as e:
        # The host work profiled apart can exceed what the runs' times leave for the bytes: then
        # fit the runs whole, with no host work taken off, and say so; predictions add no host
        # work on top.
        fit = ns.fit_alltoall_terms(terms, times, None, groups=groups, per_message_by_group=True)
        separated, why = False, str(e)
    block = {
        "backend": backend,
        "latency_us": fit["latency_s"] * 1e6,
        "latency_us_by_ranks": {str(n): v * 1e6 for n, v in fit["latency_s_by_group"].items()},
        "per_message_us": fit["per_message_s"] * 1e6,
        "per_message_us_by_ranks": {
            str(n): v * 1e6 for n, v in fit["per_message_s_by_group"].items()
        },
        "GBps": fit["bytes_per_s"] / 1e9,
        **({"overlap_by_ranks": overlap} if overlap else {}),
        **(
            taken_off
            if separated
            else {"host_work": f"not separated: with it taken off first, {why}; fitted whole"}
        ),
        "host_cores": cores,
        "load_average": {
            "before": load_before,
            "after": load_after,
            "what": "1, 5 and 15 minute load averages of the machine (os.getloadavg) "
            "before and after the fit runs",
        },
        "form": ns.ALLTOALL_FIT_FORM + "; plus the host work, known before the fit: the CPU "
        "seconds the run's dispatch spends outside its collectives (host_cpu_s, profiled on the "
        "run) x the cpu_stretch measured in the run's world (else max(1, ranks / host_cores))",
        "fitted_on": fitted_on,
    }
    runs, residuals = [], []
    for point, rec, term, host in zip(
        points, records, terms, known if separated else [0.0] * len(known)
    ):
        simulated = predict(point, block, cores)["predicted_time_s"] + host
        residuals.append(simulated / rec["time_s"] - 1)
        runs.append(
            {
                "ranks": point["ranks"],
                "gpus_per_node": point["gpus_per_node"],
                "path": point["path"],
                "size": point["size"],
                "time_s": rec["time_s"],
                "time_s_iqr": rec["time_s_iqr"],
                "simulated_s": simulated,
                "host_s": host,
                **{k: rec.get(k) for k in HOST_COUNTS},
                "residual_pct": 100 * residuals[-1],
                "n_latency": term[0],
                "n_messages": term[1],
                "bytes_term": term[2],
            }
        )
    block.update(
        runs=runs,
        rms_residual_pct=100 * (sum(r * r for r in residuals) / len(residuals)) ** 0.5,
        max_abs_residual_pct=100 * max(abs(r) for r in residuals),
    )
    return block


def calibration_from_profile(path: str, backend: str) -> dict:
    """The ``calibration`` block for ``backend`` of a profile written by ``repro calibrate``."""
    import json

    from moe_repro.records.inputs import PLATFORM_LIMIT, InputError, read_input

    try:  # within PLATFORM_LIMIT, a FIFO or device refused unread (records/inputs.py)
        doc = json.loads(read_input(path, PLATFORM_LIMIT).decode("utf-8"))
    except InputError as e:
        raise ValueError(f"calibration file {path}: {e.reason}") from None
    except ValueError as e:  # not JSON, not UTF-8
        raise ValueError(f"calibration file {path}: {e}") from None
    block = (doc.get("calibration") or {}).get(backend) if isinstance(doc, dict) else None
    if not isinstance(block, dict) or "GBps" not in block:
        raise ValueError(
            f"calibration file {path} has no calibration for backend {backend} "
            f"(write one with `repro calibrate`)"
        )
    return {**block, "source": path}


def fit_set(p: dict) -> dict:
    """The fit set of a calibration=fit point: backend, emulated nodes, ranks counts, sizes,
    repeats and the routing shape (checked; measured with the grid by measure_grid)."""
    from moe_repro.runtime.launch import launched_world_size

    if launched_world_size():
        raise ValueError(
            "calibration=fit starts its own worlds, which it cannot under torchrun/mpirun/"
            "srun: write a profile with `repro calibrate` and pass calibration=FILE"
        )
    gpus_per_node = int(p["gpus_per_node"])
    ranks = tuple(split_list(p["fit_ranks"], "fit_ranks", int))
    sizes = tuple(split_list(p["fit_sizes"], "fit_sizes", parse_size))
    if min(ranks) < 2 or any(n % min(gpus_per_node, n) for n in ranks):
        raise ValueError(
            f"fit_ranks must be >= 2 and multiples of gpus_per_node, got {p['fit_ranks']}"
        )
    repeats = int(p["fit_repeats"])
    if repeats < 1:
        raise ValueError(f"fit_repeats must be >= 1, got {repeats}")
    return {
        "backend": str(p["backend"]),
        "gpus_per_node": gpus_per_node,
        "ranks": list(ranks),
        "sizes": list(sizes),
        "repeats": repeats,
        "shape": {k: p[k] for k in ("hidden", "experts", "top_k", "placement", "seed")},
    }


def _fitted_on(fs: dict) -> str:
    return (
        f"flat over {fs['backend']}, ranks {list(fs['ranks'])}, sizes {list(fs['sizes'])} B per rank, "
        f"emulated nodes of {fs['gpus_per_node']} ranks, median of {fs['repeats']} repeats, measured "
        f"in the same worlds as the scored cells, their samples taken in turn (round by round)"
    )


def _how(point: dict, fitted_on: str) -> dict:
    return {
        "time_s": f"measured: median of the repeats of one real dispatch ({point['impl']}, count "
        f"exchange included), each sample the slowest rank",
        "predicted_time_s": f"simulated: components/network/simulator.py, serial latency model, the "
        f"run's own messages, on a local profile calibrated from {fitted_on}; "
        f"phases that may run at once overlapping by the fraction measured in the "
        f"run's world (phase_overlap; none measured: fully); "
        f"plus the run's host work (predicted_host_s)",
        "predicted_host_s": "measured: the CPU seconds the run's dispatch spends outside its "
        "collectives on the busiest rank (fit: one call after each sample, "
        "median over the rounds; a profile file: median of 5 calls in setup), "
        "stretched by the cpu_stretch measured in its world (fit) or by "
        "ranks / cores (a profile file)",
        "error_pct": "(predicted / measured - 1) x 100, per sample, median",
    }


def derived_params(p: dict) -> dict:
    point = alltoall_point(p)
    if str(p["calibration"]) == "fit":
        # The fit set is measured with the grid, in its worlds (measure_grid): the prediction
        # joins the record once the fit exists.
        # The grid's own values name the set (the point's hidden may be narrowed below).
        fs = fit_set(p)
        return {**point, "fit_set": fs, "how": _how(point, _fitted_on(fs))}
    calibration = calibration_from_profile(str(p["calibration"]), p["backend"])
    cores = int(calibration.get("host_cores") or host_cores())
    # Every alltoall param joins the point (its setup and run read them); simulated: false there
    # says the run is real, predicted_* are the simulated values beside it.
    return {
        **point,
        **predict(point, calibration, cores),
        "calibration_used": calibration,
        "how": _how(point, calibration.get("fitted_on", calibration["source"])),
    }


def derive(params: dict, state: dict, time_s: float) -> dict:
    """Measured metrics of the run, and the prediction: the simulated messages (derived_params)
    plus the host work this run's dispatch does (host_s: its CPU time outside its collectives,
    profiled in setup)."""
    measured = alltoall.derive(params, state, time_s)
    load = load_average()
    measured.update({"load_average": load[0]} if load else {})
    if "calibration_used" not in params:  # calibration=fit: predicted once the fit exists
        return measured
    calibration = params["calibration_used"]
    cores = int(calibration.get("host_cores") or host_cores())
    run = {**measured, "ranks": params["ranks"]}
    host = host_s(run, calibration, cores)
    predicted = float(params["predicted_time_s"]) + host
    return {
        **measured,
        "predicted_time_s": predicted,
        "predicted_host_s": host,
        "error_pct": 100 * (predicted / time_s - 1),
    }


def measure_world_on_rank(
    ctx, points: list[dict], repeats: list[int], config: dict, fit: list[bool]
) -> list[dict]:
    """Launcher target: one world's points (fit runs and scored cells alike), each set up,
    checked and warmed up, then sampled in turn, round by round (every point's i-th sample
    before any point's (i+1)-th), so that all of them see the same load on a shared machine.
    ``repeats[i]`` samples of point i; fit points (``fit[i]``) are not checked. Rank 0 returns
    the records, the other ranks []."""
    import dataclasses

    from moe_repro.suites.runner import RunConfig, prepare_point, summarized, timed

    cfg = RunConfig(**config)
    prepared = [
        prepare_point(alltoall.SUITE, p, dataclasses.replace(cfg, check=cfg.check and not f), ctx)
        for p, f in zip(points, fit)
    ]
    samples: list[dict[str, list[float]]] = [{"time_s": []} for _ in points]
    profiled: list[list[float]] = [[] for _ in points]  # this rank's host CPU per round
    stretch, overlap = [], []
    for r in range(max(repeats)):
        for i, (p, (state, _, timer, number, _)) in enumerate(zip(points, prepared)):
            if r < repeats[i]:
                t = timed(alltoall.SUITE, state, number, ctx, timer)
                cpu = profile_host_cpu(state)  # after the sample: warm from its calls, as they were
                if cpu is not None:
                    profiled[i].append(cpu)
                for name, value in {"time_s": t, **derive(p, state, t)}.items():
                    samples[i].setdefault(name, []).append(float(value))
        stretch.append(cpu_stretch(ctx))  # once a round: the host work's price at this load
        overlap.append(phase_overlap(ctx, prepared[0][0]["comms"]))
    for i, (state, *_) in enumerate(prepared):
        if profiled[i]:  # the busiest rank's rounds replace the profile taken in setup
            samples[i]["host_cpu_s"] = busiest_rank_rounds(state["comms"], profiled[i])
    records = []
    for i, (state, record, timer, number, device) in enumerate(prepared):
        record.update(
            summarized(samples[i]),
            repeats=repeats[i],
            number=number,
            samples=samples[i],
            device_used=str(device),
            clock=timer.clock,
            world_size=ctx.world_size,
            ranks_per_node=ctx.ranks_per_node,
            cpu_stretch=statistics.median(stretch),
            cpu_stretch_samples=stretch,
            phase_overlap=statistics.median(overlap),
            phase_overlap_samples=overlap,
        )
        records.append(record)
    return records if ctx.rank == 0 else []


def profile_host_cpu(state: dict) -> float | None:
    """This rank's host work of one more call of the point's dispatch (suites/alltoall
    .host_cpu_seconds), profiled right after the point's sample of a round; None for a peer's
    dispatch, whose collectives cannot be taken out. The rounds' profiles replace the one
    taken in setup (busiest_rank_rounds), so that it is measured at the load of the samples it
    is predicted against and is the median over the rounds, as every other quantity here is.
    A profile taken once in setup, a few calls back to back, can land on a passing stall. After
    the sample, not before: the first call after another point's runs comes cold."""
    if "cpu_ns" not in (state.get("host_work") or {}):
        return None
    return alltoall.host_cpu_seconds(lambda: alltoall._dispatch(state), state["comms"], calls=1)


def busiest_rank_rounds(comms, mine: list[float]) -> list[float]:
    """Every rank's profiles of one point, gathered (``comms.world``, a collective: every rank
    calls it with as many rounds), and the rounds of the rank whose median is the highest: the
    busiest rank, as in setup (each rank's median first, then the highest: the highest of
    single calls would favour whichever rank a stall hit)."""
    per_rank = comms.world.allgather_ints([round(1e9 * x) for x in mine])
    return [v * 1e-9 for v in max(per_rank, key=statistics.median)]


# Calls per sample chosen from the median of this many single calls: one call that hits a
# scheduler stall would make a short dispatch's samples only a few calls long, each then either
# stall-free or several times too slow (fit and cells alike).
NUMBER_FROM = 5


def _in_turn(a: list, b: list) -> list:
    """a[0], b[0], a[1], b[1], ... then the rest of the longer."""
    out = []
    for i in range(max(len(a), len(b))):
        out += a[i : i + 1] + b[i : i + 1]
    return out


def measure_grid(grid: list[dict], config, progress=None, done=None) -> list[dict] | None:
    """calibration=fit: the fit set and the scored cells measured in the same worlds, one world
    per ranks count, their samples in turn (measure_world_on_rank): load that drifts over the
    minutes of a run moves the fit and the cells together. Then the fit (fit_flat) and each
    cell's prediction. None (measured the usual way, the
    prediction made per sample by derive) for calibration=FILE."""
    import json

    fitted = [p for p in grid if str(p["calibration"]) == "fit"]
    if not fitted:
        return None
    if len(fitted) != len(grid):
        raise ValueError(
            "calibration=fit and calibration=FILE cannot share one run: run them apart"
        )
    by_set: dict[str, list[int]] = {}
    for i, p in enumerate(grid):
        by_set.setdefault(json.dumps(p["fit_set"], sort_keys=True), []).append(i)
    records: list[dict | None] = [None] * len(grid)
    try:
        _measure_fit_sets(grid, config, progress, by_set, records)
    except BaseException:
        # Ctrl-C, SIGTERM, a world that failed: the cells measured so far are kept with their
        # measured times; their prediction needs the whole fit set, so it is not made.
        for rec in records:
            if rec is not None and done:
                done(
                    rec
                    if "calibration_used" in rec
                    else {
                        **rec,
                        "prediction_missing": "the run ended before its fit set was measured in "
                        "every world, so no prediction was made",
                    }
                )
        raise
    for rec in records:
        if done:
            done(rec)
    return records


def _measure_fit_sets(
    grid: list[dict], config, progress, by_set: dict[str, list[int]], records: list[dict | None]
) -> None:
    """measure_grid's work: each fit set and its cells, world by world, into ``records``; the
    predictions once a fit set's every world has run."""
    import json
    from dataclasses import asdict, replace

    from moe_repro.runtime.launch import run_ranks
    from moe_repro.suites.runner import summarized

    finished = 0
    for key, members in by_set.items():
        fs = json.loads(key)
        fit_points = flat_fit_points(
            fs["backend"], fs["ranks"], fs["sizes"], fs["gpus_per_node"], fs["shape"]
        )
        fit_records: list[dict | None] = [None] * len(fit_points)
        print(
            f"alltoall-validation: the fit set (flat over {fs['backend']}, ranks "
            f"{'+'.join(map(str, fs['ranks']))}, sizes {'+'.join(map(str, fs['sizes']))} B per rank) "
            f"measured in the grid's worlds, in turn with the cells",
            file=sys.stderr,
        )
        load_before = load_average()
        worlds: dict[
            tuple, tuple[list[int], list[int]]
        ] = {}  # world -> (fit indices, cell indices)
        for j, f in enumerate(fit_points):
            worlds.setdefault((f["ranks"], f["ranks_per_node"]), ([], []))[0].append(j)
        for i in members:
            worlds.setdefault((grid[i]["ranks"], grid[i]["ranks_per_node"]), ([], []))[1].append(i)
        for (ranks, per_node), (fits, cells) in sorted(worlds.items()):
            order = _in_turn([("fit", j) for j in fits], [("cell", i) for i in cells])
            if progress:
                progress(
                    finished,
                    len(grid),
                    {"ranks": ranks, "backend": fs["backend"], "ranks_per_node": per_node},
                )
            got = run_ranks(
                "moe_repro.suites.alltoall_validation:measure_world_on_rank",
                {
                    "points": [fit_points[k] if what == "fit" else grid[k] for what, k in order],
                    "repeats": [
                        fs["repeats"] if what == "fit" else config.repeats for what, _ in order
                    ],
                    "config": asdict(replace(config, number_from=NUMBER_FROM)),
                    "fit": [what == "fit" for what, _ in order],
                },
                world_size=ranks,
                ranks_per_node=per_node,
                backend=fs["backend"],
                timeout_s=config.timeout_s,
            )[0]
            for (what, k), rec in zip(order, got):
                if what == "fit":
                    fit_records[k] = rec
                else:
                    records[k] = {**rec, "suite": SUITE.name}
            finished += len(cells)
        block = {
            **fit_flat(
                fit_points,
                fit_records,
                fs["backend"],
                load_before,
                _fitted_on(fs),
            ),
            "source": "fit",
        }
        cores = int(block["host_cores"])
        for i in members:
            rec, point = records[i], grid[i]
            host = host_s({**rec, "ranks": point["ranks"]}, block, cores)
            predicted = predict(point, block, cores)
            total = predicted["predicted_time_s"] + host
            extra = {
                "predicted_time_s": [total] * len(rec["samples"]["time_s"]),
                "predicted_host_s": [host] * len(rec["samples"]["time_s"]),
                "error_pct": [100 * (total / t - 1) for t in rec["samples"]["time_s"]],
            }
            rec["samples"].update(extra)
            rec.update(
                summarized(extra),
                predicted_inter_node_bytes=predicted["predicted_inter_node_bytes"],
                predicted_intra_node_bytes=predicted["predicted_intra_node_bytes"],
                calibration_used=block,
            )


GOAL_MEDIAN_ERROR_PCT = (
    15.0  # the local calibration's goal: median |error| per backend and algorithm
)
INTERVAL = 0.90  # the summary's interval of that median: 5th to 95th percentile
BOOTSTRAP_DRAWS = 2000  # resamples of the rounds behind it


def _cell_errors(record: dict) -> list[float]:
    """A cell's error per sample (round), else its one median error."""
    samples = (record.get("samples") or {}).get("error_pct")
    return [float(e) for e in samples] if samples else [float(record["error_pct"])]


def median_error_interval(
    cells: list[dict], draws: int = BOOTSTRAP_DRAWS, seed: int = 0
) -> tuple[float, float]:
    """The INTERVAL percentile bootstrap (Efron & Tibshirani, An Introduction to the Bootstrap,
    1993, ch. 13) of the median over ``cells`` of |error_pct|, each cell's error the median over
    its samples as in the summary: the rounds of one world are drawn with replacement, the same
    rounds for every cell of that world (measure_world_on_rank samples a world's points in turn,
    round by round, so a slow round slows them all), and the worlds apart. What it covers is
    the scored cells' sampling noise; the fit's, which moves every prediction of a world
    together, is not in it. |error| folds the noise one way: where the cells' errors lie near 0
    the interval leans above the median. Cells with one sample each (no samples kept) give a
    point. Seeded: the same records give the same interval."""
    errors = [_cell_errors(r) for r in cells]
    worlds: dict[tuple, list[int]] = {}
    for i, r in enumerate(cells):
        worlds.setdefault((r.get("backend"), r.get("ranks"), r.get("gpus_per_node")), []).append(i)
    rng = random.Random(seed)
    medians = []
    for _ in range(draws):
        drawn = [0.0] * len(cells)
        for members in worlds.values():
            rounds = max(len(errors[i]) for i in members)
            picks = [rng.randrange(rounds) for _ in range(rounds)]
            for i in members:
                chosen = [errors[i][k] for k in picks if k < len(errors[i])] or errors[i]
                drawn[i] = abs(statistics.median(chosen))
        medians.append(statistics.median(drawn))
    medians.sort()
    tail = (1 - INTERVAL) / 2
    return medians[int(tail * draws)], medians[min(draws - 1, int((1 - tail) * draws))]


def goal_verdict(low: float, high: float, goal: float = GOAL_MEDIAN_ERROR_PCT) -> str:
    """Within the goal only when the whole interval is, above it only when the whole interval
    is; otherwise this run's noise cannot tell, and the summary says so rather than let the
    verdict turn with the next run."""
    if high <= goal:
        return f"within the {goal:g}% goal"
    if low > goal:
        return f"above the {goal:g}% goal"
    return f"the {goal:g}% goal inside the interval: this run cannot tell; more --repeats narrow it"


def _pct(value: float) -> str:
    # one decimal, two where one would read as the goal itself (15.04% is above 15%)
    reads_as_goal = (
        f"{value:.1f}" == f"{GOAL_MEDIAN_ERROR_PCT:.1f}" and value != GOAL_MEDIAN_ERROR_PCT
    )
    return f"{value:.2f}" if reads_as_goal else f"{value:.1f}"


def error_summary(records: list[dict]) -> list[str]:
    """One line per backend and algorithm: the median over its cells of |error_pct| (each cell
    already the median over its samples), its INTERVAL bootstrap interval over the rounds
    (median_error_interval; shown where the cells kept their samples), the worst cell, and
    the verdict against GOAL_MEDIAN_ERROR_PCT on the whole interval (goal_verdict); then how
    much of the prediction is the profiled host work (the median over the cells of
    predicted_host_s / predicted_time_s): the rest is the simulator's. Cells without a
    prediction (an interrupted run) are left out."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        if isinstance(r.get("error_pct"), (int, float)):
            groups.setdefault((str(r["backend"]), str(r["algo"])), []).append(r)
    lines = []
    for (backend, algo), cells in sorted(groups.items(), key=lambda item: item[0][0]):  # by backend
        errors = [abs(float(r["error_pct"])) for r in cells]
        median = statistics.median(errors)
        low, high = median_error_interval(cells)
        low, high = min(low, median), max(high, median)  # a coarse bootstrap can miss the point
        interval = (
            "" if low == high else f" ({100 * INTERVAL:.0f}% interval {_pct(low)}-{_pct(high)}%)"
        )
        shares = [
            r["predicted_host_s"] / r["predicted_time_s"]
            for r in cells
            if isinstance(r.get("predicted_host_s"), (int, float)) and r.get("predicted_time_s")
        ]
        lines.append(
            f"{backend} {algo}: median |error| {_pct(median)}%{interval} over {len(errors)} cell"
            f"{'' if len(errors) == 1 else 's'}, worst "
            f"{max(errors):.1f}% ({goal_verdict(low, high)})"
            + (
                f"; host work (profiled) {100 * statistics.median(shares):.0f}% of the predicted "
                f"time"
                if shares
                else ""
            )
        )
    return lines


def _calibration_source(value: str) -> None:
    if value != "fit" and not os.path.isfile(value):
        raise ValueError(
            f"calibration must be fit or a profile file written by repro calibrate; "
            f"{value!r} is not a file"
        )


def _fit_ranks(value: str) -> None:
    ranks = split_list(value, "fit_ranks", int)
    if min(ranks) < 2 or max(ranks) > alltoall.MAX_LOCAL_RANKS:
        raise ValueError(f"fit_ranks must be in [2, {alltoall.MAX_LOCAL_RANKS}], got {value}")


def _fit_sizes(value: str) -> None:
    if min(split_list(value, "fit_sizes", parse_size)) < 1:
        raise ValueError(f"fit_sizes must be positive, got {value}")


SUITE = Suite(
    name="alltoall-validation",
    schema={
        "ranks": whole(2, alltoall.MAX_LOCAL_RANKS, why_max="real local ranks"),
        "gpus_per_node": whole(1, alltoall.MAX_LOCAL_RANKS),
        "algo": registered("algo", algorithm_names),
        "backend": one_of("gloo", "mpi"),
        "sizes": whole(1, 2**34),
        "hidden": whole(1, 2**16),
        "experts": whole(1, 2**16),
        "top_k": whole(1, 2**10),
        "placement": one_of(*alltoall.PLACEMENTS),
        "seed": SEED,
        "calibration": Param(str, check=_calibration_source, bad=("/nonexistent/c.json",)),
        "fit_ranks": Param(str, check=_fit_ranks, bad=("1", "x", "+", "3+5")),
        "fit_sizes": Param(str, check=_fit_sizes, bad=("0", "x", "+", "nanK")),
        "fit_repeats": whole(1, 1000),
    },
    rules=(
        top_k_within_experts(),
        Rule(
            lambda p: int(p["ranks"]) % int(p["gpus_per_node"]) == 0,
            "ranks={ranks} must be a multiple of gpus_per_node={gpus_per_node}",
            {"ranks": "4", "gpus_per_node": "3"},
        ),
        # every rank's payload, and every rank's routing draw, built in this process too (a
        # score per token and expert, and their argsort)
        fits_in_memory(
            lambda p: (
                int(p["ranks"])
                * (
                    4 * int(p["sizes"])
                    + 16
                    * int(p["experts"])
                    * (int(p["sizes"]) // (4 * int(p["top_k"]) * int(p["hidden"])))
                )
            ),
            {"sizes": str(2**34)},
        ),
    ),
    params={
        "ranks": [2, 4, 8],
        "gpus_per_node": [2],
        "algo": algorithm_names(),
        "backend": ["gloo", "mpi"],
        "sizes": [1024, 65536, 1048576, 16777216],
        "hidden": [256],
        "experts": [16],
        "top_k": [4],
        "placement": ["contiguous"],
        "seed": [0],
        "calibration": ["fit"],
        "fit_ranks": ["2+4+8"],
        "fit_sizes": ["2K+16K+256K+4M+8M"],
        "fit_repeats": [5],
    },
    quick={
        "ranks": [2, 4],
        "sizes": [1024, 1048576],
        "fit_ranks": ["2+4"],
        "fit_sizes": ["2K+256K+4M"],
    },
    table_keys=("ranks", "algo", "backend", "size"),
    table_metrics=("time_s", "predicted_time_s", "error_pct"),
    summary=error_summary,
    world_params=("ranks", "backend", "ranks_per_node"),
    derived_params=derived_params,
    measure_grid=measure_grid,
    # pyperf's min_time: a gloo dispatch of a few ms stalls now and then for a few ms, so
    # samples of a few calls each (asv's default 10 ms) scatter widely.
    min_sample_s=0.1,
    setup=alltoall.setup,
    run=alltoall.run,
    derive=derive,
    check=alltoall.check,
    metrics=[
        Metric(
            "predicted_time_s",
            "s",
            "none",
            kind="simulated",
            description="the simulator's time for this run's messages on the calibrated local "
            "profile, plus its host work (predicted_host_s)",
        ),
        Metric(
            "predicted_host_s",
            "s",
            "none",
            kind="measured",
            description="the host-work part of the prediction: the CPU seconds the run's "
            "dispatch spends outside its collectives (host_cpu_s, profiled in "
            "setup) times the cores' sharing (cpu_stretch)",
        ),
        Metric(
            "error_pct",
            "%",
            "none",
            description="(predicted / measured - 1) x 100: positive = the simulator is slower",
        ),
        Metric(
            "load_average",
            "",
            "none",
            description="the machine's 1-minute load average after each sample (os.getloadavg): "
            "how much other work shared the cores",
        ),
        *alltoall.DISPATCH_METRICS,
    ],
    param_help={
        "ranks": f"real local ranks (2-{alltoall.MAX_LOCAL_RANKS}; default 2,4,8 on a small machine)",
        "gpus_per_node": "ranks per emulated node (HALO and RBD need nodes)",
        "algo": "a registered all-to-all: " + ", ".join(algorithm_names()),
        "backend": "gloo or mpi (mpi4py under mpiexec)",
        "sizes": "bytes each rank sends (tokens x top_k x hidden x 4), e.g. 1K:16M",
        "hidden": "hidden size (float32 elements per row; narrowed below one token's payload)",
        "experts": "experts in total",
        "top_k": "experts per token",
        "placement": "expert -> rank map: contiguous, strided or random",
        "seed": "routing seed",
        "calibration": "fit (fit the profile on flat runs at fit_ranks x fit_sizes first) or a "
        "profile FILE written by `repro calibrate`",
        "fit_ranks": "ranks counts of the fit set, joined by '+'",
        "fit_sizes": "sizes of the fit set, joined by '+' (keep them apart from sizes)",
        "fit_repeats": "timed samples per fit run",
    },
)
