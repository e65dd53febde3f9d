"""``repro calibrate``: measure this machine's GEMM, attention and memory-copy ceilings and the
latency, per-message cost and bandwidth of its all-to-all, and write a ``local`` platform profile
(components.network.platform.local_profile) the planner and the network simulator can use."""

from __future__ import annotations

import os

import click

from moe_repro.cli.errors import BadInput, OutputFile, RunFailure


def _run(suite_name: str, point: dict, repeats: int, check: bool = True) -> dict:
    """The record of one grid point of a local suite, measured by the runner (warm-up,
    calibrated repeats, median and spread)."""
    from moe_repro.suites.runner import RunConfig, measure

    config = RunConfig(warmup=1, repeats=repeats, min_sample_s=0.05, check=check)
    [record] = measure(suite_name, [point], config)
    return record


def require_correct(record: dict) -> None:
    if record.get("correct") is False:
        raise RunFailure(
            f"suite {record['suite']} computed {record['wrong']} wrong elements; "
            "its time is not a ceiling"
        )


class _Steps:
    """Counts calibrate's measurements (each GEMM size, the copy, the attention, each all-to-all
    point) and reports them as progress lines (moe_repro/cli/progress.py)."""

    def __init__(self, total: int):
        from moe_repro.cli.progress import StepLines

        self.done, self.total, self.lines = 0, total, StepLines("calibrate")

    def start(self, what: str) -> None:
        self.lines(self.done, self.total, f"now {what}")

    def finished(self, record: dict | None = None) -> None:
        self.done += 1
        if record is not None and self.done < self.total:  # an all-to-all point, measured
            where = " node-wide" if record.get("path") == "node" else ""
            self.lines(
                self.done,
                self.total,
                f"measured{where} all-to-all ranks {record.get('ranks')}, "
                f"{record.get('size')} B per rank",
            )
        if self.done == self.total:
            self.lines(self.done, self.total)

    def skip(self, steps: int) -> None:
        """Steps that will not run (a backend skipped or failed part-way)."""
        self.total -= steps
        if self.done >= self.total:
            self.lines(self.total, self.total)


_STEPS: _Steps | None = None


def _step(what: str) -> None:
    if _STEPS is not None:
        _STEPS.start(what)


def _stepped(record: dict | None = None) -> None:
    if _STEPS is not None:
        _STEPS.finished(record)


def measure_gemm_tflops(sizes: list[int], repeats: int) -> dict:
    """GEMM ceiling with suites/gemm.py (float32, CPU, the caller's threads): median TFLOP/s
    per size."""
    best = {}
    for n in sizes:
        _step(f"GEMM n={n}")
        rec = _run("gemm", {"n": n, "dtype": "float32", "device": "cpu"}, repeats, check=n <= 512)
        best[n] = {
            "tflops": rec["tflops"],
            "tflops_iqr": rec.get("tflops_iqr"),
            "correct": rec.get("correct"),
        }
        _stepped()
    return best


def measure_copy_GBps(mbytes: int, repeats: int) -> tuple[float, float]:
    """Memory bandwidth of a large tensor copy (suites/memcopy.py, one thread): median GB/s and
    the spread of the copy time (max - min sample, seconds)."""
    _step(f"memory copy {mbytes} MB")
    rec = _run("memcopy", {"mbytes": mbytes, "device": "cpu", "threads": 1}, repeats)
    _stepped()
    require_correct(rec)
    return rec["GBps"], rec["time_s_max"] - rec["time_s_min"]


def measure_attention_tflops(seq: int, repeats: int) -> tuple[float, float]:
    """Causal SDPA (suites/attention.py, one thread, float32, batch 1) with 4 heads of 64, no
    GQA (switch-base's head shape): median TFLOP/s and the time spread (max - min, seconds)."""
    point = {
        "model": "switch-base",
        "seq_len": seq,
        "batch": 1,
        "heads": 4,
        "backward": False,
        "dtype": "float32",
        "device": "cpu",
        "threads": 1,
    }
    _step(f"attention seq {seq}")
    rec = _run("attention", point, repeats)
    _stepped()
    require_correct(rec)
    return rec["tflops"], rec["time_s_max"] - rec["time_s_min"]


ALLTOALL_GRID = {
    False: {"ranks": [2, 4, 8], "sizes": [2**10, 2**14, 2**18, 2**22, 2**24]},
    True: {"ranks": [2, 4], "sizes": [2**10, 2**16, 2**22]},
}  # by --quick


