"""The plots' common pieces: matplotlib without a display, one way to save a figure, and the
curves of a cell's seeds that several tables draw.

Each table's own plot lives beside it in bnlab/claims/<name>.py and uses these.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bnlab.lab.results import CellResult  # noqa: E402

__all__ = ["plt", "save", "band", "precise_points", "mean_loss", "legend"]


def save(fig, path: Path, title: str | None = None, dpi: int = 110) -> None:
    """Give `fig` its title, lay it out, write it to `path` as PNG and free it."""
    if title is not None:
        fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def band(ax, c: CellResult, label: str | None = None) -> None:
    """The cell's val acc per evaluation: the mean over seeds, a band from min to max."""
    ep, mean, lo, hi = c.mean_curve()
    if not ep:
        return
    n = len([r for r in c.runs if not r.diverged])
    line, = ax.plot(ep, mean, marker=".", ms=3, lw=1.2, label=f"{label or c.cell.label} (n={n})")
    ax.fill_between(ep, lo, hi, color=line.get_color(), alpha=0.15, lw=0)


def precise_points(ax, c: CellResult) -> bool:
    """Val acc after each PreciseBN recalibration (mean, bar = min..max over seeds); False
    when the cell's runs logged none. Its EMA curve is not drawn: PreciseBN does not touch
    training, so that curve is the plain row's and would hide it."""
    ep, mean, lo, hi = c.mean_series("val/acc_precise")
    if not ep:
        return False
    n = sum(bool(r.series("val/acc_precise")[0]) for r in c.runs if not r.diverged)
    ax.errorbar(ep, mean, yerr=[[m - a for m, a in zip(mean, lo, strict=True)],
                                [b - m for m, b in zip(mean, hi, strict=True)]],
                marker="s", ms=4, ls="--", lw=1, capsize=3,
                label=f"{c.cell.label}: after each recalibration (n={n})")
    return True


def mean_loss(ax, c: CellResult) -> None:
    """The cell's train loss, mean over the seeds that did not diverge."""
    good = [r for r in c.runs if not r.diverged]
    if not good:
        return
    xs, _ = good[0].series("train/loss")
    n = min(len(r.series("train/loss")[1]) for r in good)
    ys = [sum(r.series("train/loss")[1][i] for r in good) / len(good) for i in range(n)]
    ax.plot(xs[:n], ys, lw=1, label=c.cell.label)


def legend(ax, size: int) -> None:
    """A legend when the axes drew anything labelled."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=size)
