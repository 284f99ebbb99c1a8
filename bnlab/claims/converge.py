"""`make table-converge`: does table-recover's ranking of the fixes hold when each run trains 4x
longer? resnet20 at 4 ranks x 2, 40 epochs with the rate decayed to zero (cosine) after
warmup: the 1 x 8 reference, bn at 4 x 2, and syncbn, gn, gnws and evonorm, each at the rate
and setting table-recoverpilot chose, 3 seeds; each fix's state beside its 10-epoch state.

    python -m bnlab.claims converge-spec                # experiments/converge/sweep.yaml from
                                                        # the pilot's choices (once all are made)
    python -m bnlab.claims converge --data DIR --jobs 2 # its sweep (hours on 2 cores), the table
    python -m bnlab.claims converge --report            # the table from the runs' logs only

The rules are data in experiments/converge/rules.yaml, committed before any of its runs:
table-recover's states and thresholds (bnlab/claims/recover/ measures both tables) at 3
seeds, and the ranking's answer. Length and schedule both differ from table-recover's
(10 epochs, constant rate): a changed ranking says the protocol matters, not which of the two
changes made it. Writes experiments/converge/{table.md, converge.png} and
bnlab/measured/converge.json (the doctor says where the longer runs rank a fix otherwise than
table-recover's advice.json); its finding is set under the README's finding 2, on length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bnlab.claims import frompilot, recover
from bnlab.errors import BnlabError
from bnlab.lab import page, rules, table
from bnlab.lab.figures import nothing_yet, plt, save
from bnlab.lab.results import CellResult, fmt
from bnlab.lab.table import Finding, RunsData, Verdict
from bnlab.paths import EXPERIMENTS, MEASURED

RULES = rules.read("converge")
SPEC = EXPERIMENTS / "converge" / "sweep.yaml"
SEEDS = list(range(RULES["min_seeds"]))
FIXES = ("syncbn", "gn", "gnws", "evonorm")  # the 4 x 2 fixes it trains, beside bn and 1 x 8
INPUT = recover.FIRST                        # resnet20
EPOCHS = 40                                  # 4x table-recover's 10
LONGER = [f"epochs={EPOCHS}", "optim.schedule=cosine", "eval_every=2"]  # sparser: 2 an epoch


# ----------------------------------------------------------------------------------------
# The spec, from the pilot's choices (as table-recover's)


def longer(overrides: list[str]) -> list[str]:
    """A table-recover cell's overrides at 40 epochs, the rate decayed by a cosine, evaluated
    twice an epoch on the plateau."""
    keys = {o.split("=", 1)[0] for o in LONGER}
    return [o for o in overrides if o.split("=", 1)[0] not in keys] + LONGER


def spec_cells(picks: dict[str, dict]) -> list[dict]:
    """resnet20's reference, bn at 4 x 2 and the FIXES, as table-recover's spec would make them
    from these choices, made longer; a BnlabError while a choice among them is open."""
    wanted = {f: p for f, p in picks.items() if f in FIXES}
    missing = [f for f in FIXES if f not in wanted]
    if missing:
        raise BnlabError(f"the pilot has no cells for {', '.join(missing)}; add them to "
                         "experiments/recoverpilot/sweep.yaml (with its rule) first.")
    cells = [c for c in frompilot.spec_cells(wanted) if c["input"] == INPUT]
    return [{**c, "label": c["label"].replace(f"{INPUT}: ", ""), "overrides":
             longer(c["overrides"]), "order": 0} for c in cells]


def write_spec(path: Path = SPEC, data: str | None = None) -> int:
    """experiments/converge/sweep.yaml from the committed pilot's runs, as table-recover's."""
    return frompilot.write_from_pilot(path, [
        "make table-converge: does table-recover's ranking hold when each run trains 4x",
        "longer? resnet20 at 4 ranks x 2, 40 epochs, the rate decayed to zero (cosine) after",
        "warmup, each fix at the rate (and setting) table-recoverpilot chose on held-out data",
        "(written from its choices by `python -m bnlab.claims converge-spec`), 3 seeds; its",
        "rules: rules.yaml beside this file, committed before any of its runs."],
        {"title": "Does the ranking hold 4x longer? Each fix at 40 epochs (cosine) on resnet20 at "
         "4 ranks x 2", "experiment": "headline", "seeds": SEEDS, "jobs": 2,
         "cells": spec_cells(frompilot.pilot_picks(data))}, "converge")


# ----------------------------------------------------------------------------------------
# The cells, and each fix's state at 10 epochs


@dataclass
class Converge:
    runs: RunsData | None      # this table's runs, where its spec exists
    ten: RunsData | None       # table-recover's (its resnet20 rows: the 10-epoch states)
    waiting: str = ""


def load(ctx: table.Context) -> Converge:
    ten = recover.load(table.Context(recover.TABLE, ctx.experiments, ctx.runs, ctx.tag,
                                     ctx.data, ctx.here)).runs
    if not ctx.table.spec_path.is_file():
        return Converge(None, ten, "its spec is written from table-recoverpilot's choices once "
                        "gnws's and the group counts' are made (`python -m bnlab.claims "
                        "converge-spec`)")
    return Converge(table.runs_data(ctx), ten)


def at_ten(data: Converge, fix: str) -> dict | None:
    """The fix's table-recover measure on resnet20 (10 epochs), or None while it has none."""
    c = None if data.ten is None else recover.by_fix(data.ten, fix, INPUT)
    return None if c is None else recover.measure(data.ten, c)


