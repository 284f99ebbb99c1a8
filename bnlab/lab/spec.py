"""A sweep's spec read and its cells composed.

A sweep spec (`experiments/<name>/sweep.yaml`) names a Hydra experiment config, the seeds,
and its cells (a label and the overrides that make the cell). Each cell is composed first,
as train.py would compose it, so a typo fails before anything runs. Where each run of a cell
lives is bnlab.lab.plan's.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from bnlab.errors import BnlabError
from bnlab.lab.plan import Cell, Spec
from bnlab.paths import CONFIGS


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


def read_data_tag(tag: str) -> tuple[str, int]:
    """A data tag (`data_tag`'s `<name>-<training images>`) read back: (name, images)."""
    name, n = tag.rsplit("-", 1)
    return name, int(n)
