"""Every output path is written by one writer (records/atomic.py): a regular file or a new path
atomically, a device or FIFO written through and never replaced, a symlink's target written and
the link kept, a directory or an unwritable place refused. Commands check their output paths
before any work: one line, exit 2. Nodes are made in a temporary directory (os.mkfifo,
symlinks); /dev/null stands for a character device."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading

import pytest

from moe_repro.records.atomic import (
    atomic_write_bytes,
    atomic_write_json,
    output_dir_problem,
    output_file_problem,
)

MAIN = "from moe_repro.cli import main; main()"


def repro(*args, timeout=120, env=None):
    return subprocess.run(
        [sys.executable, "-c", MAIN, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def one_line_exit_2(res, *words):
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    for w in words:
        assert w in res.stderr, (w, res.stderr)


class FifoReader:
    """Reads a FIFO in a thread until its writer closes it (a FIFO's open waits for a reader)."""

    def __init__(self, path):
        self.data = b""
        self.thread = threading.Thread(target=self._read, args=(path,), daemon=True)
        self.thread.start()

    def _read(self, path):
        with open(path, "rb") as f:
            self.data = f.read()

    def join(self):
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "nothing was written to the FIFO"
        return self.data


# ---- the writer, one kind of path each -------------------------------------------------------


def test_a_new_path_is_written_and_no_temporary_file_is_left(tmp_path):
    out = tmp_path / "new.json"
    atomic_write_json(out, {"a": 1})
    assert json.loads(out.read_text()) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.json"]


def test_an_existing_regular_file_is_replaced_by_a_new_inode(tmp_path):
    out = tmp_path / "old.json"
    out.write_text("old")
    before = out.stat().st_ino
    atomic_write_bytes(out, b"new")
    assert out.read_bytes() == b"new"
    assert (
        out.stat().st_ino != before
    )  # renamed over, not rewritten in place (a reader sees whole files)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]


def test_a_symlink_keeps_being_a_link_and_its_target_is_written(tmp_path):
    target = tmp_path / "real" / "target.json"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    written = atomic_write_bytes(link, b"new")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_bytes() == b"new" and written == target
    assert sorted(p.name for p in target.parent.iterdir()) == ["target.json"]


def test_a_dangling_symlink_creates_its_target(tmp_path):
    target = tmp_path / "target.json"
    link = tmp_path / "link.json"
    link.symlink_to(target)
    atomic_write_bytes(link, b"made")
    assert link.is_symlink() and target.read_bytes() == b"made"


def test_a_fifo_is_written_through_and_stays_a_fifo(tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    reader = FifoReader(fifo)
    atomic_write_json(fifo, {"through": True})
    assert json.loads(reader.join()) == {"through": True}
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_character_device_is_written_through_and_stays_a_device():
    atomic_write_bytes("/dev/null", b"discarded")
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)


def test_a_symlink_to_a_fifo_writes_the_fifo(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "link.json"
    link.symlink_to(fifo)
    reader = FifoReader(fifo)
    atomic_write_bytes(link, b"via link")
    assert reader.join() == b"via link"
    assert link.is_symlink() and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_directory_is_refused_and_left_alone(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "inside").write_text("kept")
    with pytest.raises(IsADirectoryError):
        atomic_write_bytes(tmp_path / "d", b"x")
    assert (tmp_path / "d" / "inside").read_text() == "kept"


def test_a_name_near_the_length_limit_is_written(tmp_path):
    # the temporary name does not grow with the destination's, so a 250-byte name still works
    out = tmp_path / ("n" * 245 + ".json")
    atomic_write_bytes(out, b"ok", make_parents=False)
    assert out.read_bytes() == b"ok"


# ---- what is refused before any work, and why ------------------------------------------------


@pytest.mark.parametrize(
    "case, words",
    [
        ("directory", "is a directory"),
        ("missing parent", "does not exist"),
        ("parent is a file", "Not a directory"),
        ("300-char name", "longer than"),
        ("proc", "cannot create a file"),
        ("symlink loop", "symbolic links"),
    ],
)
def test_output_file_problems_say_why(tmp_path, case, words):
    (tmp_path / "d").mkdir()
    (tmp_path / "f").write_text("")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    path = {
        "directory": tmp_path / "d",
        "missing parent": tmp_path / "no" / "x.json",
        "parent is a file": tmp_path / "f" / "x.json",
        "300-char name": tmp_path / ("x" * 300),
        "proc": "/proc/x.json",
        "symlink loop": tmp_path / "loop",
    }[case]
    problem = output_file_problem(path)
    assert problem and words in problem, problem
    assert not (tmp_path / "no").exists()


def test_writable_nodes_are_not_problems(tmp_path):
    fifo = tmp_path / "p"
    os.mkfifo(fifo)  # opened without blocking by the check: no reader is a problem
    assert "no process reads" in output_file_problem(fifo)
    reader = FifoReader(fifo)
    import time

    for _ in range(600):  # the reader's open may come after the first look
        if output_file_problem(fifo) is None:
            break
        time.sleep(0.05)
    atomic_write_bytes(fifo, b"held")  # the check held the FIFO open: the reader saw no end yet
    assert reader.join() == b"held"
    assert output_file_problem("/dev/null") is None
    assert output_file_problem(tmp_path / "new.json") is None
    assert list(tmp_path.iterdir()) == [fifo]  # the probe file is gone


def test_output_dir_problems(tmp_path):
    (tmp_path / "f").write_text("")
    assert output_dir_problem(tmp_path / "new" / "deeper") is None  # created by the writer
    assert "not a directory" in output_dir_problem(tmp_path / "f")
    assert "not a directory" in output_dir_problem(tmp_path / "f" / "sub")
    assert "cannot create a file" in output_dir_problem("/proc/sys/x")
    assert not (tmp_path / "new").exists()


# ---- commands: refused before any work, nodes survive ----------------------------------------


def reproduction_file(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(
        json.dumps(
            {
                "id": "piper-table4",
                "how": "A",
                "environment": {},
                "cells": [
                    {"row": "r", "column": "c", "paper": 1.0, "ours": 1.0, "verdict": "match"}
                ],
            }
        )
    )
    return path


def test_calibrate_into_a_missing_directory_fails_before_measuring(tmp_path):
    res = repro(
        "calibrate", "--quick", "--no-alltoall", "--out", tmp_path / "nonexistent" / "x.json"
    )
    one_line_exit_2(res, "--out", "does not exist")
    assert res.stdout == "" and not (tmp_path / "nonexistent").exists()


@pytest.mark.parametrize(
    "args, words",
    [
        (["calibrate", "--out", "/proc/x.json"], "cannot create a file"),
        (["run", "piper-table4", "--out", "/proc/sys/x"], "cannot create a file"),
        (["site", "build", "--out", "/proc/sys/x"], "cannot create a file"),
        (
            [
                "plan",
                "--model",
                "deepseek-v3",
                "--platform",
                "frontier",
                "--nodes",
                "4",
                "--json",
                "DIR",
            ],
            "is a directory",
        ),
        (["bench", "gemm", "--json", "LONG"], "longer than"),
        (["run", "piper-table4", "--json", "LONG"], "longer than"),
        (["export", "--out", "DIR"], "is a directory"),
        (["--results", "/proc/results", "run", "piper-table4"], "cannot store results"),
        (["--results", "/proc/results", "bench", "gemm"], "cannot store results"),
    ],
)
def test_commands_refuse_an_unwritable_output_before_any_work(tmp_path, args, words):
    args = [
        str(tmp_path) if a == "DIR" else str(tmp_path / ("y" * 300)) if a == "LONG" else a
        for a in args
    ]
    res = repro(*args)
    one_line_exit_2(res, words)
    assert res.stdout == ""


def test_a_site_output_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("kept")
    res = repro("site", "build", "--out", tmp_path / "f")
    one_line_exit_2(res)
    assert (tmp_path / "f").read_text() == "kept"


def test_gate_json_into_a_fifo_a_device_and_a_symlink(tmp_path):
    r = reproduction_file(tmp_path)
    fifo = tmp_path / "findings.fifo"
    os.mkfifo(fifo)
    reader = FifoReader(fifo)
    res = repro("gate", "--baseline", r, "--current", r, "--json", fifo)
    assert res.returncode == 0, res.stderr
    assert json.loads(reader.join())["counts"] == {"unchanged": 1}
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)

    res = repro("gate", "--baseline", r, "--current", r, "--json", "/dev/null")
    assert res.returncode == 0, res.stderr
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)

    target = tmp_path / "target.json"
    link = tmp_path / "link.json"
    link.symlink_to(target)
    res = repro("gate", "--baseline", r, "--current", r, "--json", link)
    assert res.returncode == 0, res.stderr
    assert link.is_symlink() and json.loads(target.read_text())["counts"] == {"unchanged": 1}


def test_export_into_a_device_and_a_symlinked_file(tmp_path, results_dir):
    r = reproduction_file(tmp_path)
    from moe_repro.records.record import load_record
    from moe_repro.records.store import ResultsStore

    ResultsStore(results_dir).save(load_record(r))
    env = {**os.environ, "MOE_REPRO_RESULTS": str(results_dir)}
    res = repro("export", "--kind", "reproductions", "--out", "/dev/null", env=env)
    assert res.returncode == 0, res.stderr
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)
    target = tmp_path / "t.csv"
    target.write_text("old")
    (tmp_path / "l.csv").symlink_to(target)
    res = repro("export", "--kind", "reproductions", "--out", tmp_path / "l.csv", env=env)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "l.csv").is_symlink() and "piper-table4" in target.read_text()


