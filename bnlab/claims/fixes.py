"""`make table-fixes` (claims C6, C8, C9 on the settled headline protocol): the fixes for bn at
4 ranks x 2, side by side at one rate (the one C1 is ruled at; the spec's comment says how).

    python -m bnlab.claims fixes --data DIR --jobs 2   # sweep (hours on 2 cores), table
    python -m bnlab.claims fixes --report              # table from the runs' logs only

Trains experiments/fixes/sweep.yaml on the settled headline protocol
(configs/experiment/headline.yaml) at the spec's rate, 5 seeds a cell: bn and syncbn (the
same runs as table-lr's cells at that rate), bn with PreciseBN after every epoch, gn at the
group count the pilot chose (at least 2 channels a group), and frozen BN after the warm start
the pilot chose. Writes experiments/fixes/{table.md, fixes.png}.

The rules, their thresholds and their versions are data in experiments/fixes/rules.yaml; the
control check is bnlab.lab.judge's. C6 and C9 are jitter contrasts, ruled only where the
control (syncbn at this rate, every seed ended) is steady. The PreciseBN cell's jitter is that
of its evaluations just after each epoch end's recalibration (val/acc_precise, 10 on the
plateau): its other evaluations come 63 steps or more after a recalibration, when the running
statistics' EMA has forgotten it, and its training is bn's.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from bnlab.jitter import on_plateau
from bnlab.lab import judge, page, rules, table
from bnlab.lab.analysis import (
    Stat,
    diff_interval,
    finite,
    mean_interval,
    p_above,
    p_positive,
    ratio_interval,
)
from bnlab.lab.figures import band, legend, plt, precise_points, save
from bnlab.lab.results import CellResult, Run, fmt, gains, signed
from bnlab.lab.table import Finding, RunsData, Verdict

RULES = rules.read("fixes")
MIN_SEEDS = RULES["min_seeds"]
STEADIEST = RULES["steadiest"]        # C9: gn at most this x the lowest other jitter
LEARNED = RULES["learned"]
FLOOR_RATIO = RULES["floor_ratio"]    # C6: bn at least this x its churn floor
SEPARATED = RULES["separated"]
EXCESS = RULES["excess_share"]        # C6: frozen BN's excess at most this share of bn's
GAIN = RULES["gain_points"]           # C8: reproduced at this mean gain
CLOSE = RULES["close_points"]         # C9: gn's last-epoch acc within this of syncbn's
FIXES = ("bn", "syncbn", "precise", "gn", "frozen_bn")
# C9 compares gn with these: PreciseBN's jitter is read from 10 epoch-end evaluations, not the
# 100 the others have, and a von Neumann sd over one-epoch steps also holds the trend's drift
C9_OTHERS = ("bn", "syncbn", "frozen_bn")
KIND = {"precise": "recal"}  # which evaluations a cell's jitter reads (Run.jitter's kind)
RUNS_TO_COME = "runs still to come"
UNTESTABLE = ("a cell below learned % on the plateau or with fewer than min_seeds seeds left: "
              "untestable")


def rule_of(claim: str, *keys: str, note: str = "") -> str:
    """A claim's rule as rules.yaml words it, its thresholds, and the disclosure of every version
    written after its data were seen (bnlab.lab.rules)."""
    return (f"Rule: {RULES.words('rules', claim)}; {UNTESTABLE}.{note} Thresholds: "
            + rules.said(RULES, *keys, "learned", "min_seeds") + "." + rules.disclosure(RULES))


def cell(d: RunsData, fix: str) -> CellResult | None:
    return next((c for c in d.cells if c.cell.meta.get("fix") == fix), None)


def vals(c: CellResult | None, key: str = "vn_sd") -> list[float]:
    return [] if c is None else c.jitter_values(key, KIND.get(c.cell.meta.get("fix"), "ema"))


def mean(xs: list[float]) -> float | None:
    return float(np.mean(xs)) if xs else None


def waiting(*cells: CellResult | None) -> str | None:
    """Why a rule cannot apply yet (a cell not in the spec, held, or a seed still to end),
    else None."""
    for c in cells:
        if c is None:
            return "its cells are not in the spec yet"
        if not c.cell.seeds:
            return f"{c.cell.label}: held until C1's rate is settled (the spec's rule)"
        if len(c.runs) < c.expected:
            return f"{c.cell.label}: {len(c.runs)} of {c.expected} seeds finished"
    return None


def unusable(c: CellResult) -> str | None:
    """Why an ended cell cannot be read: too few seeds left, or it did not learn."""
    if len(vals(c)) < MIN_SEEDS:
        return f"{c.cell.label}: {c.diverged} of {len(c.runs)} seeds diverged"
    if mean(vals(c, "plateau_acc")) < LEARNED:
        return f"{c.cell.label} below {LEARNED:g}% on the plateau (did not learn)"
    return None


def control(d: RunsData) -> judge.Control:
    """table-lr's control check, on this table's syncbn cell (the same runs), every seed
    ended."""
    sb = cell(d, "syncbn")
    if why := waiting(sb):
        return judge.Control(None, why, RUNS_TO_COME)
    return judge.control_check(RULES, sb, sb.cell.meta["lr"])


def jitter_rule(d: RunsData, *fixes: str) -> tuple[str | None, str, str]:
    """(outcome, or None where the rule applies; why; that in a few words). Once the rate is
    settled (the PreciseBN cell, which runs in any case, has seeds) the control comes first:
    with it not steady the gn and frozen BN cells never run."""
    ctl, pb = control(d), cell(d, "precise")
    untestable = ("untestable", f"untestable at this setting: {ctl.why}",
                  f"no steady control: syncbn {ctl.short}")
    if ctl.ok is False and pb is not None and pb.cell.seeds:
        return untestable
    cells = [cell(d, f) for f in fixes]
    if why := waiting(*cells):
        return "not run yet", why, RUNS_TO_COME
    if ctl.ok is None:
        return "not run yet", ctl.why, RUNS_TO_COME
    if ctl.ok is False:
        return untestable
    if bad := [w for c in cells if (w := unusable(c))]:
        return "untestable", "; ".join(bad), "; ".join(bad)
    return None, ctl.why, ""


def excess(c: CellResult) -> float | None:
    """Mean over seeds of the jitter above the churn floor, sqrt(sd^2 - floor^2)."""
    pairs = [(j.get("vn_sd"), j.get("churn_floor"))
             for j in (r.jitter(c.epochs) for r in c.runs)]
    xs = [math.sqrt(max(v * v - f * f, 0.0)) for v, f in pairs if finite(v) and finite(f)]
    return mean(xs)


def c6(d: RunsData) -> Verdict:
    rule = rule_of("C6", "floor_ratio", "separated", "excess_share")
    v, why, glance = jitter_rule(d, "bn", "frozen_bn")
    bn, fr = cell(d, "bn"), cell(d, "frozen_bn")
    if v is not None:
        return Verdict("C6", "make table-fixes", "frozen BN much steadier", why, v, rule, glance)
    a, b = vals(bn), vals(fr)
    p = p_above(a, b)
    floor = mean(vals(bn, "churn_floor"))
    over = mean(a) / floor if floor else 0.0  # no floor: no way to tell jitter from noise
    xa, xb = excess(bn), excess(fr)
    lo, hi = ratio_interval(a, b)
    ours = (f"von Neumann sd bn {bn.jstat('vn_sd').fmt(2)} ({over:.1f}x its floor), "
            f"{fr.cell.label} {fr.jstat('vn_sd').fmt(2)}: bn / frozen BN "
            f"{mean(a) / max(mean(b), 1e-9):.2f}x (95% interval {fmt(lo, 2)} to {fmt(hi, 2)}), "
            f"p = {fmt(p, 3)}; above the floor "
            f"{fmt(xa, 2)} vs {fmt(xb, 2)}; plateau acc {bn.jstat('plateau_acc').fmt(1)} vs "
            f"{fr.jstat('plateau_acc').fmt(1)}; {why}")
    if over < FLOOR_RATIO:
        v = "untestable"
    elif p > SEPARATED:
        v = "not reproduced"
    else:
        v = "reproduced" if xb is not None and xa is not None and xb <= xa * EXCESS else "partly"
    glance = (f"jitter frozen BN {mean(b):.2f} vs bn {mean(a):.2f} pts (p = {fmt(p, 3)}); "
              f"plateau acc {mean(vals(fr, 'plateau_acc')):.1f}% vs "
              f"{mean(vals(bn, 'plateau_acc')):.1f}%" +
              (f" (bn only {over:.1f}x its floor)" if over < FLOOR_RATIO else ""))
    return Verdict("C6", "make table-fixes", "frozen BN much steadier", ours, v, rule, glance)


def recalibration_gain(run: Run, total_epochs: float) -> float | None:
    """Val acc after each PreciseBN recalibration minus the same weights' val acc with the
    running statistics just before it, averaged over the plateau's epoch ends."""
    if run.diverged:
        return None
    got = [r["val/acc_precise"] - ema for r in run.rows if "val/acc_precise" in r
           and on_plateau(r["epoch"], total_epochs)
           and (ema := before(run, r["epoch"])) is not None]
    return float(np.mean(got)) if got else None


