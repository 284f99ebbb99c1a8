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
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from bnlab.advice import FREE as COMMUNICATION_FREE
from bnlab.claims import practicepilot
from bnlab.claims.frompilot import write_from_pilot
from bnlab.claims.recover.cells import fewest_values, groups_of
from bnlab.claims.recover.cells import state as fix_state
from bnlab.doctor import MIN_IMAGES, MIN_VALUES, at_risk
from bnlab.errors import BnlabError
from bnlab.lab import analysis, judge, page, rules, table
from bnlab.lab.figures import nothing_yet, plt, save
from bnlab.lab.results import CellResult, fmt
from bnlab.lab.table import Verdict
from bnlab.paths import EXPERIMENTS, MEASURED

RULES = rules.read("practice")
SPEC = EXPERIMENTS / "practice" / "sweep.yaml"
PUBLISHED = json.loads((MEASURED / "published.json").read_text())["wu_he_2018"]
SEEDS = list(range(RULES["min_seeds"]))
RANKS = 8
BATCHES = (16, 8, 4, 2)       # images per rank; global batch 128 .. 16
NORMS = ("bn", "gn", "gnws")  # at every per-rank batch
FREE = ("gn", "gnws", "evonorm")  # their rates come from the pilot
NAMES = {"bn": "BN", "gn": "GroupNorm", "gnws": "GroupNorm + WS", "syncbn4": "SyncBN in groups "
         "of 4 ranks", "frozen_bn": "frozen BN", "brn": "Batch Renorm",
         "precise": "BN + PreciseBN before each evaluation", "evonorm": "EvoNorm-S0"}
BRN_RAMP = "norm.ramp_of_run={hold:0.03125,r_ramp:0.25,d_ramp:0.15625}"  # the paper's 5k/40k/25k
# of its 160k steps


# ----------------------------------------------------------------------------------------
# The spec, from table-practicepilot's choices


def fix_overrides(fix: str, length: int, lr: float) -> list[str]:
    """The overrides of one fix (beyond the per-rank batch and the length)."""
    return {"bn": ["norm=bn"],
            "gn": ["norm=gn", "norm.groups=8", f"optim.lr={lr:g}"],
            "gnws": ["norm=gnws", "norm.groups=8", f"optim.lr={lr:g}"],
            "evonorm": ["norm=evonorm", "norm.groups=8", "norm.placement=norm_act",
                        f"optim.lr={lr:g}"],
            "syncbn4": ["norm=syncbn", "norm.sync_group=4"],
            "frozen_bn": ["norm=frozen_bn", f"norm.freeze_after={length // 2}"],
            "brn": ["norm=brn", "norm.r_max=1.5", "norm.d_max=0.5", "norm.momentum=0.01",
                    BRN_RAMP],
            "precise": ["norm=bn", "precise_bn.before_eval=true"]}[fix]


def spec_cells(length: int, rates: dict[str, float]) -> list[dict]:
    """Every cell, in running order: the 8 x 16 reference and the 8 x 2 cells, then gn and
    gnws at 8 x 16, gn at twice the length, then 8 x 4, then 8 x 8 (cut first)."""
    def cell(fix: str, b: int, order: int, epochs: int = length) -> dict:
        lr = rates.get(fix, 0.1)
        longer = epochs != length
        return {"label": f"{fix} {RANKS}x{b}" + (f" ({epochs} epochs)" if longer else ""),
                "fix": fix, "per_rank": b, "lr": lr, "longer": longer, "order": order,
                "overrides": [*fix_overrides(fix, epochs, lr), f"batch_per_gpu={b}",
                              f"epochs={epochs}"]}

    cells = [cell("bn", 16, 0)]
    cells += [cell(f, 2, 0) for f in (*NORMS, "syncbn4", "frozen_bn", "brn", "precise",
                                      "evonorm")]
    cells += [cell(f, 16, 1) for f in ("gn", "gnws")]
    cells += [cell("gn", b, 2, 2 * length) for b in (16, 2)]
    cells += [cell(f, 4, 3) for f in NORMS] + [cell(f, 8, 4) for f in NORMS]
    return cells


def pilot_choices(data: str | None = None) -> tuple[int, dict[str, float]]:
    """The length and each batch-free fix's rate from the pilot's committed runs; a BnlabError
    while any is not chosen."""
    d = table.runs_data(table.Context(practicepilot.TABLE, data=data))
    picks = practicepilot.choices(d)
    open_ = [f"{k} ({p['state']})" for k, p in picks.items()
             if p["state"] not in ("chosen", "not settled")]
    if open_ or set(FREE) - set(picks):
        raise BnlabError(f"the pilot has not chosen everything yet: {', '.join(open_) or 'a fix'}"
                         "; run `make table-practicepilot` until each is chosen.")
    return picks["length"]["length"], {f: picks[f]["cell"].cell.meta["lr"] for f in FREE}


