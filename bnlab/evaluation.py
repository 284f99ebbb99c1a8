"""Evaluate a saved run's BN statistics (claims C7, C8, C10), or run the doctor offline;
and `python -m bnlab diagnose`, bnlab.diagnose's command, for any model or a bnlab run.

For a checkpoint: eval-mode accuracy at several batch sizes (must not change) and train-mode
accuracy at several (the trainer's own measure, on a copy), then bnlab.diagnose, which
measures the same for any model: accuracy with each rank's running statistics and their
average (where the run kept them) and after PreciseBN with both estimators. Printed as a table
and written to eval.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn as nn
import yaml
from tqdm import tqdm

from bnlab import checkpoint, dist, doctor, modelref
from bnlab.batchnorm import set_epoch
from bnlab.cli import emit, imported
from bnlab.data import Dataset, Split, TrainLoader, build_dataset
from bnlab.defaults import DOCTOR_KINDS
from bnlab.diagnose import Diagnosis, accuracy
from bnlab.diagnose import diagnose as diagnose_model
from bnlab.diagnostics import train_mode_accuracy
from bnlab.errors import BnlabError
from bnlab.net import build_net
from bnlab.precise_bn import ESTIMATORS
from bnlab.validation import val_metrics

if TYPE_CHECKING:  # evaluate.py's config (the train extra); the doctor and diagnose need none
    from omegaconf import DictConfig


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
    # frozen BN's freeze is no buffer: set it as the checkpoint's last step trained
    # (`epoch` is where training would go on; no step of it done means the one before)
    at = state["epoch"] - (not state.get("resume", {}).get("step_in_epoch", 0))
    set_epoch(model, max(at, 0))
    model.to(env.device)
    return TrainedRun(state, train_cfg, env, data, data.val.to(env.device), model)


def _train_mode_acc(model, data, val, env, batch: int) -> float:
    return train_mode_accuracy(model, data, val, env, batch)["bn/train_mode/acc"]


def _diagnosis(model: nn.Module, loader, steps: int, acc: Callable, ranks: list) -> Diagnosis:
    """bnlab.diagnose on the run's model: its training images (`steps` batches, unaugmented)
    for PreciseBN, val acc as the metric, each rank's running statistics where the run kept
    them."""
    images = list(loader.images(0, steps))
    return diagnose_model(model, images, evaluate=acc, num_samples=sum(map(len, images)),
                          rank_stats=ranks or None, per_rank=len(ranks) > 1)


def evaluate_run(cfg: DictConfig) -> dict:
    path = Path(cfg.run)
    run = load_trained(path, cfg.data_root, cfg.device)
    state, data, val, env, model = run.state, run.data, run.val, run.env, run.model
    acc = run.acc

    # eval mode at several batches (it must not matter: C10) and train mode at several (the
    # trainer's bn/train_mode/acc, a lone last image left out), then bnlab.diagnose: each
    # rank's statistics and their average, PreciseBN with both estimators
    tasks: list[tuple[str, Callable[[], float]]] = []  # (row, how to get its val acc)
    tasks += [(f"eval mode, batch {b}", partial(acc, model, b)) for b in cfg.eval_batches]
    tasks += [(f"train mode, batch {b}", partial(_train_mode_acc, model, data, val, env, b))
              for b in cfg.train_mode_batches]
    ranks = state.get("rank_bn_stats") or []
    loader = TrainLoader(data, env.device, cfg.precise_bn_batch, 1, 0, 1, 0, augment=False)
    steps = max(1, cfg.precise_bn_samples // cfg.precise_bn_batch)
    report: list[Diagnosis] = []
    tasks.append(("bnlab.diagnose: each rank's statistics, PreciseBN (both estimators)",
                  lambda: report.append(_diagnosis(model, loader, steps, acc, ranks))))
    print(f"checkpoint {path} (epoch {state['epoch']}, step {state['step']}): "
          f"{len(tasks) - 1} evaluations and bnlab.diagnose on {len(val)} validation images",
          file=sys.stderr)
    rows: dict[str, float] = {}
    with tqdm(tasks, desc="evaluate", unit="step", dynamic_ncols=True,
              disable=None) as bar:  # a bar on a terminal; logs stay clean
        for name, get in bar:
            bar.set_postfix_str(name)
            rows[name] = get()
    del rows[tasks[-1][0]]
    d = report[0]
    rows.update({f"rank {r} running statistics": v for r, v in enumerate(d.by_rank)})
    if d.rank_average is not None:
        rows["average of the ranks' statistics"] = d.rank_average
    rows.update({f"PreciseBN ({est} estimator)": d.precise[est] for est in ESTIMATORS})
    out = {"checkpoint": str(path), "epoch": state["epoch"], "step": state["step"],
           "val_acc": rows}
    run_dir = path if path.is_dir() else path.parent
    (run_dir / "eval.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"checkpoint {path} (epoch {state['epoch']}, step {state['step']})\n")
    print("| evaluation | val acc (%) |\n|---|---|")
    print("\n".join(f"| {k} | {v:.2f} |" for k, v in rows.items()))
    print(f"\nwrote {run_dir / 'eval.json'}")
    return out


def run_doctor(cfg: DictConfig) -> int:
    """The BN doctor (`python -m bnlab doctor`) on one of bnlab's models; its exit status."""
    d = cfg.doctor
    if d.norm not in DOCTOR_KINDS:
        raise BnlabError(f"doctor.norm={d.norm!r} is not bn or syncbn.")
    for key in ("world", "batch_per_gpu", "min_values", "min_images"):
        if not isinstance(d[key], int) or d[key] < 1:
            raise BnlabError(f"doctor.{key} must be a positive integer, got {d[key]!r}.")
    # the doctor's own parser, so every option it gains has its default here too
    from bnlab.commands import add_doctor

    sub = argparse.ArgumentParser().add_subparsers()
    add_doctor(sub)
    args = sub.choices["doctor"].parse_args(
        ["--model", f"bnlab:{d.model}", "--world", str(d.world), "--batch-per-rank",
         str(d.batch_per_gpu), "--norm", d.norm, "--min-values", str(d.min_values),
         "--min-images", str(d.min_images)])
    return doctor.report(args)


