"""records/changepoints.py: asv's piecewise-constant step detection over a history."""

import random

import pytest

from moe_repro.records.changepoints import (
    DEFAULT_MIN_RATIO,
    Step,
    detect_steps,
    fit_segments,
    open_regressions,
)


def _noisy(level, n, rel, rng):
    return [level * (1 + rel * rng.gauss(0, 1)) for _ in range(n)]


def test_a_planted_doubling_is_one_regression_at_its_index():
    rng = random.Random(3)
    values = _noisy(10.0, 20, 0.03, rng) + _noisy(20.0, 8, 0.03, rng)
    steps = detect_steps(values)
    assert len(steps) == 1
    step = steps[0]
    assert isinstance(step, Step)
    assert step.index == 20
    assert step.kind == "regression"
    assert 1.8 < step.ratio < 2.2
    assert step.ratio == pytest.approx(step.after / step.before)


def test_direction_follows_higher_is_better():
    values = [100.0, 101.0, 99.0, 50.0, 51.0, 49.0]
    (lower,) = detect_steps(values)
    (higher,) = detect_steps(values, higher_is_better=True)
    assert lower.kind == "improvement" and higher.kind == "regression"
    assert lower.index == higher.index == 3


def test_two_runs_at_two_commits_a_3x_step_is_found():
    (step,) = detect_steps([9.56, 30.6])
    assert step.index == 1 and step.kind == "regression"


def test_flat_noisy_histories_flag_nothing():
    flagged = 0
    for seed in range(100):
        rng = random.Random(seed)
        flagged += bool(detect_steps(_noisy(5.0, 25, 0.08, rng)))
    assert flagged == 0


def test_a_step_under_min_ratio_is_not_reported():
    values = [10.0] * 10 + [11.0] * 10  # a clean 10% step
    assert detect_steps(values, min_ratio=1.25) == []
    (step,) = detect_steps(values, min_ratio=1.05)
    assert step.index == 10


def test_a_single_spike_is_an_outlier_not_two_steps():
    assert detect_steps([10, 10.5, 9.8, 30, 10, 10.2, 9.9]) == []
    # ... but a newest point alone at a new level is a step (the last commit)
    (step,) = detect_steps([10, 10.5, 9.8, 10.2, 10, 10.2, 30])
    assert step.index == 6


def test_missing_and_non_finite_points_keep_their_positions():
    values = [10.0, None, 10.0, float("nan"), 10.0, 40.0, None, 40.0]
    (step,) = detect_steps(values)
    assert step.index == 5


def test_short_and_empty_histories():
    assert detect_steps([]) == [] and detect_steps([3.0]) == []
    assert detect_steps([2.0, 2.0]) == []
    assert fit_segments([]) == []


def test_bad_min_ratio_is_refused():
    with pytest.raises(ValueError):
        detect_steps([1.0, 2.0], min_ratio=0.5)


def test_open_regressions_ignore_one_that_was_undone():
    values = [10.0] * 6 + [25.0] * 6 + [10.0] * 6
    steps = detect_steps(values)
    assert [s.kind for s in steps] == ["regression", "improvement"]
    assert open_regressions(values, steps) == []
    kept = [10.0] * 6 + [25.0] * 6
    assert len(open_regressions(kept, detect_steps(kept))) == 1


def test_default_ratio_is_a_ratio():
    assert DEFAULT_MIN_RATIO > 1
