"""Measured runs a user can finish: progress per grid point, every finished point kept, and
`repro run`'s closing counts (reproductions/suite_runs.py, moe_repro/cli/run_cmd.py)."""

import io
import json
import re

import pytest
from click.testing import CliRunner

from moe_repro.records.store import ResultsStore
from moe_repro.reproductions.suite_runs import Watch, clock, run_grid, watching


def _memcopy(mbytes):
    return {"mbytes": mbytes, "device": "cpu", "threads": 1}


def test_each_finished_point_is_reported_and_stored(tmp_path):
    store, stream = ResultsStore(tmp_path / "results"), io.StringIO()
    with watching(Watch("demo", stream=stream, store=store)):
        records = run_grid("memcopy", [_memcopy(1), _memcopy(2)], repeats=1)
    lines = stream.getvalue().splitlines()
    # not a terminal: plain lines, one as the grid starts and one per finished point
    assert lines[0].startswith("demo: memcopy 0/2 points")
    assert re.fullmatch(
        r"demo: memcopy 1/2 points, \d+:\d\d elapsed, about \d+:\d\d left", lines[1]
    )
    assert re.fullmatch(r"demo: memcopy 2/2 points, \d+:\d\d elapsed", lines[2])
    stored = store.runs("suite", "memcopy")
    assert len(stored) == 1  # one file per grid, rewritten as points finish
    assert [r["mbytes"] for r in stored[0].records] == [r["mbytes"] for r in records] == [1, 2]
    assert not stored[0].interrupted


def test_a_grid_that_fails_keeps_the_points_that_finished(tmp_path):
    store, stream = ResultsStore(tmp_path / "results"), io.StringIO()
    with watching(Watch("demo", stream=stream, store=store)):
        with pytest.raises(ValueError, match="mbytes"):
            run_grid("memcopy", [_memcopy(1), _memcopy(0)], repeats=1)  # the second is refused
    (stored,) = store.runs("suite", "memcopy")
    assert [r["mbytes"] for r in stored.records] == [1]
    assert stored.interrupted and "mbytes" in stored.error
    assert "stopped after 1/2 points" in stream.getvalue()