def measure_alltoall(quick: bool, repeats: int) -> dict:
    """Fit the local all-to-all per backend (gloo, and MPI where it runs): flat dispatches of
    suites/alltoall.py over real ranks, world-wide and node-wide (path node, where a world has
    two emulated nodes or more), the simulator's serial model fitted to them
    (suites/alltoall_validation.measure_and_fit_flat). A backend that fails is reported, not
    fitted."""
    from moe_repro.runtime.launch import RankFailure, mpi_unavailable
    from moe_repro.suites.alltoall_validation import measure_and_fit_flat, node_wide_ranks

    grid = ALLTOALL_GRID[quick]
    fits = {}
    for backend in ("gloo", "mpi"):
        why_not = mpi_unavailable() if backend == "mpi" else None
        if why_not:  # not counted in the steps
            fits[backend] = {"skipped": why_not}
            continue
        # world-wide runs at every ranks count, node-wide ones where the world has two nodes or
        # more (alltoall_validation.flat_fit_points: they tell the per-message cost from L)
        node_wide = node_wide_ranks(grid["ranks"])
        runs = (len(grid["ranks"]) + len(node_wide)) * len(grid["sizes"])
        _step(
            f"all-to-all over {backend}: {runs} runs "
            f"(ranks {'/'.join(map(str, grid['ranks']))} x {len(grid['sizes'])} sizes, and node-wide at "
            f"{'/'.join(map(str, node_wide)) or 'none'})"
        )
        measured = _STEPS.done if _STEPS is not None else 0
        try:
            fits[backend] = measure_and_fit_flat(
                backend, grid["ranks"], grid["sizes"], repeats=repeats, done=_stepped
            )
        except (RankFailure, ValueError) as e:
            fits[backend] = {"skipped": f"{backend} all-to-all failed: {e}"}
            if _STEPS is not None:
                _STEPS.skip(runs - (_STEPS.done - measured))
    return fits


# A fit whose simulated times miss the measured runs by more than this (rms of the relative
# residuals) is reported as not trustworthy: the profile's all-to-all predictions are then off by
# more than a quarter of the time on the very runs it was fitted to. A choice, stated here and in
# the warning, not tuned to any result.
FIT_RMS_BOUND_PCT = 25.0


def judge_fit(backend: str, fit: dict, load: tuple[float, float, float] | None = None) -> list[str]:
    """Warnings and explanations for one backend's all-to-all fit, one line each: residuals above
    FIT_RMS_BOUND_PCT (with what to do), and a latency L or per-message cost o fitted to zero
    (what that means for predictions). Empty for a fit within the bound with both terms."""
    lines = []
    rms, worst = fit["rms_residual_pct"], fit["max_abs_residual_pct"]
    if rms > FIT_RMS_BOUND_PCT:
        busy = (
            f"; load average was {load[0]:.1f} on {os.cpu_count()} cores: other work shared the "
            f"machine"
            if load and load[0] > 0.5 * (os.cpu_count() or 1)
            else ""
        )
        lines.append(
            f"warning: the all-to-all fit over {backend} misses its own runs by {rms:.0f}% rms "
            f"(worst {worst:.0f}%), above the {FIT_RMS_BOUND_PCT:.0f}% bound{busy}. The "
            f"profile's all-to-all times are that uncertain: rerun `repro calibrate` on an idle "
            f"machine (more repeats without --quick), or take the other backend's links "
            f"(--links-from) if its fit is within the bound"
        )
    if fit["latency_us"] == 0 and fit["per_message_us"] > 0:
        lines.append(
            f"note: L (latency) fitted to 0 over {backend}: a phase costs what its messages do, "
            f"o = {fit['per_message_us']:.3g} us each (world-wide and node-wide runs agree on it); "
            f"the profile predicts every message's start cost from o alone"
        )
    elif fit["per_message_us"] == 0 and fit["latency_us"] > 0:
        lines.append(
            f"note: o (per-message cost) fitted to 0 over {backend}: node-wide phases cost what "
            f"world-wide ones do, so L = {fit['latency_us']:.3g} us carries the start cost of a "
            f"phase; issuing many messages is predicted free"
        )
    elif fit["latency_us"] == 0 and fit["per_message_us"] == 0:
        lines.append(
            f"warning: the fit over {backend} found no start cost at all (L = o = 0): small "
            f"messages are predicted to take no time, which no real machine does; rerun on an "
            f"idle machine without --quick (more sizes below 64 KiB)"
        )
    return lines


