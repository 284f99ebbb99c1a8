"""`make table-practicepilot`: table-practice's two protocol choices, made on held-out data by
the rules in experiments/practicepilot/rules.yaml before any of table-practice's runs: the
length at which the BN reference (8 ranks x 16) stops gaining, and each batch-free fix's rate.

    python -m bnlab.claims practicepilot --data DIR --jobs 2   # the pilot's runs, then the table
    python -m bnlab.claims practicepilot --report              # table from the runs' logs only

Trains experiments/practicepilot/sweep.yaml (configs/experiment/practice.yaml's recipe, 1,000
training images held out): every accuracy here is on those held-out images, never on the test
split. Writes experiments/practicepilot/{table.md, practicepilot.png}.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from bnlab.lab import choose, page, table
from bnlab.lab.figures import nothing_yet, plt, save
from bnlab.lab.results import CellResult, fmt
from bnlab.lab.table import RunsData, Verdict
from bnlab.paths import EXPERIMENTS

RULES = EXPERIMENTS / "practicepilot" / "rules.yaml"
LENGTH = "length"  # the length pilot's cells' `fix`


def gain_points() -> float:
    return float(yaml.safe_load(RULES.read_text())["length_gain_points"])


def length_cells(cells: list[CellResult]) -> list[CellResult]:
    return sorted((c for c in cells if c.cell.meta["fix"] == LENGTH),
                  key=lambda c: c.cell.meta["length"])


def rate_cells(cells: list[CellResult]) -> list[CellResult]:
    return [c for c in cells if c.cell.meta["fix"] != LENGTH]


def length_choice(cells: list[CellResult], rules: choose.Rules) -> dict:
    """{state, length, why}: the shortest length whose doubling adds less than the rules'
    points; the longest tried where none does ("not settled")."""
    cs = length_cells(cells)
    waiting = [c for c in cs if len(c.runs) < c.expected]
    if not cs or waiting:
        return {"state": "undecided", "length": None,
                "why": f"runs still to come ({len(waiting)} of {len(cs)} lengths lack seeds)"}
    scores = {c.cell.meta["length"]: choose.score(c, rules) for c in cs}
    if any(s is None for s in scores.values()):
        lost = [f"{n} epochs" for n, s in scores.items() if s is None]
        return {"state": "no candidate", "length": None,
                "why": f"a seed diverged at {', '.join(lost)}"}
    limit = gain_points()
    for n, s in scores.items():
        if 2 * n in scores and scores[2 * n] - s < limit:
            return {"state": "chosen", "length": n,
                    "why": f"{n} to {2 * n} epochs adds {scores[2 * n] - s:+.1f} points "
                           f"(under {limit:g}): {s:.1f}% to {scores[2 * n]:.1f}%"}
    longest = max(scores)
    return {"state": "not settled", "length": longest,
            "why": f"no doubling within the ladder adds under {limit:g} point; the longest "
                   f"tried, {longest} epochs ({scores[longest]:.1f}%), is used"}


def choices(d: RunsData) -> dict[str, dict]:
    """The length choice and each fix's rate choice (bnlab.lab.choose), from the runs."""
    rules = choose.Rules.read(RULES)
    return {LENGTH: length_choice(d.cells, rules), **choose.choices(rate_cells(d.cells), rules)}


def per_seed(c: CellResult) -> str:
    return ", ".join("diverged" if r.diverged else fmt(r.end_acc(c.epochs)) for r in c.runs) \
        or "-"


