"""One evaluation during training: val metrics with the running statistics, PreciseBN on the
same weights, the decomposition's three ways, and the BN health probes.

Every function evaluates without changing training: buffers are put back, recalibrations
that are only measured run on a copy.
"""

from __future__ import annotations

import copy
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from bnlab import dist
from bnlab.data import Dataset, TrainLoader, val_batches
from bnlab.diagnostics import GapProbe, divergence, rank_running_stats, train_mode_accuracy
from bnlab.errors import BnlabError
from bnlab.metrics import Meter, PredictionLog
from bnlab.precise_bn import recalibrate


@torch.no_grad()
def val_metrics(model: nn.Module, data: Dataset, val, env: dist.DistEnv, batch: int,
                preds: list | None = None) -> dict:
    """Eval-mode loss and accuracy over the whole validation set, sharded across ranks;
    `preds` collects this rank's predicted classes.

    Every rank evaluates with rank 0's BN statistics (what a checkpoint keeps); its own
    buffers are put back afterwards, so evaluating never changes training.
    """
    was_training = model.training
    own = [b.clone() for b in model.buffers()] if env.distributed else []
    dist.broadcast_buffers(model)
    model.eval()
    meter = Meter(env.device)
    for x, y in val_batches(data, val, env.device, batch, env.world, env.rank):
        logits = model(x)
        meter.add(F.cross_entropy(logits, y), logits, y)
        if preds is not None:
            preds.append(logits.argmax(1))
    model.train(was_training)
    for b, saved in zip(model.buffers(), own, strict=False):
        b.copy_(saved)
    return meter.reduce("val")


def precise_bn_due(pb: dict, epoch: int, epochs: int) -> bool:
    """PreciseBN after epoch `epoch` (0-based): every `every` epochs and/or at the end."""
    last = epoch + 1 == epochs
    return (pb["every"] > 0 and (epoch + 1) % pb["every"] == 0) or (pb["at_end"] and last)


def precise_eval(model: nn.Module, cfg: dict, data: Dataset, val, env: dist.DistEnv, *,
                 epoch: int, num_samples: int, augment: bool, apply: bool, key: str,
                 preds: list | None = None) -> tuple[dict, int]:
    """Recalibrate (in place when `apply`, else on a copy) on `num_samples` training images of
    `epoch`'s order and evaluate the result; returns the val metrics and the images used."""
    pb, sim = cfg["precise_bn"], cfg["dist"]["simulate"]
    loader = TrainLoader(data, env.device, pb["batch"] * sim, env.world, env.rank, 1,
                         cfg["seed"] + 1, augment)
    steps = num_samples // loader.global_micro
    if steps == 0:
        raise BnlabError(f"{key}={num_samples} is less than one PreciseBN batch of "
                         f"{loader.global_micro} images over all ranks; raise it or lower "
                         "precise_bn.batch.")
    target = model if apply else copy.deepcopy(model)
    recalibrate(target, lambda: loader.images(epoch, steps), pb["estimator"], pb["pooling"],
                progress=env.is_main and cfg["progress"])
    return val_metrics(target, data, val, env, cfg["data"]["eval_batch"], preds), \
        steps * loader.global_micro


def run_precise_bn(model: nn.Module, cfg: dict, data: Dataset, val, env: dist.DistEnv,
                   epoch: int) -> dict:
    """Recalibrate (in place for `apply`, on a copy for `measure`) and evaluate the result."""
    pb = cfg["precise_bn"]
    t0 = time.perf_counter()
    res, n = precise_eval(model, cfg, data, val, env, epoch=epoch, num_samples=pb["num_samples"],
                          augment=pb["augment"], apply=pb["mode"] == "apply",
                          key="precise_bn.num_samples")
    return {"val/acc_precise": res["val/acc"], "val/loss_precise": res["val/loss"],
            "precise_bn/samples": n, "time/precise_bn_s": time.perf_counter() - t0}