def faster_backend(fits: dict) -> tuple[str, dict]:
    """The fitted backend with the lower geometric-mean measured time over the runs every fitted
    backend made (each size and ranks count weighs the same), and that mean per backend (s)."""
    import math

    fitted = {b: f for b, f in fits.items() if "runs" in f}
    if not fitted:
        raise RunFailure(
            "no all-to-all backend could be measured: "
            + "; ".join(f"{b}: {f['skipped']}" for b, f in fits.items())
        )
    keys = set.intersection(
        *({(r["ranks"], r["size"]) for r in f["runs"]} for f in fitted.values())
    )
    means = {}
    for b, f in fitted.items():
        times = [r["time_s"] for r in f["runs"] if (r["ranks"], r["size"]) in keys]
        means[b] = math.exp(sum(math.log(t) for t in times) / len(times))
    return min(means, key=means.get), means


def write_alltoall_calibration(doc: dict, fits: dict, links_from: str, when: str | None) -> str:
    """Put the per-backend fits in ``doc["calibration"]`` and the chosen backend's into the
    links, NICs, ports and per-message cost the simulator reads; returns the backend used."""
    from moe_repro.components.network.simulator import apply_alltoall_fit

    chosen, means = faster_backend(fits)
    if links_from != "faster":
        if "runs" not in fits.get(links_from, {}):
            raise RunFailure(
                f"--links-from {links_from}: that backend was not fitted "
                f"({fits.get(links_from, {}).get('skipped', 'not measured')})"
            )
        chosen = links_from
    fit = fits[chosen]
    apply_alltoall_fit(
        doc,
        {
            "latency_s": fit["latency_us"] * 1e-6,
            "per_message_s": fit["per_message_us"] * 1e-6,
            "bytes_per_s": fit["GBps"] * 1e9,
        },
        fit["host_cores"],
    )
    doc["calibration"] = {
        **fits,
        "links_from": chosen,
        "date": when,
        "rule": (
            "links from --links-from, else the faster backend: lower geometric-"
            "mean measured time over the runs both made"
        ),
        "geomean_time_s": means,
    }
    fitted_keys = ("node.nic_GBps", "node.intra_node_alltoall_GBps_per_gpu", "links")
    doc["approximate"] = [k for k in doc.get("approximate", []) if k not in fitted_keys]
    doc.setdefault("sources", []).append(
        f"all-to-all: links, NICs, ports, latency_us and network.per_message_us fitted by `repro "
        f"calibrate` to real flat all-to-all runs over {chosen} (calibration.{chosen})"
    )
    doc.setdefault("efficiency", {})["note"] = (
        f"links are the fitted {chosen} all-to-all bandwidth per rank"
    )
    return chosen