def render(d: RunsData) -> str:
    rules = choose.Rules.read(RULES)
    picks = choices(d)
    length = picks[LENGTH]
    rows = [[LENGTH, length["state"], "-" if length["length"] is None else
             f"{length['length']} epochs", length["why"]]]
    rows += [[fix, p["state"], p["cell"].cell.label if p["cell"] else "-", p["why"]]
             for fix, p in picks.items() if fix != LENGTH]
    scores = {c.cell.meta["length"]: choose.score(c, rules) for c in length_cells(d.cells)}
    lrows = [[f"{n}", c.seeds_note(), per_seed(c), fmt(scores[n]),
              fmt(scores[2 * n] - scores[n]) if scores.get(2 * n) is not None
              and scores[n] is not None else "-",
              fmt(c.runs[0].last("train_epoch/loss"), 3) if c.runs else "-"]
             for n, c in zip(scores, length_cells(d.cells), strict=True)]
    lines = [page.md_table(["choice", "state", "chosen", "why"], rows), "",
             "## The reference's length (bn, 8 ranks x 16 images)", "",
             page.md_table(["epochs", "seeds", "end acc per seed (%)", "end acc (%)",
                            "gain on doubling (points)", "final train loss (seed 0)"], lrows), ""]
    for fix, cells in choose.fixes(rate_cells(d.cells)).items():
        lines += [f"## {fix} at 8 ranks x 2 images, 30 epochs", "",
                  page.md_table(["lr at global batch 128", "seeds", "end acc per seed (%)",
                                 "end acc (%)"],
                                [[f"{c.cell.meta['lr']:g}" + (" **(chosen)**" if
                                  picks[fix]["cell"] is c else ""), c.seeds_note(),
                                  per_seed(c), fmt(choose.score(c, rules))] for c in cells]), ""]
    v = rules.versions[-1]
    return table.runs_page(d, "\n".join([
        "Every accuracy here is on the 1,000 training images held out of these runs "
        "(`data.holdout=1000`), never on the test split. The score: "
        f"{rules.text['score']}.", "", *lines,
        f"The rules (experiments/practicepilot/rules.yaml, version {v['version']}, commit "
        f"{v['commit']}, written {v['written']}): length: {rules.text['length']}. Rate: "
        f"{rules.text['choose']}; a candidate: {rules.text['candidate']}; "
        f"{rules.text['edge']}. Then: {rules.text['applies']}. Two seeds per cell: choices "
        "of protocol, not results.", ""]))


def plot(d: RunsData, path: Path) -> None:
    rules = choose.Rules.read(RULES)
    fig, (la, ra) = plt.subplots(1, 2, figsize=(9.5, 3.4))
    pts = [(c.cell.meta["length"], choose.score(c, rules), choose.accs(c, "end"))
           for c in length_cells(d.cells)]
    for n, _, ys in pts:
        la.plot([n] * len(ys), ys, "o", color="C0", ms=3, alpha=0.5)
    done = [(n, s) for n, s, _ in pts if s is not None]
    if done:
        la.plot(*zip(*done, strict=True), "-", color="C0", label="mean")
    else:
        nothing_yet(la, "runs still to come")
    pick = length_choice(d.cells, rules)
    if pick["length"] is not None:
        la.axvline(pick["length"], color="C3", ls="--", lw=1)
    la.set_xscale("log", base=2)
    la.set(title="bn at 8 x 16: length", xlabel="epochs", ylabel="end val acc, held-out (%)")
    drawn = False
    for i, (fix, cells) in enumerate(choose.fixes(rate_cells(d.cells)).items()):
        for c in cells:
            ys = choose.accs(c, "end")
            ra.plot([c.cell.meta["lr"]] * len(ys), ys, "o", color=f"C{i}", ms=3, alpha=0.5)
        means = sorted((c.cell.meta["lr"], choose.score(c, rules)) for c in cells
                       if choose.score(c, rules) is not None)
        if means:
            drawn = True
            ra.plot(*zip(*means, strict=True), "-", color=f"C{i}", label=fix)
        p = choose.choose(cells, rules)
        if p["cell"] is not None:
            ra.axvline(p["cell"].cell.meta["lr"], color=f"C{i}", ls="--", lw=1)
    if drawn:
        ra.legend(fontsize=7)
    else:
        nothing_yet(ra, "runs still to come")
    ra.set_xscale("log", base=2)
    ra.set(title="fixes at 8 x 2, 30 epochs: rate", xlabel="lr at global batch 128")
    for ax in (la, ra):
        ax.grid(alpha=0.3)
    save(fig, path, "Pilot for table-practice (resnet20, held-out; dashed: chosen)")


def verdicts(d: RunsData) -> list[Verdict]:
    return []  # choices of protocol, not claims


TABLE = table.Table("practicepilot", (), table.runs_data, render, verdicts, plot,
                    block="practice")
