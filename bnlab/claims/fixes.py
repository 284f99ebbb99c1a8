"""`make table-fixes` (claims C6, C8, C9 on the settled headline protocol): the fixes for bn at
4 ranks x 2, side by side at one rate (the one C1 is ruled at; the spec's comment says how).

    python -m bnlab.claims fixes --data DIR --jobs 2   # sweep (hours on 2 cores), table
    python -m bnlab.claims fixes --report              # table from the runs' logs only

Trains experiments/fixes/sweep.yaml on the settled headline protocol
(configs/experiment/headline.yaml) at the spec's rate, 5 seeds a cell: bn and syncbn (the
same runs as table-lr's cells at that rate), bn with PreciseBN after every epoch, gn at the
group count the pilot chose (at least 2 channels a group), and frozen BN after the warm start
the pilot chose. Writes experiments/fixes/{table.md, fixes.png}.

The rules, written before these runs (experiments/README.md names the commit). C6 and C9 are
jitter contrasts: ruled only when the control (syncbn at this rate) is steady by table-lr's
control check, else "untestable at this setting". Jitter is the plateau's von Neumann sd;
separated means an exact one-sided permutation test over seeds at p <= SEPARATED.

- C6 (frozen BN much steadier): bn's jitter separated above frozen BN's and frozen at most
  half of it: reproduced; separated: partly; else not reproduced; frozen BN below
  NO_LEARNING + 5 on the plateau, or fewer than MIN_SEEDS seeds left after divergence:
  untestable.
- C8 (PreciseBN after each epoch improves val acc): in the PreciseBN cell, the val acc after
  each recalibration minus the val acc of the same weights with the running statistics just
  before it, at each epoch end of the plateau, averaged per seed: reproduced if +1 point or
  more on average and up in every seed; partly if up on average and in most seeds; else not
  reproduced. (The decomposition of table-lr's bn and syncbn cells is shown beside it.)
- C9 (GN the steadiest, close to SyncBN): steadiest = gn's jitter not separated above any
  other cell's, separated below bn's, and on average at most STEADIEST x the lowest other
  cell's; close = plateau val acc within 5 points of syncbn's, either way; both: reproduced,
  one: partly, neither: not reproduced; gn below NO_LEARNING + 5 on the plateau: untestable.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bnlab.claims import lr as lrtable
from bnlab.jitter import on_plateau
from bnlab.lab import page, table
from bnlab.lab.analysis import NO_LEARNING, SEPARATED, Stat, p_above
from bnlab.lab.figures import band, legend, plt, save
from bnlab.lab.results import CellResult, Run, fmt, gains
from bnlab.lab.table import RunsData, Verdict

MIN_SEEDS = 3
STEADIEST = 1.1
LEARNED = NO_LEARNING + 5
FIXES = ("bn", "syncbn", "precise", "gn", "frozen_bn")
RUNS_TO_COME = lrtable.RUNS_TO_COME


def cell(d: RunsData, fix: str) -> CellResult | None:
    return next((c for c in d.cells if c.cell.meta.get("fix") == fix), None)


def vals(c: CellResult | None, key: str = "vn_sd") -> list[float]:
    return [] if c is None else c.jitter_values(key)


def mean(xs: list[float]) -> float | None:
    return float(np.mean(xs)) if xs else None


def waiting(*cells: CellResult | None) -> str | None:
    """Why a rule cannot apply yet (a cell not in the spec, held, or short of seeds), else None."""
    for c in cells:
        if c is None:
            return "its cells are not in the spec yet"
        if not c.cell.seeds:
            return f"{c.cell.label}: held until C1's rate is settled (the spec's rule)"
        if len(c.runs) < min(MIN_SEEDS, c.expected):
            return f"{c.cell.label}: fewer than {MIN_SEEDS} seeds finished"
    return None


def control(d: RunsData) -> lrtable.Control:
    """table-lr's control check, on this table's syncbn cell (the same runs)."""
    sb = cell(d, "syncbn")
    if why := waiting(sb):
        return lrtable.Control(None, why, RUNS_TO_COME)
    return lrtable.control_check(sb, sb.cell.meta["lr"])


def jitter_rule(d: RunsData, *fixes: str) -> tuple[str | None, str, str]:
    """(outcome, or None where the rule applies; why; that in a few words)."""
    cells = [cell(d, f) for f in fixes]
    if why := waiting(*cells):
        return "not run yet", why, RUNS_TO_COME
    ctl = control(d)
    if ctl.ok is None:  # the control's own seeds (a cell the rule does not name) still running
        return "not run yet", ctl.why, RUNS_TO_COME
    if not ctl.ok:
        return "untestable", f"untestable at this setting: {ctl.why}", \
            f"no steady control: syncbn {ctl.short}"
    short = [c for c in cells if len(vals(c)) < MIN_SEEDS]
    if short:
        why = ", ".join(f"{c.cell.label}: {c.diverged} of {len(c.runs)} seeds diverged"
                        for c in short)
        return "untestable", why, why
    return None, ctl.why, ""


def c6(d: RunsData) -> Verdict:
    rule = (f"Rule (only where the control is steady): bn's jitter separated above frozen BN's "
            f"(p <= {SEPARATED}) and frozen at most half of it: reproduced; separated: partly; "
            f"else not reproduced; frozen BN below {LEARNED:g}% on the plateau: untestable.")
    v, why, glance = jitter_rule(d, "bn", "frozen_bn")
    bn, fr = cell(d, "bn"), cell(d, "frozen_bn")
    if v is not None:
        return Verdict("C6", "make table-fixes", "frozen BN much steadier", why, v, rule, glance)
    a, b = vals(bn), vals(fr)
    p = p_above(a, b)
    ours = (f"von Neumann sd bn {bn.jstat('vn_sd').fmt(2)}, {fr.cell.label} "
            f"{fr.jstat('vn_sd').fmt(2)} (p = {fmt(p, 3)}); plateau acc "
            f"{bn.jstat('plateau_acc').fmt(1)} vs {fr.jstat('plateau_acc').fmt(1)}; {why}")
    if mean(vals(fr, "plateau_acc")) < LEARNED:
        v = "untestable"
    elif p > SEPARATED:
        v = "not reproduced"
    else:
        v = "reproduced" if mean(b) <= mean(a) / 2 else "partly"
    glance = (f"jitter frozen BN {mean(b):.2f} vs bn {mean(a):.2f} pts (p = {fmt(p, 3)}); "
              f"plateau acc {mean(vals(fr, 'plateau_acc')):.1f}% vs "
              f"{mean(vals(bn, 'plateau_acc')):.1f}%")
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
    rule = ("Rule (paired on each seed's own weights): reproduced if +1 point or more on average "
            "and up in every seed; partly if up on average and in most seeds; else not "
            "reproduced.")
    pb = cell(d, "precise")
    if why := waiting(pb):
        return Verdict("C8", "make table-fixes", "PreciseBN improves val acc", why,
                       "not run yet", rule, RUNS_TO_COME)
    g = [x for x in (recalibration_gain(r, pb.epochs) for r in pb.runs) if x is not None]
    if len(g) < MIN_SEEDS:
        why = f"{len(g)} seeds with a gain ({pb.diverged} diverged)"
        return Verdict("C8", "make table-fixes", "PreciseBN improves val acc", why,
                       "untestable", rule, why)
    s, up = Stat.of(g), sum(x > 0 for x in g)
    side = "; ".join(f"decomposition of {c.cell.label} (PreciseBN statistics of 2,048 images "
                     f"on the same weights at each plateau epoch end): "
                     f"{Stat.of(gains(c)).fmt(2)} points"
                     for c in (cell(d, "bn"), cell(d, "syncbn")) if c is not None and gains(c))
    ours = (f"after each recalibration vs the running statistics just before it: {s.mean:+.2f} "
            f"± {s.std:.2f} points, up in {up} of {len(g)} seeds "
            f"({', '.join(f'{x:+.2f}' for x in g)})" + (f"; {side}" if side else ""))
    v = "reproduced" if s.mean >= 1 and up == len(g) else \
        "partly" if s.mean > 0 and up > len(g) / 2 else "not reproduced"
    glance = f"{s.mean:+.2f} pts after each recalibration, up in {up} of {len(g)} seeds"
    return Verdict("C8", "make table-fixes", "PreciseBN improves val acc", ours, v, rule, glance)


def c9(d: RunsData) -> Verdict:
    rule = (f"Rule (only where the control is steady): steadiest = gn's jitter not separated "
            f"above any other cell's, separated below bn's (p <= {SEPARATED}) and on average at "
            f"most {STEADIEST}x the lowest other cell's; close = plateau val acc within 5 points "
            f"of syncbn's, either way; both: reproduced, one: partly; gn below {LEARNED:g}% on "
            "the plateau: untestable.")
    v, why, glance = jitter_rule(d, *FIXES)
    if v is not None:
        return Verdict("C9", "make table-fixes", "GN steadiest, close to SyncBN", why, v, rule,
                       glance)
    gn = cell(d, "gn")
    others = {f: cell(d, f) for f in FIXES if f != "gn"}
    above = {f: p_above(vals(gn), vals(c)) for f, c in others.items()}
    below_bn = p_above(vals(others["bn"]), vals(gn))
    lowest = min(mean(vals(c)) for c in others.values())
    steadiest = all(p > SEPARATED for p in above.values()) and below_bn <= SEPARATED and \
        mean(vals(gn)) <= STEADIEST * lowest
    gap = mean(vals(others["syncbn"], "plateau_acc")) - mean(vals(gn, "plateau_acc"))
    close = abs(gap) <= 5
    ours = (f"von Neumann sd {gn.cell.label} {gn.jstat('vn_sd').fmt(2)}; lowest other "
            f"{lowest:.2f}; gn above another p >= {min(above.values()):.3f}, below bn p = "
            f"{fmt(below_bn, 3)}; plateau acc {-gap:+.1f} points against syncbn; {why}")
    if mean(vals(gn, "plateau_acc")) < LEARNED:
        v = "untestable"
    else:
        v = "reproduced" if steadiest and close else "partly" if steadiest or close else \
            "not reproduced"
    glance = (f"jitter gn {mean(vals(gn)):.2f} vs the lowest other {lowest:.2f} pts; plateau acc "
              f"{-gap:+.1f} pts against syncbn")
    return Verdict("C9", "make table-fixes", "GN steadiest, close to SyncBN", ours, v, rule,
                   glance)


def verdicts(d: RunsData) -> list[Verdict]:
    return [c6(d), c8(d), c9(d)]


def render(d: RunsData) -> str:
    rows = [[c.cell.label, c.seeds_note() if c.cell.seeds else "held",
             c.jstat("plateau_acc").fmt(1), c.jstat("final").fmt(1), c.jstat("vn_sd").fmt(2),
             c.jstat("churn_floor").fmt(2), c.jstat("over_floor").fmt(2),
             c.jstat("swing").fmt(1)] for c in d.cells]
    why = control(d).why
    return table.runs_page(d, "\n".join([
        page.md_table(["cell", "seeds", "plateau acc (%)", "final acc (%)",
                        "von Neumann sd (pts)", "churn floor (pts)", "jitter / floor",
                        "swing (± pts)"], rows), "",
        f"Control check (table-lr's rule): {why}.", "",
        "Plateau: the second half of training; mean ± sd over seeds. The rules are in "
        "bnlab/claims/fixes.py, written before these runs.", ""]))


def label_note(c: CellResult) -> str:
    """What an x label adds for a cell with no jitter to plot."""
    if vals(c):
        return ""
    return "\n(diverged)" if c.runs else "\n(held)" if not c.cell.seeds else "\n(not run yet)"


def plot(d: RunsData, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.8))
    for c in d.cells:
        band(axes[0], c)
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


TABLE = table.Table("fixes", ("C6", "C8", "C9"), table.runs_data, render, verdicts, plot,
                    block="settled")