def before(run: Run, epoch: float) -> float | None:
    """The val acc logged at `epoch` (the epoch end's evaluation, before PreciseBN)."""
    return next((r["val/acc"] for r in run.rows if "val/acc" in r
                 and abs(r["epoch"] - epoch) < 1e-9), None)


def c8(d: RunsData) -> Verdict:
    rule = rule_of("C8", "separated", "gain_points", note=" C8 reads no control.")
    pb = cell(d, "precise")
    if why := waiting(pb):
        return Verdict("C8", "make table-fixes", "PreciseBN improves val acc", why,
                       "not run yet", rule, RUNS_TO_COME)
    g = [x for x in (recalibration_gain(r, pb.epochs) for r in pb.runs) if x is not None]
    if 0.5 ** len(g) > SEPARATED:  # too few seeds for any sign-flip test to separate
        why = f"{len(g)} seeds with a gain ({pb.diverged} diverged)"
        return Verdict("C8", "make table-fixes", "PreciseBN improves val acc", why,
                       "untestable", rule, why)
    s, up, p = Stat.of(g), sum(x > 0 for x in g), p_positive(g)
    lo, hi = mean_interval(g)
    side = "; ".join(f"decomposition of {c.cell.label} (PreciseBN statistics of 2,048 images "
                     f"on the same weights at each plateau epoch end): "
                     f"{Stat.of(gains(c)).fmt(2)} points"
                     for c in (cell(d, "bn"), cell(d, "syncbn")) if c is not None and gains(c))
    weak = lo is not None and lo <= 0 < s.mean and p <= SEPARATED
    ours = (f"after each recalibration vs the running statistics just before it: {s.mean:+.2f} "
            f"± {s.std:.2f} points (95% t interval {fmt(lo, 2)} to {fmt(hi, 2)}), up in {up} of "
            f"{len(g)} seeds "
            f"({', '.join(f'{x:+.2f}' for x in g)}; sign-flip p = {fmt(p, 3)})"
            + ("; weak: the exact one-sided sign-flip test separates the gain from 0, the "
               "two-sided t interval (which assumes normal gains) does not" if weak else "")
            + (f"; {side}" if side else ""))
    v = "not reproduced" if p > SEPARATED else "reproduced" if s.mean >= GAIN else "partly"
    glance = (f"{s.mean:+.2f} pts (95% CI {fmt(lo, 2)} to {fmt(hi, 2)}) after each "
              f"recalibration, up in {up} of {len(g)} seeds (p = {fmt(p, 3)})")
    return Verdict("C8", "make table-fixes", "PreciseBN improves val acc", ours, v, rule, glance)


