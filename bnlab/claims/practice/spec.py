"""table-practice's cells and its spec, written from table-practicepilot's choices (the length
and each batch-free fix's rate): every fix at its best, in running order."""

from __future__ import annotations

import json
from pathlib import Path

from bnlab.claims import practicepilot
from bnlab.claims.frompilot import write_from_pilot
from bnlab.errors import BnlabError
from bnlab.lab import rules, table
from bnlab.paths import EXPERIMENTS, MEASURED

RULES = rules.read("practice")
SPEC = EXPERIMENTS / "practice" / "sweep.yaml"
PUBLISHED = json.loads((MEASURED / "published.json").read_text())["wu_he_2018"]
SEEDS = list(range(RULES["min_seeds"]))
RANKS = 8
BATCHES = (16, 8, 4, 2)       # images per rank; global batch 128 .. 16
NORMS = ("bn", "gn", "gnws")  # at every per-rank batch
FREE = ("gn", "gnws", "evonorm")  # their rates come from the pilot
NAMES = {"bn": "BN", "gn": "GroupNorm", "gnws": "GroupNorm + WS", "syncbn4": "SyncBN in groups "
         "of 4 ranks", "frozen_bn": "frozen BN", "brn": "Batch Renorm",
         "precise": "BN + PreciseBN before each evaluation", "evonorm": "EvoNorm-S0"}
# the doctor's thresholds as they stood when rule `doctor` was written (version 2, a373884:
# MIN_IMAGES, MIN_VALUES in bnlab/defaults.py): the ones it judges, kept where doctor_change
# has since moved bnlab's, so that the judgment reads the same after the change it made
JUDGED = (8, 16)
BRN_RAMP = "norm.ramp_of_run={hold:0.03125,r_ramp:0.25,d_ramp:0.15625}"  # the paper's 5k/40k/25k
# of its 160k steps



def fix_overrides(fix: str, length: int, lr: float) -> list[str]:
    """The overrides of one fix (beyond the per-rank batch and the length)."""
    return {"bn": ["norm=bn"],
            "gn": ["norm=gn", "norm.groups=8", f"optim.lr={lr:g}"],
            "gnws": ["norm=gnws", "norm.groups=8", f"optim.lr={lr:g}"],
            "evonorm": ["norm=evonorm", "norm.groups=8", "norm.placement=norm_act",
                        f"optim.lr={lr:g}"],
            "syncbn4": ["norm=syncbn", "norm.sync_group=4"],
            "frozen_bn": ["norm=frozen_bn", f"norm.freeze_after={length // 2}"],
            "brn": ["norm=brn", "norm.r_max=1.5", "norm.d_max=0.5", "norm.momentum=0.01",
                    BRN_RAMP],
            "precise": ["norm=bn", "precise_bn.before_eval=true"]}[fix]


def spec_cells(length: int, rates: dict[str, float]) -> list[dict]:
    """Every cell, in running order: the 8 x 16 reference and the 8 x 2 cells, then gn and
    gnws at 8 x 16, then 8 x 4, then gn at twice the length, then 8 x 8 (cut first). 8 x 4
    runs before the longer gn runs, so that its 120-epoch runs land while those wait (rules
    version 5)."""
    def cell(fix: str, b: int, order: int, epochs: int = length) -> dict:
        lr = rates.get(fix, 0.1)
        longer = epochs != length
        return {"label": f"{fix} {RANKS}x{b}" + (f" ({epochs} epochs)" if longer else ""),
                "fix": fix, "per_rank": b, "lr": lr, "longer": longer, "order": order,
                "overrides": [*fix_overrides(fix, epochs, lr), f"batch_per_gpu={b}",
                              f"epochs={epochs}"]}

    cells = [cell("bn", 16, 0)]
    cells += [cell(f, 2, 0) for f in (*NORMS, "syncbn4", "frozen_bn", "brn", "precise",
                                      "evonorm")]
    cells += [cell(f, 16, 1) for f in ("gn", "gnws")]
    cells += [cell(f, 4, 2) for f in NORMS]
    cells += [cell("gn", b, 3, 2 * length) for b in (16, 2)]
    cells += [cell(f, 8, 4) for f in NORMS]
    return cells


def pilot_picks(ctx: table.Context) -> dict[str, dict]:
    """The pilot's choices (practicepilot.choices) from its runs where `ctx` reads runs."""
    return practicepilot.choices(table.runs_data(table.Context(
        practicepilot.TABLE, runs=ctx.runs, tag=ctx.tag, data=ctx.data)))


def pilot_choices(data: str | None = None) -> tuple[int, dict[str, float]]:
    """The length and each batch-free fix's rate from the pilot's committed runs; a BnlabError
    while any is not chosen."""
    picks = pilot_picks(table.Context(practicepilot.TABLE, data=data))
    open_ = [f"{k} ({p['state']})" for k, p in picks.items()
             if p["state"] not in ("chosen", "not settled")]
    if open_ or set(FREE) - set(picks):
        raise BnlabError(f"the pilot has not chosen everything yet: {', '.join(open_) or 'a fix'}"
                         "; run `make table-practicepilot` until each is chosen.")
    return picks["length"]["length"], {f: picks[f]["cell"].cell.meta["lr"] for f in FREE}


def pilot_caveats(ctx: table.Context) -> tuple[str, ...]:
    """What the pilot's held-out runs say of a choice they gave that is not plainly settled: a
    length that no doubling settled (the longest tried is used), a rate still on its ladder's
    edge after the rate its rule added."""
    picks = pilot_picks(ctx)
    n = picks["length"]
    said = [f"the length is not settled: every doubling it tried added "
            f"{practicepilot.gain_points():g} point or more, so {n['length']} epochs, the "
            "longest tried, is used and the reference may not have reached its plateau"] \
        if n["state"] == "not settled" else []
    for f in FREE:
        p = picks.get(f, {})
        if p.get("beyond") is not None:
            c = p["cell"]
            end = "highest" if p["beyond"] > c.cell.meta["lr"] else "lowest"
            said.append(f"{NAMES[f]}'s rate, {c.cell.meta['lr']:g} at global batch 128 (chosen "
                        f"at {RANKS} x {c.cell.cfg['batch_per_gpu']} over {c.epochs} epochs), "
                        f"is the {end} its pilot tried, even with the rate its rule added, so "
                        f"{p['beyond']:g} might do better")
    return tuple(said)


HEADER = [
    "make table-practice: Wu and He's batch-size experiment at CIFAR scale (rules.yaml beside",
    "this file, written before any of its runs). Written from table-practicepilot's choices",
    "(the length, each batch-free fix's rate) by `python -m bnlab.claims practice-spec`.",
    "Run order: the 8 x 16 reference and every 8 x 2 cell, then gn and gnws at 8 x 16, then",
    "8 x 4, then gn at twice the length, then 8 x 8 (the budget cuts 8 x 8 first, then 8 x 4).",
    "8 x 4 moved before gn at twice the length (rules version 5): on the AMD EPYC machine gn",
    "8 x 16 at 240 epochs ran 575 of its 9,360 steps in 13.6 min, about 3.7 h a run."]


def write_spec(path: Path = SPEC, data: str | None = None) -> int:
    length, rates = pilot_choices(data)
    return write_from_pilot(path, HEADER, {
        "title": "Every fix at its best at a practitioner's global batch: BN, GroupNorm and the "
                 "fixes by images per rank (8 ranks)", "experiment": "practice", "seeds": SEEDS,
        "jobs": 2, "cells": spec_cells(length, rates)}, "practice")
