"""How far a figure measured on a sample may be from the server's true one: 95% intervals that
need no assumption about the latency distribution where one can do without.

- a percentile: between two order statistics of the sample, chosen from the binomial
  distribution of how many values fall below the true percentile (distribution-free; exact up
  to 2,000 values, the normal approximation above). With too few values an end is unbounded
  (infinite): below 368 values nothing bounds a p99 from above, since all of them fall under
  it more often than 2.5% of the time;
- a mean: Student's t interval;
- a share (the error rate): Wilson's score interval.
"""

from __future__ import annotations

import math

import numpy as np

Z95 = 1.959963984540054
# Student's t, two-sided 95%, by degrees of freedom (1-30); above 30 the normal's 1.96 is within 4%
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)
EXACT_UP_TO = 2000


def t95(df: int) -> float:
    """Student's t two-sided 95% quantile for ``df`` degrees of freedom (df >= 1)."""
    if df <= len(_T95):
        return _T95[max(df, 1) - 1]
    # the first two terms of the Cornish-Fisher expansion around the normal quantile
    z = Z95
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def _binomial_bounds(n: int, p: float) -> tuple[int, int]:
    """(l, u), 1-based ranks: the true p-quantile lies between the l-th and u-th smallest of n
    values with probability >= 95% (each tail at most 2.5%); l = 0 or u = n + 1 where the
    sample cannot bound that side."""
    if n > EXACT_UP_TO:
        half = Z95 * math.sqrt(n * p * (1 - p))
        return max(0, math.floor(n * p - half)), min(n + 1, math.ceil(n * p + half) + 1)
    log_p, log_q = math.log(p), math.log1p(-p)
    lg = math.lgamma(n + 1)
    cdf, lower, upper = 0.0, 0, n + 1
    found_lower = False
    for k in range(n + 1):
        cdf += math.exp(lg - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * log_p + (n - k) * log_q)
        # P(fewer than j values below the quantile) <= 2.5%: the j-th smallest is a safe lower end
        if not found_lower and cdf > 0.025:
            lower, found_lower = k, True
        # P(at least u values below it) <= 2.5%: the u-th smallest is a safe upper end
        if cdf >= 0.975:
            upper = k + 1
            break
    return lower, upper


def bounded_above_from(q: float) -> int:
    """The fewest values whose percentile ``q`` (0-100) has a finite 95% upper end (p99: 368)."""
    return math.ceil(math.log(0.025) / math.log(q / 100) - 1e-9)


def percentile_interval(values: np.ndarray, q: float) -> tuple[float, float]:
    """95% interval of the true ``q``-th percentile (0-100) from a sample (non-empty); an end
    the sample cannot bound is infinite."""
    ordered = np.sort(values)
    n = ordered.size
    lo, hi = _binomial_bounds(n, min(max(q / 100, 1e-9), 1 - 1e-9))
    return (float(ordered[lo - 1]) if lo >= 1 else -math.inf), (float(ordered[hi - 1]) if hi <= n else math.inf)


def mean_interval(values: np.ndarray) -> tuple[float, float]:
    """Student's t 95% interval of the mean (a single value: that value)."""
    n = values.size
    mean = float(values.mean())
    if n < 2:
        return mean, mean
    half = t95(n - 1) * float(values.std(ddof=1)) / math.sqrt(n)
    return mean - half, mean + half


def share_interval(hits: int, n: int) -> tuple[float, float]:
    """Wilson's 95% score interval of a share ``hits / n`` (n >= 1)."""
    p = hits / n
    z2 = Z95**2
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)
