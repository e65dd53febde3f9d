"""Everything a run leaves on the machine while it runs, in one registry, and the janitor that
removes it when the run cannot.

- Work directories in the temp directory: one prefix per kind (:data:`PREFIXES`), each
  directory holding ``owner.pid`` (the process that made it). A directory whose owner is gone
  is stale (:func:`remove_stale_workdirs`, run before each launch). A launched world's
  directory is the exception: its name carries its launcher's pid instead.
- MPICH's shared memory: ranks under mpiexec map ``/dev/shm/mpich_shm_<world>_<node>`` (and
  ``mpich_vci_*``), unlinked by ``MPI_Finalize``; a rank killed first leaves it. The name
  carries a hash of the launcher's job name, no pid, so a world's segments are found by
  snapshot: the files of :data:`SHM_PATTERNS` owned by this user that were not there before the
  launch (:func:`shm_snapshot`, :func:`remove_new_segments`). One is removed only once no
  process of the world is alive and no live process holds it (open or mapped): another
  user's segment (other owner) and another live run's (held by its ranks) are never touched.
- The janitor (``python -S`` running this file, started by ``launch.run_ranks`` in its own
  session) outlives a SIGKILLed ``repro``, where no cleanup code of ours runs: it learns of the
  parent's end from its stdin (the pipe closes without the parent's ``done``), waits for the
  world's processes (their environment names the work directory: WORLD_ENV) to end, ending
  any straggler itself, then removes every registered directory the parent owned and the
  world's MPI segments. On the normal path the parent removes its own directories and the
  janitor only ends stragglers and sweeps the segments.
- Ranks that mpiexec started (``mpiexec -n N repro ...``) have no process of ours above them:
  each starts a janitor of its own before MPI_Init (:func:`watch_launched_rank`).

Standard library only and no package import: the janitor starts in tens of milliseconds.
"""

from __future__ import annotations

import fnmatch
import json
import os
import select
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

RANKS_PREFIX = (
    "moe-repro-ranks-"  # runtime/launch.py: one local world's files (results, heartbeats)
)
POINTS_PREFIX = "moe-repro-points-"  # suites/runner.py: a world's finished records, handed back
# launch.launched_world_dir: the ranks of a launched world on one node; named after its
# launcher's process (no owner.pid): that function removes those whose launcher is gone
WORLD_PREFIX = "moe-repro-world-"
PREFIXES = (RANKS_PREFIX, POINTS_PREFIX, WORLD_PREFIX)
OWNER_FILE = "owner.pid"
WORLD_ENV = "MOE_REPRO_WORKDIR"  # set by the launcher in a world's environment: its work directory

SHM_DIR = Path("/dev/shm")
SHM_PATTERNS = ("mpich_shm_*", "mpich_vci_*")
WORLD_END_WAIT_S = 10.0  # how long the janitor waits for the world's processes to end
DONE = b"done\n"  # the parent's last line to the janitor: it cleaned up its own directories
NO_WORKDIR = "-"  # the janitor of a launched rank: no work directory, segments only
LAUNCHED_WAIT_S = 30.0  # how long a launched rank's janitor waits for its peers to let go


def make_workdir(prefix: str) -> Path:
    """A new directory in the temp directory with a registered prefix, holding owner.pid. Call
    it where a signal cannot come between the two steps (``signals.deferred``)."""
    if prefix not in PREFIXES:
        raise ValueError(f"unregistered work-directory prefix {prefix!r}: add it to PREFIXES")
    d = Path(tempfile.mkdtemp(prefix=prefix))
    (d / OWNER_FILE).write_text(str(os.getpid()))
    return d


