"""Reading a sweep's runs back: per-run numbers and per-cell statistics over seeds.

Only what the runs logged is used (metrics.jsonl, status.json, run.json, sweep.json);
nothing here trains or types a number.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from bnlab.analysis import Stat, finite, step_sd, swing, window
from bnlab.metrics import read_jsonl
from bnlab.rundir import read_status
from bnlab.sweep import RUNS, Cell, Spec, plan


@dataclass
class RunResult:
    path: Path
    seed: int
    status: str
    epochs: list[float] = field(default_factory=list)
    accs: list[float] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)
    info: dict = field(default_factory=dict)
    wall_s: float | None = None

    def last(self, key: str):
        vals = [r[key] for r in self.rows if key in r]
        return vals[-1] if vals else None

    def series(self, key: str) -> tuple[list[float], list[float]]:
        pts = [(r["epoch"], r[key]) for r in self.rows if key in r]
        return [p[0] for p in pts], [p[1] for p in pts]

    @property
    def diverged(self) -> bool:
        # The logger writes a NaN or infinite value as null.
        losses = [r["train/loss"] for r in self.rows if "train/loss" in r]
        return self.status == "diverged" or any(v is None or not math.isfinite(v) for v in losses)

    def metrics(self, total_epochs: float) -> dict[str, float | None]:
        if self.diverged or not self.accs:
            return {}
        w = window(self.epochs, self.accs, total_epochs)
        return {"final": self.accs[-1], "best": max(self.accs), "swing": swing(w),
                "step_sd": step_sd(w), "loss": self.last("train_epoch/loss"),
                "precise": self.last("val/acc_precise"), "train_s": self.last("time/train_s")}


# The affordability rule for the training-dynamics tables, on the 2-core machine with
# the sweep's default of 2 runs side by side.
BUDGET_MIN = {"target": 45, "all": 120}
JOBS = 2


def run_minutes(runs: list[RunResult]) -> float:
    """The runs' sweep.json wall times (all launches) summed, each run counted once."""
    return sum({r.path: r.wall_s or 0.0 for r in runs}.values()) / 60


def wall_minutes(runs: list[RunResult]) -> float:
    """Wall time of the runs as a sweep at JOBS runs side by side would take it."""
    return run_minutes(runs) / JOBS


def budget_line(runs: list[RunResult], expected: int, limit: str) -> str:
    """The runs' wall time against the budget `limit` ("target" or "all"), in one sentence."""
    minutes, cap = wall_minutes(runs), BUDGET_MIN[limit]
    done = len({r.path for r in runs})
    scope = "" if done == expected else f" (the {done} of {expected} runs finished so far)"
    verdict = "within it" if minutes <= cap else f"missed, {minutes / cap:.1f}x over"
    return (f"budget {cap} min on this machine; the runs{scope} come to about {minutes:.0f} "
            f"min at {JOBS} runs side by side: {verdict}")


def load_run(d: Path, seed: int) -> RunResult | None:
    """A finished run's logs, or None when the run is missing or unfinished."""
    status = read_status(d)
    if status not in ("completed", "diverged"):
        return None
    rows = read_jsonl(d / "metrics.jsonl")
    ep, acc = zip(*[(r["epoch"], r["val/acc"]) for r in rows if "val/acc" in r],
                  strict=True) if any("val/acc" in r for r in rows) else ((), ())
    info = json.loads((d / "run.json").read_text())
    sweep = json.loads((d / "sweep.json").read_text()) if (d / "sweep.json").is_file() else {}
    return RunResult(d, seed, status, list(ep), list(acc), rows, info, sweep.get("wall_s"))


@dataclass
class CellResult:
    cell: Cell
    runs: list[RunResult]
    expected: int

    @property
    def epochs(self) -> float:
        return self.cell.cfg["epochs"]

    def stat(self, key: str) -> Stat:
        return Stat.of([r.metrics(self.epochs).get(key) for r in self.runs])

    def paired(self, key: str, base: str) -> list[float]:
        """`key - base` in each run that logged both (the same run's weights: a paired
        difference, free of the seed-to-seed spread)."""
        ms = [r.metrics(self.epochs) for r in self.runs]
        return [m[key] - m[base] for m in ms if finite(m.get(key)) and finite(m.get(base))]

    @property
    def diverged(self) -> int:
        return sum(r.diverged for r in self.runs)

    def seeds_note(self) -> str:
        """`3`, or `2/3` while seeds are missing, with diverged runs named."""
        n = f"{len(self.runs)}" if len(self.runs) == self.expected else \
            f"{len(self.runs)}/{self.expected}"
        return n + (f" ({self.diverged} diverged)" if self.diverged else "")

    def mean_series(self, key: str) -> tuple[list[float], list[float], list[float], list[float]]:
        """`key` per logged point: epochs, mean, min, max over the seeds that finished and
        logged it."""
        good = [r.series(key) for r in self.runs if not r.diverged]
        good = [g for g in good if g[0]]
        if not good:
            return [], [], [], []
        n = min(len(ys) for _, ys in good)
        cols = list(zip(*[ys[:n] for _, ys in good], strict=True))
        return (good[0][0][:n], [sum(c) / len(c) for c in cols], [min(c) for c in cols],
                [max(c) for c in cols])

    def mean_curve(self) -> tuple[list[float], list[float], list[float], list[float]]:
        """Val acc per evaluation: epochs, mean, min, max over the seeds that finished."""
        return self.mean_series("val/acc")


def collect(spec: Spec, tag: str, root: Path = RUNS) -> list[CellResult]:
    by_cell: dict[str, list[RunResult]] = {c.label: [] for c in spec.cells}
    for cell, seed, d in plan(spec, tag, root):
        r = load_run(d, seed)
        if r is not None:
            by_cell[cell.label].append(r)
    return [CellResult(c, by_cell[c.label], len(c.seeds)) for c in spec.cells]


def fmt(x, digits: int = 1) -> str:
    return f"{x:.{digits}f}" if finite(x) else "-"