def end_acc(c: CellResult) -> float | None:
    """Mean over seeds of the mean val acc over the last epoch's evaluations."""
    out = []
    for r in c.runs:
        ep, acc = r.series("val/acc")
        last = [a for e, a in zip(ep, acc, strict=True) if e > c.epochs - 1 + 1e-9]
        if last and not r.diverged:
            out.append(float(np.mean(last)))
    return mean(out)


def c9(d: RunsData) -> Verdict:
    rule = rule_of("C9", "separated", "steadiest", "close_points")
    v, why, glance = jitter_rule(d, "bn", "syncbn", "gn")
    if v is not None:
        return Verdict("C9", "make table-fixes", "GN steadiest, close to SyncBN", why, v, rule,
                       glance)
    coming = [c.cell.label for f in C9_OTHERS if (c := cell(d, f)) is not None
              and c.cell.seeds and waiting(c)]
    if coming:
        return Verdict("C9", "make table-fixes", "GN steadiest, close to SyncBN",
                       f"{', '.join(coming)}: seeds still to come", "not run yet", rule,
                       RUNS_TO_COME)
    gn = cell(d, "gn")
    others = {f: c for f in C9_OTHERS if (c := cell(d, f)) is not None
              and c.cell.seeds and not unusable(c)}
    above = {f: p_above(vals(gn), vals(c)) for f, c in others.items()}
    below_bn = p_above(vals(others["bn"]), vals(gn))
    low = min(others.values(), key=lambda c: mean(vals(c)))
    lowest = mean(vals(low))
    lo, hi = ratio_interval(vals(gn), vals(low))
    steadiest = all(p > SEPARATED for p in above.values()) and below_bn <= SEPARATED and \
        mean(vals(gn)) <= STEADIEST * lowest
    gap = end_acc(others["syncbn"]) - end_acc(gn)
    close = abs(gap) <= CLOSE
    ours = (f"von Neumann sd {gn.cell.label} {gn.jstat('vn_sd').fmt(2)}; lowest of "
            f"{', '.join(others)} {lowest:.2f} ({low.cell.label}): gn / {low.cell.label} "
            f"{mean(vals(gn)) / max(lowest, 1e-9):.2f}x (95% interval {fmt(lo, 2)} to "
            f"{fmt(hi, 2)}); gn above "
            + ", ".join(f"{f} p = {fmt(p, 3)}" for f, p in above.items())
            + f"; below bn p = {fmt(below_bn, 3)}; last epoch's val acc "
            f"{-gap:+.1f} points against syncbn; {why}")
    v = "reproduced" if steadiest and close else "partly" if steadiest or close else \
        "not reproduced"
    glance = (f"jitter gn {mean(vals(gn)):.2f} vs the lowest other {lowest:.2f} pts; last "
              f"epoch's acc {-gap:+.1f} pts against syncbn (4 x 2, lr "
              f"{page.short(gn.cell.meta['lr'])}, {gn.epochs:g} epochs)")  # GN's protocol, said
    return Verdict("C9", "make table-fixes", "GN steadiest, close to SyncBN", ours, v, rule,
                   glance)


