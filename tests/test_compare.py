"""repro compare and repro gate --history on stores built here: a planted 2x regression in one
suite between two commits is named by both, and a store of A/A runs flags nothing."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from moe_repro.records.compare import CompareInputError, compare_runs, format_comparison
from moe_repro.records.history import flag_store
from moe_repro.records.record import SuiteRecord
from moe_repro.records.store import ResultsStore

C1, C2 = "1111aaaa" + "0" * 32, "2222bbbb" + "0" * 32
SUITES = {"gemm": 9.5e-3, "memcopy": 2.0e-3, "moe-dispatch": 1.5e-3}


def _suite_record(name, level, commit, stamp, rng, noise=0.03, load=None):
    records = []
    for n in (256, 512):
        base = level * n / 256
        times = [base * (1 + rng.gauss(0, noise)) for _ in range(7)]
        records.append(
            {
                "suite": name,
                "n": n,
                "time_s": sorted(times)[3],
                "samples": {"time_s": times},
                "correct": True,
                "wrong": 0,
                **({"load_start": load, "load_end": load} if load is not None else {}),
            }
        )
    return SuiteRecord(
        suite=name,
        params=["n"],
        metrics=[{"name": "time_s", "unit": "s", "better": "lower", "kind": "measured"}],
        records=records,
        environment={
            "timestamp": stamp,
            "git_commit": commit,
            "git_dirty": False,
            "noise": {"cpu_count": 2, **({"load_start": [load] * 3} if load else {})},
        },
    )


def build_store(root, planted: float | None, runs_per_commit=3, seed=0):
    """Runs of three suites at two commits; ``planted``: gemm's time at C2 times this."""
    store = ResultsStore(root)
    rng = random.Random(seed)
    minute = 0
    for commit in (C1, C2):
        for _ in range(runs_per_commit):
            for name, level in SUITES.items():
                scale = planted if (planted and commit == C2 and name == "gemm") else 1.0
                stamp = f"2026-11-28T08:{minute:02d}:00+00:00"
                store.save(_suite_record(name, level * scale, commit, stamp, rng))
            minute += 1
    return store


def test_compare_names_the_planted_regression_and_only_it(tmp_path):
    store = build_store(tmp_path, planted=2.0)
    comparison = compare_runs(store, C1[:8], C2[:8])
    slower = {(r.suite, r.params) for r in comparison.slower()}
    assert slower == {("gemm", "n=256"), ("gemm", "n=512")}
    for row in comparison.slower():
        assert row.ratio == pytest.approx(2.0, rel=0.15) and row.p_value < 0.05
    assert not [r for r in comparison.rows if r.suite != "gemm" and r.verdict == "slower"]
    text = format_comparison(comparison)
    assert "slower" in text and "gemm" in text and "commit 1111aaaa" in text


def test_compare_of_a_a_commits_has_no_slower_row(tmp_path):
    store = build_store(tmp_path, planted=None)
    comparison = compare_runs(store, C1[:8], C2[:8])
    assert comparison.rows and not comparison.slower()
    assert not [r for r in comparison.rows if r.verdict == "faster"]


def test_history_names_the_planted_regression_and_only_it(tmp_path):
    store = build_store(tmp_path, planted=2.0)
    flags = flag_store(store)
    assert {(f.series.result, f.series.key, f.step.kind, f.open) for f in flags} == {
        ("gemm", "n=256", "regression", True),
        ("gemm", "n=512", "regression", True),
    }
    assert all(f.commit == C2 and f.step.index == 3 for f in flags)


def test_history_of_a_a_runs_flags_nothing(tmp_path):
    for seed in range(5):
        store = build_store(tmp_path / str(seed), planted=None, runs_per_commit=4, seed=seed)
        assert flag_store(store) == []


