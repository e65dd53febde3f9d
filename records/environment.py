"""The environment record stored beside every result: enough to tell two runs apart.

It also keeps the noise context a timing needs to be read (``noise``): the load average when
the run started (:func:`mark_start`, called by the suite runner before its first point) and
when it was stored, the process's CPU time over the run, the CPU clock frequency where the
kernel exposes it, and ``loaded``: a run that saw a 1-minute load average above the core count
shared its cores with other work, and its wall times are the machine's under that load, not
the machine's own.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import socket
import subprocess
import sys
import time
from functools import lru_cache
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what the platform module says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


_START: dict | None = None


def load_average() -> list[float] | None:
    """The 1-, 5- and 15-minute load averages (None where the system has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def cpu_frequency_mhz() -> float | None:
    """The mean current clock of the CPUs in MHz, from cpufreq or /proc/cpuinfo (None where
    neither says: many virtual machines expose no frequency)."""
    khz = []
    for path in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_cur_freq"):
        try:
            khz.append(float(path.read_text().strip()))
        except (OSError, ValueError):
            pass
    if khz:
        return round(sum(khz) / len(khz) / 1000, 1)
    try:
        mhz = [
            float(line.split(":", 1)[1])
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("cpu MHz")
        ]
    except (OSError, ValueError):
        mhz = []
    return round(sum(mhz) / len(mhz), 1) if mhz else None


def mark_start(force: bool = False) -> None:
    """Note the load average and CPU time as a run starts (the first call counts unless
    ``force``): :func:`noise_context` reports from here."""
    global _START
    if _START is None or force:
        _START = {"load": load_average(), "cpu": time.process_time()}


def noise_context() -> dict:
    """Load average at start and now, CPU time since the start, CPU frequency, and whether
    the load exceeded the core count (``loaded``)."""
    end = load_average()
    start = _START["load"] if _START else None
    cores = os.cpu_count() or 1
    worst = max((x[0] for x in (start, end) if x), default=None)
    children = os.times()
    return {
        "load_start": start,
        "load_end": end,
        "cpu_count": cores,
        "cpu_time_s": round(time.process_time() - (_START["cpu"] if _START else 0.0), 3),
        "children_cpu_time_s": round(children.children_user + children.children_system, 3),
        "cpu_freq_mhz": cpu_frequency_mhz(),
        "loaded": None if worst is None else worst > cores,
    }


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@lru_cache(maxsize=1)
def git_state() -> dict:
    """Commit and dirty flag of the harness source tree (None outside a git checkout)."""
    src = Path(__file__).resolve().parent.parent
    commit = _git(["rev-parse", "HEAD"], src)
    if commit is None:
        return {"git_commit": None, "git_dirty": None}
    status = _git(["status", "--porcelain", "--untracked-files=no"], src)
    return {"git_commit": commit, "git_dirty": bool(status)}


def device_description() -> dict:
    """The compute device results were measured on: a GPU name, or the CPU model. A run that
    never imported torch (a simulation) computed on the CPU, whatever GPUs the host has."""
    if "torch" not in sys.modules:
        return {"device": cpu_model(), "device_type": "cpu", "device_count": 1}
    try:
        import torch

        if torch.cuda.is_available():
            return {
                "device": torch.cuda.get_device_name(0),
                "device_type": "cuda",
                "device_count": torch.cuda.device_count(),
            }
    except Exception:  # torch missing or broken: still describe the CPU
        pass
    return {"device": cpu_model(), "device_type": "cpu", "device_count": 1}


def collect_environment(command: list[str] | None = None) -> dict:
    """Provenance of a run. torch's version is read from its installed metadata and its thread
    count only where the run imported torch: importing it here would cost a simulated run
    more than the simulation (1-4 s)."""
    torch_version: str | None = None
    threads: int | None = None
    if "torch" in sys.modules:
        try:
            import torch

            torch_version, threads = str(torch.__version__), torch.get_num_threads()
        except Exception:
            pass
    else:
        try:
            from importlib.metadata import version

            torch_version = version("torch")
        except Exception:
            pass
    env = {
        "python": platform.python_version(),
        "torch": torch_version,
        "torch_threads": threads,
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "hostname": socket.gethostname(),
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(command if command is not None else ["repro", *sys.argv[1:]]),
        "noise": noise_context(),
    }
    env.update(device_description())
    env.update(git_state())
    return env