def final_acc(c: CellResult) -> float | None:
    """Mean over seeds of the last epoch's evaluations (shown, not ruled)."""
    per = []
    for r in c.runs:
        last = [row["val/acc"] for row in r.rows if "val/acc" in row
                and row.get("epoch", 0) > c.epochs - 1 + 1e-9]
        if last and not r.diverged:
            per.append(float(np.mean(last)))
    return float(np.mean(per)) if per else None


def said(m: dict | None) -> str:
    if m is None:
        return "undecided (runs still to come)"
    if m["state"] == "bn":
        return "bn"
    share = m["share"][0]  # its share where it does better than bn (the table has the rest)
    return m["state"] + (f", {100 * share:.0f}% of bn's loss"
                         if math.isfinite(share) and m["state"] != "no better" else "")


def ranking(data: Converge) -> tuple[str, list[str]]:
    """The ranking's answer by rules.yaml (holds, changes, undecided) and each fix's two
    states in words."""
    if data.runs is None:
        return "undecided", []
    rows, states = [], []
    for fix in FIXES:
        c = recover.by_fix(data.runs, fix, INPUT)
        m40 = None if c is None else recover.measure(data.runs, c, RULES)
        m10 = at_ten(data, fix)
        states.append((m10 and m10["state"], m40 and m40["state"]))
        rows.append(f"{fix}: {said(m10)} at 10 epochs, {said(m40)} at {EPOCHS}")
    if any(s is None or "unclear" in (a, b) for a, b in states for s in (a, b)):
        return "undecided", rows
    changed = [f for f, (a, b) in zip(FIXES, states, strict=True) if a != b]
    return ("holds" if not changed else "changes (" + ", ".join(changed) + ")"), rows


def identical(d: RunsData | None, fix: str) -> bool | None:
    """Whether the fix's runs log the same val acc as the 1 x 8 reference's, seed by seed, at
    every evaluation (simulated SyncBN over all 4 ranks normalizes the same 8 images); None
    where either cell lacks runs."""
    c = None if d is None else recover.by_fix(d, fix, INPUT)
    ref = None if d is None else recover.by_fix(d, "reference", INPUT)
    if c is None or ref is None or not c.runs or not ref.runs:
        return None
    by = {r.seed: [row["val/acc"] for row in r.rows if "val/acc" in row] for r in ref.runs}
    return all(r.seed in by and by[r.seed] ==
               [row["val/acc"] for row in r.rows if "val/acc" in row] for r in c.runs)


