"""Nothing a run creates outlives it, however it ends: its work directories (every registered
prefix: the ranks' folder and the points folder suites/runner.py hands records back through)
and MPICH's shared-memory segments (/dev/shm/mpich_shm_*), which ranks killed before
MPI_Finalize leave behind.

Segments are attributed to a run by the processes that map them (its ranks carry a tag in their
environment), so the tests never count, or expect gone, a segment of another run on this
machine. The unit tests sweep a private folder standing in for /dev/shm.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import patient
from procs import live_processes_with_env
from moe_repro.runtime import workdirs
from moe_repro.runtime.launch import mpi_unavailable, remove_stale_workdirs

needs_mpi = pytest.mark.skipif(bool(mpi_unavailable()), reason=str(mpi_unavailable()))


# --- the registry ----------------------------------------------------------------------------


def test_the_registry_names_the_ranks_and_the_points_prefixes():
    assert "moe-repro-ranks-" in workdirs.PREFIXES
    assert "moe-repro-points-" in workdirs.PREFIXES
    from moe_repro.runtime.launch import LAUNCHED_DIR_PREFIX

    assert LAUNCHED_DIR_PREFIX in workdirs.PREFIXES  # a launched world's node directory


def test_a_dead_owners_points_folder_is_removed_by_the_stale_sweep(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # tempfile re-reads TMPDIR
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    d = tmp_path / "moe-repro-points-abc"
    d.mkdir()
    (d / "owner.pid").write_text(str(dead.pid))
    (d / "000000.json").write_text("{}")
    live = tmp_path / "moe-repro-points-live"
    live.mkdir()
    (live / "owner.pid").write_text(str(os.getppid()))
    assert d in remove_stale_workdirs()
    assert not d.exists() and live.exists()


def test_make_workdir_refuses_an_unregistered_prefix():
    with pytest.raises(ValueError, match="unregistered"):
        workdirs.make_workdir("moe-repro-elsewhere-")


# --- the segment sweep, on a folder standing in for /dev/shm ---------------------------------


def test_only_new_unheld_segments_of_this_user_are_removed(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    old = shm / "mpich_shm_0ld_0"
    old.write_bytes(b"x")
    before = workdirs.shm_snapshot(shm)
    ours = shm / "mpich_shm_aaaa_0"
    vci = shm / "mpich_vci_aaaa_0"
    live = shm / "mpich_shm_bbbb_0"
    other = shm / "mpich_shm_cccc_0"
    unrelated = shm / "torch_1234"
    for f in (ours, vci, live, other, unrelated):
        f.write_bytes(b"x")
    if os.getuid() == 0:
        os.chown(other, 65534, 65534)  # another user's segment
    with open(live, "rb") as held:  # a live run's segment: one of its processes holds it
        holder = subprocess.Popen(["sleep", "60"], stdin=held)
    try:
        removed = workdirs.remove_new_segments(before, shm_dir=shm)
    finally:
        holder.kill()
        holder.wait()
    assert sorted(removed) == sorted([ours, vci])
    assert not ours.exists() and not vci.exists()
    assert old.exists(), "a segment that was there before the launch is not the world's"
    assert live.exists(), "a segment a live process holds is never removed"
    assert unrelated.exists()
    if os.getuid() == 0:
        assert other.exists(), "another user's segment is never removed"


def test_the_sweep_waits_for_the_worlds_processes(tmp_path, fake_clock):
    # A rank of the world (its command line names the work directory) still runs: the sweep
    # waits for it, on the clock it is given, and removes nothing that the rank still holds.
    shm = tmp_path / "shm"
    shm.mkdir()
    world = str(tmp_path / "moe-repro-ranks-x")
    seg = shm / "mpich_shm_dddd_0"
    seg.write_bytes(b"x")
    with open(seg, "rb") as held:
        rank = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)", world], stdin=held
        )
    # The rank counts once its command line names the world: wait for its exec (a busy machine
    # can leave the forked child without it for a while), bounded by a hang guard.
    cmdline = Path(f"/proc/{rank.pid}/cmdline")
    guard = time.monotonic() + patient(10)
    while world not in cmdline.read_bytes().decode(errors="replace"):
        assert time.monotonic() < guard, "the rank never started"
        time.sleep(0.01)
    slept = []

    def sleep(s):
        slept.append(s)
        fake_clock.advance(s)

    try:
        removed = workdirs.remove_new_segments(
            {}, world, shm_dir=shm, wait_s=1.0, clock=fake_clock, sleep=sleep
        )
    finally:
        rank.kill()
        rank.wait()
    assert removed == [] and seg.exists()
    assert slept and abs(sum(slept) - 1.0) < 0.1, "it waited wait_s for the world's rank, no longer"
    assert workdirs.remove_new_segments({}, world, shm_dir=shm) == [seg] and not seg.exists()


def _janitor_input(tmp_path, text: bytes):
    path = tmp_path / "janitor-stdin"
    path.write_bytes(text)
    return open(path, "rb")


def test_the_janitor_cleans_up_after_a_parent_that_died(tmp_path, monkeypatch):
    # End of input without "done": the parent died. Every registered folder it owned goes.
    monkeypatch.setattr(workdirs, "SHM_DIR", tmp_path)  # no segment sweep of the real one here
    owner = os.getppid()
    ranks = tmp_path / "moe-repro-ranks-a"
    points = tmp_path / "moe-repro-points-b"
    someone_elses = tmp_path / "moe-repro-points-c"
    for d, pid in ((ranks, owner), (points, owner), (someone_elses, 1)):
        d.mkdir()
        (d / "owner.pid").write_text(str(pid))
    monkeypatch.setattr(os, "getppid", lambda: owner)
    with _janitor_input(tmp_path, b"null\n") as stream:
        workdirs.janitor(owner, str(ranks), mpi=False, stream=stream)
    assert not ranks.exists() and not points.exists()
    assert someone_elses.exists()


def test_the_janitor_ends_a_rank_that_outlived_its_parent(tmp_path, monkeypatch):
    # A rank forked while its parent was being SIGKILLed misses the parent-death signal and
    # would wait for its peers: the janitor ends every process of the world (WORLD_ENV) once
    # the parent is gone; a process of another world is left alone.
    owner = os.getppid()
    ranks = tmp_path / "moe-repro-ranks-a"
    ranks.mkdir()
    (ranks / "owner.pid").write_text(str(owner))
    code = "import time; time.sleep(60)"
    stray = subprocess.Popen(
        [sys.executable, "-c", code], env=dict(os.environ, **{workdirs.WORLD_ENV: str(ranks)})
    )
    other = subprocess.Popen(
        [sys.executable, "-c", code],
        env=dict(os.environ, **{workdirs.WORLD_ENV: str(ranks) + "-other"}),
    )
    monkeypatch.setattr(os, "getppid", lambda: owner)
    try:
        with _janitor_input(tmp_path, b"null\n") as stream:
            workdirs.janitor(owner, str(ranks), mpi=False, stream=stream)
        assert stray.wait(timeout=patient(5)) == -signal.SIGKILL
        assert other.poll() is None
        assert not ranks.exists()
    finally:
        for p in (stray, other):
            p.kill()
            p.wait()


def test_a_launched_worlds_node_folder_goes_when_its_launcher_has_ended(tmp_path, fake_clock):
    # mpiexec's proxy is the launched ranks' parent and names their node folder; once it has
    # ended (the world was killed), the rank's janitor removes the folder; a live launcher's
    # folder is kept.
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    uid = os.getuid()
    ours = tmp_path / f"moe-repro-world-{uid}-{launcher.pid}-run"
    other = tmp_path / f"moe-repro-world-{uid}-{launcher.pid}0-run"  # another launcher's
    for d in (ours, other):
        d.mkdir()
    try:

        def sleep(s):
            fake_clock.advance(s)

        assert (
            workdirs.remove_launched_dirs(
                launcher.pid, tmp_path, wait_s=1, clock=fake_clock, sleep=sleep
            )
            == []
        )
        assert ours.exists(), "kept while its launcher runs"
    finally:
        launcher.kill()
        launcher.wait()
    assert workdirs.remove_launched_dirs(launcher.pid, tmp_path) == [ours]
    assert not ours.exists() and other.exists()


def test_the_janitor_leaves_a_live_parents_folders_to_it(tmp_path, monkeypatch):
    owner = os.getppid()
    points = tmp_path / "moe-repro-points-b"
    points.mkdir()
    (points / "owner.pid").write_text(str(owner))
    monkeypatch.setattr(os, "getppid", lambda: owner)
    with _janitor_input(tmp_path, b"null\n" + workdirs.DONE) as stream:
        workdirs.janitor(owner, str(tmp_path / "moe-repro-ranks-a"), mpi=False, stream=stream)
    assert points.exists()


# --- real worlds -------------------------------------------------------------------------------


def _segments_mapped_by(pids: list[int]) -> set[str]:
    names = set()
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/maps").read_text(errors="replace").splitlines():
                fields = line.split(None, 5)
                if len(fields) == 6 and fields[5].startswith("/dev/shm/mpich_"):
                    names.add(fields[5].split()[0])
        except OSError:
            continue
    return names


def _start(tmp_path, args: list[str]):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    tag = f"MOE_REPRO_CLEANUP_TEST={uuid.uuid4().hex}"
    env = dict(
        os.environ,
        TMPDIR=str(tmp),
        MOE_REPRO_RESULTS=str(tmp_path / "results"),
        MOE_REPRO_CLEANUP_TEST=tag.split("=")[1],
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", "from moe_repro.cli import main; main()", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, tmp, tag


def _left(tmp: Path, tag: str, segments: set[str]) -> dict:
    return {
        "processes": live_processes_with_env(tag),
        "segments": sorted(s for s in segments if os.path.exists(s)),
        "folders": sorted(p.name for p in tmp.iterdir() if p.name.startswith(workdirs.PREFIXES)),
    }


def _wait_clean(tmp: Path, tag: str, segments: set[str], seconds: float) -> dict:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        left = _left(tmp, tag, segments)
        if not any(left.values()):
            return left
        time.sleep(0.1)
    return _left(tmp, tag, segments)


@pytest.mark.multiprocess
@pytest.mark.slow
@needs_mpi
def test_sigkill_of_a_local_mpi_world_leaves_no_segment_and_no_points_folder(tmp_path):
    proc, tmp, tag = _start(
        tmp_path,
        [
            "bench",
            "allreduce",
            "--ranks",
            "2",
            "--backend",
            "mpi",
            "--bytes",
            "8",
            "--repeats",
            "1000000",
            "--timeout",
            "600",
        ],
    )
    try:
        deadline = time.monotonic() + patient(60)
        segments: set[str] = set()
        while not segments:  # the ranks are past MPI_Init: their segment exists
            assert proc.poll() is None, proc.stderr.read()[-2000:]
            assert time.monotonic() < deadline, "the MPI ranks did not start"
            segments = _segments_mapped_by(live_processes_with_env(tag))
            time.sleep(0.05)
        assert any(p.name.startswith(workdirs.POINTS_PREFIX) for p in tmp.iterdir())
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=patient(10))
        left = _wait_clean(tmp, tag, segments, patient(20))
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert not left["processes"], f"processes left after SIGKILL: {left}"
    assert not left["segments"], f"MPI segments left after SIGKILL: {left}"
    assert not left["folders"], f"work folders left after SIGKILL: {left}"


@pytest.mark.multiprocess
@pytest.mark.slow
@needs_mpi
def test_a_killed_rank_of_a_local_mpi_world_leaves_no_segment(tmp_path):
    # alltoall --fault kill:1: rank 1 SIGKILLs itself in its 3rd call; repro reports the failure
    # (exit 1) and ends the world; MPICH's segment, never finalized, must go with it.
    proc, tmp, tag = _start(
        tmp_path,
        [
            "bench",
            "alltoall",
            "--nodes",
            "1",
            "--gpus-per-node",
            "2",
            "--algo",
            "flat",
            "--backend",
            "mpi",
            "--fault",
            "kill:1",
            "--quick",
            "--timeout",
            "600",
        ],
    )
    segments: set[str] = set()
    try:
        deadline = time.monotonic() + patient(120)
        while proc.poll() is None:  # learn the world's segments while its ranks map them
            assert time.monotonic() < deadline, "the world did not end"
            segments |= _segments_mapped_by(live_processes_with_env(tag))
            time.sleep(0.02)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert proc.returncode == 1, err[-2000:]
    assert "rank(s) 1" in err
    left = _wait_clean(tmp, tag, segments, patient(5))
    assert segments, "the ranks were never seen mapping their segment"
    assert not any(left.values()), f"left after the failed world: {left}"


@pytest.mark.multiprocess
@pytest.mark.slow
@needs_mpi
def test_the_fault_harness_finds_nothing_left_after_signals_at_random_moments():
    # A few cases of tests/fault_harness.py (python tests/fault_harness.py --runs 40 is the
    # full measurement): SIGINT/SIGTERM/SIGHUP/SIGKILL into local MPI and gloo worlds.
    harness = Path(__file__).parent / "fault_harness.py"
    r = subprocess.run(
        [
            sys.executable,
            str(harness),
            "--runs",
            "4",
            "--seed",
            "3",
            "--kinds",
            "allreduce-mpi,alltoall-gloo",
        ],
        capture_output=True,
        text=True,
        timeout=patient(900),
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "total: 4 runs, 0 leftovers" in r.stdout, r.stdout[-4000:]


@pytest.mark.multiprocess
@pytest.mark.slow
@needs_mpi
def test_sigkill_of_launched_mpi_ranks_leaves_no_segment(tmp_path):
    # mpiexec -n 2 repro ...: nothing of ours runs above the ranks. Both ranks are SIGKILLed
    # (the OOM killer, a scheduler's kill -9): no MPI_Finalize runs; a janitor that local rank 0
    # started before MPI_Init removes the segment once the ranks are gone.
    mpiexec = Path(sys.executable).parent / "mpiexec"
    if not mpiexec.exists():
        pytest.skip("no mpiexec beside this Python")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    tag = uuid.uuid4().hex
    env = dict(
        os.environ,
        TMPDIR=str(tmp),
        MOE_REPRO_RESULTS=str(tmp_path / "results"),
        MOE_REPRO_CLEANUP_TEST=tag,
    )
    proc = subprocess.Popen(
        [
            str(mpiexec),
            "-n",
            "2",
            str(Path(sys.executable).parent / "repro"),
            "bench",
            "allreduce",
            "--backend",
            "mpi",
            "--bytes",
            "8",
            "--repeats",
            "1000000",
            "--timeout",
            "600",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + patient(60)
        segments: set[str] = set()
        while not segments:
            assert proc.poll() is None, "mpiexec ended before its ranks started"
            assert time.monotonic() < deadline, "the MPI ranks did not start"
            segments = _segments_mapped_by(live_processes_with_env(tag))
            time.sleep(0.05)
        for pid in live_processes_with_env(
            tag
        ):  # the ranks (and mpiexec), not its proxy or the janitor
            try:
                if b"bench" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        proc.wait(timeout=patient(30))
        deadline = time.monotonic() + patient(30)
        while (
            live_processes_with_env(tag) or any(os.path.exists(s) for s in segments)
        ) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        for pid in live_processes_with_env(
            tag
        ):  # a rank that outlived mpiexec: not this test's subject
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    left = sorted(s for s in segments if os.path.exists(s))
    assert not left, f"MPI segments left after SIGKILL of the launched ranks: {left}"