WRITERS = {
    "run --json": ["run", "piper-table4", "--quiet", "--json", "OUT"],
    "plan --json": [
        "plan",
        "--model",
        "deepseek-v3",
        "--platform",
        "frontier",
        "--nodes",
        "4",
        "--json",
        "OUT",
    ],
    "bench --json": ["bench", "memcopy", "--mbytes", "1", "--repeats", "1", "--json", "OUT"],
    "calibrate --out": ["calibrate", "--quick", "--no-alltoall", "--ranks", "1", "--out", "OUT"],
}


@pytest.mark.parametrize("name", list(WRITERS))
def test_a_fifo_and_a_symlink_survive_every_command_that_writes(tmp_path, name):
    env = {**os.environ, "MOE_REPRO_RESULTS": str(tmp_path / "results")}
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    reader = FifoReader(fifo)
    res = repro(*[str(fifo) if a == "OUT" else a for a in WRITERS[name]], env=env)
    assert res.returncode == 0, res.stderr
    assert json.loads(reader.join()) and stat.S_ISFIFO(os.lstat(fifo).st_mode)

    target, link = tmp_path / "target.json", tmp_path / "link.json"
    link.symlink_to(target)
    res = repro(*[str(link) if a == "OUT" else a for a in WRITERS[name]], env=env)
    assert res.returncode == 0, res.stderr
    assert link.is_symlink() and json.loads(target.read_text())


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
def test_a_device_that_refuses_the_write_stays_a_device(tmp_path):
    r = reproduction_file(tmp_path)
    res = repro("gate", "--baseline", r, "--current", r, "--json", "/dev/full")
    one_line_exit_2(res, "cannot write --json /dev/full")
    assert stat.S_ISCHR(os.lstat("/dev/full").st_mode)
