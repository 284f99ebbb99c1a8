"""A cell's seeds summarised: mean and sd over the finite values."""

from __future__ import annotations

import math

import pytest

from bnlab.lab.analysis import Stat


def test_stat_counts_only_finite_values():
    s = Stat.of([1.0, 3.0, float("nan"), None])
    assert (s.mean, s.n) == (2.0, 2) and s.std == pytest.approx(math.sqrt(2))
    assert Stat.of([None]).fmt() == "-"


def test_p_above_is_the_exact_permutation_p_value():
    from bnlab.lab.analysis import p_above

    assert p_above([5, 6, 7, 8, 9], [1, 2, 3, 4, 4.5]) == pytest.approx(1 / 252)
    assert p_above([1, 2, 3], [4, 5, 6]) == 1.0
    assert p_above([1, 2, 3], [1, 2, 3]) == pytest.approx(0.7)  # 8 of 20 splits tie, 6 beat
    assert p_above([1.0], [2.0, 3.0]) is None