@click.command("calibrate")
@click.option(
    "--out",
    "out_path",
    type=OutputFile(),
    default="local-platform.json",
    show_default=True,
    help="Where to write the profile (use it as --platform FILE).",
)
@click.option(
    "--ranks", type=int, default=None, help="Ranks ('GPUs') per node (default: CPU cores)."
)
@click.option("--quick", is_flag=True, help="Smaller sizes and fewer repeats (seconds).")
@click.option(
    "--alltoall/--no-alltoall",
    "fit_alltoall",
    default=True,
    show_default=True,
    help="Also fit the all-to-all's latency, per-message cost and bandwidth (real flat "
    "runs over gloo, and MPI where mpi4py and mpiexec are present).",
)
@click.option(
    "--links-from",
    type=click.Choice(["faster", "gloo", "mpi"]),
    default="faster",
    show_default=True,
    help="Which backend's all-to-all fit sets the profile's links.",
)
def command(out_path, ranks, quick, fit_alltoall, links_from) -> None:
    """Measure GEMM, attention and memory-copy ceilings on this machine (one thread = one rank)
    and write a `local` platform profile for `repro plan --model M --nodes N --platform FILE`.

    With --alltoall (default) it also runs flat all-to-all dispatches over 2-8 real local ranks
    (2 and 4 with --quick) and 1 KiB-16 MiB per rank, over the world and, where it has two
    emulated nodes (of 2 ranks) or more, over every node at once, over gloo and over MPI where it
    runs, and fits the simulator's serial model to them per backend: t = n_L x L + n_o x o + B / beta
    (L: latency per phase, o: per-message cost, beta: bytes/s; n_L, n_o, B read off the
    simulator for each run's messages), least squares on relative error, after taking off each
    run's host work (the CPU time its dispatch spends outside its collectives, profiled on the
    run, stretched by the cores' sharing), with one L and one o per ranks count (node-wide runs
    issue fewer messages per phase: they tell o from L); the machine's load average before and
    after is kept with the fit. The profile keeps every fit under "calibration" (values,
    residuals, runs, date); the faster backend's sets links[*].latency_us and GBps, the NICs and
    ports, and network.per_message_us.

    Each fit is judged: residuals above 25% rms print a warning with what to do (an idle
    machine, more repeats, the other backend's links), and a latency or per-message cost fitted
    to zero is explained; the judgment is kept with the fit in the profile."""
    import torch

    from moe_repro.records.atomic import atomic_write_json
    from moe_repro.components.network.platform import from_dict, local_profile
    from moe_repro.records.environment import collect_environment

    cores = os.cpu_count() or 1
    ranks = ranks if ranks is not None else cores
    if ranks <= 0:
        raise BadInput(f"--ranks must be positive, got {ranks}")
    repeats = 3 if quick else 7
    global _STEPS
    grid = ALLTOALL_GRID[quick]
    from moe_repro.runtime.launch import mpi_unavailable
    from moe_repro.suites.alltoall_validation import host_work_taken_off

    backends = 1 + (mpi_unavailable() is None)  # gloo, and MPI where it runs
    _STEPS = _Steps(
        (2 if quick else 3)
        + 2
        + (len(grid["ranks"]) * len(grid["sizes"]) * backends if fit_alltoall else 0)
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gemm = measure_gemm_tflops([256, 512] if quick else [256, 512, 1024], repeats)
        copy, copy_spread = measure_copy_GBps(64 if quick else 256, repeats)
        attn, attn_spread = measure_attention_tflops(512 if quick else 1024, repeats)
    finally:
        torch.set_num_threads(threads)
    peak = max(v["tflops"] for v in gemm.values())
    try:
        mem_total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError):
        mem_total = 8.0
    env = collect_environment(["repro", "calibrate"])
    measured = {
        "gemm_float32_1thread": gemm,
        "copy_GBps": copy,
        "copy_spread_s": copy_spread,
        "attention_tflops": attn,
        "attention_spread_s": attn_spread,
        "cpu_count": cores,
        "memory_total_GB": mem_total,
        "cpu": env.get("cpu_model"),
        "when": env.get("timestamp"),
    }
    doc = local_profile(
        peak,
        attn,
        copy,
        ranks,
        mem_total / ranks,
        f"this machine ({env.get('cpu_model') or 'CPU'}), {ranks} ranks of one thread",
        measured,
    )
    fits, chosen = {}, None
    if fit_alltoall:
        fits = measure_alltoall(quick, repeats=3 if quick else 5)
        load = os.getloadavg() if hasattr(os, "getloadavg") else None
        for backend, fit in fits.items():
            if "runs" in fit:  # kept with the fit in the profile, and printed below
                fit["judgment"] = judge_fit(backend, fit, load)
        chosen = write_alltoall_calibration(doc, fits, links_from, env.get("timestamp"))
    from_dict(doc)  # validate before writing
    atomic_write_json(out_path, doc, make_parents=False)
    click.echo(
        f"GEMM ceiling (1 thread, fp32): {peak * 1e3:.1f} GFLOPS  "
        + " ".join(f"n={n}: {v['tflops'] * 1e3:.1f}" for n, v in gemm.items())
    )
    click.echo(f"attention (sdpa, causal): {attn * 1e3:.1f} GFLOPS; memory copy: {copy:.1f} GB/s")
    for backend, fit in fits.items():
        if "runs" not in fit:
            click.echo(f"all-to-all over {backend}: not fitted ({fit['skipped']})")
            continue
        click.echo(
            f"all-to-all over {backend} (flat, {len(fit['runs'])} runs): L {fit['latency_us']:.3g} us, "
            f"o {fit['per_message_us']:.3g} us per message, beta {fit['GBps']:.3g} GB/s per rank; "
            f"fit residuals rms {fit['rms_residual_pct']:.0f}%, worst {fit['max_abs_residual_pct']:.0f}%"
            + ("  <- links" if backend == chosen else "")
        )
        if host_work_taken_off(fit):  # the host work was taken off before the fit
            click.echo(
                "  host work: profiled on each run and taken off; L per ranks count: "
                + ", ".join(
                    f"{n}: {v:.3g} us" for n, v in fit.get("latency_us_by_ranks", {}).items()
                )
                + (
                    "; o per ranks count: "
                    + ", ".join(
                        f"{n}: {v:.3g} us" for n, v in fit["per_message_us_by_ranks"].items()
                    )
                    if fit.get("per_message_us_by_ranks")
                    else ""
                )
            )
        if fit.get("load_average"):
            load = fit["load_average"]
            click.echo(
                f"  load average (1/5/15 min): {load['before']} before the runs, {load['after']} after"
            )
        for line in fit.get("judgment", []):
            click.echo(line, err=line.startswith("warning"))
    click.echo(f"wrote {out_path} (use: repro plan --model MODEL --nodes N --platform {out_path})")
