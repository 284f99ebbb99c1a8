"""What bnlab measured about the fixes at the break, for the doctor's fix line: read from
experiments/recover/advice.json, which `make table-recover` writes from its runs once every fix
has its seeds (bnlab/claims/recover.py). Nothing here types a result."""

from __future__ import annotations

import json

from bnlab.paths import EXPERIMENTS

ADVICE = EXPERIMENTS / "recover" / "advice.json"
TABLE = "make table-recover: experiments/recover/table.md"


def said(entry: dict) -> str:
    """'gn recovers 62% of BN's loss (95% CI 40 to 84)', or its state where no share."""
    if entry.get("share") is None:
        return f"{entry['fix']}: {entry['state']}"
    ci = "" if entry.get("lo") is None else \
        f" (95% CI {100 * entry['lo']:.0f} to {100 * entry['hi']:.0f})"
    return f"{entry['fix']} recovers {100 * entry['share']:.0f}% of BN's loss{ci}"


def without_communication() -> str:
    """The doctor's line on fixes that need no communication: the best one table-recover
    measured at 4 ranks x 2, citing it; or that it has not been measured yet."""
    try:
        advice = json.loads(ADVICE.read_text())
        line = f"without communication, at {advice['where']}: {said(advice['best_free'])}"
    except (OSError, ValueError, KeyError, TypeError):
        return ("without communication: which fix recovers most at the break has not been "
                f"measured yet ({TABLE}); the lines below are options, not yet ranked at the "
                "break")
    return f"{line} ({TABLE})"
