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

The rules and the prediction, written before these runs, are data in experiments/lr/rules.yaml;
cells.py reads the cells and the control check (bnlab.lab.judge), verdicts.py rules on C1, C3
and C4, prediction.py sets the variance split beside the prediction, cost.py reads what the
running statistics cost in accuracy (what `bnlab diagnose` reports), bn against syncbn.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np

from bnlab.claims.lr.cells import *  # noqa: F403 (the table's names, one namespace)
from bnlab.claims.lr.cells import (
    CLAIMED,
    NORMS,
    REPRODUCED,
    RULES,
    cell,
    chosen,
    contrast,
    mean,
    rates,
    ready,
    ruling_rate,
    seeds_to_come,
    steady,
    vals,
    without_added,
)
from bnlab.claims.lr.cost import section as cost_section
from bnlab.claims.lr.prediction import *  # noqa: F403
from bnlab.claims.lr.prediction import parts, predictions, why
from bnlab.claims.lr.verdicts import *  # noqa: F403
from bnlab.claims.lr.verdicts import c1_parts, swing_order, verdicts
from bnlab.jitter import PLATEAU
from bnlab.lab import page, rules, table
from bnlab.lab.analysis import Stat
from bnlab.lab.figures import band, legend, plt, save
from bnlab.lab.results import CellResult, fmt
from bnlab.lab.table import Finding, RunsData

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


def swing_line(d: RunsData) -> list[str]:
    """By the claim's own measure, the swing, at C1's rate: its order and whether the seeds'
    spread separates it, said beside C1's contrast (the von Neumann sd removes the trend the
    swing reads)."""
    lr = ruling_rate(d)[0]
    if lr is None or cell(d, "bn", lr) is None or cell(d, "syncbn", lr) is None:
        return []
    order, b, s = swing_order(d, lr)
    if order is None:
        return []
    said = {"reversed": "reverses: BN's is the smaller", "the same": "agrees: BN's is the larger",
            "indistinguishable": f"{'reverses' if b.mean < s.mean else 'agrees'} by the means, "
            f"within the seeds' spread (sd {b.std or 0:.1f} and {s.std or 0:.1f}): "
            "indistinguishable"}[order]
    return ["", f"By the claim's own measure, the swing (half the range of val acc over the "
            f"plateau, mean over seeds), BN ±{b.mean:.1f} against SyncBN ±{s.mean:.1f} at lr "
            f"{lr:g}: the order {said}. The swing reads the plateau's climb and its slow moves "
            "as well; the von Neumann sd, C1's measure, removes the trend and reads the "
            "evaluation-to-evaluation jitter the claim is about."]


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
    lines += [*swing_line(d), "", *cost_section(d), "",
              "## Why BN jitters: the prediction against the measurement", "",
              *predictions(d), "",
              "Statistics part: the detrended variance of (val acc with the running statistics "
              "- val acc of the same weights with PreciseBN statistics); weights part: that of "
              "the PreciseBN series (bnlab.jitter.variance_split; twice their covariance makes "
              "up the rest, so a statistics share above 100% means the two co-vary negatively). "
              "On the plateau, the second half of training; mean ± sd over seeds. "
              "The prediction and the rules: below.", "",
              *rules.history(RULES, {"first_rates": c1_parts(without_added(d))[0]
                                     + seeds_to_come(without_added(d),
                                                     rates(without_added(d)))})]
    return table.runs_page(d, "\n".join(lines))


