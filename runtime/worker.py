"""Entry point of one rank started by :mod:`moe_repro.runtime.launch` (``python -m moe_repro.runtime.worker``)."""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from moe_repro.records.atomic import atomic_write_json, atomic_write_text
from moe_repro.runtime.launch import RankContext


def _load(target: str):
    module, _, func = target.partition(":")
    return getattr(importlib.import_module(module), func)


def _exit_when_parent_dies() -> None:
    """A rank never outlives the process that started it (repro, or mpiexec's proxy): the kernel's
    parent-death signal where available (Linux), and a thread that notices being re-parented."""
    from moe_repro.runtime.launch import die_with_parent

    die_with_parent()  # for ranks whose parent is mpiexec's proxy rather than repro
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


HEARTBEAT_S = 0.5


def _start_heartbeat(workdir: Path, rank: int, stop: threading.Event | None = None) -> None:
    """Every HEARTBEAT_S (until ``stop`` is set), write when this rank last ran and where its
    main thread is (innermost Python frame). A stopped process stops beating; a rank blocked in
    a collective beats from inside the communication library -- launch.py tells a hung rank
    from its waiting peers so."""
    main_thread = threading.main_thread()
    path = workdir / f"rank-{rank}.beat"
    stop = stop or threading.Event()

    def where() -> str:
        frame = sys._current_frames().get(main_thread.ident)
        return (
            f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
            if frame
            else "?"
        )

    def beat() -> None:
        while not stop.is_set():
            try:
                atomic_write_json(
                    path,
                    {"t": time.time(), "where": where(), "pid": os.getpid()},
                    make_parents=False,
                )
            except OSError:
                return  # the work directory is gone: the run is over
            stop.wait(HEARTBEAT_S)

    threading.Thread(target=beat, name="heartbeat", daemon=True).start()


