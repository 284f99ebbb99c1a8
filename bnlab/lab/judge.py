"""The one judge: the comparisons every settled table rules with, each reading its thresholds
from the table's rules.yaml (bnlab.lab.rules). A claims module says which cells to compare and
what its claim makes of the result; the arithmetic and the states are here.

- the control check: does a control cell's jitter stand still (it learned, and its plateau
  jitter is at most `steady` x its own churn floor)?
- a paired gap with its t interval, and a paired jitter ratio with its log interval, over the
  seeds both cells ended without diverging; breaks / holds / unclear from the gap;
- "undecided while runs are to come": `ready`, `lost`, `complete`;
- seed extension: every cell cut to its first seeds (what the rules read before more seeds
  were added), and the cells a rule gives more seeds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from bnlab.lab.analysis import mean_interval
from bnlab.lab.results import CellResult, paired_kind
from bnlab.lab.rules import Rules
from bnlab.lab.table import RunsData, complete

__all__ = ["Control", "asks_more_seeds", "complete", "control_check", "first_seeds",
           "gap_state", "lost", "mean", "paired", "ratio_of_means", "ready", "shared", "vals"]


def vals(c: CellResult | None, key: str = "vn_sd") -> list[float]:
    return [] if c is None else c.jitter_values(key)


def mean(xs: list[float]) -> float | None:
    return float(np.mean(xs)) if xs else None


def ready(rules: Rules, *cells: CellResult | None) -> bool:
    """Every cell has min_seeds finished seeds (diverged ones count as finished)."""
    n = rules["min_seeds"]
    return all(c is not None and len(c.runs) >= min(n, c.expected) for c in cells)


def lost(rules: Rules, c: CellResult) -> bool:
    """Fewer than min_seeds of the cell's seeds can have a jitter, whatever the seeds still to
    come give."""
    return len(vals(c)) + max(c.expected - len(c.runs), 0) < rules["min_seeds"]


class Control(NamedTuple):
    """The control check at one rate: steady (None until it has run), why, and in few words."""

    ok: bool | None
    why: str
    short: str


def control_check(rules: Rules, sb: CellResult | None, lr: float,
                  name: str = "syncbn") -> Control:
    """The control check on a control cell (`name`) run at `lr`, by `rules`' min_seeds,
    learned and steady."""
    n = rules["min_seeds"]
    if not ready(rules, sb):
        return Control(None, f"{name} at lr {lr:g}: fewer than {n} seeds finished",
                       f"lr {lr:g} still to come")
    if len(vals(sb)) < n:
        why = f"{name} at lr {lr:g}: {sb.diverged} of {len(sb.runs)} seeds diverged"
        return Control(False, why, f"diverged at lr {lr:g}")
    acc, vn, floor = mean(vals(sb, "plateau_acc")), mean(vals(sb)), mean(vals(sb, "churn_floor"))
    if acc < rules["learned"]:
        return Control(False, f"{name} at lr {lr:g} does not learn ({acc:.1f}% on the plateau)",
                       f"does not learn at lr {lr:g}")
    ratio, bound = (vn / floor if floor else math.inf), rules["steady"]
    text = (f"{name} at lr {lr:g}: jitter {vn:.2f} = {ratio:.1f}x its churn floor {floor:.2f} "
            f"({'steady' if ratio <= bound else 'not steady'}: the bound is {bound:g}x)")
    return Control(ratio <= bound, text, f"{ratio:.1f}x its floor at lr {lr:g}")


def pairs(c: CellResult, ref: CellResult) -> tuple[list[float], list[float], list[int]]:
    """(gaps, log jitter ratios, seeds where only the cell diverged), over the seeds both ran.
    A gap is the reference's plateau accuracy minus the cell's: positive = accuracy lost."""
    mine, theirs = {r.seed: r for r in c.runs}, {r.seed: r for r in ref.runs}
    gaps, logs, gone = [], [], []
    for s in sorted(set(mine) & set(theirs)):
        a, b = mine[s], theirs[s]
        if a.diverged and not b.diverged:
            gone.append(s)
        if a.diverged or b.diverged:
            continue
        ja = a.jitter(c.epochs, paired_kind(c.kind, ref.kind))
        jb = b.jitter(ref.epochs, paired_kind(ref.kind, c.kind))
        if ja.get("plateau_acc") is not None and jb.get("plateau_acc") is not None:
            gaps.append(jb["plateau_acc"] - ja["plateau_acc"])
        if (ja.get("vn_sd") or 0) > 0 and (jb.get("vn_sd") or 0) > 0:
            logs.append(math.log(ja["vn_sd"] / jb["vn_sd"]))
    return gaps, logs, gone


def paired(c: CellResult, ref: CellResult) -> dict:
    """The cell against its reference, paired on the seed: gap (mean, 95% t interval), jitter
    ratio (geometric mean, 95% t interval on the logs), their counts, the seeds only the cell
    diverged on."""
    gaps, logs, gone = pairs(c, ref)
    lo, hi = mean_interval(gaps)
    llo, lhi = mean_interval(logs)
    return {"gap": float(np.mean(gaps)) if gaps else math.nan, "lo": lo, "hi": hi,
            "n": len(gaps), "jitter": math.exp(float(np.mean(logs))) if logs else math.nan,
            "jlo": math.exp(llo) if llo is not None else None,
            "jhi": math.exp(lhi) if lhi is not None else None, "jn": len(logs), "lost": gone}


def gap_state(rules: Rules, gap: float, lo: float | None, hi: float | None, n: int) -> str:
    """breaks, holds or unclear, from the paired gap's mean and interval (rules.yaml `states`)."""
    if n < rules["min_seeds"] or lo is None or hi is None:
        return "unclear"
    if gap >= rules["break_points"] and lo > 0:
        return "breaks"
    if gap < rules["break_points"] and hi < rules["hold_bound"]:
        return "holds"
    return "unclear"


