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
    r = subprocess.run([str(BIN / "torchrun"), "--standalone", "--nproc_per_node=4", str(BIN / "repro"),
                        "--results", str(tmp_path / "store"), "bench", "alltoall", "--nodes", "2",
                        "--gpus-per-node", "2", "--algo", "flat,halo", "--repeats", "2", "--quick",
                        "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "terminate called" not in r.stderr
    assert [rec["algo"] for rec in json.loads(out.read_text())["records"]] == ["flat", "halo"]
