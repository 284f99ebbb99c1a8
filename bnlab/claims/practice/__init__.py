"""`make table-practice`: Wu and He's batch-size experiment (Group Normalization, 2018) at CIFAR
scale. resnet20 at 8 simulated ranks x 16, 8, 4 and 2 images under one standard recipe
(configs/experiment/practice.yaml), every fix at its best, judged by
experiments/practice/rules.yaml (written before any of its runs):

    python -m bnlab.claims practice-spec [--data DIR]          # the spec, from the pilot's choices
    python -m bnlab.claims practice --data DIR --jobs 2        # its runs, then the table
    python -m bnlab.claims practice --report                   # the table from the runs' logs

Where BN breaks as the per-rank batch shrinks, whether GroupNorm stays flat, and at 8 x 2 how
much of BN's loss each fix gets back; Wu and He's published curve (ResNet-50 on ImageNet,
bnlab/measured/published.json) beside ours for the shape. Writes experiments/practice/
{table.md, practice.png}.

spec.py writes the spec from the pilot's choices; cells.py measures the cells; doctor.py judges
the doctor's thresholds and writes what the doctor reads; words.py writes the README's finding
2 once the 8 x 2 cells have their seeds (table-recover's and table-converge's findings then
leave the README: table-recover's line on another input stays under it, and this page links
all three earlier tables); this file writes the page and the figure.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from bnlab.claims import recover
from bnlab.claims.practice.cells import *  # noqa: F403
from bnlab.claims.practice.cells import (
    Practice,
    bn_states,
    find,
    fix_at_two,
    fixes_at_two,
    flatness,
    gap,
    load,
    per_seed,
)
from bnlab.claims.practice.doctor import *  # noqa: F403 (the table's names, one namespace)
from bnlab.claims.practice.doctor import advice, advice_row, before_v4, doctor_lines
from bnlab.claims.practice.spec import *  # noqa: F403
from bnlab.claims.practice.spec import BATCHES, NAMES, NORMS, PUBLISHED, RULES
from bnlab.claims.practice.words import *  # noqa: F403
from bnlab.claims.practice.words import IS, across, finding
from bnlab.lab import analysis, page, rules, table
from bnlab.lab.figures import nothing_yet, plt, save
from bnlab.lab.results import CellResult, fmt
from bnlab.lab.table import Verdict

# ----------------------------------------------------------------------------------------
# The page


def acc_cell(c: CellResult | None) -> str:
    """Mean end accuracy with its 95% t interval over the seeds."""
    if c is None:
        return "-"
    vals = list(per_seed(c).values())
    if len(c.runs) < c.expected or not vals:
        return f"({c.seeds_note()} seeds)"
    lo, hi = analysis.mean_interval(vals)
    return f"{np.mean(vals):.1f}" + (f" ({lo:.1f} to {hi:.1f})" if lo is not None else "")


def gap_cell(g: dict | None, state: str = "") -> str:
    """A paired gap with its interval, and its state where it has one."""
    if g is None:
        return state or "to come"
    iv = f" ({g['lo']:.1f} to {g['hi']:.1f})" if g["lo"] is not None else ""
    return f"{g['gap']:+.1f}{iv}" + (f", {state}" if state else "")


def published_gap(norm: str, b: int, against: int = 32) -> float:
    """Wu and He's top-1 error at `b` images per GPU minus theirs at `against` (points lost)."""
    err, at = PUBLISHED["error"][norm], PUBLISHED["images_per_rank"]
    return err[at.index(b)] - err[at.index(against)]