def ratio_state(rules: Rules, jlo: float | None, n: int, steady_ref: bool) -> str:
    """The jitter ratio's state: untestable where the reference is not steady, unclear under
    min_seeds pairs, higher where the interval lies above 1, else not higher."""
    if not steady_ref:
        return "untestable"
    if n < rules["min_seeds"] or jlo is None:
        return "unclear"
    return "higher" if jlo > 1 else "not higher"


def shared(ref: CellResult, c: CellResult) -> CellResult:
    """The reference over the cell's own seeds: seeds a rule gives the reference for another
    cell change nothing of this one."""
    if ref is c:
        return ref
    seeds = set(c.cell.seeds)
    return replace(ref, runs=[r for r in ref.runs if r.seed in seeds],
                   expected=len(seeds & set(ref.cell.seeds)))


def first_seeds(d: RunsData, n: int) -> RunsData:
    """Every cell cut to its first `n` seeds: the data as the rules read them before a seed
    extension."""
    cut = []
    for c in d.cells:
        keep = sorted(c.cell.seeds)[:n]
        cut.append(replace(c, cell=replace(c.cell, seeds=keep),
                           runs=[r for r in c.runs if r.seed in keep],
                           expected=min(c.expected, len(keep))))
    return replace(d, cells=cut)


def asks_more_seeds(d: RunsData, n: int, measure: Callable[[RunsData, CellResult], dict | None],
                    reference: Callable[[RunsData, CellResult], CellResult]
                    ) -> list[CellResult]:
    """The seed extension: the cells that, on their first `n` seeds, are unclear on exactly
    `n` seed pairs because their interval is too wide (not a divergence, not a missing count,
    `measure`'s "why" empty), with their references (`reference`), as cells of `d`."""
    first = first_seeds(d, n)
    asked = set()
    for c in first.cells:
        m = measure(first, c)
        if m is not None and m["state"] == "unclear" and not m["why"] and m["n"] == n:
            asked |= {c.cell.label, reference(first, c).cell.label}
    return [c for c in d.cells if c.cell.label in asked]


def ratio_of_means(num: list[float], den: list[float], draws: int = 10_000
                   ) -> tuple[float, float | None, float | None]:
    """mean(num) / mean(den) over paired seeds (num[i] and den[i] from seed i), with a 95%
    percentile bootstrap interval that resamples seeds (a draw takes both of a seed's numbers)
    from a fixed generator; nan where the denominator's mean is not positive, no interval under
    2 seeds."""
    a, b = np.asarray(num, float), np.asarray(den, float)
    if len(a) == 0 or b.mean() <= 0:
        return math.nan, None, None
    if len(a) < 2:
        return float(a.mean() / b.mean()), None, None
    idx = np.random.default_rng(0).integers(0, len(a), (draws, len(a)))
    sa, sb = a[idx].sum(1), b[idx].sum(1)
    r = sa[sb > 0] / sb[sb > 0]
    return float(a.mean() / b.mean()), float(np.quantile(r, 0.025)), float(np.quantile(r, 0.975))
