"""Step time, measured side by side in one run: simulated ranks vs real gloo DDP, SyncBN vs BN.

    uv run python benchmarks/sim_vs_ddp.py [--model resnet18] [--steps 30]

Every configuration runs the trainer's own pieces (build_net, wrap, TrainLoader, train_step)
on generated CIFAR-shaped data. Times are medians over optimizer steps after warm-up; ratios
compare figures from this one run on this one machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch

from bnlab import dist
from bnlab.data import Dataset, TrainLoader, make_synthetic
from bnlab.metrics import Meter
from bnlab.optim import build_optimizer
from bnlab.trainer import build_net, train_step, wrap

OPTIM = {"lr": 0.01, "momentum": 0.9, "weight_decay": 5e-4, "nesterov": False,
         "schedule": "constant", "warmup_epochs": 0, "step_milestones": [], "step_gamma": 1.0}


def _cfg(model: str, norm: str, simulate: int) -> dict:
    return {"seed": 0, "model": {"name": model}, "norm": {"kind": norm}, "grad_accum": 1,
            "dist": {"broadcast_buffers": True, "simulate": simulate}, "optim": OPTIM}


def step_times(model: str, norm: str, batch: int, steps: int, warmup: int, simulate: int = 1,
               threads: int = 0) -> list[float]:
    """Seconds per optimizer step on this rank (or the simulated group)."""
    env = dist.init("cpu", "gloo", threads=threads)
    cfg = _cfg(model, norm, simulate)
    net_model = build_net(cfg)
    net = wrap(net_model, cfg, env)
    n = (steps + warmup) * batch * env.world * simulate
    train, val = make_synthetic(num_train=n, num_val=8)
    loader = TrainLoader(Dataset(train, val, (0.5,) * 3, (0.25,) * 3), env.device,
                         batch * simulate, env.world, env.rank, 1, seed=0, augment=True)
    opt, _ = build_optimizer(OPTIM, net_model, loader.steps_per_epoch, 1)
    meter, times = Meter(env.device), []
    for i, micro in enumerate(loader.epoch(0)):
        t0 = time.perf_counter()
        train_step(net, micro, opt, meter, sync_grads=env.world * simulate > 1)
        dist.barrier()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    dist.teardown()
    return times


def real(nproc: int, *args) -> float:
    return statistics.median(dist.launch_local(step_times, nproc, *args)[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--batch", type=int, default=2, help="images per rank")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    a = p.parse_args()
    common = (a.model, "bn", a.batch, a.steps, a.warmup)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}; model {a.model}, {a.batch} images per rank, "
          f"median of {a.steps} steps")
    rows = []
    sim4 = statistics.median(step_times(*common, simulate=4))
    ddp4 = real(4, *common)
    rows.append(("simulated 4 x 2 (1 process)", sim4, "real 4-process gloo DDP x 2", ddp4))
    for world in (2, 4):
        bn = real(world, *common)
        sync = real(world, a.model, "syncbn", a.batch, a.steps, a.warmup)
        rows.append((f"syncbn, {world}-process gloo", sync, f"bn, {world}-process gloo", bn))
    print("\n| measured | s/step | against | s/step | ratio |\n|---|---|---|---|---|")
    for name, t, ref_name, ref in rows:
        print(f"| {name} | {t:.4f} | {ref_name} | {ref:.4f} | {t / ref:.2f}x |")
    print(f"\nsimulation speed-up over real DDP at 4 x {a.batch}: {ddp4 / sim4:.2f}x")


if __name__ == "__main__":
    main()