class LaunchedWatch:
    """The watchdog of one rank of a world torchrun, mpiexec or srun started, where no
    supervisor of ours watches the ranks (run_ranks's does for the worlds it starts).

    A thread checks every POLL_S, and ends this rank -- one line on stderr, exit 1, so that the
    launcher tears the whole world down -- when
    - the run passes its deadline (``timeout_s``, the command's --timeout);
    - a peer on this node stopped making progress: its heartbeat silent past the supervisor's
      limit (launch.Heartbeats, the same rule and message) while this rank beats;
    - a peer on this node left the world early (interrupted: :meth:`leave`);
    - a peer's watch on this node is ending it (that peer's cause, e.g. its deadline, holds).
    A rank blocked in a collective never returns to Python, so only a thread can do this.
    Before ending, ``on_abort(why, interrupted)`` runs (rank 0 stores the points that finished)
    and returns what to add to the line.

    The ranks of a node share ``directory`` (launch.launched_world_dir): heartbeats,
    ``rank-R.json`` once a rank finished (no longer watched), ``rank-R.left`` when it left
    early, ``rank-R.ended`` with the cause when its watch ends it (its peers report that cause,
    not the broken collective its exit leaves them), ``rank-0.kept`` saying what rank 0 stored. Without a directory only the deadline
    watches. ``clock`` (deadline) and ``wall`` (heartbeat stamps) are injectable for tests.
    """

    POLL_S = 0.5
    KEPT_WAIT_S = 10.0  # how long a leaving rank waits for rank 0 to say what it stored
    PEER_EXIT_WAIT_S = 5.0  # how long rank 0 lets a leaving peer print its own line first

    def __init__(
        self,
        rank: int,
        world_size: int,
        timeout_s: float,
        directory: Path | None,
        on_abort=None,
        launcher: str = "the launcher",
        clock=time.monotonic,
        wall=time.time,
    ):
        from moe_repro.runtime.launch import Heartbeats

        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self.directory, self.on_abort, self.launcher = directory, on_abort, launcher
        self.clock, self.wall = clock, wall
        self.deadline = clock() + timeout_s
        self.beats = Heartbeats(directory, world_size, clock=wall) if directory else None
        self.stopped = threading.Event()
        self._ending = threading.Lock()
        self.aborting = False
        self.silent: list[int] = []  # the peers found silent by the last check

    def _path(self, rank: int, what: str) -> Path:
        return self.directory / f"rank-{rank}.{what}"

    def _read(self, rank: int, what: str) -> str | None:
        try:
            return self._path(rank, what).read_text().strip()
        except (OSError, TypeError, AttributeError):
            return None

    def _mark(self, what: str, text: str) -> None:
        if self.directory is not None:
            try:
                atomic_write_text(self._path(self.rank, what), text, make_parents=False)
            except OSError:
                pass  # the directory is gone: no peer reads it any more

    def reason(self) -> tuple[str, bool] | None:
        """(why this rank must end now, whether a peer was interrupted), or None."""
        if self.clock() > self.deadline:
            return f"the run did not finish within {self.timeout_s:g} s (--timeout)", False
        if self.directory is None:
            return None
        for r in range(self.world_size):
            if r == self.rank:
                continue
            left = self._read(r, "left")
            if left is not None:
                return f"rank {r} left the world ({left})", "interrupted" in left
            ended = self._read(r, "ended")
            if ended is not None:  # a peer's watch is ending the world: the same cause holds here
                return ended, False
        silent = self.beats.silent_ranks()
        self.silent = silent
        if silent:
            return "rank(s) " + ", ".join(map(str, silent)) + " " + self.beats.describe(
                silent
            ), False
        return None

    def start(self) -> "LaunchedWatch":
        if self.directory is not None:
            _start_heartbeat(self.directory, self.rank, self.stopped)
        threading.Thread(target=self._run, name="launched-watch", daemon=True).start()
        return self

    def _run(self) -> None:
        while not self.stopped.wait(self.POLL_S):
            found = self.reason()
            if found and not self.stopped.is_set():
                self.abort(*found)

    def abort(self, why: str, interrupted: bool = False) -> None:
        """Run ``on_abort``, say why in one line, and end this rank with exit 1."""
        if not self._ending.acquire(blocking=False):
            return  # the main thread is already leaving
        self.aborting = True
        self._mark("ended", why)  # first: a peer that sees this rank go reports the same cause
        kept = None
        try:
            kept = self.on_abort(why, interrupted) if self.on_abort else None
        except BaseException as e:  # noqa: BLE001 -- the rank ends either way
            kept = f"storing the finished points failed: {type(e).__name__}: {e}"
        if self.rank == 0:
            self._mark("kept", kept or "nothing stored")
        _say(
            f"repro: rank {self.rank} of {self.world_size}: {why}"
            + (f"; {kept}" if kept else "")
            + f"; ending this rank so that {self.launcher} ends the world"
        )
        if self.rank == 0 and "left the world" in why:
            self._wait_for_leaving_peers()
        self._kill_stopped_peers()
        os._exit(1)

    def _kill_stopped_peers(self) -> None:
        """End the silent peers that are stopped (SIGSTOP, a debugger): a stopped process takes
        no SIGTERM, so the launcher would wait out its grace period (torchrun: 30 s) before its
        SIGKILL. Only a process of the same launcher on this node (our parent's child) in the
        stopped state, named by its own heartbeat."""
        for r in self.silent:
            try:
                pid = int(json.loads(self._read(r, "beat") or "{}")["pid"])
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                if fields[0] in ("T", "t") and int(fields[1]) == os.getppid():
                    os.kill(pid, signal.SIGKILL)
            except (OSError, ValueError, KeyError, IndexError):
                pass

    def hold_if_aborting(self) -> None:
        """For the main thread, on an error: when the watch has a cause (a peer's watch ended it
        at the deadline and its exit broke the collective this rank was in), that error is an
        effect of the cause: end this rank with the cause's line now, or, while the watch is
        ending this rank already, wait for its exit instead of reporting a second failure."""
        found = None if self.aborting else self.reason()
        if found is not None:
            self.abort(*found)  # returns only when the watch thread got there first
        while self.aborting:
            time.sleep(0.1)

    def _wait_for_leaving_peers(self) -> None:
        """Let the peers that left early read rank-0.kept and print their line before this rank's
        exit gets them killed (mpiexec kills every rank when one exits non-zero)."""
        until = self.clock() + self.PEER_EXIT_WAIT_S
        pids = []
        for r in range(1, self.world_size):
            try:
                if self._read(r, "left") is not None:
                    pids.append(int(json.loads(self._read(r, "beat") or "{}")["pid"]))
            except (ValueError, KeyError):
                pass
        from moe_repro.runtime.launch import process_ended

        while self.clock() < until and not all(process_ended(p) for p in pids):
            time.sleep(0.05)

    def finish(self) -> None:
        """This rank's work is done: stop watching, mark it finished (its peers stop watching
        it), and remove the shared directory once every rank of the node has finished."""
        self.stopped.set()
        self._mark("json", "{}")
        if self.directory is None:
            return
        from moe_repro.runtime.launch import launched_local_size

        try:
            done = len(list(self.directory.glob("rank-*.json")))
        except OSError:
            return
        if done >= (launched_local_size() or self.world_size):
            import shutil

            shutil.rmtree(self.directory, ignore_errors=True)

    def leave(self, why: str, code: int, kept: str | None = None) -> None:
        """End this rank early (interrupted): tell the peers on this node (rank 0 then stores
        what finished, if it is not this rank), say honestly what was kept, and exit with
        ``code`` at once -- without MPI's finalize or the process group's teardown, which wait
        on peers blocked in a collective. Never returns."""
        if not self._ending.acquire(blocking=False):
            self.stopped.wait()  # the watch is ending this rank already
        self.stopped.set()
        self._mark("left", why)
        if self.rank == 0:
            self._mark("kept", kept or "no point had finished: nothing stored")
            what = (
                f"finished results were kept: {kept}"
                if kept
                else "no point had finished: nothing stored"
            )
        else:
            until = self.clock() + self.KEPT_WAIT_S
            said = self._read(0, "kept")
            while said is None and self.directory is not None and self.clock() < until:
                time.sleep(0.05)
                said = self._read(0, "kept")
            what = (
                f"rank 0 keeps the finished results: {said}"
                if said
                else "this rank keeps no results (rank 0 stores them) and rank 0 did not confirm "
                f"within {self.KEPT_WAIT_S:g} s that it stored any"
            )
        _say(f"repro: rank {self.rank} of {self.world_size}: {why} ({what})")
        os._exit(code)