def render(data: Practice) -> str:
    if data.runs is None:
        return "\n".join(["# Every fix at its best at a practitioner's global batch (8 ranks)",
                          "", f"No runs yet: {data.waiting}.", "", *rules_lines(data), ""])
    d = data.runs
    cells = d.cells
    bn = bn_states(cells)
    rows = [[NAMES[f]] + [acc_cell(find(cells, f, b)) for b in BATCHES] for f in NORMS]
    grows = [[f"{NAMES['bn']}: gap to its 8 x 16"] + ["reference"] + [gap_cell(*bn[b]) for b in
                                                               BATCHES[1:]]]
    for f in ("gn", "gnws"):
        verdict, each = flatness(cells, f)
        grows.append([f"{NAMES[f]}: gap to its own 8 x 16 (across batches: {verdict})", "-",
                      *[gap_cell(*each[b]) for b in BATCHES[1:]]])
    fixes = [(c, fix_at_two(cells, c)) for c in fixes_at_two(cells)]  # measured once each
    frows = []
    for c, m in fixes:
        share = "-" if m is None or not math.isfinite(m["share"][0]) else \
            f"{100 * m['share'][0]:.0f}%" + (f" ({100 * m['share'][1]:.0f} to "
                                             f"{100 * m['share'][2]:.0f})" if m["share"][1]
                                             is not None else "")
        frows.append([NAMES.get(c.cell.meta["fix"], c.cell.meta["fix"]), acc_cell(c),
                      "-" if m is None else gap_cell(m["gap"]),
                      "-" if m is None else gap_cell(m["gain"]), share,
                      "to come" if m is None else m["state"]])
    lrows = [[c.cell.label, f"{c.cell.meta['lr']:g}", str(c.epochs), c.seeds_note(),
              steps_of(c), fmt(np.mean(losses) if (losses := final_losses(c)) else None, 3),
              by_seed(c)] for c in cells]
    return table.runs_page(d, "\n".join([
        f"Test accuracy of resnet20 on the CIFAR-10 subset ({images(d)}) at the end of "
        "training (the mean over the evaluations of its last tenth), mean over "
        f"{RULES['min_seeds']} seeds with its 95% t interval; gaps are paired on the seed "
        "(positive: accuracy lost).", "", *pilot_lines(data), EARLIER, "",
        "## BN and GroupNorm by images per rank (8 ranks)", "",
        *([said, ""] if (said := across(data)) else []),  # once every batch is judged
        page.md_table(["", *[f"8 x {b}" for b in BATCHES]], rows), "",
        page.md_table(["gap (points)", *[f"8 x {b}" for b in BATCHES]], grows), "",
        *gains_lines(cells),
        "## Each fix at 8 x 2 (global batch 16)", "",
        "Each fix against bn at 8 x 16 (the reference) and bn at 8 x 2. A gap is accuracy lost "
        "against the reference (positive: below it); a gain is accuracy won over bn at 8 x 2 "
        "(positive: above it). The share of bn's loss is the gain divided by bn's own gap, with "
        "a 95% bootstrap interval over the seeds. It is measured only where bn breaks at 8 x 2 "
        "and ended every seed; over 100% means the fix ends above the reference. WS: Weight "
        "Standardization.", "",
        recover.states_in_words(RULES, "the 8 x 16 reference") + " These are table-recover's "
        "states (rules: fixes, below), read in the order given.", "",
        page.md_table(["fix", "end acc (%)", "gap to 8 x 16", "gain over bn 8 x 2",
                       "share of bn's loss", "state"], frows), "",
        *best_lines(data), *weak_lines(cells, fixes),
        *doctor_lines(cells), *longer_lines(cells), *published_lines(cells),
        "## Every cell: rate, length, steps, final train loss and each seed's end", "",
        page.md_table(["cell", "lr at 128", "epochs", "seeds", "steps per run",
                       "final train loss (mean)", "end acc by seed (%)"], lrows), "",
        *rules_lines(data), ""]))


# where the question was asked before (table-recover's and table-converge's findings are what
# the README's finding 2 stands in for once this table tells it: practice.words.REPLACES), one
# click from the README
EARLIER = ("Asked before on smaller runs: [table-recover](../recover/table.md) (global batch 8, "
           "4 x 2 against 1 x 8, 10 epochs, on resnet20 and on torchvision resnet18 at 32 px), "
           "[table-converge](../converge/table.md) (the same on resnet20 for 40 epochs) and "
           "[table-batch](../batch/table.md) (Wu and He's layout at 4 ranks x 32 down to 2, "
           "torchvision resnet18 at 32 px, 5 epochs).")


