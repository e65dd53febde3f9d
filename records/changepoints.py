"""Change points in a result's history: where a metric stepped to a new level, and which way.

The method is asv's (airspeed-velocity, ``asv/step_detect.py``): the history is fitted by a
piecewise-constant function minimizing the Potts functional ``gamma * k + sum |y_i - mu_r|``
(an L1 cost, each level the median of its segment), solved exactly by the Bellman recursion of
Friedrich et al., "Complexity Penalized M-Estimation: Fast Computation", J. Comput. Graph.
Stat. 17(1) 2008. The penalty ``gamma`` is chosen as asv does, by the Schwarz-type information
criterion of Yao, "Estimating the number of change-points via Schwarz criterion", Stat. Probab.
Lett. 6 (1988): minimize ``beta * k + ln(sigma_0 + sum |y - mu|)`` with ``beta = 4 ln(n) / n``
over a log grid of gammas, ``sigma_0`` the noise floor asv fixes (a tenth of the smallest jump
between levels; a thousandth of the level for one or two segments). Differences from asv: the
fit is exact on the newest MAX_POINTS points (asv approximates with windows of 20 to scale), the
gamma search is a fixed grid, not a golden-section search, and asv's AR(1) noise term is left
out (runs here are not batched per commit).

A boundary between two fitted levels is reported as a :class:`Step` when, as in asv's
``detect_regressions``, the jump exceeds both segments' mean absolute deviation, and the levels
differ by at least ``min_ratio`` (either way). The default, 25%, sits above the run-to-run
spread of CPU time measured for the gate's error rate on a shared machine (README, "The gate's
error rate"): a history's points are single runs made under whatever load the machine had.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Sequence

DEFAULT_MIN_RATIO = 1.25
MAX_POINTS = 200  # the newest points fitted exactly (O(n^2) per penalty tried)
_GAMMAS = 24  # penalties tried, log-spaced (asv's range: gamma_0 * [0.1 / n, 1])


@dataclass(frozen=True)
class Step:
    index: int  # position of the first point of the new level in the history
    before: float  # level before the step
    after: float  # level after the step
    ratio: float  # after / before
    kind: str  # "regression" or "improvement" (depends on higher_is_better)


@dataclass(frozen=True)
class Segment:
    start: int  # first index (inclusive), in the fitted points' numbering
    end: int  # last index (exclusive)
    level: float  # the segment's median
    error: float  # its mean absolute deviation from the median


def _deviation_table(y: list[float]) -> list[list[float]]:
    """dist[l][r - l]: sum |y_i - median(y[l..r])| for every l <= r, each row rolled with two
    heaps in O(n log n) (asv's rolling_median_dev)."""
    table = []
    for left in range(len(y)):
        low: list[float] = []  # max-heap (negated) of the lower half
        high: list[float] = []  # min-heap of the upper half
        low_sum = high_sum = 0.0
        row = []
        for x in y[left:]:
            if low and x > -low[0]:
                heapq.heappush(high, x)
                high_sum += x
            else:
                heapq.heappush(low, -x)
                low_sum += x
            if len(low) > len(high) + 1:
                v = -heapq.heappop(low)
                low_sum -= v
                heapq.heappush(high, v)
                high_sum += v
            elif len(high) > len(low):
                v = heapq.heappop(high)
                high_sum -= v
                heapq.heappush(low, -v)
                low_sum += v
            median = -low[0] if len(low) > len(high) else (-low[0] + high[0]) / 2
            dev = (median * len(low) - low_sum) + (high_sum - median * len(high))
            row.append(max(0.0, dev))
        table.append(row)
    return table


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    k = len(s) // 2
    return s[k] if len(s) % 2 else (s[k - 1] + s[k]) / 2


def _potts(n: int, dist: list[list[float]], gamma: float) -> list[int]:
    """Right edges (exclusive) of the segments minimizing gamma * k + sum of L1 costs."""
    best = [0.0] * (n + 1)
    best[0] = -gamma
    left_of = [0] * (n + 1)
    for r in range(1, n + 1):
        value, arg = math.inf, 0
        for left in range(r):
            cost = best[left] + gamma + dist[left][r - 1 - left]
            if cost <= value:
                value, arg = cost, left
        best[r], left_of[r] = value, arg
    rights = []
    r = n
    while r > 0:
        rights.append(r)
        r = left_of[r]
    return rights[::-1]


def fit_segments(values: Sequence[float]) -> list[Segment]:
    """The piecewise-constant fit of ``values`` (finite numbers), penalty by the criterion."""
    y = [float(v) for v in values]
    n = len(y)
    if n == 0:
        return []
    dist = _deviation_table(y)
    gamma_0 = dist[0][n - 1] or 1.0
    beta = 4 * math.log(n) / n if n > 1 else 1.0
    best: tuple[float, list[int]] | None = None
    seen: set[tuple[int, ...]] = set()
    low = math.log(0.1 / n)
    for i in range(_GAMMAS):
        gamma = gamma_0 * math.exp(low * (1 - i / (_GAMMAS - 1)))
        rights = _potts(n, dist, gamma)
        if tuple(rights) in seen:
            continue
        seen.add(tuple(rights))
        lefts = [0, *rights[:-1]]
        levels = [_median(y[a:b]) for a, b in zip(lefts, rights)]
        cost = sum(dist[a][b - 1 - a] for a, b in zip(lefts, rights))
        if len(levels) > 2:
            sigma_0 = 0.1 * min(abs(u - v) for u, v in zip(levels, levels[1:]))
        else:
            sigma_0 = 0.001 * min(abs(v) for v in levels)
        objective = beta * len(rights) + math.log(max(1e-300, sigma_0) + cost)
        if best is None or objective < best[0]:
            best = (objective, rights)
    assert best is not None
    rights = best[1]
    lefts = [0, *rights[:-1]]
    return [
        Segment(a, b, _median(y[a:b]), dist[a][b - 1 - a] / (b - a)) for a, b in zip(lefts, rights)
    ]


def _without_spikes(ys: list[float], segments: list[Segment], min_ratio: float) -> list[Segment]:
    """Merge a one-point segment between two segments at the same level (within ``min_ratio``)
    into them: one run under a burst of load is an outlier, not two steps (asv accepts short
    intervals only where the level does not come back, ``detect_regressions``' min_size)."""
    out = list(segments)
    i = 1
    while i < len(out) - 1:
        prev, seg, nxt = out[i - 1], out[i], out[i + 1]
        same = (
            prev.level > 0
            and nxt.level > 0
            and max(prev.level / nxt.level, nxt.level / prev.level) < min_ratio
        )
        if seg.end - seg.start == 1 and same:
            points = ys[prev.start : nxt.end]
            level = _median(points)
            error = sum(abs(p - level) for p in points) / len(points)
            out[i - 1 : i + 2] = [Segment(prev.start, nxt.end, level, error)]
            i = max(1, i - 1)
        else:
            i += 1
    return out


def detect_steps(
    values: Sequence[float | None],
    *,
    higher_is_better: bool = False,
    min_ratio: float = DEFAULT_MIN_RATIO,
) -> list[Step]:
    """The steps of a history, oldest first. ``values`` in time order; None or a non-finite
    value is a point with no number (skipped, indices still count it). A step is a boundary of
    the fit whose levels differ by at least ``min_ratio`` and by more than either segment's
    mean absolute deviation; ``kind`` is "regression" where the new level is worse (higher,
    unless ``higher_is_better``). Levels of opposite sign or zero give no ratio: not reported."""
    if not min_ratio >= 1:
        raise ValueError(f"min_ratio must be >= 1, got {min_ratio!r}")
    where = [i for i, v in enumerate(values) if v is not None and math.isfinite(v)][-MAX_POINTS:]
    ys = [float(values[i]) for i in where]  # type: ignore[arg-type]
    steps = []
    segments = _without_spikes(ys, fit_segments(ys), min_ratio)
    for prev, seg in zip(segments, segments[1:]):
        before, after = prev.level, seg.level
        if before == 0 or after == 0 or (before > 0) != (after > 0):
            continue
        ratio = after / before
        big = max(ratio, 1 / ratio) >= min_ratio
        beyond_noise = abs(after - before) > max(prev.error, seg.error)
        if not (big and beyond_noise):
            continue
        worse = ratio < 1 if higher_is_better else ratio > 1
        steps.append(
            Step(where[seg.start], before, after, ratio, "regression" if worse else "improvement")
        )
    return steps


def open_regressions(
    values: Sequence[float | None],
    steps: list[Step],
    *,
    higher_is_better: bool = False,
    min_ratio: float = DEFAULT_MIN_RATIO,
) -> list[Step]:
    """The regression steps the history has not recovered from: the newest level (the last
    step's, or the whole history's) is still worse than the level before the step by at least
    ``min_ratio``. A gate fails on these; a regression a later step undid is history."""
    if not steps:
        return []
    latest = steps[-1].after
    out = []
    for step in steps:
        if step.kind != "regression":
            continue
        ratio = latest / step.before
        worse = (1 / ratio if higher_is_better else ratio) if ratio > 0 else 0.0
        if worse >= min_ratio:
            out.append(step)
    return out
