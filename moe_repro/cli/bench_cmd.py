"""``repro bench``: run a benchmark suite's parameter grid for real and store the records."""

from __future__ import annotations

import signal
import threading

import click

from moe_repro.cli.finite import FiniteFloatRange
from moe_repro.cli.errors import BadInput, OutputFile, RunFailure


def options_as_params(args: list[str]) -> list[str]:
    """Turn leftover ``--key value`` / ``--key=value`` words into ``key=value`` parameter pairs;
    a bare ``--key`` (no value follows) is ``key=1``."""
    pairs, i = [], 0
    while i < len(args):
        word = args[i]
        if not word.startswith("--") or len(word) == 2:
            raise BadInput(
                f"unexpected argument {word!r}; suite parameters are given as --name value"
            )
        key, eq, value = word[2:].partition("=")
        if not eq:
            if i + 1 >= len(args) or args[i + 1].startswith("--"):
                value = "1"  # a bare --flag sets a 0/1 parameter (e.g. --backward)
            else:
                value, i = args[i + 1], i + 1
        pairs.append(f"{key.replace('-', '_')}={value}")
        i += 1
    return pairs


class _BenchCommand(click.Command):
    """``repro bench``, whose help ends with this machine's local-rank limit and its reason
    (computed when the help is shown: cores, available memory and the open-file limit)."""

    def format_epilog(self, ctx, formatter) -> None:
        from moe_repro.runtime.launch import local_rank_limit

        limit, why = local_rank_limit()
        formatter.write_paragraph()
        formatter.write_text(
            f"Local ranks on this machine: at most {limit} ({why}; 8 per core, "
            f"256 MiB per rank, 4 open files per peer, whichever is least). A larger "
            f"real world is refused before any rank starts, except where the suite "
            f"simulates it (alltoall); launch it with torchrun, mpiexec or srun."
        )


