"""The ``repro`` command line: one module per subcommand (asv style), discovered by name.

A module ``moe_repro/cli/<name>_cmd.py`` that defines ``command`` (a click command or group)
becomes ``repro <command.name>``. Every such module is imported at start-up, so it imports only
click and the CLI's own helpers at module level and everything heavier inside its command;
`repro --help` and `repro list` then start without torch (tests/test_cli.py checks this). Errors: bad input exits 2 with one line, a failure while
running exits 1 with one line; set MOE_REPRO_DEBUG=1 for the traceback.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
import traceback

import click

from moe_repro import __version__
from moe_repro.cli.errors import ResultsDir
from moe_repro.runtime import signals

_EPILOG = """\b
Examples:
  repro list                            what can be run
  repro run piper-table4                one paper table: paper vs ours, in the terminal
  repro run piper-table4 --json t.json --out piper-report
                                        ... plus its JSON and an HTML report in piper-report/
  repro bench gemm --param n=512,1024   the device's GEMM ceiling
  repro bench allreduce --quick         2- and 4-rank all-reduce, gloo and MPI, for real
  repro site build --out site/_build    the static results site

Results are stored under ./results (or --results DIR, or $MOE_REPRO_RESULTS).
Exit codes: 0 ran (deviations are results), 1 failure while running, 2 bad input.
"""


# Commands that read no stored results. They skip loading the results store, whose record
# schema (pydantic) is most of the start-up time of `repro list` otherwise.
_WITHOUT_STORE = {"list"}

# Commands that join no world of ranks. Under torchrun, mpiexec or srun every rank runs the
# command line; rank 0 runs these once and the other ranks end at once, so that a --json, --out
# or stored result is written once (not once per rank) and calibrate measures an otherwise idle
# machine.
RANK_ZERO_ONLY = {"calibrate", "compare", "export", "gate", "list", "plan", "site", "validate"}


class _ReproGroup(click.Group):
    """``repro``: an option of its own typed after the subcommand (``repro bench gemm --results
    x``) is answered, before any work, with where it goes instead of "No such option"."""

    def resolve_command(self, ctx, args):
        name, command, rest = super().resolve_command(ctx, args)
        if command is not None:
            _refuse_late_global_option(ctx, self, command, name, rest)
        return name, command, rest


def _refuse_late_global_option(ctx, group, command, name, rest) -> None:
    own = {opt for p in getattr(command, "params", ()) for opt in (*p.opts, *p.secondary_opts)}
    help_names = set(ctx.help_option_names)
    words = []  # the subcommand's leading words: "bench gemm", "site build"
    for word in rest:
        if word.startswith("-"):
            break
        words.append(word)
    where = " ".join([name, *words])
    for i, word in enumerate(rest):
        if word == "--":
            return
        flag, eq, value = word.partition("=")
        if not flag.startswith("--") or flag in own or flag in help_names:
            continue
        for param in group.params:
            if isinstance(param, click.Option) and flag in param.opts:
                if param.is_eager:  # --version: answered on its own
                    usage = f"repro {flag}"
                elif param.is_flag:
                    usage = f"repro {flag} {where} ..."
                else:
                    value = (
                        value
                        if eq
                        else rest[i + 1]
                        if i + 1 < len(rest)
                        else param.metavar or "VALUE"
                    )
                    usage = f"repro {flag} {value} {where} ..."
                raise click.UsageError(
                    f"{flag} is an option of repro itself, not of {name}: it "
                    f"goes before the subcommand: {usage}",
                    ctx,
                )


@click.group(
    cls=_ReproGroup,
    epilog=_EPILOG,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="repro")
@click.option(
    "--results",
    "results_dir",
    type=ResultsDir(),
    default=None,
    metavar="DIR",
    envvar="MOE_REPRO_RESULTS",
    help="Results store directory (default ./results; MOE_REPRO_RESULTS set but empty "
    "counts as unset). Goes before the subcommand: repro --results DIR bench ...",
)
@click.pass_context
def cli(ctx: click.Context, results_dir: str | None) -> None:
    """moe-repro: check MoE training-systems papers, benchmark their components, gate regressions."""
    from moe_repro.runtime.launch import launched_rank

    rank_zero = launched_rank() in (None, 0)  # not launched, or rank 0 of a launched world
    if ctx.invoked_subcommand in RANK_ZERO_ONLY and not rank_zero:
        ctx.exit(0)
    if ctx.invoked_subcommand in _WITHOUT_STORE:
        return
    from moe_repro.records.store import ResultsStore

    ctx.obj = ResultsStore(results_dir, saves=rank_zero)  # a run is stored once, by rank 0


def _register() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name.endswith("_cmd"):
            module = importlib.import_module(f"{__name__}.{info.name}")
            cli.add_command(module.command)


_register()


# The command line as the user typed it, set by the console entry point (None when the CLI is
# driven some other way, e.g. from tests): results record it as "the command that ran".
INVOCATION: list[str] | None = None


def _speaks() -> bool:
    """Not a non-zero rank of a launched world (read from the launcher's variables only)."""
    if os.environ.get("MOE_REPRO_WORKER"):
        return True
    for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value) == 0
    return True


