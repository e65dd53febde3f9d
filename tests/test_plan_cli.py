"""`repro plan`: the Done-when command and one-line errors with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _repro(*args, cwd=None):
    return subprocess.run([sys.executable, "-c", "from moe_repro.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=120)


def test_plan_deepseek_v3_frontier_json(tmp_path):
    out = tmp_path / "p.json"
    r = _repro("plan", "--model", "deepseek-v3", "--platform", "frontier", "--nodes", "64", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "pp" in r.stdout and "best:" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["gpus"] == 512 and doc["candidates"]
    for c in doc["candidates"]:
        assert c["pp"] * c["ep"] == 512 and 256 % c["ep"] == 0
        assert set(c) >= {"pp", "ep", "peak_bytes", "feasible", "why_not", "estimate"}


@pytest.mark.parametrize("args,needle", [
    (["--model", "nope", "--platform", "frontier", "--nodes", "4"], "unknown model 'nope'"),
    (["--model", "tiny-moe", "--platform", "mars", "--nodes", "4"], "unknown platform 'mars'"),
    (["--model", "tiny-moe", "--platform", "frontier", "--nodes", "0"], "--nodes must be positive"),
    (["--model", "tiny-moe", "--platform", "frontier", "--nodes", "1", "--seq", "-5"], "--seq must be positive"),
    (["--model", "tiny-moe", "--platform", "missing.json", "--nodes", "1"], "not found"),
    (["--model", "deepseek-v3", "--platform", "frontier", "--nodes", "4", "--pp", "2", "--ep", "32"],
     "is not the 32 GPUs"),
    (["--model", "deepseek-v3", "--platform", "frontier", "--nodes", "3", "--pp", "1", "--ep", "24"],
     "EP=24 does not divide the expert count E=256"),
    (["--model", "tiny-moe", "--platform", "frontier", "--nodes", "1", "--pp", "8", "--ep", "1"],
     "PP=8 exceeds the layer count L=4"),
    (["--model", "tiny-moe", "--platform", "frontier", "--nodes", "1", "--pp", "8"], "--pp and --ep go together"),
])
def test_bad_input_one_line_exit_2(args, needle):
    r = _repro("plan", *args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr


def test_plan_one_layout():
    r = _repro("plan", "--model", "deepseek-v3", "--platform", "frontier", "--nodes", "64", "--pp", "16", "--ep", "32")
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if line[:2].strip().isdigit()]
    assert [row[:2] for row in rows] == [["16", "32"]]


def test_plan_with_a_copied_profile(tmp_path):
    from importlib import resources

    doc = json.loads(resources.files("moe_repro.components.network").joinpath("platforms", "frontier.json").read_text())
    doc["gpu"]["hbm_GB"] = 1  # an edited copy: nothing fits in 1 GB
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(doc))
    r = _repro("plan", "--model", "mixtral-8x7b", "--platform", str(path), "--nodes", "1")
    assert r.returncode == 0, r.stderr
    assert "best: none fits" in r.stdout and "Eq. 11" in r.stdout
