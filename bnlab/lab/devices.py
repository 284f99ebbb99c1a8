"""A sweep table's cells on a second device: the same spec's runs read from another runs
folder (the GPU's, experiments/runs-cuda, which `make gpu-check` fills), judged by the table's
own rule cell by cell, beside this folder's. The two devices' runs never share a cell.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from bnlab.lab.results import CellResult, collect, fmt
from bnlab.lab.table import RunsData

# judge(data, cell) -> the cell's measure (a dict with "state", "gap", "lo", "hi"), or None
# while its runs, or its reference's, are still to come
Judge = Callable[[RunsData, CellResult], dict | None]


def elsewhere(d: RunsData, root: Path) -> RunsData | None:
    """`d`'s spec read back from the runs under `root` (same data tag); None where none ran
    (or `root` is `d`'s own folder)."""
    if root.resolve() == d.root.resolve() or not (root / d.tag).is_dir():
        return None
    return replace(d, cells=collect(d.spec, d.tag, root), root=root)


def device_of(d: RunsData) -> str:
    """The GPU (or device) the runs name in their run.json, e.g. "NVIDIA H100 80GB HBM3"."""
    names = []
    for c in d.cells:
        for r in c.runs:
            machine = r.info.get("machine", "")
            names.append(machine.split("GPU ", 1)[1] if "GPU " in machine else
                         r.info.get("device", "?"))
    return ", ".join(dict.fromkeys(names)) or "?"


def said(m: dict) -> str:
    """A cell's state and gap, or why it has no gap (diverged on every seed)."""
    if not math.isfinite(m["gap"]):
        return f"{m['state']} ({m.get('why') or 'no finite gap'})"
    return f"{m['state']}, {m['gap']:+.1f} ({fmt(m['lo'])} to {fmt(m['hi'])}, {m['n']} seeds)"


def compare(here: RunsData, there: RunsData, judge: Judge,
            group: Callable[[CellResult], str], names: tuple[str, str] = ("CPU", "CUDA")) -> str:
    """One paragraph: every cell judged on the other device, its state and gap there and here;
    the references' accuracy on both; how many of each group's runs are still to come there.
    A cell `there` alone has (one its spec runs on that device only) is said to be so.
    `names`: what to call here's and there's device."""
    mine = {c.cell.label: c for c in here.cells}
    a, b = names
    cells, refs, agree, both, todo = [], [], 0, 0, {}
    for c in there.cells:
        m = judge(there, c)
        if m is None:
            key = group(c)
            done, want = todo.get(key, (0, 0))
            todo[key] = (done + len(c.runs), want + c.expected)
            continue
        own = mine.get(c.cell.label)
        h = judge(here, own) if own is not None else None
        if m["state"] == "reference":
            refs.append(f"{c.cell.label} {c.jstat('plateau_acc').fmt(1)} on {b}, " + (
                f"{own.jstat('plateau_acc').fmt(1)} on {a}" if own else f"{b} only"))
            continue
        if own is None:
            cells.append(f"{c.cell.label}: {said(m)} on {b} ({b} only)")
            continue
        both += 1  # a cell both devices ran
        agree += h is not None and h["state"] == m["state"]
        cells.append(f"{c.cell.label}: {said(m)} on {b}; "
                     f"{said(h) + ' on ' + a if h else 'still to come on ' + a}")
    runs = sum(len(c.runs) for c in there.cells)
    want = sum(c.expected for c in there.cells)
    parts = [f"{runs} of {want} runs, in experiments/{there.root.name}/, on {device_of(there)}"]
    if cells:
        parts += cells
        if both:
            parts.append(f"the same state on both devices in {agree} of {both} cells")
    if refs:
        parts.append("the references' plateau accuracy (%): " + "; ".join(refs))
    left = {k: v for k, v in todo.items() if v[1]}
    if left:
        parts.append(f"still to come on {b}: " + ", ".join(
            f"{k} ({done} of {n} runs)" for k, (done, n) in left.items()))
    return "; ".join(parts) + "."
