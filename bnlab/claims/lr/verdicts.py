"""table-lr's verdicts on C1, C3 and C4, by experiments/lr/rules.yaml."""

from __future__ import annotations

from bnlab.claims.lr.cells import (
    CLAIMED,
    FLOOR_RATIO,
    LEARNED,
    MIN_SEEDS,
    PENDING,
    RUNS_TO_COME,
    SEPARATED,
    STEADY,
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
from bnlab.lab import table
from bnlab.lab.results import fmt
from bnlab.lab.table import RunsData, Verdict


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
    glance = (f"jitter (von Neumann sd, not a swing) bn {mean(vals(bn)):.2f} vs syncbn "
              f"{mean(vals(cell(d, 'syncbn', lr))):.2f} pts, {c['ratio']:.2f}x (95% CI "
              f"{fmt(c['lo'], 2)} to {fmt(c['hi'], 2)}) at lr {lr:g}" + note)
    told, _ = disclosure(d, lr)
    return v, f"{c['text']}{note}; {why}", RULE_C1 + told, glance


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