def best_lines(data: Practice) -> list[str]:
    """The doctor's best fix at 8 x 2 and its best without per-step communication, by name,
    once every fix there has its seeds (advice_row)."""
    rule = "The doctor's best fix is the one with the best state, then the largest gain"
    if (row := advice_row(data)) is None:
        return [rule + ".", ""]
    best, free = row["best"], row.get("best_free")
    other = (f"; without per-step communication, {free['name']} ({free['state']})"
             if free is not None and free["fix"] != best["fix"] else "")
    return [f"{rule}: here {best['name']} ({best['state']}){other}.", ""]


def weak_lines(cells: list[CellResult], fixes: list[tuple[CellResult, dict | None]]
               ) -> list[str]:
    """Where the evidence at 8 x 2 is weak, said from the numbers: bn's own loss (what every
    share divides by) where its interval reaches below the break rule's points, and each fix
    that recovers by its gap to the reference while its gain over bn there reaches 0 (`fixes`:
    each fix's cell at 8 x 2 with its fix_at_two)."""
    said = []
    b, state = bn_states(cells)[2]
    if state == "breaks" and b is not None and not b["lost"] and b["lo"] is not None \
            and b["lo"] < RULES["break_points"]:
        said.append(f"bn's own loss at 8 x 2, {gap_cell(b)}, which every share divides by, "
                    f"has an interval reaching below the rule's {RULES['break_points']:g} points")
    weak = [(NAMES[c.cell.meta["fix"]], gap_cell(m["gain"])) for c, m in fixes
            if m is not None and m["state"] == "recovers"
            and m["gain"]["lo"] is not None and m["gain"]["lo"] <= 0]
    if weak:
        one = len(weak) == 1
        its, gains, those = ("its", "its gain", "that gain") if one else \
            ("their", "their gains", "those gains")
        said.append(f"{page.listed([n for n, _ in weak])} recover{'s' * one} by {its} gap to "
                    f"the reference, but {gains} over bn at 8 x 2, "
                    f"{page.listed([g for _, g in weak])}, reach{'es' * one} 0 or below: the "
                    f"{RULES['min_seeds']} seeds cannot tell {those} from none")
    return [f"Where the evidence is weak: {'; '.join(said)}.", ""] if said else []


def gains_lines(cells: list[CellResult]) -> list[str]:
    """Where gn or gnws ends clearly higher at fewer images per rank than at its own 8 x 16
    (the interval below 0): rule `flat` bounds a loss only, so that counts as flat; said with
    the optimizer steps each run took."""
    got = [f"{NAMES[f]} at 8 x {b}, {gap_cell(g)}" for f in ("gn", "gnws")
           for b, (g, _) in flatness(cells, f)[1].items()
           if g is not None and not g["lost"] and g["hi"] is not None and g["hi"] < 0]
    if not got:
        return []
    ref = find(cells, "bn", BATCHES[0])
    steps = {b: n for b in BATCHES if (c := find(cells, "bn", b)) is not None
             and (n := steps_of(c)) != "-"}
    return [f"Ends higher than at its own 8 x 16 (a negative gap): {'; '.join(got)}. Rule flat "
            "bounds a loss only, so a gain counts as flat; a run takes "
            f"{', '.join(f'{n} optimizer steps at 8 x {b}' for b, n in steps.items())} "
            f"({ref.epochs if ref else '-'} epochs each: fewer images per rank make more, "
            "smaller steps over the same epochs).", ""]


def images(d: table.RunsData) -> str:
    """'5,085 training images, 1,017 test'."""
    n = d.tested_on
    return f"{d.trained_on:,} training images" + (f", {n:,} test" if n else "")


