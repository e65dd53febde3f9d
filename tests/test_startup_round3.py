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
    env = {
        **os.environ,
        "BLOCK_AT": block_at,
        "READY": str(ready),
        "HOLD_S": str(patient(30)),
        "PYPROJECT": str(ROOT / "pyproject.toml"),
        "MOE_REPRO_RESULTS": str(tmp_path / "results"),
    }
    env.pop("MOE_REPRO_DEBUG", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", _BLOCKED_START, *args],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
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


@pytest.mark.parametrize(
    "sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)]
)
@pytest.mark.parametrize("block_at", ["click", "moe_repro.cli.bench_cmd"])
def test_a_signal_while_the_cli_imports_is_one_line_and_128_plus_signal(
    tmp_path, block_at, sig, code
):
    rc, out, err = _signal_while_importing(tmp_path, block_at, sig, "list")
    assert rc == code, (rc, err[-2000:])
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert "interrupted" in err and out == ""


def test_a_signal_while_a_command_imports_torch_is_one_line(tmp_path):
    rc, out, err = _signal_while_importing(
        tmp_path, "torch", signal.SIGTERM, "bench", "gemm", "--quick"
    )
    assert rc == 143, (rc, err[-2000:])
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_the_console_script_installs_the_handlers_before_importing_the_cli():
    """The entry module itself imports nothing of the CLI (so nothing heavy) before main runs."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        target = tomllib.load(f)["project"]["scripts"]["repro"]
    module = target.partition(":")[0]
    code = (
        f"import sys, signal; import {module} as m; "
        "print(sorted(n for n in ('click', 'torch', 'pydantic', 'moe_repro.cli') if n in sys.modules))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT.parent,
        timeout=patient(30),
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout


# --- memory: refused before any rank starts ------------------------------------------------------


def repro(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-c", "from moe_repro.entry import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=patient(timeout),
    )


def _refused_for_memory(r, results_dir) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-500:])
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "GiB for" in r.stderr and "GiB of memory available here" in r.stderr, r.stderr
    assert not (results_dir.exists() and any(results_dir.rglob("*.json"))), "nothing stored"


def test_pp_ep_train_of_a_model_no_machine_holds_is_refused_before_ranks_start(results_dir):
    r = repro("bench", "pp-ep-train", "--model", "gpt3-175b")
    _refused_for_memory(r, results_dir)
    assert "weights, gradients, Adam state" in r.stderr


def test_pp_ep_train_memory_grows_with_the_micro_batches_and_is_refused_beyond_memory(monkeypatch):
    from moe_repro.runtime import launch
    from moe_repro.suites.pp_ep_train import SUITE, memory_bytes

    small = {k: v[0] for k, v in SUITE.params.items()}
    big = {**small, "micro_batches": 1024, "micro_batch_size": 1024}
    assert memory_bytes(big) > 100 * memory_bytes(small)
    monkeypatch.setattr(
        launch, "available_memory_bytes", lambda: (memory_bytes(small) + memory_bytes(big)) / 2
    )
    assert len(SUITE.grid({})) == 1
    with pytest.raises(ValueError, match="GiB of memory available here"):
        SUITE.grid({"micro_batches": [1024], "micro_batch_size": [1024]})


def test_pp_ep_train_memory_estimate_is_near_what_a_real_run_holds(tmp_path, results_dir):
    """The estimate against the trainer's own measurement of a small GPipe run (every
    micro-batch in flight): within a factor of two of its peak bytes, summed over stages."""
    from moe_repro.suites.pp_ep_train import SUITE, memory_bytes

    out = tmp_path / "t.json"
    r = repro(
        "train",
        "--pp",
        "2",
        "--schedule",
        "gpipe",
        "--micro-batches",
        "4",
        "--micro-batch-size",
        "32",
        "--steps",
        "1",
        "--json",
        str(out),
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    import json

    measured = sum(s["peak_bytes"] for s in json.loads(out.read_text())["per_stage"])
    point = {
        **{k: v[0] for k, v in SUITE.params.items()},
        "pp": 2,
        "schedule": "gpipe",
        "micro_batches": 4,
        "micro_batch_size": 32,
        "steps": 1,
    }
    assert measured / 2 < memory_bytes(point) < 2 * measured, (memory_bytes(point), measured)


def test_every_suite_checks_the_memory_its_parameters_size(monkeypatch):
    """With no memory available, every suite's quick grid is refused by its memory rule, unless
    every point of it is simulated (those allocate nothing at the point's size)."""
    from moe_repro.runtime import launch
    from moe_repro.suites import all_suites

    monkeypatch.setattr(launch, "available_memory_bytes", lambda: 1.0)
    unchecked = []
    for name, suite in sorted(all_suites().items()):
        try:
            grid = suite.grid({}, quick=True)
        except ValueError as e:
            assert "GiB of memory available here" in str(e), (name, str(e))
            continue
        if not all(p.get("simulated") for p in grid):
            unchecked.append(name)
    assert unchecked == []


@pytest.mark.parametrize(
    "suite, args",
    [
        ("imbalance", ["--ep", "4096", "--experts", "4096"]),
        ("imbalance", ["--mode", "simulated", "--steps", "10000", "--tokens", "16M"]),
        ("feplb-balancer", ["--ep", "4096", "--experts", "65536"]),
        (
            "eplb-policy",
            [
                "--nodes",
                "8",
                "--gpus-per-node",
                "64",
                "--experts",
                "65536",
                "--tokens",
                "4096",
                "--micro-batches",
                "64",
                "--policy",
                "global",
            ],
        ),
        # the routing draw (a score per token and expert) outgrows the rows sent
        (
            "alltoall",
            [
                "--nodes",
                "1",
                "--tokens",
                "1M",
                "--experts",
                "65536",
                "--top-k",
                "1",
                "--hidden",
                "1",
            ],
        ),
        (
            "dispatch-stages",
            ["--tokens", "1M", "--experts", "65536", "--top-k", "1", "--hidden", "1"],
        ),
        (
            "alltoall-validation",
            ["--sizes", "64M", "--experts", "65536", "--top-k", "1", "--hidden", "1"],
        ),
        # the router's [S, E] scores; the capacity-padded layer's [S, E, C] masks (quadratic in S)
        (
            "moe-layer",
            [
                "--impl",
                "pft",
                "--tokens",
                "1M",
                "--experts",
                "65536",
                "--top-k",
                "1",
                "--d-model",
                "1",
                "--d-ffn",
                "1",
            ],
        ),
        ("moe-layer", ["--impl", "padded", "--tokens", "64K"]),
        ("moe-dispatch", ["--impl", "padded", "--tokens", "64K"]),
        (
            "llep-layer",
            [
                "--tokens",
                "1M",
                "--experts",
                "65536",
                "--top-k",
                "1",
                "--d-model",
                "1",
                "--d-ffn",
                "1",
            ],
        ),
        (
            "ssmb-memory",
            [
                "--ranks",
                "1",
                "--seq",
                "1M",
                "--experts",
                "65536",
                "--top-k",
                "1",
                "--hidden",
                "1",
                "--expert-ffn",
                "1",
                "--dense-ffn",
                "4",
            ],
        ),
    ],
)
def test_suites_sized_beyond_memory_are_refused_before_work(suite, args, results_dir):
    _refused_for_memory(repro("bench", suite, *args), results_dir)


def test_the_padded_layers_memory_grows_with_the_square_of_its_tokens():
    """GShard's masks are [S, E, C] with C proportional to S: doubling the tokens of a padded
    point about quadruples what it needs, while the padding-free layer's about doubles."""
    from moe_repro.suites.moe_layer import SUITE
    from moe_repro.suites._moe_stages import _layer_bytes

    base = {k: v[0] for k, v in SUITE.params.items()}
    grow = {
        impl: _layer_bytes({**base, "impl": impl, "tokens": 2**16})
        / _layer_bytes({**base, "impl": impl, "tokens": 2**15})
        for impl in ("padded", "pft")
    }
    assert grow["padded"] > 3.5 and grow["pft"] < 2.5, grow


# --- an estimate before long work ----------------------------------------------------------------


def _first_stderr_lines_then_ctrl_c(tmp_path, *args, lines: int = 1) -> tuple[list[str], int, str]:
    """Start `repro ARGS`, read its first stderr ``lines``, then interrupt it (the long work is
    never waited for): (those lines, exit code, the rest of stderr)."""
    import threading

    env = {**os.environ, "MOE_REPRO_RESULTS": str(tmp_path / "results")}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from moe_repro.entry import main; main()", *args],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    first: list[str] = []
    reader = threading.Thread(
        target=lambda: first.extend(proc.stderr.readline() for _ in range(lines)), daemon=True
    )
    reader.start()
    reader.join(patient(60))
    try:
        proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()
        proc.wait(timeout=patient(60))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return first + [""] * (lines - len(first)), proc.returncode, rest


def test_bench_imbalance_says_its_points_and_expected_time_first(tmp_path):
    (line, progress), code, rest = _first_stderr_lines_then_ctrl_c(
        tmp_path, "bench", "imbalance", lines=2
    )
    assert line.startswith("repro: 3120 grid points, expected to take about "), line
    assert progress.startswith("[1/3120] imbalance"), (
        progress
    )  # the progress lines follow, as before
    assert code == 130, (code, rest[-1000:])


def test_run_full_says_its_expected_time_first(tmp_path):
    (line,), code, rest = _first_stderr_lines_then_ctrl_c(tmp_path, "run", "xmoe-fig11", "--full")
    assert line.startswith("repro: xmoe-fig11 --full, expected to take about "), line
    assert code == 130, (code, rest[-1000:])


def test_a_short_run_prints_no_estimate():
    from moe_repro.cli.run_cmd import estimate_line, run_minutes
    from moe_repro.suites import get_suite

    assert estimate_line(["xmoe-fig11"], run_minutes(["xmoe-fig11"])) is None
    imbalance = get_suite("imbalance")
    from moe_repro import catalog

    seconds, basis = imbalance.estimated_seconds(imbalance.grid({}, quick=True))
    assert seconds < catalog.LONG_RUN_S and catalog.long_run_line("x", seconds, basis) is None


def test_the_estimate_adds_up_the_points_and_formats_hours():
    from moe_repro import catalog
    from moe_repro.suites import get_suite

    imbalance = get_suite("imbalance")
    grid = imbalance.grid({})
    seconds, _ = imbalance.estimated_seconds(grid)
    assert seconds == pytest.approx(sum(imbalance.point_seconds(p) for p in grid))
    assert imbalance.estimated_seconds(grid + grid)[0] == pytest.approx(2 * seconds)
    assert (
        catalog.long_run_line("n points", 3 * 3600 + 20 * 60, "b")
        == "repro: n points, expected to take about 3 h 20 min (b); Ctrl-C keeps what finished"
    )
    assert catalog.long_run_line("n points", 600, "b").startswith(
        "repro: n points, expected to take about 10 min"
    )
    # a suite with no declared cost scales the catalog's timing of its default grid
    gemm = get_suite("gemm")
    default = gemm.grid({})
    assert gemm.estimated_seconds(default)[0] == pytest.approx(60 * catalog.suite("gemm").minutes)
    assert gemm.estimated_seconds(default * 3)[0] == pytest.approx(
        180 * catalog.suite("gemm").minutes
    )


def test_every_reproduction_with_a_full_run_has_its_time_in_the_catalog():
    from moe_repro import catalog
    from moe_repro.reproductions import all_reproductions

    missing = [
        rid
        for rid, r in all_reproductions().items()
        if r.full and not catalog.REPRODUCTIONS[rid].full_minutes
    ]
    assert missing == []