def test_without_a_watch_nothing_is_printed_or_stored(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    records = run_grid("memcopy", [_memcopy(1)], repeats=1)
    assert len(records) == 1 and not (tmp_path / "results").exists()
    assert capsys.readouterr().err == ""


@pytest.mark.multiprocess
def test_a_world_hands_back_its_points_one_by_one_and_keeps_them_when_a_rank_fails(tmp_path):
    """A multi-process world runs all its points in one launch; each is still reported and
    stored as rank 0 finishes it, and a failure on the ranks leaves the finished ones stored."""
    store, stream = ResultsStore(tmp_path / "results"), io.StringIO()
    base = {
        "ranks": 2,
        "backend": "gloo",
        "tokens": 32,
        "d_model": 16,
        "d_ffn": 32,
        "experts": 8,
        "top_k": 2,
        "skew": 4.0,
        "seed": 0,
    }
    with watching(Watch("demo", stream=stream, store=store)):
        records = run_grid(
            "llep-layer",
            [dict(base, layer="plain"), dict(base, layer="llep")],
            repeats=1,
            timeout_s=120,
        )
        assert [r["layer"] for r in records] == ["plain", "llep"]
        assert "llep-layer 1/2 points" in stream.getvalue()
        # the setup of the second point raises on every rank, after the first finished
        with pytest.raises(Exception):
            run_grid(
                "llep-layer",
                [dict(base, layer="plain"), dict(base, layer="no-such-layer")],
                repeats=1,
                timeout_s=120,
            )
    runs = store.runs("suite", "llep-layer")
    assert [len(r.records) for r in runs] == [2, 1]
    assert not runs[0].interrupted and runs[1].interrupted
    assert "stopped after 1/2 points" in stream.getvalue()


def test_clock():
    assert clock(5) == "0:05" and clock(65) == "1:05" and clock(3725) == "1:02:05"


# --- repro run: --full, the count lines, --quiet -------------------------------------------


def _fake(monkeypatch):
    """One reproduction with a known outcome (two cells: one agrees, one deviates), standing in
    for the registry, so the command's lines can be checked exactly."""
    from moe_repro import reproductions
    from moe_repro.reproductions.spec import PaperValue, Reproduction, Result

    seen = []

    def compute(repro, params):
        seen.append(dict(params))
        return Result(
            cells=[
                repro.compare("a", "x", 1.0, "x"),
                repro.compare("b", "x", 3.0, "x"),
                repro.compare("c", "x", 5.0, "x"),
            ]
        )

    fake = Reproduction(
        id="piper-table4",
        compute=compute,
        defaults={"size": 1},
        full={"size": 8},
        paper_values=[
            PaperValue("a", "x", "1.0", "x", "test"),
            PaperValue("b", "x", "2.0", "x", "test"),
        ],
    )
    monkeypatch.setattr(reproductions, "all_reproductions", lambda: {"piper-table4": fake})
    return seen


def _run(*args):
    from moe_repro.cli import cli

    return CliRunner().invoke(cli, ["run", *args], catch_exceptions=False)


def test_quiet_prints_one_count_line_per_reproduction(results_dir, monkeypatch):
    _fake(monkeypatch)
    out = _run("piper-table4", "--quiet").output.splitlines()
    assert len(out) == 1
    assert re.fullmatch(
        r"piper-table4: 1 of 2 compared cells agree, 1 deviate \(ran \d+:\d\d\)", out[0]
    )


def test_the_last_line_counts_compared_cells(results_dir, monkeypatch):
    _fake(monkeypatch)
    out = _run("piper-table4").output.splitlines()
    assert out[-1].startswith("piper-table4: 1 of 2 compared cells agree, 1 deviate")


def test_full_runs_the_paper_sized_parameters_and_says_so(results_dir, monkeypatch):
    seen = _fake(monkeypatch)
    _run("piper-table4", "--quiet")
    _run("piper-table4", "--quiet", "--full")
    _run("piper-table4", "--quiet", "--full", "--param", "size=4")
    assert [p["size"] for p in seen] == [1, 8, 4]  # --param applies after --full
    commands = {
        json.loads(p.read_text())["command"]
        for p in results_dir.glob("reproductions/piper-table4/*.json")
    }
    assert commands == {
        "repro run piper-table4",
        "repro run piper-table4 --full",
        "repro run piper-table4 --full --param size=4",
    }


def test_count_lines_per_paper_and_for_all():
    from types import SimpleNamespace

    from moe_repro.cli.run_cmd import count_lines

    cell = lambda v: {"verdict": v, "derived_from": None}  # noqa: E731
    records = [
        SimpleNamespace(paper="piper", cells=[cell("match"), cell("deviates")]),
        SimpleNamespace(paper="piper", cells=[cell("claim-holds")]),
        SimpleNamespace(paper="mop", cells=[cell("no-paper-value")]),
    ]
    assert count_lines(records) == [
        "piper (2 reproductions): 2 of 3 compared cells agree, 1 deviate",
        "mop (1 reproduction): nothing compared",
        "all 3 reproductions: 2 of 3 compared cells agree, 1 deviate",
    ]
    assert count_lines(records[:1]) == []  # one reproduction: its own line is the last


def test_run_help_teaches_full_progress_and_the_count_line():
    from moe_repro.cli import cli

    text = " ".join(CliRunner().invoke(cli, ["run", "--help"]).output.split())
    for needle in ("--full", "progress", "compared cells agree", "--quiet", "interrupted"):
        assert needle in text, needle
    from moe_repro.records.grading import PREDICTION_TOLERANCE

    assert f"within {PREDICTION_TOLERANCE:.0%} of the paper's value" in text  # the policy's own


@pytest.mark.multiprocess
def test_mop_llep_grades_the_recapped_direction_not_the_gpu_size():
    from moe_repro.reproductions.mop_llep import FASTER, REPRODUCTION

    result = REPRODUCTION.run(
        {"tokens": 64, "d_model": 16, "d_ffn": 32, "experts": 4, "top_k": 2, "repeats": 1}
    )
    by = {(c.row, c.column): c for c in result.cells}
    speedup, claim = by[("LLEP", "speedup vs plain EP")], by[("LLEP", FASTER)]
    assert speedup.verdict == "no-paper-value"
    assert claim.verdict == ("claim-holds" if speedup.ours > 1 else "claim-fails")
    assert claim.ours == speedup.ours
    # with the policy's minimum of repeats the direction is read at every repeat; direction
    # first: slower at the median fails, whatever some repeats give
    from moe_repro.records.grading import MIN_SEEDS

    result = REPRODUCTION.run(
        {"tokens": 64, "d_model": 16, "d_ffn": 32, "experts": 4, "top_k": 2, "repeats": MIN_SEEDS}
    )
    by = {(c.row, c.column): c for c in result.cells}
    speedup, claim = by[("LLEP", "speedup vs plain EP")], by[("LLEP", FASTER)]
    if speedup.ours <= 1:
        assert claim.verdict == "claim-fails"
    else:
        assert claim.verdict in ("claim-holds", "seed-dependent")
    assert len(claim.seeds["holds"]) == MIN_SEEDS and f"of {MIN_SEEDS} repeats" in claim.note


@pytest.mark.timing
def test_a_computation_without_grid_points_still_says_it_is_running(monkeypatch):
    import time

    from conftest import patient
    from moe_repro.reproductions import suite_runs

    monkeypatch.setattr(suite_runs, "TICK_S", 0.5)
    stream = io.StringIO()
    with watching(Watch("demo", stream=stream)):
        # the ticker looks every second: wait for its first line (a busy machine wakes it late)
        deadline = time.monotonic() + patient(3)
        while not stream.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
    lines = stream.getvalue().splitlines()
    assert lines and all(re.fullmatch(r"demo: running, \d+:\d\d elapsed", line) for line in lines)


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_on_a_terminal_one_line_is_rewritten_and_the_last_one_kept(tmp_path):
    stream = _Terminal()
    with watching(Watch("demo", stream=stream)):
        run_grid("memcopy", [_memcopy(1), _memcopy(2)], repeats=1)
    text = stream.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")  # one line, closed once
    assert text.split("\r\x1b[K")[-1].startswith("demo: memcopy 2/2 points")


def test_piper_fig5_shows_the_caption_claim_as_echo_of_the_simulator():
    """Fig. 5's 'bandwidth drops significantly as soon as all-to-all involves inter-node
    communication', on the simulated Frontier: it follows from the profile's link speeds, so it
    is shown and not counted."""
    from moe_repro.records.grading import agreement
    from moe_repro.reproductions.piper_fig5 import DROP, REPRODUCTION

    result = REPRODUCTION.run({"real": 0, "bytes_per_gpu": "16777216"})
    (claim,) = [c for c in result.cells if c.column == DROP]
    assert claim.verdict == "echo" and claim.ours < 1 and claim.how == "S"
    assert agreement(result.cells)["compared"] == 0


def test_a_training_run_counts_its_steps(monkeypatch):
    # piper-fig9 / piper-alg2: one training run, no grid points; its steps are counted instead
    from moe_repro.components.balance.routing_record import fig9_config, train_and_record
    from moe_repro.reproductions import suite_runs

    monkeypatch.setattr(suite_runs, "STEP_LINE_S", 0.0)  # a line per step off a terminal
    stream = io.StringIO()
    with watching(Watch("demo", stream=stream)):
        train_and_record(
            fig9_config(n_layers=1),
            steps=3,
            batch=4,
            sources=2,
            progress=suite_runs.step_progress("training"),
        )
    lines = stream.getvalue().splitlines()
    assert [
        re.match(r"demo: training (\d)/3 steps, \d+:\d\d elapsed", line).group(1) for line in lines
    ] == ["1", "2", "3"]
    assert "left" in lines[0] and "left" not in lines[-1]


def test_a_step_counter_outside_a_watch_prints_nothing(capsys):
    from moe_repro.reproductions.suite_runs import step_progress

    step_progress("training")(1, 2)
    assert capsys.readouterr() == ("", "")


@pytest.mark.multiprocess
@pytest.mark.timing
def test_a_world_that_times_out_keeps_every_point_it_finished(tmp_path, monkeypatch, fake_clock):
    """A long measured grid whose rank stops answering: the world is killed at its timeout, and
    the points that finished before are stored, marked interrupted. The timeout is counted on a
    fake clock, moved past it once two points are in: a busy machine's slow start cannot use the
    timeout up before them, and the test does not wait it out."""
    import functools
    import threading
    import time

    from conftest import patient
    from moe_repro.runtime import launch
    from moe_repro.suites import get_suite

    suite = get_suite("alltoall")
    # one world (same ranks and backend), three points; the third stops rank 1 mid-collective
    grid = suite.grid(
        suite.parse_overrides(
            ["nodes=2", "gpus_per_node=1", "algo=flat,halo", "tokens=16", "hidden=8"]
        )
    )
    hang = dict(grid[0], fault="hang:1")
    monkeypatch.setattr(launch, "run_ranks", functools.partial(launch.run_ranks, clock=fake_clock))
    store, stream = ResultsStore(tmp_path / "results"), io.StringIO()

    def time_out_after_two_points():
        deadline = time.monotonic() + patient(
            30
        )  # a hang guard: the clock moves at the latest then
        while "alltoall 2/3 points" not in stream.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
        fake_clock.advance(61)

    mover = threading.Thread(target=time_out_after_two_points, daemon=True)
    mover.start()
    with watching(Watch("demo", stream=stream, store=store)):
        with pytest.raises(Exception, match="did not finish within 60 s"):
            run_grid("alltoall", [*grid, hang], repeats=1, timeout_s=60)
    mover.join()
    (stored,) = store.runs("suite", "alltoall")
    assert [r["algo"] for r in stored.records] == ["flat", "halo"]
    assert stored.interrupted and stored.error
    assert "stopped after 2/3 points" in stream.getvalue()