def commits(d: RunsData, fix: str) -> str:
    """The commits the fix's runs on resnet20 were made at, short."""
    c = recover.by_fix(d, fix, INPUT)
    return ", ".join(sorted({str(r.info.get("commit", "?"))[:7] for r in c.runs}))


def same_runs(data: Converge) -> list[str]:
    """A paragraph on any fix whose runs here equal the reference's in every logged val acc:
    its share is an identity of the simulation, not a sample; and whether its 10-epoch runs
    did the same."""
    out = []
    for fix in FIXES:
        if not identical(data.runs, fix):
            continue
        ten = identical(data.ten, fix)
        out.append(
            f"{fix}'s runs log the same val acc as the 1 x 8 reference's at every evaluation, "
            "seed by seed: over 4 simulated ranks it normalizes the same 8 images with the same "
            "floats, so its share here is that identity, not a sample. " + (
                "" if ten is None else "Its 10-epoch runs do too." if ten else
                f"Its 10-epoch runs (commits {commits(data.ten, fix)}) do not equal their "
                f"reference's, made at other commits ({commits(data.ten, 'reference')}), so "
                "there the seeds' noise stays in its interval."))
    return [" ".join(out), ""] if out else []


def render(data: Converge) -> str:
    head = ["# Does the ranking hold 4x longer?", "",
            "Generated by `make table-converge` (`python -m bnlab.claims converge`); do not "
            "edit.", ""]
    if data.runs is None:
        return "\n".join([*head, f"Not run yet: {data.waiting}.", "",
                          f"Its cells: {' '.join(str(RULES.raw['cells']).split())}.", "",
                          f"The ranking: {' '.join(str(RULES.raw['ranking']).split())}.", "",
                          *rules.history(RULES)])
    d, rows = data.runs, []
    for c in d.cells:
        fix = c.cell.meta.get("fix")
        ref = fix == "reference"
        m = None if ref else recover.measure(d, c, RULES)
        ten = None if ref else at_ten(data, fix)
        rows.append([c.cell.label, c.seeds_note(), c.jstat("plateau_acc").fmt(1),
                     fmt(final_acc(c), 1), c.jstat("vn_sd").fmt(2),
                     c.jstat("churn_floor").fmt(2),
                     "-" if m is None or ref else
                     f"{m['gap']['gap']:+.1f} ({fmt(m['gap']['lo'])} to {fmt(m['gap']['hi'])})",
                     "-" if m is None or m["state"] == "bn" or not math.isfinite(m["share"][0])
                     else f"{100 * m['share'][0]:.0f}% ({fmt(recover.pct(m['share'][1]), 0)} "
                     f"to {fmt(recover.pct(m['share'][2]), 0)})",
                     "reference" if ref else said(m), "-" if ref else said(ten)])
    answer, words = ranking(data)
    bn = recover.by_fix(d, "bn", INPUT)
    mb = None if bn is None else recover.measure(d, bn, RULES)
    breaks = ("still to come" if mb is None else "breaks (its gap to 1 x 8 at least "
              f"{RULES['break_points']:g} points, its interval above 0)" if mb["bn_breaks"] else
              "does not break: no share is read, and a fix's state there says less than at "
              "10 epochs")
    return table.runs_page(d, "\n".join([
        page.md_table(["cell", "seeds", "plateau acc (%)", "final acc (%)",
                       "von Neumann sd (pts)", "churn floor (pts)", "gap to 1x8 (pts, 95% CI)",
                       "share of bn's loss recovered (95% CI)", f"state at {EPOCHS} epochs",
                       "state at 10 epochs (table-recover)"], rows), "",
        f"**The ranking at {EPOCHS} epochs: {answer}** ({'; '.join(words)}).", "",
        f"bn at 4 x 2 after {EPOCHS} epochs: {breaks}.", "", *same_runs(data),
        "Length and schedule both differ from table-recover's: "
        f"{' '.join(str(RULES.raw['cells']).split())}. Measure: "
        f"{' '.join(str(RULES.raw['measure']).split())}. The ranking: "
        f"{' '.join(str(RULES.raw['ranking']).split())}. Final accuracy (shown, not ruled): the "
        "mean of the last epoch's evaluations.", "", recover.states_in_words(RULES), "",
        *rules.history(RULES)]))


