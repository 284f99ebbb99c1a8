"""`make table-recoverpilot`: each fix's learning rate (and setting) for table-recover, chosen on
held-out data by the rule in experiments/recoverpilot/rules.yaml (bnlab.lab.choose applies it).

    python -m bnlab.claims recoverpilot --data DIR --jobs 2   # the pilot's runs, then the table
    python -m bnlab.claims recoverpilot --report              # table from the runs' logs only

Trains experiments/recoverpilot/sweep.yaml (resnet20, 4 simulated ranks x 2 images, table-values'
10-epoch protocol, 1,000 training images held out): every accuracy here is on those held-out
images, never on the test split. Writes experiments/recoverpilot/{table.md, recoverpilot.png}.
"""

from __future__ import annotations

from pathlib import Path

from bnlab.lab import choose, page, table
from bnlab.lab.figures import nothing_yet, plt, save
from bnlab.lab.results import CellResult, fmt
from bnlab.lab.table import RunsData, Verdict
from bnlab.paths import EXPERIMENTS

RULES = EXPERIMENTS / "recoverpilot" / "rules.yaml"


def row(c: CellResult, rules: choose.Rules, pick: dict) -> list[str]:
    per = ["diverged" if r.diverged else fmt(r.jitter(c.epochs).get("plateau_acc"))
           for r in c.runs]
    mark = " **(chosen)**" if pick["cell"] is c else ""
    s = choose.setting(c, rules)
    return [f"{c.cell.meta['lr']:g}{mark}", "-" if s is None else str(s), c.seeds_note(),
            ", ".join(per) or "-", fmt(choose.score(c))]


def render(d: RunsData) -> str:
    rules = choose.Rules.read(RULES)
    picks = choose.choices(d.cells, rules)
    rows = [[f"{fix}", p["state"], p["cell"].cell.label if p["cell"] else "-", p["why"]]
            for fix, p in picks.items()]
    lines = [page.md_table(["fix", "state", "chosen cell", "why"], rows), ""]
    for fix, cells in choose.fixes(d.cells).items():
        key = rules.prefer.get(fix, ("setting",))[0]
        lines += [f"## {fix}", "",
                  page.md_table(["lr", key, "seeds", "plateau acc per seed (%)",
                                 "plateau acc (%)"],
                                [row(c, rules, picks[fix]) for c in cells]), ""]
    v = rules.versions[-1]
    return table.runs_page(d, "\n".join([
        "Every accuracy here is on the 1,000 training images held out of these runs "
        "(`data.holdout=1000`), never on the test split. Plateau accuracy: the mean val acc "
        "over the evaluations of the second half of training, averaged over the seeds.", "",
        *lines,
        f"The rule (experiments/recoverpilot/rules.yaml, version {v['version']}, written "
        f"{v['written']}): {rules.text['choose']}; a candidate: {rules.text['candidate']}; "
        f"{rules.text['edge']}. Two seeds per cell: a choice of protocol, not a result.", ""]))


def plot(d: RunsData, path: Path) -> None:
    rules = choose.Rules.read(RULES)
    groups = choose.fixes(d.cells)
    n = max(1, len(groups))
    cols = min(4, n)
    fig, axes = plt.subplots((n + cols - 1) // cols, cols, figsize=(3.6 * cols, 3.0 * ((n + cols
                             - 1) // cols)), squeeze=False, sharey=True)
    for ax, (fix, cells) in zip(axes.flat, groups.items(), strict=False):
        pick = choose.choose(cells, rules)
        by_setting: dict = {}
        for c in cells:
            by_setting.setdefault(choose.setting(c, rules), []).append(c)
        drawn = False
        for i, (s, cs) in enumerate(by_setting.items()):
            for c in cs:
                ys = c.jitter_values("plateau_acc")
                ax.plot([c.cell.meta["lr"]] * len(ys), ys, "o", color=f"C{i}", ms=3, alpha=0.5)
            pts = [(c.cell.meta["lr"], choose.score(c)) for c in cs
                   if choose.score(c) is not None]
            if pts:
                drawn = True
                ax.plot(*zip(*sorted(pts), strict=True), "-", color=f"C{i}",
                        label="mean" if s is None else str(s))
        if pick["cell"] is not None:
            ax.axvline(pick["cell"].cell.meta["lr"], color="C3", ls="--", lw=1)
        if not drawn:
            nothing_yet(ax, "runs still to come")
        ax.set_xscale("log", base=2)
        ax.set(title=fix, xlabel="learning rate")
        ax.grid(alpha=0.3)
        if len(by_setting) > 1 and drawn:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    axes[0][0].set_ylabel("plateau val acc, held-out (%)")
    save(fig, path, "Pilot for table-recover (resnet20, 4 ranks x 2, held-out; dashed: chosen)")


def verdicts(d: RunsData) -> list[Verdict]:
    return []  # choices of protocol, not claims


# Its own block: its runs are no seeds of the settled verdicts (no README line until
# table-recover rules on something).
TABLE = table.Table("recoverpilot", (), table.runs_data, render, verdicts, plot, block="recover")
