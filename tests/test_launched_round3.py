"""Worlds an external launcher starts (torchrun, mpiexec): a rank stopped or interrupted ends the
world within its --timeout, rank 0 keeps what finished, and a run is stored once.

The multi-process tests launch real 2-rank worlds of ``repro`` through the console script's
entry point (moe_repro.entry:main) and signal rank 1 only, as a user with ``kill`` would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
import torch
from click.testing import CliRunner

BIN = Path(sys.executable).parent
HAS_GPU = torch.cuda.is_available()
needs_mpiexec = pytest.mark.skipif(
    not (BIN / "mpiexec").exists(), reason="no mpiexec beside this Python"
)
needs_torchrun = pytest.mark.skipif(
    not (BIN / "torchrun").exists(), reason="torchrun not beside this Python"
)
LIMIT_S = 60.0  # a world that has not ended by then hangs (the tests' own bound, not a timing)


def _entry(tmp_path: Path) -> str:
    """A script that runs ``repro`` (the console script's entry point) with the arguments."""
    script = tmp_path / "repro_entry.py"
    script.write_text(
        "import sys\nfrom moe_repro.entry import main\nsys.argv[0] = 'repro'\nmain()\n"
    )
    return str(script)


def _rank_pid(launcher: int, rank: int) -> int | None:
    """The pid of rank ``rank`` of the world ``launcher`` started: its descendant that runs the
    entry script with the launcher's rank variable saying ``rank``."""
    parents = {}
    for entry in Path("/proc").iterdir():
        try:
            parents[int(entry.name)] = int(
                (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
            )
        except (OSError, ValueError, IndexError):
            continue
    for pid in parents:
        up = pid
        while up in parents and up != launcher:
            up = parents[up]
        if up != launcher:
            continue
        try:
            env = dict(
                v.split("=", 1)
                for v in Path(f"/proc/{pid}/environ")
                .read_bytes()
                .decode(errors="replace")
                .split("\0")
                if "=" in v
            )
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if env.get("PMI_RANK", env.get("RANK")) == str(rank) and "repro_entry.py" in cmdline:
            return pid
    return None


def _launch(
    cmd: list[str], tmp_path: Path, signum: int | None = None, when: str = "[2/2]"
) -> tuple[int, str]:
    """Run a launched world; once ``when`` appears on its stderr send ``signum`` to rank 1.
    Returns (exit code, stderr); fails if the world has not ended LIMIT_S after it started."""
    err_path = tmp_path / "world.err"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True, cwd=tmp_path
        )
    started, signalled, stopped = time.monotonic(), signum is None, None
    try:
        while proc.poll() is None:
            if time.monotonic() - started > LIMIT_S:
                pytest.fail(
                    f"the world still ran {LIMIT_S:g} s after it started "
                    f"(signal {signum} sent: {signalled}): {err_path.read_text()[-2000:]}"
                )
            if not signalled and when in err_path.read_text(errors="replace"):
                pid = _rank_pid(proc.pid, 1)
                if pid is not None:
                    os.kill(pid, signum)
                    signalled, stopped = True, pid if signum == signal.SIGSTOP else None
            time.sleep(0.1)
        assert signalled, "the run ended before rank 1 could be signalled"
        return proc.returncode, err_path.read_text(errors="replace")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if stopped is not None:
            try:
                os.kill(stopped, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()


def _stored(store: Path) -> list[Path]:
    return sorted(store.rglob("*.json")) if store.exists() else []


def _bench(tmp_path: Path, *args: str) -> list[str]:
    return [
        _entry(tmp_path),
        "--results",
        str(tmp_path / "store"),
        "bench",
        "allreduce",
        "--ranks",
        "2",
        *args,
    ]


# --- the watch, with injected clocks ---------------------------------------------------------------


def test_the_watch_ends_a_rank_past_its_timeout():
    from moe_repro.runtime.worker import LaunchedWatch

    now = [100.0]
    watch = LaunchedWatch(0, 2, 40.0, None, clock=lambda: now[0])
    now[0] = 139.0
    assert watch.reason() is None
    now[0] = 141.0
    why, interrupted = watch.reason()
    assert "did not finish within 40 s (--timeout)" in why and not interrupted


def _beat(directory: Path, rank: int, t: float) -> None:
    (directory / f"rank-{rank}.beat").write_text(
        json.dumps({"t": t, "where": "x.py:1 in f", "pid": 1})
    )


def test_the_watch_names_a_peer_whose_heartbeat_stopped(tmp_path):
    from moe_repro.runtime import launch
    from moe_repro.runtime.worker import LaunchedWatch

    wall = [1000.0]
    watch = LaunchedWatch(0, 2, 1e6, tmp_path, clock=lambda: 0.0, wall=lambda: wall[0])
    _beat(tmp_path, 0, 1000.0)
    _beat(tmp_path, 1, 1000.0)
    assert watch.reason() is None

    def beat_alone(seconds: float):  # rank 0 beats every half second, rank 1 is silent
        found = None
        for _ in range(int(seconds * 2)):
            wall[0] += 0.5
            _beat(tmp_path, 0, wall[0])
            found = watch.reason()
        return found

    assert beat_alone(launch.HANG_FLOOR_S - 1) is None  # silent, not yet past the floor
    why, _ = beat_alone(2)
    assert why.startswith("rank(s) 1 stopped making progress") and "rank 1 silent for 16 s" in why
    (tmp_path / "rank-1.json").write_text("{}")  # a rank that finished is not watched
    wall[0] += 1
    assert watch.reason() is None


def test_the_watch_sees_a_peer_that_left(tmp_path):
    from moe_repro.runtime.worker import LaunchedWatch

    watch = LaunchedWatch(0, 2, 1e6, tmp_path, clock=lambda: 0.0, wall=lambda: 0.0)
    (tmp_path / "rank-1.left").write_text("interrupted by SIGTERM")
    why, interrupted = watch.reason()
    assert why == "rank 1 left the world (interrupted by SIGTERM)" and interrupted


def test_a_peer_whose_watch_ended_it_gives_this_rank_the_same_cause(tmp_path):
    """Rank 1 reaches its deadline a moment before rank 0 and exits; rank 0's collective then
    breaks (connection reset) before its own deadline: rank 0 reports the deadline, not the
    broken connection."""
    from moe_repro.runtime.worker import LaunchedWatch

    now = [100.0]
    ranks = [
        LaunchedWatch(r, 2, 8.0, tmp_path, clock=lambda: now[0], wall=lambda: now[0])
        for r in (0, 1)
    ]
    now[0] = 108.5
    ranks[1].deadline, ranks[0].deadline = 108.0, 109.0  # rank 1 started half a second sooner
    assert ranks[0].reason() is None
    why, _ = ranks[1].reason()
    ranks[1]._mark("ended", why)  # what abort writes first, before this rank exits
    assert ranks[0].reason() == ("the run did not finish within 8 s (--timeout)", False)


def test_an_error_in_the_main_thread_ends_the_rank_with_the_watchs_cause(
    tmp_path, monkeypatch, capsys
):
    from moe_repro.runtime import worker

    def exit_(code):
        raise SystemExit(code)

    monkeypatch.setattr(worker.os, "_exit", exit_)
    watch = worker.LaunchedWatch(1, 2, 1e6, tmp_path, clock=lambda: 0.0, wall=lambda: 0.0)
    watch.hold_if_aborting()  # no cause: the caller reports its error as it is
    (tmp_path / "rank-0.ended").write_text("the run did not finish within 8 s (--timeout)")
    with pytest.raises(SystemExit) as ended:
        watch.hold_if_aborting()
    assert ended.value.code == 1
    said = capsys.readouterr().err.strip().splitlines()
    assert said == [
        "repro: rank 1 of 2: the run did not finish within 8 s (--timeout); "
        "ending this rank so that the launcher ends the world"
    ]


# --- a backend that cannot run here ---------------------------------------------------------------


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU")
@pytest.mark.parametrize("suite", ["alltoall", "pp-ep-train"])
def test_nccl_without_a_gpu_is_refused_before_any_rank_starts(suite, tmp_path, monkeypatch, capsys):
    import moe_repro.suites.runner as runner
    from moe_repro.cli import main

    monkeypatch.setattr(runner, "measure", lambda *a, **k: pytest.fail("work started"))
    with pytest.raises(SystemExit) as exited:
        main(["--results", str(tmp_path / "store"), "bench", suite, "--backend", "nccl", "--quick"])
    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    assert err.count("\n") == 1 and err.startswith(
        "repro: error: backend nccl: this machine has no CUDA GPU"
    ), err


def test_nccl_with_fewer_gpus_than_ranks_per_node_is_refused(monkeypatch):
    from moe_repro.runtime import device

    monkeypatch.setattr(device, "cuda_count", lambda: 1)
    device.check_backend("nccl", 1)
    device.check_backend("gloo", 8)
    with pytest.raises(ValueError, match="2 ranks per node but this machine has 1 GPU"):
        device.check_backend("nccl", 2)


# --- real launched worlds -------------------------------------------------------------------------


def _world(launcher: str) -> list[str]:
    if launcher == "mpiexec":
        return [str(BIN / "mpiexec"), "-n", "2", sys.executable]
    return [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2"]


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize(
    "launcher,backend",
    [
        pytest.param("mpiexec", "mpi", marks=needs_mpiexec),
        pytest.param("torchrun", "gloo", marks=needs_torchrun),
    ],
)
def test_a_stopped_rank_ends_the_world_and_rank_0_keeps_what_finished(launcher, backend, tmp_path):
    """kill -STOP of one rank: its peer sees the heartbeat stop, stores the finished point, ends
    the stopped rank (which takes no SIGTERM) and itself; the launcher then ends the world (it
    used to wait forever)."""
    code, err = _launch(
        [
            *_world(launcher),
            *_bench(
                tmp_path,
                "--backend",
                backend,
                "--bytes",
                "8,4194304",
                "--repeats",
                "300",
                "--min-sample-s",
                "0.02",
                "--timeout",
                "200",
            ),
        ],
        tmp_path,
        signal.SIGSTOP,
    )
    assert code != 0, err
    lines = [line for line in err.splitlines() if line.startswith("repro: rank 0 of 2:")]
    assert len(lines) == 1 and "rank(s) 1 stopped making progress" in lines[0], err
    stored = _stored(tmp_path / "store")
    assert len(stored) == 1, err
    record = json.loads(stored[0].read_text())
    assert [r["bytes"] for r in record["records"]] == [8]
    assert "rank(s) 1 stopped making progress" in record["error"]


@pytest.mark.multiprocess
@pytest.mark.slow
@needs_mpiexec
def test_sigterm_to_one_rank_under_mpiexec_ends_the_world_with_the_finished_points_stored(tmp_path):
    code, err = _launch(
        [
            str(BIN / "mpiexec"),
            "-n",
            "2",
            sys.executable,
            *_bench(
                tmp_path,
                "--backend",
                "mpi",
                "--bytes",
                "8,4194304",
                "--repeats",
                "300",
                "--min-sample-s",
                "0.02",
                "--timeout",
                "200",
            ),
        ],
        tmp_path,
        signal.SIGTERM,
    )
    assert code != 0, err
    stored = _stored(tmp_path / "store")
    assert len(stored) == 1, err
    record = json.loads(stored[0].read_text())
    assert record["interrupted"] is True and [r["bytes"] for r in record["records"]] == [8]
    said = [
        line
        for line in err.splitlines()
        if line.startswith("repro: rank 1 of 2: interrupted by SIGTERM")
    ]
    assert len(said) == 1 and f"rank 0 keeps the finished results: stored {stored[0]}" in said[0], (
        err
    )


@pytest.mark.multiprocess
@pytest.mark.slow
@needs_torchrun
def test_a_torchrun_world_ends_at_its_timeout(tmp_path):
    """Every rank ends itself once the run passes --timeout (a million samples take far longer)."""
    code, err = _launch(
        [
            str(BIN / "torchrun"),
            "--standalone",
            "--nproc-per-node",
            "2",
            *_bench(
                tmp_path,
                "--backend",
                "gloo",
                "--bytes",
                "8",
                "--repeats",
                "1000000",
                "--min-sample-s",
                "0.2",
                "--timeout",
                "8",
            ),
        ],
        tmp_path,
    )
    assert code != 0, err
    assert "rank 0 of 2: the run did not finish within 8 s (--timeout)" in err, err
    assert "no point had finished: nothing stored" in err and not _stored(tmp_path / "store")


@pytest.mark.multiprocess
@pytest.mark.slow
@needs_torchrun
def test_torchrun_stores_a_reproduction_once(tmp_path):
    out = tmp_path / "out.json"
    r = subprocess.run(
        [
            str(BIN / "torchrun"),
            "--standalone",
            "--nproc-per-node",
            "2",
            _entry(tmp_path),
            "--results",
            str(tmp_path / "store"),
            "run",
            "piper-table4",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert len(_stored(tmp_path / "store")) == 1, r.stdout
    assert r.stdout.count("stored: ") == 1 and r.stdout.count("(ran ") == 1, r.stdout
    assert json.loads(out.read_text())["id"] == "piper-table4"


# --- srun (no Slurm here: its variables, faked) ---------------------------------------------------


def _as_srun_rank(monkeypatch, rank: int, step: str = "0") -> None:
    for name in (
        "WORLD_SIZE",
        "RANK",
        "LOCAL_WORLD_SIZE",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_RESTART_COUNT",
        "MOE_REPRO_WORKER",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_RANK",
        "PMI_SIZE",
        "PMI_RANK",
        "PMIX_SIZE",
        "PMIX_RANK",
        "PMIX_NAMESPACE",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "MPI_LOCALNRANKS",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "2(x2)")
    monkeypatch.setenv("SLURM_PROCID", str(rank))
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_STEP_ID", step)


def _record():
    from moe_repro.records.environment import collect_environment
    from moe_repro.records.record import SuiteRecord

    return SuiteRecord(
        suite="allreduce",
        description="d",
        params=[],
        metrics=[],
        records=[],
        environment=collect_environment(),
    )


def test_under_srun_only_rank_0_stores(monkeypatch, tmp_path):
    """The store the CLI gives a launched rank other than 0 saves nothing; rank 0's saves."""
    from moe_repro.cli import cli

    seen = {}

    @cli.command("probe-store", hidden=True)
    @click.pass_obj
    def probe(store):
        seen["path"] = store.save(_record())

    try:
        for rank, stored in ((1, False), (0, True)):
            _as_srun_rank(monkeypatch, rank)
            result = CliRunner().invoke(cli, ["--results", str(tmp_path / "store"), "probe-store"])
            assert result.exit_code == 0, result.output
            assert (seen["path"] is not None) is stored
        assert _stored(tmp_path / "store") == [seen["path"]]
    finally:
        cli.commands.pop("probe-store", None)


def test_under_srun_the_ranks_per_node_come_from_slurm(monkeypatch):
    from moe_repro.runtime.launch import launched_local_size

    _as_srun_rank(monkeypatch, 1)
    assert launched_local_size() == 2  # SLURM_NTASKS_PER_NODE "2(x2)": 2 on each of 2 nodes


def test_each_srun_step_has_its_own_world_directory_and_dead_launchers_dirs_go(
    monkeypatch, tmp_path
):
    import tempfile

    from moe_repro.runtime import launch

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid names a launcher that is gone
    stale = tmp_path / f"{launch.LAUNCHED_DIR_PREFIX}{os.getuid()}-{dead.pid}-77-0"
    stale.mkdir()
    (stale / "rank-1.beat").write_text("{}")
    _as_srun_rank(monkeypatch, 0, step="0")
    first = launch.launched_world_dir()
    _as_srun_rank(monkeypatch, 0, step="1")
    second = launch.launched_world_dir()
    assert first.is_dir() and second.is_dir() and first != second
    assert first.parent == tmp_path and f"-{os.getppid()}-77-" in first.name
    assert not stale.exists()


@pytest.mark.parametrize("rank, written", [("0", True), ("1", False)])
def test_a_command_that_joins_no_world_writes_its_json_once_from_rank_0(tmp_path, rank, written):
    """Under a launcher every rank runs the command line; `repro gate --json` (like plan, validate,
    export, site, calibrate, list) writes from rank 0 alone. The launcher's variables are set as
    torchrun sets them."""
    result = tmp_path / "r.json"
    result.write_text(
        json.dumps(
            {
                "id": "piper-table4",
                "title": "t",
                "cells": [
                    {
                        "row": "a",
                        "column": "b",
                        "paper": 1.0,
                        "ours": 1.0,
                        "unit": "GB",
                        "verdict": "match",
                        "how": "A",
                    }
                ],
                "environment": {},
            }
        )
    )
    out = tmp_path / "gate.json"
    env = {
        **os.environ,
        "RANK": rank,
        "WORLD_SIZE": "2",
        "LOCAL_RANK": rank,
        "LOCAL_WORLD_SIZE": "2",
        "TORCHELASTIC_RUN_ID": "test",
    }
    env.pop("MOE_REPRO_WORKER", None)
    proc = subprocess.run(
        [
            sys.executable,
            _entry(tmp_path),
            "gate",
            "--baseline",
            str(result),
            "--current",
            str(result),
            "--json",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert out.exists() is written
    assert (proc.stdout.strip() != "") is written  # rank 1 prints nothing either