def plot(data: Converge, path: Path) -> None:
    """Each fix's share of bn's loss recovered at 10 and at 40 epochs, one row a fix."""
    fig, ax = plt.subplots(figsize=(8, 3.2))
    drawn = False
    for i, fix in enumerate(FIXES):
        for j, (d, by, label) in enumerate(((data.ten, recover.RULES, "10 epochs"),
                                            (data.runs, RULES, f"{EPOCHS} epochs (cosine)"))):
            c = None if d is None else recover.by_fix(d, fix, INPUT)
            m = None if c is None else recover.measure(d, c, by)
            if m is None or not math.isfinite(m["share"][0]):
                continue
            s, lo, hi = (100 * x if x is not None else None for x in m["share"])
            err = [[s - lo], [hi - s]] if lo is not None else None
            ax.errorbar([s], [-i - 0.15 + 0.3 * j], xerr=err, fmt="os"[j], capsize=3,
                        color=f"C{j}", label=label if i == 0 or not drawn else None)
            drawn = True
    if drawn:
        ax.axvline(0, color="C3", lw=1)
        ax.axvline(100, color="grey", ls="--", lw=1)
        ax.legend(fontsize=8, loc="lower right")
    else:
        nothing_yet(ax, data.waiting or "runs still to come")
    ax.set_yticks([-i for i in range(len(FIXES))],
                  [recover.NAMES.get(f, f) for f in FIXES])
    ax.set(xlabel="share of bn's loss recovered (%, 95% CI; 0 = bn at 4 x 2, 100 = 1 x 8)")
    ax.grid(alpha=0.3, axis="x")
    answer = ranking(data)[0]
    save(fig, path, "Does the ranking hold 4x longer? (resnet20, 4 ranks x 2)" + (
        "" if measured(data) is None else f"\nat {EPOCHS} epochs the ranking " + (
            "is undecided (a fix unclear at one length)" if answer == "undecided" else answer)))


# ----------------------------------------------------------------------------------------
# What the doctor and the README read


def measured(data: Converge) -> dict | None:
    """resnet20 at 40 epochs, as advice.json holds an input ({input, epochs, bn_breaks, where,
    fixes}, each fix as table-recover's entry()); None until every cell has its seeds."""
    if data.runs is None:
        return None
    fixes = {}
    for fix in FIXES:
        c = recover.by_fix(data.runs, fix, INPUT)
        m = None if c is None else recover.measure(data.runs, c, RULES)
        if m is None:
            return None
        fixes[fix] = {**recover.entry(fix, c, m), **({"identical": True}
                                                      if identical(data.runs, fix) else {})}
    bn = recover.by_fix(data.runs, "bn", INPUT)
    return {"input": INPUT, "epochs": EPOCHS, "bn_breaks": recover.measure(
                data.runs, bn, RULES)["bn_breaks"],
            "where": f"4 ranks x 2 on {INPUT} (CIFAR-10) trained {EPOCHS} epochs (cosine)",
            "fixes": fixes}


def measured_path(out: Path) -> Path:
    """As table-recover's advice.json: into the package when built into experiments/converge,
    else beside the table."""
    return MEASURED / "converge.json" if out.resolve() == (EXPERIMENTS / "converge").resolve() \
        else out / "converge.json"


def write_measured(data: Converge, out: Path) -> None:
    """converge.json for the doctor (bnlab.advice.longer); removed while runs are to come."""
    path, got = measured_path(out), measured(data)
    if got is None:
        path.unlink(missing_ok=True)
    else:
        table.save_results(path, got)


# each state as a verb phrase, for "at 10 epochs, GroupNorm did no better"
DID = {"recovers": "recovered", "partly": "partly recovered", "no better": "did no better",
       "unclear": "was unclear"}


