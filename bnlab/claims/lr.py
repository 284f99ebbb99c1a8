"""`make table-lr` (claims C1, C3, C4 on the settled headline protocol): the learning-rate
crossover. Why does BN jitter, and where can a contrast with SyncBN show at all?

    python -m bnlab.claims lr --data DIR --jobs 2   # sweep (hours on 2 cores), table
    python -m bnlab.claims lr --report              # table from the runs' logs only

Trains experiments/lr/sweep.yaml: resnet20 bn and syncbn at 4 ranks x 2 images (simulated) on
the settled headline protocol (configs/experiment/headline.yaml: constant rate after half an
epoch of warmup, 20 epochs, 10 evaluations an epoch on the plateau), at the rate the pilot
chose on held-out data (experiments/pilot; the spec's `chosen_lr`) and at rates spanning it up
to 0.1, 5 seeds each, every training image, the test split. Every plateau evaluation is
decomposed (record.decompose): the same weights with PreciseBN statistics, so each run's
detrended variance splits into the weights' part and the running statistics' part
(bnlab.jitter.variance_split). Writes experiments/lr/{table.md, lr.png}.

The rules, written before these runs (experiments/README.md names the commit):

- **Control check.** At a rate, syncbn (the control; 1 rank x 8 computes exactly what it does)
  is *steady* when it learned (plateau acc >= NO_LEARNING + 5) and its plateau jitter (von
  Neumann sd, mean over seeds) is at most STEADY times its own churn floor (mean over seeds):
  its accuracy then moves little more than prediction churn through a fixed test set would.
  A contrast is ruled only at a rate whose control is steady; elsewhere it is "untestable at
  this setting", never "not reproduced".
- **C1** is ruled at the chosen rate; if its control is not steady, at the steady rate nearest
  to it (on a log scale; the smaller of two equally near); with none, untestable. There: bn
  below NO_LEARNING + 5 on the plateau: untestable (no room to jitter); bn's jitter separated
  above syncbn's (exact one-sided permutation test over seeds, p <= SEPARATED) and >= 2x it,
  with bn >= FLOOR_RATIO x its churn floor: reproduced; separated but under 2x or under that
  floor: partly; not separated: not reproduced (indistinguishable); fewer than MIN_SEEDS of
  bn's seeds left after divergence: untestable (added once some of its runs had finished,
  none diverged: table-fixes' wording; the code had crashed there). The effect size is the
  ratio of mean jitters with a 95% bootstrap interval over seeds (bnlab.lab.analysis).
- **C3** (1 rank x 8 far steadier than 4 x 2) is the same computation as C1: 1 x 8 bn is
  syncbn at 4 x 2 exactly (tests/test_simulate.py), so its verdict is C1's, said so.
- **C4** (changing the learning rate does not remove the effect) needs C1's effect at its rate
  (reproduced or partly), else untestable. The effect survives at another rate whose control
  is steady if bn's jitter is separated above syncbn's there and >= 1.5x it; reproduced if it
  survives at every such rate, partly at some, not reproduced at none; with no other steady
  rate, untestable. Augmentation and the optimizer are not varied on this protocol.

The prediction, written before these runs. The running statistics are an EMA (momentum m =
0.1) of batch statistics. Their error against the current weights' true statistics has two
parts: sampling noise, variance ~ m / (2 - m) x the batch statistic's variance, independent
of the rate, and 4x larger for bn (rank 0's 2 images per update, DDP's buffer broadcast) than
for syncbn (8); and lag behind weights that move ~lr per step, variance ~ lr^2 / (2m), the same
for both. To first order the accuracy's statistics part follows the error's variance:
S(norm, lr) = a_norm + b lr^2 with a_bn = 4 a_syncbn. So (P1) at the lowest rate bn's
statistics part is >= 2x syncbn's (about 4x); (P2) that ratio falls as the rate rises, toward
1; (P3) syncbn's statistics part grows with the rate. The table fits a_bn, a_syncbn and b to
the six cell means and sets a_bn / a_syncbn beside the 4 predicted.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import numpy as np

from bnlab.jitter import PLATEAU
from bnlab.lab import page, table
from bnlab.lab.analysis import NO_LEARNING, SEPARATED, Stat, p_above, ratio_interval
from bnlab.lab.figures import band, legend, plt, save
from bnlab.lab.results import CellResult, fmt, split
from bnlab.lab.table import RunsData, Verdict

NORMS = ("bn", "syncbn")
MIN_SEEDS = 3      # seeds each cell needs before a rule applies
STEADY = 1.5       # the control is steady at most this multiple of its own churn floor
FLOOR_RATIO = 1.5  # bn's jitter above this multiple of its churn floor: its quality moves
SURVIVES = 1.5     # C4: the effect survives at another rate at this ratio (and separated)
LEARNED = NO_LEARNING + 5
CLAIMED = "bn ±10, syncbn ±2"
PENDING = "the nearest rate left to rule at"
RUNS_TO_COME = "runs still to come"


def cell(d: RunsData, norm: str, lr: float) -> CellResult | None:
    return next((c for c in d.cells if c.cell.meta.get("norm") == norm
                 and math.isclose(c.cell.meta.get("lr", -1), lr)), None)


def rates(d: RunsData) -> list[float]:
    return sorted({c.cell.meta["lr"] for c in d.cells})


def chosen(d: RunsData) -> float:
    return d.spec.extra["chosen_lr"]


def vals(c: CellResult | None, key: str = "vn_sd") -> list[float]:
    return [] if c is None else c.jitter_values(key)


def mean(xs: list[float]) -> float | None:
    return float(np.mean(xs)) if xs else None


def ready(*cells: CellResult | None) -> bool:
    """Every cell has MIN_SEEDS finished seeds (diverged ones count as finished)."""
    return all(c is not None and len(c.runs) >= min(MIN_SEEDS, c.expected) for c in cells)


def lost(c: CellResult) -> bool:
    """Fewer than MIN_SEEDS of the cell's seeds can have a jitter, whatever the seeds still to
    come give."""
    return len(vals(c)) + max(c.expected - len(c.runs), 0) < MIN_SEEDS


class Control(NamedTuple):
    """The control check at one rate: steady (None until it has run), why, and in few words."""

    ok: bool | None
    why: str
    short: str


def steady(d: RunsData, lr: float) -> Control:
    """The control check on syncbn at `lr`."""
    return control_check(cell(d, "syncbn", lr), lr)


def control_check(sb: CellResult | None, lr: float, name: str = "syncbn") -> Control:
    """The control check on a control cell (`name`, syncbn by default) run at `lr`, this
    table's or another's."""
    if not ready(sb):
        return Control(None, f"{name} at lr {lr:g}: fewer than {MIN_SEEDS} seeds finished",
                       f"lr {lr:g} still to come")
    if len(vals(sb)) < MIN_SEEDS:
        why = f"{name} at lr {lr:g}: {sb.diverged} of {len(sb.runs)} seeds diverged"
        return Control(False, why, f"diverged at lr {lr:g}")
    acc, vn, floor = mean(vals(sb, "plateau_acc")), mean(vals(sb)), mean(vals(sb, "churn_floor"))
    if acc < LEARNED:
        return Control(False, f"{name} at lr {lr:g} does not learn ({acc:.1f}% on the plateau)",
                       f"does not learn at lr {lr:g}")
    ratio = vn / floor if floor else math.inf
    text = (f"{name} at lr {lr:g}: jitter {vn:.2f} = {ratio:.1f}x its churn floor {floor:.2f} "
            f"({'steady' if ratio <= STEADY else 'not steady'}: the bound is {STEADY:g}x)")
    return Control(ratio <= STEADY, text, f"{ratio:.1f}x its floor at lr {lr:g}")


def contrast(d: RunsData, lr: float) -> dict:
    """bn against syncbn at `lr`: jitter ratio with its interval, p, bn against its floor."""
    bn, sb = cell(d, "bn", lr), cell(d, "syncbn", lr)
    a, b = vals(bn), vals(sb)
    lo, hi = ratio_interval(a, b)
    return {"ratio": mean(a) / max(mean(b), 1e-9), "lo": lo, "hi": hi, "p": p_above(a, b),
            "over": mean(vals(bn, "over_floor")), "bn_acc": mean(vals(bn, "plateau_acc")),
            "text": (f"lr {lr:g}: von Neumann sd bn {bn.jstat('vn_sd').fmt(2)}, syncbn "
                     f"{sb.jstat('vn_sd').fmt(2)}: {mean(a) / max(mean(b), 1e-9):.2f}x "
                     f"(95% interval {fmt(lo, 2)} to {fmt(hi, 2)}), p = {fmt(p_above(a, b), 3)}; "
                     f"bn at {fmt(mean(vals(bn, 'over_floor')), 1)}x its churn floor; plateau "
                     f"acc bn {bn.jstat('plateau_acc').fmt(1)}, syncbn "
                     f"{sb.jstat('plateau_acc').fmt(1)}")}


def by_nearness(d: RunsData) -> list[float]:
    """The rates in the order C1's rule tries them: the chosen one, then the nearest on a log
    scale (the smaller of two equally near)."""
    pick = chosen(d)
    return sorted(rates(d), key=lambda r: (abs(math.log(r / pick)), r))


def ruling_rate(d: RunsData) -> tuple[float | None, str, list[Control]]:
    """C1's rate by the rule (None while a rate it must read has not run, or where none is
    steady), why, and the control checks read on the way, nearest first. A rate not run yet
    blocks only the rates behind it: C1 is ruled as soon as no unfinished rate could turn out
    nearer (the answer is the same as waiting for every rate)."""
    read = []
    for lr in by_nearness(d):
        read.append(steady(d, lr))
        if read[-1].ok is None:
            return None, "; ".join(c.why for c in read) + f" ({PENDING})", read
        if read[-1].ok:
            near = "" if lr == chosen(d) else f"; the nearest steady rate is {lr:g}"
            return lr, "; ".join(c.why for c in read) + near, read
    return None, "; ".join(c.why for c in read) + "; no rate has a steady control", read


def settled_rate(d: RunsData) -> float | None:
    """The rate C1's rule gives once no seed still to come can change it (every control it
    read has all its seeds); the chosen rate where no rate is steady; None before."""
    lr, why, read = ruling_rate(d)
    if lr is None and PENDING in why:
        return None
    tried = by_nearness(d)[:len(read)]
    if any(len(cell(d, "syncbn", r).runs) < cell(d, "syncbn", r).expected for r in tried):
        return None
    return lr if lr is not None else chosen(d)


def outcome(c: dict) -> str:
    """C1's outcome from the contrast at a rate whose control is steady and where enough of
    bn's seeds are left."""
    if c["bn_acc"] is None or c["bn_acc"] < LEARNED:
        return "untestable"
    if c["p"] is None or c["p"] > SEPARATED:
        return "not reproduced"
    return "reproduced" if c["ratio"] >= 2 and (c["over"] or 0) >= FLOOR_RATIO else "partly"


