"""bnlab.jitter on synthetic series whose answer is known by construction."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bnlab import jitter
from bnlab.jitter import MIN_EVALS, MISSING


def test_swing_is_half_the_range_over_the_last_40_percent():
    epochs = [i / 5 for i in range(1, 26)]  # 5 evaluations per epoch, 5 epochs
    accs = [50.0] * 14 + [40.0, 60.0, 45.0, 55.0, 50.0, 52.0, 48.0, 50.0, 51.0, 49.0, 50.0]
    w = jitter.window(epochs, accs, 5)
    assert len(w) == 11 and w[0] == 40.0  # from epoch 3.0 (60% of 5) on
    assert jitter.swing(w) == 10.0
    diffs = np.diff(w)
    assert jitter.step_sd(w) == pytest.approx(float(np.std(diffs, ddof=1)))


def test_measures_refuse_too_few_evaluations():
    for f in (jitter.swing, jitter.residual_sd, jitter.von_neumann_sd, jitter.loss_jitter):
        with pytest.raises(ValueError, match=str(MIN_EVALS)):
            f([1.0] * (MIN_EVALS - 1))


def test_plateau_is_the_second_half_of_training():
    epochs = [i / 10 for i in range(1, 201)]  # 10 evaluations per epoch, 20 epochs
    w = jitter.plateau(epochs, list(range(200)), 20)
    assert len(w) == 100 and w[0] == 100  # epoch 10.1 onwards


def test_a_trend_swings_but_does_not_jitter():
    line = 30 + 0.2 * np.arange(50)  # 10 points of rise over the window, no noise
    assert jitter.swing(line) == pytest.approx(4.9)
    assert jitter.residual_sd(line) == pytest.approx(0, abs=1e-9)
    assert jitter.von_neumann_sd(line) == pytest.approx(0.2 / math.sqrt(2))
    assert jitter.trend(line)[0] == pytest.approx(0.2)


def test_detrended_measures_recover_the_noise_sd_under_a_trend():
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 2.0, 4000)
    series = 20 + 0.01 * np.arange(4000) + noise
    assert jitter.residual_sd(series) == pytest.approx(2.0, rel=0.05)
    assert jitter.von_neumann_sd(series) == pytest.approx(2.0, rel=0.05)
    assert jitter.swing(series) > 3 * 2.0  # the range keeps growing with the window


def test_loss_jitter_is_relative():
    rng = np.random.default_rng(1)
    base = np.exp(rng.normal(0, 0.1, 3000))
    assert jitter.loss_jitter(base) == pytest.approx(0.1, rel=0.05)
    assert jitter.loss_jitter(5 * base) == pytest.approx(jitter.loss_jitter(base))
    assert math.isnan(jitter.loss_jitter([1.0] * 9 + [float("inf")]))


def test_churn_and_flips_count_changed_images():
    labels = np.array([0, 1, 2, 3])
    preds = np.array([[0, 1, 2, 3],    # all right
                      [0, 1, 2, 4],    # image 3 wrong: 1 changed class, 1 flip
                      [0, 1, 5, 5]])   # image 2 wrong (flip), image 3 wrong -> other wrong
    assert jitter.churn(preds) == pytest.approx(100 * (1 / 4 + 2 / 4) / 2)
    assert jitter.flip_share(preds, labels) == pytest.approx(100 * (1 / 4 + 1 / 4) / 2)
    assert list(jitter.accuracy(preds, labels)) == [100, 75, 50]


def test_missing_predictions_are_left_out():
    labels = np.array([0, 1])
    preds = np.array([[0, MISSING], [1, MISSING]])
    assert jitter.churn(preds) == 100.0 and jitter.flip_share(preds, labels) == 100.0
    assert list(jitter.accuracy(preds, labels)) == [100, 0]


def test_churn_floor_is_the_jitter_of_quality_neutral_flips():
    # A model of constant quality: at each evaluation a random 6% of the images flip
    # between right and wrong, as many each way on average. Its accuracy's von Neumann sd
    # must match the floor computed from the observed flip share.
    rng = np.random.default_rng(2)
    n, evals = 1000, 600
    labels = np.zeros(n, dtype=np.int64)
    right = rng.random(n) < 0.5
    rows = []
    for _ in range(evals):
        right ^= rng.random(n) < 0.06
        rows.append(np.where(right, 0, 1))
    preds = np.stack(rows)
    f = jitter.flip_share(preds, labels)
    assert f == pytest.approx(6.0, rel=0.05)
    acc = jitter.accuracy(preds, labels)
    assert jitter.von_neumann_sd(acc) == pytest.approx(jitter.churn_floor(f, n), rel=0.1)
    # far below the floor that treats every evaluation as a fresh draw of the test set
    assert jitter.churn_floor(f, n) < jitter.binomial_floor(50, n) / 2


def test_binomial_floor_at_the_issue_numbers():
    assert jitter.binomial_floor(40, 1017) == pytest.approx(1.536, abs=1e-3)
    assert jitter.binomial_floor(40, 10000) == pytest.approx(0.490, abs=1e-3)


def test_variance_split_adds_up_and_finds_the_statistics_noise():
    rng = np.random.default_rng(3)
    weights = 50 + 0.05 * np.arange(2000) + rng.normal(0, 1.0, 2000)
    stats_noise = rng.normal(0, 3.0, 2000)
    parts = jitter.variance_split(weights + stats_noise, weights)
    assert parts["weights"] + parts["statistics"] + parts["covariance"] == \
        pytest.approx(parts["total"])
    assert parts["weights"] == pytest.approx(1.0, rel=0.1)
    assert parts["statistics"] == pytest.approx(9.0, rel=0.1)
    with pytest.raises(ValueError, match="cannot be split"):
        jitter.variance_split(weights[:10], weights[:9])


def test_a_once_an_epoch_reading_needs_every_epoch_end_of_the_plateau(tmp_path):
    """`recal` (val/acc_precise at epoch ends) and `ends` (val/acc at epoch ends) give a plateau
    mean from the plateau's 5 epoch ends of a 10-epoch run, none from fewer; other kinds need
    jitter.MIN_EVALS evaluations; Run.series reads by step as by epoch."""
    from bnlab.lab.results import plateau_ends
    from conftest import fake_headline_run

    r = fake_headline_run(tmp_path / "r", [float(i) for i in range(100)], epochs=10,
                          precise=1.0)  # val/acc i at step i + 1, epoch (i + 1) / 10
    assert plateau_ends(10) == 5
    assert r.jitter(10, "ends")["plateau_acc"] == pytest.approx((59 + 69 + 79 + 89 + 99) / 5)
    assert r.jitter(10, "recal")["plateau_acc"] == pytest.approx((59 + 69 + 79 + 89 + 99) / 5
                                                                  + 1.0)
    short = fake_headline_run(tmp_path / "s", [float(i) for i in range(90)], epochs=10,
                              precise=1.0)  # 9 epochs logged: 4 epoch ends on the plateau
    assert short.jitter(10, "recal") == {} and short.jitter(10, "ends") == {}
    few = fake_headline_run(tmp_path / "f", [50.0] * 14, epochs=2)  # 4 evaluations on it
    assert few.jitter(2) == {}
    steps, accs = r.series("val/acc", by="step")
    assert steps[:2] == [1, 2] and accs[:2] == [0.0, 1.0]