def verdicts(d: RunsData) -> list[Verdict]:
    vs, done = [c6(d), c8(d), c9(d)], table.complete(*d.cells)
    for v in vs:  # each reads these cells alone (bn and syncbn at C1's settled rate among them)
        v.final = done and v.verdict != "not run yet"
    return vs


def render(d: RunsData) -> str:
    def js(c: CellResult, key: str) -> Stat:
        return Stat.of(vals(c, key))

    rows = [[c.cell.label, c.seeds_note() if c.cell.seeds else "held",
             js(c, "plateau_acc").fmt(1), fmt(end_acc(c)), js(c, "vn_sd").fmt(2),
             js(c, "churn_floor").fmt(2), js(c, "over_floor").fmt(2), js(c, "swing").fmt(1)]
            for c in d.cells]
    why = control(d).why
    return table.runs_page(d, "\n".join([
        page.md_table(["cell", "seeds", "plateau acc (%)", "last epoch's acc (%)",
                        "von Neumann sd (pts)", "churn floor (pts)", "jitter / floor",
                        "swing (± pts)"], rows), "",
        f"Control check (table-lr's rule): {why}.", "",
        "Plateau accuracy over bn's (points, mean over seeds, 95% Welch interval: the norms' "
        "weights differ, so not paired): " + ("; ".join(
            f"{c.cell.label} {x[0]:+.1f} ({fmt(x[1])} to {fmt(x[2])})" for c in d.cells
            if c.cell.meta.get("fix") != "bn" and (x := over_bn(d, c.cell.meta["fix"]))
            is not None) or "none measured yet") + ".", "",
        "Plateau: the second half of training; mean ± sd over seeds. Swing: half the range "
        "of val acc on the plateau, the claims' '+/- points'. The PreciseBN cell's "
        "columns read its evaluations just after each epoch end's recalibration (10 on the "
        "plateau; they keep no predictions, so no churn floor): its other evaluations come "
        "after the running statistics' EMA has forgotten the recalibration. The rules: below.",
        "", PRECISE_MEASURES, "", *rules.history(RULES)]))