RULE_C1 = (f"Control check: syncbn must learn and its plateau jitter be at most {STEADY:g}x its "
           "own churn floor, else the rate is untestable. Ruled at the pilot's chosen rate, or "
           "at the steady rate nearest it on a log scale (the smaller of two equally near). "
           "There: bn's jitter (von Neumann sd) separated above "
           f"syncbn's (exact one-sided permutation test, p <= {SEPARATED}) and >= 2x it, with "
           f"bn >= {FLOOR_RATIO:g}x its churn floor: reproduced; separated, under 2x or under that "
           "floor: partly; not separated: not reproduced (indistinguishable); bn below "
           f"{LEARNED:g}% on the plateau, or fewer than {MIN_SEEDS} of its seeds left after "
           "divergence: untestable (this clause was added after some of the runs were seen; "
           "no bn run has diverged, so it changes no verdict). Effect size: the ratio of mean "
           "jitters with a 95% bootstrap interval over seeds.")


def without_added(d: RunsData) -> RunsData:
    """The table as its spec first stood: without the rates added after some runs were seen."""
    return dataclasses.replace(d, cells=[c for c in d.cells if not c.cell.meta.get("added_later")])


def seeds_to_come(d: RunsData, among: list[float]) -> str:
    """" (so far: bn at lr 0.1: 3/5 seeds; ...)" for the cells at these rates still short of
    seeds, else empty."""
    short = [f"{n} at lr {r:g}: {c.seeds_note()} seeds" for r in among for n in NORMS
             if (c := cell(d, n, r)) is not None and len(c.runs) < c.expected]
    return f" (so far: {'; '.join(short)})" if short else ""


