"""table-lr's prediction, written before its runs (experiments/lr/rules.yaml `rules: prediction`):
each cell's variance split into the running statistics' part and the weights' part, against
S(norm, lr) = a_norm + b lr^2 with a_bn = 4 a_syncbn (P1-P3)."""

from __future__ import annotations

import math

import numpy as np

from bnlab.claims.lr.cells import (
    MIN_SEEDS,
    NORMS,
    P1,
    PREDICTED,
    RULES,
    cell,
    mean,
    rates,
    ready,
)
from bnlab.lab import page, rules
from bnlab.lab.analysis import ratio_interval
from bnlab.lab.results import CellResult, fmt, split
from bnlab.lab.table import Finding, RunsData


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
        marks["P1"] = "agrees" if ratio[lowest] >= P1 else "disagrees"
    p1 = (f"{ratio[lowest]:.2f}x ({interval(d, lowest)}): {marks['P1']}."
          if lowest in rs else "its seeds are still to come." if lowest in coming else
          "too few of its seeds left after divergence: not checked.")
    out = [f"- P1, bn's statistics part at least {P1:g}x syncbn's at the lowest rate ({lowest:g}; "
           f"the model behind it, a_bn = {PREDICTED:g} a_syncbn, gives about {PREDICTED:g}x): "
           f"{p1}",
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
                   + ", ".join(f"{lr:g}: bn / syncbn statistics part {ratio[lr]:.2f}x "
                               f"({interval(d, lr)}), syncbn's {sb[lr]:.2f} points²"
                               for lr in late) + ".")
        out += fit_line(d, done, "The same fit with them")
    return out, marks


def interval(d: RunsData, lr: float) -> str:
    """'95% CI 0.92 to 1.68': the bootstrap interval of bn's over syncbn's statistics part."""
    lo, hi = ratio_interval(*(parts(cell(d, n, lr), "statistics") for n in NORMS))
    return f"95% CI {fmt(lo, 2)} to {fmt(hi, 2)}"


def why(d: RunsData, ruled: float | None = None) -> Finding:
    """Why BN jitters, in a sentence: bn's over syncbn's statistics part at the lowest rate the
    prediction was written for (P1's test) and at `ruled` (C1's rate, where it differs), with
    their bootstrap intervals, against P1's bound."""
    m = judged(d)[1]
    if "P1" not in m:
        return Finding("Why BN jitters (the prediction written before table-lr's runs): its "
                       "runs are still to come.", "lr", rank=5)
    low, ratio = predicted_rates(d)[0], m["ratio"]
    added = ruled is not None and ruled != low and ruled in ratio
    later = (f"; {ratio[ruled]:.2f}x ({interval(d, ruled).removeprefix('95% CI ')}) at "
             f"{page.rate(ruled).split(' (')[0].removeprefix('lr ')}, added later"
             if added else "")
    met = f"as predicted beforehand ({P1:g}x or more)" if m["P1"] == "agrees" else \
        f"not the {P1:g}x or more predicted beforehand"
    return Finding(
        f"Why BN jitters: on {page.model(d.cells)} at lr {page.short(low)}, BN's running "
        f"statistics add {ratio[low]:.2f}x the jitter variance SyncBN's add ({interval(d, low)}), "
        f"{met}"
        f"{later}.", "lr",
        rules.mark(RULES) if added else "", rank=5)


def fit_line(d: RunsData, among: list[float], what: str) -> list[str]:
    f = fit(d, among)
    if f is None:
        return []
    rel = f["a_bn"] / f["a_syncbn"] if f["a_syncbn"] > 0 else math.nan
    return [f"- {what} to the {f['n']} cell means: a_bn {f['a_bn']:.2f}, a_syncbn "
            f"{f['a_syncbn']:.2f} points² (a_bn / a_syncbn {rel:.1f}; {PREDICTED:g} predicted), "
            f"b {f['b']:.0f} points² per lr²."]

