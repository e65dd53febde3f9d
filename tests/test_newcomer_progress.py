"""Progress and parameters for a newcomer: `repro run` of several ids says where it is (done/total,
elapsed, time left) off a terminal, `repro run ID --show-params` lists what --param takes, a
rank timeout names the parameter that allows longer, and counted-step commands (site build,
calibrate) print plain progress lines."""

from __future__ import annotations

import io
import re
import subprocess
import sys

import pytest

from moe_repro.cli import run_cmd
from moe_repro.cli.progress import StepLines


def repro(*args, timeout=600):
    return subprocess.run(
        [sys.executable, "-c", "from moe_repro.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_show_params_lists_every_default(results_dir):
    from moe_repro.reproductions import all_reproductions

    r = repro("run", "xmoe-fig11", "--show-params")
    assert r.returncode == 0, r.stderr
    defaults = all_reproductions()["xmoe-fig11"].defaults
    listed = {line.split()[0]: line.split()[1] for line in r.stdout.splitlines()[1:]}
    assert listed.keys() == defaults.keys()
    assert listed["timeout_s"] == str(defaults["timeout_s"])
    assert "[--full: " in r.stdout  # its paper-sized values beside the defaults
    assert not list(results_dir.rglob("*.json"))  # nothing ran


def test_batch_line_scales_the_catalog_minutes_by_the_pace_so_far(monkeypatch):
    clock = iter([1000.0 + 120.0])
    monkeypatch.setattr(run_cmd.time, "monotonic", lambda: next(clock))
    # a took 120 s where the catalog says 60: the rest is expected twice as slow
    line = run_cmd.batch_line(1, ["a", "b", "c"], 1000.0, {"a": 1.0, "b": 2.0, "c": None})
    assert line == "[2/3] b, 2:00 elapsed, about 4:00 left (+1 not timed)"
    # faster than the catalog (its minutes are rounded up): the catalog's minutes, not less
    clock = iter([1000.0 + 6.0])
    line = run_cmd.batch_line(1, ["a", "b", "c"], 1000.0, {"a": 1.0, "b": 2.0, "c": None})
    assert line == "[2/3] b, 0:06 elapsed, about 2:00 left (+1 not timed)"


def test_several_ids_print_progress_lines_when_stderr_is_a_file(results_dir, tmp_path):
    err = tmp_path / "err.txt"
    with err.open("w") as stream:
        r = subprocess.run(
            [
                sys.executable,
                "-c",
                "from moe_repro.cli import main; main()",
                "run",
                "piper-table1",
                "piper-table4",
            ],
            stdout=subprocess.DEVNULL,
            stderr=stream,
            timeout=600,
        )
    assert r.returncode == 0
    lines = err.read_text().splitlines()
    assert re.fullmatch(r"\[1/2\] piper-table1, \d+:\d\d elapsed, about \d+:\d\d left", lines[0]), (
        lines
    )
    assert any(
        re.fullmatch(r"\[2/2\] piper-table4, \d+:\d\d elapsed, about \d+:\d\d left", x)
        for x in lines
    )


def test_a_rank_timeout_names_the_parameter_that_allows_longer(monkeypatch):
    from moe_repro import reproductions
    from moe_repro.runtime.launch import RankFailure

    class Slow:
        defaults = {"timeout_s": 900.0, "tokens": 512}

        def run(self, params):
            raise RankFailure("rank 1 did not finish within 900 s (hung?)", [1])

    monkeypatch.setattr(reproductions, "all_reproductions", lambda: {"slow": Slow()})
    with pytest.raises(RankFailure) as e:
        run_cmd.run_one("slow", {})
    assert "did not finish within 900 s" in str(e.value)
    assert "--param timeout_s=3600" in str(e.value) and e.value.ranks == [1]


def test_step_lines_count_and_estimate():
    out = io.StringIO()
    lines = StepLines("build", stream=out)
    lines(0, 4, "now page a")
    lines(2, 4, "now page c")
    lines(4, 4)
    first, middle, last = out.getvalue().splitlines()
    assert first.startswith("build: 0/4 done, now page a, 0:00 elapsed") and "left" not in first
    assert re.fullmatch(r"build: 2/4 done, now page c, 0:00 elapsed, about 0:00 left", middle)
    assert last.startswith("build: 4/4 done, ") and "left" not in last


def test_site_build_prints_progress(results_dir, tmp_path):
    r = repro("site", "build", "--out", str(tmp_path / "site"))
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0].startswith("site build: 0/") and "elapsed" in lines[0]
    total = lines[0].split("/")[1].split()[0]
    assert lines[-1].startswith(f"site build: {total}/{total} done")


def test_export_keeps_integers_and_says_which_runs_it_kept(results_dir, tmp_path):
    import csv

    for args in (
        ["alltoall", "--nodes", "16", "--algo", "flat"],
        ["alltoall", "--nodes", "16", "--algo", "halo"],
        ["gemm", "--n", "64", "--repeats", "1", "--warmup", "0"],
    ):
        assert repro("bench", *args).returncode == 0
    out = tmp_path / "r.csv"
    r = repro("export", "--out", str(out))
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(out.open()))
    # gemm rows have no "ranks": the alltoall rows' ranks stay whole numbers, not 128.0
    assert {row["ranks"] for row in rows} == {"128", ""}
    assert {row["n"] for row in rows} == {"64", ""}
    # the latest alltoall run (halo) stands for the suite, and the command says so
    assert {row["algo"] for row in rows} == {"halo", ""}
    assert (
        "alltoall: the latest run" in r.stderr
        and "1 earlier run left out (--all-runs exports them)" in r.stderr
    )
    r = repro("export", "--all-runs", "--out", str(out))
    assert {row["algo"] for row in csv.DictReader(out.open())} == {"flat", "halo", ""}