def disclosure(d: RunsData, lr: float | None) -> tuple[str, str]:
    """Where C1 is ruled at a rate added to the spec after other rates' runs were seen: that,
    with what the rule gives on the spec's first rates alone, for its reasons and in a few
    words ("", "" elsewhere)."""
    c = cell(d, "syncbn", lr) if lr is not None else None
    if c is None or not c.cell.meta.get("added_later"):
        return "", ""
    first = without_added(d)
    old = c1_parts(first)[0]
    return (f" Disclosed: lr {lr:g} was added to the spec after some runs at other rates had "
            "been seen, as a fallback should the quarter rate's control fail its check (before "
            "any of its own runs; experiments/lr/sweep.yaml says when); on the spec's first "
            f"rates alone ({', '.join(f'{r:g}' for r in rates(first))}) this rule gives: "
            f"{old}{seeds_to_come(first, rates(first))}.",
            f" [a rate added after others were seen; without it: {old}]")


def c1_parts(d: RunsData) -> tuple[str, str, str, str]:
    """(verdict, ours, why, ours in a few words) of C1 on this protocol."""
    lr, why, read = ruling_rate(d)
    if lr is None:
        bn = cell(d, "bn", chosen(d))
        if not read or read[0].ok is None or not ready(bn):
            return "not run yet", why, RULE_C1, RUNS_TO_COME
        passed = ", ".join(c.short for c in read if c.ok is False)
        if PENDING in why:
            return ("not run yet", why, RULE_C1,
                    f"syncbn itself not steady: {passed}; {read[-1].short}")
        return "untestable", why, RULE_C1, f"no steady control: {passed}"
    if not ready(cell(d, "bn", lr)):
        return ("not run yet", f"bn at lr {lr:g}: fewer than {MIN_SEEDS} seeds finished",
                RULE_C1, RUNS_TO_COME)
    bn = cell(d, "bn", lr)
    if len(vals(bn)) < MIN_SEEDS and not lost(bn):  # diverged seeds, but enough still to come
        return ("not run yet", f"bn at lr {lr:g}: {bn.diverged} of {len(bn.runs)} seeds "
                "diverged, more to come", RULE_C1, RUNS_TO_COME)
    if len(vals(bn)) < MIN_SEEDS:  # too many of bn's seeds diverged
        why_bn = f"bn at lr {lr:g}: {bn.diverged} of {len(bn.runs)} seeds diverged"
        return "untestable", f"{why_bn}; {why}", RULE_C1, why_bn
    c = contrast(d, lr)
    v = outcome(c)
    note = " (indistinguishable)" if v == "not reproduced" else \
        " (bn does not learn: no room to jitter)" if v == "untestable" else ""
    glance = (f"at lr {lr:g} (control steady): jitter bn {mean(vals(bn)):.2f} "
              f"vs syncbn {mean(vals(cell(d, 'syncbn', lr))):.2f} pts, {c['ratio']:.2f}x (95% CI "
              f"{fmt(c['lo'], 2)} to {fmt(c['hi'], 2)})" + note)
    told, few = disclosure(d, lr)
    return v, f"{c['text']}{note}; {why}", RULE_C1 + told, glance + few


