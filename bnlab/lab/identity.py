"""The identities the lab knows, checked on a table's own runs: its A/A control.

SyncBN over all W simulated ranks x b images normalizes the same W*b images as BN at 1 x W*b,
so on the same seed, config and CPU kernels the two log the same numbers at every step. Where a
table holds both cells, its page shows, seed by seed, whether they do: equal at every logged
value, or the first step and value that differ with each run's kernels (run.json's floats). A
difference on the same kernels is a defect of the simulation; across kernels it measures the
floats' noise, which no seed-to-seed comparison should be taken for.
"""

from __future__ import annotations

from bnlab import floatenv
from bnlab.lab.results import CellResult, Run
from bnlab.rundir import NOT_EXPERIMENT, get_dotted, without, without_added_later

# What may differ between the two sides of the identity (their norm and their layout).
LAYOUT = (*NOT_EXPERIMENT, "norm", "dist.simulate", "batch_per_gpu", "seed")
SKIP = ("images_per_s", "time/", "train/loss_rank0")  # timings, and what one rank alone saw


def side(c: CellResult) -> tuple[str, int, int] | None:
    """("syncbn", W, b) for SyncBN over all its W ranks, ("bn", 1, B) for BN on one rank."""
    cfg = c.cell.cfg
    norm, world = get_dotted(cfg, "norm.kind"), get_dotted(cfg, "dist.simulate") or 1
    if norm == "syncbn" and world > 1 and get_dotted(cfg, "norm.sync_group") in (0, None):
        return "syncbn", world, cfg.get("batch_per_gpu", 0)
    if norm == "bn" and world == 1:
        return "bn", 1, cfg.get("batch_per_gpu", 0)
    return None


def rest(c: CellResult) -> dict:
    """The config less what the identity lets differ, and the norm's eps and momentum."""
    cfg = c.cell.cfg
    return {**without_added_later(without(cfg, LAYOUT)),
            "bn": (get_dotted(cfg, "norm.eps"), get_dotted(cfg, "norm.momentum"))}


def pairs(cells: list[CellResult]) -> list[tuple[CellResult, CellResult]]:
    """(syncbn over all W x b, bn at 1 x W*b) cell pairs with otherwise the same config."""
    sides = [(c, side(c)) for c in cells if getattr(c.cell, "cfg", None)]
    out = []
    for a, sa in sides:
        if sa is None or sa[0] != "syncbn":
            continue
        for b, sb in sides:
            if sb is not None and sb[0] == "bn" and sb[2] == sa[1] * sa[2] and rest(a) == rest(b):
                out.append((a, b))
    return out


def logged(rows: list[dict], skip: tuple[str, ...] = SKIP, until: int | None = None
           ) -> dict[tuple[int, str], float]:
    """Every number a run logged, by (step, key), less the keys starting with `skip`; only at
    steps up to `until` where given."""
    return {(row["step"], k): v for row in rows if until is None or row.get("step", 0) <= until
            for k, v in row.items()
            if k != "step" and isinstance(v, int | float) and not k.startswith(skip)}


def first_difference(want: dict, got: dict) -> tuple[list, tuple | None]:
    """The (step, key) pairs both logged, in order (train/loss first within a step), and the
    first whose values differ in any bit: (step, key, one, other), or None."""
    both = sorted(set(want) & set(got), key=lambda sk: (sk[0], sk[1] != "train/loss", sk[1]))
    first = next(((s, k, want[s, k], got[s, k]) for s, k in both if want[s, k] != got[s, k]),
                 None)
    return both, first


def check(a: Run, b: Run) -> dict:
    """Two runs of one seed compared at every value both logged: {equal, compared, first,
    kernels (each side's capability and CPU vendor at start and resumes)}."""
    both, first = first_difference(logged(a.rows), logged(b.rows))
    return {"equal": first is None and bool(both), "compared": len(both), "first": first,
            "kernels": (floatenv.kernels_all(a.info), floatenv.kernels_all(b.info))}


def kernels_said(caps: list[str | None]) -> str:
    seen = sorted({c or "not recorded" for c in caps})
    return " then ".join(seen) if len(seen) > 1 else seen[0]


def lines(cells: list[CellResult]) -> list[str]:
    """The page's A/A section, where the table holds an identity's two cells."""
    found = pairs(cells)
    if not found:
        return []
    out = ["## A/A control: SyncBN over all ranks against BN on their images", "",
           "SyncBN over all W simulated ranks normalizes the same images as BN on one rank "
           "with W times the batch: on the same seed and CPU kernels their runs must log the "
           "same numbers at every step. Across kernels (run.json's `floats`), what differs "
           "measures the floats' noise, not the seeds'.", ""]
    for a, b in found:
        rows = []
        mine, theirs = {r.seed: r for r in a.runs}, {r.seed: r for r in b.runs}
        for s in sorted(set(mine) & set(theirs)):
            v = check(mine[s], theirs[s])
            ka, kb = (kernels_said(k) for k in v["kernels"])
            if v["equal"]:
                said = f"equal at all {v['compared']} logged values"
            elif v["first"]:
                step, key, x, y = v["first"]
                said = f"differ from step {step} ({key}: {x:.6g} against {y:.6g})"
            else:
                said = "nothing logged by both"
            rows.append(f"| {s} | {said} | {ka} | {kb} |")
        out += [f"`{a.cell.label}` against `{b.cell.label}`:", "",
                "| seed | the two runs | kernels (syncbn) | kernels (bn) |", "|---|---|---|---|",
                *rows, ""]
    return out
