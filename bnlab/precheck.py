"""Command-line overrides checked before Hydra starts, so a typo gets one sentence.

Hydra itself reports an unknown group choice or key over several lines (and creates the
run directory first). `check(argv)` composes the same config with Hydra's compose API and
turns its complaint into one sentence naming the override and the fix, before anything
exists on disk. Multirun sweeps and Hydra's own flags are left to Hydra.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from bnlab.errors import BnlabError
from bnlab.paths import CONFIGS


def _group_choice(arg: str) -> str | None:
    """`norm=nope` -> a sentence listing the norms, when `nope` is not one of them."""
    key, _, value = arg.lstrip("+").partition("=")
    group = CONFIGS / key
    if "." in key or not group.is_dir() or (group / f"{value}.yaml").is_file():
        return None
    options = ", ".join(sorted(p.stem for p in group.glob("*.yaml")))
    return f"{key}={value} is not a {key} config; choose one of {options}."


def writable(path: Path) -> bool:
    """Whether `path` exists as a writable folder or could be created as one."""
    p = path.resolve()
    while not p.exists():
        p = p.parent
    if not p.is_dir():
        return False
    try:  # os.access says yes to root everywhere: try it (an empty folder, removed at once)
        os.rmdir(tempfile.mkdtemp(prefix=".bnlab-write-test-", dir=p))
    except OSError:
        return False
    return True


def check(argv: list[str], config_name: str = "train") -> None:
    if any(a.startswith("-") for a in argv):  # -m, --cfg, --help...: Hydra's own business
        return
    for a in argv:
        if (msg := _group_choice(a)) is not None:
            raise BnlabError(msg)
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from bnlab import hydra_setup

    hydra_setup.register()
    task = [a for a in argv if not a.startswith("hydra.")]
    try:
        with initialize_config_dir(str(CONFIGS), version_base="1.3"):
            cfg = compose(config_name, overrides=task)
    except (HydraException, OmegaConfBaseException) as e:
        first = str(e).strip().splitlines()[0].rstrip(".")
        raise BnlabError(f"{first}; check the spelling against configs/{config_name}.yaml "
                         "(or add a new key with +key=value).") from None
    run_dir = next((a.split("=", 1)[1] for a in argv if a.startswith("hydra.run.dir=")), None)
    out = run_dir or OmegaConf.select(cfg, "output_dir")
    if out is not None and not writable(Path(str(out))):
        raise BnlabError(f"cannot create or write the output folder {out}; choose a writable "
                         "output_dir (or hydra.run.dir).")


def first_rank(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process (`env`: its environment) is rank 0, read before any process group
    exists and without torch: torchrun's RANK, else in a SLURM step of several tasks its
    SLURM_PROCID (which bnlab.dist.adopt_slurm_env makes RANK later), else yes. A value that
    is not a number counts as rank 0: the typo is then said rather than lost."""
    env = os.environ if env is None else env

    def number(key: str, default: int) -> int:
        value = (env.get(key) or "").strip()
        return int(value) if value.isdigit() else default

    if "RANK" in env:
        return number("RANK", 0) == 0
    return number("SLURM_STEP_NUM_TASKS", 1) < 2 or number("SLURM_PROCID", 0) == 0


def check_or_exit(argv: list[str], config_name: str = "train") -> None:
    """One sentence and exit status 2 for bad overrides. Under torchrun or srun every rank
    checks the same command line; only rank 0 says so (the launcher then reports its ranks'
    exit status)."""
    try:
        check(argv, config_name)
    except BnlabError as e:
        if first_rank():
            print(f"bnlab: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
