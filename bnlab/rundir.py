"""What a run directory records beside its metrics (config, commit, versions, status), and
what a run's identity leaves out or lets change (NOT_EXPERIMENT, RESUME_MAY_CHANGE,
ADDED_LATER: the config keys its directory name and a resume ignore; PINNED: keys its
directory name reads at a fixed value)."""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import time
from importlib import metadata
from pathlib import Path

import yaml

from bnlab import floatenv
from bnlab.paths import ROOT

PACKAGES = ("torch", "torchvision", "hydra-core", "omegaconf", "numpy", "wandb")
# A run's status (status.json). A final one is a result, which a sweep never runs again; the
# others are unfinished: launched again, the run resumes (from its checkpoint, where it has one).
STATUSES = ("running", "completed", "failed", "diverged", "preempted")
FINAL = ("completed", "diverged")
RESUMABLE = tuple(s for s in STATUSES if s not in FINAL)  # running, failed, preempted


# ----------------------------------------------------------------------------------------
# A run's identity: which config keys make it a different experiment

# Keys that cannot change what a run computes: where it writes and how it reports.
NOT_EXPERIMENT = ("name", "output_dir", "progress", "checkpoint", "checkpoint_every", "log_every",
                  "resume", "logger", "data.root", "data.download", "dist.threads",
                  "dist.timeout_s", "dist.device", "dist.backend")
# ...and, for resuming, keys that change what is measured or when training stops, not the
# training itself.
RESUME_MAY_CHANGE = (*NOT_EXPERIMENT, "max_steps", "eval_every", "eval_sparse_until",
                     "diagnostics", "on_nan",
                     "data.val_limit", "data.eval_batch")


def without(cfg: dict, keys) -> dict:
    """A deep copy of `cfg` with the dotted `keys` removed."""
    c = json.loads(json.dumps(cfg))
    for dotted in keys:
        *parents, leaf = dotted.split(".")
        d = c
        for p in parents:
            d = d.get(p, {})
        d.pop(leaf, None)
    return c


# Keys added after runs were made, at the value those runs had: a config holding one at that
# value is the same experiment as one without it (run directory names, resume checks).
ADDED_LATER = {"on_nan": "stop", "data.rank_skew": False, "record.predictions": False,
               "record.decompose": False, "record.decompose_samples": 2048,
               "record.decompose_after": 0.0, "optim.name": "sgd", "dist.bn_sync": "none",
               "norm.impl": "auto", "data.holdout": 0, "data.holdout_seed": 0,
               "data.image_size": 32, "eval_sparse_until": 0.0,
               "record.decompose_batch": True, "optim.scale_from": 0,
               "precision": "fp32", "channels_last": False, "optim.decay_norms": True,
               "model.zero_init_residual": False, "norm.placement": "each_bn",
               "precise_bn.before_eval": False, "norm.ramp_of_run": None,
               "compile": False}


# Keys that change nothing a run logs (the start-of-run warning's threshold, the doctor's:
# bnlab/doctor.py), named in run directories at the value they had when those were first
# named, so that a new default renames no run.
PINNED = {"diagnostics.min_values": 16}


def pinned(cfg: dict) -> dict:
    """A copy of `cfg` with each PINNED key it holds set to its pinned value."""
    c = json.loads(json.dumps(cfg))
    for dotted, value in PINNED.items():
        parent, _, leaf = dotted.rpartition(".")
        d = get_dotted(c, parent) if parent else c
        if isinstance(d, dict) and leaf in d:
            d[leaf] = value
    return c


def get_dotted(cfg: dict, dotted: str):
    """The value at a dotted key, or None where any part is missing."""
    for part in dotted.split("."):
        cfg = cfg.get(part) if isinstance(cfg, dict) else None
    return cfg


def without_added_later(cfg: dict) -> dict:
    """`cfg` without the ADDED_LATER keys that hold their old value (and without a group those
    keys leave empty)."""
    c = without(cfg, [k for k, v in ADDED_LATER.items() if get_dotted(cfg, k) == v])
    for group in {k.split(".")[0] for k in ADDED_LATER if "." in k}:
        if c.get(group) == {} and cfg.get(group) != {}:
            c.pop(group)
    return c


def changed_keys(old: dict, new: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two configs."""
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += changed_keys(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k}")
    return out


# ----------------------------------------------------------------------------------------
# What a run records

COPIED_FROM = "BNLAB_COMMIT"  # set where the tree was copied to another machine (a lent GPU)


def git_commit() -> str | None:
    """The checkout's commit, with "-dirty" where tracked files changed. In a copy of the tree
    sent to another machine, whose .git (if any) need not be the tree's, the commit it was
    copied from, as the sender gives it in BNLAB_COMMIT, with "-copy" added."""
    if os.environ.get(COPIED_FROM):
        return f"{os.environ[COPIED_FROM]}-copy"
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for p in PACKAGES:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return out


def machine() -> str:
    """This machine in words: CPU model, cores, memory, and the GPU if torch sees one."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem = int(Path("/proc/meminfo").read_text().split()[1]) / 2**20
        mem_s = f", {mem:.0f} GiB memory"
    except (OSError, ValueError, IndexError):
        mem_s = ""
    import torch

    gpu = f", GPU {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ", no GPU"
    return f"{cpu}, {os.cpu_count()} cores{mem_s}{gpu}"


def write_run_info(run_dir: Path, cfg: dict, extra: dict) -> None:
    run_dir = Path(run_dir)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    info = {"commit": git_commit(), "versions": versions(), "host": socket.gethostname(),
            "machine": machine(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "floats": floatenv.record(), **extra}
    (run_dir / "run.json").write_text(json.dumps(info, indent=2) + "\n")


def note_resume(run_dir: Path, step: int, dropped_lines: int,
                device: str | None = None) -> list[str]:
    """Add this resume (when, from which step, this commit, machine, device and what its floats
    depend on) to run.json's `resumed` list; returns what differs in the floats' record from
    the run's start (["not recorded"] for a run started before runs recorded it)."""
    path = Path(run_dir) / "run.json"
    info = json.loads(path.read_text()) if path.is_file() else {}
    floats = floatenv.record()
    info.setdefault("resumed", []).append({
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "from_step": step,
        "metrics_lines_dropped": dropped_lines, "commit": git_commit(),
        "host": socket.gethostname(), "machine": machine(),
        **({"device": device} if device else {}), "floats": floats})
    path.write_text(json.dumps(info, indent=2) + "\n")
    return floatenv.differences(info.get("floats"), floats)


def set_status(run_dir: Path, status: str, **detail) -> None:
    """status.json, replaced atomically; a running run also names its process and host."""
    assert status in STATUSES, status
    if status == "running":
        detail = {"pid": os.getpid(), "host": socket.gethostname(), **detail}
    rec = {"status": status, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **detail}
    path = Path(run_dir) / "status.json"
    tmp = path.with_name(f".status.json.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(rec) + "\n")
    os.replace(tmp, path)


def read_status_full(run_dir: Path) -> dict | None:
    p = Path(run_dir) / "status.json"
    try:
        rec = json.loads(p.read_text())
        return rec if isinstance(rec, dict) and "status" in rec else None
    except (OSError, ValueError):
        return None


def read_status(run_dir: Path) -> str | None:
    rec = read_status_full(run_dir)
    return None if rec is None else rec["status"]


def ended_as(status: str | None, rc: int | None = None) -> str:
    """How a run whose process has ended stands, from the status it left: `failed` where it
    left none, or left `running` without exiting cleanly (exit status `rc` not 0; None: it
    died without one); else that status."""
    if status is None or (status == "running" and rc != 0):
        return "failed"
    return status
