"""PNG plots of the experiment tables (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bnlab.results import CellResult  # noqa: E402


def _band(ax, c: CellResult, label: str | None = None) -> None:
    ep, mean, lo, hi = c.mean_curve()
    if not ep:
        return
    n = len([r for r in c.runs if not r.diverged])
    line, = ax.plot(ep, mean, marker=".", ms=3, lw=1.2, label=f"{label or c.cell.label} (n={n})")
    ax.fill_between(ep, lo, hi, color=line.get_color(), alpha=0.15, lw=0)


def _precise_points(ax, c: CellResult) -> bool:
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


def _mean_loss(ax, c: CellResult) -> None:
    good = [r for r in c.runs if not r.diverged]
    if not good:
        return
    xs, _ = good[0].series("train/loss")
    n = min(len(r.series("train/loss")[1]) for r in good)
    ys = [sum(r.series("train/loss")[1][i] for r in good) / len(good) for i in range(n)]
    ax.plot(xs[:n], ys, lw=1, label=c.cell.label)


def _legend(ax, size: int) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=size)


def _finish(fig, path: Path, title: str) -> None:
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def jitter(by_section: dict[str, list[CellResult]], path: Path) -> None:
    main = by_section.get("main", [])
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    for c in main:
        if not _precise_points(axes[0], c):
            _band(axes[0], c)
            _mean_loss(axes[2], c)
    base = [c for c in main if c.cell.label in ("bn", "syncbn")]
    for c in base + by_section.get("C4", []) + by_section.get("cifar_stem", []):
        _band(axes[1], c)
    axes[0].set_title("4 ranks x 2 images: val acc (mean, band = min..max over seeds)")
    axes[1].set_title("C4 variants and resnet18_cifar beside bn / syncbn")
    axes[2].set_title("train loss (mean over every step and rank)")
    axes[2].set_yscale("log")
    for ax in axes:
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        _legend(ax, 7)
    axes[0].set_ylabel("val accuracy (%)")
    axes[1].set_ylabel("val accuracy (%)")
    _finish(fig, path, "Jitter under DDP with 2 images per rank (CIFAR-10)")


def batch(rows: list[str], cols: list[int], grid: dict, ref: dict, path: Path) -> None:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in rows:
        pts = [(b, grid[r, b].stat("final")) for b in sorted(cols) if (r, b) in grid]
        pts = [(b, s) for b, s in pts if s.mean is not None]
        if pts:
            ax1.errorbar([b for b, _ in pts], [s.mean for _, s in pts],
                         yerr=[s.std or 0 for _, s in pts], marker="o", capsize=3, label=r)
        if r in ref:
            ax2.plot(sorted(cols), [100 - ref[r][b] for b in sorted(cols)], marker="o", label=r)
    ax1.set(title="ours: CIFAR-10, resnet18, 4 ranks, 5 epochs (mean ± std over seeds)",
            ylabel="final val accuracy (%)")
    ax2.set(title="Wu & He 2018: ResNet-50 ImageNet (100 - val error), quoted",
            ylabel="val accuracy (%)")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(cols), [str(b) for b in sorted(cols)])
        ax.set_xlabel("images per rank")
        ax.grid(alpha=0.3)
        _legend(ax, 9)
    _finish(fig, path, "Where BN breaks down: accuracy by images per rank")


def curves(cells: list[CellResult], path: Path, title: str) -> None:
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for c in cells:
        _band(ax, c)
    ax.set(xlabel="epoch", ylabel="val accuracy (%)")
    ax.grid(alpha=0.3)
    _legend(ax, 8)
    _finish(fig, path, title)