def plot(d: RunsData, path: Path) -> None:
    """The message first: each norm's plateau jitter by rate, C1's ratio written at the rate
    where SyncBN is steady; then the two cells' curves at that rate, labelled where they end;
    then the variance BN's running statistics cause, by rate."""
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2))
    ruled = ruling_rate(d)[0]
    ticks = [f"{page.rate(x).split(' (')[0].removeprefix('lr ')}\n"
             f"{page.rate(x).split(' (')[1].rstrip(')').replace(' of the default', ' default')}"
             for x in rates(d)]
    for ax, key, title, unit in (
            (axes[0], "vn_sd", "jitter on the plateau, by rate", "points"),
            (axes[2], None, "variance from BN's running statistics", "points squared")):
        for i, n in enumerate(NORMS):
            xs, ys = [], []
            for lr in rates(d):
                v = vals(cell(d, n, lr), key) if key else parts(cell(d, n, lr), "statistics")
                ax.plot([lr] * len(v), v, "o", color=f"C{i}", ms=3, alpha=0.4)
                if v:
                    xs.append(lr)
                    ys.append(mean(v))
            ax.plot(xs, ys, "-", color=f"C{i}", lw=2, label=n.replace("bn", "BN").replace(
                "syncBN", "SyncBN"))
        if key:
            for lr in rates(d):
                f = vals(cell(d, "syncbn", lr), "churn_floor")
                if f:
                    ax.plot([lr], [mean(f)], "_", color="black", ms=14,
                            label="the test set's noise floor" if lr == rates(d)[0] else None)
            if ruled is not None:
                c = contrast(d, ruled)
                ax.annotate(f"BN {c['ratio']:.2f}x SyncBN\n(95% CI {fmt(c['lo'], 2)} to "
                            f"{fmt(c['hi'], 2)});\nonly here is SyncBN steady",
                            (ruled, mean(vals(cell(d, "bn", ruled), key))), xytext=(12, 28),
                            textcoords="offset points", fontsize=9,
                            arrowprops={"arrowstyle": "->", "color": "0.3"})
        ax.set_xscale("log", base=2)
        ax.set_xticks(rates(d), ticks, fontsize=8)
        ax.set(title=title, xlabel="learning rate", ylabel=unit)
        ax.grid(alpha=0.3)
        legend(ax, 8)
    ax, at = axes[1], ruled or chosen(d)
    for i, n in enumerate(NORMS):
        c = cell(d, n, at)
        if c is not None and c.runs:
            band(ax, c, color=f"C{i}")
            ep, m, _, _ = c.mean_curve()
            ax.text(ep[-1], m[-1], f"  {n.replace('bn', 'BN').replace('syncBN', 'SyncBN')}",
                    color=f"C{i}", va="center", fontsize=9)
    ax.axvline(PLATEAU * 20, color="grey", ls=":", lw=1)
    ax.set(title=f"val accuracy at {page.rate(at)}", xlabel="epoch (dotted: the plateau "
           "starts)", ylabel="val accuracy (%)")
    ax.margins(x=0.12)
    ax.grid(alpha=0.3)
    head = ("C1: BN's jitter against SyncBN's, resnet20 at 4 ranks x 2" if ruled is None else
            f"BN jitters {contrast(d, ruled)['ratio']:.2f}x as much as SyncBN where SyncBN is "
            f"steady (C1 claimed ±10 against ±2), resnet20 at 4 ranks x 2")
    save(fig, path, head, empty=not any(c.runs for c in d.cells))


SAID = {"partly": "holds only partly", "reproduced": "reproduces",
        "not reproduced": "does not reproduce"}


def finding(d: RunsData) -> list[Finding]:
    """C1 in a sentence (the jitter measured where the control is steady, against the claimed
    swing and the rule's bar), and why BN jitters (prediction.why)."""
    v, _, _, _ = c1_parts(d)
    lr = ruling_rate(d)[0]
    if lr is None or v in ("not run yet", "untestable"):
        c1 = Finding(f"C1 (BN {CLAIMED.split(', ')[0].removeprefix('bn ')}, SyncBN "
                     f"{CLAIMED.split(', ')[1].removeprefix('syncbn ')}) is {v}: no rate where "
                     "SyncBN is steady has been ruled.", "lr", rules.mark(RULES), rank=3)
    else:
        c = contrast(d, lr)
        steady_rates = [r for r in rates(d) if steady(d, r).ok]
        only = (f"the one rate of {len(rates(d))} where SyncBN is steady"
                if len(steady_rates) == 1 else
                f"one of {len(steady_rates)} rates of {len(rates(d))} where SyncBN is steady")
        c1 = Finding(
            f"C1 (BN {CLAIMED.split(', ')[0].removeprefix('bn ')}, SyncBN "
            f"{CLAIMED.split(', ')[1].removeprefix('syncbn ')}) {SAID.get(v, v)}: on "
            f"{page.model(d.cells)} at {page.rate(lr)}, {only}, BN's jitter is {c['ratio']:.2f}x "
            f"SyncBN's (95% CI {fmt(c['lo'], 2)} to {fmt(c['hi'], 2)}); the rule asks "
            f"{REPRODUCED:g}x.", "lr", rules.mark(RULES), rank=3)
    return [c1, why(d, lr)]


TABLE = table.Table("lr", ("C1", "C3", "C4"), table.runs_data, render, verdicts, plot,
                    block="settled", headline="lr.png", finding=finding, rules="lr")