@click.command(
    "bench",
    cls=_BenchCommand,
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
)
@click.argument("suite_name", metavar="SUITE")
@click.option(
    "--param",
    "params",
    multiple=True,
    metavar="K=V[,V...]",
    help="Set a grid axis (repeatable), e.g. --param n=512,1024 --param ranks=2.",
)
@click.option("--quick", is_flag=True, help="The suite's small grid (what CI runs).")
@click.option(
    "--show-params",
    is_flag=True,
    help="Print the suite's parameters (default grid, quick grid, meaning) and exit.",
)
@click.option(
    "--repeats",
    type=click.IntRange(1),
    default=5,
    show_default=True,
    help="Timed samples per grid point (median and spread are over these).",
)
@click.option(
    "--warmup",
    type=click.IntRange(0),
    default=1,
    show_default=True,
    help="Untimed calls before the samples.",
)
@click.option(
    "--min-sample-s",
    type=FiniteFloatRange(0),
    default=0.01,
    help="Each sample repeats the call until it lasts this long (timer resolution). "
    "[default: 0.01, or the suite's own where --show-params names one]",
)
@click.option(
    "--check/--no-check",
    default=True,
    show_default=True,
    help="Run the suite's correctness check (#wrong) before timing.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=FiniteFloatRange(1),
    default=300.0,
    show_default=True,
    help="Multi-process suites: kill the world and fail if it runs longer (s); under "
    "torchrun/mpiexec/srun each rank ends itself (exit 1) and the launcher the world.",
)
@click.option(
    "--json",
    "json_path",
    type=OutputFile(),
    default=None,
    help="Write {suite, records, environment} to this file.",
)
@click.option(
    "--device",
    default=None,
    metavar="auto|cpu|cuda[:N][,...]",
    help="Where every suite runs (default: the suite's own, else auto). In a world of "
    "ranks the backend decides: nccl ranks on cuda:LOCAL_RANK, gloo/mpi on cpu.",
)
@click.pass_context
def command(
    ctx,
    suite_name,
    params,
    quick,
    show_params,
    repeats,
    warmup,
    min_sample_s,
    check,
    timeout_s,
    json_path,
    device,
) -> None:
    """Run benchmark SUITE over its parameter grid and print median and spread per metric.

    Any suite parameter can also be given as its own option: `--nodes 2 --algo flat,halo` is
    `--param nodes=2 --param algo=flat,halo` (dashes in option names become underscores).

    `repro list` names the suites; `repro bench SUITE --show-params` lists a suite's parameters.

    A world this machine cannot hold is simulated where the suite can simulate (alltoall), and
    refused before any rank starts where it cannot (the limit is at the end): `repro bench alltoall --nodes
    16` (more than 16 local ranks, no launcher) predicts it on dgx-h100 -- 8 H100 GPUs and 8
    400 Gb/s NICs per node on a rail-optimised fabric, the cluster most MoE training runs on --
    and says so in its first line; `--platform frontier|h200|FILE.json` picks another profile.
    Under torchrun/mpirun/srun the launched world is measured, its nodes and ranks per node the
    defaults.
    Integer parameters take sizes and doubling ranges: --sizes 1K:64M.

    Every record holds its parameters and metrics as flat keys (median, plus _iqr, _min, _max),
    the raw samples, and, where the suite checks its output, `wrong` and `correct`. Results are
    stored in the results store even when interrupted (the records that finished are kept, marked
    `interrupted: true`): by Ctrl-C, SIGTERM or SIGHUP alike (exit 130, 143, 129).

    Every parameter is checked against the suite's declaration (--show-params prints each one's
    range) before any rank starts; a bad value is one line, exit 2. A rank whose heartbeat stops
    for longer than max(15 s, 10 x the slowest heartbeat gap so far) while the others beat is
    reported as hung at once, without waiting for --timeout. Under torchrun/mpiexec/srun each rank
    watches itself the same way (its deadline, and the heartbeats of the ranks on its node): a
    rank that ends the world says why in one line, rank 0 stores the points that finished first,
    and a rank interrupted alone says what rank 0 kept.
    """

    if (
        not show_params
    ):  # where results go is checked first: a run must never end unable to keep them
        problem = ctx.obj.write_problem()
        if problem:
            raise BadInput(f"cannot store results in {ctx.obj.root}: {problem}")

    from moe_repro.records.atomic import atomic_write_json
    from moe_repro.records.record import dump
    from moe_repro.runtime.device import check_backend, check_device, check_world_device
    from moe_repro.runtime.launch import (
        RankFailure,
        launched_local_size,
        launched_rank,
        launched_world_size,
    )
    from moe_repro.runtime.signals import Interrupted, deferred, name_of
    from moe_repro.runtime.worker import watch_launched_world
    from moe_repro.reports.terminal import format_records
    from moe_repro import catalog
    from moe_repro.suites import get_suite
    from moe_repro.suites.runner import RunConfig, measure, suite_record

    store = ctx.obj
    try:
        catalog.suite(suite_name)  # known without importing any suite; close matches if not
    except ValueError as e:
        raise BadInput(str(e)) from None
    suite = get_suite(suite_name)  # imports that suite's module only
    try:  # before --show-params too: it also checks the options given with it
        pairs = list(params) + options_as_params(ctx.args)
        overrides = suite.parse_overrides(pairs)
        if device is not None:  # the one place --device reaches every suite (as a grid axis)
            overrides["device"] = [d.strip() for d in device.split(",")]
            for name in overrides["device"]:
                check_device(name)
        grid = suite.grid(overrides, quick=quick)
        for point in grid:  # a world's ranks run where its backend puts them
            check_world_device(point.get("device", "auto"), str(point.get("backend", "")))
            if not point.get("simulated"):  # and its backend must run here (nccl: a GPU per rank)
                check_backend(
                    str(point.get("backend", "")),
                    launched_local_size()
                    or int(point.get("ranks_per_node") or point.get("ranks") or 1),
                )
    except ValueError as e:
        raise BadInput(str(e)) from None
    if show_params:
        click.echo(f"{suite.name}: {suite.description}")
        for key, default in suite.params.items():
            quick_values = f"  (quick: {suite.quick[key]})" if key in suite.quick else ""
            allowed = f" [{suite.schema[key].describe()}]" if key in suite.schema else ""
            click.echo(
                f"  --{key.replace('_', '-')} {','.join(map(str, default))}{quick_values}{allowed}"
                f"\n      {suite.param_help.get(key, '')}".rstrip()
            )
        click.echo(
            "metrics: "
            + ", ".join(f"{m.name} [{m.unit}, {m.better} is better]" for m in suite.all_metrics)
        )
        if suite.min_sample_s:
            click.echo(
                f"samples last at least {suite.min_sample_s:g} s unless --min-sample-s says otherwise"
            )
        click.echo(
            f"the options given make {len(grid)} grid point{'s' if len(grid) != 1 else ''} (none run)"
        )
        return
    if (
        suite.min_sample_s
        and ctx.get_parameter_source("min_sample_s") is click.core.ParameterSource.DEFAULT
    ):
        min_sample_s = suite.min_sample_s
    config = RunConfig(
        warmup=warmup, repeats=repeats, min_sample_s=min_sample_s, check=check, timeout_s=timeout_s
    )
    records: list[dict] = []

    speaks = launched_rank() in (None, 0)  # under a launcher, one line per job: rank 0's
    estimate = suite.estimated_seconds(grid)  # a long run says so before it starts
    long_run = catalog.long_run_line(
        f"{len(grid)} grid point{'s' if len(grid) != 1 else ''}", *(estimate or (None, ""))
    )
    if long_run and speaks:
        click.echo(long_run, err=True)
    simulated = {
        str(p.get("platform")): p.get("simulated_because", "") for p in grid if p.get("simulated")
    }
    if simulated and speaks:
        # first line of output: the numbers below are predictions, and why
        click.echo(
            "simulated on "
            + "; ".join(f"{name} ({why})" if why else name for name, why in simulated.items())
            + ": every number of those points is a prediction of the suite's simulator, not a measurement"
        )
        for line in simulation_caveats(suite.name, grid):
            click.echo(line)
    for line in dict.fromkeys(
        p["backend_chosen"] for p in grid if p.get("backend_chosen") and speaks
    ):
        click.echo(line)  # what --backend auto picked, and why

    def progress(i: int, n: int, point: dict) -> None:
        # the grid's own axes (derived values such as the rows per rank are in the record)
        shown = " ".join(
            f"{k}={v}" for k, v in point.items() if k in suite.params or k in suite.world_params
        )
        click.echo(f"[{i + 1}/{n}] {suite.name} {shown}", err=True)

    finishing, finished = threading.Lock(), []

    def finish(interrupted: bool = False, error: str | None = None, record=None):
        """Store the run and write --json, once (the main thread or a launched rank's watch,
        whichever comes first); rank 0 alone under a launcher. Returns the stored path."""
        with finishing:
            if finished:
                return finished[0]
            path = None
            record = record or suite_record(suite, records, interrupted=interrupted, error=error)
            if speaks and (records or not (interrupted or error)):
                path = store.save(record)
                click.echo(f"stored: {path}", err=True)
            if json_path and speaks:
                atomic_write_json(json_path, dump(record), make_parents=False)
            finished.append(path)
            return path

    def kept(path) -> str | None:
        return f"{path} ({len(records)} finished point(s))" if path else None

    def on_abort(why: str, interrupted: bool) -> str | None:
        """A launched rank's watch ends the rank (deadline, hung or departed peer): rank 0
        stores the points that finished first, marked with why."""
        if not speaks:
            return None
        path = finish(interrupted=interrupted, error=why)
        return f"stored {kept(path)}" if path else "no point had finished: nothing stored"

    # under torchrun/mpiexec/srun no supervisor of ours watches the ranks: each watches itself
    watch = watch_launched_world(timeout_s, on_abort)

    def run() -> None:
        try:
            measure(suite, grid, config, progress=progress, done=records.append)
        except Exception:
            if watch is not None:
                watch.hold_if_aborting()  # the watch reports the cause and ends this rank
            raise

    try:
        run()
    except (KeyboardInterrupt, Interrupted) as e:  # Ctrl-C, SIGTERM, SIGHUP: keep what finished
        with deferred():  # a second signal waits until the finished records are stored
            path = finish(interrupted=True)
            if watch is not None:  # tell the peers and leave now (finalizing would wait on them)
                signum = getattr(e, "signum", signal.SIGINT)
                watch.leave(f"interrupted by {name_of(signum)}", 128 + signum, kept(path))
        raise
    except RankFailure as e:
        finish(error=str(e))
        raise RunFailure(str(e)) from None
    except ValueError as e:  # a grid point the suite rejects (e.g. bytes not a multiple of 4)
        finish(error=str(e))
        raise BadInput(str(e)) from None
    if watch is not None:
        watch.finish()
    if launched_world_size() and not (speaks and records):
        return  # under an external launcher only rank 0 reports and stores
    with deferred():  # every point finished: a signal now waits until the record is stored
        record = suite_record(suite, records)
        click.echo(format_records(record))
        for line in record.summary:  # the suite's own summary (Suite.summary), stored with it
            click.echo(line)
        finish(record=record)
    wrong = [r for r in records if r.get("correct") is False]
    if wrong:
        raise RunFailure(f"{len(wrong)} record(s) failed the correctness check (#wrong > 0)")