def short(fix: str) -> str:
    """The fix as the README's finding names it (GroupNorm+WS, SyncBN, GroupNorm)."""
    return recover.SHORT.get(fix, recover.NAMES.get(fix, fix))


def share_words(e: dict, first: bool) -> str:
    """'SyncBN gets back 95% of BN's loss (95% CI 80 to 110), recovers' (`first`), else 'SyncBN
    95% (80 to 110), recovers': each interval beside the share it bounds; 'all, recovers' where
    its runs equal the reference's; its state where it has no share."""
    name = short(e["fix"])
    if e.get("identical"):  # its runs are the reference's: no interval to give
        return f"{name} gets back all of BN's loss, {e['state']} (its runs equal 1 x 8's)" \
            if first else f"{name} all, {e['state']} (its runs equal 1 x 8's)"
    if e.get("share") is None or e.get("lo") is None:
        return f"{name} {e['state']}"
    return recover.share_clause(name, e, first)


def at_forty(got: dict) -> str:
    """The fixes at 40 epochs in a clause: those better than bn with their shares, best
    first, then those no better; 'no fix beats BN' where none is better."""
    fixes = sorted(got["fixes"].values(), key=lambda e: -e["gain"])
    better = [share_words(e, i == 0) for i, e in enumerate(
        e for e in fixes if e["state"] != "no better")]
    worse = [short(e["fix"]) for e in fixes if e["state"] == "no better"]
    if not better:
        return "no fix beats BN"
    return ", ".join(better) + ("" if not worse else
                                f"; {page.listed(worse)} no better than BN")


def finding(data: Converge) -> list[Finding]:
    """The README's finding 2 on length, set under it (`extends`): at 40 epochs, each fix that
    does better than bn with its share, those no better, then whether the states are as at 10
    epochs; a line saying its runs are to come until they have ended."""
    head = f"At {EPOCHS} epochs (4x longer) on {INPUT}"
    got = measured(data)
    if got is None:
        return [Finding(f"{head}: runs still to come.", "converge", rules.mark(RULES),
                        rank=2, extends="recover")]
    if got["bn_breaks"]:
        text = f"{head}, {at_forty(got)}."
    else:
        text = (f"{head}, BN at 4 x 2 no longer breaks, so no share of its loss is read: "
                + page.listed([f"{short(f)} {e['state']}" for f, e in got["fixes"].items()]) + ".")
    return [Finding(f"{text} {held(data, got)}", "converge", rules.mark(RULES), rank=2,
                    extends="recover")]


def held(data: Converge, got: dict) -> str:
    """Whether each fix's state is as at 10 epochs, as a sentence: where one changed, what it
    did at 10; where one is unclear at either length (the rule then leaves the ranking
    undecided), which, and how the others compare; where a 10-epoch state is still to come,
    that."""
    ten = {fix: at_ten(data, fix) for fix in FIXES}
    if any(m is None for m in ten.values()):
        return "Its 10-epoch states are still to come."
    states = {f: (ten[f]["state"], got["fixes"][f]["state"]) for f in FIXES}
    unclear = [f for f, (a, b) in states.items() if "unclear" in (a, b)]
    changed = [f for f, (a, b) in states.items() if a != b and f not in unclear]
    was = page.listed([f"{short(f)} {DID[states[f][0]]}" for f in changed])
    if not unclear:
        return f"At 10 epochs, {was}." if changed else "Each fix's state is as at 10 epochs."
    why = page.listed([f"{short(f)} at " + page.listed(
        [n for n, s in zip(("10", str(EPOCHS)), states[f], strict=True) if s == "unclear"])
        + " epochs" for f in unclear])
    rest = f"; at 10 epochs {was}" if changed else ""
    return f"Ranking undecided, as {why} was unclear{rest}."


def verdicts(data: Converge) -> list[Verdict]:
    return []  # a ranking of fixes at another length, stated on its page


TABLE = table.Table("converge", (), load, render, verdicts, plot, block="recover",
                    finding=finding, also=write_measured)