# PreciseBN's gain answers one question several ways across the pages; this page owns C8
PRECISE_MEASURES = (
    "**PreciseBN's gain, one question, several measures.** The README quotes C8's: in the "
    "PreciseBN cell, val accuracy just after each plateau epoch end's recalibration (4,096 "
    "training images) minus the same checkpoint's just before it, paired, per seed. The others: "
    "the plateau line above compares two trained cells, unpaired (the PreciseBN cell's "
    "after-recalibration evaluations against bn's whole plateau, where bn's epoch ends sit "
    "below its plateau mean); C8's decomposition gain recalibrates the bn cell's own "
    "checkpoints on a copy with 2,048 fixed, unaugmented images (other images, and on two "
    "seeds other weights); table-lr's cost section averages that decomposition over every "
    "plateau evaluation, within epochs too, where it gains more; the +0.78 in this page's rules "
    "history is one seed of the decomposition, written when two seeds existed; "
    "table-precisebn's PreciseBN minus EMA (L2) is torchvision resnet18 on the short protocol "
    "(5 epochs, cosine decay, lr 0.0125), one seed's final checkpoint, where the decayed rate "
    "has let the running statistics settle.")


def label_note(c: CellResult) -> str:
    """What an x label adds for a cell with no jitter to plot."""
    if vals(c):
        return ""
    return "\n(diverged)" if c.runs else "\n(held)" if not c.cell.seeds else "\n(not run yet)"


def plot(d: RunsData, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.8))
    for i, c in enumerate(d.cells):  # one colour a cell in both panels
        if c.cell.meta.get("fix") in KIND:  # PreciseBN: its EMA curve is bn's, not drawn
            precise_points(axes[0], c, f"C{i}")
        else:
            band(axes[0], c, color=f"C{i}")
    axes[0].set(title="val acc (band: min..max over seeds)", xlabel="epoch",
                ylabel="val accuracy (%)")
    axes[0].grid(alpha=0.3)
    legend(axes[0], 7)
    ax = axes[1]
    for i, c in enumerate(d.cells):
        v, f = vals(c), vals(c, "churn_floor")
        ax.scatter([i] * len(v), v, color=f"C{i}", zorder=3)
        if f:
            ax.scatter([i] * len(f), f, marker="_", s=300, color="black", zorder=2,
                       label="churn floor" if i == 0 else None)
    ax.set_xticks(range(len(d.cells)), [c.cell.meta.get("fix", c.cell.label)
                                        + label_note(c) for c in d.cells])
    ax.set(title="plateau jitter (von Neumann sd) per seed", ylabel="points")
    ax.grid(alpha=0.3, axis="y")
    legend(ax, 8)
    save(fig, path, d.spec.title,
         empty=not any(c.runs for c in d.cells))


def over_bn(d: RunsData, fix: str) -> tuple[float, float | None, float | None] | None:
    """A fix's plateau accuracy over bn's, mean over seeds with a 95% Welch interval (not
    paired: the norms' weights differ, rules.yaml `compare`); None until both have seeds."""
    a, b = vals(cell(d, fix), "plateau_acc"), vals(cell(d, "bn"), "plateau_acc")
    if not a or not b:
        return None
    return (mean(a) - mean(b), *diff_interval(a, b))


def finding(d: RunsData) -> list[Finding]:
    """What to use at 4 x 2, in a sentence: syncbn's plateau accuracy over bn's with its
    interval, frozen BN's and gn's, and what C6 and C9 found of their jitter."""
    bn, sb = cell(d, "bn"), cell(d, "syncbn")
    if waiting(bn, sb) or not vals(bn, "plateau_acc"):
        return [Finding("The fixes at 4 x 2: their runs are still to come.", "fixes", rank=4)]
    g, lr = over_bn(d, "syncbn"), sb.cell.meta["lr"]
    where = ("above" if g[1] is not None and g[1] > 0 else
             "below" if g[2] is not None and g[2] < 0 else "not separated from")
    v6, _, v9 = (v.verdict for v in verdicts(d))
    others = {name: x[0] for fix, name in (("frozen_bn", "frozen BN"), ("gn", "GroupNorm"))
              if (x := over_bn(d, fix)) is not None}
    return [Finding(
        f"On {page.model([bn, sb])} at 4 x 2, lr {page.short(lr)}, {bn.epochs:g} epochs, SyncBN "
        f"plateaus {abs(g[0]):.1f} points {where} "
        f"BN (95% CI {signed(g[1])} to {signed(g[2])})"
        + (", " + " and ".join(f"{name} {x:+.1f}" for name, x in others.items())
           + (", neither steadier than BN (C6, C9 not reproduced)"
              if v6 == v9 == "not reproduced" else f" (C6 {v6}, C9 {v9})") if others else "")
        + ".", "fixes", rules.mark(RULES), rank=4)]


TABLE = table.Table("fixes", ("C6", "C8", "C9"), table.runs_data, render, verdicts, plot,
                    block="settled", finding=finding, rules="fixes")