def test_a_wall_clock_step_beside_a_loaded_run_is_named_but_does_not_fail(tmp_path):
    store = ResultsStore(tmp_path)
    rng = random.Random(1)
    for i, (commit, level, load) in enumerate([(C1, 1e-3, 1.0)] * 3 + [(C2, 2e-3, 18.0)] * 3):
        stamp = f"2026-11-28T08:{i:02d}:00+00:00"
        store.save(_suite_record("gemm", level, commit, stamp, rng, load=load))
    flags = flag_store(store)
    assert flags and all(f.open and f.loaded and not f.fails for f in flags)
    comparison = compare_runs(store, C1[:8], C2[:8])
    rows = [r for r in comparison.rows if r.metric == "time_s"]
    assert rows and {r.verdict for r in rows} == {"noisy"}
    assert comparison.noise_a == "load average up to 1 on 2 cores"
    assert comparison.noise_b.startswith("load average up to 18 on 2 cores (loaded")
    assert "loaded" in format_comparison(comparison).splitlines()[1]


def test_a_run_is_named_by_its_file(tmp_path):
    store = build_store(tmp_path, planted=2.0, runs_per_commit=1)
    first, last = store.history("suite", "gemm")
    comparison = compare_runs(store, f"gemm/{first.stem}", f"gemm/{last.stem}")
    assert comparison.a.startswith("run gemm/") and len(comparison.slower()) == 2
    assert {r.suite for r in comparison.rows} == {"gemm"}
    comparison = compare_runs(store, first.stem, last.stem)  # every suite stored under it
    assert {r.suite for r in comparison.rows} == set(SUITES)
    assert {r.suite for r in comparison.slower()} == {"gemm"}
    comparison = compare_runs(store, str(first), str(last))
    assert len(comparison.slower()) == 2


def test_unknown_and_ambiguous_names_are_refused(tmp_path):
    store = build_store(tmp_path, planted=None, runs_per_commit=1)
    with pytest.raises(CompareInputError, match="no stored run or commit named 'beef'"):
        compare_runs(store, "beef", C1[:8])
    store.save(
        _suite_record(
            "gemm", 1e-3, "1111abcd" + "0" * 32, "2026-11-28T09:00:00+00:00", random.Random()
        )
    )
    with pytest.raises(CompareInputError, match="start of 2 commits"):
        compare_runs(store, "1111", C2[:8])


def _repro(*args):
    return subprocess.run(
        [sys.executable, "-c", "from moe_repro.cli import main; main()", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_compare_and_gate_history_on_the_planted_store(tmp_path):
    planted = tmp_path / "planted"
    build_store(planted, planted=2.0)
    res = _repro("--results", planted, "compare", C1[:8], C2[:8])
    assert res.returncode == 0, res.stderr
    slower = [line for line in res.stdout.splitlines() if line.startswith("slower")]
    assert len(slower) == 2 and all("gemm" in line for line in slower)
    res = _repro("gate", "--history", planted, "--json", tmp_path / "steps.json")
    assert res.returncode == 1, res.stderr
    steps = json.loads((tmp_path / "steps.json").read_text())["steps"]
    assert {(s["result"], s["kind"], s["open"]) for s in steps} == {("gemm", "regression", True)}
    assert "open regression" in res.stdout and "gemm" in res.stdout

    quiet = tmp_path / "aa"
    build_store(quiet, planted=None)
    res = _repro("gate", "--history", quiet)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 open regression(s)" in res.stdout


@pytest.mark.parametrize(
    "args, words",
    [
        (["compare", "nosuch", "beef"], "no stored run or commit named 'nosuch'"),
        (["gate", "--history", "{missing}"], "not a directory"),
        (["gate", "--history", "{empty}"], "no stored runs"),
        (["gate", "--history", "{empty}", "--current", "x"], "without --baseline/--current"),
        (["gate"], "give --baseline and --current, or --history STORE"),
        (["gate", "--history", "{empty}", "--min-step", "lots"], "--min-step"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, words):
    (tmp_path / "empty").mkdir()
    args = [a.format(missing=tmp_path / "nope", empty=tmp_path / "empty") for a in args]
    res = _repro("--results", tmp_path / "empty", *args)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in res.stderr
