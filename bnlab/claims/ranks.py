"""`make table-ranks` (claim C5; C3's short-protocol history): one rank against four at the
same global batch, and gradient accumulation. C3 is ruled once, in table-lr (1 x 8 bn is
syncbn at 4 x 2 exactly).

    python -m bnlab.claims ranks --data DIR --jobs 2   # sweep, then the table
    python -m bnlab.claims ranks --report              # table from the runs' logs only

Trains experiments/ranks/sweep.yaml (1x8 beside 4x2, 4x2 + grad_accum 4 beside 4x8) and
writes experiments/ranks/{table.md, ranks.png}.
"""

from __future__ import annotations

from pathlib import Path

from bnlab.lab import page, table
from bnlab.lab.figures import band, legend, plt, save
from bnlab.lab.results import CellResult, mean_of, missing, side_by_side
from bnlab.lab.table import RunsData, Verdict


def render(d: RunsData) -> str:
    rows = []
    for c in d.cells:
        cfg = c.cell.cfg
        rows.append([c.cell.label, str(c.cell.meta["global"]), str(cfg["batch_per_gpu"]),
                     str(cfg["grad_accum"]), f"{cfg['optim']['lr']:g}", *page.metric_cells(c)])
    return table.runs_page(d, "\n".join([
        page.md_table(["layout", "global batch", "BN batch (images per rank)", "grad_accum",
                        "lr", *page.METRIC_HEADER], rows), "",
        "Pairs share the global batch, the learning rate and the order of the images (the "
        "sampler is layout-independent): 1x8 with 4x2, and 4x2 + grad_accum 4 with 4x8. "
        "Gradient accumulation enlarges the optimizer's batch, not the batch BN normalizes "
        "over.", "", page.SWING_NOTE, ""]))


def plot(d: RunsData, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for c in d.cells:
        band(ax, c)
    ax.set(xlabel="epoch", ylabel="val accuracy (%)")
    ax.grid(alpha=0.3)
    legend(ax, 8)
    save(fig, path,
         "Same global batch, same data order: val accuracy (mean and range over seeds)")


# ----------------------------------------------------------------------------------------
# The rules: each claim's verdict from the cells (label -> CellResult)


def c5(cells: dict[str, CellResult]) -> Verdict:
    acc, big = cells.get("4 ranks x 2 + grad_accum 4"), cells.get("4 ranks x 8")
    a, b = mean_of(acc, "swing"), mean_of(big, "swing")
    fa, fb = mean_of(acc, "final"), mean_of(big, "final")
    ours = side_by_side(acc, big, "4x2+accum4", "4x8")
    if missing(a, b, fa, fb):
        return Verdict("C5", "make table-ranks", "accumulation does not help BN", ours,
                       "not run yet", "")
    v = "reproduced" if a >= 1.5 * b or fb - fa >= 3 else "not reproduced"
    return Verdict("C5", "make table-ranks", "accumulation does not help BN", ours, v,
                   "Rule: reproduced if accumulation leaves a swing >= 1.5x that of the real "
                   "batch of 8 per rank, or an accuracy 3+ points lower.")


def verdicts(d: RunsData) -> list[Verdict]:
    return [c5(d.by_label)]  # C3 is C1's computation: ruled once, in table-lr


TABLE = table.Table("ranks", ("C5",), table.runs_data, render, verdicts, plot, block="claims")