def c1(d: RunsData) -> Verdict:
    v, ours, why, glance = c1_parts(d)
    return Verdict("C1", "make table-lr", CLAIMED, ours, v, why, glance)


def c3(d: RunsData) -> Verdict:
    v, ours, why, glance = c1_parts(d)
    return Verdict("C3", "make table-lr", "1x8 far more stable than 4x2",
                   "the same cells as C1: " + ours, v,
                   "1 rank x 8 with bn computes exactly what syncbn at 4 ranks x 2 computes (the "
                   "same 8 images normalized together, the same steps; tests/test_simulate.py), "
                   "so C3 is C1's contrast and gets C1's verdict by C1's rule."
                   + why.removeprefix(RULE_C1),  # C1's disclosure, where it has one
                   "C1's cells (1x8 bn computes what syncbn 4x2 does): " + glance)


def c4(d: RunsData) -> Verdict:
    base, _, _, _ = c1_parts(d)
    lr0 = ruling_rate(d)[0]
    rule = (f"Rule: C1's effect must exist at its rate (reproduced or partly), else untestable; "
            f"at every other rate whose control is steady the effect survives if bn's jitter is "
            f"separated above syncbn's (p <= {SEPARATED}) and >= {SURVIVES:g}x it; reproduced if "
            "it survives at every such rate, partly at some, not reproduced at none; a rate "
            f"where fewer than {MIN_SEEDS} of bn's seeds are left after divergence does not "
            "count (added after some runs were seen; none diverged, so it changes no verdict); "
            "no other steady rate that counts: untestable. Augmentation and the "
            "optimizer are not varied on this protocol (the short protocol's table-jitter has "
            "them, as history).")
    parts, got, waiting, gone = [], [], False, 0
    for lr in (r for r in rates(d) if r != lr0):
        ctl, bn = steady(d, lr), cell(d, "bn", lr)
        if ctl.ok is None or (ctl.ok and not ready(bn)):
            waiting = True
            parts.append(f"lr {lr:g}: not run yet")
        elif not ctl.ok:
            parts.append(ctl.why)
        elif len(vals(bn)) < MIN_SEEDS and not lost(bn):
            waiting = True
            parts.append(f"lr {lr:g}: bn's diverged seeds, more to come")
        elif len(vals(bn)) < MIN_SEEDS:
            gone += 1
            parts.append(f"bn at lr {lr:g}: {bn.diverged} of {len(bn.runs)} seeds diverged "
                         "(does not count)")
        else:
            c = contrast(d, lr)
            alive = c["p"] is not None and c["p"] <= SEPARATED and c["ratio"] >= SURVIVES
            got.append(alive)
            parts.append(c["text"] + (" (survives)" if alive else " (gone)"))
    effect = base in ("reproduced", "partly")
    if base == "not run yet" or (effect and waiting):
        v, glance = "not run yet", RUNS_TO_COME
    elif not effect:
        v, glance = "untestable", f"C1 is {base}: no effect to survive"
        rule += f" C1 is {base}, so there is no effect to survive."
    elif not got:
        v = "untestable"
        glance = "bn diverged at every other steady rate" if gone else \
            "no other rate with a steady control"
    else:
        v = "reproduced" if all(got) else "partly" if any(got) else "not reproduced"
        glance = f"the effect survives at {sum(got)} of {len(got)} other steady rates"
    return Verdict("C4", "make table-lr", "aug off / other optimizer / lr do not remove it",
                   "; ".join(parts) or "no other rate", v, rule, glance)


