"""Evaluate a saved run's BN statistics (claims C7, C8, C10), or diagnose settings offline.

For a checkpoint: eval-mode accuracy at several batch sizes (must not change), train-mode
accuracy at several batch sizes (on a copy: a train-mode forward moves running statistics),
accuracy with each rank's running statistics and their average (where the run kept them),
and after PreciseBN with both estimators. Printed as a table and written to eval.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn as nn
import yaml
from omegaconf import DictConfig
from tqdm import tqdm

from bnlab import checkpoint, dist, doctor
from bnlab.batchnorm import RankBatchNorm
from bnlab.data import Dataset, Split, TrainLoader, build_dataset
from bnlab.diagnostics import train_mode_accuracy
from bnlab.errors import BnlabError
from bnlab.net import build_net
from bnlab.precise_bn import ESTIMATORS, recalibrate, set_running_stats
from bnlab.validation import val_metrics


def _load_rank_stats(model, stats: dict) -> None:
    for name, m in model.named_modules():
        if isinstance(m, RankBatchNorm) and name in stats:
            set_running_stats(m, *stats[name])


@dataclass
class TrainedRun:
    """A run's final checkpoint as one process evaluates it."""

    state: dict
    cfg: dict
    env: dist.DistEnv
    data: Dataset
    val: Split
    model: torch.nn.Module  # the bare model with rank 0's statistics, as DDP keeps them

    def acc(self, model: torch.nn.Module | None = None, batch: int = 256) -> float:
        """Eval-mode val acc (%) of `model` (default: the loaded one)."""
        m = self.model if model is None else model
        return val_metrics(m, self.data, self.val, self.env, batch)["val/acc"]


def load_trained(path: Path, data_root: str | None = None, device: str = "cpu") -> TrainedRun:
    """The checkpoint in `path` (a run folder or checkpoint.pt), its data and its model."""
    state = checkpoint.load(path)
    try:
        train_cfg = yaml.safe_load(state["config"])
        train_cfg["dist"]["simulate"] = 1  # evaluation runs the bare model in one process
    except (KeyError, TypeError, yaml.YAMLError):
        raise BnlabError(f"checkpoint: {path} holds no bnlab run config; is it a bnlab "
                         "checkpoint?") from None
    if data_root is not None:
        train_cfg["data"]["root"] = data_root
    env = dist.DistEnv(0, 1, 0, dist.pick_device(device, 0), None)
    data = build_dataset(train_cfg["data"])
    model = build_net(train_cfg)
    model.load_state_dict(state["model"])
    model.to(env.device)
    return TrainedRun(state, train_cfg, env, data, data.val.to(env.device), model)


def _train_mode_acc(model, data, val, env, batch: int) -> float:
    return train_mode_accuracy(model, data, val, env, batch)["bn/train_mode/acc"]


def _with_stats(model: nn.Module, stats: dict, acc: Callable) -> float:
    """Val acc of a copy of `model` holding these running statistics (one rank's, or a mean)."""
    m = copy.deepcopy(model)
    _load_rank_stats(m, stats)
    return acc(m)


def _precise_acc(model: nn.Module, loader, steps: int, est: str, acc: Callable) -> float:
    """Val acc of a copy of `model` with PreciseBN statistics from `steps` batches."""
    m = copy.deepcopy(model)
    recalibrate(m, lambda: loader.images(0, steps), est)
    return acc(m)


def evaluate_run(cfg: DictConfig) -> dict:
    path = Path(cfg.run)
    run = load_trained(path, cfg.data_root, cfg.device)
    state, data, val, env, model = run.state, run.data, run.val, run.env, run.model
    acc = run.acc

    tasks: list[tuple[str, Callable[[], float]]] = []  # (row, how to get its val acc)
    tasks += [(f"eval mode, batch {b}", partial(acc, model, b)) for b in cfg.eval_batches]
    tasks += [(f"train mode, batch {b}", partial(_train_mode_acc, model, data, val, env, b))
              for b in cfg.train_mode_batches]
    ranks = state.get("rank_bn_stats") or []
    tasks += [(f"rank {r} running statistics", partial(_with_stats, model, stats, acc))
              for r, stats in enumerate(ranks)]
    if ranks:
        avg = {n: tuple(torch.stack([s[n][i] for s in ranks]).mean(0) for i in (0, 1))
               for n in ranks[0]}
        tasks.append(("average of the ranks' statistics", partial(_with_stats, model, avg, acc)))
    loader = TrainLoader(data, env.device, cfg.precise_bn_batch, 1, 0, 1, 0, augment=False)
    steps = max(1, cfg.precise_bn_samples // cfg.precise_bn_batch)
    tasks += [(f"PreciseBN ({est} estimator)",
               partial(_precise_acc, model, loader, steps, est, acc)) for est in ESTIMATORS]
    print(f"checkpoint {path} (epoch {state['epoch']}, step {state['step']}): "
          f"{len(tasks)} evaluations of {len(val)} validation images", file=sys.stderr)
    rows: dict[str, float] = {}
    with tqdm(tasks, desc="evaluate", unit="evaluation", dynamic_ncols=True,
              disable=None) as bar:  # a bar on a terminal; logs stay clean
        for name, get in bar:
            bar.set_postfix_str(name)
            rows[name] = get()
    out = {"checkpoint": str(path), "epoch": state["epoch"], "step": state["step"],
           "val_acc": rows}
    run_dir = path if path.is_dir() else path.parent
    (run_dir / "eval.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"checkpoint {path} (epoch {state['epoch']}, step {state['step']})\n")
    print("| evaluation | val acc (%) |\n|---|---|")
    print("\n".join(f"| {k} | {v:.2f} |" for k, v in rows.items()))
    print(f"\nwrote {run_dir / 'eval.json'}")
    return out


def diagnose(cfg: DictConfig) -> int:
    """The BN doctor (`python -m bnlab doctor`) on one of bnlab's models; its exit status."""
    d = cfg.diagnose
    if d.norm not in doctor.KINDS:
        raise BnlabError(f"diagnose.norm={d.norm!r} is not bn or syncbn.")
    for key in ("world", "batch_per_gpu", "min_values", "min_images"):
        if not isinstance(d[key], int) or d[key] < 1:
            raise BnlabError(f"diagnose.{key} must be a positive integer, got {d[key]!r}.")
    return doctor.report(argparse.Namespace(
        model=f"bnlab:{d.model}", input=None, world=d.world, batch_per_rank=d.batch_per_gpu,
        norm=d.norm, sync_group=0, min_values=d.min_values, min_images=d.min_images,
        json=False))


def main(cfg: DictConfig) -> None:
    try:
        if cfg.diagnose.enabled:
            raise SystemExit(diagnose(cfg))
        elif cfg.run is None:
            raise BnlabError("run is not set; pass run=<run dir or checkpoint.pt>, or "
                             "diagnose.enabled=true.")
        else:
            evaluate_run(cfg)
    except BnlabError as e:
        print(f"bnlab: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


