"""The gate's inputs, read with limits, and the values it refuses or fails (reliability round
three): a device, a FIFO or a socket named as a side is refused unread (exit 2), a file over the
cap too; a number beyond float's range, a numeric string or a boolean metric is bad input (2); a
negative duration and a non-finite cell graded match are regressions (1); the record `repro
validate` writes into a store does not make the store unreadable to the gate. Every case runs
the real `repro gate` in its own process, under a memory cap, so an unbounded read fails the
test instead of the machine."""

import json
import math
import os
import resource
import socket
import subprocess
import sys

import pytest

from test_gate_contract import assert_one_line_error as one_line
from test_gate_contract import findings

from moe_repro.records.inputs import PLATFORM_LIMIT, RESULT_LIMIT, InputError, read_input

MAIN = "from moe_repro.cli import main; main()"
MEMORY_CAP = 3 * 1024**3  # far above what the gate needs; far below reading /dev/zero to its end


def _cap_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def repro(*args, stdin=None, timeout=60, capped=True):
    """``capped``: under MEMORY_CAP (the commands that read inputs; a run that may start a GPU
    library, which reserves much address space, goes without)."""
    return subprocess.run(
        [sys.executable, "-c", MAIN, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        input=stdin,
        preexec_fn=_cap_memory if capped else None,
    )


def gate(*args, **kw):
    return repro("gate", *args, **kw)


def suite(time_s=1.0, correct=True, samples=None):
    """A stored bench result: one grid point, time_s measured (seconds, lower is better)."""
    record = {"suite": "gemm", "n": 256, "time_s": time_s, "correct": correct}
    if samples is not None:
        record["samples"] = {"time_s": samples}
    return {
        "suite": "gemm",
        "params": ["n"],
        "metrics": [{"name": "time_s", "unit": "s", "better": "lower", "kind": "measured"}],
        "records": [record],
        "environment": {"timestamp": "2026-11-21T00:00:00+00:00"},
    }


def reproduction(ours=52.6, verdict="match", unit="ms"):
    cell = {
        "row": "Mixtral 8x7B",
        "column": "Latency",
        "paper": 52.6,
        "ours": ours,
        "unit": unit,
        "verdict": verdict,
    }
    return {"id": "piper-table4", "how": "A", "cells": [cell], "environment": {}}


@pytest.fixture
def write(tmp_path):
    def write(name, payload):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(payload if isinstance(payload, str) else json.dumps(payload))
        return path

    return write


# ---- inputs that are not regular files, or too large ----------------------------------------


def test_a_device_as_baseline_is_refused_unread(write):
    # /dev/zero never ends: read to its end it takes all memory (the cap above stops it here)
    one_line(
        gate("--baseline", "/dev/zero", "--current", write("c.json", suite())),
        2,
        "/dev/zero",
        "not a regular file",
    )


def test_a_fifo_without_a_writer_as_current_is_refused_at_once(write, tmp_path):
    fifo = tmp_path / "c.json"
    os.mkfifo(fifo)  # no writer ever: opening it for reading would wait forever
    one_line(
        gate("--baseline", write("b.json", suite()), "--current", fifo, timeout=30),
        2,
        "c.json",
        "FIFO",
    )


def test_a_socket_as_current_is_refused(write, tmp_path):
    path = tmp_path / "s.json"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        one_line(
            gate("--baseline", write("b.json", suite()), "--current", path, timeout=30),
            2,
            "s.json: a socket, not a regular file",
        )


def test_a_result_file_over_the_cap_is_refused_unread(write, tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(RESULT_LIMIT + 1)  # sparse: no disk used
    one_line(
        gate("--baseline", write("b.json", suite()), "--current", big), 2, "big.json", "256 MiB"
    )


def test_standard_input_is_read_for_a_dash(write):
    res = gate("--baseline", write("b.json", suite()), "--current", "-", stdin=json.dumps(suite()))
    assert res.returncode == 0 and "2 unchanged" in res.stdout, res.stdout + res.stderr
    slower = gate(
        "--baseline",
        write("b.json", suite()),
        "--current",
        "-",
        stdin=json.dumps(suite(time_s=2.0)),
    )
    assert slower.returncode == 1, slower.stdout + slower.stderr
    one_line(gate("--baseline", "-", "--current", "-", stdin=json.dumps(suite())), 2, "-")


def test_a_dash_with_standard_input_closed_is_bad_input(write):
    def closed_stdin():
        _cap_memory()
        os.close(0)

    res = subprocess.run(
        [
            sys.executable,
            "-c",
            MAIN,
            "gate",
            "--baseline",
            str(write("b.json", suite())),
            "--current",
            "-",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
        preexec_fn=closed_stdin,
    )
    one_line(res, 2, "<stdin>", "closed")


def test_read_input_keeps_to_its_limit(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 10)
    assert read_input(path, 10) == b"x" * 10
    with pytest.raises(InputError, match="larger than"):
        read_input(path, 9)
    with pytest.raises(InputError, match="directory"):
        read_input(tmp_path, 10)
    with pytest.raises(InputError, match="no such file"):
        read_input(tmp_path / "nope", 10)


def test_a_platform_file_over_its_cap_is_refused(tmp_path):
    big = tmp_path / "p.json"
    big.write_text(" " * PLATFORM_LIMIT + "{}")  # valid JSON were it read, but over 1 MiB
    one_line(
        repro("plan", "--model", "tiny-moe", "--platform", big, "--nodes", "1"),
        2,
        "p.json",
        "1 MiB",
    )


def test_a_fifo_as_platform_is_refused_as_one(tmp_path):
    fifo = tmp_path / "p.json"
    os.mkfifo(fifo)
    one_line(
        repro("plan", "--model", "tiny-moe", "--platform", fifo, "--nodes", "1", timeout=30),
        2,
        "p.json",
        "FIFO",
    )


# ---- numbers: strict types, within float's range --------------------------------------------


@pytest.mark.parametrize("literal", ["1" + "0" * 400, "1" + "0" * 5000, "1e400"])
def test_a_number_beyond_float_range_is_bad_input(write, literal):
    text = json.dumps(suite()).replace('"time_s": 1.0', f'"time_s": {literal}')
    assert literal in text
    one_line(
        gate("--baseline", write("b.json", suite()), "--current", write("c.json", text)),
        2,
        "c.json",
        "range of a float",
    )


@pytest.mark.parametrize("value", ["1.2", True])
def test_a_cell_number_that_is_a_string_or_a_boolean_is_bad_input(write, value):
    current = reproduction(verdict="deviates")
    current["cells"][0]["ours"] = value
    one_line(
        gate("--baseline", write("b.json", reproduction()), "--current", write("c.json", current)),
        2,
        "c.json",
        "ours",
    )


@pytest.mark.parametrize("value", ["1.2", True])
def test_a_suite_metric_that_is_a_string_or_a_boolean_is_bad_input(write, value):
    one_line(
        gate(
            "--baseline",
            write("b.json", suite()),
            "--current",
            write("c.json", suite(time_s=value)),
        ),
        2,
        "c.json",
        "time_s",
        "not a number",
    )


def test_correct_is_true_or_false_and_nothing_else(write):
    # the runner stores correct as wrong == 0: a boolean
    b = write("b.json", suite())
    assert gate("--baseline", b, "--current", write("c.json", suite())).returncode == 0
    one_line(
        gate("--baseline", b, "--current", write("c1.json", suite(correct=1))),
        2,
        "correct",
        "not true or false",
    )
    lost = gate("--baseline", b, "--current", write("c2.json", suite(correct=False)))
    assert lost.returncode == 1, lost.stdout + lost.stderr


# ---- impossible values are regressions ------------------------------------------------------


def test_a_negative_time_is_a_regression_not_an_improvement(write, tmp_path):
    out = tmp_path / "g.json"
    res = gate(
        "--baseline",
        write("b.json", suite()),
        "--current",
        write("c.json", suite(time_s=-1)),
        "--json",
        out,
    )
    assert res.returncode == 1, res.stdout + res.stderr
    (bad,) = [f for f in findings(out) if f["metric"] == "time_s"]
    assert bad["status"] == "regression" and "negative" in bad["why"]


def test_a_negative_time_sample_is_a_regression_even_with_a_good_median(write):
    good = [1.0, 1.01, 0.99, 1.02, 0.98]
    res = gate(
        "--baseline",
        write("b.json", suite(samples=good)),
        "--current",
        write("c.json", suite(samples=[1.0, 1.01, -0.99, 1.02, 0.98])),
    )
    assert res.returncode == 1 and "negative" in res.stdout, res.stdout + res.stderr


def test_a_negative_baseline_time_fixed_in_current_passes_as_improvement(write, tmp_path):
    out = tmp_path / "g.json"
    res = gate(
        "--baseline",
        write("b.json", suite(time_s=-1)),
        "--current",
        write("c.json", suite()),
        "--json",
        out,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    (f,) = [f for f in findings(out) if f["metric"] == "time_s"]
    assert f["status"] == "improvement"


def test_a_negative_reproduction_cell_is_a_difference_and_compared_as_one(write):
    # a cell's unit also names differences ("FEPLB below FasterMoE", ms): no sign is imposed
    same = reproduction(ours=-0.064, verdict="no-paper-value")
    assert (
        gate("--baseline", write("b.json", same), "--current", write("c.json", same)).returncode
        == 0
    )


def test_a_nan_in_a_cell_graded_match_is_a_regression(write, tmp_path):
    out = tmp_path / "g.json"
    broken = json.dumps(reproduction(ours=math.nan, verdict="match"))
    res = gate(
        "--baseline",
        write("b.json", reproduction()),
        "--current",
        write("c.json", broken),
        "--json",
        out,
    )
    assert res.returncode == 1, res.stdout + res.stderr
    (f,) = findings(out)
    assert f["status"] == "regression" and "not finite" in f["why"]


# ---- a results store, with what `repro validate` writes into it -----------------------------


def test_a_store_holding_validate_output_is_gated_with_a_note(tmp_path):
    store = tmp_path / "results"
    res = repro("--results", store, "run", "piper-table4", "--quiet", timeout=300, capped=False)
    assert res.returncode == 0, res.stdout + res.stderr
    res = repro("--results", store, "validate", "--predictor", "memory", timeout=300, capped=False)
    assert res.returncode == 0, res.stdout + res.stderr
    validation = store / "validation" / "validation.json"
    assert validation.is_file()
    res = gate("--baseline", store, "--current", store)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (
        "unchanged" in res.stdout
        and "validation.json" in res.stderr
        and "not a result" in res.stderr
    )
    # a stray result file in a store is no run of it either; but a folder of results that is not
    # a store is read whole, and a bad file there still fails
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "x.json").write_text(validation.read_text())
    one_line(gate("--baseline", store, "--current", tmp_path / "plain"), 2, "x.json")


def test_help_documents_the_new_cases():
    res = repro("gate", "--help")
    text = " ".join(res.stdout.split())
    for words in (
        "negative",
        "regular file",
        f"{RESULT_LIMIT // 2**20} MiB",
        "true/false",
        "range of a float",
        "standard input",
        "not a result",
    ):
        assert words in text, words