def pilot_lines(data: Practice) -> list[str]:
    """What the pilot said of a choice it gave that is not plainly settled, read where it
    is: a length no doubling settled, a rate still on its ladder's edge."""
    if not data.pilot:
        return []
    return ["From its pilot ([table-practicepilot](../practicepilot/table.md), on held-out "
            "training images):", "", *(f"- {x}." for x in data.pilot), ""]


def by_seed(c: CellResult) -> str:
    """Each seed's end accuracy, in seed order ('seed 1 diverged' where one did), so that a
    reader sees which seed widens an interval."""
    ends = per_seed(c)
    return ", ".join(f"{ends[r.seed]:.1f}" if r.seed in ends else f"seed {r.seed} diverged"
                     for r in sorted(c.runs, key=lambda r: r.seed)) or "-"


def steps_of(c: CellResult) -> str:
    n = [r.info.get("steps_per_epoch") for r in c.runs if r.info.get("steps_per_epoch")]
    return f"{n[0] * c.epochs:,}" if n else "-"


def final_losses(c: CellResult) -> list[float]:
    return [v for r in c.runs if not r.diverged and (v := r.last("train_epoch/loss")) is not None]


def longer_lines(cells: list[CellResult]) -> list[str]:
    """gn at the table's length and at twice it, each against the same bn reference (8 x 16 at
    the table's length)."""
    ref = find(cells, "bn", 16)
    rows = [[f"8 x {b}", gap_cell(gap(find(cells, "gn", b), ref)),
             gap_cell(gap(find(cells, "gn", b, longer=True), ref))] for b in (16, 2)]
    n = ref.epochs if ref is not None else None
    at = (f"gn at {n} epochs", f"gn at {2 * n} epochs") if n else ("gn", "gn at twice the length")
    over = f" over {n} epochs" if n else ""
    return ["## Does GroupNorm catch up with twice the training? (shown, not ruled)", "",
            f"Each gap is against the same bn reference, bn at 8 x 16{over} (positive: gn ends "
            "below it).", "", page.md_table(["gn's gap to the bn reference", *at], rows), ""]


def published_lines(cells: list[CellResult]) -> list[str]:
    bn = bn_states(cells)[2][0]
    g16 = gap(find(cells, "gn", 16), find(cells, "bn", 16))
    err, at = PUBLISHED["error"], PUBLISHED["images_per_rank"]
    return ["## Beside Wu and He's published curve (shown, not ruled)", "",
            f"Published: {PUBLISHED['source']}, top-1 error by images per GPU; the shape is "
            f"compared, not the numbers ({PUBLISHED['model']} on {PUBLISHED['dataset']} "
            "there, resnet20 on the CIFAR-10 subset here).", "",
            page.md_table(["", "ours (points, 95% CI)", "Wu and He (points)"], [
                ["bn's loss at 2 images per rank against 16",
                 "-" if bn is None else gap_cell(bn), f"{published_gap('bn', 2, 16):.1f}"],
                ["bn's loss at 2 images per rank against 32 (not run here)", "-",
                 f"{published_gap('bn', 2):.1f}"],
                ["gn's gap to bn at 16 images per rank", "-" if g16 is None else gap_cell(g16),
                 f"{err['gn'][at.index(16)] - err['bn'][at.index(16)]:.1f}"]]), ""]


def rules_lines(data: Practice) -> list[str]:
    """The rules in words (rules.yaml), then their history (what version 3 gives on `data`)."""
    words = [f"**{k}**: {' '.join(RULES.raw[k].split())}" for k in (
        "cells", "measure", "bn_breaks", "flat", "fixes", "diverged", "longer", "published",
        "doctor", "doctor_change", "advice")]
    return ["## The rules", "", *[w + "\n" for w in words],
            *rules.history(RULES, {"before_v4": before_v4(data)})]


# ----------------------------------------------------------------------------------------
# The figure: ours by images per rank, Wu and He's, and accuracy against steps


