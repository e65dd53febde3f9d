"""Start-up: a signal while `repro` imports, memory refused before ranks start, an estimate
before long work (reliability round three)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from conftest import patient

ROOT = Path(__file__).resolve().parent.parent

# Runs the console script exactly as pip's generated one does (the entry point that
# pyproject.toml declares, called with no argument), with an import finder in front that
# blocks the import named by $BLOCK_AT: it creates $READY and waits there, so a signal is sent
# at a known moment of start-up, not at a moment guessed by sleeping.
_BLOCKED_START = r"""
import importlib, importlib.abc, os, sys, time, tomllib

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == os.environ["BLOCK_AT"]:
            open(os.environ["READY"], "w").close()
            deadline = time.monotonic() + float(os.environ["HOLD_S"])
            while time.monotonic() < deadline:
                time.sleep(0.01)
        return None

sys.meta_path.insert(0, Block())
with open(os.environ["PYPROJECT"], "rb") as f:
    module, _, func = tomllib.load(f)["project"]["scripts"]["repro"].partition(":")
sys.argv[0] = "repro"
sys.exit(getattr(importlib.import_module(module), func)())
"""


def _signal_while_importing(tmp_path, block_at: str, sig: int, *args: str):
    ready = tmp_path / "ready"
    env = {**os.environ, "BLOCK_AT": block_at, "READY": str(ready), "HOLD_S": str(patient(30)),
           "PYPROJECT": str(ROOT / "pyproject.toml"), "MOE_REPRO_RESULTS": str(tmp_path / "results")}
    env.pop("MOE_REPRO_DEBUG", None)
    proc = subprocess.Popen([sys.executable, "-c", _BLOCKED_START, *args], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + patient(30)
        while not ready.exists():  # the process is now held inside that import
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, f"never reached the import of {block_at}"
            time.sleep(0.01)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=patient(30))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, err


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
@pytest.mark.parametrize("block_at", ["click", "moe_repro.cli.bench_cmd"])
def test_a_signal_while_the_cli_imports_is_one_line_and_128_plus_signal(tmp_path, block_at, sig, code):
    rc, out, err = _signal_while_importing(tmp_path, block_at, sig, "list")
    assert rc == code, (rc, err[-2000:])
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert "interrupted" in err and out == ""


def test_a_signal_while_a_command_imports_torch_is_one_line(tmp_path):
    rc, out, err = _signal_while_importing(tmp_path, "torch", signal.SIGTERM, "bench", "gemm", "--quick")
    assert rc == 143, (rc, err[-2000:])
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_the_console_script_installs_the_handlers_before_importing_the_cli():
    """The entry module itself imports nothing of the CLI (so nothing heavy) before main runs."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        target = tomllib.load(f)["project"]["scripts"]["repro"]
    module = target.partition(":")[0]
    code = (f"import sys, signal; import {module} as m; "
            "print(sorted(n for n in ('click', 'torch', 'pydantic', 'moe_repro.cli') if n in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT.parent,
                       timeout=patient(30))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout
