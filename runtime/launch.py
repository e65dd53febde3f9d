"""Local multi-process launcher: N real ranks on this machine, grouped into emulated nodes.

``run_ranks(target, kwargs, world_size, ...)`` starts one process per rank, each running
``target(ctx, **kwargs)`` (``target`` is ``"module:function"``) with a :class:`RankContext`, and
returns the list of each rank's JSON-serialisable return value, indexed by rank.

Backends
- ``gloo`` (and ``nccl`` on GPUs): one Python process per rank, torch.distributed initialised
  over TCP on 127.0.0.1.
- ``mpi``: ``mpiexec -n N`` (the ``mpich`` wheel's by default; set ``MOE_REPRO_MPIEXEC`` to use a
  site MPI) runs the ranks; collectives go through mpi4py.

Failure is bounded: if a rank exits non-zero, the others are killed at once; if ranks are still
running after ``timeout_s``, all are killed. Either way :class:`RankFailure` names the ranks that
did not finish, with the tail of their stderr, and no process is left behind (each launch runs
in its own session and the whole process group is killed).

Emulated nodes: ``ranks_per_node`` consecutive ranks form one node (``node = rank //
ranks_per_node``), exported as LOCAL_RANK / LOCAL_WORLD_SIZE / GROUP_RANK like torchrun does.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moe_repro.runtime import signals, workdirs

BACKENDS = ("gloo", "nccl", "mpi")


class RankFailure(RuntimeError):
    """A rank died, raised, or did not finish in time."""

    def __init__(self, message: str, ranks: list[int]):
        super().__init__(message)
        self.ranks = ranks


@dataclass
class RankContext:
    """What a rank knows about its world. Built by the worker, passed to the target."""

    rank: int
    world_size: int
    ranks_per_node: int
    backend: str
    comm: Any = None  # mpi4py communicator for backend "mpi"

    @property
    def node(self) -> int:
        return self.rank // self.ranks_per_node

    @property
    def local_rank(self) -> int:
        return self.rank % self.ranks_per_node

    @property
    def device(self):
        """This rank's device: cuda:LOCAL_RANK under nccl, cpu otherwise (runtime/device.py)."""
        from moe_repro.runtime.device import rank_device

        return rank_device(self.backend, self.local_rank)

    @property
    def n_nodes(self) -> int:
        return -(-self.world_size // self.ranks_per_node)

    def barrier(self) -> None:
        if self.backend == "mpi":
            self.comm.Barrier()
        else:
            import torch.distributed as dist

            dist.barrier()

    def all_reduce_max(self, value: float) -> float:
        if self.backend == "mpi":
            from mpi4py import MPI

            return self.comm.allreduce(value, op=MPI.MAX)
        import torch
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.float64, device=self.device)  # NCCL: on the GPU
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())


# What one local rank costs, for the local-rank limit. Memory: a rank with torch and a gloo
# group initialised (ru_maxrss after init_process_group, torch 2.x, CPU) stays a little under
# 256 MiB resident, which leaves its suite's buffers a little room (larger buffers are each
# suite's own memory rule). Cores: beyond 8 ranks per core start-up alone (every rank imports
# torch) takes minutes and timings mean nothing. Files: gloo opens sockets to every peer in
# every rank.
RANK_MEMORY_BYTES = 256 * 2**20
RANKS_PER_CORE = 8
FILES_PER_PEER = 4
FILES_RESERVED = 128


