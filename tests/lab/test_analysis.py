"""The jitter statistics: swing, step sd, mean and std over seeds."""

from __future__ import annotations

import math

import pytest

from bnlab.lab.analysis import MIN_EVALS, Stat, step_sd, swing, window


def test_swing_is_half_the_range_over_the_last_40_percent():
    epochs = [i / 5 for i in range(1, 26)]  # 5 evaluations per epoch, 5 epochs
    accs = [50.0] * 14 + [40.0, 60.0, 45.0, 55.0, 50.0, 52.0, 48.0, 50.0, 51.0, 49.0, 50.0]
    w = window(epochs, accs, 5)
    assert len(w) == 11 and w[0] == 40.0  # from epoch 3.0 (60% of 5) on
    assert swing(w) == 10.0
    diffs = [b - a for a, b in zip(w, w[1:], strict=False)]
    mean = sum(diffs) / len(diffs)
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1))
    assert step_sd(w) == pytest.approx(sd)


def test_swing_refuses_too_few_evaluations():
    with pytest.raises(ValueError, match=str(MIN_EVALS)):
        swing([1.0] * (MIN_EVALS - 1))


def test_stat_counts_only_finite_values():
    s = Stat.of([1.0, 3.0, float("nan"), None])
    assert (s.mean, s.n) == (2.0, 2) and s.std == pytest.approx(math.sqrt(2))
    assert Stat.of([None]).fmt() == "-"
