"""A signal at any moment of a real run (issue 33): SIGTERM, SIGHUP or SIGINT sent to `repro
bench allreduce` at 20 random moments from start-up to the end, at 2, 4 and 16 ranks.

After each, the test asserts: the parent exited with 128 + signal (a signal sent before main()
installed its handlers -- the interpreter still starting, read from /proc/PID/status -- may end
it as Python does, with nothing to keep: nothing may be stored then); no process of the run is left (found by a tag in their environment); no work
directory is left (the run's TMPDIR is private); and every point that finished before the
signal (its file, seen in the run's TMPDIR) is in a stored record marked ``interrupted: true``
(or the run finished first and stored it complete).

The moments are drawn uniformly over the length of an uninterrupted run at the same size,
measured first. Slow (16 ranks start on a 2-core machine): marked ``slow``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import patient

pytestmark = pytest.mark.slow

RANKS = {2: 7, 4: 7, 16: 6}  # moments per world size: 20 in all
SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def command(ranks: int) -> list[str]:
    # two points per world: a signal between them leaves one finished record to keep
    return [
        sys.executable,
        "-c",
        "from moe_repro.cli import main; main()",
        "bench",
        "allreduce",
        "--ranks",
        str(ranks),
        "--backend",
        "gloo",
        "--bytes",
        "8,4096",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--min-sample-s",
        "0",
        "--timeout",
        "600",
    ]


def tagged_processes(tag: str) -> list[int]:
    """Live (not zombie) processes whose environment carries ``tag``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if tag.encode() not in (entry / "environ").read_bytes():
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def handlers_installed(pid: int) -> bool:
    """Whether repro's main() has installed its handlers (SIGTERM among the caught signals,
    /proc/PID/status SigCgt): before that the process is still the interpreter starting up
    (site, imports), whose reaction to a signal is Python's own."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    except OSError:
        pass
    return True


def finished_points(tmp: Path) -> int:
    """Points the world has handed back so far (runner.run_points_on_rank writes each); 0 when
    the run removes its points folder while it is being listed (callers keep the largest seen)."""
    try:
        return sum(1 for _ in tmp.glob("moe-repro-points-*/*.json"))
    except FileNotFoundError:
        return 0


def run_once(tmp_path: Path, ranks: int, at_s: float | None, sig: int | None) -> dict:
    run_dir = tmp_path / uuid.uuid4().hex[:8]
    tmp, results = run_dir / "tmp", run_dir / "results"
    tmp.mkdir(parents=True)
    tag = f"MOE_REPRO_SIGNAL_TEST={uuid.uuid4().hex}"
    env = dict(
        os.environ,
        TMPDIR=str(tmp),
        MOE_REPRO_RESULTS=str(results),
        MOE_REPRO_SIGNAL_TEST=tag.split("=")[1],
    )
    start = time.monotonic()
    proc = subprocess.Popen(
        command(ranks), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    seen, handled = 0, True
    if at_s is not None:
        while time.monotonic() - start < at_s and proc.poll() is None:
            seen = max(seen, finished_points(tmp))
            time.sleep(0.01)
        seen = max(seen, finished_points(tmp))
        if proc.poll() is None:
            handled = handlers_installed(proc.pid)
            proc.send_signal(sig)
    _, err = proc.communicate(timeout=patient(90))
    took = time.monotonic() - start
    deadline = time.monotonic() + patient(1.5)  # the janitor and killed groups need a moment
    while (tagged_processes(tag) or any(tmp.iterdir())) and time.monotonic() < deadline:
        time.sleep(0.1)
    stored = (
        [json.loads(p.read_text()) for p in results.rglob("*.json")] if results.exists() else []
    )
    return {
        "rc": proc.returncode,
        "err": err,
        "took": took,
        "seen": seen,
        "handled": handled,
        "left": tagged_processes(tag),
        "dirs": sorted(p.name for p in tmp.iterdir()),
        "stored": stored,
    }


def test_a_signal_at_any_moment_keeps_what_finished_and_leaves_nothing(tmp_path):
    rng = random.Random(int(os.environ.get("MOE_REPRO_SIGNAL_SEED", time.time_ns())))
    outcomes = []
    for ranks, moments in RANKS.items():
        full = run_once(tmp_path, ranks, None, None)
        assert full["rc"] == 0, full["err"][-2000:]
        assert len(full["stored"]) == 1 and len(full["stored"][0]["records"]) == 2
        for _ in range(moments):
            sig, at = rng.choice(SIGNALS), rng.uniform(0, full["took"])
            out = run_once(tmp_path, ranks, at, sig)
            where = (
                f"{ranks} ranks, {signal.Signals(sig).name} at {at:.2f} s of {full['took']:.1f} s"
            )
            assert not out["left"], f"{where}: processes left: {out['left']}"
            assert not out["dirs"], f"{where}: left in TMPDIR: {out['dirs']}"
            complete = [s for s in out["stored"] if not s["interrupted"] and len(s["records"]) == 2]
            if out["rc"] in (0, -sig) and complete:  # it finished (and stored) before the signal
                kind = "finished first"
                assert len(out["stored"]) == 1
            elif not out["handled"]:
                # sent while the interpreter was still starting (before main()): no rank could
                # exist yet, nothing may be stored; how Python itself ends is not ours to set
                kind = f"interpreter start-up (exit {out['rc']})"
                assert not out["stored"] and not out["seen"], where
            elif out["rc"] == -sig:
                pytest.fail(f"{where}: killed by the signal although its handlers were installed")
            else:
                assert "Traceback" not in out["err"], f"{where}: {out['err'][-2000:]}"
                assert out["rc"] == 128 + sig, f"{where}: exit {out['rc']}: {out['err'][-2000:]}"
                stored = [r for s in out["stored"] for r in s["records"]]
                assert len(stored) >= out["seen"], (
                    f"{where}: {out['seen']} finished, {len(stored)} stored"
                )
                assert all(s["interrupted"] or len(s["records"]) == 2 for s in out["stored"]), where
                kind = f"interrupted ({len(stored)} of 2 points kept)"
            outcomes.append((ranks, signal.Signals(sig).name, round(at, 2), out["rc"], kind))
    print("\n".join(map(str, outcomes)))
    assert len(outcomes) == sum(RANKS.values())
