import copy
import json
import random
import subprocess
import sys

import pytest

from moe_repro.records.gate import compare, exit_code, load_entries
from moe_repro.records.stats import mann_whitney_u


def gate(*args):
    return subprocess.run(
        [sys.executable, "-c", "from moe_repro.cli import main; main()", "gate", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def suite_payload(seed, scale=1.0, n_samples=7):
    """A stored bench result with jittered samples (+-2%), time scaled by ``scale``."""
    rng = random.Random(seed)
    records = []
    for n in (256, 512):
        base = 1e-3 * (n / 256) ** 3
        times = [base * scale * (1 + rng.uniform(-0.02, 0.02)) for _ in range(n_samples)]
        tflops = [2 * n**3 / t / 1e12 for t in times]
        med = sorted(times)[len(times) // 2]
        records.append(
            {
                "suite": "gemm",
                "n": n,
                "dtype": "float32",
                "time_s": med,
                "tflops": 2 * n**3 / med / 1e12,
                "correct": True,
                "wrong": 0,
                "samples": {"time_s": times, "tflops": tflops},
            }
        )
    return {
        "suite": "gemm",
        "params": ["n", "dtype"],
        "metrics": [
            {"name": "time_s", "unit": "s", "better": "lower", "kind": "measured"},
            {"name": "tflops", "unit": "TFLOP/s", "better": "higher", "kind": "measured"},
        ],
        "records": records,
        "environment": {"timestamp": "2026-11-21T00:00:00+00:00"},
    }


@pytest.fixture
def dirs(tmp_path):
    def write(name, payload):
        d = tmp_path / name
        d.mkdir(exist_ok=True)
        (d / "gemm.json").write_text(json.dumps(payload))
        return str(d)

    return write


def test_mann_whitney_exact_small_samples():
    # fully separated 5 vs 5: p = 2 / C(10, 5) = 2/252
    assert mann_whitney_u([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])[1] == pytest.approx(2 / 252)
    # interleaved: U = 10, P(U <= 10) = 87/252 -> two-sided 174/252
    assert mann_whitney_u([1, 3, 5, 7, 9], [2, 4, 6, 8, 10]) == (10.0, pytest.approx(174 / 252))


def test_identical_results_pass(dirs):
    p = suite_payload(1)
    res = gate("--baseline", dirs("a", p), "--current", dirs("b", copy.deepcopy(p)))
    assert res.returncode == 0, res.stdout + res.stderr


def test_twenty_percent_slowdown_is_a_regression(dirs, tmp_path):
    out = tmp_path / "g.json"
    res = gate(
        "--baseline",
        dirs("a", suite_payload(1)),
        "--current",
        dirs("b", suite_payload(2, scale=1.2)),
        "--json",
        str(out),
    )
    assert res.returncode == 1, res.stdout + res.stderr
    findings = json.loads(out.read_text())["findings"]
    regressed = {(f["key"], f["metric"]) for f in findings if f["status"] == "regression"}
    assert regressed == {
        ("n=256 dtype=float32", "time_s"),
        ("n=512 dtype=float32", "time_s"),
        ("n=256 dtype=float32", "tflops"),
        ("n=512 dtype=float32", "tflops"),
    }
    assert all(f["p_value"] < 0.05 for f in findings if f["status"] == "regression")


def test_speedup_is_reported_as_improvement_and_passes(dirs):
    res = gate(
        "--baseline",
        dirs("a", suite_payload(1)),
        "--current",
        dirs("b", suite_payload(2, scale=0.8)),
    )
    assert res.returncode == 0 and "improvement" in res.stdout


def test_noise_below_threshold_passes_with_fresh_jitter(dirs):
    res = gate(
        "--baseline",
        dirs("a", suite_payload(1)),
        "--current",
        dirs("b", suite_payload(3, scale=1.01)),
    )
    assert res.returncode == 0, res.stdout


def test_large_but_insignificant_change_passes():
    # medians 10% apart but the samples overlap completely: not a real change
    b = suite_payload(1)
    c = copy.deepcopy(b)
    rec_b, rec_c = b["records"][0], c["records"][0]
    rec_b["samples"]["time_s"] = [1.0, 1.5, 1.0, 1.5, 1.0, 1.5, 1.2]
    rec_c["samples"]["time_s"] = [1.5, 1.0, 1.5, 1.0, 1.5, 1.0, 1.32]
    rec_b["time_s"], rec_c["time_s"] = 1.2, 1.32
    findings = compare(_entries(b), _entries(c))
    f = next(f for f in findings if f.key.startswith("n=256") and f.metric == "time_s")
    assert f.status == "unchanged" and f.p_value > 0.05


def test_missing_result_has_its_own_code(dirs):
    b = suite_payload(1)
    c = copy.deepcopy(b)
    c["records"] = c["records"][:1]
    res = gate("--baseline", dirs("a", b), "--current", dirs("b", c))
    assert res.returncode == 3, res.stdout


def test_analytic_change_of_any_size_fails(tmp_path):
    cell = {
        "row": "Mixtral 8x7B",
        "column": "Latency",
        "paper": 52.6,
        "ours": 56.371,
        "unit": "ms",
        "verdict": "deviates",
    }
    b = {"id": "piper-table4", "how": "A", "cells": [cell], "environment": {}}
    c = copy.deepcopy(b)
    c["cells"][0]["ours"] = 56.371 * (1 + 1e-6)
    assert exit_code(compare(_entries(b), _entries(c))) == 1
    assert exit_code(compare(_entries(b), _entries(copy.deepcopy(b)))) == 0


def test_correctness_loss_fails_even_if_faster():
    b = suite_payload(1)
    c = copy.deepcopy(b)
    c["records"][0]["correct"] = False
    assert exit_code(compare(_entries(b), _entries(c))) == 1


def test_bad_input_exit_2(dirs):
    assert gate("--baseline", "/nonexistent", "--current", "/nonexistent").returncode == 2
    p = dirs("a", suite_payload(1))
    assert gate("--baseline", p, "--current", p, "--threshold", "lots").returncode == 2


def test_a_side_without_records_is_bad_input_not_all_missing(dirs, tmp_path):
    base = dirs("a", suite_payload(1))
    (tmp_path / "empty").mkdir()
    res = gate("--baseline", base, "--current", str(tmp_path / "empty"))
    assert res.returncode == 2 and "no results found" in res.stderr, res.stdout
    assert gate("--baseline", str(tmp_path / "empty"), "--current", base).returncode == 2


def test_an_unreadable_result_file_is_bad_input_naming_it(dirs, tmp_path):
    base = dirs("a", suite_payload(1))
    broken = dict(suite_payload(2), records="many")  # wrong type in a field
    current = dirs("b", broken)
    res = gate("--baseline", base, "--current", current)
    assert res.returncode == 2 and "gemm.json" in res.stderr and "records" in res.stderr


def test_a_fifo_beside_results_is_skipped_with_a_warning_and_bad_input_is_one_line(dirs, tmp_path):
    import os

    p = suite_payload(1)
    base, current = dirs("a", p), dirs("b", copy.deepcopy(p))
    os.mkfifo(tmp_path / "b" / "pipe.json")  # opening it would wait for a writer
    res = gate("--baseline", base, "--current", current)
    assert res.returncode == 0 and "skipped" in res.stderr and "pipe.json" in res.stderr, res.stderr
    # With an unreadable result beside the FIFO, the run is bad input: its one error line
    # alone (a fuzz case pointing the gate at / found a FIFO first and printed three lines)
    (tmp_path / "b" / "broken.json").write_text(json.dumps(dict(suite_payload(2), records="many")))
    res = gate("--baseline", base, "--current", current)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "broken.json" in lines[0], res.stderr


def _entries(payload):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "x.json"
        f.write_text(json.dumps(payload))
        return load_entries(f)


def test_simulated_records_are_compared_exactly():
    b = suite_payload(1)
    for r in b["records"]:
        r["simulated"], r["samples"] = True, {}
    c = copy.deepcopy(b)
    c["records"][0]["time_s"] *= 1.001  # far below the 5% threshold, but a model changed
    findings = compare(_entries(b), _entries(c))
    assert exit_code(findings) == 1
    assert {f.kind for f in findings} == {"exact"}


def test_a_path_the_file_system_cannot_hold_is_bad_input():
    from moe_repro.records.gate import GateInputError, load_entries

    with pytest.raises(GateInputError, match="File name too long"):
        load_entries("x" * 300)
