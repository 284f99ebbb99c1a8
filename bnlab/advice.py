"""What bnlab measured about the fixes at the break, for the doctor's fix line: read from
experiments/recover/advice.json, which `make table-recover` writes from its runs once every fix
has its seeds (bnlab/claims/recover.py). Nothing here types a result."""

from __future__ import annotations

import json

from bnlab.paths import EXPERIMENTS

ADVICE = EXPERIMENTS / "recover" / "advice.json"
TABLE = "make table-recover: experiments/recover/table.md"


def said(entry: dict) -> str:
    """'GroupNorm (gn) gets back 62% of BN's loss (95% CI 40 to 84): partly'; where it ends
    below bn, 'GroupNorm (gn) ends 4.1 points below BN (share of BN's loss recovered -45%, 95%
    CI -60 to -30): no better'; its state alone where it has no share."""
    fix = entry["fix"] if entry.get("name") is None else f"{entry['name']} ({entry['fix']})"
    if entry.get("share") is None:
        return f"{fix}: {entry['state']}"
    ci = "" if entry.get("lo") is None else \
        f"95% CI {100 * entry['lo']:.0f} to {100 * entry['hi']:.0f}"
    if entry["share"] < 0:
        return (f"{fix} ends {-entry['gain']:.1f} points below BN (share of BN's loss "
                f"recovered {100 * entry['share']:.0f}%{', ' + ci if ci else ''}): "
                f"{entry['state']}")
    return (f"{fix} gets back {100 * entry['share']:.0f}% of BN's loss"
            f"{f' ({ci})' if ci else ''}: {entry['state']}")


def read() -> dict | None:
    """advice.json as `make table-recover` wrote it; None where it is missing or unreadable."""
    try:
        advice = json.loads(ADVICE.read_text())
    except (OSError, ValueError):
        return None
    return advice if isinstance(advice, dict) else None


def measured(fix: str) -> str:
    """What table-recover measured for `fix` at 4 ranks x 2, for the doctor's line on it:
    '; table-recover at 4 ranks x 2 on resnet20 (CIFAR-10): GroupNorm (gn) ...'; empty while
    it has not measured it."""
    advice = read()
    try:
        return f"; table-recover at {advice['where']}: {said(advice['fixes'][fix])}"
    except (KeyError, TypeError, AttributeError):
        return ""


def without_communication(options: str = "the lines below are options") -> str:
    """The doctor's line on fixes with no per-step communication (PreciseBN's all-reduce comes
    once per recalibration): the best one table-recover measured at 4 ranks x 2 (or that none
    did better than BN, and the closest), citing it; or that it has not been measured yet, and
    where the options are (`options`: the doctor's lines below them; bnlab.diagnose names the
    doctor)."""
    advice = read()
    try:
        free = advice["best_free"]
        line = f"without per-step communication, at {advice['where']}: " + (
            f"none did better than BN; the closest, {said(free)}"
            if free["state"] == "no better" else said(free))
    except (KeyError, TypeError, AttributeError):
        return ("without per-step communication: which fix recovers most at the break has not been "
                f"measured yet ({TABLE}); {options}, not yet ranked at the break")
    return f"{line} ({TABLE})"