HEADER = [
    "make table-practice: Wu and He's batch-size experiment at CIFAR scale (rules.yaml beside",
    "this file, written before any of its runs). Written from table-practicepilot's choices",
    "(the length, each batch-free fix's rate) by `python -m bnlab.claims practice-spec`.",
    "Run order: the 8 x 16 reference and every 8 x 2 cell, then gn and gnws at 8 x 16, gn at",
    "twice the length, then 8 x 4, then 8 x 8 (the budget cuts 8 x 8 first, then 8 x 4)."]


def write_spec(path: Path = SPEC, data: str | None = None) -> int:
    length, rates = pilot_choices(data)
    return write_from_pilot(path, HEADER, {
        "title": "Every fix at its best at a practitioner's global batch: BN, GroupNorm and the "
                 "fixes by images per rank (8 ranks)", "experiment": "practice", "seeds": SEEDS,
        "jobs": 2, "cells": spec_cells(length, rates)}, "practice")


# ----------------------------------------------------------------------------------------
# Measures: end accuracy paired on the seed


Practice = table.Pending  # its runs once its spec exists, else why it waits


def load(ctx: table.Context) -> Practice:
    return table.pending(ctx, "its spec is written from table-practicepilot's choices once the "
                         "length and every batch-free fix's rate are chosen (`python -m "
                         "bnlab.claims practice-spec`)")


def find(cells: list[CellResult], fix: str, b: int, longer: bool = False) -> CellResult | None:
    return next((c for c in cells if c.cell.meta["fix"] == fix and c.cell.meta["per_rank"] == b
                 and bool(c.cell.meta.get("longer")) == longer), None)


def per_seed(c: CellResult) -> dict[int, float]:
    """End accuracy by seed, over the seeds that ended without diverging."""
    out = {}
    for r in c.runs:
        v = r.end_acc(c.epochs)
        if v is not None:
            out[r.seed] = v
    return out


def gap(c: CellResult | None, ref: CellResult | None) -> dict | None:
    """ref's end accuracy minus c's, paired on the seed: mean, 95% t interval, pairs, and
    whether c diverged where ref did not; None until both have every seed."""
    if c is None or ref is None or not table.complete(c, ref):
        return None
    a, b = per_seed(c), per_seed(ref)
    diffs = [b[s] - a[s] for s in sorted(set(a) & set(b))]
    lo, hi = analysis.mean_interval(diffs)
    return {"gap": float(np.mean(diffs)) if diffs else math.nan, "lo": lo, "hi": hi,
            "n": len(diffs), "lost": any(s in b and s not in a for s in {r.seed for r in c.runs})}


def level(g: dict | None, bad: str, good: str, at_least: float, under: float) -> str:
    """`bad` where the gap is at least `at_least` with its interval above 0, `good` where it is
    under `at_least` with its upper end under `under`, else unclear."""
    if g is None:
        return "to come"
    if g["lost"]:
        return bad
    if g["n"] < RULES["min_seeds"] or g["lo"] is None:
        return "unclear"
    if g["gap"] >= at_least and g["lo"] > 0:
        return bad
    if g["gap"] < at_least and g["hi"] < under:
        return good
    return "unclear"


def bn_states(cells: list[CellResult]) -> dict[int, tuple[dict | None, str]]:
    """bn's gap to 8 x 16 and its state at each smaller per-rank batch."""
    ref = find(cells, "bn", 16)
    return {b: (g, level(g, "breaks", "holds", RULES["break_points"], RULES["flat_interval"]))
            for b in BATCHES[1:] for g in [gap(find(cells, "bn", b), ref)]}


def flatness(cells: list[CellResult], fix: str) -> tuple[str, dict[int, tuple[dict | None, str]]]:
    """A batch-free norm's gap to its own 8 x 16 cell at each per-rank batch, and the verdict:
    flat, drops (at some batch), unclear or to come."""
    own = find(cells, fix, 16)
    each = {b: (g, level(g, "drops", "flat", RULES["flat_gap"], RULES["flat_interval"]))
            for b in BATCHES[1:] for g in [gap(find(cells, fix, b), own)]}
    states = [s for _, s in each.values()]
    verdict = "drops" if "drops" in states else "to come" if "to come" in states else \
        "flat" if all(s == "flat" for s in states) else "unclear"
    return verdict, each


