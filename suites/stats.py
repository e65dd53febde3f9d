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
    return {"median": statistics.median(xs), "q1": q1, "q3": q3, "iqr": q3 - q1,
            "min": xs[0], "max": xs[-1], "n": len(xs)}
