"""Intervals for success rates: Wilson and Newcombe for attempts, t and Welch over training seeds.

Pure Python (no scipy): the t quantiles for the few degrees of freedom a seed count gives are tabulated.
"""

from __future__ import annotations

import math
from typing import Sequence

Z95 = 1.959963984540054
# two-sided 95% t quantiles by degrees of freedom (1..30); beyond that the normal's
T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
       2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t95(df: int) -> float:
    if df < 1:
        raise ValueError("a t interval needs at least two values")
    return T95[df - 1] if df <= len(T95) else Z95


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion; (0, 1) for no attempts."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def newcombe(s1: int, n1: int, s2: int, n2: int) -> tuple[float, float, float]:
    """p1 - p2 with Newcombe's hybrid score interval (method 10, from the two Wilson intervals)."""
    p1, p2 = s1 / n1, s2 / n2
    l1, u1 = wilson(s1, n1)
    l2, u2 = wilson(s2, n2)
    d = p1 - p2
    return d, d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)


def mean_interval(values: Sequence[float]) -> tuple[float, float | None, float | None]:
    """Mean with a 95% t interval; no interval for a single value."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    m = sum(values) / n
    if n < 2:
        return m, None, None
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    half = t95(n - 1) * sd / math.sqrt(n)
    return m, m - half, m + half


def welch_interval(a: Sequence[float], b: Sequence[float]) -> tuple[float, float | None, float | None]:
    """mean(a) - mean(b) with a Welch 95% interval; where one side has a single value, its variance counts as
    zero (a non-learned arm has one policy, not a spread over training seeds); none where neither has two."""
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    d = ma - mb
    var = 0.0
    dfs = []
    for xs, m in ((a, ma), (b, mb)):
        if len(xs) > 1:
            v = sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs)
            var += v
            dfs.append((v, len(xs) - 1))
    if not dfs:
        return d, None, None
    if var == 0:
        return d, d, d
    df = var ** 2 / sum(v ** 2 / k for v, k in dfs if v > 0) if any(v > 0 for v, _ in dfs) else min(k for _, k in dfs)
    half = t95(max(1, int(math.floor(df)))) * math.sqrt(var)
    return d, d - half, d + half
