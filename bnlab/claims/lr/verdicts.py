"""table-lr's verdicts on C1, C3 and C4, by experiments/lr/rules.yaml."""

from __future__ import annotations

from bnlab.claims.lr.cells import (
    CLAIMED,
    FLOOR_RATIO,
    LEARNED,
    MIN_SEEDS,
    PENDING,
    REPRODUCED,
    RULES,
    RUNS_TO_COME,
    SEPARATED,
    SURVIVES,
    cell,
    chosen,
    contrast,
    lost,
    mean,
    rates,
    ready,
    ruling_rate,
    seeds_to_come,
    settled_rate,
    steady,
    vals,
    without_added,
)
from bnlab.lab import page, rules, table
from bnlab.lab.analysis import Stat
from bnlab.lab.results import fmt
from bnlab.lab.table import RunsData, Verdict


def outcome(c: dict) -> str:
    """C1's outcome from the contrast at a rate whose control is steady and where enough of
    bn's seeds are left."""
    if c["bn_acc"] is None or c["bn_acc"] < LEARNED:
        return "untestable"
    if c["p"] is None or c["p"] > SEPARATED:
        return "not reproduced"
    return "reproduced" if c["ratio"] >= REPRODUCED and (c["over"] or 0) >= FLOOR_RATIO \
        else "partly"


RULE_C1 = (f"Rule: {RULES.words('rules', 'control')}. {RULES.words('rules', 'C1')}. Effect "
           "size: the ratio of mean jitters with a 95% bootstrap interval over seeds. "
           "Thresholds: " + rules.said(RULES, "steady", "learned", "separated",
                                       "reproduced_ratio", "floor_ratio", "min_seeds") + ".")


def disclosure(d: RunsData, lr: float | None) -> str:
    """The rules' versions written after their data were seen (bnlab.lab.rules.disclosure),
    with what the rule gives on the spec's first rates alone where C1 is ruled at a rate added
    after other rates' runs were seen (that version left out elsewhere)."""
    c = cell(d, "syncbn", lr) if lr is not None else None
    old = None
    if c is not None and c.cell.meta.get("added_later"):
        first = without_added(d)
        old = (f"on the spec's first rates alone ({', '.join(f'{r:g}' for r in rates(first))}) "
               f"{c1_parts(first)[0]}{seeds_to_come(first, rates(first))}")
    return rules.disclosure(RULES, {"first_rates": old})


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
    order, b, s = swing_order(d, lr)
    swing = "" if order is None else f"; by the swing {order}, {b.mean:.1f} vs {s.mean:.1f}"
    glance = (f"von Neumann sd bn {mean(vals(bn)):.2f} vs syncbn "
              f"{mean(vals(cell(d, 'syncbn', lr))):.2f}, {c['ratio']:.2f}x ({fmt(c['lo'], 2)} "
              f"to {fmt(c['hi'], 2)}) at lr {page.short(lr)}{swing}" + note)
    return v, f"{c['text']}{note}; {why}", RULE_C1 + disclosure(d, lr), glance


def swing_order(d: RunsData, lr: float) -> tuple[str | None, Stat, Stat]:
    """The claim's own measure, bn's swing against syncbn's at `lr` (mean and sd over seeds),
    in a word (order_of), with both."""
    b, s = (cell(d, n, lr).jstat("swing") for n in ("bn", "syncbn"))
    return order_of(b, s), b, s


def order_of(b: Stat, s: Stat) -> str | None:
    """'indistinguishable' where bn's and syncbn's means differ by no more than the seeds'
    spread (the larger sd), else 'reversed' (bn's the smaller) or 'the same' (bn's the
    larger); None where either is missing."""
    if b.mean is None or s.mean is None:
        return None
    spread = max((x for x in (b.std, s.std) if x is not None), default=0.0)
    return "indistinguishable" if abs(b.mean - s.mean) <= spread else \
        "reversed" if b.mean < s.mean else "the same"


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
                   "C1's contrast: 1x8 bn computes exactly what syncbn 4x2 does")


def c4(d: RunsData) -> Verdict:
    base, _, _, _ = c1_parts(d)
    lr0 = ruling_rate(d)[0]
    rule = (f"Rule: {RULES.words('rules', 'C4')}; a rate where fewer than min_seeds of bn's "
            "seeds are left after divergence does not count. Thresholds: "
            + rules.said(RULES, "separated", "survives", "min_seeds") + "."
            + disclosure(d, lr0))
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