def recalibrate_before_eval(model: nn.Module, cfg: dict, data: Dataset, env: dist.DistEnv,
                            epoch: int) -> dict:
    """PreciseBN right before an evaluation (precise_bn.before_eval, as detectron2's hook
    runs it): the running statistics recomputed in place on precise_bn.num_samples training
    images of `epoch`'s order, pooled over every rank's, so the evaluation reads them."""
    pb, sim = cfg["precise_bn"], cfg["dist"]["simulate"]
    t0 = time.perf_counter()
    loader = TrainLoader(data, env.device, pb["batch"] * sim, env.world, env.rank, 1,
                         cfg["seed"] + 1, pb["augment"])
    steps = pb["num_samples"] // loader.global_micro
    recalibrate(model, lambda: loader.images(epoch, steps), pb["estimator"], pb["pooling"],
                progress=False)
    return {"precise_bn/samples": steps * loader.global_micro,
            "time/precise_bn_s": time.perf_counter() - t0}


def classes(parts: list[torch.Tensor], env: dist.DistEnv) -> torch.Tensor:
    """The predicted classes of the whole test set in order, from every rank's share."""
    mine = torch.cat(parts).to("cpu", torch.uint8) if parts else torch.zeros(0, dtype=torch.uint8)
    return torch.cat(dist.all_gather_object(mine))


def evaluation(model: nn.Module, cfg: dict, data: Dataset, val, env: dist.DistEnv,
               preds: PredictionLog, step: int, epoch: float) -> dict:
    """One evaluation (after PreciseBN in place where `precise_bn.before_eval`): val metrics
    with the running statistics (EMA) and, with
    `record.decompose` (at evaluations after `record.decompose_after` of training), the same
    weights with (b) PreciseBN statistics of a fixed,
    un-augmented set of training images (`decomp/..._precise`) and, unless
    `record.decompose_batch` is false, (c) each rank batch's own statistics in train mode
    (`decomp/..._batch`). Each way's predictions go to `preds`."""
    rec = cfg["record"]
    record = rec["predictions"]  # the same on every rank: gathering is a collective
    keep = [] if record else None
    pre = {}
    if cfg["precise_bn"].get("before_eval", False):  # evaluations at (e, e + 1] are epoch e's
        pre = recalibrate_before_eval(model, cfg, data, env, math.ceil(epoch) - 1)
    out = {**pre, **val_metrics(model, data, val, env, cfg["data"]["eval_batch"], keep)}
    ways = [("ema", keep)]
    if rec["decompose"] and epoch > rec["decompose_after"] * cfg["epochs"] + 1e-9:
        t0 = time.perf_counter()
        kp = [] if record else None
        res, n = precise_eval(model, cfg, data, val, env, epoch=0, augment=False, apply=False,
                              num_samples=rec["decompose_samples"],
                              key="record.decompose_samples", preds=kp)
        out.update({"decomp/acc_precise": res["val/acc"], "decomp/loss_precise": res["val/loss"],
                    "decomp/samples": n})
        ways.append(("precise", kp))
        if rec.get("decompose_batch", True):  # (c): a forward per rank batch of the test set
            kb = [] if record else None
            tm = train_mode_accuracy(model, data, val, env, cfg["batch_per_gpu"], kb,
                                     cfg["data"]["eval_batch"])
            out.update({"decomp/acc_batch": tm["bn/train_mode/acc"],
                        "decomp/loss_batch": tm["bn/train_mode/loss"]})
            ways.append(("batch", kb))
        out["time/decompose_s"] = time.perf_counter() - t0
    if record:
        for kind, parts in ways:
            preds.log(step, epoch, kind, classes(parts, env))  # rank 0 writes
    return out


def bn_health(model: nn.Module, cfg: dict, data: Dataset, val, env: dist.DistEnv,
              probe: GapProbe | None) -> dict:
    """bn/... metrics at an evaluation: rank divergence, batch gap, train-mode accuracy."""
    out = divergence(rank_running_stats(model, env))
    if probe is not None:
        out.update(probe.result())
    batch = cfg["diagnostics"]["train_mode_batch"] or cfg["batch_per_gpu"]
    if batch > 1:  # one image alone: BN in train mode has nothing to normalize it with
        out.update(train_mode_accuracy(model, data, val, env, batch))
    return out
