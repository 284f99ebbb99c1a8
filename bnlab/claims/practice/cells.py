"""table-practice's measures: each cell's end accuracy paired on the seed, where BN breaks,
whether GroupNorm stays flat, and each fix at 8 x 2 in table-recover's states."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from bnlab.claims.practice.spec import BATCHES, RULES, pilot_caveats
from bnlab.claims.recover.cells import state as fix_state
from bnlab.lab import analysis, judge, table
from bnlab.lab.results import CellResult


@dataclass
class Practice(table.Pending):
    """Its runs once its spec exists (else why it waits), and what its pilot says of a choice
    it gave that is not plainly settled (spec.pilot_caveats)."""

    pilot: tuple[str, ...] = ()


def load(ctx: table.Context) -> Practice:
    got = table.pending(ctx, "its spec is written from table-practicepilot's choices once the "
                        "length and every batch-free fix's rate are chosen (`python -m "
                        "bnlab.claims practice-spec`)")
    return Practice(got.runs, got.waiting, pilot_caveats(ctx) if got.runs else ())


def find(cells: list[CellResult], fix: str, b: int, longer: bool = False) -> CellResult | None:
    return next((c for c in cells if c.cell.meta["fix"] == fix and c.cell.meta["per_rank"] == b
                 and bool(c.cell.meta.get("longer")) == longer), None)


def per_seed(c: CellResult) -> dict[int, float]:
    """End accuracy by seed, over the seeds that ended without diverging."""
    out = {}
    for r in c.runs:
        v = r.end_acc(c.epochs)
        if v is not None:
            out[r.seed] = v
    return out


def gap(c: CellResult | None, ref: CellResult | None) -> dict | None:
    """ref's end accuracy minus c's, paired on the seed: mean, 95% t interval, pairs, and
    whether c diverged where ref did not; None until both have every seed."""
    if c is None or ref is None or not table.complete(c, ref):
        return None
    a, b = per_seed(c), per_seed(ref)
    diffs = [b[s] - a[s] for s in sorted(set(a) & set(b))]
    lo, hi = analysis.mean_interval(diffs)
    return {"gap": float(np.mean(diffs)) if diffs else math.nan, "lo": lo, "hi": hi,
            "n": len(diffs), "lost": any(s in b and s not in a for s in {r.seed for r in c.runs})}


def level(g: dict | None, bad: str, good: str, at_least: float, under: float) -> str:
    """`bad` where the gap is at least `at_least` with its interval above 0, `good` where it is
    under `at_least` with its upper end under `under`, else unclear."""
    if g is None:
        return "to come"
    if g["lost"]:
        return bad
    if g["n"] < RULES["min_seeds"] or g["lo"] is None:
        return "unclear"
    if g["gap"] >= at_least and g["lo"] > 0:
        return bad
    if g["gap"] < at_least and g["hi"] < under:
        return good
    return "unclear"


def bn_states(cells: list[CellResult]) -> dict[int, tuple[dict | None, str]]:
    """bn's gap to 8 x 16 and its state at each smaller per-rank batch."""
    ref = find(cells, "bn", 16)
    return {b: (g, level(g, "breaks", "holds", RULES["break_points"], RULES["flat_interval"]))
            for b in BATCHES[1:] for g in [gap(find(cells, "bn", b), ref)]}


def flatness(cells: list[CellResult], fix: str) -> tuple[str, dict[int, tuple[dict | None, str]]]:
    """A batch-free norm's gap to its own 8 x 16 cell at each per-rank batch, and the verdict:
    flat, drops (at some batch), unclear or to come."""
    own = find(cells, fix, 16)
    each = {b: (g, level(g, "drops", "flat", RULES["flat_gap"], RULES["flat_interval"]))
            for b in BATCHES[1:] for g in [gap(find(cells, fix, b), own)]}
    states = [s for _, s in each.values()]
    verdict = "drops" if "drops" in states else "to come" if "to come" in states else \
        "flat" if all(s == "flat" for s in states) else "unclear"
    return verdict, each


def fixes_at_two(cells: list[CellResult]) -> list[CellResult]:
    """The fixes' cells at 8 x 2 (bn and the longer gn runs left out), in the spec's order."""
    return [c for c in cells if c.cell.meta["per_rank"] == 2 and not c.cell.meta.get("longer")
            and c.cell.meta["fix"] != "bn"]


def fix_at_two(cells: list[CellResult], c: CellResult, v3: bool = False) -> dict | None:
    """A fix at 8 x 2 against the 8 x 16 reference and bn at 8 x 2: table-recover's state and
    the share of bn's loss it gets back (where bn breaks at 8 x 2 and ended every seed; `v3`:
    as rules version 3 read it, a share wherever bn breaks and unclear only where the gap has
    too few pairs)."""
    ref, bn = find(cells, "bn", 16), find(cells, "bn", 2)
    g, gain = gap(c, ref), gap(bn, c)
    if g is None or gain is None or (b := gap(bn, ref)) is None:
        return None
    breaks = level(b, "breaks", "holds", RULES["break_points"], RULES["flat_interval"]) == \
        "breaks" and (v3 or not b["lost"])
    a, bb, r = per_seed(c), per_seed(bn), per_seed(ref)
    seeds = sorted(set(a) & set(bb) & set(r))
    share = judge.ratio_of_means([a[s] - bb[s] for s in seeds], [r[s] - bb[s] for s in seeds]) \
        if breaks else (math.nan, None, None)
    counted = {**gain, "n": max(gain["n"], RULES["min_seeds"])} if v3 else gain
    return {"gap": g, "gain": gain, "share": share,
            "state": fix_state(g, counted, g["lost"], RULES)}
