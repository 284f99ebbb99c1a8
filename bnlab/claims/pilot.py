"""`make table-pilot`: the headline protocol's choices, made on held-out data by stated rules.

    python -m bnlab.claims pilot --data DIR --jobs 2   # the pilot's runs, then the table
    python -m bnlab.claims pilot --report              # table from the runs' logs only

Trains experiments/pilot/sweep.yaml on the headline protocol (configs/experiment/headline.yaml)
with 1,000 training images held out (data.holdout=1000): every accuracy here is measured on
those held-out images, never on the test split that reports the results. `choice` applies
the rules below; the headline's tables (experiments/lr, fixes, values) use what it picks
(tests/claims/test_pilot.py checks that they do). Writes experiments/pilot/{table.md,
pilot.png}.

The rules, written before the pilot's runs, are data in experiments/pilot/rules.yaml: each
cell's score is its held-out plateau accuracy (bnlab.lab.choose.score); per choice, the best
score wins, and among candidates within `tie_points` of it the rule prefers the smallest rate,
the most groups (the closest to the claim's 32), the earliest freeze point. A choice is made
once every candidate of its kind has all its seeds; until then it says so.
"""

from __future__ import annotations

from pathlib import Path

from bnlab.lab import page, rules, table
from bnlab.lab.choose import score  # a candidate's mean held-out plateau accuracy
from bnlab.lab.figures import nothing_yet, plt, save
from bnlab.lab.results import CellResult, fmt
from bnlab.lab.table import RunsData, Verdict

RULES = rules.read("pilot")
TIE = RULES["tie_points"]  # points of plateau accuracy within which candidates count as tied
# Per choice: the spec key it varies, how a tie is broken (the preferred value among the tied),
# and how it reads in the table.
CHOICES = {ch: (c["key"], {"min": min, "max": max}[c["prefer"]], c["label"])
           for ch, c in RULES.raw["choices"].items()}


def cells_of(d: RunsData, choice: str) -> list[CellResult]:
    return [c for c in d.cells if c.cell.meta.get("choice") == choice]


def choose(d: RunsData, choice: str) -> dict:
    """{value, why} for one choice: the value is None until every candidate has finished."""
    key, prefer, _ = CHOICES[choice]
    cells = cells_of(d, choice)
    if not cells:
        return {"value": None, "why": "no candidates in the spec yet"}
    waiting = [c.cell.label for c in cells if len(c.runs) < c.expected]
    if waiting:
        return {"value": None, "why": f"{len(waiting)} of {len(cells)} candidates still lack "
                "seeds"}
    scored = {c.cell.meta[key]: score(c) for c in cells}
    ok = {v: s for v, s in scored.items() if s is not None}
    if not ok:
        return {"value": None, "why": "every candidate diverged in some seed"}
    best = max(ok.values())
    tied = [v for v, s in ok.items() if s >= best - TIE]
    value = prefer(tied)
    lost = [f"{v:g}" for v, s in scored.items() if s is None]
    why = (f"best plateau accuracy {best:.1f}% at {max(ok, key=ok.get):g}; within {TIE:g} "
           f"point of it: {', '.join(f'{v:g}' for v in sorted(tied))}; the rule prefers "
           f"{'the smallest' if prefer is min else 'the largest'}: {value:g}")
    if lost:
        why += f" (diverged in a seed, not candidates: {', '.join(lost)})"
    return {"value": value, "why": why, "score": ok[value]}


def choices(d: RunsData) -> dict[str, dict]:
    return {ch: choose(d, ch) for ch in CHOICES if cells_of(d, ch)}


# ----------------------------------------------------------------------------------------
# The table and its plot


def row(c: CellResult, key: str, picked) -> list[str]:
    per = [f"{r.jitter(c.epochs).get('plateau_acc', float('nan')):.1f}" if not r.diverged
           else "diverged" for r in c.runs]
    s = score(c)
    mark = " **(chosen)**" if picked is not None and c.cell.meta[key] == picked else ""
    return [f"{c.cell.meta[key]:g}{mark}", c.seeds_note(), ", ".join(per) or "-",
            fmt(s), c.jstat("final").fmt(1), c.jstat("vn_sd").fmt(2)]


def chosen(value) -> str:
    return "-" if value is None else f"{value:g}"


def render(d: RunsData) -> str:
    lines = []
    picks = choices(d)
    for ch, pick in picks.items():
        key, _, title = CHOICES[ch]
        lines += [f"## {title[0].upper() + title[1:]}", "",
                  page.md_table([key, "seeds", "plateau acc per seed (%)", "plateau acc (%)",
                                  "final acc (%)", "von Neumann sd (pts)"],
                                 [row(c, key, pick["value"]) for c in cells_of(d, ch)]), "",
                  f"**Chosen: {chosen(pick['value'])}** ({pick['why']}).", ""]
    return table.runs_page(d, "\n".join([
        "Every accuracy here is on the 1,000 training images held out of these runs "
        "(`data.holdout=1000`), never on the test split. Plateau accuracy: the mean val acc "
        "over the evaluations of the second half of training, averaged over the seeds.", "",
        *lines,
        f"Rules (experiments/pilot/rules.yaml, written before these runs): the best plateau "
        f"accuracy wins; candidates within {TIE:g} point of it count as tied, and the tie goes to "
        "the smaller learning rate, the most gn groups, the earliest freeze. A candidate that "
        "diverged in any seed is out. Two seeds per candidate: a choice of protocol, not a "
        "result; where candidates are tied the rule, not the data, picks.", "",
        *rules.history(RULES)]))


def plot(d: RunsData, path: Path) -> None:
    picks = choices(d) or {"lr": {"value": None}}
    fig, axes = plt.subplots(1, len(picks), figsize=(5.5 * len(picks), 4.2), squeeze=False)
    for ax, (ch, pick) in zip(axes[0], picks.items(), strict=True):
        key, _, title = CHOICES[ch]
        cells = cells_of(d, ch)
        xs = [c.cell.meta[key] for c in cells]
        for c, x in zip(cells, xs, strict=True):
            ys = c.jitter_values("plateau_acc")
            ax.plot([x] * len(ys), ys, "o", color="0.6", ms=4)
        means = [(x, score(c)) for c, x in zip(cells, xs, strict=True) if score(c) is not None]
        if means:
            ax.plot(*zip(*means, strict=True), "-", color="C0", lw=1.5, label="mean of seeds")
        else:
            nothing_yet(ax, "not every seed has run yet")
        if pick["value"] is not None:
            ax.axvline(pick["value"], color="C3", ls="--", lw=1, label=f"chosen: {pick['value']:g}")
        if ch == "lr":
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [f"{x:g}" for x in xs], rotation=45, ha="right")
        else:
            ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.set(title=title, xlabel=key, ylabel="plateau val acc, held-out (%)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    save(fig, path, "Pilot on 1,000 held-out training images (resnet20, 4 ranks x 2)")


def verdicts(d: RunsData) -> list[Verdict]:
    return []  # choices of protocol, not claims


TABLE = table.Table("pilot", (), table.runs_data, render, verdicts, plot, block="settled")