def verdicts(d: RunsData) -> list[Verdict]:
    vs = [c1(d), c3(d), c4(d)]
    lr = settled_rate(d)  # no seed still to come changes C1's rate...
    c1_final = lr is not None and table.complete(cell(d, "bn", lr), cell(d, "syncbn", lr)) \
        and vs[0].verdict != "not run yet"  # ...nor its cells there
    vs[0].final = vs[1].final = c1_final
    vs[2].final = c1_final and vs[2].verdict != "not run yet" and (
        vs[0].verdict not in ("reproduced", "partly") or table.complete(*d.cells))
    return vs


# ----------------------------------------------------------------------------------------
# The crossover: statistics and weights at each rate, beside the prediction


def parts(c: CellResult | None, part: str) -> list[float]:
    out = []
    for r in (c.runs if c else []):
        s = split(r, c.epochs)
        if s is not None:
            out.append(s[part])
    return out


def fit(d: RunsData, among: list[float]) -> dict | None:
    """Least squares of the statistics part's cell means at the rates `among` on a_bn,
    a_syncbn and b lr^2."""
    rows, ys = [], []
    for c in d.cells:
        s = parts(c, "statistics") if c.cell.meta["lr"] in among else []
        if len(s) >= MIN_SEEDS:
            lr = c.cell.meta["lr"]
            rows.append([c.cell.meta["norm"] == "bn", c.cell.meta["norm"] == "syncbn", lr ** 2])
            ys.append(np.mean(s))
    if len(rows) < 4 or len({r[0] for r in rows}) < 2:
        return None
    (a_bn, a_sb, b), *_ = np.linalg.lstsq(np.array(rows, float), np.array(ys), rcond=None)
    return {"a_bn": a_bn, "a_syncbn": a_sb, "b": b, "n": len(rows)}