def simulation_caveats(suite_name: str, grid: list[dict]) -> list[str]:
    """What a simulated answer rests on, said right under the "simulated" line: the values of
    each simulated platform's profile that the simulation reads but no measurement set (the
    profile's ``approximate``), and for the all-to-all how the simulator held against published
    measurements (`repro validate`) and at what message sizes, beside this run's."""
    from moe_repro.components.network.platform import load_platform, unmeasured_network_values

    out = []
    for name in dict.fromkeys(
        str(p["platform"]) for p in grid if p.get("simulated") and p.get("platform")
    ):
        try:
            values = unmeasured_network_values(load_platform(name))
        except (OSError, ValueError):  # the suite already refused a profile it cannot read
            continue
        if values:
            out.append(
                f"  {name}: values no measurement set (the profile's approximate): {', '.join(values)}"
            )
    if suite_name == "alltoall" and any(p.get("simulated") for p in grid):
        from moe_repro.reproductions.validation import track_record

        t = track_record("alltoall-bandwidth")
        lo, hi = t["bytes_per_peer"]
        mine = sorted({int(p["size"]) // int(p["ranks"]) for p in grid if p.get("simulated")})
        out.append(
            f"  how far to trust it: the simulator's all-to-all bandwidth, scored against {t['points']} "
            f"published runs ({', '.join(t['platforms'])}, {_bytes(lo)}-{_bytes(hi)} per peer), came out "
            f"{t['min_error']:+.0%} to {t['max_error']:+.0%} (MAPE {t['mape']:.1%}; repro validate); "
            f"this run sends {', '.join(_bytes(b) for b in mine)} per peer"
            + (", smaller than any scored run's" if mine and mine[-1] < lo else "")
        )
    return out


def _bytes(n: float) -> str:
    for unit, size in (("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"
