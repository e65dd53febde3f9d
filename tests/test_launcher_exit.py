"""A good run under an external launcher exits 0 on every rank (issue 17): no abort at exit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


@pytest.mark.skipif(not (BIN / "torchrun").exists(), reason="torchrun not beside this Python")
def test_torchrun_four_ranks_exit_zero(tmp_path):
    out = tmp_path / "r.json"
    r = subprocess.run(
        [
            str(BIN / "torchrun"),
            "--standalone",
            "--nproc_per_node=4",
            str(BIN / "repro"),
            "--results",
            str(tmp_path / "store"),
            "bench",
            "alltoall",
            "--nodes",
            "2",
            "--gpus-per-node",
            "2",
            "--algo",
            "flat,halo",
            "--repeats",
            "2",
            "--quick",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "terminate called" not in r.stderr
    assert [rec["algo"] for rec in json.loads(out.read_text())["records"]] == ["flat", "halo"]


def _run_as_launched_rank(
    args: list[str], monkeypatch, tmp_path, rank: int, **env
) -> tuple[int, str]:
    """``repro bench ...`` in this process as rank ``rank`` of a 4-rank world the environment
    describes (torchrun's variables unless ``env`` gives others); nothing may start a world."""
    import contextlib
    import io

    import moe_repro.suites.runner as runner
    from moe_repro.cli import main

    for name in (
        "WORLD_SIZE",
        "RANK",
        "LOCAL_WORLD_SIZE",
        "TORCHELASTIC_RUN_ID",
        "MOE_REPRO_WORKER",
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "PMIX_SIZE",
    ):
        monkeypatch.delenv(name, raising=False)
    for name, value in (
        {
            "WORLD_SIZE": "4",
            "RANK": str(rank),
            "LOCAL_WORLD_SIZE": "4",
            "TORCHELASTIC_RUN_ID": "test",
        }
        if not env
        else env
    ).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MOE_REPRO_RESULTS", str(tmp_path / "results"))
    monkeypatch.setattr(runner, "measure", lambda *a, **k: pytest.fail("work started"))
    monkeypatch.setattr("moe_repro.cli.SILENT_RANK_GRACE_S", 0.0)  # nothing here stops the rank
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        with pytest.raises(SystemExit) as exited:
            main(["bench", *args])
    return exited.value.code, err.getvalue()


def test_mpi_backend_under_torchrun_is_refused_before_work_saying_what_to_run(
    monkeypatch, tmp_path
):
    code, err = _run_as_launched_rank(
        ["allreduce", "--backend", "mpi"], monkeypatch, tmp_path, rank=0
    )
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--backend mpi needs a world started by mpiexec/mpirun" in err
    assert "Run: mpiexec -n 4 repro" in err and "torchrun" in err
    # the other ranks exit the same way without repeating the line
    code, err = _run_as_launched_rank(
        ["allreduce", "--backend", "mpi"], monkeypatch, tmp_path, rank=3
    )
    assert code == 2 and err == ""


def test_a_grid_world_size_other_than_the_launchers_is_refused(monkeypatch, tmp_path):
    code, err = _run_as_launched_rank(["allreduce", "--ranks", "2"], monkeypatch, tmp_path, rank=0)
    assert code == 2 and "torchrun started 4 ranks, but the grid asks for 2" in err
    code, err = _run_as_launched_rank(
        ["alltoall", "--nodes", "4", "--gpus-per-node", "2"], monkeypatch, tmp_path, rank=0
    )
    assert code == 2 and "the grid asks for 8" in err


def test_mpi_backend_under_mpiexec_passes_the_check(monkeypatch, tmp_path):
    from moe_repro.runtime.launch import check_launched_world

    for name in ("WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE", "MOE_REPRO_WORKER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PMI_SIZE", "4")
    monkeypatch.setenv("PMI_RANK", "0")
    check_launched_world({"mpi"}, {4})  # no error: an MPI world of the asked size
    with pytest.raises(ValueError, match="mpiexec/mpirun started 4 ranks, but the grid asks for 2"):
        check_launched_world({"mpi"}, {2})


@pytest.mark.skipif(not (BIN / "torchrun").exists(), reason="torchrun not beside this Python")
def test_torchrun_with_the_mpi_backend_exits_2_on_every_rank(tmp_path):
    r = subprocess.run(
        [
            str(BIN / "torchrun"),
            "--standalone",
            "--nproc_per_node=2",
            str(BIN / "repro"),
            "--results",
            str(tmp_path / "store"),
            "bench",
            "allreduce",
            "--backend",
            "mpi",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode != 0
    assert r.stderr.count("--backend mpi needs a world started by mpiexec/mpirun") == 1, r.stderr[
        -3000:
    ]
    assert "exitcode  : 2" in r.stderr and not (tmp_path / "store").exists()


# A silent rank whose grace never runs out (only the launcher's signal can end it), and which
# marks the moment it starts waiting: the test signals it then, not after a guessed start-up time.
_SILENT_RANK = """
import sys, time
import moe_repro.cli as cli
cli.SILENT_RANK_GRACE_S = 3600.0
real_sleep = time.sleep
def sleep(seconds):
    if seconds == cli.SILENT_RANK_GRACE_S:
        open({mark!r}, "w").close()
    real_sleep(seconds)
time.sleep = sleep
cli.main()
"""


@pytest.mark.timing
def test_a_silent_rank_waits_for_the_launcher_and_leaves_quietly_with_the_code(tmp_path):
    """The race CI once lost: rank 1 exited first and torchrun killed rank 0 before it printed
    why. A silent rank now stays until the launcher's SIGTERM, then exits 2 with nothing said."""
    import os
    import signal
    import time

    from conftest import patient

    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MOE_REPRO_WORKER", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE")
    }
    env.update(
        WORLD_SIZE="2",
        RANK="1",
        LOCAL_WORLD_SIZE="2",
        TORCHELASTIC_RUN_ID="t",
        MOE_REPRO_RESULTS=str(tmp_path / "store"),
    )
    mark = tmp_path / "waiting"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _SILENT_RANK.format(mark=str(mark)),
            "bench",
            "allreduce",
            "--backend",
            "mpi",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + patient(10)  # a hang guard: start-up, then the wait begins
    while not mark.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    still_waiting = mark.exists() and proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(
            timeout=patient(6)
        )  # the grace is an hour: only the signal ends it
    finally:
        proc.kill()
    assert still_waiting, "the silent rank exited (or never waited) before the launcher stopped it"
    assert proc.returncode == 2 and err == "" and out == ""


_LAUNCHED_RANK = """
import atexit, os, sys
import torch.distributed as dist
from moe_repro.cli import _joined_launched_world, main
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
atexit.register(lambda: open({mark!r}, "w").write("ran"))
print("joined", _joined_launched_world(), flush=True)
main(["list"])
"""


@pytest.mark.parametrize("launched", [True, False])
def test_a_launched_rank_leaves_through_its_atexit_handlers_and_os_exit(tmp_path, launched):
    """A rank of a launched world that joined it ends by flushing, running the atexit handlers (the
    process group's teardown lives there) and os._exit, never through the interpreter's shutdown;
    a process with a process group but no launcher exits as usual. Both exit 0 with their output
    and their atexit handler run."""
    import os
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mark = tmp_path / "atexit-ran"
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "RANK",
            "OMPI_COMM_WORLD_RANK",
            "PMI_RANK",
            "PMIX_RANK",
            "SLURM_PROCID",
            "WORLD_SIZE",
            "OMPI_COMM_WORLD_SIZE",
            "PMI_SIZE",
            "PMIX_SIZE",
            "SLURM_NTASKS",
            "MOE_REPRO_WORKER",
        )
    }
    if launched:
        env.update(
            RANK="0", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2"
        )  # what a launcher sets; the group here is 1 rank
    r = subprocess.run(
        [sys.executable, "-c", _LAUNCHED_RANK.format(port=port, mark=str(mark))],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines()[0] == f"joined {launched}"
    assert "alltoall" in r.stdout  # repro list's output was flushed before os._exit
    assert mark.read_text() == "ran"
