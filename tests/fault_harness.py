"""Fault harness: signals at random moments into real worlds, then a count of what they left.

    python tests/fault_harness.py --runs 40 [--seed N] [--kinds allreduce-gloo,allreduce-mpi,...]

Each run starts one case (a small ``repro bench`` world), sends SIGINT, SIGTERM, SIGHUP or
SIGKILL to its top process at a moment drawn uniformly over the length of an uninterrupted run
of the same case (measured first; the first 85% of it, so that most land while the world
runs), waits for it to end and for its clean-up (the janitor) to
finish, and counts leftovers of three kinds:

- shm: MPICH segments (/dev/shm/mpich_shm_*, mpich_vci_*) that appeared during the run;
- tmp: registered work folders (runtime/workdirs.PREFIXES) in the run's private TMPDIR;
- procs: processes of the run still alive (each run tags its processes' environment); a run
  still running --hang-after seconds after its signal is hung, and its processes count so.

It prints one line per run and a summary line per kind, and exits 1 if anything was left.

Other people's files are never counted or removed: each run has its own TMPDIR, and where the
harness may (root, ``unshare``), it re-runs itself in a private mount namespace with its own
tmpfs on /dev/shm, so every segment there is one of its runs'. Otherwise (``--shared-shm``)
a segment counts only if a process of the run was seen mapping it (the harness reads the run's
processes' /proc/PID/maps every 20 ms while it runs).

Kinds: local worlds ``allreduce-gloo``, ``allreduce-mpi``, ``alltoall-gloo``, ``alltoall-mpi``
(the default set), and launched worlds ``mpiexec-allreduce`` (mpiexec -n 2 repro ... --backend
mpi) and ``torchrun-allreduce`` (torchrun --nproc-per-node 2 repro ... --backend gloo).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from procs import live_processes_with_env

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL)
PREFIXES = (
    "moe-repro-ranks-",
    "moe-repro-points-",
    "moe-repro-world-",
)  # checked against runtime/workdirs below
SHM_PATTERNS = ("mpich_shm_", "mpich_vci_")
IN_NAMESPACE = "MOE_REPRO_FAULT_HARNESS_NS"
SMALL = ["--repeats", "2", "--warmup", "0", "--min-sample-s", "0", "--timeout", "300"]
REPRO = [sys.executable, "-c", "from moe_repro.cli import main; main()"]

CASES = {
    "allreduce-gloo": REPRO
    + ["bench", "allreduce", "--ranks", "2", "--backend", "gloo", "--bytes", "8,4096", *SMALL],
    "allreduce-mpi": REPRO
    + ["bench", "allreduce", "--ranks", "2", "--backend", "mpi", "--bytes", "8,4096", *SMALL],
    "alltoall-gloo": REPRO
    + [
        "bench",
        "alltoall",
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--algo",
        "flat",
        "--backend",
        "gloo",
        "--quick",
        *SMALL,
    ],
    "alltoall-mpi": REPRO
    + [
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
        "--quick",
        *SMALL,
    ],
    "mpiexec-allreduce": [
        str(BIN / "mpiexec"),
        "-n",
        "2",
        str(BIN / "repro"),
        "bench",
        "allreduce",
        "--backend",
        "mpi",
        "--bytes",
        "8,4096",
        *SMALL,
    ],
    "torchrun-allreduce": [
        str(BIN / "torchrun"),
        "--nproc-per-node",
        "2",
        "--no-python",
        str(BIN / "repro"),
        "bench",
        "allreduce",
        "--backend",
        "gloo",
        "--bytes",
        "8,4096",
        *SMALL,
    ],
}
LOCAL = ("allreduce-gloo", "allreduce-mpi", "alltoall-gloo", "alltoall-mpi")


def tagged(tag: str) -> list[int]:
    """Live (not zombie) processes whose environment carries ``tag``."""
    return live_processes_with_env(tag)


def segments() -> dict[str, int]:
    """{path: inode} of the MPI segments in /dev/shm."""
    found = {}
    try:
        entries = list(os.scandir("/dev/shm"))
    except OSError:
        return found
    for e in entries:
        if e.name.startswith(SHM_PATTERNS):
            try:
                found[e.path] = e.inode()
            except OSError:
                pass
    return found


def mapped_by(pids: list[int]) -> set[str]:
    names = set()
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/maps").read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[5].startswith("/dev/shm/mpich_"):
                names.add(fields[5].split()[0])
    return names


class Run:
    """One run of a case in its own TMPDIR, its processes tagged."""

    def __init__(self, base: Path, kind: str, private_shm: bool):
        self.kind, self.private_shm = kind, private_shm
        self.dir = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=base))
        self.tmp = self.dir / "tmp"
        self.tmp.mkdir()
        self.tag = uuid.uuid4().hex
        self.before = segments()
        self.seen: set[str] = set()  # segments a process of this run mapped
        env = dict(
            os.environ,
            TMPDIR=str(self.tmp),
            MOE_REPRO_RESULTS=str(self.dir / "results"),
            MOE_REPRO_FAULT_RUN=self.tag,
            PYTHONUNBUFFERED="1",
        )
        self.start = time.monotonic()
        self.proc = subprocess.Popen(
            CASES[kind],
            env=env,
            cwd=self.dir,
            stdout=subprocess.DEVNULL,
            stderr=open(self.dir / "stderr", "wb"),
            start_new_session=True,
        )

    def watch(self, until: float) -> None:
        """Learn the run's segments until ``until`` (monotonic) or its end."""
        while time.monotonic() < until and self.proc.poll() is None:
            if not self.private_shm:
                self.seen |= mapped_by(tagged(self.tag))
            time.sleep(0.02)

    def new_segments(self) -> list[str]:
        now = segments()
        new = [p for p, ino in now.items() if self.before.get(p) != ino]
        return sorted(new if self.private_shm else [p for p in new if p in self.seen])

    def leftovers(self) -> dict[str, list]:
        return {
            "shm": self.new_segments(),
            "procs": tagged(self.tag),
            "tmp": sorted(p.name for p in self.tmp.iterdir() if p.name.startswith(PREFIXES)),
        }

    def settle(self, seconds: float) -> dict[str, list]:
        """Wait until nothing is left or ``seconds`` pass; what is left then."""
        deadline = time.monotonic() + seconds
        left = self.leftovers()
        while any(left.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
            left = self.leftovers()
        return left

    def clear(self, left: dict[str, list]) -> None:
        """Remove what this run left, so the next run starts clean (only this run's things)."""
        for pid in left["procs"]:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for path in left["shm"]:
            try:
                os.unlink(path)
            except OSError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)