@pytest.mark.parametrize(
    "fit, expect",
    [
        # the fit: 67% rms, worst 90%, L 0 -> a warning with what to do, and L explained
        (
            {
                "rms_residual_pct": 67.0,
                "max_abs_residual_pct": 90.0,
                "latency_us": 0.0,
                "per_message_us": 211.0,
            },
            [
                "warning: the all-to-all fit over gloo misses its own runs by 67% rms (worst 90%), above the 25% bound",
                "note: L (latency) fitted to 0 over gloo",
            ],
        ),
        (
            {
                "rms_residual_pct": 12.0,
                "max_abs_residual_pct": 20.0,
                "latency_us": 30.0,
                "per_message_us": 5.0,
            },
            [],
        ),
        (
            {
                "rms_residual_pct": 10.0,
                "max_abs_residual_pct": 15.0,
                "latency_us": 0.0,
                "per_message_us": 0.0,
            },
            ["warning: the fit over gloo found no start cost at all (L = o = 0)"],
        ),
        (
            {
                "rms_residual_pct": 10.0,
                "max_abs_residual_pct": 15.0,
                "latency_us": 40.0,
                "per_message_us": 0.0,
            },
            ["note: o (per-message cost) fitted to 0 over gloo"],
        ),
    ],
)
def test_calibrate_judges_its_fit(fit, expect):
    from moe_repro.cli.calibrate_cmd import FIT_RMS_BOUND_PCT, judge_fit

    lines = judge_fit("gloo", fit, load=(0.1, 0.1, 0.1))
    assert len(lines) == len(expect)
    for line, start in zip(lines, expect):
        assert line.startswith(start)
    if fit["rms_residual_pct"] > FIT_RMS_BOUND_PCT:
        assert (
            "rerun `repro calibrate` on an idle machine" in lines[0]
            and "load average" not in lines[0]
        )
        busy = judge_fit("gloo", fit, load=(9.0, 8.0, 7.0))[0]
        assert "load average was 9.0" in busy