def plot(data: Practice, path: Path) -> None:
    fig, (ours, theirs, steps) = plt.subplots(1, 3, figsize=(13, 3.8))
    cells = data.runs.cells if data.runs else []
    drawn = False
    for i, f in enumerate(NORMS):
        pts = [(b, np.mean(list(v.values())), v) for b in BATCHES
               if (c := find(cells, f, b)) is not None and table.complete(c)
               and (v := per_seed(c))]
        if pts:
            drawn = True
            xs = [p[0] for p in pts]
            ours.plot(xs, [100 - p[1] for p in pts], "o-", color=f"C{i}", label=NAMES[f])
            for b, _, v in pts:
                ours.plot([b] * len(v), [100 - a for a in v.values()], ".", color=f"C{i}",
                          alpha=0.4)
    if not drawn:
        nothing_yet(ours, "runs still to come")
    else:
        ours.legend(fontsize=7)
    ours.set(title="ours: resnet20, CIFAR-10 subset", xlabel="images per rank (8 ranks)",
             ylabel="test error (%)")
    at = PUBLISHED["images_per_rank"]
    for i, f in enumerate(("bn", "gn")):
        theirs.plot(at, PUBLISHED["error"][f], "s--", color=f"C{i}", label=f"{NAMES[f]}")
    theirs.legend(fontsize=7)
    theirs.set(title="published: Wu and He 2018, ResNet-50, ImageNet",
               xlabel="images per GPU (8 GPUs)", ylabel="top-1 error (%)")
    shown = False
    for i, f in enumerate(NORMS):
        for j, b in enumerate(BATCHES):
            c = find(cells, f, b)
            if c is None or not table.complete(c):  # as the panel beside it: every seed
                continue
            x, m, _, _ = c.mean_series("val/acc")
            spe = c.runs[0].info.get("steps_per_epoch")
            if x and spe:
                shown = True
                steps.plot([e * spe for e in x], m, color=f"C{i}", alpha=1 - 0.2 * j, lw=1,
                           label=f"{f} 8 x {b}")
    if shown:
        steps.legend(fontsize=6, ncol=3)
    else:
        nothing_yet(steps, "runs still to come")
    steps.set_xscale("log")
    steps.set(title="ours: test acc against optimizer steps", xlabel="steps",
              ylabel="test acc (%)")
    for ax in (ours, theirs):
        ax.set_xscale("log", base=2)
        ax.set_xticks(at)
        ax.set_xticklabels([str(a) for a in at])
        ax.invert_xaxis()
    for ax in (ours, theirs, steps):
        ax.grid(alpha=0.3)
    save(fig, path, title(data))


def title(data: Practice) -> str:
    """The figure's message: where BN breaks and whether GroupNorm and GroupNorm+WS stay flat,
    once all are judged at every per-rank batch (states only: what the rules gave); until then
    what it shows."""
    said = across(data) if data.runs is not None else ""
    if not said:
        return "BN and GroupNorm by images per rank: ours beside Wu and He's (runs to come)"
    cells = data.runs.cells
    states = {b: s for b, (_, s) in bn_states(cells).items()}
    breaks = [str(b) for b, s in states.items() if s == "breaks"]
    bn = (f"BN breaks at {page.listed(breaks)} images per rank" if breaks else
          "BN holds at every per-rank batch" if set(states.values()) == {"holds"} else
          "BN's break is unclear")
    return (f"{bn}; GroupNorm {IS[flatness(cells, 'gn')[0]]}, GroupNorm+WS "
            f"{IS[flatness(cells, 'gnws')[0]]} (ours, beside Wu and He's)")


def verdicts(data: Practice) -> list[Verdict]:
    return []  # its rules' states are on its page; the README's finding follows its runs


TABLE = table.Table("practice", (), load, render, verdicts, plot, block="practice", also=advice,
                    headline="practice.png", headline_told=True, finding=finding)