# How long a silent rank waits before exiting on bad input. torchrun and mpiexec stop every rank
# as soon as the first one exits; a silent rank that won the race would get rank 0 killed before
# it printed why (so the user would see exit code 2 and no reason).
SILENT_RANK_GRACE_S = 5.0


def _let_rank_zero_speak(code: int) -> None:
    """Wait (at most SILENT_RANK_GRACE_S) for the launcher to stop this rank after rank 0 has
    printed the reason and exited; the launcher's SIGTERM then ends this rank with the same code,
    quietly."""
    import signal
    import threading
    import time

    if threading.current_thread() is not threading.main_thread():
        return

    def leave(signum, frame):
        raise SystemExit(code)

    previous = {sig: signal.signal(sig, leave) for sig in signals.ENDING}
    try:
        time.sleep(SILENT_RANK_GRACE_S)
    finally:
        signals.restore(previous)


def _joined_launched_world() -> bool:
    """This process is a rank of a world an external launcher started (torchrun, mpiexec, srun;
    not one of our own supervised workers) and has joined it (torch.distributed or MPI is up)."""
    from moe_repro.runtime.launch import launched_rank

    if launched_rank() is None:  # not launched, or one of our own supervised workers
        return False
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return True
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized()


def _exit_launched_rank(code) -> None:
    """End a launched rank without the interpreter's own shutdown: flush, run the atexit
    handlers (the process group's teardown), finalize MPI, then os._exit. The interpreter's
    shutdown could still run the communication library's C++ destructors with its threads alive
    and abort a good run's rank (SIGABRT, "terminate called without an active exception": seen
    once in two full test runs under load after the teardown moved to atexit), and the launcher
    then reports the whole job failed."""
    import atexit

    code = 0 if code is None else code if isinstance(code, int) else 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    atexit._run_exitfuncs()
    mpi = sys.modules.get("mpi4py.MPI")  # mpi4py finalizes at the C level, which os._exit skips
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    os._exit(code)


def main(argv: list[str] | None = None) -> None:
    try:
        _main(argv)
    except SystemExit as e:
        if _joined_launched_world():
            _exit_launched_rank(e.code)
        raise


def _main(argv: list[str] | None = None) -> None:
    global INVOCATION
    INVOCATION = ["repro", *(sys.argv[1:] if argv is None else argv)]
    # SIGTERM/SIGHUP end a command as Ctrl-C does: finished results kept, exit 128 + signal
    previous_handlers = signals.install()
    try:
        code = cli.main(args=argv, prog_name="repro", standalone_mode=False)
    except signals.Interrupted as e:
        click.echo(f"repro: interrupted by {e.signal_name} (finished results were kept)", err=True)
        sys.exit(e.code)
    except click.exceptions.Abort:
        click.echo("repro: aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        # One line, whatever the kind of input error (click's own usage errors included); under
        # torchrun/mpiexec/srun every rank exits with the code, rank 0 alone says why.
        if _speaks():
            click.echo(f"repro: error: {e.format_message()}", err=True)
        else:
            _let_rank_zero_speak(e.exit_code)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("repro: interrupted (finished results were kept)", err=True)
        sys.exit(130)
    except Exception as e:  # a failure while running: one line, traceback on request
        interrupted_by = signals.received()
        if interrupted_by is not None:  # a library turned the interrupt into its own error
            click.echo(
                f"repro: interrupted by {signals.name_of(interrupted_by)} (finished results were kept)",
                err=True,
            )
            sys.exit(128 + interrupted_by)
        if os.environ.get("MOE_REPRO_DEBUG"):
            traceback.print_exc()
        click.echo(
            f"repro: failed: {type(e).__name__}: {e} (MOE_REPRO_DEBUG=1 for the traceback)",
            err=True,
        )
        sys.exit(1)
    finally:
        signals.restore(previous_handlers)
    sys.exit(code if isinstance(code, int) else 0)
