"""`make table-decompose` (the first headline protocol's history; its C8 rule now lives in
table-fixes, its split in table-lr): why BN jitters. The same weights evaluated three ways at every
evaluation, and the jitter split into the weights' part and the statistics' part.

    python -m bnlab.claims decompose --data DIR --jobs 2   # sweep (shared with plateau), table
    python -m bnlab.claims decompose --report              # table from the runs' logs only

Trains experiments/decompose/sweep.yaml: resnet20 bn and syncbn at 4 ranks x 2 images on the
headline protocol (the same runs as table-plateau's resnet20 bn and syncbn cells) with
`record.decompose=true`: at each evaluation the weights are evaluated with (a) the running
(EMA) statistics, (b) PreciseBN statistics of a fixed, un-augmented set of 2,048 training
images (pooled, bnlab.precise_bn) and (c) train-mode batch statistics at the rank batch of 2.
On the plateau, the detrended variance of (a) is split (bnlab.jitter.variance_split) into the
variance of (b), which only the weights move, the variance of (a - b), what the running
statistics add, and their covariance. Writes experiments/decompose/{table.md, decompose.png}.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bnlab import jitter
from bnlab.lab import page, table
from bnlab.lab.analysis import Stat
from bnlab.lab.figures import legend, plt, save
from bnlab.lab.results import SERIES, CellResult, split
from bnlab.lab.table import RunsData, Verdict

WAYS = {"ema": "(a) running (EMA) statistics", "precise": "(b) PreciseBN statistics",
        "batch": "(c) batch statistics, 2 images"}
PARTS = ("weights", "statistics", "covariance")


def split_stat(c: CellResult, part: str, share: bool = False) -> Stat:
    out = []
    for r in c.runs:
        s = split(r, c.epochs)
        if s is not None and not (share and s["total"] <= 0):
            out.append(100 * s[part] / s["total"] if share else s[part])
    return Stat.of(out)


def render(d: RunsData) -> str:
    rows = []
    for c in d.cells:
        for kind, name in WAYS.items():
            rows.append([c.cell.label, name, c.seeds_note(), c.jstat("plateau_acc", kind).fmt(),
                         c.jstat("vn_sd", kind).fmt(2), c.jstat("residual_sd", kind).fmt(2),
                         c.jstat("churn_floor", kind).fmt(2), c.jstat("churn", kind).fmt(1),
                         c.jstat("loss_jitter", kind).fmt(3)])
    parts = []
    for c in d.cells:
        parts.append([c.cell.label, split_stat(c, "total").fmt(2),
                      *(f"{split_stat(c, p).fmt(2)} ({split_stat(c, p, True).fmt(0)}%)"
                        for p in PARTS),
                      c.jstat("churn_floor").fmt(2)])
    return table.runs_page(d, "\n".join([
        "## Val acc on the plateau, the same weights evaluated three ways", "",
        page.md_table(["cell", "evaluated with", "seeds", "plateau val acc (%)",
                        "von Neumann sd (pts)", "residual sd (pts)", "churn floor (pts)",
                        "churn (%)", "log val-loss jitter"], rows), "",
        "## The detrended variance of (a), split", "",
        page.md_table(["cell", "total (pts²)", "weights: var of (b)",
                        "statistics: var of (a) - (b)", "2 cov", "churn floor of (a) (pts)"],
                       parts), "",
        findings(d), "",
        "Residuals around each series' own fitted line on the plateau (the second half of "
        "training), so the three parts add up to the total (bnlab.jitter.variance_split); the "
        "shares are each seed's, then averaged. The churn floor is the jitter that prediction "
        "flips alone give when the quality does not change (bnlab/jitter.py); a part whose sd "
        "is near it is within the test set's resolution. Mean ± sd over seeds.", ""]))


def findings(d: RunsData) -> str:
    """What the split says, in a sentence per cell, from the numbers above."""
    out = []
    for c in d.cells:
        s, w = split_stat(c, "statistics", True), split_stat(c, "weights", True)
        cov = split_stat(c, "covariance", True)
        if s.mean is None:
            continue
        out.append(f"- {c.cell.label}: of the detrended variance of val acc, the running "
                   f"statistics' part is {s.mean:.0f}%, the weights' {w.mean:.0f}% and twice "
                   f"their covariance {cov.mean:+.0f}% (n = {s.n}); (b)'s jitter "
                   f"{c.jstat('vn_sd', 'precise').fmt(2)} against its churn floor "
                   f"{c.jstat('churn_floor', 'precise').fmt(2)} points.")
    return "\n".join(out) or "No run has finished yet."


def plot(d: RunsData, path: Path) -> None:
    fig, axes = plt.subplots(1, len(d.cells) + 1, figsize=(6 * (len(d.cells) + 1), 4.6),
                             squeeze=False)
    for ax, c in zip(axes[0], d.cells, strict=False):
        r = next((r for r in c.runs if not r.diverged), None)
        if r is None:
            continue
        for kind, name in WAYS.items():
            ax.plot(*r.series(SERIES[kind][0]), lw=1, label=name)
        ax.axvline(jitter.PLATEAU * c.epochs, color="grey", ls=":", lw=1)
        ax.set(title=f"{c.cell.label}, seed {r.seed}: the same weights three ways",
               xlabel="epoch", ylabel="val accuracy (%)")
        ax.grid(alpha=0.3)
        legend(ax, 8)
    ax = axes[0][-1]
    x = np.arange(len(d.cells))
    bottom = np.zeros(len(d.cells))
    for i, part in enumerate(PARTS):
        h = np.array([split_stat(c, part).mean or 0.0 for c in d.cells])
        ax.bar(x, h, bottom=np.where(h >= 0, bottom, 0), color=f"C{i}", label=part)
        bottom += np.maximum(h, 0)
    ax.set_xticks(x, [c.cell.label for c in d.cells])
    ax.set(title="detrended variance of (a) on the plateau (mean over seeds)",
           ylabel="points²")
    ax.grid(alpha=0.3, axis="y")
    legend(ax, 8)
    save(fig, path, "Statistics or weights? resnet20, 4 ranks x 2 images")


def verdicts(d: RunsData) -> list[Verdict]:
    """None: the first headline protocol's history; C8 is ruled once, in table-fixes."""
    return []


TABLE = table.Table("decompose", (), table.runs_data, render, verdicts, plot, block="plateau")
