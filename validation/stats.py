"""The small statistics the step-time estimate needs, without numpy or scipy in the import path: mean,
percentile, sample standard deviation, lag-1 autocorrelation and Student's t 0.975 quantile."""
from __future__ import annotations

import math
from typing import Sequence


def mean(xs: Sequence[float]) -> float:
    """The arithmetic mean (math.fsum: exact for long series)."""
    return math.fsum(xs) / len(xs)


def median(xs: Sequence[float]) -> float:
    """The 50th percentile."""
    return percentile(xs, 50.0)


def percentile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default method)."""
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def std(xs: Sequence[float]) -> float:
    """The sample standard deviation (n - 1; 0 for fewer than 2 values)."""
    if len(xs) < 2:
        return 0.0
    m = mean(xs)
    return math.sqrt(math.fsum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def lag1(xs: Sequence[float]) -> float:
    """Lag-1 autocorrelation (0 for fewer than 3 values or no variance)."""
    if len(xs) < 3:
        return 0.0
    m = mean(xs)
    den = math.fsum((x - m) ** 2 for x in xs)
    if den == 0:
        return 0.0
    return math.fsum((xs[i] - m) * (xs[i + 1] - m) for i in range(len(xs) - 1)) / den


def t_quantile_975(dof: float) -> float:
    """Student's t 0.975 quantile (scipy-free: Cornish-Fisher series, exact enough for dof >= 1)."""
    if dof < 3:  # below 3 the series is poor: use the exact value of the smaller integer (wider)
        dof = max(1, int(dof))
    if dof == 1:
        return 12.706204736
    if dof == 2:
        return 4.302652730
    z = 1.959963985
    g1 = (z ** 3 + z) / 4
    g2 = (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96
    g3 = (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384
    g4 = (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160
    return z + g1 / dof + g2 / dof ** 2 + g3 / dof ** 3 + g4 / dof ** 4