def predicted_rates(d: RunsData) -> list[float]:
    """The rates the prediction was written for: the spec's, less those added later."""
    return sorted({c.cell.meta["lr"] for c in d.cells if not c.cell.meta.get("added_later")})


def predictions(d: RunsData) -> list[str]:
    """P1-P3 against the measurements, one line each (or why not yet), judged at the rates the
    prediction was written for; a rate added later gets its own line, judged by nothing."""
    return judged(d)[0]


def judged(d: RunsData) -> tuple[list[str], dict]:
    """predictions' lines, and each of P1-P3's outcome (agrees, disagrees; P1 absent until it
    is checked) with the measurements they read and the rates they were judged at."""
    done = [lr for lr in rates(d) if all(len(parts(cell(d, n, lr), "statistics")) >= MIN_SEEDS
                                          for n in NORMS)]
    rs = [lr for lr in done if lr in predicted_rates(d)]
    if len(rs) < 2:
        return ["- The prediction is checked once two rates have both cells' seeds."], {}
    ratio = {lr: mean(parts(cell(d, "bn", lr), "statistics"))
             / max(mean(parts(cell(d, "syncbn", lr), "statistics")), 1e-9) for lr in done}
    sb = {lr: mean(parts(cell(d, "syncbn", lr), "statistics")) for lr in done}
    lo, hi, lowest = rs[0], rs[-1], predicted_rates(d)[0]
    left = [lr for lr in predicted_rates(d) if lr not in rs]
    coming = [lr for lr in left if not ready(*(cell(d, n, lr) for n in NORMS))]
    spent = [lr for lr in left if lr not in coming]  # every seed in, too few left to split
    so_far = "".join([
        f"; so far: lr {', '.join(f'{lr:g}' for lr in coming)} still to come" if coming else "",
        f"; lr {', '.join(f'{lr:g}' for lr in spent)}: too few seeds left after divergence"
        if spent else ""])
    so_far = f" ({so_far[2:]})" if so_far else ""
    marks = {"P2": "agrees" if ratio[hi] < ratio[lo] else "disagrees",
             "P3": "agrees" if sb[hi] > sb[lo] else "disagrees",
             "judged at": rs, "ratio": ratio, "syncbn": sb, "so far": so_far}
    if lowest in rs:
        marks["P1"] = "agrees" if ratio[lowest] >= 2 else "disagrees"
    p1 = (f"{ratio[lowest]:.2f}x: {marks['P1']}."
          if lowest in rs else "its seeds are still to come." if lowest in coming else
          "too few of its seeds left after divergence: not checked.")
    out = [f"- P1, bn's statistics part >= 2x syncbn's at the lowest rate ({lowest:g}; about 4x "
           f"predicted): {p1}",
           f"- P2, that ratio falls as the rate rises: "
           f"{', '.join(f'{ratio[lr]:.2f}x at {lr:g}' for lr in rs)}: "
           f"{marks['P2']}{so_far}.",
           f"- P3, syncbn's statistics part grows with the rate: "
           f"{', '.join(f'{sb[lr]:.2f} at {lr:g}' for lr in rs)} points²: "
           f"{marks['P3']}{so_far}."]
    out += fit_line(d, rs, "Fit S = a_norm + b lr²")
    late = [lr for lr in done if lr not in rs]
    if late:
        out.append("- Rates added after the prediction (not judged by it): "
                   + ", ".join(f"{lr:g}: bn / syncbn statistics part {ratio[lr]:.2f}x, syncbn's "
                               f"{sb[lr]:.2f} points²" for lr in late) + ".")
        out += fit_line(d, done, "The same fit with them")
    return out, marks