def main(cfg: DictConfig) -> None:
    try:
        if cfg.doctor.enabled:
            raise SystemExit(run_doctor(cfg))
        elif cfg.run is None:
            raise BnlabError("run is not set; pass run=<run dir or checkpoint.pt>, or "
                             "doctor.enabled=true.")
        else:
            evaluate_run(cfg)
    except BnlabError as e:
        print(f"bnlab: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


# ----------------------------------------------------------------------------------------
# python -m bnlab diagnose


def _factory(spec: str, what: str) -> Callable:
    """`--loader`'s function (bnlab.cli.imported)."""
    fn = imported(spec, what)
    if not callable(fn):
        raise BnlabError(f"--{what} {spec!r} is no function; give one that returns batches.")
    return fn


def load_weights(model: nn.Module, path: Path) -> None:
    """A state dict (or a checkpoint holding one under 'model' or 'state_dict') into `model`."""
    state = checkpoint.load(path)
    if isinstance(state, dict):
        state = state.get("model", state.get("state_dict", state))
    try:
        model.load_state_dict(checkpoint.model_state(state))
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0]
        raise BnlabError(f"--checkpoint {path} does not fit --model ({first}); give the "
                         "weights of this model.") from None


def _own_run(args: argparse.Namespace) -> tuple[nn.Module, list, Callable, int, list | None]:
    """A bnlab run's model, training images (unaugmented), val acc, per-rank batch and its
    ranks' running statistics (where the run kept them)."""
    run = load_trained(Path(args.model), args.data_root)
    batch = 32  # PreciseBN's batch, as evaluate.py's default (configs/evaluate.yaml)
    loader = TrainLoader(run.data, run.env.device, batch, 1, 0, 1, 0, augment=False)
    steps = max(1, -(-args.num_samples // batch))
    return (run.model, list(loader.images(0, steps)), run.acc, run.cfg["batch_per_gpu"],
            run.state.get("rank_bn_stats") or None)


def diagnose_command(args: argparse.Namespace) -> int:
    """`python -m bnlab diagnose`: the table, the JSON; exit 1 above the threshold."""
    if args.loader is None:
        if ":" in args.model:
            raise BnlabError("--loader is needed for your own model (<module>:<function> "
                             "returning its training batches); without it --model must be a "
                             "bnlab run or its checkpoint.pt.")
        model, batches, evaluate, batch, ranks = _own_run(args)
    else:
        model, _ = modelref.load_model(args.model)
        if args.checkpoint is not None:
            load_weights(model, Path(args.checkpoint))
        batches, batch, ranks = _factory(args.loader, "loader")(), None, None
        evaluate = None
        if args.val_loader:
            evaluate = accuracy(list(_factory(args.val_loader, "val-loader")()),
                                lambda b: b[0], lambda b: b[1])
    report = diagnose_model(model, batches, evaluate=evaluate, num_samples=args.num_samples,
                            batch_per_rank=args.batch_per_rank or batch, threshold=args.threshold,
                            rank_stats=ranks, per_rank=args.per_rank)
    report.doctor = f"{getattr(args, 'prog', 'bnlab')} doctor"  # as the user called bnlab
    emit(args.json, report.table(), report.to_json())
    return 1 if report.cost > args.threshold else 0
