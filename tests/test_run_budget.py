"""`repro run --all --budget SECONDS`: the reproductions whose catalog time fits what is left of
the budget run, shortest first; each one left out is one line naming its time and the command that
fills its page. The clock is injected (a fake one advanced by each run), never timed."""

from __future__ import annotations

import pytest

from moe_repro.cli import main, run_cmd

CHEAP = ["piper-table1", "piper-table4", "piper-fig10"]  # analytic, under a second each


def test_an_estimate_that_fits_what_is_left_runs():
    assert run_cmd.over_budget("x", 0.5, budget_s=45, elapsed_s=10) is None  # 30 s of 35 left
    assert run_cmd.over_budget("x", 0.5, budget_s=45, elapsed_s=15) is None  # exactly fits


def test_one_that_does_not_fit_is_one_line_with_its_time_and_command():
    line = run_cmd.over_budget("feplb-fig4", 4.2, budget_s=45, elapsed_s=20)
    assert line == (
        "feplb-fig4: skipped (needs about 252 s on a 2-core CPU machine, 25 s of the budget "
        "left): repro run feplb-fig4"
    )
    # the budget already spent: nothing left, never a negative time
    assert "0 s of the budget left" in run_cmd.over_budget("x", 0.1, budget_s=5, elapsed_s=9)


def test_one_with_no_measured_time_is_left_out():
    line = run_cmd.over_budget("x", None, budget_s=1e9, elapsed_s=0)
    assert line is not None and "not measured" in line and line.endswith("repro run x")


def _run(capsys, *args) -> tuple[int, str]:
    with pytest.raises(SystemExit) as done:
        main(list(args))
    return done.value.code, capsys.readouterr().out


def _timed_batch(monkeypatch, fake_clock, minutes, per_run_s=None):
    """CHEAP with the given catalog minutes; each run moves the injected clock per_run_s, or
    by its own catalog time when per_run_s is None."""
    times = dict(zip(CHEAP, minutes))
    monkeypatch.setattr(run_cmd, "resolve_ids", lambda *a, **k: list(CHEAP))
    monkeypatch.setattr(run_cmd, "run_minutes", lambda chosen, full=False: dict(times))
    monkeypatch.setattr(run_cmd.time, "monotonic", fake_clock)
    real_run_one = run_cmd.run_one

    def run_one(rid, *args, **kwargs):
        fake_clock.advance(60 * times[rid] if per_run_s is None else per_run_s)
        return real_run_one(rid, *args, **kwargs)

    monkeypatch.setattr(run_cmd, "run_one", run_one)


def test_the_batch_runs_what_fits_shortest_first_and_names_the_rest(
    results_dir, monkeypatch, fake_clock, capsys
):
    # catalog times 6 s, 30 s, 6 s; each run moves the clock 15 s
    _timed_batch(monkeypatch, fake_clock, (0.1, 0.5, 0.1), 15)
    code, out = _run(capsys, "run", "--all", "--quiet", "--budget", "40")
    assert code == 0
    lines = out.splitlines()
    # the two 6 s ones first, in their order (40 s left, then 25 s); then 10 s are left: the
    # 30 s one is skipped
    assert lines[0].startswith("piper-table1: ") and "(ran " in lines[0]
    assert lines[1].startswith("piper-fig10: ") and "(ran " in lines[1]
    assert lines[2] == (
        "piper-table4: skipped (needs about 30 s on a 2-core CPU machine, 10 s of the budget "
        "left): repro run piper-table4"
    )
    stored = {p.parent.name for p in results_dir.rglob("*.json")} | {
        p.stem for p in results_dir.rglob("*.json")
    }
    assert not any("piper-table4" in name for name in stored)
    assert any("piper-table1" in name for name in stored)


def test_shortest_first_fills_more_pages_than_the_listed_order(
    results_dir, monkeypatch, fake_clock, capsys
):
    # listed first, the 30 s one would fit 35 s and leave 5 s, too few for either 6 s one: one
    # page; shortest first, the two 6 s ones run and 23 s are left for the 30 s one: two pages
    _timed_batch(monkeypatch, fake_clock, (0.5, 0.1, 0.1))
    code, out = _run(capsys, "run", "--all", "--quiet", "--budget", "35")
    ran = [line.split(":")[0] for line in out.splitlines() if "(ran " in line]
    assert code == 0 and ran == ["piper-table4", "piper-fig10"], out
    assert out.splitlines()[2].startswith("piper-table1: skipped (needs about 30 s")


def test_a_zero_budget_runs_nothing_and_says_so_for_each(results_dir, monkeypatch, capsys):
    monkeypatch.setattr(run_cmd, "resolve_ids", lambda *a, **k: list(CHEAP))
    code, out = _run(capsys, "run", "--all", "--quiet", "--budget", "0")
    assert code == 0
    assert [line.split(":")[0] for line in out.splitlines()] == CHEAP
    assert all("skipped" in line for line in out.splitlines())
    assert not list(results_dir.rglob("*.json"))


def test_a_budget_for_one_named_reproduction_is_refused_in_one_line(results_dir, capsys):
    with pytest.raises(SystemExit) as done:
        main(["run", "piper-table1", "--budget", "10"])
    assert done.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--budget" in err


def test_a_negative_budget_is_refused(results_dir, capsys):
    with pytest.raises(SystemExit) as done:
        main(["run", "--all", "--budget", "-1"])
    assert done.value.code == 2
