"""How much validation accuracy jitters from one evaluation to the next, defined once.

Two families of measures, and the test set's own floor beside them:

- The claims' quantity, `swing`: half the peak-to-peak range of val acc in a window
  ("+/- points"). Kept because it is what the reports quote; it is mostly trend when the
  window sits where the model still learns, so no verdict on the new protocol rules on it.
- Detrended jitter, on the plateau window (`plateau`: the evaluations after the first
  PLATEAU of training): `residual_sd`, the sd of the residuals around a least-squares line
  (a linear trend removed), and `von_neumann_sd`, sqrt(mean squared successive difference
  / 2), which a slow trend of any shape barely moves. Both are the sd of one evaluation's
  noise (points), so they can be set beside the floors. `loss_jitter`: the von Neumann sd
  of log val loss, where a model near chance jitters without room in its accuracy.
- Per-example: `churn`, the share of test images whose predicted class changes between
  consecutive evaluations, and `flip_share`, the share whose correctness changes.
- Floors. `binomial_floor`: sqrt(p(1-p)/N), the sd of a test set of N images measuring a
  model of accuracy p (every evaluation an independent draw). `churn_floor`: the jitter
  the observed flips alone would give if each flipped image were a fair coin between right
  and wrong, i.e. the model's quality did not change: successive differences then have
  variance f/N (f the flip share), and the von Neumann sd is sqrt(f / (2N)). Jitter at the
  churn floor is prediction churn through a fixed test set; jitter well above it means the
  model's quality itself moves from one evaluation to the next.

Everything takes plain sequences and numpy arrays; nothing here reads a file.
"""

from __future__ import annotations

import math

import numpy as np

WINDOW = 0.4       # the claims' swing window: the last 40% of training
MIN_EVALS = 8      # evaluations a window must hold
PLATEAU = 0.5      # the plateau window: evaluations after the first half of training
MISSING = 255      # a test image without a prediction (a train-mode batch of one image)


def window(epochs, values, total_epochs: float, start: float = 1.0 - WINDOW) -> list[float]:
    """The values at evaluations with epoch >= start * total_epochs."""
    lo = start * total_epochs - 1e-9
    return [v for e, v in zip(epochs, values, strict=True) if e >= lo]


def on_plateau(epoch: float, total_epochs: float) -> bool:
    """Whether an evaluation at `epoch` is in the plateau window: epoch > PLATEAU *
    total_epochs (the stated rule: at a constant learning rate after warmup, the second half
    of training)."""
    return epoch > PLATEAU * total_epochs + 1e-9


def plateau(epochs, values, total_epochs: float) -> list[float]:
    """The values in the plateau window (on_plateau)."""
    return [v for e, v in zip(epochs, values, strict=True) if on_plateau(e, total_epochs)]


def _need(values, what: str) -> np.ndarray:
    a = np.asarray(values, dtype=float)
    if a.ndim != 1 or len(a) < MIN_EVALS:
        raise ValueError(f"{what} needs at least {MIN_EVALS} evaluations, got {len(a)}")
    return a


def swing(values) -> float:
    """Half the peak-to-peak range: the "+/- points" of the claims."""
    a = _need(values, "swing")
    return float(a.max() - a.min()) / 2.0


def step_sd(values) -> float:
    """Standard deviation of successive differences (evaluation to evaluation)."""
    return float(np.std(np.diff(_need(values, "step_sd")), ddof=1))


def trend(values) -> tuple[float, float]:
    """Least-squares line through the values against their index: (slope per evaluation,
    intercept)."""
    a = _need(values, "trend")
    slope, intercept = np.polyfit(np.arange(len(a), dtype=float), a, 1)
    return float(slope), float(intercept)


def residual_sd(values) -> float:
    """Sd of the residuals around the least-squares line (2 degrees of freedom used)."""
    a = _need(values, "residual_sd")
    slope, intercept = trend(a)
    res = a - (slope * np.arange(len(a)) + intercept)
    return float(math.sqrt(float(np.sum(res ** 2)) / (len(a) - 2)))


def von_neumann_sd(values) -> float:
    """sqrt(mean squared successive difference / 2): the noise sd, blind to slow trends."""
    a = _need(values, "von_neumann_sd")
    return float(math.sqrt(float(np.mean(np.diff(a) ** 2)) / 2.0))


def loss_jitter(losses) -> float:
    """Von Neumann sd of log val loss (a relative measure: 0.1 is about 10% per evaluation)."""
    a = _need(losses, "loss_jitter")
    if not np.all(np.isfinite(a)) or np.any(a <= 0):
        return math.nan
    return von_neumann_sd(np.log(a))


def _pairs(preds: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    p = np.asarray(preds)
    if p.ndim != 2 or p.shape[0] < 2:
        raise ValueError(f"needs a (evaluations >= 2, images) array, got shape {p.shape}")
    a, b = p[:-1], p[1:]
    seen = (a != MISSING) & (b != MISSING)
    return a, b, seen


def churn(preds) -> float:
    """Mean share (%) of test images whose predicted class changes between consecutive
    evaluations; `preds` is (evaluations, images) of class indices."""
    a, b, seen = _pairs(preds)
    return float(100.0 * np.mean(np.sum((a != b) & seen, 1) / np.maximum(seen.sum(1), 1)))


def flip_share(preds, labels) -> float:
    """Mean share (%) of test images whose correctness changes between consecutive
    evaluations."""
    a, b, seen = _pairs(preds)
    y = np.asarray(labels)
    if y.shape != (a.shape[1],):
        raise ValueError(f"labels of shape {y.shape} do not match {a.shape[1]} images")
    flips = ((a == y) != (b == y)) & seen
    return float(100.0 * np.mean(flips.sum(1) / np.maximum(seen.sum(1), 1)))


def churn_floor(flip_pct: float, n: int) -> float:
    """The von Neumann sd (points) that flips alone give when the quality does not change."""
    return 100.0 * math.sqrt(flip_pct / 100.0 / (2.0 * n))


def binomial_floor(acc_pct: float, n: int) -> float:
    """Sd (points) of the accuracy of N test images measuring a model of accuracy acc_pct."""
    p = min(max(acc_pct / 100.0, 0.0), 1.0)
    return 100.0 * math.sqrt(p * (1.0 - p) / n)


def accuracy(preds, labels) -> np.ndarray:
    """Accuracy (%) of each evaluation's predictions, images without one left out."""
    p, y = np.asarray(preds), np.asarray(labels)
    seen = p != MISSING
    return 100.0 * ((p == y) & seen).sum(1) / np.maximum(seen.sum(1), 1)


def variance_split(full, weights_only) -> dict[str, float]:
    """Detrended variance of `full` (val acc with EMA statistics) split into the part of
    `weights_only` (the same weights with PreciseBN statistics) and the part of their
    difference (what the running statistics add), plus twice their covariance, so that
    the three parts sum to the whole. Residuals around each series' own line."""
    f, w = _need(full, "variance_split"), _need(weights_only, "variance_split")
    if len(f) != len(w):
        raise ValueError(f"series of {len(f)} and {len(w)} evaluations cannot be split")
    x = np.arange(len(f), dtype=float)

    def res(a):
        return a - np.polyval(np.polyfit(x, a, 1), x)

    rw, rs = res(w), res(f - w)
    dof = len(f) - 2
    return {"total": float(np.sum(res(f) ** 2) / dof), "weights": float(np.sum(rw ** 2) / dof),
            "statistics": float(np.sum(rs ** 2) / dof),
            "covariance": float(2 * np.sum(rw * rs) / dof)}
