"""A pilot's choice rule, kept as data beside its sweep (experiments/<name>/rules.yaml), and the
one function that applies it: per fix, the candidate cell (a rate, and a setting where the fix
has one) with the best held-out score; ties within `tie_points` broken by the preferred setting,
then the smallest rate; one more rate past a ladder's edge where the choice lands on it.

A cell's spec entry carries `fix`, `lr` and, for a fix with a setting, that setting's key
(`prefer` names it); a rate the edge rule added carries `edge: true`. Nothing here types a
number: scores come from the runs' logs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from bnlab.errors import BnlabError
from bnlab.lab.results import CellResult


@dataclass
class Rules:
    """rules.yaml, read: the tie, the preferred settings, the versions with their history."""

    tie: float
    prefer: dict[str, tuple[str, list]]  # fix -> (setting key, values best first)
    versions: list[dict]
    text: dict[str, str]                 # score, candidate, choose, edge, ... in words
    measure: str = "plateau"             # plateau: the second half's mean | end: the last tenth's
    edge_factor: float = 4.0             # the rate added past a ladder's edge: x or / this

    @classmethod
    def read(cls, path: Path) -> Rules:
        if not path.is_file():
            raise BnlabError(f"no rules at {path}; a pilot's rule is written there before its "
                             "runs.")
        raw = yaml.safe_load(path.read_text())
        prefer = {fix: (p["key"], list(p["order"])) for fix, p in raw.get("prefer", {}).items()}
        text = {k: v for k, v in raw.items() if isinstance(v, str)}
        measure = raw.get("measure", "plateau")
        if measure not in ("plateau", "end"):
            raise BnlabError(f"{path}: measure '{measure}' is unknown; write plateau or end.")
        return cls(float(raw["tie_points"]), prefer, raw["versions"], text, measure,
                   float(raw.get("edge_factor", 4.0)))


def accs(c: CellResult, measure: str = "plateau") -> list[float]:
    """Each finished seed's held-out accuracy by `measure`: the plateau's mean (the second
    half of training) or the end's (the evaluations of its last tenth)."""
    if measure == "end":
        vals = [r.end_acc(c.epochs) for r in c.runs]
        return [v for v in vals if v is not None]
    return c.jitter_values("plateau_acc")


def score(c: CellResult, rules: Rules | None = None) -> float | None:
    """Mean held-out accuracy (by the rules' measure) over the cell's seeds; None unless every
    seed completed and none diverged (no candidate)."""
    if len(c.runs) < c.expected or c.diverged:
        return None
    vals = accs(c, rules.measure if rules else "plateau")
    return float(np.mean(vals)) if len(vals) == c.expected else None


def setting(c: CellResult, rules: Rules) -> object:
    """The cell's value of its fix's setting (None for a fix without one)."""
    key = rules.prefer.get(c.cell.meta["fix"], (None,))[0]
    return c.cell.meta.get(key) if key else None


def fixes(cells: list[CellResult]) -> dict[str, list[CellResult]]:
    """The cells by fix, in spec order."""
    out: dict[str, list[CellResult]] = {}
    for c in cells:
        out.setdefault(c.cell.meta["fix"], []).append(c)
    return out


def choose(cells: list[CellResult], rules: Rules) -> dict:
    """One fix's choice: {state, cell, why, edge}, and `beyond` where chosen. state: "chosen",
    "undecided" (a cell lacks a seed), "needs a rate" (the choice sits on its ladder's edge:
    `edge` is the rate to add) or "no candidate" (every cell diverged). `beyond`: where the
    choice stays on its ladder's edge after the rule's one added rate, the next rate out, else
    None."""
    waiting = [c for c in cells if len(c.runs) < c.expected]
    if waiting:
        return {"state": "undecided", "cell": None, "edge": None,
                "why": f"runs still to come ({len(waiting)} of {len(cells)} cells lack seeds)"}
    scored = [(c, score(c, rules)) for c in cells]
    ok = [(c, s) for c, s in scored if s is not None]
    if not ok:
        return {"state": "no candidate", "cell": None, "edge": None,
                "why": "every cell diverged in a seed"}
    best = max(s for _, s in ok)
    tied = [c for c, s in ok if s >= best - rules.tie]
    order = rules.prefer.get(cells[0].cell.meta["fix"], (None, [None]))[1]

    def rank(c: CellResult) -> tuple:
        v = setting(c, rules)
        return (order.index(v) if v in order else len(order), c.cell.meta["lr"])

    pick = min(tied, key=rank)
    rates = sorted({c.cell.meta["lr"] for c in cells if setting(c, rules) == setting(pick,
                                                                                       rules)})
    lr, edge = pick.cell.meta["lr"], None
    extended = any(c.cell.meta.get("edge") for c in cells)  # the rule adds a rate once
    if len(rates) > 1 and lr in (rates[0], rates[-1]) and not extended:
        f = rules.edge_factor
        edge = lr / f if lr == rates[0] else lr * f
    top = max(ok, key=lambda cs: cs[1])[0]
    why = (f"best {best:.1f}% ({top.cell.label}); within {rules.tie:g} point: "
           f"{len(tied)} cell(s); the rule takes {pick.cell.label}")
    lost = [c.cell.label for c, s in scored if s is None]
    if lost:
        why += f"; diverged in a seed: {', '.join(lost)}"
    if edge is not None:
        return {"state": "needs a rate", "cell": pick, "edge": edge,
                "why": why + f"; it lies on its ladder's edge, so the rule adds lr {edge:g}"}
    beyond = None  # still on the edge after the rate the rule added: the next rate out
    if extended and len(rates) > 1 and lr in (rates[0], rates[-1]):
        beyond = lr / rules.edge_factor if lr == rates[0] else lr * rules.edge_factor
        why += ("; still on its ladder's edge after the rate the rule added (the rule adds one "
                "once), so a rate beyond it might do better")
    return {"state": "chosen", "cell": pick, "edge": None, "beyond": beyond, "why": why}


def choices(cells: list[CellResult], rules: Rules) -> dict[str, dict]:
    return {fix: choose(cs, rules) for fix, cs in fixes(cells).items()}
