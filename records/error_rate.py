"""The regression gate's error rate, from runs measured with and without an injected slowdown.

A gate rule flags a pair of runs (baseline A, current B) when B's median is worse than A's by
more than a threshold and, with a significance level, a two-sided Mann-Whitney U test on the
two runs' samples gives p below it (records/gate.py's rule; asv's). Its false-positive rate is
the fraction of A/A pairs (two distinct runs of the same code) it flags; its power at a size is
the fraction of (A, A slowed by that size) pairs it flags. This module computes both for a grid
of thresholds and levels from pools of runs (tools/gate_error_rate.py measures them, with the
suites' ``slowdown`` knob), and picks the rule with the most power at a target size among those
whose false-positive rate stays within a budget.

The pairs are drawn from pools: every unordered pair of distinct baseline runs (the earlier as
A) and every (baseline, slowed) pair. Pairs share runs, so they are not independent: the rates
are exact over the pool, and their uncertainty is that of the number of runs, not of pairs.
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import asdict, dataclass

from moe_repro.records.stats import mann_whitney_u

THRESHOLDS = (0.0, 0.02, 0.03, 0.05, 0.075, 0.10, 0.15, 0.20, 0.30, 0.50)
ALPHAS = (1.0, 0.05, 0.01)  # 1.0: the threshold alone, no test
STATISTICS = ("median", "min")  # what the threshold compares: the runs' medians or minima


@dataclass(frozen=True)
class PairStat:
    ratio: float  # median(B) / median(A), for a lower-is-better metric
    p_value: float
    min_ratio: float = math.nan  # min(B) / min(A)

    def of(self, statistic: str) -> float:
        return self.min_ratio if statistic == "min" else self.ratio


@dataclass
class RuleRate:
    metric: str
    samples: int  # samples a side
    statistic: str  # median | min
    threshold: float
    alpha: float
    false_positive_rate: float
    aa_pairs: int
    power: dict[str, float]  # slowdown (as text, "0.1") -> fraction of pairs flagged
    slowed_pairs: dict[str, int]

    def to_dict(self) -> dict:
        return asdict(self)


def pair_stat(a: list[float], b: list[float]) -> PairStat:
    _, p = mann_whitney_u(a, b)
    return PairStat(statistics.median(b) / statistics.median(a), p, min(b) / min(a))


def flags(stat: PairStat, threshold: float, alpha: float, statistic: str = "median") -> bool:
    """The gate's rule for a lower-is-better metric: worse by more than the threshold (by the
    runs' medians, or minima) and, below a level of 1, significant."""
    return stat.of(statistic) > 1 + threshold and (alpha >= 1 or stat.p_value < alpha)


def pair_stats(
    baseline: list[list[float]], slowed: dict[str, list[list[float]]], samples: int
) -> tuple[list[PairStat], dict[str, list[PairStat]]]:
    """The A/A and the (A, slowed) pair statistics of one pool (each run: its samples, the
    first ``samples`` of them)."""
    cut = [run[:samples] for run in baseline]
    aa = [pair_stat(a, b) for a, b in itertools.combinations(cut, 2)]
    ab = {
        size: [pair_stat(a, b[:samples]) for a in cut for b in runs]
        for size, runs in slowed.items()
    }
    return aa, ab


def rates(
    metric: str,
    samples: int,
    aa: list[PairStat],
    ab: dict[str, list[PairStat]],
    thresholds=THRESHOLDS,
    alphas=ALPHAS,
    statistic_names=STATISTICS,
) -> list[RuleRate]:
    """Every rule's false-positive rate and power over the given pair statistics."""
    out = []
    for statistic, threshold, alpha in itertools.product(statistic_names, thresholds, alphas):
        fp = sum(flags(s, threshold, alpha, statistic) for s in aa)
        power = {
            size: sum(flags(s, threshold, alpha, statistic) for s in stats) / len(stats)
            for size, stats in ab.items()
            if stats
        }
        out.append(
            RuleRate(
                metric,
                samples,
                statistic,
                threshold,
                alpha,
                fp / len(aa) if aa else float("nan"),
                len(aa),
                power,
                {size: len(stats) for size, stats in ab.items()},
            )
        )
    return out


def choose(
    candidates: list[RuleRate], fp_budget: float = 0.01, target: str = "0.1"
) -> RuleRate | None:
    """The rule with the most power at ``target`` among those with a false-positive rate at
    most ``fp_budget``; ties go to the lower false-positive rate, then the larger threshold."""
    ok = [r for r in candidates if r.false_positive_rate <= fp_budget]
    if not ok:
        return None
    return max(
        ok,
        key=lambda r: (
            r.power.get(target, 0.0),
            -r.false_positive_rate,
            sum(r.power.values()),
            r.threshold,
        ),
    )
