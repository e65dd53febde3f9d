"""Summary statistics of repeated timings: median and spread (IQR, min, max), as asv reports."""

from __future__ import annotations

import statistics


def quantile(sorted_xs: list[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default method) of an already sorted list."""
    if not sorted_xs:
        raise ValueError("quantile of an empty list")
    pos = q * (len(sorted_xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def summarize(samples: list[float]) -> dict[str, float]:
    xs = sorted(samples)
    q1, q3 = quantile(xs, 0.25), quantile(xs, 0.75)
    return {
        "median": statistics.median(xs),
        "q1": q1,
        "q3": q3,
        "iqr": q3 - q1,
        "min": xs[0],
        "max": xs[-1],
        "n": len(xs),
    }


EXACT_MAX_N = 50  # exact U distribution up to this many samples a side (milliseconds in scipy)


def mann_whitney_u(x: list[float], y: list[float]) -> tuple[float, float]:
    """Two-sided Mann-Whitney U test (Mann & Whitney 1947), as asv uses to call a change real.

    Returns (U of x, p-value), from scipy.stats.mannwhitneyu. Benchmarks keep 3-10 repeats,
    where a normal approximation misjudges p near alpha, so the p-value is exact (from the U
    distribution) when both samples have at most EXACT_MAX_N values and there are no ties;
    otherwise scipy's "auto" method (normal approximation with tie and continuity correction).
    """
    from scipy.stats import mannwhitneyu  # scipy loads in ~0.3 s; only the gate needs it

    if not x or not y:
        raise ValueError("Mann-Whitney U needs two non-empty samples")
    pooled = list(x) + list(y)
    exact = max(len(x), len(y)) <= EXACT_MAX_N and len(set(pooled)) == len(pooled)
    result = mannwhitneyu(x, y, alternative="two-sided", method="exact" if exact else "auto")
    return float(result.statistic), float(result.pvalue)