def in_private_namespace(argv: list[str]) -> int | None:
    """Re-run this script in a private mount namespace with its own /dev/shm; None where that
    is not possible here (then the shared /dev/shm is used, with attribution by mapping)."""
    if os.environ.get(IN_NAMESPACE) or os.geteuid() != 0 or not shutil.which("unshare"):
        return None
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "true"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    if probe.returncode:
        return None
    script = 'mount -t tmpfs -o size=1g,mode=1777 moe-repro-fault-harness /dev/shm && exec "$@"'
    return subprocess.run(
        [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
            sys.executable,
            __file__,
            *argv,
        ],
        env=dict(os.environ, **{IN_NAMESPACE: "1"}),
    ).returncode


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # the runs get SIGINT and SIGHUP as from a terminal, even when this script was started in
    # the background (which leaves them ignored, and its runs would inherit that)
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=40, help="signalled runs in all (default 40)")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: from the clock)")
    ap.add_argument(
        "--kinds",
        default=",".join(LOCAL),
        help=f"comma-separated cases, of: {', '.join(CASES)} (default: the local ones)",
    )
    ap.add_argument(
        "--shared-shm",
        action="store_true",
        help="use the machine's /dev/shm (segments attributed by mapping)",
    )
    ap.add_argument(
        "--hang-after",
        type=float,
        default=60.0,
        help="seconds after the signal a run may take to end; past it, it is hung (default 60)",
    )
    ap.add_argument(
        "--settle",
        type=float,
        default=30.0,
        help="seconds to wait after a run ends for its clean-up (default 30)",
    )
    a = ap.parse_args(argv)
    kinds = [k for k in a.kinds.split(",") if k]
    unknown = [k for k in kinds if k not in CASES]
    if unknown or not kinds or a.runs < 1:
        ap.error(f"unknown kinds {unknown}" if unknown else "need at least one kind and one run")
    if not a.shared_shm:
        rc = in_private_namespace(argv)
        if rc is not None:
            return rc
    private_shm = bool(os.environ.get(IN_NAMESPACE)) and not a.shared_shm
    sys.path.insert(0, str(ROOT))
    from moe_repro.runtime.workdirs import PREFIXES as registered

    assert set(PREFIXES) <= set(registered), "the harness's prefixes are the registry's"
    seed = a.seed if a.seed is not None else time.time_ns() % 2**32
    rng = random.Random(seed)
    base = Path(tempfile.mkdtemp(prefix="moe-repro-fault-harness-"))
    print(
        f"fault harness: seed {seed}, {a.runs} runs over {', '.join(kinds)}; /dev/shm "
        f"{'private (own mount namespace)' if private_shm else 'shared: segments counted by mapping'}; "
        f"TMPDIR per run under {base}",
        flush=True,
    )
    totals = {
        k: {"runs": 0, "finished first": 0, "shm": 0, "tmp": 0, "procs": 0, "signals": {}}
        for k in kinds
    }
    try:
        full = {}
        for kind in kinds:  # the length of an uninterrupted run: the moments are drawn over it
            run = Run(base, kind, private_shm)
            run.watch(time.monotonic() + 600)
            rc = run.proc.wait()
            full[kind] = time.monotonic() - run.start
            left = run.settle(a.settle)
            print(
                f"  {kind}: uninterrupted run {full[kind]:.1f} s, exit {rc}"
                + (f", LEFT {left}" if any(left.values()) else ""),
                flush=True,
            )
            if rc != 0:
                print((run.dir / "stderr").read_text(errors="replace")[-2000:], file=sys.stderr)
                return 1
            run.clear(left)
        for i in range(a.runs):
            kind = kinds[i % len(kinds)]
            sig, at = rng.choice(SIGNALS), rng.uniform(0, 0.85 * full[kind])
            run = Run(base, kind, private_shm)
            run.watch(run.start + at)
            if run.proc.poll() is None:
                run.proc.send_signal(sig)
            run.watch(time.monotonic() + a.hang_after)
            try:
                rc = run.proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                rc = "hung"  # its processes count as left (ended below, after the count)
            left = run.settle(a.settle)
            t = totals[kind]
            t["runs"] += 1
            t["finished first"] += rc == 0
            t["signals"][sig.name] = t["signals"].get(sig.name, 0) + 1
            for what in ("shm", "tmp", "procs"):
                t[what] += len(left[what])
            print(
                f"  run {i + 1:3d} {kind:18s} {sig.name:7s} at {at:5.2f} s of {full[kind]:4.1f} s: "
                f"exit {rc}; left: shm {len(left['shm'])}, tmp {len(left['tmp'])}, "
                f"procs {len(left['procs'])}" + (f" {left}" if any(left.values()) else ""),
                flush=True,
            )
            if run.proc.poll() is None:
                os.killpg(run.proc.pid, signal.SIGKILL)
                run.proc.wait()
            run.clear(left)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    bad = 0
    for kind, t in totals.items():
        if not t["runs"]:
            continue
        sigs = ", ".join(f"{n} {c}" for n, c in sorted(t["signals"].items()))
        left = t["shm"] + t["tmp"] + t["procs"]
        bad += left
        print(
            f"{kind}: {t['runs']} runs ({sigs}; {t['finished first']} finished before the signal); leftovers: shm {t['shm']}, tmp {t['tmp']}, "
            f"procs {t['procs']}{'' if left else ' -- clean'}"
        )
    print(f"total: {sum(t['runs'] for t in totals.values())} runs, {bad} leftovers")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
