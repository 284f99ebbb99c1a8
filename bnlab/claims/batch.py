"""`make table-batch` (claims C2, L1): val acc by images per rank, beside the GroupNorm paper.

    python -m bnlab.claims batch --data DIR --jobs 2   # sweep, then the table
    python -m bnlab.claims batch --report              # table from the runs' logs only

Trains experiments/batch/sweep.yaml (bn, syncbn and gn at 2 to 32 images per rank, 4 ranks)
and writes experiments/batch/{table.md, batch.png}.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from bnlab.lab import page, table
from bnlab.lab.analysis import NO_LEARNING
from bnlab.lab.figures import legend, plt, save
from bnlab.lab.results import CellResult, fmt, mean_of, missing
from bnlab.lab.table import RunsData, Verdict


def grid(d: RunsData) -> tuple[list[str], list[int], dict[tuple[str, int], CellResult]]:
    """Rows (norms, in the spec's order), columns (images per rank, largest first), cells."""
    cols = sorted({c.cell.meta["col"] for c in d.cells}, reverse=True)
    rows = list(dict.fromkeys(c.cell.meta["row"] for c in d.cells))
    return rows, cols, {(c.cell.meta["row"], c.cell.meta["col"]): c for c in d.cells}


def render(d: RunsData) -> str:
    rows_, cols, cells = grid(d)
    ref = d.spec.extra.get("reference", {})

    def err(c: CellResult) -> str:
        s = c.stat("final")
        return "-" if s.mean is None else \
            f"{100 - s.mean:.1f}" + (f" ± {s.std:.1f}" if s.std is not None else "")

    def line(name: str, r: str, text: Callable[[CellResult], str]) -> list[str]:
        """One row of the grid; `n/a` where the spec has no cell (a row run at some sizes)."""
        return [name, *(text(cells[r, b]) if (r, b) in cells else "n/a" for b in cols)]

    header = ["images per rank", *map(str, cols)]
    body = [line(f"{r} (ours, val error %)", r, err) for r in rows_]
    body += [[f"{r} ({ref['source'].split(',')[0]}, ImageNet)",
              *(fmt(ref[r].get(b)) for b in cols)] for r in rows_ if r in ref]
    acc = [line(f"{r} val acc (%)", r, lambda c: c.stat("final").fmt()) for r in rows_]
    sw = [line(f"{r} swing (± pts)", r, lambda c: c.stat("swing").fmt()) for r in rows_]
    seeds = [line(f"{r} seeds", r, CellResult.seeds_note) for r in rows_]
    steps = [["optimizer steps (from the logs)", *(steps_of(cells, rows_, b) for b in cols)]]
    lr = ", ".join(f"{b}: {cells[rows_[0], b].cell.cfg['optim']['lr']:g}" for b in cols)
    return table.runs_page(d, "\n".join([
        "## Val error (%) by images per rank, as in the GroupNorm paper's table", "",
        page.md_table(header, body), "",
        f"Ours: CIFAR-10 (`{d.tag}`), torchvision resnet18, 4 ranks, 5 epochs, final val error "
        f"= 100 - final val acc, mean ± std over seeds. Learning rate by images per rank ({lr}): "
        "0.1 x global batch / 64. The paper's rows are ResNet-50 on ImageNet, quoted for the "
        "shape only." + (f" {d.spec.extra['note']}" if d.spec.extra.get("note") else ""), "",
        "## Val acc, swing and seeds", "", page.md_table(header, acc + sw + seeds + steps), "",
        "Every cell trains 5 epochs, so more images per rank means fewer optimizer steps; "
        "compare the rows within a column. A row's final val acc under "
        f"{NO_LEARNING:g}% means the run did not learn (see its train loss in "
        "metrics.jsonl), which L1's verdict leaves out.", "",
        page.SWING_NOTE, ""]))


def steps_of(cells: dict, rows: list[str], col: int) -> str:
    """The optimizer steps the column's runs took, read from their last logged step."""
    n = {r.last("step") for row in rows if (row, col) in cells for r in cells[row, col].runs}
    return "-" if not n else "/".join(str(x) for x in sorted(n))


def plot(d: RunsData, path: Path) -> None:
    rows, cols, cells = grid(d)
    ref = d.spec.extra.get("reference", {})
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in rows:
        pts = [(b, cells[r, b].stat("final")) for b in sorted(cols) if (r, b) in cells]
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
        legend(ax, 9)
    save(fig, path, "Where BN breaks down: accuracy by images per rank")


# ----------------------------------------------------------------------------------------
# The rules: each claim's verdict from the cells (label -> CellResult)


def c2(cells: dict[str, CellResult]) -> Verdict:
    gaps = {b: (mean_of(cells.get(f"syncbn {b}"), "final"), mean_of(cells.get(f"bn {b}"), "final"))
            for b in (2, 16, 32)}
    if any(missing(*g) for g in gaps.values()):
        return Verdict("C2", "make table-batch", "16+ images per rank mostly restores BN",
                       "-", "not run yet", "")
    gap = {b: s - n for b, (s, n) in gaps.items()}
    ours = ", ".join(f"syncbn - bn at {b}: {gap[b]:+.1f} pts" for b in (2, 16, 32))
    v = "reproduced" if gap[16] <= 2 and gap[2] >= 5 else \
        "partly" if gap[16] < gap[2] / 2 else "not reproduced"
    return Verdict("C2", "make table-batch", "16+ images per rank mostly restores BN", ours, v,
                   "Rule: reproduced if bn is within 2 points of syncbn at 16 images per rank "
                   "while 5+ points behind at 2; partly if the gap at 16 is under half the "
                   "gap at 2.")


def l1(cells: dict[str, CellResult]) -> Verdict:
    sizes = (32, 16, 8, 4, 2)
    vals = {(r, b): mean_of(cells.get(f"{r} {b}"), "final") for r in ("bn", "gn") for b in sizes}
    if missing(*(vals[r, b] for r in ("bn", "gn") for b in (2, 32))):
        return Verdict("L1", "make table-batch", "BN error grows below 8/GPU; GN flat", "-",
                       "not run yet", "")
    # A row that stayed near chance at some size says nothing about batch size there.
    dead = [f"{r} at {b}" for r in ("bn", "gn") for b in sizes
            if vals[r, b] is not None and vals[r, b] < NO_LEARNING]
    learned = [b for b in sizes if all(vals[r, b] is not None and vals[r, b] >= NO_LEARNING
                                       for r in ("bn", "gn"))]
    note = f" Did not learn (final acc < {NO_LEARNING:g}%): {', '.join(dead)}." if dead else ""
    quarter = [(b, mean_of(cells.get(f"gn {b}, lr / 4"), "final")) for b in sizes]
    quarter = [f"{v:.1f}% at {b}" for b, v in quarter if v is not None]
    if quarter:
        note += f" gn at a quarter of the rate (not ruled on): final acc {', '.join(quarter)}."
    rule = ("Rule: from the largest size where both rows learned (8 or more) down to 2: "
            "reproduced if bn loses 5+ points and gn under a third of that; partly if gn "
            "loses less than bn.")
    # Disclosed: the rule above replaced, after the data was seen, one that compared 32 with
    # 2 images per rank whether or not a row learned there (commit 7490cd0).
    o_bn, o_gn = vals["bn", 32] - vals["bn", 2], vals["gn", 32] - vals["gn", 2]
    old = "reproduced" if o_bn >= 5 and o_gn <= o_bn / 3 else "partly" if o_gn < o_bn else \
        "not reproduced"
    note += (" This rule was written after the data was seen (commit 7490cd0); the rule before "
             "it (32 to 2 images per rank, whether or not a row learned) gives "
             f"{old} (bn {o_bn:.1f}, gn {o_gn:.1f} points).")
    if 2 not in learned or max(learned) < 8:
        return Verdict("L1", "make table-batch", "BN error grows below 8/GPU; GN flat",
                       "no size of 8 or more where both bn and gn learned" + note.rstrip("."),
                       "not reproduced", rule + note)
    top = max(learned)
    dbn = vals["bn", top] - vals["bn", 2]
    dgn = vals["gn", top] - vals["gn", 2]
    ours = f"val acc lost from {top} to 2 images per rank: bn {dbn:.1f}, gn {dgn:.1f} points " \
           "(paper, 32 to 2: 11.1 and 0.0 points of error)"
    v = "reproduced" if dbn >= 5 and dgn <= dbn / 3 else "partly" if dgn < dbn else \
        "not reproduced"
    return Verdict("L1", "make table-batch", "BN error grows below 8/GPU; GN flat", ours, v,
                   rule + note)


def verdicts(d: RunsData) -> list[Verdict]:
    return [c2(d.by_label), l1(d.by_label)]


TABLE = table.Table("batch", ("C2", "L1"), table.runs_data, render, verdicts, plot, block="claims")
