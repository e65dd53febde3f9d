"""`repro run --all --budget SECONDS`: the reproductions whose catalog time fits what is left of
the budget run in order; each one left out is one line naming its time and the command that
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


def test_the_batch_runs_what_fits_in_order_and_names_the_rest(
    results_dir, monkeypatch, fake_clock, capsys
):
    # three analytic reproductions; catalog times 6 s, 30 s, 6 s; each run moves the clock 30 s
    monkeypatch.setattr(run_cmd, "resolve_ids", lambda *a, **k: list(CHEAP))
    monkeypatch.setattr(
        run_cmd, "run_minutes", lambda chosen, full=False: dict(zip(CHEAP, (0.1, 0.5, 0.1)))
    )
    monkeypatch.setattr(run_cmd.time, "monotonic", fake_clock)
    real_run_one = run_cmd.run_one

    def run_one(*args, **kwargs):
        fake_clock.advance(30)
        return real_run_one(*args, **kwargs)

    monkeypatch.setattr(run_cmd, "run_one", run_one)
    code, out = _run(capsys, "run", "--all", "--quiet", "--budget", "40")
    assert code == 0
    lines = out.splitlines()
    # the first runs (6 s fit 40); then 10 s are left: the 30 s one is skipped, the 6 s one runs
    assert lines[0].startswith("piper-table1: ") and "(ran " in lines[0]
    assert lines[1] == (
        "piper-table4: skipped (needs about 30 s on a 2-core CPU machine, 10 s of the budget "
        "left): repro run piper-table4"
    )
    assert lines[2].startswith("piper-fig10: ") and "(ran " in lines[2]
    stored = {p.parent.name for p in results_dir.rglob("*.json")} | {
        p.stem for p in results_dir.rglob("*.json")
    }
    assert not any("piper-table4" in name for name in stored)
    assert any("piper-table1" in name for name in stored)


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