def fix_at_two(cells: list[CellResult], c: CellResult) -> dict | None:
    """A fix at 8 x 2 against the 8 x 16 reference and bn at 8 x 2: table-recover's state and
    the share of bn's loss it gets back (where bn breaks at 8 x 2)."""
    ref, bn = find(cells, "bn", 16), find(cells, "bn", 2)
    g, gain = gap(c, ref), gap(bn, c)
    if g is None or gain is None or (b := gap(bn, ref)) is None:
        return None
    breaks = level(b, "breaks", "holds", RULES["break_points"], RULES["flat_interval"]) == \
        "breaks"
    a, bb, r = per_seed(c), per_seed(bn), per_seed(ref)
    seeds = sorted(set(a) & set(bb) & set(r))
    share = judge.ratio_of_means([a[s] - bb[s] for s in seeds], [r[s] - bb[s] for s in seeds]) \
        if breaks else (math.nan, None, None)
    return {"gap": g, "gain": gain, "share": share, "state": fix_state(g, gain, g["lost"], RULES)}


# ----------------------------------------------------------------------------------------
# The doctor's thresholds (rules `doctor`, `doctor_change`) and the advice row (`advice`)

WHERE = f"{RANKS} ranks x 2 on resnet20 (CIFAR-10)"


def doctor_judgment(cells: list[CellResult]) -> dict:
    """The doctor's thresholds on bn's cells at 8, 4 and 2 images per rank (rules `doctor`):
    {answer, rows: [{per_rank, values, state, flagged}], change}; `change` is what
    `doctor_change` gives (a new MIN_IMAGES, or None where the thresholds stay)."""
    states = bn_states(cells)
    rows = []
    for b in BATCHES[1:]:
        v = fewest_values(find(cells, "bn", b))
        rows.append({"per_rank": b, "values": v, "state": states[b][1],
                     "flagged": None if v is None else at_risk(b, v)})
    if any(r["state"] not in ("breaks", "holds") or r["flagged"] is None for r in rows):
        return {"answer": "undecided", "rows": rows, "change": None}
    wrong = [r for r in rows if r["flagged"] != (r["state"] == "breaks")]
    if not wrong:
        return {"answer": "supported", "rows": rows, "change": None}
    named = "; ".join(f"bn {r['state']} at {RANKS} x {r['per_rank']} ({r['per_rank']} images, "
                      f"{r['values']} values), which the doctor "
                      f"{'flags' if r['flagged'] else 'passes'}" for r in wrong)
    breaking = [r["per_rank"] for r in rows if r["state"] == "breaks"]
    holding = [r["per_rank"] for r in rows if r["state"] == "holds"]
    separate = bool(holding) and (not breaking or max(breaking) < min(holding))
    return {"answer": f"not supported ({named})", "rows": rows,
            "change": min(holding) if separate else None}


def doctor_lines(cells: list[CellResult]) -> list[str]:
    """The page's section on the doctor's thresholds: each bn cell flagged or passed, the
    answer, and what `doctor_change` gives."""
    j = doctor_judgment(cells)
    rows = [[f"{RANKS} x {r['per_rank']}", str(r["per_rank"]),
             "-" if r["values"] is None else str(r["values"]), r["state"],
             "-" if r["flagged"] is None else "flagged" if r["flagged"] else "passed"]
            for r in j["rows"]]
    if j["answer"] == "undecided":
        then = "The thresholds stay until every bn cell has its state."
    elif j["change"] is not None:
        then = (f"By doctor_change, MIN_IMAGES becomes {j['change']} (the smallest per-rank "
                "batch at which bn holds), in its own commit that names that rule.")
    elif j["answer"] == "supported":
        then = "The thresholds stay."
    elif not any(r["state"] == "holds" for r in j["rows"]):
        then = ("bn holds at no per-rank batch below 16, so doctor_change has no batch to move "
                "MIN_IMAGES to: the thresholds stay, and the doctor says they are not "
                "supported here.")
    else:
        then = ("bn's breaking and holding per-rank batches do not separate, so by "
                "doctor_change the thresholds stay, and the doctor says they are not supported "
                "here.")
    return ["## The doctor's thresholds against bn's curve", "",
            f"bnlab's doctor flags a BN layer below {MIN_IMAGES} images or {MIN_VALUES} values "
            "per channel per rank (rules: doctor). Here, at resnet20's smallest BN layer:", "",
            page.md_table(["bn", "images per rank", "values per channel per rank", "bn",
                           "the doctor"], rows), "",
            f"The thresholds: **{j['answer']}**. {then}", ""]


