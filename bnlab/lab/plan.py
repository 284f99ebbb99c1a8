"""A sweep's cells, and where each run of them lives.

A run's directory is named by a hash of its resolved config (keys that cannot change the
result left out, bnlab.rundir), under `experiments/runs/<data tag>/`: tables that share a
cell share its runs. Composing the cells from a spec file is bnlab.lab.spec's job.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from bnlab.dist import world_size
from bnlab.paths import RUNS
from bnlab.rundir import NOT_EXPERIMENT, pinned, without, without_added_later


@dataclass
class Cell:
    label: str
    overrides: list[str]
    seeds: list[int]
    cfg: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)  # the spec's other keys (row, col, section...)

    @property
    def key(self) -> str:
        """`<model>-<norm>-<ranks>x<batch>-<hash>`: readable, and unique per resolved config."""
        c = pinned(without_added_later(without(self.cfg, (*NOT_EXPERIMENT, "seed"))))
        digest = hashlib.sha1(json.dumps(c, sort_keys=True).encode()).hexdigest()[:10]
        world = world_size(self.cfg, self.cfg["dist"]["nproc_per_node"])  # the config's alone
        return (f"{self.cfg['model']['name']}-{self.cfg['norm']['kind']}-{world}x"
                f"{self.cfg['batch_per_gpu']}-{digest}")


@dataclass
class Spec:
    name: str
    title: str
    experiment: str
    cells: list[Cell]
    path: Path
    extra: dict = field(default_factory=dict)


def run_dir(tag: str, cell: Cell, seed: int, root: Path = RUNS) -> Path:
    return root / tag / cell.key / f"seed{seed}"


def set_aside(d: Path) -> Path:
    """Move an unfinished run out of the way (kept, never deleted) so it can run again."""
    i = 1
    while (dest := d.with_name(f"{d.name}.unfinished-{i}")).exists():
        i += 1
    d.rename(dest)
    return dest


def plan(specs: Spec | list[Spec], tag: str, root: Path = RUNS) -> list[tuple[Cell, int, Path]]:
    """Every (cell, seed, dir), each dir once: cells with a higher `order` last, then
    seed-major, so early results cover every cell."""
    specs = [specs] if isinstance(specs, Spec) else specs
    cells = [c for s in specs for c in s.cells]
    seen, out = set(), []
    for order in sorted({c.meta.get("order", 0) for c in cells}):
        for seed in sorted({s for c in cells for s in c.seeds}):
            for cell in cells:
                d = run_dir(tag, cell, seed, root)
                if cell.meta.get("order", 0) == order and seed in cell.seeds and d not in seen:
                    seen.add(d)
                    out.append((cell, seed, d))
    return out
