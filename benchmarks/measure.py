"""The measurements behind `make bench`: each returns seconds (per step, per batch...) from
the project's own code paths or from a bare PyTorch loop written here for comparison.

Times are medians. A training step is timed from the step's first forward to the end of its
optimizer update; on CUDA the device is synchronised before each clock reading (`_sync`).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from bnlab import dist, trainer, validation
from bnlab.data import Dataset, TrainLoader, augment, build_dataset, make_synthetic
from bnlab.metrics import Meter, read_jsonl
from bnlab.models import build_model
from bnlab.net import build_net
from bnlab.optim import build_optimizer
from bnlab.precise_bn import recalibrate
from bnlab.precision import Precision

OPTIM = {"name": "sgd", "lr": 0.01, "momentum": 0.9, "weight_decay": 5e-4, "nesterov": False,
         "schedule": "constant", "warmup_epochs": 0, "step_milestones": [], "step_gamma": 1.0}


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def run_cfg(overrides: list[str]) -> dict:
    """A resolved training config, exactly as train.py composes it."""
    from bnlab.lab.spec import compose

    return compose(overrides)


# -- the trainer, end to end ------------------------------------------------------------------

def trainer_step_s(model: str, batch: int, steps: int, every: int, extra: list[str] = (),
                   threads: int = 0, device: str = "cpu") -> list[float]:
    """Seconds per optimizer step of `trainer.run` itself (loader, step, scheduler, meters,
    logging) on `device`, from the images/s it logs every `every` steps; the first interval
    (warm-up) is dropped."""
    world = next((int(o.split("=")[1]) for o in extra if o.startswith("dist.simulate=")), 1)
    # One step more than max_steps, so the run stops before the epoch's end (no evaluation).
    cfg = run_cfg([f"model={model}", "data=synthetic",
                   f"data.num_train={batch * world * (steps + 1)}", "data.num_val=32",
                   f"batch_per_gpu={batch}", "epochs=1", "eval_every=1",
                   f"max_steps={steps}", f"log_every={every}", "diagnostics.enabled=false",
                   "checkpoint=false", "progress=false", "optim.schedule=constant",
                   "optim.warmup_epochs=0", f"dist.threads={threads}", *extra])
    env = dist.init(device, "gloo" if device == "cpu" else "auto", threads=threads)
    with tempfile.TemporaryDirectory() as d:
        trainer.run(cfg, Path(d), env)
        rows = read_jsonl(Path(d) / "metrics.jsonl")
    dist.teardown()
    rates = [r["images_per_s"] for r in rows if "images_per_s" in r][1:]
    return [batch * world / r for r in rates]


def bare_step_s(model: str, batch: int, steps: int, every: int, threads: int = 0,
                channels_last: bool = False, compile_model: bool = False
                ) -> tuple[list[float], float]:
    """A hand-written loop: same model, SGD, augmentation (bnlab.data.augment) and data on
    the device; returns (seconds per step over each `every` steps after the first block,
    seconds spent before the first step finished, compile included)."""
    torch.set_num_threads(threads or torch.get_num_threads())
    torch.manual_seed(0)
    net = build_model(model)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    net = net.to(memory_format=fmt)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    fwd = torch.compile(net) if compile_model else net
    train, _ = make_synthetic(num_train=batch * 8, num_val=8)
    mean = torch.tensor([0.49, 0.48, 0.45]).view(1, 3, 1, 1)
    std = torch.tensor([0.25, 0.24, 0.26]).view(1, 3, 1, 1)
    g = torch.Generator().manual_seed(0)
    times, t_first, t0 = [], 0.0, time.perf_counter()
    for s in range(steps):
        idx = torch.randint(0, len(train), (batch,), generator=g)
        off = torch.randint(0, 9, (batch, 2), generator=g)
        flip = torch.rand(batch, generator=g) < 0.5
        x = ((augment(train.x[idx], off, flip).float() / 255 - mean) / std)
        x = x.contiguous(memory_format=fmt)
        loss = F.cross_entropy(fwd(x), train.y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if s == 0:
            t_first = time.perf_counter() - t0
        if (s + 1) % every == 0:
            times.append((time.perf_counter() - t0) / every)
            t0 = time.perf_counter()
    return times[1:], t_first


def loader_s(batch: int, steps: int) -> list[float]:
    """Seconds to produce one augmented, normalized global batch with the trainer's loader
    (CIFAR-sized synthetic images on the CPU)."""
    train, val = make_synthetic(num_train=batch * steps, num_val=8)
    loader = TrainLoader(Dataset(train, val, (0.5,) * 3, (0.25,) * 3), torch.device("cpu"),
                         batch, 1, 0, 1, seed=0, augment=True)
    out, t0 = [], time.perf_counter()
    for _ in loader.epoch(0):
        out.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
    return out


# -- DDP: simulated and real -------------------------------------------------------------------

def _ddp_cfg(model: str, norm: str | dict, simulate: int) -> dict:
    """`norm`: a kind (its defaults), or a norm config (configs/norm/<kind>.yaml's keys)."""
    norm = norm if isinstance(norm, dict) else {"kind": norm}
    return {"seed": 0, "model": {"name": model}, "norm": norm, "grad_accum": 1,
            "dist": {"broadcast_buffers": True, "simulate": simulate}, "optim": OPTIM}


def _sync(device: torch.device | str) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously), so a clock reading counts
    the work launched before it."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def ddp_step_s(model: str, norm: str | dict, batch: int, steps: int, warmup: int, simulate: int = 1,
               threads: int = 0, check_stop: bool = False, local_sync: bool = False,
               device: str = "cpu", precision: str = "fp32",
               channels_last: bool = False) -> list[float]:
    """Seconds per optimizer step with the trainer's pieces (wrap, TrainLoader, train_step),
    on this rank or for the simulated group; `check_stop` adds the trainer's per-step
    preemption agreement (a 1-element max all-reduce); `local_sync` replaces SyncBN's
    collectives by local copies (its computation without its communication); `precision`
    and `channels_last` as the run's keys (bnlab.precision)."""
    from bnlab.preempt import StopRequest

    if local_sync:
        _local_syncbn_collectives()

    env = dist.init(device, "auto", threads=threads)
    cfg = _ddp_cfg(model, norm, simulate)
    amp = Precision(precision, channels_last, env.device)
    net_model = amp.model(build_net(cfg).to(env.device))
    net = trainer.wrap(net_model, cfg, env)
    n = (steps + warmup) * batch * dist.world_size(cfg, env.world)
    train, val = make_synthetic(num_train=n, num_val=8)
    loader = TrainLoader(Dataset(train, val, (0.5,) * 3, (0.25,) * 3), env.device,
                         batch * simulate, env.world, env.rank, 1, seed=0, augment=True)
    opt, _ = build_optimizer(OPTIM, net_model, loader.steps_per_epoch, 1)
    meter, times, request = Meter(env.device), [], StopRequest()
    for i, micro in enumerate(loader.epoch(0)):
        dist.barrier()
        _sync(env.device)
        t0 = time.perf_counter()
        trainer.train_step(net, micro, opt, meter, sync_grads=env.world * simulate > 1, amp=amp)
        if check_stop:
            request.pending(env)
        _sync(env.device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    dist.teardown()
    return times


def _local_syncbn_collectives() -> None:
    """In this process, SyncBN's all_gather and all_reduce act as if every rank had sent
    this rank's tensor: same shapes and arithmetic, no communication."""
    import torch.distributed as tdist

    import bnlab.syncbn

    class Local:
        def __getattr__(self, name):
            return getattr(tdist, name)

        @staticmethod
        def all_gather(out, t, group=None):
            for o in out:
                o.copy_(t)

        @staticmethod
        def all_reduce(t, group=None, op=None):
            t.mul_(tdist.get_world_size(group))

    if not isinstance(getattr(bnlab.syncbn, "tdist", None), type(tdist)):
        raise RuntimeError("bnlab.syncbn no longer names torch.distributed `tdist`: update "
                           "_local_syncbn_collectives, or its timings keep the collectives")
    bnlab.syncbn.tdist = Local()


def real_ddp(nproc: int, *args, **kw) -> float:
    """Median seconds per step on rank 0 of `nproc` real gloo processes."""
    return median(dist.launch_local(_ddp_worker, nproc, args, kw)[0])


def _ddp_worker(args: tuple, kw: dict) -> list[float]:
    return ddp_step_s(*args, **kw)


# -- PreciseBN and evaluation -------------------------------------------------------------------

def precise_bn_s(model: str, simulate: int, batch: int, samples: int) -> float:
    """Seconds for one PreciseBN recalibration (train estimator, pooled), as the trainer
    runs it: `samples` images in batches of `batch` per rank over `simulate` ranks."""
    cfg = _ddp_cfg(model, "bn", simulate)
    net = trainer.wrap(build_net(cfg), cfg, dist.init("cpu", "gloo"))
    train, val = make_synthetic(num_train=samples, num_val=8)
    loader = TrainLoader(Dataset(train, val, (0.5,) * 3, (0.25,) * 3), torch.device("cpu"),
                         batch * simulate, 1, 0, 1, seed=1, augment=False)
    steps = samples // loader.global_micro
    t0 = time.perf_counter()
    recalibrate(net, lambda: loader.images(0, steps), "train", "pooled")
    return time.perf_counter() - t0


def device_name(device: str) -> str:
    """The device a figure was measured on, named in its row: the GPU's name, else the CPU."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return "CPU"


def eval_s(model: str, batch: int, n: int = 1024, device: str = "cpu",
           precision: str = "fp32") -> float:
    """Seconds for the trainer's evaluation of `n` validation images at batch `batch` (under
    `precision`'s autocast, as the trainer evaluates)."""
    data = build_dataset({"name": "synthetic", "num_train": 64, "num_val": n, "noise": 1.2,
                          "seed": 0, "train_limit": 0, "val_limit": 0})
    cfg = _ddp_cfg(model, "bn", 1)
    env = dist.init(device, "auto")
    net = build_net(cfg).to(env.device)
    val = data.val.to(env.device)
    amp = Precision(precision, False, env.device)
    with amp.autocast():
        validation.val_metrics(net, data, val, env, batch)  # warm-up
        _sync(env.device)
        t0 = time.perf_counter()
        validation.val_metrics(net, data, val, env, batch)
        _sync(env.device)
    return time.perf_counter() - t0


def syncbn_layer_s(shape: tuple[int, ...], reps: int, warmup: int) -> dict[str, float]:
    """Seconds for one forward and backward of one BN layer in training mode on CUDA, per
    implementation: torch's SyncBatchNorm kernels and bnlab's function (each through a
    one-rank NCCL group: the statistics' computation and one all_gather, no other rank to
    wait for), and torch's BatchNorm without any sync."""
    import torch.distributed as tdist

    from bnlab.batchnorm import RankBatchNorm
    from bnlab.syncbn import sync_batch_norm, torch_sync_batch_norm

    dev = torch.device("cuda", 0)
    tdist.init_process_group("nccl", store=tdist.HashStore(), rank=0, world_size=1,
                             device_id=dev)
    layer = RankBatchNorm(shape[1], sync="exact").to(dev)
    x = torch.randn(shape, device=dev, requires_grad=True)
    fns = {"torch SyncBatchNorm": lambda: torch_sync_batch_norm(x, layer, None),
           "bnlab syncbn": lambda: sync_batch_norm(x, layer, None),
           "torch BatchNorm, no sync": lambda: F.batch_norm(
               x, layer.running_mean, layer.running_var, layer.weight, layer.bias, True, 0.1,
               layer.eps)}
    out = {}
    for name, fn in fns.items():
        for _ in range(warmup):
            fn().sum().backward()
        _sync(dev)
        t0 = time.perf_counter()
        for _ in range(reps):
            fn().sum().backward()
        _sync(dev)
        out[name] = (time.perf_counter() - t0) / reps
    tdist.destroy_process_group()
    return out