def finding(d: RunsData) -> str:
    """Why BN jitters, in a line for the README's first screen: what the prediction written
    before the runs said, what was measured at the rates it was written for, and each part's
    outcome."""
    m = judged(d)[1]
    if not m:
        return "Why BN jitters (the prediction against table-lr): runs still to come"
    rs = m["judged at"]
    f = fit(d, rs)
    rel = f"; fitted bn / syncbn floor {f['a_bn'] / f['a_syncbn']:.1f} (4 predicted)" \
        if f and f["a_syncbn"] > 0 else ""
    ratio, sb = m["ratio"], m["syncbn"]
    return (f"Why BN jitters: bn's statistics part is "
            f"{', '.join(f'{ratio[lr]:.2f}x' for lr in rs)} syncbn's at lr "
            f"{', '.join(f'{lr:g}' for lr in rs)} (predicted from the EMA's sampling noise, "
            f"before the runs: about 4x at the lowest, falling as the rate rises); syncbn's own "
            f"is {', '.join(f'{sb[lr]:.2f}' for lr in rs)} points²{rel}: "
            f"P1 (>= 2x at the lowest) {m.get('P1', 'still to come')}, P2 (falls) {m['P2']}, "
            f"P3 (syncbn's grows) {m['P3']}{m['so far']}{seeds_to_come(d, rs)}")


def fit_line(d: RunsData, among: list[float], what: str) -> list[str]:
    f = fit(d, among)
    if f is None:
        return []
    rel = f["a_bn"] / f["a_syncbn"] if f["a_syncbn"] > 0 else math.nan
    return [f"- {what} to the {f['n']} cell means: a_bn {f['a_bn']:.2f}, a_syncbn "
            f"{f['a_syncbn']:.2f} points² (a_bn / a_syncbn {rel:.1f}; 4 predicted), "
            f"b {f['b']:.0f} points² per lr²."]


COLUMNS = ["lr", "cell", "seeds", "plateau acc (%)", "von Neumann sd (pts)", "churn floor (pts)",
           "jitter / floor", "statistics part (pts²)", "weights part (pts²)",
           "statistics share (%)"]


def row(c: CellResult) -> list[str]:
    st, we = parts(c, "statistics"), parts(c, "weights")
    tot = parts(c, "total")
    share = Stat.of([100 * s / t for s, t in zip(st, tot, strict=True) if t > 0])
    return [f"{c.cell.meta['lr']:g}", c.cell.meta["norm"], c.seeds_note(),
            c.jstat("plateau_acc").fmt(1), c.jstat("vn_sd").fmt(2),
            c.jstat("churn_floor").fmt(2), c.jstat("over_floor").fmt(2), Stat.of(st).fmt(2),
            Stat.of(we).fmt(2), share.fmt(0)]


def eval_cost(d: RunsData) -> str:
    """What evaluation costs a run of this table and what the sparse first half saved, from
    the logs of the runs that trained in one launch (means over them, so the parts add up):
    wall time (sweep.json) less the training steps' time and the decompositions' leaves the
    plain evaluations with start-up and checkpoints, an upper bound on their cost."""
    got = []
    for r in (r for c in d.cells for r in c.runs):
        train = r.last("time/train_s")
        if r.launches != 1 or not r.wall_s or r.diverged or train is None:
            continue
        dec = [x["time/decompose_s"] for x in r.rows if "time/decompose_s" in x]
        evals = Counter(math.ceil(x["epoch"] - 1e-9) for x in r.rows if "val/acc" in x)
        rest = r.wall_s - train - sum(dec)
        skipped = sum(max(evals.values()) - n for n in evals.values())
        saved = skipped * rest / sum(evals.values())  # at most: rest holds start-up too
        got.append((r.wall_s, train, sum(dec), len(dec), rest, sum(evals.values()), skipped,
                    saved))
    if not got:
        return "Evaluation cost: no run trained in one launch yet."
    wall, train, dec, ndec, rest, nev, skipped, saved = (float(np.mean(x))
                                                         for x in zip(*got, strict=True))
    return (f"Evaluation cost, from the logs of the {len(got)} runs that trained in one launch "
            f"(means; each beside another run): a run {wall / 60:.1f} min = its training steps "
            f"{train / 60:.1f} + its {ndec:.0f} decompositions {dec / 60:.1f} + the rest "
            f"{rest / 60:.1f} min (its {nev:.0f} plain evaluations with start-up and checkpoints:"
            f" at most {rest / nev:.1f} s an evaluation). Evaluating only at epoch ends before "
            f"the plateau skipped {skipped:.0f} evaluations a run: at most {saved / 60:.1f} min, "
            f"{100 * saved / (wall + saved):.0f}% of the {(wall + saved) / 60:.1f} min a run "
            "evaluating 10 times an epoch throughout would take. Derived from the runs' logs "
            "after they ran: the saving was not measured before the sweep started.")