def _say(line: str) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def watch_launched_world(timeout_s: float, on_abort=None) -> LaunchedWatch | None:
    """Start this rank's :class:`LaunchedWatch` when torchrun, mpiexec or srun started this
    process (None otherwise: a local world has run_ranks's supervisor)."""
    from moe_repro.runtime.launch import (
        launched_by,
        launched_rank,
        launched_world_dir,
        launched_world_size,
    )

    size = launched_world_size()
    if not size:
        return None
    return LaunchedWatch(
        launched_rank() or 0,
        size,
        timeout_s,
        launched_world_dir(),
        on_abort,
        launcher=launched_by(),
    ).start()


def main(argv: list[str] | None = None) -> int:
    _exit_when_parent_dies()
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--workdir", required=True, type=Path)
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--ranks-per-node", type=int, required=True)
    ap.add_argument("--backend", required=True)
    ap.add_argument("--rank", type=int)
    ap.add_argument("--master-port", type=int)
    a = ap.parse_args(argv)

    comm = None
    if a.backend == "mpi":
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        rank = comm.Get_rank()
        if comm.Get_size() != a.world_size:
            raise SystemExit(f"mpiexec started {comm.Get_size()} ranks, expected {a.world_size}")
    else:
        rank = a.rank
    _start_heartbeat(a.workdir, rank)
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(a.world_size),
        LOCAL_RANK=str(rank % a.ranks_per_node),
        LOCAL_WORLD_SIZE=str(a.ranks_per_node),
        GROUP_RANK=str(rank // a.ranks_per_node),
    )
    try:
        import torch

        torch.set_num_threads(int(os.environ.get("MOE_REPRO_THREADS", "1")))
        if a.backend != "mpi":
            import torch.distributed as dist

            from moe_repro.runtime.device import bind, rank_device

            bind(rank_device(a.backend, rank % a.ranks_per_node))  # nccl: this rank's GPU first
            dist.init_process_group(
                a.backend,
                init_method=f"tcp://127.0.0.1:{a.master_port}",
                rank=rank,
                world_size=a.world_size,
                timeout=datetime.timedelta(seconds=300),
            )
        ctx = RankContext(
            rank=rank,
            world_size=a.world_size,
            ranks_per_node=a.ranks_per_node,
            backend=a.backend,
            comm=comm,
        )
        kwargs = json.loads((a.workdir / "kwargs.json").read_text())
        result = _load(a.target)(ctx, **kwargs)
        atomic_write_json(a.workdir / f"rank-{rank}.json", result)
        if a.backend != "mpi":
            import torch.distributed as dist

            dist.destroy_process_group()
    except BaseException:
        atomic_write_text(a.workdir / f"rank-{rank}.failed", traceback.format_exc())
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)  # do not wait on peers stuck in a collective
    if a.backend != "mpi":
        # The result is written and every group shut down: leave without the interpreter's
        # finalization, where gloo's threads and the subgroups' process groups that Python
        # objects still hold are torn down in no set order and can abort the rank (SIGABRT,
        # "terminate called without an active exception": seen once in CI, after every point
        # of the run had been stored; pytorch/pytorch#179291 describes the same abort), as
        # moe_repro.cli._exit_launched_rank does for ranks a launcher started. MPI ranks exit
        # normally: mpi4py finalizes MPI at exit, which mpiexec expects.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
