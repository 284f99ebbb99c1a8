"""A sweep's spec, its cells composed, and where each run of them lives.

A sweep spec (`experiments/<name>/sweep.yaml`) names a Hydra experiment config, the seeds,
and its cells (a label and the overrides that make the cell). Each cell is composed first,
so a typo fails before anything runs. A run's directory is named by a hash of its resolved
config (keys that cannot change the result left out), under `experiments/runs/<data tag>/`:
tables that share a cell share its runs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bnlab.config import NOT_EXPERIMENT, without, without_added_later
from bnlab.errors import BnlabError
from bnlab.paths import CONFIGS, RUNS


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
        c = without_added_later(without(self.cfg, (*NOT_EXPERIMENT, "seed")))
        digest = hashlib.sha1(json.dumps(c, sort_keys=True).encode()).hexdigest()[:10]
        world = self.cfg["dist"]["simulate"] * self.cfg["dist"]["nproc_per_node"]
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


def compose(overrides: list[str], here: bool = True) -> dict:
    """The resolved training config for these overrides, as train.py would build it (checked
    against this machine's devices unless `here` is False: runs that train elsewhere)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from bnlab import hydra_setup
    from bnlab.config import validate

    hydra_setup.register()
    try:
        with initialize_config_dir(str(CONFIGS), version_base="1.3"):
            cfg = OmegaConf.to_container(hydra_compose("train", overrides=overrides),
                                         resolve=True)
    except (HydraException, OmegaConfBaseException) as e:
        first = str(e).strip().splitlines()[0]
        raise BnlabError(f"the overrides {' '.join(overrides)} do not compose: {first}") from e
    validate(cfg, here)
    return cfg


def data_overrides(data: str | None) -> list[str]:
    """`--data DIR` reads CIFAR-10 from DIR and never downloads; without it, the default."""
    return [f"data.root={Path(data).resolve()}", "data.download=false"] if data else []


def load_spec(path: Path, data: str | None = None, here: bool = True) -> Spec:
    path = Path(path)
    if not path.is_file():
        raise BnlabError(f"no sweep spec at {path}; give experiments/<name>/sweep.yaml.")
    return spec_from(yaml.safe_load(path.read_text()), path, data, here=here)


def spec_from(raw: dict, path: Path, data: str | None = None, name: str | None = None,
              here: bool = True) -> Spec:
    """A spec from its parsed YAML; its name is `name`, else the folder of `path`. `here`:
    its runs train on this machine (False: on SLURM's)."""
    exp, seeds = raw["experiment"], raw.get("seeds", [0, 1, 2])
    cells = []
    for c in raw["cells"]:
        ov = [f"experiment={exp}", *c.get("overrides", [])]
        meta = {k: v for k, v in c.items() if k not in ("label", "overrides", "seeds")}
        cell = Cell(c["label"], ov, c.get("seeds", seeds), meta=meta)
        cell.cfg = compose(ov + data_overrides(data), here)
        cells.append(cell)
    extra = {k: v for k, v in raw.items() if k not in ("title", "experiment", "seeds", "cells")}
    name = name or path.parent.name
    return Spec(name, raw.get("title", name), exp, cells, path, extra)


def data_tag(cfg: dict) -> str:
    """Which data the runs saw: `cifar10-<training images>` (or `synthetic-<n>`)."""
    from bnlab.config import check_data
    from bnlab.data import build_dataset

    check_data(cfg)
    d = build_dataset({**cfg["data"], "holdout": 0})  # a held-out split is part of the config
    return f"{cfg['data']['name']}-{len(d.train)}"


# ----------------------------------------------------------------------------------------
# The runs' directories


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
