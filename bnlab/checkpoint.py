"""Atomic checkpoints that load with `weights_only=True`."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from bnlab.errors import BnlabError

CHECKPOINT = "checkpoint.pt"


def save(path: Path, state: dict) -> None:
    """Write to a temp file in the same directory, then rename: a crash never leaves half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load(path: Path, map_location="cpu") -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT
    if not path.is_file():
        raise BnlabError(
            f"checkpoint: {path} does not exist; point at a run directory or a .pt file."
        )
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        raise BnlabError(
            f"checkpoint: {path} is corrupt or truncated ({type(e).__name__}); "
            "use an earlier checkpoint or rerun."
        ) from None


# A state dict saved before bnlab.simulate kept its ranks' statistics out of it holds them
# under these names too: they are not the model's (a resume brings them back from its ranks'
# buffers), and `current` leaves them out.
OLD_SIM = (".sim_running_mean", ".sim_running_var")


def current(state: dict) -> dict:
    """A state dict as this bnlab saves it: an old one without its OLD_SIM entries."""
    return {k: v for k, v in state.items() if not k.endswith(OLD_SIM)}


def model_state(state: dict) -> dict:
    """A saved model's state dict as the bare model takes it: without DDP's `module.` prefix
    (a simulated run's state dict is the bare model's already: bnlab.simulate keeps its ranks'
    statistics out of it; an old one's are left out by `current`)."""
    return {k.removeprefix("module."): v for k, v in current(state).items()}


def require(run_dir: Path, target: str) -> None:
    """A table measured on a run's checkpoint needs it on this machine; committed runs keep
    only their records."""
    if not (Path(run_dir) / CHECKPOINT).is_file():
        raise BnlabError(f"the run in {run_dir} has no checkpoint on this machine (checkpoints "
                         f"are not committed); train the table's runs into an empty folder "
                         f"with `make {target} RUNS=<folder>`, or move this run away.")