def _owner(d: Path) -> int | None:
    try:
        return int((d / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None  # not ours, or being created right now


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _workdirs(tmp: Path | None = None):
    tmp = Path(tmp or tempfile.gettempdir())
    for prefix in PREFIXES:
        yield from tmp.glob(prefix + "*")


def remove_stale_workdirs(tmp: Path | None = None) -> list[Path]:
    """Remove registered work directories whose owner died without cleaning up (SIGKILL, and
    its janitor killed too). Returns what was removed."""
    removed = []
    for d in _workdirs(tmp):
        pid = _owner(d)
        if pid is None or pid == os.getpid() or alive(pid):
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


def remove_workdirs_of(owner: int, tmp: Path | None = None) -> list[Path]:
    """Remove every registered work directory ``owner`` made (the janitor, once it is dead)."""
    removed = []
    for d in _workdirs(tmp):
        if _owner(d) == owner:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def shm_snapshot(shm_dir: Path = SHM_DIR) -> dict[str, int]:
    """{name: inode} of the MPI segments this user owns now."""
    found = {}
    try:
        entries = list(os.scandir(shm_dir))
    except OSError:
        return found
    for e in entries:
        if not any(fnmatch.fnmatchcase(e.name, p) for p in SHM_PATTERNS):
            continue
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        if st.st_uid == os.getuid():
            found[e.name] = st.st_ino
    return found


def new_segments(before: dict[str, int], shm_dir: Path = SHM_DIR) -> list[Path]:
    """This user's MPI segments that were not in ``before`` (a same name on another inode is a
    new file)."""
    now = shm_snapshot(shm_dir)
    return [Path(shm_dir) / name for name, ino in sorted(now.items()) if before.get(name) != ino]


def _mine(path: Path) -> bool:
    try:
        return path.stat().st_uid == os.getuid()
    except OSError:
        return False


def _pids():
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            yield int(entry.name)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def holders(paths: list[Path]) -> dict[str, set[int]]:
    """{path: pids} for those of ``paths`` that a live process has open or mapped (from /proc:
    descriptors, then maps). Processes whose /proc entries cannot be read belong to other
    users."""
    wanted = {str(p) for p in paths}
    found: dict[str, set[int]] = {}
    if not wanted:
        return found
    for pid in _pids():
        try:
            for fd in os.scandir(f"/proc/{pid}/fd"):
                try:
                    target = os.readlink(fd.path)
                except OSError:
                    continue
                if target in wanted:
                    found.setdefault(target, set()).add(pid)
            with open(f"/proc/{pid}/maps", errors="replace") as f:
                for line in f:
                    fields = line.rstrip("\n").split(None, 5)
                    if len(fields) == 6 and fields[5] in wanted:
                        found.setdefault(fields[5], set()).add(pid)
        except OSError:
            continue
    return found


def _exiting(pid: int) -> bool:
    """A process in its exit: its memory (and so its command line) is gone before its open
    files are closed and it becomes a zombie."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return not f.read() and _running(pid)
    except OSError:
        return False


def processes_naming(workdir: str) -> list[int]:
    """Live processes (not zombies) other than this one that belong to the world of
    ``workdir``: an argument of their command line is it (mpiexec and the ranks), or their
    environment holds ``WORLD_ENV=workdir`` (every process of the world, mpiexec's proxies and a
    rank not yet exec'd among them)."""
    arg, entry = workdir.encode(), f"{WORLD_ENV}={workdir}".encode()
    found = []
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                ours = arg in f.read().split(b"\0")
            if not ours:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    ours = entry in f.read().split(b"\0")
        except OSError:
            continue
        if ours and _running(pid):
            found.append(pid)
    return found


def end_world(
    workdir: str, wait_s: float = WORLD_END_WAIT_S, clock=time.monotonic, sleep=time.sleep
) -> list[int]:
    """SIGKILL every process whose environment holds ``WORLD_ENV=workdir`` (the world's ranks,
    mpiexec and its proxies) until none is left or ``wait_s`` passes; returns those signalled.
    Run when the world is over (its parent died, or finished with it): a rank that started
    while its parent was dying missed its parent-death signal and would wait for its peers."""
    needle = f"{WORLD_ENV}={workdir}".encode()
    signalled: list[int] = []
    deadline = clock() + wait_s
    while True:
        left = []
        for pid in _pids():
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if needle in env and _running(pid):
                left.append(pid)
        if not left or clock() >= deadline:
            return signalled
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
                signalled.append(pid)
            except OSError:
                pass
        sleep(0.05)


def remove_new_segments(
    before: dict[str, int],
    world: str | None = None,
    shm_dir: Path = SHM_DIR,
    wait_s: float = WORLD_END_WAIT_S,
    clock=time.monotonic,
    sleep=time.sleep,
    learned: frozenset[str] = frozenset(),
    wait_held: bool = False,
) -> list[Path]:
    """Once no process naming ``world`` runs (up to ``wait_s``), unlink this user's MPI segments
    that appeared since ``before`` or that a rank of the world was seen mapping (``learned``),
    and that no live process holds. ``wait_held``: wait (up to ``wait_s``) while they are held,
    for a launched world, whose other ranks nothing names. Returns what was removed."""
    deadline = clock() + wait_s
    if world is not None:
        while processes_naming(world) and clock() < deadline:
            sleep(0.05)
    removed = []
    while True:
        seen = [Path(p) for p in learned if Path(p).parent == Path(shm_dir)]
        candidates = sorted(set(new_segments(before, shm_dir)) | {p for p in seen if _mine(p)})
        busy = holders(candidates)
        for path in candidates:
            if str(path) in busy:
                continue
            try:
                path.unlink()
            except OSError:
                continue  # unlinked meanwhile by its own world, or not ours to remove
            removed.append(path)
        # a rank of the world may still be exiting (no command line, files not yet closed);
        # in a local world, a segment a live process holds is another run's: it is left alone
        waiting = (
            bool(busy)
            if wait_held
            else any(_exiting(pid) for pids in busy.values() for pid in pids)
        )
        if not waiting or clock() >= deadline:
            return removed
        sleep(0.05)


def remove_launched_dirs(
    launcher: int,
    tmp: Path | None = None,
    wait_s: float = LAUNCHED_WAIT_S,
    clock=time.monotonic,
    sleep=time.sleep,
) -> list[Path]:
    """Remove the node directories (WORLD_PREFIX, named ``<uid>-<launcher pid>-<run>``) of the
    launched world whose launcher process on this node is ``launcher``, once that process has
    ended (up to ``wait_s``); the launcher's next world would otherwise be the one to sweep
    them. Returns what was removed."""
    pattern = f"{WORLD_PREFIX}{os.getuid()}-{launcher}-*"
    deadline = clock() + wait_s
    while True:
        dirs = sorted(Path(tmp or tempfile.gettempdir()).glob(pattern))
        if not dirs:
            return []
        if not _running(launcher):
            for d in dirs:
                shutil.rmtree(d, ignore_errors=True)
            return dirs
        if clock() >= deadline:
            return []
        sleep(0.1)


def janitor(owner: int, workdir: str, mpi: bool, stream=None, launcher: int | None = None) -> None:
    """The janitor's body (see the module docstring). Its stdin carries one JSON line (the
    segment snapshot taken before the launch, or null), then ``done`` from a parent that
    cleaned up; end of input without it means the parent died. ``launcher``: a launched
    rank's parent (mpiexec's proxy), whose node directory goes once it has ended."""
    stream = stream if stream is not None else sys.stdin.buffer
    fd = stream.fileno()
    buf = b""
    learned: set[str] = set()
    while os.getppid() == owner:
        if mpi and workdir == NO_WORKDIR:  # a launched rank: what it maps is its world's
            learned |= mapped_segments(owner)
        ready, _, _ = select.select([fd], [], [], 0.2)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
    first, _, rest = buf.partition(b"\n")
    try:
        before = json.loads(first) or {}
    except ValueError:
        before = {}
    if workdir != NO_WORKDIR:
        end_world(workdir)  # the world is over either way: no straggler may outlive it
    if (
        not rest.endswith(DONE) and workdir != NO_WORKDIR
    ):  # the parent died: its cleanup did not run
        deadline = time.monotonic() + WORLD_END_WAIT_S
        while processes_naming(workdir) and time.monotonic() < deadline:
            time.sleep(0.05)  # a live rank would write into the directory being removed
        shutil.rmtree(workdir, ignore_errors=True)
        remove_workdirs_of(owner, Path(workdir).parent)
    if mpi:
        if workdir == NO_WORKDIR:
            remove_new_segments(
                before, None, wait_s=LAUNCHED_WAIT_S, learned=frozenset(learned), wait_held=True
            )
            if launcher:
                remove_launched_dirs(launcher)
        else:
            remove_new_segments(before, workdir, learned=frozenset(learned))


def mapped_segments(pid: int) -> set[str]:
    """The MPI segments process ``pid`` maps now."""
    found = set()
    try:
        with open(f"/proc/{pid}/maps", errors="replace") as f:
            for line in f:
                fields = line.rstrip("\n").split(None, 5)
                if (
                    len(fields) == 6
                    and fields[5].startswith(str(SHM_DIR) + "/")
                    and any(
                        fnmatch.fnmatchcase(os.path.basename(fields[5]), p) for p in SHM_PATTERNS
                    )
                ):
                    found.add(fields[5])
    except OSError:
        pass
    return found


_LAUNCHED_JANITOR: list = []  # keeps the pipe to this rank's janitor open while the rank lives


def watch_launched_rank() -> None:
    """In a rank of a world mpiexec/mpirun started, before MPI_Init: start a janitor that, when
    this rank's process ends (whatever ends it), removes the node's MPI segments the world
    leaves: those that appeared since its snapshot and those it saw this rank map, once no
    process holds them (it waits up to LAUNCHED_WAIT_S for the world's other ranks to end; a
    segment still held then is left), and the world's node directory once the launcher's
    process here (this rank's parent) has ended. A launched rank has no parent of ours to
    clean up after it: the launcher is mpiexec. Every rank starts one: the segment is created by
    whichever local rank gets there first, and that rank's janitor saw it appear."""
    import subprocess

    if _LAUNCHED_JANITOR or "mpi4py.MPI" in sys.modules:
        return  # already watched; MPI began before the snapshot
    snapshot = shm_snapshot()
    try:
        janitor_proc = subprocess.Popen(
            [
                sys.executable,
                "-S",
                __file__,
                str(os.getpid()),
                NO_WORKDIR,
                "mpi",
                str(os.getppid()),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        janitor_proc.stdin.write(json.dumps(snapshot).encode() + b"\n")
        janitor_proc.stdin.flush()
    except OSError:
        return
    _LAUNCHED_JANITOR.append(janitor_proc)


if __name__ == "__main__":
    janitor(
        int(sys.argv[1]),
        sys.argv[2],
        sys.argv[3] == "mpi",
        launcher=int(sys.argv[4]) if len(sys.argv) > 4 else None,
    )
