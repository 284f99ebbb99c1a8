"""What the tables report about one run and about a cell's seeds, defined once.

Swing (claims C1, C3, C6, C9): half the peak-to-peak range of validation accuracy over the
evaluations in the last 40% of training, i.e. +/- points around the middle of the range.
A run needs at least `MIN_EVALS` evaluations in that window (evaluate several times per
epoch). Beside it, `step_sd`: the standard deviation of successive differences of val acc
in the same window, which a slow trend barely moves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

WINDOW = 0.4    # the last 40% of training
MIN_EVALS = 8   # evaluations the window must hold
NO_LEARNING = 15.0  # final val acc (%) below which a run did not learn (chance is 10%)


def window(epochs: list[float], accs: list[float], total_epochs: float) -> list[float]:
    """Val acc at the evaluations in the last WINDOW of training (epoch >= 60% of total)."""
    start = (1.0 - WINDOW) * total_epochs - 1e-9
    return [a for e, a in zip(epochs, accs, strict=True) if e >= start]


def swing(accs: list[float]) -> float:
    """Half the peak-to-peak range: the "+/- points" of the claims."""
    if len(accs) < MIN_EVALS:
        raise ValueError(f"swing needs at least {MIN_EVALS} evaluations, got {len(accs)}")
    return (max(accs) - min(accs)) / 2.0


def step_sd(accs: list[float]) -> float:
    """Standard deviation of successive differences (evaluation to evaluation)."""
    if len(accs) < MIN_EVALS:
        raise ValueError(f"step_sd needs at least {MIN_EVALS} evaluations, got {len(accs)}")
    return float(np.std(np.diff(accs), ddof=1))


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