def render(d: RunsData) -> str:
    lines = [f"Chosen rate (experiments/pilot, on held-out data): **{chosen(d):g}**.", "",
             page.md_table(COLUMNS, [row(c) for lr in rates(d) for n in NORMS
                                      if (c := cell(d, n, lr)) is not None]), "",
             eval_cost(d), "",
             "## Control check and contrast, rate by rate", ""]
    for lr in rates(d):
        ok, why, _ = steady(d, lr)
        bn = cell(d, "bn", lr)
        lines.append(f"- {why}" + (f"; {contrast(d, lr)['text']}" if ok is not None and
                                   ready(bn) and vals(bn) else ""))
    lines += ["", "## Why BN jitters: the prediction against the measurement", "",
              *predictions(d), "",
              "Statistics part: the detrended variance of (val acc with the running statistics "
              "- val acc of the same weights with PreciseBN statistics); weights part: that of "
              "the PreciseBN series (bnlab.jitter.variance_split; twice their covariance makes "
              "up the rest, so a statistics share above 100% means the two co-vary negatively). "
              "On the plateau, the second half of training; mean ± sd over seeds. "
              "The prediction and the rules are in bnlab/claims/lr.py, written before these "
              "runs.", ""]
    return table.runs_page(d, "\n".join(lines))


def plot(d: RunsData, path: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    ax = axes[0]
    ruled = ruling_rate(d)[0]
    shown = (ruled or chosen(d), rates(d)[-1])  # C1's rate (else the chosen), and 0.1
    for lr in rates(d):
        for n in NORMS:
            c = cell(d, n, lr)
            if c is not None and c.runs and lr in shown:
                band(ax, c, f"{n}, lr {lr:g}" + (" (C1's rate)" if lr == ruled else ""))
    ax.axvline(PLATEAU * 20, color="grey", ls=":", lw=1)
    ax.set(title="val acc (band: min..max over seeds)", xlabel="epoch", ylabel="val accuracy (%)")
    ax.grid(alpha=0.3)
    legend(ax, 7)
    for ax, key, title in ((axes[1], "vn_sd", "plateau jitter (von Neumann sd)"),
                           (axes[2], None, "statistics part of the variance")):
        for i, n in enumerate(NORMS):
            xs, ys = [], []
            for lr in rates(d):
                v = vals(cell(d, n, lr), key) if key else parts(cell(d, n, lr), "statistics")
                ax.plot([lr] * len(v), v, "o", color=f"C{i}", ms=3, alpha=0.5)
                if v:
                    xs.append(lr)
                    ys.append(mean(v))
            ax.plot(xs, ys, "-", color=f"C{i}", label=n)
        if key:
            label = "syncbn's churn floor"
            for lr in rates(d):
                f = vals(cell(d, "syncbn", lr), "churn_floor")
                if f:
                    ax.plot([lr], [mean(f)], "_", color="black", ms=14, label=label)
                    label = None  # one legend entry
        ax.set_xscale("log", base=2)
        ax.set_xticks(rates(d), [f"{x:g}" for x in rates(d)])
        ax.axvline(chosen(d), color="grey", ls="--", lw=1)
        ax.set(title=title, xlabel="learning rate (dashed: chosen)",
               ylabel="points" if key else "points²")
        ax.grid(alpha=0.3)
        legend(ax, 8)
    save(fig, path, "The learning-rate crossover: resnet20, 4 ranks x 2, constant rate",
         empty=not any(c.runs for c in d.cells))


TABLE = table.Table("lr", ("C1", "C3", "C4"), table.runs_data, render, verdicts, plot,
                    block="settled", headline="lr.png", finding=finding)
