"""Summary statistics of repeated timings: median and spread (IQR, min, max), as asv reports."""

from __future__ import annotations

import math
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


def mann_whitney_u(x: list[float], y: list[float]) -> tuple[float, float]:
    """Two-sided Mann-Whitney U test (Mann & Whitney 1947), as asv uses to call a change real.

    Returns (U of x, p-value). Exact p from the U distribution when there are no ties and the
    samples are small (n1 * n2 <= 400); otherwise the normal approximation with tie correction
    and continuity correction.
    """
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        raise ValueError("Mann-Whitney U needs two non-empty samples")
    pooled = sorted([(v, 0) for v in x] + [(v, 1) for v in y])
    ranks = [0.0] * len(pooled)
    ties: list[int] = []
    i = 0
    while i < len(pooled):  # average ranks over runs of equal values
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[k] = (i + j) / 2 + 1
        ties.append(j - i + 1)
        i = j + 1
    r1 = sum(r for r, (_, who) in zip(ranks, pooled) if who == 0)
    u = r1 - n1 * (n1 + 1) / 2
    if all(t == 1 for t in ties) and n1 * n2 <= 400:
        counts = _u_distribution(n1, n2)
        total = sum(counts)
        k = int(round(u))
        lower = sum(counts[: k + 1]) / total
        upper = sum(counts[k:]) / total
        return u, min(1.0, 2 * min(lower, upper))
    n = n1 + n2
    mu = n1 * n2 / 2
    tie_term = sum(t ** 3 - t for t in ties) / (n * (n - 1)) if n > 1 else 0.0
    sigma = math.sqrt(n1 * n2 / 12 * ((n + 1) - tie_term))
    if sigma == 0:
        return u, 1.0
    z = (abs(u - mu) - 0.5) / sigma
    return u, min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2)))


def _u_distribution(n1: int, n2: int) -> list[int]:
    """Number of arrangements giving each U = 0..n1*n2 (recurrence f(m,n,u) = f(m-1,n,u-n) + f(m,n-1,u))."""
    # table[m][n] is the count list for sample sizes (m, n); built bottom-up.
    table = [[[1] if m == 0 or n == 0 else None for n in range(n2 + 1)] for m in range(n1 + 1)]
    for m in range(1, n1 + 1):
        for n in range(1, n2 + 1):
            out = [0] * (m * n + 1)
            for u, c in enumerate(table[m - 1][n]):  # the largest value is from x: adds n to U
                out[u + n] += c
            for u, c in enumerate(table[m][n - 1]):  # the largest value is from y
                out[u] += c
            table[m][n] = out
    return table[n1][n2]
