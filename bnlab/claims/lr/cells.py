"""table-lr's cells: bn and syncbn at each rate, the control check at each rate (bnlab.lab.judge
by experiments/lr/rules.yaml), and the rate C1 is ruled at."""

from __future__ import annotations

import dataclasses
import math

from bnlab.lab import judge, rules
from bnlab.lab.analysis import p_above, ratio_interval
from bnlab.lab.results import CellResult, fmt
from bnlab.lab.table import RunsData

RULES = rules.read("lr")
NORMS = ("bn", "syncbn")
MIN_SEEDS = RULES["min_seeds"]        # seeds each cell needs before a rule applies
STEADY = RULES["steady"]              # the control is steady at most this x its churn floor
FLOOR_RATIO = RULES["floor_ratio"]    # bn's jitter above this x its churn floor: it moves
REPRODUCED = RULES["reproduced_ratio"]  # C1: bn's jitter at least this x syncbn's
SURVIVES = RULES["survives"]          # C4: the effect survives at another rate at this ratio
P1 = RULES["p1_ratio"]                # the prediction: bn's statistics part >= this x syncbn's
PREDICTED = RULES["predicted_ratio"]  # ...about this x, from the EMA's sampling noise
LEARNED = RULES["learned"]
SEPARATED = RULES["separated"]
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


vals, mean, Control = judge.vals, judge.mean, judge.Control


def ready(*cells: CellResult | None) -> bool:
    """Every cell has MIN_SEEDS finished seeds (diverged ones count as finished)."""
    return judge.ready(RULES, *cells)


def lost(c: CellResult) -> bool:
    """Fewer than MIN_SEEDS of the cell's seeds can have a jitter, whatever the seeds still to
    come give."""
    return judge.lost(RULES, c)


def steady(d: RunsData, lr: float) -> Control:
    """The control check (bnlab.lab.judge) on syncbn at `lr`."""
    return judge.control_check(RULES, cell(d, "syncbn", lr), lr)


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


def without_added(d: RunsData) -> RunsData:
    """The table as its spec first stood: without the rates added after some runs were seen."""
    return dataclasses.replace(d, cells=[c for c in d.cells if not c.cell.meta.get("added_later")])


def seeds_to_come(d: RunsData, among: list[float]) -> str:
    """" (so far: bn at lr 0.1: 3/5 seeds; ...)" for the cells at these rates still short of
    seeds, else empty."""
    short = [f"{n} at lr {r:g}: {c.seeds_note()} seeds" for r in among for n in NORMS
             if (c := cell(d, n, r)) is not None and len(c.runs) < c.expected]
    return f" (so far: {'; '.join(short)})" if short else ""

