"""Hydra resolvers, registered before the config is composed.

`${run_stamp:}` replaces `${now:}` in run-directory names. Under torchrun every rank composes
its own config, and `${now:}` resolves per process, so ranks that start a second apart would
create one directory each. The stamp is instead the start time of the torchrun agent that
spawned the ranks (their shared parent), so all local ranks of a run agree.
"""

from __future__ import annotations

import os
import time

from omegaconf import OmegaConf

FORMAT = "%Y-%m-%d_%H-%M-%S"
_stamp: str | None = None


def _parent_start_time() -> float | None:
    """Start time (epoch seconds) of this process's parent, from /proc (Linux)."""
    try:
        with open(f"/proc/{os.getppid()}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22 of stat: starttime, in clock ticks after boot
        with open("/proc/stat") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def run_stamp() -> str:
    """One timestamp per run: $BNLAB_RUN_STAMP, else the SLURM job (all its tasks, and the
    job again after a requeue), else the torchrun agent's start, else now."""
    global _stamp
    if _stamp is None:
        _stamp = os.environ.get("BNLAB_RUN_STAMP")
    if _stamp is None and "SLURM_JOB_ID" in os.environ:
        _stamp = "slurm-" + os.environ.get("SLURM_ARRAY_JOB_ID", os.environ["SLURM_JOB_ID"])
    if _stamp is None:
        t = _parent_start_time() if "TORCHELASTIC_RUN_ID" in os.environ else None
        _stamp = time.strftime(FORMAT, time.localtime(t if t is not None else time.time()))
    return _stamp


def register() -> None:
    if not OmegaConf.has_resolver("run_stamp"):
        OmegaConf.register_new_resolver("run_stamp", run_stamp)
