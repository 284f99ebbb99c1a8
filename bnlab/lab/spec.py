"""A sweep's spec read and its cells composed.

A sweep spec (`experiments/<name>/sweep.yaml`) names a Hydra experiment config, the seeds,
and its cells (a label and the overrides that make the cell). Each cell is composed first,
as train.py would compose it, so a typo fails before anything runs. Where each run of a cell
lives is bnlab.lab.plan's.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import tempfile
from importlib import metadata
from pathlib import Path

import yaml

from bnlab.errors import BnlabError
from bnlab.lab.plan import Cell, Spec
from bnlab.paths import CONFIGS


def compose(overrides: list[str], here: bool = True) -> dict:
    """The resolved training config for these overrides, as train.py would build it (checked
    against this machine's devices unless `here` is False: runs that train elsewhere)."""
    from omegaconf.errors import OmegaConfBaseException

    from bnlab import hydra_setup
    from bnlab.config import validate

    hydra_setup.register()  # bnlab's resolvers, also where the composition comes from the cache
    try:
        cfg = resolve(composed(list(overrides)))
    except OmegaConfBaseException as e:
        raise not_composed(overrides, e) from e
    validate(cfg, here)
    return cfg


def resolve(cfg: dict) -> dict:
    """A composition's interpolations resolved, as plain containers (`${oc.env:...}` reads the
    environment of this call)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.create(cfg), resolve=True)


def not_composed(overrides: list[str], e: Exception) -> BnlabError:
    """The one sentence for overrides that Hydra cannot compose or OmegaConf cannot resolve."""
    first = str(e).strip().splitlines()[0]
    return BnlabError(f"the overrides {' '.join(overrides)} do not compose: {first}")


# ---- Hydra's composition, kept on disk --------------------------------------------------
# A table's report and a sweep's start compose every cell of their specs (`make report`: over
# two hundred), each a fifth of a second or more in Hydra, which reads the config files again
# for each one. Composition depends only on the overrides, the files under configs/ and the
# installed Hydra packages, so the composed config is kept under a key of all three
# (unresolved: an ${oc.env:...} still reads the environment of each caller) and read back
# while they stay the same. The folder is $BNLAB_CACHE/composed, else
# $XDG_CACHE_HOME/bnlab/composed, else ~/.cache/bnlab/composed; it holds pickles, so it must
# be the user's own. BNLAB_CACHE=off (or 0, false, no) turns it off; deleting it is safe.


CACHE_FORMAT = 1  # raised where hydra_compose changes what it keeps: older entries unread


def cache_dir() -> Path | None:
    """Where composed configs are kept, or None where BNLAB_CACHE is `off`."""
    env = os.environ.get("BNLAB_CACHE", "")
    if env.lower() in ("off", "0", "false", "no"):
        return None
    if env:
        return Path(env) / "composed"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "bnlab" / "composed"


def compose_key(overrides: list[str]) -> str:
    """What a composition depends on: the overrides, every file under configs/ and the
    versions of the packages that compose it (Hydra, its plugins, OmegaConf, PyYAML)."""
    h = hashlib.sha256(repr((CACHE_FORMAT, "train", tuple(overrides))).encode())
    for f in sorted(p for p in CONFIGS.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(CONFIGS)).encode() + b"\0" + f.read_bytes() + b"\0")
    h.update(composers().encode())
    return h.hexdigest()


@functools.cache
def composers() -> str:
    """The installed packages that compose a config, with their versions (once a process)."""
    names = sorted(f"{(d.metadata['Name'] or '').lower()}=={d.version}"
                   for d in metadata.distributions())
    return " ".join(n for n in names if n.startswith(("hydra", "omegaconf==", "pyyaml==",
                                                      "antlr4-python3-runtime==")))


def composed(overrides: list[str]) -> dict:
    """Hydra's composition of train.yaml with these overrides, unresolved, from the cache
    where it holds it; one sentence where the overrides do not compose (never cached)."""
    folder = cache_dir()
    key = compose_key(overrides) if folder else None
    if key is not None and (folder / f"{key}.pkl").is_file():
        try:
            return pickle.loads((folder / f"{key}.pkl").read_bytes())
        except Exception:  # a damaged entry: composed again below, and replaced
            pass
    cfg = hydra_compose(overrides)
    if key is not None and compose_key(overrides) == key:  # no config file changed meanwhile
        keep(folder / f"{key}.pkl", pickle.dumps(cfg))
    return cfg


def keep(f: Path, data: bytes) -> None:
    """`data` into `f`, written whole and then renamed (a reader never sees half of it); a
    read-only or full disk keeps nothing, and the config is composed each time instead."""
    part = None
    try:
        f.parent.mkdir(parents=True, exist_ok=True)
        fd, part = tempfile.mkstemp(dir=f.parent, suffix=".part")
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(part, f)
    except OSError:
        if part is not None:
            Path(part).unlink(missing_ok=True)


def hydra_compose(overrides: list[str]) -> dict:
    """Hydra's composition, unresolved, as plain containers.

    Hydra composes in two steps: the defaults lists, with the overrides that choose config
    groups (`experiment=values`, `norm=gn`), then every other override (`optim.lr=0.05`)
    applied to the merged config. The first step is most of the time and most cells of a
    spec share it, so it is done once for each set of group choices (`base`) and the second
    step runs Hydra's own code on a copy. Overrides of Hydra's own settings or sweeps
    (`a=1,2`) take Hydra's path whole, as do values that refer to Hydra's settings
    (`+x=${hydra.job.chdir}`). A value Hydra refuses with a ValueError (`norm=null`) is one
    sentence too."""
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(str(CONFIGS), version_base="1.3"):
            split = split_overrides(overrides)
            if split is None or not split[1]:
                return compose_whole(overrides)
            return apply_values(base(tuple(split[0]), compose_key(split[0])), split[1])
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        raise not_composed(overrides, e) from e


def compose_whole(overrides: list[str]) -> dict:
    """Hydra's compose of train.yaml (inside initialize_config_dir), as plain containers."""
    from hydra import compose as hydra_compose_config
    from omegaconf import OmegaConf

    return OmegaConf.to_container(hydra_compose_config("train", overrides=overrides),
                                  resolve=False)


def split_overrides(overrides: list[str]) -> tuple[list[str], list] | None:
    """The overrides that choose config groups (as given) and the others (as Hydra parsed
    them), split as Hydra splits them (a dict value is never a choice); None where Hydra's
    own settings or a sweep are among them."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    repo = GlobalHydra.instance().hydra.config_loader.repository
    groups, values = [], []
    for line, o in zip(overrides, OverridesParser.create().parse_overrides(overrides),
                       strict=True):
        if o.is_sweep_override() or o.key_or_group.split("/")[0].split(".")[0] == "hydra" \
                or "${hydra." in line:  # Hydra's node, which the first step leaves out
            return None
        if isinstance(o.value(), dict) or not repo.group_exists(o.key_or_group):
            values.append(o)
        else:
            groups.append(line)
    return groups, values


@functools.lru_cache(maxsize=256)
def base(groups: tuple[str, ...], key: str) -> dict:
    """The composition of these group choices alone (`key`: compose_key's, so that an edited
    config file is composed again)."""
    return compose_whole(list(groups))


def apply_values(cfg: dict, values: list) -> dict:
    """The other overrides applied as Hydra applies them: to the merged config in struct
    mode (a new key needs `+`), by Hydra's own function."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from omegaconf import OmegaConf

    conf = OmegaConf.create(cfg)
    OmegaConf.set_struct(conf, True)
    ConfigLoaderImpl._apply_overrides_to_config(values, conf)
    return OmegaConf.to_container(conf, resolve=False)


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
        ov = cell_overrides(raw, c)
        meta = {k: v for k, v in c.items() if k not in ("label", "overrides", "seeds")}
        cell = Cell(c["label"], ov, c.get("seeds", seeds), meta=meta)
        cell.cfg = compose(ov + data_overrides(data), here)
        cells.append(cell)
    extra = {k: v for k, v in raw.items() if k not in ("title", "experiment", "seeds", "cells")}
    name = name or path.parent.name
    return Spec(name, raw.get("title", name), exp, cells, path, extra)


def cell_overrides(raw: dict, cell: dict) -> list[str]:
    """A spec cell's overrides as its runs get them (before --data's): the spec's experiment,
    then the cell's own."""
    return [f"experiment={raw['experiment']}", *cell.get("overrides", [])]


def committed_cells() -> list[list[str]]:
    """Every cell's overrides (cell_overrides) over the committed specs
    (experiments/*/sweep.yaml), each once, sorted."""
    from bnlab.paths import EXPERIMENTS

    return [list(ov) for ov in sorted(
        {tuple(cell_overrides(raw, c)) for raw in (yaml.safe_load(p.read_text())
                                                  for p in sorted(EXPERIMENTS.glob("*/sweep.yaml")))
         for c in raw["cells"]})]


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