def available_memory_bytes() -> float:
    """MemAvailable of /proc/meminfo (bytes), else the physical memory, else no limit."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return math.inf


def local_rank_limit() -> tuple[int, str]:
    """(most ranks this machine runs at once, why): the smallest of 8 per core, the available
    memory at 256 MiB per rank, and the open-file limit at 4 files per peer."""
    import resource

    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )
    memory = available_memory_bytes()
    files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    limits = {f"{RANKS_PER_CORE} per core on {cores} cores": cores * RANKS_PER_CORE}
    if math.isfinite(memory):
        limits[f"{memory / 2**30:.1f} GiB available at {RANK_MEMORY_BYTES >> 20} MiB per rank"] = (
            int(memory // RANK_MEMORY_BYTES)
        )
    if files != resource.RLIM_INFINITY:
        limits[f"open-file limit {files} at {FILES_PER_PEER} per peer"] = max(
            1, (files - FILES_RESERVED) // FILES_PER_PEER
        )
    why = min(limits, key=limits.get)
    return max(1, limits[why]), why


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mpiexec_path() -> str:
    """The mpiexec to use: $MOE_REPRO_MPIEXEC, else the one beside this Python, else on PATH."""
    explicit = os.environ.get("MOE_REPRO_MPIEXEC")
    if explicit:
        return explicit
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if not found:
        raise RankFailure(
            "no mpiexec found: install the 'mpich' wheel or set MOE_REPRO_MPIEXEC", []
        )
    return found


def mpi_unavailable() -> str | None:
    """Why MPI ranks cannot run here (None: they can): mpi4py and an mpiexec are needed."""
    import importlib.util

    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed"
    try:
        found = mpiexec_path()
    except RankFailure as e:
        return str(e)
    if not (os.path.exists(found) or shutil.which(found)):
        return f"mpiexec {found} does not exist"
    return None


def launched_by_mpi() -> bool:
    """Whether an MPI launcher (mpiexec/mpirun: PMI or Open MPI variables) started this world,
    rather than torchrun (WORLD_SIZE) or srun alone."""
    if os.environ.get("MOE_REPRO_WORKER") or os.environ.get("WORLD_SIZE"):
        return False
    return any(os.environ.get(v) for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"))


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def run_ranks(
    target: str,
    kwargs: dict | None = None,
    world_size: int = 2,
    ranks_per_node: int | None = None,
    backend: str = "gloo",
    timeout_s: float = 120.0,
    threads_per_rank: int | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> list[Any]:
    """Run ``target(ctx, **kwargs)`` on ``world_size`` real ranks; return results by rank.
    ``timeout_s`` is counted on ``clock`` (a test passes a fake one to choose the moment)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    ranks_per_node = ranks_per_node or world_size
    if ranks_per_node < 1 or world_size % ranks_per_node:
        raise ValueError(f"ranks_per_node={ranks_per_node} must divide world_size={world_size}")
    limit, why = local_rank_limit()
    if world_size > limit:  # refused before any rank starts (suites check this earlier still)
        raise ValueError(
            f"{world_size} local ranks requested; this machine runs at most {limit} ({why})"
        )
    if threads_per_rank is None:  # oversubscribing cores makes every rank slower than one
        threads_per_rank = max(1, (os.cpu_count() or 1) // world_size)

    remove_stale_workdirs()
    previous, workdir, janitor = {}, None, None
    procs: dict[str, subprocess.Popen] = {}
    try:
        previous = signals.install()
        with signals.deferred():  # the directory is never without its owner file (a signal waits)
            workdir = workdirs.make_workdir(WORKDIR_PREFIX)
        janitor = _start_janitor(workdir, backend == "mpi")  # before any rank: its segment snapshot
        (workdir / "kwargs.json").write_text(json.dumps(kwargs or {}))
        env = dict(
            os.environ,
            OMP_NUM_THREADS=str(threads_per_rank),
            MOE_REPRO_WORKER="1",
            **{workdirs.WORLD_ENV: str(workdir)},  # the janitor finds the world's processes by it
            MOE_REPRO_THREADS=str(threads_per_rank),
            PYTHONUNBUFFERED="1",
        )
        common = [
            "-m",
            "moe_repro.runtime.worker",
            "--target",
            target,
            "--workdir",
            str(workdir),
            "--world-size",
            str(world_size),
            "--ranks-per-node",
            str(ranks_per_node),
            "--backend",
            backend,
        ]
        if backend == "mpi":
            mpiexec = mpiexec_path()
            # MPICH's mpiexec (hydra, the mpich wheel's) SIGKILLs every rank when one dies, which
            # hides which one died; without that cleanup the dead rank is the only one gone, and
            # _supervise ends the others itself.
            keep = (
                ["-disable-auto-cleanup"]
                if Path(mpiexec).parent == Path(sys.executable).parent
                else []
            )
            cmd = [mpiexec, *keep, "-n", str(world_size), sys.executable, *common]
            with open(workdir / "mpiexec.err", "wb") as err, signals.deferred():
                procs["mpiexec"] = subprocess.Popen(
                    cmd,
                    env=env,
                    stdout=err,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=_in_child,
                )
        else:
            port = free_port()
            for r in range(world_size):
                cmd = [sys.executable, *common, "--rank", str(r), "--master-port", str(port)]
                with open(workdir / f"rank-{r}.err", "wb") as err, signals.deferred():
                    procs[str(r)] = subprocess.Popen(
                        cmd,
                        env=env,
                        stdout=err,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        preexec_fn=_in_child,
                    )
        _supervise(procs, workdir, world_size, timeout_s, clock)
        return [json.loads((workdir / f"rank-{r}.json").read_text()) for r in range(world_size)]
    finally:
        try:
            with signals.deferred():  # a second signal must not cut the cleanup short
                # ranks first (a signal may have come while they were being started, before
                # _supervise): a live rank writing its heartbeat would keep the directory
                for p in procs.values():
                    _kill_group(p)
                if workdir is not None:
                    shutil.rmtree(workdir, ignore_errors=True)
                if janitor is not None:
                    _end_janitor(janitor)
        finally:
            # after the block, which puts back the handlers it found (ours) as it ends: inside
            # it, the caller's handlers were restored and then overwritten again
            signals.restore(previous)


WORKDIR_PREFIX = workdirs.RANKS_PREFIX
JANITOR_WAIT_S = 15.0  # the most a finished run waits for its janitor's segment sweep


def _start_janitor(workdir: Path, mpi: bool) -> subprocess.Popen:
    """The watcher (runtime/workdirs.py) that cleans up when this process dies on a path where
    no cleanup code runs (SIGKILL, a crash in C): this process's registered work directories,
    and under MPI the segments the world's killed ranks left, told from the snapshot taken
    here before any rank starts. Its own session: a signal to our process group spares it.
    Its stdin is a pipe from us: the kernel closes it when we die, which wakes it at once."""
    janitor = subprocess.Popen(
        [
            sys.executable,
            "-S",
            workdirs.__file__,
            str(os.getpid()),
            str(workdir),
            "mpi" if mpi else "-",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        janitor.stdin.write(json.dumps(workdirs.shm_snapshot() if mpi else None).encode() + b"\n")
        janitor.stdin.flush()
    except OSError:
        pass
    return janitor


def _end_janitor(janitor: subprocess.Popen) -> None:
    """Tell the janitor we cleaned up our directories; it sweeps the world's MPI segments (once
    the world's processes are gone) and exits; wait for it, so that a finished run left nothing."""
    try:
        janitor.stdin.write(workdirs.DONE)
        janitor.stdin.close()
    except OSError:
        pass
    try:
        janitor.wait(timeout=JANITOR_WAIT_S)
    except subprocess.TimeoutExpired:
        janitor.kill()
        janitor.wait()


def die_with_parent() -> None:
    """In a child between fork and exec: ask Linux to SIGKILL it when its parent dies
    (prctl PR_SET_PDEATHSIG), so a SIGKILLed ``repro`` leaves no rank or mpiexec behind. The
    setting survives exec; elsewhere the worker's parent-liveness thread does the same job."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _in_child() -> None:
    """preexec_fn of a rank (or mpiexec), forked with SIGINT/SIGTERM/SIGHUP blocked: no Python
    handler of the parent may run here (runtime/signals.py), then the parent-death signal."""
    signals.in_child_after_fork(before_unblocking=die_with_parent)


def remove_stale_workdirs() -> list[Path]:
    """Remove work directories of every registered prefix (runtime/workdirs.py) left by a run
    whose owner died without cleaning up: each holds owner.pid; one whose owner is gone is
    stale. Returns what was removed."""
    return workdirs.remove_stale_workdirs()


def _waiting_in_communication(workdir: Path, rank: int) -> bool:
    try:
        where = json.loads((workdir / f"rank-{rank}.beat").read_text()).get("where", "")
    except (OSError, ValueError):
        return False
    return any(part in where for part in _WAITING_IN)


def _vanished_ranks(workdir: Path, world_size: int, pids: dict[int, int]) -> list[int]:
    """Ranks whose process is gone (or a zombie) before writing their result; learns each
    rank's pid from its heartbeat into ``pids``."""
    gone = []
    for r in range(world_size):
        if r not in pids:
            try:
                pids[r] = int(json.loads((workdir / f"rank-{r}.beat").read_text())["pid"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
        if not _result_written(workdir, r) and process_ended(pids[r]):
            gone.append(r)
    return gone


def process_ended(pid: int) -> bool:
    """Gone, or a zombie its parent (mpiexec's proxy, not us) has not reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return not workdirs.alive(pid)


class _ExitOrder:
    """The order in which the ranks' processes end, as the kernel reports each end (a pidfd
    becomes readable when its process terminates; Linux 5.3+). Under mpiexec a dead rank's
    peers are stopped within milliseconds, often inside one 20 ms poll of their pids, which then
    cannot tell the first from the rest; waiting on the pidfds wakes the supervisor at the first
    end. Ranks that end in the same wake-up form one batch (still ambiguous). Without pidfds
    (another OS, an old kernel) it only sleeps, and the pid polls decide as before."""

    def __init__(self):
        self.fds: dict[int, int] = {}
        self.batches: list[list[int]] = []

    def add(self, rank: int, pid: int) -> None:
        if (
            rank in self.fds
            or any(rank in b for b in self.batches)
            or not hasattr(os, "pidfd_open")
        ):
            return
        try:
            self.fds[rank] = os.pidfd_open(pid)
        except OSError:  # already gone, or pidfds unsupported: the pid polls still see it
            pass

    def wait(self, timeout_s: float) -> None:
        if not self.fds:
            time.sleep(timeout_s)
            return
        import select

        ready, _, _ = select.select(list(self.fds.values()), [], [], timeout_s)
        batch = sorted(r for r, fd in self.fds.items() if fd in ready)
        for r in batch:
            os.close(self.fds.pop(r))
        if batch:
            self.batches.append(batch)

    def first_of(self, ranks: list[int]) -> list[int]:
        """Of ``ranks`` (gone before their result), those of the earliest batch that holds any;
        ``ranks`` unchanged when no batch does."""
        for batch in self.batches:
            first = [r for r in batch if r in ranks]
            if first:
                return first
        return ranks

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def _supervise(
    procs: dict[str, subprocess.Popen],
    workdir: Path,
    world_size: int,
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    deadline = clock() + timeout_s
    # Under mpiexec only its exit code comes back, and a dead rank's peers abort soon after it;
    # so watch the ranks' own pids (from their heartbeats) and remember which vanished first.
    watch = "mpiexec" in procs
    pids: dict[int, int] = {}
    vanished: list[int] = []
    exits = _ExitOrder()
    beats = Heartbeats(workdir, world_size)
    try:
        while True:
            codes = {name: p.poll() for name, p in procs.items()}
            silent = beats.silent_ranks()
            if silent:  # found from the heartbeats, without waiting for the timeout
                _raise_for(workdir, world_size, codes, beats.describe(silent), silent=silent)
            if watch and not vanished:
                vanished = exits.first_of(_vanished_ranks(workdir, world_size, pids))
                for r, pid in pids.items():
                    exits.add(r, pid)
                if vanished and codes.get("mpiexec") is None:
                    codes["mpiexec"] = -signal.SIGKILL  # a failure now: ended below, by _kill_group
            failed = {name: c for name, c in codes.items() if c not in (None, 0)}
            missing = [r for r in range(world_size) if not _result_written(workdir, r)]
            if failed and not missing:
                # every rank wrote its result before one ended badly: a fault of the teardown
                # (a library's threads at exit), after the work; the results are whole
                _warn_teardown_fault(workdir, codes)
                return
            if failed and not all(n.isdigit() and _result_written(workdir, int(n)) for n in failed):
                _raise_for(workdir, world_size, codes, "exited with code", vanished)
            # else the ranks that ended badly had written their results first: the others go on
            if all(c == 0 for c in codes.values()):
                if missing:
                    _raise_for(workdir, world_size, codes, "exited without a result")
                return
            if clock() > deadline:
                _raise_for(
                    workdir, world_size, codes, f"did not finish within {timeout_s:g} s (hung?)"
                )
            exits.wait(0.02) if watch else time.sleep(0.02)
    finally:
        exits.close()
        # Kill every group, finished or not: a group may hold children (mpiexec's proxies,
        # a rank's helpers) after its leader exited. A signal now waits until all are gone.
        with signals.deferred():
            for p in procs.values():
                _kill_group(p)


def _result_written(workdir: Path, rank: int) -> bool:
    return (workdir / f"rank-{rank}.json").exists()


def _exit_how(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


def _warn_teardown_fault(workdir: Path, codes: dict[str, int | None]) -> None:
    """Say on stderr which ranks (or mpiexec) ended badly after every rank had written its
    result, and how: the run's results are kept, the fault is not hidden."""
    how = []
    for name, code in codes.items():
        if code in (None, 0):
            continue
        log = workdir / (f"rank-{name}.err" if name.isdigit() else "mpiexec.err")
        tail = _tail(log, 1)
        how.append(
            f"{'rank ' + name if name.isdigit() else name}: {_exit_how(code)}"
            + (f"; {tail}" if tail else "")
        )
    sys.stderr.write(
        "repro: warning: after every rank had written its result, "
        + " | ".join(how)
        + " (in teardown: the results are whole and kept)\n"
    )
    sys.stderr.flush()


# A rank is hung when its heartbeat has been silent longer than HANG_MULTIPLE times the slowest
# gap between two heartbeats seen so far in this world (a loaded machine beats slower: the limit
# grows with it), and never less than HANG_FLOOR_S (start-up imports can hold the interpreter
# lock for seconds on an oversubscribed machine), while another rank still beats.
HANG_FLOOR_S = 15.0
HANG_MULTIPLE = 10.0
_BEAT_READ_S = 0.5  # how often the supervisor reads the heartbeats


class Heartbeats:
    """The ranks' heartbeats (worker.py writes one every HEARTBEAT_S) as the supervisor sees
    them: each rank's last beat and the slowest gap between two beats of any rank so far."""

    def __init__(self, workdir: Path, world_size: int, clock: Callable[[], float] = time.time):
        self.workdir, self.world_size = workdir, world_size
        self.clock = clock  # the wall clock the beats are stamped with (a test passes its own)
        self.last: dict[int, float] = {}
        self.where: dict[int, str] = {}
        self.slowest_gap = 0.0
        self.read_at = 0.0

    def limit_s(self) -> float:
        return max(HANG_FLOOR_S, HANG_MULTIPLE * self.slowest_gap)

    def silent_ranks(self) -> list[int]:
        """Unfinished ranks silent past the limit while another unfinished rank still beats."""
        if self.clock() - self.read_at < _BEAT_READ_S:
            return []
        self.read_at = self.clock()
        unfinished = [r for r in range(self.world_size) if not _result_written(self.workdir, r)]
        for r in unfinished:
            try:
                beat = json.loads((self.workdir / f"rank-{r}.beat").read_text())
                t = float(beat["t"])
            except (OSError, ValueError, KeyError, TypeError):
                continue  # not started yet, or being written
            if r in self.last and t > self.last[r]:
                self.slowest_gap = max(self.slowest_gap, t - self.last[r])
            self.last[r] = max(t, self.last.get(r, t))
            self.where[r] = str(beat.get("where", "?"))
        now, limit = self.clock(), self.limit_s()
        silent = [r for r in unfinished if r in self.last and now - self.last[r] > limit]
        beating = [r for r in unfinished if r in self.last and r not in silent]
        return silent if beating else []

    def describe(self, silent: list[int]) -> str:
        now = self.clock()
        last = "; ".join(
            f"rank {r} silent for {now - self.last[r]:.0f} s, last at {self.where[r]}"
            for r in silent
        )
        return (
            f"stopped making progress ({last}): no heartbeat for longer than {self.limit_s():.0f} s "
            f"(the larger of {HANG_FLOOR_S:g} s and {HANG_MULTIPLE:g} x the slowest heartbeat gap "
            f"so far, {self.slowest_gap:.1f} s); the others waited on it"
        )


def _raise_for(
    workdir: Path,
    world_size: int,
    codes: dict[str, int | None],
    what: str,
    vanished: list[int] | None = None,
    silent: list[int] | None = None,
) -> None:
    """Name the ranks that caused the failure, most likely cause first.

    A rank killed by a signal or crashed without a Python traceback is the cause; ranks that
    raised come next (often they only raised because a peer vanished); on a timeout, the ranks
    still running. With mpiexec only its own exit code is known, so per-rank files decide.
    """
    unfinished = [r for r in range(world_size) if not _result_written(workdir, r)]
    raised = [r for r in unfinished if (workdir / f"rank-{r}.failed").exists()]
    rank_codes = {int(n): c for n, c in codes.items() if n.isdigit()}
    died = [r for r, c in rank_codes.items() if c not in (None, 0) and r not in raised]
    # under mpiexec no rank's own exit code comes back: the unfinished ranks are the running ones
    running = [r for r, c in rank_codes.items() if c is None] if rank_codes else unfinished
    first_gone = [r for r in (vanished or []) if r in unfinished and r not in raised]
    if len(first_gone) > 1:
        # a peer may die of the first one's death within the same poll: the one that died on
        # its own was, by its last heartbeat, outside communication (see _hung_ranks)
        on_own = [r for r in first_gone if not _waiting_in_communication(workdir, r)]
        first_gone = on_own or first_gone
    signalled = [r for r in died if (rank_codes.get(r) or 0) < 0]
    if silent:
        culprits = silent
    elif "within" in what and running:
        culprits, what = _hung_ranks(workdir, running, what)
    elif first_gone:
        # under mpiexec: the rank(s) whose process vanished first (we end the rest)
        culprits = died = first_gone
    else:
        # a rank killed by a signal is the cause; peers that then failed are named after it
        culprits = signalled or died + raised or unfinished
    # the ranks that failed after the cause, each under its own cause (not the cause's)
    followers = [r for r in died + raised if r not in culprits]

    def detail(r: int) -> str:
        code = rank_codes.get(r)
        how = _exit_how(code) if code else ""
        if r in first_gone and not how:
            how = "its process ended first, without a Python error"
        tail = _tail(workdir / f"rank-{r}.failed", 1) or _tail(workdir / f"rank-{r}.err", 1)
        return f"rank {r}: " + "; ".join(x for x in (how, tail) if x) if how or tail else ""

    details = [d for d in map(detail, culprits[:4]) if d]
    if not details and (workdir / "mpiexec.err").exists():
        details.append(
            f"mpiexec (exit code {codes.get('mpiexec')}): {_tail(workdir / 'mpiexec.err', 1)}"
        )
    names = ", ".join(map(str, culprits)) or "none"
    if what == "exited with code" and first_gone:
        what = "ended first, killed or crashed (its peers were then stopped)"
    elif what == "exited with code":
        what = "was killed by a signal" if signalled and culprits[0] in signalled else "failed"
    msg = f"rank(s) {names} of {world_size} {what}" + (
        f" -- {' | '.join(details)}" if details else ""
    )
    after = [d for d in map(detail, followers[:4]) if d]
    if after:
        msg += f"; then, after it: {' | '.join(after)}"
    raise RankFailure(msg, culprits)


# Where a rank's main thread waits when it is blocked on its peers, not stuck on its own.
_WAITING_IN = (
    "torch/distributed",
    "mpi4py",
    "components/alltoall/",
    "components/network/comm.py",
    "runtime/launch.py",
)
STALE_HEARTBEAT_S = 3.0


def _hung_ranks(workdir: Path, running: list[int], what: str) -> tuple[list[int], str]:
    """On a timeout, the ranks that stopped making progress, from their heartbeats: ranks whose
    heartbeat went stale (stopped processes), else ranks busy outside communication while the
    others wait in it; all running ranks when the heartbeats cannot tell them apart."""
    now, beats = time.time(), {}
    for r in running:
        try:
            beats[r] = json.loads((workdir / f"rank-{r}.beat").read_text())
        except (OSError, ValueError):
            beats[r] = None
    stale = [r for r in running if beats[r] is None or now - beats[r]["t"] > STALE_HEARTBEAT_S]
    if stale and len(stale) < len(running):
        last = "; ".join(
            f"rank {r} silent for {now - beats[r]['t']:.0f} s, last at {beats[r]['where']}"
            if beats[r]
            else f"rank {r} never reported"
            for r in stale
        )
        return stale, f"{what}: stopped making progress ({last}); the others waited on it"
    fresh = [r for r in running if r not in stale]
    waiting = [r for r in fresh if any(k in beats[r]["where"] for k in _WAITING_IN)]
    busy = [r for r in fresh if r not in waiting]
    if busy and waiting:
        where = "; ".join(f"rank {r} at {beats[r]['where']}" for r in busy)
        return (
            busy,
            f"{what}: {where}, while rank(s) {', '.join(map(str, waiting))} waited in communication",
        )
    return running, what


# --- Worlds started by an external launcher (torchrun, srun, mpirun) --------------------------

_SIZE_VARS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS")
_RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
_LOCAL_SIZE_VARS = (
    "LOCAL_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MPI_LOCALNRANKS",
    "SLURM_NTASKS_PER_NODE",
)


def _first_int(names: tuple[str, ...]) -> int | None:
    for name in names:
        value = os.environ.get(name, "").split("(")[0]  # SLURM writes "4(x2)"
        if value.isdigit():
            return int(value)
    return None


def launched_world_size() -> int | None:
    """World size if this process was started by torchrun, srun or mpirun (and not by us)."""
    if os.environ.get("MOE_REPRO_WORKER"):
        return None
    size = _first_int(_SIZE_VARS)
    return size if size and size > 1 else None


def launched_local_size() -> int | None:
    """Ranks on this node of a world torchrun, srun or mpirun started (None when not launched)."""
    return (
        (_first_int(_LOCAL_SIZE_VARS) or launched_world_size()) if launched_world_size() else None
    )


def launched_rank() -> int | None:
    """This process's rank in a world torchrun, srun or mpirun started (None when not launched)."""
    return _first_int(_RANK_VARS) if launched_world_size() else None


def launched_by() -> str:
    """Which launcher started this world, as the user would name it."""
    if launched_by_mpi():
        return "mpiexec/mpirun"
    if os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("LOCAL_WORLD_SIZE"):
        return "torchrun"
    if os.environ.get("SLURM_NTASKS"):
        return "srun"
    return "a launcher"


def check_launched_world(backends: set[str], ranks: set[int]) -> None:
    """Before any work under torchrun, mpiexec or srun: the backends asked for must be able to
    use this world, and the world sizes asked for must be its size. ValueError saying what to
    run instead (a backend "mpi" rank outside an MPI world is a 1-rank MPI singleton: it would
    measure alone and be labelled with the launcher's world size)."""
    size = launched_world_size()
    if not size:
        return
    how = launched_by()
    if "mpi" in backends and not launched_by_mpi():
        raise ValueError(
            f"--backend mpi needs a world started by mpiexec/mpirun; this one was "
            f"started by {how} ({size} ranks), where each MPI rank would be a 1-rank "
            f"singleton. Run: mpiexec -n {size} repro ... --backend mpi, or keep "
            f"{how} with --backend gloo"
        )
    wrong = sorted(r for r in ranks if r != size)
    if wrong:
        raise ValueError(
            f"{how} started {size} ranks, but the grid asks for "
            f"{', '.join(map(str, wrong))}; launch that many, or leave the world size "
            f"to the launcher"
        )


def init_launched_world(backend: str) -> RankContext:
    """Join the world an external launcher started; returns this rank's context.

    mpi: MPI.COMM_WORLD (node = shared-memory communicator). gloo/nccl: torch.distributed from
    the environment (torchrun sets MASTER_ADDR/PORT; under mpirun/srun they default to
    127.0.0.1:29500 unless set, which covers single-node runs).
    """
    if backend == "mpi":
        workdirs.watch_launched_rank()  # before MPI_Init: the segments a killed world leaves go
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        local = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_size()
        return RankContext(comm.Get_rank(), comm.Get_size(), local, "mpi", comm)
    import torch.distributed as dist

    rank, size = _first_int(_RANK_VARS), _first_int(_SIZE_VARS)
    local = _first_int(_LOCAL_SIZE_VARS) or size
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    if not dist.is_initialized():
        from moe_repro.runtime.device import bind, rank_device

        bind(rank_device(backend, rank % local))  # nccl: this rank's GPU, as RankContext.device
        dist.init_process_group(backend, rank=rank, world_size=size)
        # Tear the group down before the interpreter does: a process group destroyed during
        # interpreter shutdown, with its threads still running, can abort the rank (SIGABRT,
        # "terminate called without an active exception") after a good run, and the launcher
        # then reports the job failed.
        atexit.register(_leave_launched_world)
    return RankContext(rank, size, local, backend)


def _leave_launched_world() -> None:
    import torch.distributed as dist

    if dist.is_initialized():  # no barrier: a rank that failed early must not hang its peers here
        dist.destroy_process_group()


LAUNCHED_DIR_PREFIX = workdirs.WORLD_PREFIX  # registered with the others (runtime/workdirs.py)
# The variables that tell one run of a launcher from the next under the same parent process
# (torchrun restarts its workers under the same agent; a Slurm job runs several steps).
_RUN_ID_VARS = (
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "PMIX_NAMESPACE",
    "OMPI_MCA_ess_base_jobid",
)


def launched_world_dir() -> Path | None:
    """The directory the ranks of a launched world on this node share (their heartbeats, and
    the marks of ranks that finished or left), None when not launched. Named after the
    launcher's process on this node (the parent of every local rank: torchrun's agent,
    mpiexec's proxy, slurmstepd) and its run's id; ranks started through a wrapper of their own
    each get a directory of their own, and then only their deadline watches them. Directories
    whose launcher process is gone are removed here."""
    import re
    import tempfile

    if not launched_world_size():
        return None
    run = "-".join(os.environ.get(v, "") for v in _RUN_ID_VARS).strip("-")
    key = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{os.getuid()}-{os.getppid()}-{run}")[:120]
    base = Path(tempfile.gettempdir())
    for old in base.glob(f"{LAUNCHED_DIR_PREFIX}{os.getuid()}-*"):
        try:
            owner = int(old.name[len(LAUNCHED_DIR_PREFIX) :].split("-")[1])
        except (IndexError, ValueError):
            continue
        if owner != os.getppid() and not workdirs.alive(owner):
            shutil.rmtree(old, ignore_errors=True)
    directory = base / f"{LAUNCHED_DIR_PREFIX}{key}"
    try:
        directory.mkdir(mode=0o700, exist_ok=True)
    except OSError:
        return None
    return directory
