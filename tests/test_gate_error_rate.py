"""records/error_rate.py: false-positive rate and power of gate rules over pools of runs, on
synthetic pools with a known answer (the measurement itself is tools/gate_error_rate.py)."""

from __future__ import annotations

import random

import pytest

from moe_repro.records.error_rate import choose, flags, pair_stat, pair_stats, rates


def _run(level, rng, noise=0.01, n=10):
    return [level * (1 + rng.gauss(0, noise)) for _ in range(n)]


def _pools(seed=0, between=0.0):
    """Baseline runs at 1.0 (each run's level off by ``between``, run-to-run noise) and runs
    slowed by 5%, 10% and 25%."""
    rng = random.Random(seed)

    def level(x):
        return x * (1 + rng.gauss(0, between))

    base = [_run(level(1.0), rng) for _ in range(16)]
    slowed = {str(s): [_run(level(1 + s), rng) for _ in range(8)] for s in (0.05, 0.1, 0.25)}
    return base, slowed


def test_pair_stat_ratio_and_rule():
    stat = pair_stat([1.0, 1.01, 0.99, 1.0, 1.02], [2.0, 2.02, 1.98, 2.01, 2.03])
    assert stat.ratio == pytest.approx(2.0, rel=0.02) and stat.p_value < 0.05
    assert stat.min_ratio == pytest.approx(1.98 / 0.99)
    assert flags(stat, 0.05, 0.05) and not flags(stat, 1.5, 0.05)
    same = pair_stat([1.0, 1.1, 0.9, 1.05], [1.02, 0.95, 1.08, 0.97])
    assert not flags(same, 0.0, 0.05)  # not significant
    assert flags(same, 0.0, 1.0) == (same.ratio > 1)  # threshold alone


def test_quiet_pools_give_no_false_positive_and_full_power_at_10_percent():
    base, slowed = _pools()
    aa, ab = pair_stats(base, slowed, samples=10)
    assert len(aa) == 16 * 15 // 2 and len(ab["0.1"]) == 16 * 8
    table = rates("time_s", 10, aa, ab)
    rule = next(
        r for r in table if r.statistic == "median" and r.threshold == 0.05 and r.alpha == 0.05
    )
    assert rule.false_positive_rate == 0.0
    assert rule.power["0.1"] == 1.0 and rule.power["0.25"] == 1.0
    best = choose(table)
    assert best is not None and best.power["0.1"] == 1.0 and best.false_positive_rate <= 0.01


def test_run_to_run_noise_shows_up_as_false_positives_of_the_test():
    base, slowed = _pools(between=0.05)  # each run's level off by 5%: the samples do not see it
    aa, ab = pair_stats(base, slowed, samples=10)
    table = rates("time_s", 10, aa, ab)
    loose = next(
        r for r in table if r.statistic == "median" and r.threshold == 0.0 and r.alpha == 0.05
    )
    assert loose.false_positive_rate > 0.2
    best = choose(table)
    # the budget is kept by a larger threshold, at the price of power
    assert best is None or (best.false_positive_rate <= 0.01 and best.threshold >= 0.05)


def test_choose_respects_the_budget_and_none_when_nothing_fits():
    base, slowed = _pools(between=0.3)
    aa, ab = pair_stats(base, slowed, samples=5)
    table = rates("time_s", 5, aa, ab, thresholds=(0.0,), alphas=(1.0,))
    assert choose(table, fp_budget=0.01) is None
