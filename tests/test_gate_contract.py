"""The gate's exit-code contract (issue 17): 0 pass, 1 regression, 2 bad input, 3 missing,
4 internal error; non-finite current values never pass; the Mann-Whitney p-value is exact for
small samples. Every case runs the real `repro gate` command in its own process."""

import json
import math
import subprocess
import sys
from math import comb

import pytest

from moe_repro.records.stats import mann_whitney_u

MAIN = "from moe_repro.cli import main; main()"
GATE = [sys.executable, "-c", MAIN, "gate"]


def gate(*args, prelude=""):
    """Run `repro gate ARGS`; ``prelude`` is Python run first in that process (fault injection)."""
    cmd = [sys.executable, "-c", f"{prelude}\n{MAIN}", "gate"]
    return subprocess.run([*cmd, *map(str, args)], capture_output=True, text=True, timeout=60)


def suite(times_256=(1.00, 1.01, 0.99, 1.02, 0.98), times_512=(8.0, 8.1, 7.9, 8.2, 7.8)):
    """A stored bench result: two grid points, time_s measured with its samples."""
    records = []
    for n, times in ((256, times_256), (512, times_512)):
        records.append(
            {
                "suite": "gemm",
                "n": n,
                "time_s": sorted(times)[len(times) // 2],
                "correct": True,
                "samples": {"time_s": list(times)},
            }
        )
    return {
        "suite": "gemm",
        "params": ["n"],
        "metrics": [{"name": "time_s", "unit": "s", "better": "lower", "kind": "measured"}],
        "records": records,
        "environment": {"timestamp": "2026-11-21T00:00:00+00:00"},
    }


def reproduction(ours=56.371):
    cell = {
        "row": "Mixtral 8x7B",
        "column": "Latency",
        "paper": 52.6,
        "ours": ours,
        "unit": "ms",
        "verdict": "deviates",
    }
    return {"id": "piper-table4", "how": "A", "cells": [cell], "environment": {}}


@pytest.fixture
def write(tmp_path):
    def write(name, payload):
        path = tmp_path / name
        path.write_text(payload if isinstance(payload, str) else json.dumps(payload))
        return path

    return write


def assert_one_line_error(res, code, *words):
    assert res.returncode == code, (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    for w in words:
        assert w in res.stderr, (w, res.stderr)


def findings(path):
    return json.loads(path.read_text())["findings"]


# ---- the documented contract ---------------------------------------------------------------


def test_help_documents_every_exit_code_and_non_finite_values():
    res = subprocess.run([*GATE, "--help"], capture_output=True, text=True, timeout=60)
    text = " ".join(res.stdout.split())
    for line in (
        "0 pass",
        "1 regression",
        "2 bad input",
        "3 missing",
        "4 internal error",
        "not finite",
    ):
        assert line in text, line


def test_exit_0_when_nothing_changed(write):
    b = write("b.json", suite())
    res = gate("--baseline", b, "--current", write("c.json", suite()))
    assert res.returncode == 0, res.stdout + res.stderr


def test_exit_1_on_a_regression(write):
    res = gate(
        "--baseline",
        write("b.json", reproduction()),
        "--current",
        write("c.json", reproduction(57.0)),
    )
    assert res.returncode == 1 and "regression" in res.stdout, res.stdout + res.stderr


def test_exit_3_when_a_baseline_result_is_missing(write):
    c = suite()
    c["records"] = c["records"][:1]
    res = gate("--baseline", write("b.json", suite()), "--current", write("c.json", c))
    assert res.returncode == 3 and "missing" in res.stdout, res.stdout + res.stderr


def test_exit_4_on_an_internal_error_one_line_no_traceback(write):
    # A fault injected inside the comparison stands for any bug in the gate: it must be told
    # apart from both a regression (1) and bad input (2).
    prelude = (
        "import moe_repro.records.gate as g\n"
        "def broken(*a, **k):\n    raise KeyError('injected fault')\n"
        "g._compare_one = broken"
    )
    b = write("b.json", suite())
    res = gate("--baseline", b, "--current", b, prelude=prelude)
    assert_one_line_error(res, 4, "internal error", "injected fault")


# ---- exit 2: bad input, one case per test --------------------------------------------------


def test_missing_file_is_bad_input(write, tmp_path):
    res = gate("--baseline", write("b.json", suite()), "--current", tmp_path / "nope.json")
    assert_one_line_error(res, 2, "nope.json")


@pytest.mark.parametrize("side", ["baseline", "current"])
def test_malformed_json_is_bad_input_on_either_side(write, side):
    good, bad = write("good.json", suite()), write("bad.json", '{"suite": "gemm", "records": [')
    args = (
        ("--baseline", bad, "--current", good)
        if side == "baseline"
        else ("--baseline", good, "--current", bad)
    )
    assert_one_line_error(gate(*args), 2, side, "bad.json", "not JSON")


def test_empty_file_is_bad_input(write):
    res = gate("--baseline", write("b.json", suite()), "--current", write("c.json", ""))
    assert_one_line_error(res, 2, "c.json", "empty file")


@pytest.mark.parametrize("content", ["[]", "{}"])
def test_a_file_holding_no_records_is_bad_input(write, content):
    res = gate("--baseline", write("b.json", suite()), "--current", write("c.json", content))
    assert_one_line_error(res, 2, "c.json")


def test_wrong_kind_of_records_is_bad_input_not_all_missing(write):
    # reproductions against a suite baseline: the wrong file, not every suite result missing
    res = gate("--baseline", write("b.json", suite()), "--current", write("c.json", reproduction()))
    assert_one_line_error(res, 2, "reproduction", "suite")


def test_an_unknown_record_kind_is_bad_input(write):
    res = gate(
        "--baseline",
        write("b.json", suite()),
        "--current",
        write("c.json", {**suite(), "kind": "banana", "schema_version": 2}),
    )
    assert_one_line_error(res, 2, "c.json", "banana")


def test_records_failing_the_schema_are_bad_input(write):
    broken = suite()
    broken["metrics"][0]["better"] = "faster"  # not one of higher, lower, none
    res = gate("--baseline", write("b.json", suite()), "--current", write("c.json", broken))
    assert_one_line_error(res, 2, "c.json", "better")


def test_a_metric_that_is_not_a_number_is_bad_input(write):
    c = suite()
    c["records"][0]["time_s"] = "fast"
    res = gate("--baseline", write("b.json", suite()), "--current", write("c.json", c))
    assert_one_line_error(res, 2, "c.json", "time_s", "not a number")


def test_json_output_in_a_missing_directory_is_bad_input_and_not_created(write, tmp_path):
    b = write("b.json", suite())
    res = gate("--baseline", b, "--current", b, "--json", tmp_path / "no" / "such" / "g.json")
    assert_one_line_error(res, 2, "--json", "does not exist")
    assert not (tmp_path / "no").exists()
    assert res.stdout == ""  # refused before comparing anything


def test_unwritable_json_output_is_bad_input_not_a_regression(write, tmp_path):
    # a regression with an unwritable --json: CI must see "broken" (2), not "slower" (1)
    b, c = write("b.json", reproduction()), write("c.json", reproduction(57.0))
    (tmp_path / "a-file").write_text("")
    res = gate("--baseline", b, "--current", c, "--json", tmp_path / "a-file" / "g.json")
    assert_one_line_error(res, 2, "--json")


def test_json_output_in_a_directory_that_refuses_writes_is_bad_input(write, tmp_path):
    # /proc refuses new files even for root, for whom permission bits would not
    b = write("b.json", suite())
    res = gate("--baseline", b, "--current", b, "--json", "/proc/gate.json")
    assert_one_line_error(res, 2, "--json", "cannot write")


@pytest.mark.parametrize("threshold", ["lots", "-5%", "nan", "inf", "1000%", ""])
def test_bad_threshold_is_bad_input(write, threshold):
    b = write("b.json", suite())
    assert_one_line_error(
        gate("--baseline", b, "--current", b, "--threshold", threshold), 2, "threshold"
    )


@pytest.mark.parametrize("pair", ["gemm", "=5%", "gemm=fast"])
def test_bad_suite_threshold_is_bad_input(write, pair):
    b = write("b.json", suite())
    assert_one_line_error(
        gate("--baseline", b, "--current", b, "--suite-threshold", pair), 2, "threshold"
    )


@pytest.mark.parametrize("alpha", ["nan", "0", "1.5", "often"])
def test_bad_alpha_is_bad_input(write, alpha):
    b = write("b.json", suite())
    assert_one_line_error(gate("--baseline", b, "--current", b, "--alpha", alpha), 2, "--alpha")


# ---- non-finite current values never pass --------------------------------------------------


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_analytic_value_is_a_regression(write, tmp_path, value):
    out = tmp_path / "g.json"
    res = gate(
        "--baseline",
        write("b.json", reproduction()),
        "--current",
        write("c.json", reproduction(value)),
        "--json",
        out,
    )
    assert res.returncode == 1, res.stdout + res.stderr
    (f,) = findings(out)
    assert f["status"] == "regression" and "not finite" in f["why"]


def test_non_finite_measured_median_is_a_regression(write, tmp_path):
    c = suite()
    c["records"][1]["time_s"] = math.nan
    out = tmp_path / "g.json"
    res = gate(
        "--baseline", write("b.json", suite()), "--current", write("c.json", c), "--json", out
    )
    assert res.returncode == 1, res.stdout + res.stderr
    bad = [f for f in findings(out) if f["status"] == "regression"]
    assert [(f["key"], f["metric"]) for f in bad] == [("n=512", "time_s")]
    assert "not finite" in bad[0]["why"]


def test_a_non_finite_measured_sample_is_a_regression_even_with_a_good_median(write, tmp_path):
    c = suite()
    c["records"][0]["samples"]["time_s"][3] = math.inf  # the median (1.00) is untouched
    out = tmp_path / "g.json"
    res = gate(
        "--baseline", write("b.json", suite()), "--current", write("c.json", c), "--json", out
    )
    assert res.returncode == 1, res.stdout + res.stderr
    bad = [f for f in findings(out) if f["status"] == "regression"]
    assert [f["key"] for f in bad] == ["n=256"] and "sample is not finite" in bad[0]["why"]


def test_a_non_finite_baseline_fixed_in_current_does_not_fail(write, tmp_path):
    out = tmp_path / "g.json"
    res = gate(
        "--baseline",
        write("b.json", reproduction(math.nan)),
        "--current",
        write("c.json", reproduction()),
        "--json",
        out,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert findings(out)[0]["status"] == "improvement"


# ---- Mann-Whitney: exact for small samples (scipy) -----------------------------------------


def normal_approximation_p(u, n1, n2):
    """The old gate's p-value: normal approximation to U with continuity correction, no ties."""
    mu, sigma = n1 * n2 / 2, math.sqrt(n1 * n2 * (n1 + n2 + 1) / 12)
    return math.erfc((abs(u - mu) - 0.5) / sigma / math.sqrt(2))


def test_exact_p_of_complete_separation_four_against_four():
    # 1 of C(8, 4) = 70 orderings puts all of x below y; two-sided doubles it
    u, p = mann_whitney_u([1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0])
    assert u == 0 and p == pytest.approx(2 / 70, rel=1e-12)
    assert normal_approximation_p(0, 4, 4) == pytest.approx(0.0304, abs=1e-4)  # not 0.0286


def test_exact_and_normal_approximation_disagree_at_alpha_0_05():
    # 4 baseline repeats against 8, U = 4: P(U <= u) counts the partitions of u into at most 4
    # parts of size <= 8, for u = 0..4: 1 + 1 + 2 + 3 + 5 = 12 of C(12, 4) = 495 orderings.
    exact = 2 * 12 / comb(12, 4)
    x = [9.5, 9.501, 9.502, 13.503]  # the last value is above exactly 4 of y
    y = [10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 17.0]
    u, p = mann_whitney_u(x, y)
    assert u == 4 and p == pytest.approx(exact, rel=1e-12)
    assert p < 0.05 <= normal_approximation_p(u, 4, 8)  # the old test would call it noise


def test_gate_calls_a_change_significant_that_the_normal_approximation_would_not(write, tmp_path):
    b = suite(times_256=(9.5, 9.501, 9.502, 13.503))
    c = suite(times_256=(10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 17.0))
    out = tmp_path / "g.json"
    res = gate("--baseline", write("b.json", b), "--current", write("c.json", c), "--json", out)
    assert res.returncode == 1, res.stdout + res.stderr
    f = next(f for f in findings(out) if f["key"] == "n=256")
    assert f["status"] == "regression" and f["p_value"] == pytest.approx(24 / 495, rel=1e-12)


def test_ties_use_the_tie_corrected_normal_approximation():
    # with ties there is no exact distribution of U to use; the formula is written out here
    x, y = [1.0, 1.0, 2.0, 2.0, 3.0], [2.0, 3.0, 3.0, 4.0, 4.0]
    ties = [2, 3, 3, 2]  # the values 1, 2, 3, 4 occur this many times in the pooled sample
    n1, n2 = 5, 5
    u = 0 + 0 + 0.5 + 0.5 + (1 + 2 * 0.5)  # per x: the y below it, half for each equal y
    n = n1 + n2
    sigma = math.sqrt(n1 * n2 / 12 * ((n + 1) - sum(t**3 - t for t in ties) / (n * (n - 1))))
    expected = math.erfc((abs(u - n1 * n2 / 2) - 0.5) / sigma / math.sqrt(2))
    got_u, p = mann_whitney_u(x, y)
    assert got_u == u and p == pytest.approx(expected, rel=1e-9)


def test_mann_whitney_refuses_an_empty_sample():
    with pytest.raises(ValueError):
        mann_whitney_u([], [1.0])


# ---- nothing exact missed: per-cell kind, null metrics, measured cells listed --------------


def mixed(analytic=100.0, measured=5.0, latency=2.0):
    """A reproduction with analytic and measured cells, as spec.py records them (how per cell)."""
    cells = [
        {
            "row": "model",
            "column": "params (B)",
            "paper": 100.0,
            "ours": analytic,
            "verdict": "match",
            "how": "A",
        },
        {
            "row": "run",
            "column": "throughput",
            "paper": 5.0,
            "ours": measured,
            "verdict": "not-comparable",
            "how": "R",
        },
        {
            "row": "run",
            "column": "latency",
            "paper": 2.0,
            "ours": latency,
            "verdict": "not-comparable",
            "how": "R",
        },
    ]
    cells[0]["verdict"] = "match" if analytic == 100.0 else "deviates"
    return {"id": "piper-fig9", "how": "A+R", "cells": cells, "environment": {}}


def test_an_exact_cell_changed_x1_5_inside_a_mixed_reproduction_fails(write, tmp_path):
    out = tmp_path / "g.json"
    res = gate(
        "--baseline",
        write("b.json", mixed()),
        "--current",
        write("c.json", mixed(analytic=150.0)),
        "--json",
        out,
    )
    assert res.returncode == 1, res.stdout + res.stderr
    by_key = {f["key"]: f for f in findings(out)}
    assert by_key["model | params (B)"]["status"] == "regression"
    assert by_key["model | params (B)"]["kind"] == "exact"


def test_a_measured_cell_moving_is_listed_by_name_as_not_gated(write, tmp_path):
    out = tmp_path / "g.json"
    res = gate(
        "--baseline",
        write("b.json", mixed()),
        "--current",
        write("c.json", mixed(measured=9.0)),
        "--json",
        out,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "not-gated" in res.stdout and "run | throughput" in res.stdout
    statuses = {f["key"]: f["status"] for f in findings(out)}
    assert statuses == {
        "model | params (B)": "unchanged",
        "run | throughput": "not-gated",
        "run | latency": "not-gated",
    }


@pytest.mark.parametrize("which", ["measured cell", "analytic cell"])
def test_a_cell_that_becomes_null_fails(write, which):
    current = mixed()
    current["cells"][1 if which == "measured cell" else 0]["ours"] = None
    current["cells"][0]["verdict"] = "not-reproduced" if which == "analytic cell" else "match"
    res = gate("--baseline", write("b.json", mixed()), "--current", write("c.json", current))
    assert res.returncode == 1 and "null" in res.stdout, res.stdout + res.stderr


def test_a_measured_suite_metric_that_becomes_null_or_nan_fails(write):
    for broken in (None, "NaN"):
        c = suite()
        c["records"][0]["time_s"] = None if broken is None else math.nan
        c["records"][0]["samples"] = {}
        res = gate(
            "--baseline", write("b.json", suite()), "--current", write("c.json", json.dumps(c))
        )
        assert res.returncode == 1, (broken, res.stdout, res.stderr)


def test_a_seeded_monte_carlo_cell_is_compared_exactly(write):
    # M: an expectation from seeded samples, deterministic per seed (catalog.HOW_MEANING)
    b, c = mixed(), mixed()
    for record in (b, c):
        record["how"], record["cells"][0]["how"] = "M+R", "M"
    c["cells"][0]["ours"] = 100.0 * (1 + 1e-6)
    c["cells"][0]["verdict"] = "deviates"
    res = gate("--baseline", write("b.json", b), "--current", write("c.json", c))
    assert res.returncode == 1 and "params (B)" in res.stdout, res.stdout + res.stderr
