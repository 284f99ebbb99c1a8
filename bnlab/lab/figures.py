"""The plots' common pieces: matplotlib without a display, one way to save a figure, and the
curves of a cell's seeds that several tables draw.

Each table's own plot lives beside it in bnlab/claims/<name>.py and uses these.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bnlab.lab.results import CellResult  # noqa: E402

__all__ = ["plt", "save", "band", "precise_points", "mean_loss", "legend", "text_problems",
           "nothing_yet"]


# Every figure saved in this process whose text a reader cannot read: (path, problem). The
# report's test asserts it stays empty; save() also says so on stderr.
PROBLEMS: list[tuple[str, str]] = []


def save(fig, path: Path, title: str | None = None, dpi: int = 110,
         empty: bool = False) -> None:
    """Give `fig` its title, lay it out, check its text reads cleanly (text_problems), write it
    to `path` as PNG and free it; `empty`: no run has finished yet, and every axes says so."""
    if empty:
        for ax in fig.axes:
            nothing_yet(ax)
    if title is not None:
        fig.suptitle(title)
    fig.tight_layout()
    found: list[str] = []  # the text checked in savefig's own draw, not in a draw of its own

    def check(event) -> None:
        found[:] = text_problems(fig, event.renderer)

    path.parent.mkdir(parents=True, exist_ok=True)
    watch = fig.canvas.mpl_connect("draw_event", check)
    fig.savefig(path, dpi=dpi)
    fig.canvas.mpl_disconnect(watch)
    for problem in found:
        PROBLEMS.append((str(path), problem))
        print(f"bnlab: warning: figure {path}: {problem}", file=sys.stderr)
    plt.close(fig)


def nothing_yet(ax, what: str = "no finished runs yet") -> None:
    """Say so on an axes that has nothing to draw yet (rather than leave it blank)."""
    ax.text(0.5, 0.5, what, transform=ax.transAxes, ha="center", va="center", color="0.4",
            fontsize=11, zorder=5, bbox={"facecolor": "white", "edgecolor": "none"})


def band(ax, c: CellResult, label: str | None = None, color: str | None = None) -> None:
    """The cell's val acc per evaluation: the mean over seeds, a band from min to max."""
    ep, mean, lo, hi = c.mean_curve()
    if not ep:
        return
    n = len([r for r in c.runs if not r.diverged])
    line, = ax.plot(ep, mean, marker=".", ms=3, lw=1.2, label=f"{label or c.cell.label} (n={n})",
                    color=color)
    ax.fill_between(ep, lo, hi, color=line.get_color(), alpha=0.15, lw=0)


def precise_points(ax, c: CellResult, color: str | None = None) -> bool:
    """Val acc after each PreciseBN recalibration (mean, bar = min..max over seeds); False
    when the cell's runs logged none. Its EMA curve is not drawn: PreciseBN does not touch
    training, so that curve is the plain row's and would hide it."""
    ep, mean, lo, hi = c.mean_series("val/acc_precise")
    if not ep:
        return False
    n = sum(bool(r.series("val/acc_precise")[0]) for r in c.runs if not r.diverged)
    ax.errorbar(ep, mean, yerr=[[m - a for m, a in zip(mean, lo, strict=True)],
                                [b - m for m, b in zip(mean, hi, strict=True)]],
                marker="s", ms=4, ls="--", lw=1, capsize=3, color=color,
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


def text_problems(fig, renderer=None) -> list[str]:
    """Text in a drawn figure that a reader cannot read: a title, label, tick label or legend
    entry that leaves the canvas, or two that overlap (tick labels of one axis with each other,
    any text with a title, text drawn on an axes with other such text or a legend). Empty when
    the figure reads cleanly. `renderer`: the one that has just drawn it (at the end of
    savefig's draw, where save checks); without it, the figure is drawn here first."""
    if renderer is None:
        fig.draw_without_rendering()  # every text placed as a draw places it, no pixels painted
    r = renderer or fig.canvas.get_renderer()
    canvas = fig.bbox
    texts = []  # (what, bbox)
    if fig._suptitle is not None and fig._suptitle.get_text():
        texts.append(("suptitle", fig._suptitle.get_window_extent(r)))
    for i, ax in enumerate(fig.axes):
        if not ax.get_visible():
            continue
        for name, t in (("title", ax.title), ("xlabel", ax.xaxis.label),
                        ("ylabel", ax.yaxis.label)):
            if t.get_text():
                texts.append((f"axes {i} {name} {t.get_text()[:30]!r}", t.get_window_extent(r)))
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            span = (hi - lo) * 1e-6
            ticks = [t for t in axis.get_major_ticks()  # the drawn ones: inside the view
                     if t.label1.get_visible() and t.label1.get_text()
                     and lo - span <= t.get_loc() <= hi + span]
            boxes = [(t.label1.get_text(), t.label1.get_window_extent(r)) for t in ticks]
            for (a, ba), (b, bb) in zip(boxes, boxes[1:], strict=False):
                if ba.overlaps(bb):
                    texts.append((f"axes {i}: tick labels {a!r} and {b!r} overlap", None))
            texts += [(f"axes {i} tick {a!r}", ba) for a, ba in boxes]
        leg = ax.get_legend()
        if leg is not None:
            texts.append((f"axes {i} legend", leg.get_window_extent(r)))
        texts += [(f"axes {i} label {t.get_text()[:30]!r}", t.get_window_extent(r))
                  for t in ax.texts if t.get_text() and t.get_visible()]
    out = [w for w, b in texts if b is None]
    boxes = [(w, b) for w, b in texts if b is not None]
    for w, b in boxes:
        if b.x0 < canvas.x0 - 1 or b.y0 < canvas.y0 - 1 or b.x1 > canvas.x1 + 1 or \
                b.y1 > canvas.y1 + 1:
            out.append(f"{w} leaves the canvas")
    titles = [(w, b) for w, b in boxes if "title" in w]
    for w, b in titles:
        for v, c in boxes:
            if v != w and b.overlaps(c):
                out.append(f"{w} overlaps {v}")
    labels = [(w, b) for w, b in boxes if " label " in w or w.endswith("legend")]
    for j, (w, b) in enumerate(labels):  # text drawn on the axes: each readable alone
        out += [f"{w} overlaps {v}" for v, c in labels[j + 1:] if b.overlaps(c)]
    return out
