"""table-values' figure: the accuracy gap against values per channel, by input."""

from __future__ import annotations

import math
from pathlib import Path

from bnlab.claims.values.cells import BIG, BREAK, MIN_SEEDS, images, measured
from bnlab.doctor import MIN_VALUES
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


LABELS = {"resnet20": "resnet20", "resnet18 32 px": "r18 32px", "resnet18 64 px": "r18 64px"}


def plot(d: RunsData, path: Path, title: str = "Where BN breaks") -> None:
    """One panel, the message's: each cell's accuracy lost against its 1 x batch reference by
    values per channel, each point named with its input (the jitter ratios, read only where
    the reference is steady, are in the table)."""
    fig, ax = plt.subplots(figsize=(11, 5.4))
    ms = [m for _, m in measured(d) if m["values"] is not None]
    for m in ms:
        kw, x, y = style(m), shift(m), m["gap"]
        if y is None or not math.isfinite(y):
            if lost_seed(m):  # diverged on every seed it ran: at the top, where the worst are
                ax.plot([x], [0.96], transform=ax.get_xaxis_transform(),
                        **{**kw, "marker": "x", "ms": 9, "color": "C3"})
            continue
        err = [[y - m["lo"]], [m["hi"] - y]] if m["lo"] is not None and m["hi"] is not None \
            else None
        ax.errorbar([x], [y], yerr=err, capsize=3, alpha=0.35 if m.get("pending") else 1, **kw)
        if lost_seed(m):
            ax.plot([x], [y], marker="x", ms=9, ls="none", color="C3")
        if m["state"] != "reference":
            up = m["batch"] == BIG  # its reference sits close below and right: above it
            ax.annotate(LABELS.get(m["input"], m["input"]), (x, y),
                        xytext=(7, 7) if up else (6, -3), textcoords="offset points",
                        fontsize=7, color="0.25")
    if not any(m["state"] != "reference" for m in ms):
        nothing_yet(ax, "no cell and its reference have all their seeds yet")
    ax.axhline(0, color="grey", lw=1)
    ax.axhline(BREAK, color="C3", ls=":", lw=1,
               label=f"breaks: {BREAK:g} points or more lost, interval above 0")
    ax.axvline(MIN_VALUES, color="C3", ls="--", lw=1,
               label=f"the doctor's threshold: {MIN_VALUES} values per channel")
    ax.set_xscale("log", base=2)
    ax.set(title="accuracy lost against 1 rank with the same global batch, by input",
           xlabel="values per channel at the smallest BN layer, one rank (log scale)",
           ylabel="accuracy lost (points)")
    ax.grid(alpha=0.3)
    lines, names = ax.get_legend_handles_labels()  # the thresholds first, then the cells
    handles, labels = legend(ms, True)
    ax.legend(lines + handles, names + labels, fontsize=8, loc="upper right")
    save(fig, path, title)
