"""table-values' figure: the gap and the jitter ratio against values per channel."""

from __future__ import annotations

import math
from pathlib import Path

from bnlab.claims.values.cells import BIG, BREAK, MIN_SEEDS, images, measured
from bnlab.doctor import MIN_IMAGES, MIN_VALUES
from bnlab.lab.figures import nothing_yet, plt, save
from bnlab.lab.table import RunsData

MARKERS = {1: "v", 2: "o", 4: "s", 8: "^"}  # by images per rank, at global batch 8
BIG_STYLE = {"marker": "D", "color": "C4"}  # rule v5's cells (the references: hollow, grey)


def lost_seed(m: dict) -> bool:
    """A cell that breaks because it diverged on a seed where its reference did not."""
    return m["state"] == "breaks" and "diverged on seed" in m["why"]


def style(m: dict) -> dict:
    """A cell's marker: its shape and colour by images per rank, rule v5's block its own; the
    references grey, hollow, in their block's shape (1 x 8 as 8 images per rank)."""
    n, ref = m["images"], m["state"] == "reference"
    if m["batch"] == BIG:
        kw = dict(BIG_STYLE)
    else:
        kw = {"marker": MARKERS.get(n, "o"),
              "color": f"C{sorted(MARKERS).index(n)}" if n in MARKERS else "C5"}
    return {**kw, "ms": 7, "ls": "none", **({"mfc": "none", "color": "0.5"} if ref else {})}


def shift(m: dict) -> float:
    """A cell's x: its values per channel, stepped by images per rank where two layouts reach
    one level (rule v5's block one step further)."""
    n = m["images"]
    step = 2.5 if m["batch"] == BIG else sorted(MARKERS).index(n) - 1.5 if n in MARKERS else 0
    return m["values"] * 2 ** (0.18 * step)


def legend(ms: list[dict], gap: bool) -> tuple[list, list[str]]:
    """One entry per images per rank that a cell has, then the references and the markings
    that the panel (`gap`, else the jitter's) draws (a point left unread keeps its shape,
    greyed)."""
    from matplotlib.lines import Line2D
    handles, labels = [], []
    for size, n in sorted({(m["batch"], m["images"]) for m in ms if m["state"] != "reference"}):
        handles.append(Line2D([], [], **style({"images": n, "batch": size, "state": ""})))
        labels.append(f"{images(n)} per rank" + (f" (global batch {size})" if size != 8 else ""))
    for size in sorted({m["batch"] for m in ms if m["state"] == "reference"}):
        handles.append(Line2D([], [], **style({"images": size, "batch": size,
                                               "state": "reference"})))
        labels.append(f"1 x {size} reference " + ("(gap 0)" if gap else "(ratio 1)"))
    if any(m.get("pending") for m in ms):
        handles.append(Line2D([], [], marker="o", ms=7, ls="none", color="0.3", alpha=0.35))
        labels.append(f"faded: on {MIN_SEEDS} seeds, rule v4's seeds to come")
    if gap and any(lost_seed(m) for m in ms):
        handles.append(Line2D([], [], marker="x", ms=9, ls="none", color="C3"))
        labels.append("diverged on a seed: breaks (gap over the other seeds)")
    if not gap and any(m["jstate"] == "untestable" for m in ms):
        handles.append(Line2D([], [], marker="o", ms=7, ls="none", color="0.7", mfc="none"))
        labels.append("grey, hollow: reference not steady, not read")
    return handles, labels


def plot(d: RunsData, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    ms = [m for _, m in measured(d) if m["values"] is not None]
    lost = []  # cells that diverged on every seed they ran: no gap to draw
    for m in ms:
        kw, x = style(m), shift(m)
        diverged = lost_seed(m)
        if diverged and not math.isfinite(m["gap"]):
            lost.append((x, kw))
        for ax, y, lo, hi in ((axes[0], m["gap"], m["lo"], m["hi"]),
                              (axes[1], m["jitter"], m["jlo"], m["jhi"])):
            if y is None or not math.isfinite(y):
                continue
            err = [[y - lo], [hi - y]] if lo is not None and hi is not None else None
            unread = ax is axes[1] and m["jstate"] == "untestable"  # drawn, not read
            ax.errorbar([x], [y], yerr=err, capsize=3, alpha=0.35 if m.get("pending") else 1,
                        **({**kw, "color": "0.7", "mfc": "none"} if unread else kw))
            if diverged and ax is axes[0]:
                ax.plot([x], [y], marker="x", ms=9, ls="none", color="C3")
    for x, kw in lost:  # at the top of the gap panel, where the worst cells are
        axes[0].plot([x], [0.96], transform=axes[0].get_xaxis_transform(),
                     **{**kw, "marker": "x", "ms": 9, "color": "C3"})
    if not any(m["state"] != "reference" for m in ms):
        for ax in axes:
            nothing_yet(ax, "no cell and its reference have all their seeds yet")
    for ax, y, ylabel, title, line in (
            (axes[0], 0, "accuracy lost to the 1 x batch reference (points)",
             "accuracy gap to the reference",
             (BREAK, f"breaks at {BREAK:g} points lost (interval above 0)")),
            (axes[1], 1, "jitter / the reference's jitter", "jitter against the reference",
             None)):
        ax.axhline(y, color="grey", lw=1)
        if line:
            ax.axhline(line[0], color="C3", ls=":", lw=1, label=line[1])
        ax.axvline(MIN_VALUES, color="C3", ls="--", lw=1,
                   label=f"doctor: at risk below {MIN_VALUES} values (or {MIN_IMAGES} images)")
        ax.set_xscale("log", base=2)
        ax.set(title=title, xlabel="values per channel at the smallest BN layer (log)",
               ylabel=ylabel)
        ax.grid(alpha=0.3)
        lines, names = ax.get_legend_handles_labels()  # the thresholds first, then the cells
        handles, labels = legend(ms, ax is axes[0])
        ax.legend(lines + handles, names + labels, fontsize=8)
    save(fig, path, "Where BN breaks: global batch 8 (and 16: 2 x 8 against 1 x 16), only the "
                    "grouping changes")

