"""table-lr's statistics' cost: what `bnlab diagnose` reports for a trained model (val acc with
PreciseBN statistics minus with the running statistics), read from these runs' own logs at every
plateau evaluation, bn against syncbn by experiments/lr/rules.yaml's `cost` rule."""

from __future__ import annotations

import numpy as np

from bnlab import jitter
from bnlab.claims.lr.cells import MIN_SEEDS, NORMS, RULES, cell, rates, ruling_rate
from bnlab.lab import page
from bnlab.lab.analysis import Stat, diff_interval
from bnlab.lab.results import SERIES, CellResult, fmt
from bnlab.lab.table import RunsData

BN_LARGER, SYNCBN_LARGER, SAME = ("bn's cost is larger", "syncbn's cost is larger",
                                  "indistinguishable")


def costs(c: CellResult | None) -> list[float]:
    """Per run, the plateau mean of (PreciseBN val acc - running-statistics val acc), in
    points, over the evaluations that logged both (the same weights, evaluated twice)."""
    out = []
    for r in (c.runs if c else []):
        if r.diverged:
            continue
        running = dict(zip(*r.series(SERIES["ema"][0]), strict=True))
        diffs = [p - running[e] for e, p in zip(*r.series(SERIES["precise"][0]), strict=True)
                 if e in running and jitter.on_plateau(e, c.epochs)]
        if diffs:
            out.append(float(np.mean(diffs)))
    return out


def outcome(bn: list[float], syncbn: list[float]) -> tuple[str, float | None, float | None]:
    """The rule's state for bn's costs against syncbn's, and the interval of the difference."""
    if min(len(bn), len(syncbn)) < MIN_SEEDS:
        return "untestable", None, None
    lo, hi = diff_interval(bn, syncbn)
    return (BN_LARGER if lo > 0 else SYNCBN_LARGER if hi < 0 else SAME), lo, hi


def by_rate(d: RunsData) -> list[dict]:
    """Each rate's costs, the difference's interval and the rule's state there."""
    out = []
    for lr in rates(d):
        bn, sb = costs(cell(d, "bn", lr)), costs(cell(d, "syncbn", lr))
        state, lo, hi = outcome(bn, sb)
        out.append({"lr": lr, "bn": bn, "syncbn": sb, "lo": lo, "hi": hi, "state": state,
                    "diff": float(np.mean(bn) - np.mean(sb)) if bn and sb else None})
    return out


def ruled(d: RunsData) -> dict | None:
    """The rule's reading at C1's rate, None where C1 has no rate."""
    lr = ruling_rate(d)[0]
    return next((r for r in by_rate(d) if r["lr"] == lr), None)


def section(d: RunsData) -> list[str]:
    """The page's section: the cost per rate and norm, the difference, the ruled line."""
    rows = [[f"{r['lr']:g}", *(Stat.of(r[n]).fmt(2) for n in NORMS),
             "-" if r["diff"] is None else f"{r['diff']:+.2f}",
             "-" if r["lo"] is None else f"{r['lo']:+.2f} to {r['hi']:+.2f}", r["state"]]
            for r in by_rate(d)]
    at = ruled(d)
    said = ("C1 has no rate to rule at yet, so neither has this rule." if at is None else
            f"Ruled at C1's rate, lr {at['lr']:g}: **{at['state']}** (bn minus syncbn "
            f"{fmt(at['diff'], 2)} points, 95% interval {fmt(at['lo'], 2)} to "
            f"{fmt(at['hi'], 2)}); the other rates are shown, not ruled.")
    return ["## What the running statistics cost in accuracy (what `bnlab diagnose` reports)", "",
            page.md_table(["lr", "bn: cost (pts)", "syncbn: cost (pts)",
                           "bn - syncbn (pts)", "95% Welch interval", "state"], rows), "",
            said, "",
            f"Rule (experiments/lr/rules.yaml, `cost`): {RULES.words('rules', 'cost')}. "
            "Written after these runs, once table-fixes' C8 row had published a close measure "
            "on them (the same difference at the plateau's epoch ends, at C1's rate; version "
            "\"added cost\" below): the ruled line confirms that reading on every plateau "
            "evaluation rather than testing a new one. Cost: "
            "val acc with PreciseBN statistics minus with the running statistics, the same "
            "weights at each plateau evaluation, averaged over the plateau; mean ± sd over "
            "seeds. A positive cost is accuracy the running statistics lose and PreciseBN "
            "wins back (`bnlab.precise_bn`); it says nothing of what training on 2 images a "
            "rank did to the weights themselves."]