def advice_row(data: Practice) -> dict | None:
    """This table's row for the doctor (rules `advice`), in table-recover's form: every fix at
    8 x 2 ({fix, name, state, gain, groups, share, lo, hi}), the best and the best without
    per-step communication, the input and its values per channel; None until the reference, bn
    at 8 x 2 and every fix there have their seeds."""
    if data.runs is None:
        return None
    cells = data.runs.cells
    at_two = [c for c in cells if c.cell.meta["per_rank"] == 2 and not c.cell.meta.get("longer")
              and c.cell.meta["fix"] != "bn"]
    ms = {c.cell.meta["fix"]: (c, fix_at_two(cells, c)) for c in at_two}
    if not ms or any(m is None for _, m in ms.values()):
        return None
    fixes = {f: {"fix": f, "name": NAMES.get(f, f), "state": m["state"],
                 "gain": m["gain"]["gap"], **groups_of(c),
                 **({"share": m["share"][0], "lo": m["share"][1], "hi": m["share"][2]}
                    if math.isfinite(m["share"][0]) else {})}
             for f, (c, m) in ms.items()}
    free = [f for f in fixes if f in COMMUNICATION_FREE]
    gain = lambda f: fixes[f]["gain"]  # noqa: E731
    return {"table": "table-practice", "input": "resnet20",
            "values": fewest_values(find(cells, "bn", 2)), "where": WHERE,
            "global_batch": 2 * RANKS, "epochs": find(cells, "bn", 2).epochs,
            "best": fixes[max(fixes, key=gain)],
            "best_free": fixes[max(free, key=gain)] if free else None, "fixes": fixes}


def advice(data: Practice, out: Path) -> None:
    """practice.json for the doctor (bnlab.advice): the advice row once its cells have their
    seeds, and what this table finds of the thresholds once bn's cells are judged; removed
    while it has neither."""
    path = table.measured_path(out, "practice", "practice.json")
    row = advice_row(data)
    j = doctor_judgment(data.runs.cells) if data.runs is not None else {"answer": "undecided"}
    got = {**(row or {}), **({"thresholds": {
        "answer": j["answer"], "global_batches": f"{2 * RANKS} to {BATCHES[0] * RANKS}",
        "table": "make table-practice: experiments/practice/table.md in bnlab's repository"}}
        if j["answer"] != "undecided" else {})}
    if not got:
        path.unlink(missing_ok=True)
    else:
        table.save_results(path, got)


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


def published_gap(norm: str, b: int) -> float:
    """Wu and He's top-1 error at `b` images per GPU minus theirs at 32 (points lost)."""
    err, at = PUBLISHED["error"][norm], PUBLISHED["images_per_rank"]
    return err[at.index(b)] - err[at.index(32)]


def render(data: Practice) -> str:
    if data.runs is None:
        return "\n".join(["# Every fix at its best at a practitioner's global batch (8 ranks)",
                          "", f"No runs yet: {data.waiting}.", "", *rules_lines(), ""])
    d = data.runs
    cells = d.cells
    bn = bn_states(cells)
    rows = [[NAMES[f]] + [acc_cell(find(cells, f, b)) for b in BATCHES] for f in NORMS]
    grows = [["bn: gap to bn at 8 x 16"] + ["reference"] + [gap_cell(*bn[b]) for b in
                                                               BATCHES[1:]]]
    for f in ("gn", "gnws"):
        verdict, each = flatness(cells, f)
        grows.append([f"{f}: gap to its own 8 x 16 ({verdict})", "-",
                      *[gap_cell(*each[b]) for b in BATCHES[1:]]])
    fixes = [c for c in cells if c.cell.meta["per_rank"] == 2 and not c.cell.meta.get("longer")
             and c.cell.meta["fix"] != "bn"]
    frows = []
    for c in fixes:
        m = fix_at_two(cells, c)
        share = "-" if m is None or not math.isfinite(m["share"][0]) else \
            f"{100 * m['share'][0]:.0f}%" + (f" ({100 * m['share'][1]:.0f} to "
                                             f"{100 * m['share'][2]:.0f})" if m["share"][1]
                                             is not None else "")
        frows.append([NAMES.get(c.cell.meta["fix"], c.cell.meta["fix"]), acc_cell(c),
                      "-" if m is None else gap_cell(m["gap"]),
                      "-" if m is None else gap_cell(m["gain"]), share,
                      "to come" if m is None else m["state"]])
    lrows = [[c.cell.label, f"{c.cell.meta['lr']:g}", str(c.epochs), c.seeds_note(),
              steps_of(c), fmt(np.mean(losses) if (losses := final_losses(c)) else None, 3)]
             for c in cells]
    return table.runs_page(d, "\n".join([
        "Test accuracy of resnet20 on the CIFAR-10 subset (5,085 training images, 1,017 test) "
        "at the end of training (the mean over the evaluations of its last tenth), mean over "
        "3 seeds with its 95% t interval; gaps are paired on the seed (positive: accuracy "
        "lost).", "",
        "## BN and GroupNorm by images per rank (8 ranks)", "",
        page.md_table(["", *[f"8 x {b}" for b in BATCHES]], rows), "",
        page.md_table(["gap (points)", *[f"8 x {b}" for b in BATCHES]], grows), "",
        "## Each fix at 8 x 2 (global batch 16)", "",
        "Against bn at 8 x 16 (the reference) and bn at 8 x 2, table-recover's states; the share "
        "of bn's loss is the fix's gain over bn at 8 x 2 divided by bn's gap, with a bootstrap "
        "interval over the seeds (only where bn breaks at 8 x 2).", "",
        page.md_table(["fix", "end acc (%)", "gap to 8 x 16", "gain over bn 8 x 2",
                       "share of bn's loss", "state"], frows), "",
        *doctor_lines(cells), *longer_lines(cells), *published_lines(cells),
        "## Every cell: rate, length, steps and final train loss", "",
        page.md_table(["cell", "lr at 128", "epochs", "seeds", "steps per run",
                       "final train loss (mean)"], lrows), "",
        *rules_lines(), ""]))


