"""The training loop: build, train with grad accumulation, evaluate, log, checkpoint.

Reads top to bottom. It receives a resolved, validated config (a plain dict) and a DistEnv;
it never parses strings or asks how it was launched.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
import yaml
from tqdm import tqdm

from bnlab import checkpoint, dist
from bnlab.batchnorm import set_epoch, set_run_length
from bnlab.bn_sync import sync_bn_stats
from bnlab.compat import ddp
from bnlab.data import Dataset, TrainLoader, build_dataset
from bnlab.diagnostics import GapProbe, rank_running_stats
from bnlab.errors import BnlabError
from bnlab.metrics import PREDICTIONS, Meter, MetricsLogger, PredictionLog, essentials
from bnlab.net import build_net
from bnlab.optim import build_optimizer
from bnlab.precision import FP32, Precision
from bnlab.preempt import StopRequest
from bnlab.resume import load_latest, rank_state, restore, truncate_metrics
from bnlab.rundir import note_resume, set_status, write_run_info
from bnlab.simulate import SimulatedDDP
from bnlab.syncbn import syncbn_impl
from bnlab.validation import (
    bn_health,
    evaluation,
    precise_bn_due,
    run_precise_bn,
)


def ran_syncbn(cfg: dict, env: dist.DistEnv, sim: int) -> str | None:
    """Whose exact SyncBN this run computes with (run.json): "torch" (its CUDA kernels),
    "bnlab" (its own function; always under the simulation), None for another norm or for
    one rank (which syncs with nobody: plain BN runs)."""
    if cfg["norm"]["kind"] != "syncbn" or (sim <= 1 and env.world <= 1):
        return None
    return "bnlab" if sim > 1 else syncbn_impl(cfg["norm"].get("impl", "auto"), env.device)


def train_loader(cfg: dict, data: Dataset, env: dist.DistEnv) -> TrainLoader:
    """The run's training batches; a simulated run reads each global micro-batch whole (the
    same images in the same order as its real ranks would)."""
    return TrainLoader(data, env.device, cfg["batch_per_gpu"] * cfg["dist"]["simulate"],
                       env.world, env.rank, cfg["grad_accum"], cfg["seed"],
                       cfg["data"]["augment"], cfg["data"].get("rank_skew", False))


def eval_points(steps_per_epoch: int, per_epoch: int) -> set[int]:
    """1-based step counts within an epoch after which to evaluate, evenly spaced."""
    if per_epoch > steps_per_epoch:
        raise BnlabError(
            f"eval_every={per_epoch} is more than the {steps_per_epoch} optimizer steps per "
            f"epoch; lower eval_every or batch_per_gpu."
        )
    return {round((i + 1) * steps_per_epoch / per_epoch) for i in range(per_epoch)}


def dense(cfg: dict, epoch: int) -> bool:
    """Whether 0-based `epoch` evaluates `eval_every` times: every epoch ending after the first
    `eval_sparse_until` of training (before it, only the epoch end: no measure reads those)."""
    return epoch + 1 > cfg.get("eval_sparse_until", 0.0) * cfg["epochs"] + 1e-9


def train_step(model: nn.Module, micro: list, opt: torch.optim.Optimizer, meter: Meter,
               sync_grads: bool, amp: Precision = FP32) -> torch.Tensor:
    """One optimizer step over k micro-batches; DDP all-reduces only on the last one.

    Each micro-batch loss is divided by k and DDP averages over ranks, so the gradient is
    the mean over all k * world * batch_per_gpu samples. `amp`: the forward (loss included)
    under the run's autocast, fp16's loss scaling, the images' memory format.
    """
    k = len(micro)
    opt.zero_grad(set_to_none=True)
    for i, (x, y) in enumerate(micro):
        skip = sync_grads and i < k - 1
        with model.no_sync() if skip else contextlib.nullcontext():
            with amp.autocast():
                logits = model(amp.images(x))
                loss = F.cross_entropy(logits, y)  # float32 under autocast
            amp.backward(loss / k)
        meter.add(loss, logits, y)
    amp.step(opt)
    return loss.detach()


def wrap(model: nn.Module, cfg: dict, env: dist.DistEnv) -> nn.Module:
    """DDP for real ranks, SimulatedDDP for `dist.simulate` ranks in this process, or as is;
    with `compile`, the bare model compiled in place first (its state-dict keys unchanged)."""
    if cfg.get("compile"):
        model.compile()
    sync_buffers = cfg["dist"]["broadcast_buffers"]
    if cfg["dist"]["simulate"] > 1:
        return SimulatedDDP(model, cfg["dist"]["simulate"], sync_buffers)
    if env.distributed:
        ids = [env.device.index] if env.device.type == "cuda" else None
        return ddp(model, ids, sync_buffers)
    return model


class Clock:
    """Training wall time with evaluation excluded; synchronises the device when read."""

    def __init__(self, device: torch.device):
        self.device, self.total, self.t0 = device, 0.0, None

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def start(self):
        self._sync()
        self.t0 = time.perf_counter()

    def stop(self) -> float:
        self._sync()
        self.total += time.perf_counter() - self.t0
        return self.total


def save_checkpoint(run_dir: Path, cfg: dict, model: nn.Module, opt, sched,
                    meters: list[Meter], env: dist.DistEnv, epoch: int, step_in_epoch: int,
                    step: int, amp: Precision = FP32) -> None:
    """Everything needed to resume exactly at this step boundary (collective; rank 0 writes).

    `epoch`/`step_in_epoch`: where training continues (0-based epoch, steps done in it).
    """
    ranks = rank_state(model, meters, env)
    ranks_bn = rank_running_stats(model, env) if dist.world_size(cfg, env.world) > 1 else []
    if env.is_main:
        checkpoint.save(run_dir / checkpoint.CHECKPOINT, {
            "model": checkpoint.model_state(model.state_dict()), "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(), "epoch": epoch, "step": step,
            "config": yaml.safe_dump(cfg, sort_keys=False),
            "rank_bn_stats": ranks_bn,  # every rank's running statistics (C7)
            "scaler": amp.state_dict(),  # fp16's loss scale ({} otherwise)
            "resume": {"epoch": epoch, "step_in_epoch": step_in_epoch, "ranks": ranks,
                       "model": model.state_dict()},
        })


@dataclass
class Loop:
    """Everything one run's loop reads and moves: built once by `setup`, advanced by
    `train_epoch` and `end_epoch`."""

    cfg: dict
    run_dir: Path
    env: dist.DistEnv
    data: Dataset
    model: nn.Module  # the bare model (its state is what checkpoints keep)
    net: nn.Module    # what trains: DDP, SimulatedDDP or the model itself
    loader: TrainLoader
    evals: set[int]   # the steps of a dense epoch after which to evaluate
    opt: torch.optim.Optimizer
    sched: object
    val: object
    meters: list[Meter]  # [this log interval's, this epoch's]
    logger: MetricsLogger
    preds: PredictionLog
    clock: Clock
    amp: Precision    # autocast, fp16's gradient scaler, memory format
    step: int = 0
    last: dict = field(default_factory=dict)  # the latest evaluation and epoch metrics
    stopped: str = "completed"
    stop_step: int = 0
    synced: dict = field(default_factory=dict)
    logged: tuple[float, int] = (0.0, 0)  # training seconds and step at the last log line

    @property
    def spe(self) -> int:
        return self.loader.steps_per_epoch

    @property
    def ranks(self) -> int:
        return dist.world_size(self.cfg, self.env.world)

    @property
    def stop(self) -> int:
        """The last step: max_steps, else every epoch (the schedule always spans them all)."""
        return self.cfg["max_steps"] or self.spe * self.cfg["epochs"]

    def checkpoint(self, epoch: int, i: int) -> None:
        save_checkpoint(self.run_dir, self.cfg, self.model, self.opt, self.sched, self.meters,
                        self.env, epoch, i, self.step, self.amp)


def setup(cfg: dict, run_dir: Path, env: dist.DistEnv, meta: dict | None,
          resuming: bool) -> tuple[Loop, int, int]:
    """Build the run (data, model, optimizer, loggers), restore its checkpoint when resuming,
    and write run.json; returns the loop and where it continues (epoch, step in it)."""
    data = build_dataset(cfg["data"])
    amp = Precision.of(cfg, env.device)
    model = amp.model(build_net(cfg).to(env.device))
    # Every rank starts from identical weights (same seed); DDP also broadcasts rank 0's.
    net = wrap(model, cfg, env)
    sim, world = cfg["dist"]["simulate"], dist.world_size(cfg, env.world)
    loader = train_loader(cfg, data, env)
    spe = loader.steps_per_epoch
    if spe == 0:
        raise BnlabError(
            f"the training set ({len(data.train)} images) is smaller than one optimizer step "
            f"({loader.global_micro * cfg['grad_accum']} images); "
            "lower batch_per_gpu or grad_accum."
        )
    per_step = loader.global_micro * cfg["grad_accum"]
    if len(data.train) % per_step:
        dist.print0(f"bnlab: note: {len(data.train) % per_step} of the {len(data.train)} training "
                    f"images do not fill an optimizer step of {per_step} and are left out of each "
                    "epoch (different ones each epoch: the order is reshuffled).")
    dist.print0(essentials(cfg, len(data.train), len(data.val), data.size, env, per_step))
    evals = eval_points(spe, cfg["eval_every"])  # dense epochs; the others evaluate at the end
    opt, sched = build_optimizer(cfg["optim"], model, spe, cfg["epochs"], per_step)
    brn_steps = set_run_length(model, spe * cfg["epochs"] * cfg["grad_accum"])  # brn's shares
    meters = [Meter(env.device), Meter(env.device)]
    ckpt = load_latest(run_dir) if resuming else None  # after wrap: own buffers win over DDP's
    epoch0, start, step = restore(ckpt, model, opt, sched, meters, env) if ckpt else (0, 0, 0)
    amp.load_state_dict(ckpt.get("scaler", {}) if ckpt else {})
    if env.is_main:
        info = {"world": world, "simulated": sim > 1, "processes": env.world,
                "device": str(env.device), "backend": env.backend, "steps_per_epoch": spe,
                "syncbn_impl": ran_syncbn(cfg, env, sim), "lr": opt.defaults["lr"],
                **({"brn_ramp": brn_steps} if brn_steps else {}), **(meta or {})}
        if resuming:
            truncate_metrics(run_dir, step, PREDICTIONS)
            dropped = truncate_metrics(run_dir, step)
            differs = note_resume(run_dir, step, dropped, str(env.device))
            if differs and differs != ["not recorded"]:
                dist.print0(f"bnlab: warning: this resume computes with another "
                            f"{', '.join(differs)} than the run's start (run.json's floats): "
                            "from here its numbers are not those of one uninterrupted run.")
            dist.print0(f"resuming {run_dir} at step {step} (epoch {epoch0 + 1}, step "
                        f"{start} of {spe}); dropped {dropped} metrics line(s) past it")
        else:
            write_run_info(run_dir, cfg, info)
        set_status(run_dir, "running", step=step)
    warn_bn_sync(cfg, world)
    logger = MetricsLogger(run_dir, env.is_main, cfg, console=False,
                           wandb_cfg=cfg["logger"]["wandb"])
    preds = PredictionLog(run_dir, env.is_main and cfg["record"]["predictions"], data.val.y)
    loop = Loop(cfg, run_dir, env, data, model, net, loader, evals, opt, sched,
                data.val.to(env.device), meters, logger, preds, Clock(env.device), amp, step=step,
                logged=(0.0, step))
    return loop, epoch0, start


def warn_bn_sync(cfg: dict, ranks: int) -> None:
    bn_sync = cfg["dist"]["bn_sync"]
    if bn_sync != "none" and cfg["dist"]["broadcast_buffers"] and ranks > 1:
        dist.print0(f"bnlab: warning: dist.bn_sync={bn_sync} changes little here: with "
                    f"dist.broadcast_buffers=true every rank already takes rank 0's BN "
                    f"statistics at each forward; set dist.broadcast_buffers=false to let the "
                    f"ranks keep their own until the epoch end.")


def log_train(lp: Loop, epoch: int, i: int, loss: torch.Tensor) -> dict:
    """The train-metrics line (every `log_every` steps and at the epoch's end). A loss that is
    not finite stops the run as diverged (the same reduced value on every rank, so every rank
    stops together)."""
    elapsed = lp.clock.stop()
    step_meter, epoch_meter = lp.meters
    epoch_meter.t += step_meter.t  # every step of the epoch passes through here
    t0, s0 = lp.logged
    per_step = lp.loader.global_micro * lp.cfg["grad_accum"]
    rec = {"step": lp.step, "epoch": epoch + i / lp.spe, "lr": lp.opt.param_groups[0]["lr"],
           **step_meter.reduce("train"),
           # rank 0's last loss: the sparse sample a naive logger shows
           "train/loss_rank0": float(loss),
           "images_per_s": (lp.step - s0) * per_step / max(elapsed - t0, 1e-9)}
    lp.logged = (elapsed, lp.step)
    lp.logger.log(rec, echo=False)
    lp.clock.start()
    if not math.isfinite(rec["train/loss"]) and lp.cfg["on_nan"] == "stop":
        lp.stopped, lp.stop_step = "diverged", lp.step
    return rec


def evaluate_now(lp: Loop, epoch: int, i: int, probe: GapProbe | None) -> None:
    """One evaluation (and the BN health metrics), timed apart from training."""
    lp.clock.stop()
    at = epoch + i / lp.spe
    with lp.amp.autocast():  # evaluated as it trains
        lp.last = {"step": lp.step, "epoch": at,
                   **evaluation(lp.model, lp.cfg, lp.data, lp.val, lp.env, lp.preds, lp.step, at)}
        if lp.cfg["diagnostics"]["enabled"]:
            lp.last.update(bn_health(lp.model, lp.cfg, lp.data, lp.val, lp.env, probe))
    lp.logger.log(lp.last, echo=False)
    lp.clock.start()


def train_epoch(lp: Loop, epoch: int, first: int, request: StopRequest) -> int:
    """Train `epoch` from its step `first`: step, log, evaluate, sync BN at its end, and stop
    on a request or a non-finite loss. Returns the epoch's last step (1-based)."""
    cfg, spe = lp.cfg, lp.spe
    set_epoch(lp.model, epoch)
    lp.net.train()
    here = lp.evals if dense(cfg, epoch) else {spe}
    every = cfg["checkpoint_every"] if cfg["checkpoint"] else 0
    bar = tqdm(total=spe, initial=first, desc=f"epoch {epoch + 1}/{cfg['epochs']}", leave=False,
               disable=not (lp.env.is_main and cfg["progress"]), dynamic_ncols=True)
    i = first
    for i, micro in enumerate(lp.loader.epoch(epoch, first), start=first + 1):
        probe = GapProbe(lp.model) if cfg["diagnostics"]["enabled"] and i in here else None
        with probe or contextlib.nullcontext():
            loss = train_step(lp.net, micro, lp.opt, lp.meters[0], lp.ranks > 1, lp.amp)
        lp.sched.step()
        lp.step += 1
        bar.update(1)
        if lp.step % cfg["log_every"] == 0 or i == spe or lp.step == lp.stop:
            rec = log_train(lp, epoch, i, loss)
            bar.set_postfix(loss=f"{rec['train/loss']:.3f}")
            if lp.stopped == "diverged":
                break
        if i == spe and cfg["dist"]["bn_sync"] != "none":  # the epoch end, before evaluating
            lp.clock.stop()
            lp.synced = sync_bn_stats(lp.net, cfg["dist"]["bn_sync"])
            lp.clock.start()
        if i in here:
            evaluate_now(lp, epoch, i, probe)
        if request.pending(lp.env):
            lp.checkpoint(epoch, i)
            lp.stopped, lp.stop_step = "preempted", lp.step
            break
        if every and lp.step % every == 0 and i < spe:
            lp.checkpoint(epoch, i)
        if lp.step == lp.stop:
            break
    bar.close()
    return i


def end_epoch(lp: Loop, epoch: int) -> None:
    """The epoch's metrics, PreciseBN when due, the console line and the checkpoint."""
    cfg = lp.cfg
    ep = {"step": lp.step, "epoch": epoch + 1, **lp.meters[1].reduce("train_epoch"),
          "time/train_s": lp.clock.stop(),
          **(lp.synced if cfg["dist"]["bn_sync"] != "none" else {})}
    if precise_bn_due(cfg["precise_bn"], epoch, cfg["epochs"]):
        with lp.amp.autocast():  # recalibrated on the activations the run computes
            ep.update(run_precise_bn(lp.model, cfg, lp.data, lp.val, lp.env, epoch))
    lp.logger.log(ep, echo=False)
    lp.last = {**lp.last, **ep}
    dist.print0(f"epoch {epoch + 1}/{cfg['epochs']}  train/loss {ep['train_epoch/loss']:.4f}  "
                f"val/acc {lp.last.get('val/acc', float('nan')):.2f}")
    if cfg["checkpoint"]:
        lp.checkpoint(epoch + 1, 0)
    lp.clock.start()


def cut_short(lp: Loop, epoch: int, i: int) -> None:
    """max_steps ended training within an epoch: evaluate there (unless that step just did)
    and checkpoint, so the run leaves something to look at and can be extended."""
    if lp.last.get("step") != lp.step:
        evaluate_now(lp, epoch, i, None)
    if lp.cfg["checkpoint"]:
        lp.checkpoint(epoch, i)


def run(cfg: dict, run_dir: Path, env: dist.DistEnv, meta: dict | None = None,
        resuming: bool = False) -> dict:
    """Train one run; rank 0 writes everything under `run_dir`. Returns the final metrics,
    with `stopped` = completed | diverged | preempted and the step."""
    run_dir = Path(run_dir)
    lp, epoch0, start = setup(cfg, run_dir, env, meta, resuming)
    lp.clock.start()
    with StopRequest() as request:
        for epoch in range(epoch0, cfg["epochs"]):
            if lp.step >= lp.stop:
                break
            i = train_epoch(lp, epoch, start if epoch == epoch0 else 0, request)
            if lp.stopped != "completed":
                break
            if lp.step == lp.stop and i < lp.spe:  # max_steps within the epoch
                cut_short(lp, epoch, i)
                break
            end_epoch(lp, epoch)
    lp.logger.close()
    lp.preds.close()
    if env.is_main:
        detail = {"signal": request.signum} if lp.stopped == "preempted" else {}
        if lp.stopped == "completed" and lp.stop < lp.spe * cfg["epochs"]:
            detail["max_steps"] = lp.stop  # a larger max_steps (or 0) extends it later
        set_status(run_dir, lp.stopped, step=lp.stop_step or lp.step, **detail)
    return {**lp.last, "stopped": lp.stopped, "step": lp.stop_step or lp.step,
            "steps": lp.stop, "schedule": lp.spe * cfg["epochs"], "train_s": lp.clock.total,
            "val_images": len(lp.data.val)}
