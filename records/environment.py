"""The environment record stored beside every result: enough to tell two runs apart."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import socket
import subprocess
import sys
from functools import lru_cache
from pathlib import Path


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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
        return {"device": _cpu_model(), "device_type": "cpu", "device_count": 1}
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
    return {"device": _cpu_model(), "device_type": "cpu", "device_count": 1}


def collect_environment(command: list[str] | None = None) -> dict:
    """Provenance of a run. torch's version is read from its installed metadata and its thread
    count only where the run imported torch: importing it here would cost a simulated run
    more than the simulation (1-4 s)."""
    torch_version, threads = None, None
    if "torch" in sys.modules:
        try:
            import torch

            torch_version, threads = torch.__version__, torch.get_num_threads()
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
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "hostname": socket.gethostname(),
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(command if command is not None else ["repro", *sys.argv[1:]]),
    }
    env.update(device_description())
    env.update(git_state())
    return env
