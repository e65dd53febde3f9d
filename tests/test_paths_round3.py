"""Output and store paths a hostile user can give, each refused before any work (one line, exit
2) or written through without blocking for good; a global option typed after its subcommand;
CSV export cells a spreadsheet would run as formulas. Each case runs the command that showed
the failure, in a temporary directory."""

from __future__ import annotations

import csv
import errno
import json
import os
import socket
import subprocess
import sys

import pytest

from test_safe_writes import MAIN, FifoReader, one_line_exit_2

GEMM = ["bench", "gemm", "--n", "16"]


def in_dir(tmp_path, *args, env=None, timeout=120):
    """``repro ARGS`` run in ``tmp_path`` (relative paths land there); a hang fails the test."""
    try:
        return subprocess.run(
            [sys.executable, "-c", MAIN, *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=tmp_path,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"repro {' '.join(map(str, args))} did not finish in {timeout} s")


def stored_files(root):
    return sorted(p.relative_to(root) for p in root.rglob("*.json")) if root.exists() else []


# ---- the results store ---------------------------------------------------------------------


@pytest.mark.parametrize("case", ["symlink to a missing directory", "symlink loop"])
def test_a_results_store_that_cannot_be_a_directory_is_refused_before_measuring(tmp_path, case):
    if case == "symlink loop":
        (tmp_path / "rlink").symlink_to("rlink")
    else:
        (tmp_path / "rlink").symlink_to("nowhere-dir")
    res = in_dir(
        tmp_path, "--results", "rlink", "bench", "gemm", "--n", "64,128", "--json", "j.json"
    )
    one_line_exit_2(res, "rlink")
    assert res.stdout == "", "nothing is measured"
    assert not (tmp_path / "j.json").exists() and not (tmp_path / "nowhere-dir").exists()


def test_a_results_store_behind_a_dangling_link_is_refused_from_the_environment_too(tmp_path):
    (tmp_path / "rlink").symlink_to("nowhere-dir")
    res = in_dir(tmp_path, *GEMM, env={**os.environ, "MOE_REPRO_RESULTS": "rlink"})
    one_line_exit_2(res, "symbolic link", "does not exist")
    assert res.stdout == ""


def test_an_empty_results_option_is_refused(tmp_path):
    res = in_dir(tmp_path, "--results", "", *GEMM)
    one_line_exit_2(res, "--results", "empty")
    assert res.stdout == "" and stored_files(tmp_path) == []


def test_an_empty_results_variable_is_unset_not_the_current_directory(tmp_path):
    res = in_dir(tmp_path, *GEMM, env={**os.environ, "MOE_REPRO_RESULTS": ""})
    assert res.returncode == 0, res.stderr
    files = stored_files(tmp_path)
    assert len(files) == 1 and files[0].parts[:3] == ("results", "suites", "gemm"), files


# ---- output files and directories ------------------------------------------------------------


def test_a_trailing_slash_on_an_output_file_is_refused(tmp_path):
    (tmp_path / "some").mkdir()
    res = in_dir(
        tmp_path,
        *GEMM,
        "--json",
        "some/newdir/",
        env={**os.environ, "MOE_REPRO_RESULTS": str(tmp_path / "results")},
    )
    one_line_exit_2(res, "--json", "'/'")
    assert res.stdout == "" and list((tmp_path / "some").iterdir()) == []


def test_a_socket_as_output_file_is_refused_before_measuring(tmp_path):
    server = socket.socket(socket.AF_UNIX)
    cwd = os.getcwd()
    os.chdir(tmp_path)  # a short relative name: socket paths are limited to about 100 bytes
    try:
        server.bind("sock")
    finally:
        os.chdir(cwd)
    try:
        res = in_dir(
            tmp_path,
            *GEMM,
            "--json",
            "sock",
            env={**os.environ, "MOE_REPRO_RESULTS": str(tmp_path / "results")},
        )
    finally:
        server.close()
    one_line_exit_2(res, "--json", "socket")
    assert res.stdout == "" and stored_files(tmp_path / "results") == []


def test_a_dangling_symlink_as_output_directory_is_refused_before_running(tmp_path):
    (tmp_path / "dangling").symlink_to("nowhere")
    res = in_dir(
        tmp_path,
        "run",
        "piper-table4",
        "--out",
        "dangling",
        env={**os.environ, "MOE_REPRO_RESULTS": str(tmp_path / "results")},
    )
    one_line_exit_2(res, "--out", "symbolic link", "does not exist")
    assert res.stdout == "" and stored_files(tmp_path / "results") == []
    assert not (tmp_path / "nowhere").exists()


def test_a_fifo_with_no_reader_is_refused_before_measuring(tmp_path):
    os.mkfifo(tmp_path / "ff")
    res = in_dir(
        tmp_path,
        *GEMM,
        "--json",
        "ff",
        env={**os.environ, "MOE_REPRO_RESULTS": str(tmp_path / "results")},
        timeout=60,
    )
    one_line_exit_2(res, "--json", "no process reads")
    assert res.stdout == "" and stored_files(tmp_path / "results") == []


def test_dev_stdout_into_a_pipe_is_written_after_the_table(tmp_path):
    # the pipe's /proc name ("pipe:[N]") is no file name: the descriptor itself is written
    res = in_dir(
        tmp_path,
        *GEMM,
        "--json",
        "/dev/stdout",
        env={**os.environ, "MOE_REPRO_RESULTS": str(tmp_path / "results")},
    )
    assert res.returncode == 0, res.stderr
    table, brace, rest = res.stdout.partition("\n{")
    assert "float32" in table  # what the command printed comes first
    assert json.loads(brace.strip() + rest)["suite"] == "gemm"


# ---- writing through a node never blocks for good (an injected clock: no real waiting) -------


class FakeClock:
    """Each reading is ``step`` seconds after the last: every wait runs out at its first look."""

    def __init__(self, step=1000.0):
        self.now, self.step = 0.0, step

    def __call__(self):
        self.now += self.step
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_a_fifo_whose_reader_never_comes_fails_with_a_reason(tmp_path):
    from moe_repro.records.atomic import _write_through

    fifo = tmp_path / "ff"
    os.mkfifo(fifo)
    clock = FakeClock()
    with pytest.raises(OSError) as info:
        _write_through(fifo, b"x", wait_s=30, clock=clock, sleep=clock.sleep)
    assert info.value.errno == errno.ENXIO and "no process reads it" in str(info.value)


def test_a_reader_that_takes_nothing_ends_the_write_with_a_reason(tmp_path):
    from moe_repro.records.atomic import _write_through

    fifo = tmp_path / "ff"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # there, and never reads
    try:
        clock = FakeClock()
        with pytest.raises(TimeoutError) as info:  # more than a pipe holds
            _write_through(fifo, b"x" * (8 << 20), stall_s=300, clock=clock, sleep=clock.sleep)
        assert "took nothing for 300 s" in str(info.value)
    finally:
        os.close(reader)


def test_a_fifo_whose_reader_is_there_is_written(tmp_path):
    fifo = tmp_path / "ff"
    os.mkfifo(fifo)
    reader = FifoReader(fifo)
    res = in_dir(
        tmp_path,
        *GEMM,
        "--json",
        "ff",
        env={**os.environ, "MOE_REPRO_RESULTS": str(tmp_path / "results")},
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(reader.join())["suite"] == "gemm"


# ---- a global option after the subcommand ---------------------------------------------------


@pytest.mark.parametrize(
    "args, usage",
    [
        (["bench", "gemm", "--n", "16", "--results", "x"], "repro --results x bench gemm ..."),
        (["run", "piper-table4", "--results=x"], "repro --results x run piper-table4 ..."),
        (["export", "--results"], "repro --results DIR export ..."),
    ],
)
def test_a_global_option_after_the_subcommand_says_where_it_goes(tmp_path, args, usage):
    res = in_dir(
        tmp_path, *args, env={**os.environ, "MOE_REPRO_RESULTS": str(tmp_path / "results")}
    )
    one_line_exit_2(res, "--results is an option of repro itself", usage)
    assert res.stdout == "" and not (tmp_path / "x").exists()


# ---- CSV export -------------------------------------------------------------------------------


def test_csv_export_escapes_formulas_and_keeps_negative_numbers(tmp_path, results_dir):
    from moe_repro.records.environment import collect_environment
    from moe_repro.records.record import SuiteRecord
    from moe_repro.records.store import ResultsStore

    cells = {
        "link": '=HYPERLINK("http://x","y")',
        "plus": "+cmd|'/c calc'!A0",
        "minus": "-2+3",
        "at": "@SUM(A1)",
        "tab": "\t=1",
        "cr": "\r=1",
        "plain": "fine",
        "neg": -1.5,
        "neg_int": -3,
    }
    ResultsStore(results_dir).save(
        SuiteRecord(
            suite="s", params=["link"], records=[cells], environment=collect_environment(["repro"])
        )
    )
    out = tmp_path / "out.csv"
    res = in_dir(tmp_path, "export", "--format", "csv", "--out", out)
    assert res.returncode == 0, res.stderr
    with open(out, newline="") as f:  # as the csv module reads: a bare CR would end the row
        rows = list(csv.DictReader(f))
    assert len(rows) == 1, rows
    row = rows[0]
    for key in ("link", "plus", "minus", "at", "tab", "cr"):
        assert row[key] == "'" + cells[key], (key, row[key])
    assert row["plain"] == "fine" and row["neg"] == "-1.5" and row["neg_int"] == "-3"
