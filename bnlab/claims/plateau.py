"""`make table-plateau`: the first headline protocol, kept as history (no verdicts): jitter
on the plateau, detrended, beside the test set's floor, over 5 seeds.

    python -m bnlab.claims plateau --data DIR --jobs 2   # sweep (hours on 2 cores), table
    python -m bnlab.claims plateau --report              # table from the runs' logs only

Trains experiments/plateau/sweep.yaml: bn, syncbn, gn and frozen BN at 4 ranks x 2 images on
resnet20 and torchvision resnet18, with a constant learning rate after warmup (the rate
experiments/lrpilot chose for each model, on the test split, as the largest stable one), 20
epochs evaluated 10 times each, every evaluation's predictions kept
(configs/experiment/plateau.yaml). Writes experiments/plateau/{table.md, plateau.png}. The
measures are bnlab/jitter.py's.

Its rules (landed in commit 1fc01e2) ruled C1, C4, C6 and C9 here; experiments/README.md
keeps what they said and gave. At lr 0.1 the syncbn control itself jittered at about 3x its
churn floor, so no contrast with bn could show: the claims are ruled once, on the settled
protocol (table-lr, table-fixes), with a control check.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bnlab.jitter import PLATEAU
from bnlab.lab import page, table
from bnlab.lab.analysis import SEPARATED, p_above
from bnlab.lab.figures import band, legend, plt, save
from bnlab.lab.results import CellResult
from bnlab.lab.table import RunsData, Verdict

MODELS = ("resnet20", "resnet18")
NORMS = ("bn", "syncbn", "gn", "frozen_bn")
MEASURE = "vn_sd"


def cell(d: RunsData, model: str, norm: str, variant: str | None = None) -> CellResult | None:
    """The cell of this model and norm; `variant`: one of C4's, else the base."""
    return next((c for c in d.cells if c.cell.meta.get("model") == model
                 and c.cell.meta.get("norm") == norm and c.cell.meta.get("variant") == variant),
                None)


def vals(c: CellResult | None, key: str = MEASURE) -> list[float]:
    return [] if c is None else c.jitter_values(key)


def mean(xs: list[float]) -> float | None:
    return float(np.mean(xs)) if xs else None


def shown(c: CellResult | None, key: str = MEASURE, digits: int = 2) -> str:
    return "-" if c is None else c.jstat(key).fmt(digits)


def p_text(p: float | None) -> str:
    return "-" if p is None else f"{p:.3f}"


# ----------------------------------------------------------------------------------------
# The table


COLUMNS = ["cell", "seeds", "plateau val acc (%)", "final val acc (%)", "swing (± pts)",
           "residual sd (pts)", "von Neumann sd (pts)", "churn floor (pts)", "jitter / floor",
           "log val-loss jitter", "churn (%)", "trend (pts/epoch)"]


def row(c: CellResult) -> list[str]:
    return [c.cell.label, c.seeds_note(), shown(c, "plateau_acc", 1), shown(c, "final", 1),
            shown(c, "swing", 1), shown(c, "residual_sd"), shown(c), shown(c, "churn_floor"),
            shown(c, "over_floor"), shown(c, "loss_jitter"), shown(c, "churn", 1),
            shown(c, "slope")]


def render(d: RunsData) -> str:
    lines = []
    for model in MODELS:
        cells = [c for c in d.cells if c.cell.meta.get("model") == model]
        if not cells:
            continue
        lr = cells[0].cell.cfg["optim"]["lr"]
        lines += [f"## {model}, 4 ranks x 2 images, lr {lr:g} constant", "",
                  page.md_table(COLUMNS, [row(c) for c in cells]), "",
                  separation(d, model), ""]
    lines += [NOTE.format(start=PLATEAU, n=d.tested_on or "the"), ""]
    return table.runs_page(d, "\n".join(lines))


NOTE = (
    "All measures on the plateau window: the evaluations after the first {start:.0%} of "
    "training (bnlab/jitter.py). Swing: half the range there, the claims' \"+/- points\" (it "
    "grows with any trend and with the window's length). Residual sd: sd around a fitted "
    "line. Von Neumann sd: sqrt(mean squared successive difference / 2), the noise of one "
    "evaluation, which the rules use. Churn floor: the von Neumann sd that the observed "
    "prediction flips alone would give on {n} test images if every flip were a fair coin "
    "between right and wrong (quality unchanged); jitter / floor well above 1 means the "
    "model's quality itself moves between evaluations. Churn: share of test images whose "
    "predicted class changes between consecutive evaluations. Log val-loss jitter: von "
    "Neumann sd of log val loss. Mean ± sd over seeds.")


def separation(d: RunsData, model: str) -> str:
    """The pairwise tests the rules use, as one line."""
    bn, sb, gn, fr = (cell(d, model, n) for n in NORMS)
    parts = []
    for name, a, b in (("bn above syncbn", bn, sb), ("bn above frozen_bn", bn, fr),
                       ("bn above gn", bn, gn), ("gn above syncbn", gn, sb)):
        parts.append(f"{name} p = {p_text(p_above(vals(a), vals(b)))}")
    return ("Seeds told apart (exact one-sided permutation test on the von Neumann sd, "
            f"p <= {SEPARATED} separates): " + "; ".join(parts) + ".")


def plot(d: RunsData, path: Path) -> None:
    models = [m for m in MODELS if any(c.cell.meta.get("model") == m for c in d.cells)]
    fig, axes = plt.subplots(2, len(models), figsize=(7 * len(models), 9), squeeze=False)
    for j, model in enumerate(models):
        cells = [c for c in d.cells if c.cell.meta.get("model") == model]
        ax = axes[0][j]
        for c in cells:
            band(ax, c)
        ax.axvline(PLATEAU * (cells[0].epochs if cells else 1), color="grey", ls=":", lw=1)
        ax.set(title=f"{model}: val acc (band: min..max over seeds)",
               xlabel="epoch (plateau: right of the dotted line)", ylabel="val accuracy (%)")
        ax.grid(alpha=0.3)
        legend(ax, 8)
        ax = axes[1][j]
        cells = [c for c in cells if vals(c)]  # a cell without finished seeds: no empty slot
        for i, c in enumerate(cells):
            v, f = vals(c), vals(c, "churn_floor")
            ax.scatter([i] * len(v), v, color=f"C{i}", zorder=3, label="von Neumann sd"
                       if i == 0 else None)
            if f:
                ax.scatter([i] * len(f), f, marker="_", s=300, color="black", zorder=2,
                           label="churn floor" if i == 0 else None)
        ax.set_xticks(range(len(cells)), [c.cell.label.removeprefix(f"{model} ")
                                          .replace(" (", "\n(").replace(", ", ",\n")
                                          for c in cells], fontsize=8)
        ax.set(title=f"{model}: jitter per seed on the plateau, beside its churn floor",
               ylabel="points")
        ax.grid(alpha=0.3, axis="y")
        legend(ax, 8)
    save(fig, path, "Headline protocol: constant lr, 20 epochs, 10 evaluations per epoch")


def verdicts(d: RunsData) -> list[Verdict]:
    """None: this is the first headline protocol's history (its learning rate was chosen on
    the test split, and its control was not steady); C1, C4, C6 and C9 are ruled once, on
    the settled protocol (table-lr, table-fixes)."""
    return []


TABLE = table.Table("plateau", (), table.runs_data, render, verdicts, plot, block="plateau")
