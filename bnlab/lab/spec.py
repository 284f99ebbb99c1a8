"""A sweep's spec read and its cells composed.

A sweep spec (`experiments/<name>/sweep.yaml`) names a Hydra experiment config, the seeds,
and its cells (a label and the overrides that make the cell). Each cell is composed first,
as train.py would compose it, so a typo fails before anything runs. Where each run of a cell
lives is bnlab.lab.plan's.
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
from pathlib import Path

import yaml

from bnlab.errors import BnlabError
from bnlab.lab.plan import Cell, Spec
from bnlab.paths import CONFIGS


def configs_stamp() -> tuple:
    """What a composition reads besides its overrides, as it is now: the config files' text
    and the environment variables they name (`${oc.env:NAME,...}`). A composed config is
    reused only while this is unchanged."""
    texts = tuple((str(p), p.read_text()) for p in sorted(CONFIGS.rglob("*.yaml")))
    names = sorted({n for _, t in texts for n in re.findall(r"oc\.env:(\w+)", t)})
    return hashlib.sha256(repr(texts).encode()).hexdigest(), \
        tuple((n, os.environ.get(n)) for n in names)


# overrides and configs_stamp() -> the composed config, before validation: Hydra takes about
# 0.2 s a config, and a report or a test session composes the same cells many times
_COMPOSED: dict[tuple, dict] = {}


def compose(overrides: list[str], here: bool = True) -> dict:
    """The resolved training config for these overrides, as train.py would build it (checked
    against this machine's devices unless `here` is False: runs that train elsewhere). Each
    call returns a config of its own; the same overrides on unchanged config files are
    composed once per process."""
    key = (tuple(overrides), configs_stamp())
    if key not in _COMPOSED:
        _COMPOSED[key] = hydra_config(overrides)
    cfg = copy.deepcopy(_COMPOSED[key])
    from bnlab.config import validate

    validate(cfg, here)
    return cfg


def hydra_config(overrides: list[str]) -> dict:
    """Hydra's composition of train.yaml with these overrides, resolved, unvalidated."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from bnlab import hydra_setup

    hydra_setup.register()
    try:
        with initialize_config_dir(str(CONFIGS), version_base="1.3"):
            return OmegaConf.to_container(hydra_compose("train", overrides=overrides),
                                          resolve=True)
    except (HydraException, OmegaConfBaseException) as e:
        first = str(e).strip().splitlines()[0]
        raise BnlabError(f"the overrides {' '.join(overrides)} do not compose: {first}") from e


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
