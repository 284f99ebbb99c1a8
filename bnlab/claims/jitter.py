"""`make table-jitter`: val acc jitter at 4 ranks x 2 images on the short protocol (history: C1,
C4, C6, C8 and C9 are ruled on the settled headline protocol, table-lr and table-fixes).

    python -m bnlab.claims jitter --data DIR --jobs 2   # sweep, real-DDP check, table
    python -m bnlab.claims jitter --report              # table from the runs' logs only

Trains experiments/jitter/sweep.yaml (bn, syncbn, gn, ln, frozen BN, PreciseBN every epoch,
C4's variants, resnet18_cifar, and the key cells as real gloo processes), measures the first
steps of real DDP against the simulation (bnlab/claims/ddpcheck.py, kept in ddpcheck.json)
and writes experiments/jitter/{table.md, jitter.png}.
"""

from __future__ import annotations

from pathlib import Path

from bnlab.lab import page, table
from bnlab.lab.figures import band, legend, mean_loss, plt, precise_points, save
from bnlab.lab.results import CellResult, fmt
from bnlab.lab.table import RunsData, Verdict

TITLES = {"main": "4 ranks x 2 images, torchvision resnet18",
          "C4": "C4: augmentation off, and the reports' exact learning rate",
          "cifar_stem": "resnet18_cifar (3x3 stem, no max-pool)"}


def sections(d: RunsData) -> dict[str, list[CellResult]]:
    """The cells by the spec's `section` (main, C4, cifar_stem, ddp)."""
    out: dict[str, list[CellResult]] = {}
    for c in d.cells:
        out.setdefault(c.cell.meta.get("section", "main"), []).append(c)
    return out


# ----------------------------------------------------------------------------------------
# The table


def render(d: RunsData) -> str:
    by_section = sections(d)
    lines = []
    for sec in ("main", "C4", "cifar_stem"):
        rows = [[c.cell.label, *page.metric_cells(c)] for c in by_section.get(sec, [])]
        if sec == "main":
            pb = [c for c in by_section.get(sec, []) if c.stat("precise").n]
            extra = [f"- PreciseBN row, val acc after the last recalibration: "
                     f"{c.stat('precise').fmt()} (the row's val acc columns are the EMA "
                     "statistics' before it)" for c in pb]
        else:
            extra = []
        if rows:
            lines += [f"## {TITLES[sec]}", "",
                      page.md_table(["row", *page.METRIC_HEADER], rows), "", *extra, ""]
    ddp = by_section.get("ddp", [])
    if ddp:
        lines += ["## Simulation vs real DDP (4 gloo processes), seed 0", "",
                  "The same cell re-run as 4 real processes for its first epoch; the "
                  "simulation's run is the table's row. fp32 rounding differs between the two "
                  "layouts, so the runs are expected to agree closely at first and then drift "
                  "apart chaotically (see README, Simulated ranks).", "",
                  ddp_table(ddp, d.cells), ""]
    from bnlab.claims import ddpcheck  # here, so `python -m bnlab.claims.ddpcheck` runs once

    lines += [ddpcheck.section(d.out / ddpcheck.SAVED), page.SWING_NOTE, ""]
    return table.runs_page(d, "\n".join(lines))


def ddp_table(ddp: list[CellResult], cells: list[CellResult]) -> str:
    by_label = {c.cell.label: c for c in cells}
    rows = []
    for c in ddp:
        sim = by_label.get(c.cell.meta["compare"])
        real_run = c.runs[0] if c.runs else None
        sim_run = next((r for r in (sim.runs if sim else []) if r.seed == 0), None)
        if real_run is None or sim_run is None:
            rows.append([c.cell.label, "not run yet", "", "", "", ""])
            continue
        stop = real_run.last("step")
        sim_loss = {r["step"]: r["train/loss"] for r in sim_run.rows
                    if "train/loss" in r and r["step"] <= stop}
        real_loss = {r["step"]: r["train/loss"] for r in real_run.rows if "train/loss" in r}
        common = sorted(set(sim_loss) & set(real_loss))
        first = common[0]
        diffs = [abs(sim_loss[s] - real_loss[s]) for s in common]
        sim_acc = [a for e, a in zip(sim_run.epochs, sim_run.accs, strict=True)
                   if e <= real_run.epochs[-1] + 1e-9]
        rows.append([c.cell.label, str(stop),
                     f"{sim_loss[first]:.4f} / {real_loss[first]:.4f}",
                     f"{max(diffs):.3f}",
                     " ".join(fmt(a) for a in sim_acc) + " / "
                     + " ".join(fmt(a) for a in real_run.accs),
                     f"{sim_acc[-1] - real_run.accs[-1]:+.1f}" if sim_acc else "-"])
    return page.md_table(["cell", "steps", "train loss at first log, sim / real",
                     "max abs loss diff over logs", "val acc at each eval, sim / real",
                     "last val acc diff (pts)"], rows)


def plot(d: RunsData, path: Path) -> None:
    by_section = sections(d)
    main = by_section.get("main", [])
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    for c in main:
        if not precise_points(axes[0], c):
            band(axes[0], c)
            mean_loss(axes[2], c)
    base = [c for c in main if c.cell.label in ("bn", "syncbn")]
    for c in base + by_section.get("C4", []) + by_section.get("cifar_stem", []):
        band(axes[1], c)
    axes[0].set_title("4 ranks x 2 images: val acc (mean, band = min..max over seeds)")
    axes[1].set_title("C4 variants and resnet18_cifar beside bn / syncbn")
    axes[2].set_title("train loss (mean over every step and rank)")
    axes[2].set_yscale("log")
    for ax in axes:
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        legend(ax, 7)
    axes[0].set_ylabel("val accuracy (%)")
    axes[1].set_ylabel("val accuracy (%)")
    save(fig, path, "Jitter under DDP with 2 images per rank (CIFAR-10)")


def verdicts(d: RunsData) -> list[Verdict]:
    """None: C1, C4, C6, C8 and C9 are ruled once, on the settled headline protocol
    (table-lr, table-fixes); this table is their short protocol's history."""
    return []


def measure(ctx) -> dict:
    """The real-DDP check on the spec's bn and syncbn cells (ddpcheck.json)."""
    from bnlab.claims import ddpcheck

    res = ddpcheck.measure(ctx.data, ddpcheck.STEPS)
    print(ddpcheck.table(res))
    return res


TABLE = table.Table("jitter", (), table.runs_data, render, verdicts, plot, measure=measure,
                    saved="ddpcheck.json", block="claims")
