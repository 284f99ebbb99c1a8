"""Resuming a run exactly: what a checkpoint holds, and what a run directory allows.

A checkpoint is taken at a step boundary. Beside the model (rank 0's statistics, what
evaluate.py reads), optimizer and schedule, it holds each rank's own buffers (BN running
statistics differ between ranks), each rank's metric sums since the last log line, and
each rank's torch RNG state. The data order and augmentation need no state: they are a
function of (seed, epoch) (bnlab.data.EpochPlan). Resuming from it reproduces the
uninterrupted run bit for bit on CPU, metrics.jsonl included (timings aside).
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import torch
import torch.distributed as tdist
import torch.nn as nn

from bnlab import checkpoint, dist
from bnlab.errors import BnlabError
from bnlab.metrics import Meter
from bnlab.rundir import (
    RESUMABLE,
    RESUME_MAY_CHANGE,
    changed_keys,
    get_dotted,
    read_status_full,
    without,
    without_added_later,
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def extends(run_dir: Path, st: dict, cfg: dict) -> bool:
    """A run that max_steps ended early goes on when launched again with more steps (a larger
    max_steps, or 0 for every epoch) from the checkpoint it left."""
    if "max_steps" not in st or not (Path(run_dir) / checkpoint.CHECKPOINT).is_file():
        return False
    return cfg["max_steps"] == 0 or cfg["max_steps"] > st.get("step", 0)


def plan(run_dir: Path, cfg: dict) -> bool:
    """Whether this launch resumes the run in `run_dir` (False: a fresh run). Refuses, with
    one sentence, a directory whose run is finished (unless max_steps ended it and this launch
    asks for more), still running, or another experiment."""
    st = read_status_full(run_dir)
    if st is None:
        return False
    status = st.get("status")
    if status == "completed" and extends(run_dir, st, cfg):
        return True
    if status == "completed" and "max_steps" in st:
        raise BnlabError(f"the run directory {run_dir} holds a run that max_steps ended at "
                         f"step {st.get('step')}; raise max_steps (or set max_steps=0 for every "
                         "epoch) to extend it from its checkpoint, or choose another "
                         "hydra.run.dir.")
    if status == "completed":
        raise BnlabError(f"the run directory {run_dir} already holds a completed run; choose "
                         "another hydra.run.dir (a finished run is never overwritten).")
    if status == "diverged":
        raise BnlabError(f"the run directory {run_dir} holds a run that diverged at step "
                         f"{st.get('step')}; choose another hydra.run.dir (resuming would "
                         "diverge again).")
    if status not in RESUMABLE:
        raise BnlabError(f"the run directory {run_dir} holds a run with status {status!r}; "
                         "choose another hydra.run.dir.")
    if cfg["resume"] == "never":
        raise BnlabError(f"the run directory {run_dir} holds an unfinished ({status}) run and "
                         "resume=never; set resume=auto to continue it or choose another "
                         "hydra.run.dir.")
    if status == "running" and st.get("host") == socket.gethostname() and \
            _alive(st.get("pid", -1)) and st.get("pid") != os.getpid():
        raise BnlabError(f"the run in {run_dir} is running now (pid {st['pid']}); wait for it "
                         "or stop it before resuming.")
    saved = Path(run_dir) / "config.yaml"
    if saved.is_file():
        import yaml

        old = yaml.safe_load(saved.read_text())
        diff = changed_keys(*(without_added_later(without(c, RESUME_MAY_CHANGE))
                              for c in (old, cfg)))
        if diff:
            shown = ", ".join(f"{k} ({get_dotted(old, k)!r} -> {get_dotted(cfg, k)!r})"
                              for k in diff[:3])
            raise BnlabError(f"cannot resume the run in {run_dir} with a different experiment: "
                             f"{shown}; restore those settings or choose another "
                             "hydra.run.dir.")
    return True


def rank_state(model: nn.Module, meters: list[Meter], env: dist.DistEnv) -> list[dict]:
    """Every rank's own buffers, meter sums and RNG state, gathered (a collective)."""
    mine = {"buffers": {k: v.detach().cpu().clone() for k, v in model.named_buffers()},
            "meters": [m.t.detach().cpu().clone() for m in meters],
            "rng": torch.get_rng_state()}
    if not env.distributed:
        return [mine]
    out: list = [None] * env.world
    tdist.all_gather_object(out, mine)
    return out


def restore(ckpt: dict, model: nn.Module, opt, sched, meters: list[Meter],
            env: dist.DistEnv) -> tuple[int, int, int]:
    """Load a checkpoint into this rank; returns (epoch, step within it, global step)."""
    r = ckpt["resume"]
    if len(r["ranks"]) != env.world:
        raise BnlabError(f"the checkpoint holds {len(r['ranks'])} ranks' state but this launch "
                         f"has {env.world} processes; relaunch with the run's own layout.")
    mine = r["ranks"][env.rank]
    model.load_state_dict(checkpoint.current(r["model"]))
    # the simulated ranks' statistics are buffers left out of the state dict: each rank's
    # buffers below bring them back
    with torch.no_grad():
        own = dict(model.named_buffers())
        for k, v in mine["buffers"].items():
            own[k].copy_(v)
    opt.load_state_dict(ckpt["optimizer"])
    sched.load_state_dict(ckpt["scheduler"])
    for m, t in zip(meters, mine["meters"], strict=True):
        m.t.copy_(t)
    torch.set_rng_state(mine["rng"])
    return r["epoch"], r["step_in_epoch"], ckpt["step"]


def load_latest(run_dir: Path) -> dict | None:
    """The run's checkpoint, or None when it has none yet (the run restarts from step 0)."""
    path = Path(run_dir) / checkpoint.CHECKPOINT
    if not path.is_file():
        return None
    try:
        ckpt = checkpoint.load(path)
    except BnlabError:
        raise BnlabError(f"the checkpoint of the unfinished run, {path}, is corrupt or "
                         "truncated; delete it to restart that run from step 0, or choose "
                         "another hydra.run.dir.") from None
    if "resume" not in ckpt:
        raise BnlabError(f"{path} was written by an older bnlab and cannot resume a run; "
                         "choose another hydra.run.dir.")
    return ckpt


def truncate_metrics(run_dir: Path, step: int, name: str = "metrics.jsonl") -> int:
    """Keep the lines of a run's log (metrics.jsonl, predictions.jsonl) written up to `step`
    (a torn last line goes too); returns the number of lines dropped. The file is replaced
    atomically."""
    path = Path(run_dir) / name
    if not path.is_file():
        return 0
    keep, dropped = [], 0
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            dropped += 1
            continue
        if rec.get("step", 0) <= step:
            keep.append(line)
        else:
            dropped += 1
    tmp = path.with_name(f".{name}.tmp")
    tmp.write_text("".join(f"{ln}\n" for ln in keep))
    os.replace(tmp, path)
    return dropped
