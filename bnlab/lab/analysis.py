"""A cell's seeds summarised (mean and sd) and the line below which a run did not learn.

The jitter measures themselves (swing, step_sd, the detrended measures, churn and the
floors) are the library's: bnlab/jitter.py.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

NO_LEARNING = 15.0  # final val acc (%) below which a run did not learn (chance is 10%)


def finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


@dataclass
class Stat:
    """Mean and sample standard deviation over seeds (diverged seeds counted apart)."""
    mean: float | None
    std: float | None
    n: int

    @classmethod
    def of(cls, values: list[float | None]) -> Stat:
        vals = [v for v in values if finite(v)]
        if not vals:
            return cls(None, None, 0)
        return cls(float(np.mean(vals)), float(np.std(vals, ddof=1)) if len(vals) > 1 else None,
                   len(vals))

    def fmt(self, digits: int = 1) -> str:
        if self.mean is None:
            return "-"
        s = f"{self.mean:.{digits}f}"
        return s + (f" ± {self.std:.{digits}f}" if self.std is not None else "")


SEPARATED = 0.05  # the p-value below which two cells' seeds are told apart


def p_above(a: list[float], b: list[float]) -> float | None:
    """One-sided exact permutation p-value that the seeds in `a` sit above those in `b`: the
    share of all ways of splitting the pooled values into groups of len(a) and len(b) whose
    difference of means is at least the observed one. With 5 seeds a side the smallest is
    1/252; with 3, 1/20. None with fewer than 2 seeds on a side."""
    if len(a) < 2 or len(b) < 2:
        return None
    pooled, n = [*a, *b], len(a)
    total = sum(pooled)
    observed = sum(a) / n - sum(b) / len(b)
    hits = count = 0
    for idx in itertools.combinations(range(len(pooled)), n):
        s = sum(pooled[i] for i in idx)
        hits += s / n - (total - s) / len(b) >= observed - 1e-12
        count += 1
    return hits / count


def p_positive(xs: list[float]) -> float | None:
    """One-sided exact sign-flip p-value that paired differences `xs` (one per seed) sit above
    0: the share of the 2^n ways of flipping their signs whose mean is at least the observed
    one. With 5 seeds the smallest is 1/32; with 3, 1/8. None with fewer than 2."""
    if len(xs) < 2:
        return None
    observed = sum(xs)
    hits = sum(sum(s * x for s, x in zip(signs, xs, strict=True)) >= observed - 1e-12
               for signs in itertools.product((1, -1), repeat=len(xs)))
    return hits / 2 ** len(xs)


def ratio_interval(a: list[float], b: list[float], draws: int = 10_000,
                   level: float = 0.95) -> tuple[float | None, float | None]:
    """A percentile bootstrap interval for mean(a) / mean(b): each group's seeds resampled
    with replacement, `draws` times, from a fixed generator (the same numbers every report).
    With 5 seeds a side it is rough, and says so by its width. (None, None) with fewer than 2
    seeds on a side."""
    if len(a) < 2 or len(b) < 2:
        return None, None
    rng = np.random.default_rng(0)
    ma = rng.choice(np.asarray(a, float), (draws, len(a))).mean(1)
    mb = rng.choice(np.asarray(b, float), (draws, len(b))).mean(1)
    r = ma / np.maximum(mb, 1e-12)
    q = (1 - level) / 2
    return float(np.quantile(r, q)), float(np.quantile(r, 1 - q))


# Two-sided 97.5% quantiles of Student's t by degrees of freedom (for 95% intervals); above
# the table, the normal's.
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228}


def mean_interval(xs: list[float]) -> tuple[float | None, float | None]:
    """A 95% t interval for the mean of `xs` (paired differences over seeds, say); (None, None)
    with fewer than 2 values."""
    if len(xs) < 2:
        return None, None
    m, sd = float(np.mean(xs)), float(np.std(xs, ddof=1))
    half = T975.get(len(xs) - 1, 1.96) * sd / math.sqrt(len(xs))
    return m - half, m + half


def diff_interval(a: list[float], b: list[float]) -> tuple[float | None, float | None]:
    """A 95% Welch t interval for mean(a) - mean(b), two independent groups of seeds (the
    degrees of freedom by Welch-Satterthwaite, rounded down); (None, None) with fewer than 2
    values on a side."""
    if len(a) < 2 or len(b) < 2:
        return None, None
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return (float(np.mean(a) - np.mean(b)),) * 2
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    d, half = float(np.mean(a) - np.mean(b)), T975.get(int(df), 1.96) * se
    return d - half, d + half