def steps_of(c: CellResult) -> str:
    n = [r.info.get("steps_per_epoch") for r in c.runs if r.info.get("steps_per_epoch")]
    return f"{n[0] * c.epochs:,}" if n else "-"


def final_losses(c: CellResult) -> list[float]:
    return [v for r in c.runs if not r.diverged and (v := r.last("train_epoch/loss")) is not None]


def longer_lines(cells: list[CellResult]) -> list[str]:
    ref = find(cells, "bn", 16)
    rows = [[f"8 x {b}", gap_cell(gap(find(cells, "gn", b), ref)),
             gap_cell(gap(find(cells, "gn", b, longer=True), ref))] for b in (16, 2)]
    return ["## Does GroupNorm catch up with twice the training? (shown, not ruled)", "",
            page.md_table(["gn", "gap to the bn reference", "at twice the length"], rows), ""]


def published_lines(cells: list[CellResult]) -> list[str]:
    bn = bn_states(cells)[2][0]
    g16 = gap(find(cells, "gn", 16), find(cells, "bn", 16))
    ours = ["-" if bn is None else f"{bn['gap']:.1f}", "-" if g16 is None else
            f"{g16['gap']:.1f}"]
    return ["## Beside Wu and He's published curve (shown, not ruled)", "",
            f"Published: {PUBLISHED['source']}, top-1 error by images per GPU; the shape is "
            "compared, not the numbers (ImageNet, ResNet-50, 90 epochs there; 5,085 CIFAR-10 "
            "images, resnet20 here).", "",
            page.md_table(["", "ours (points)", "Wu and He (points)"], [
                ["bn's loss at 2 images per rank (against 16 here, 32 there)", ours[0],
                 f"{published_gap('bn', 2):.1f}"],
                ["gn's gap to bn at 16 images per rank", ours[1],
                 f"{PUBLISHED['error']['gn'][1] - PUBLISHED['error']['bn'][1]:.1f}"]]), ""]


def rules_lines() -> list[str]:
    """The rules in words (rules.yaml), then their history."""
    words = [f"**{k}**: {' '.join(RULES.raw[k].split())}" for k in (
        "cells", "measure", "bn_breaks", "flat", "fixes", "longer", "published", "doctor",
        "doctor_change", "advice")]
    return ["## The rules", "", *[w + "\n" for w in words], *rules.history(RULES)]


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
    for i, f in enumerate(("bn", "gn")):
        for j, b in enumerate(BATCHES):
            c = find(cells, f, b)
            if c is None or not c.runs:
                continue
            x, m, _, _ = c.mean_series("val/acc")
            spe = c.runs[0].info.get("steps_per_epoch")
            if x and spe:
                shown = True
                steps.plot([e * spe for e in x], m, color=f"C{i}", alpha=1 - 0.2 * j, lw=1,
                           label=f"{f} 8 x {b}")
    if shown:
        steps.legend(fontsize=6, ncol=2)
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
    save(fig, path, "BN and GroupNorm by images per rank: ours beside Wu and He's")


def verdicts(data: Practice) -> list[Verdict]:
    return []  # its rules' states are on its page; the README's finding follows its runs


TABLE = table.Table("practice", (), load, render, verdicts, plot, block="practice", also=advice)
