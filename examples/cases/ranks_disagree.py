"""Case: BN running statistics differ across ranks at evaluation.

Reported as pytorch/pytorch#13711 and open-mmlab/mmdetection#2539 (and asked in
huggingface/pytorch-image-models#110: is `distribute_bn` needed?). Cause: DDP with
`broadcast_buffers=False` (or a wrapper that never syncs buffers) lets each rank keep the BN
running statistics of its own batches, so each rank evaluates a different model.

    python examples/cases/ranks_disagree.py      # 2 gloo ranks on the CPU, a few seconds

It reproduces the symptom with plain PyTorch, then shows what bnlab says about it
(`bnlab.diagnose`, which gathers every rank's statistics) and the fix working
(`bnlab.sync_bn_stats`). Its last lines: `symptom: ...`, `bnlab: ...`, `fixed: ...`.
"""

from __future__ import annotations

import gc
import os
import tempfile
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import bnlab

WORLD, STEPS = 2, 20


def net() -> nn.Module:
    torch.manual_seed(0)  # every rank starts from the same weights
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))


def batches(rank: int, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each rank's own images: rank 1's are brighter (as a sampler that splits a dataset
    sorted by source would give)."""
    g = torch.Generator().manual_seed(rank)
    return [(torch.randn(8, 3, 8, 8, generator=g) + 3.0 * rank,
             torch.randint(0, 4, (8,), generator=g)) for _ in range(n)]


def spread(model: nn.Module) -> float:
    """The largest difference of any BN running mean between the ranks (all ranks call it)."""
    means = torch.cat([m.running_mean for m in model.modules()
                       if isinstance(m, nn.BatchNorm2d)])
    every = [torch.empty_like(means) for _ in range(WORLD)]
    dist.all_gather(every, means)
    return max((e - every[0]).abs().max().item() for e in every)


def say_and_fix(model: nn.Module, r: int, fix, named: str) -> None:
    """What bnlab says (bnlab.diagnose, which gathers every rank's statistics), then `fix` on
    every rank and how far apart the ranks are after it: the cases' last two lines."""
    verdict = bnlab.diagnose(model, batches(r, 4), num_samples=32, batch_per_rank=8).verdict()
    if r == 0:
        print("bnlab: " + " ".join(line.strip() for line in verdict.splitlines()))  # one line
    fix()
    after = spread(model.module)
    if r == 0:
        print(f"fixed: after {named} they differ by up to {after:.2g}")


def run(rank_fn, world: int = WORLD) -> None:
    """`rank_fn(r)` on `world` gloo ranks, each after joining the process group (every case's
    spawn)."""
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_joined, args=(rank_fn, os.path.join(tmp, "store"), world), nprocs=world)


def _joined(r: int, rank_fn, store_path: str, world: int) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=r,
                            world_size=world)
    rank_fn(r)
    leave()


def leave() -> None:
    """Tear down in order once a case is done: every DDP wrapper of the case freed first (its
    reducer holds the process group and its threads), then every rank past its last
    collective, then the groups. Destroyed under a live wrapper, the group's threads were
    left to die with the interpreter, which aborted some runs at exit ("terminate called
    without an active exception")."""
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def rank(r: int) -> None:
    # the cause: buffers never broadcast (as the reports wrote it; newer torch names the
    # option forward_sync_buffers and warns about the old name)
    warnings.filterwarnings("ignore", "`broadcast_buffers` is deprecated")
    model = DDP(net(), broadcast_buffers=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for x, y in batches(r, STEPS):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    before = spread(model.module)
    if r == 0:
        print(f"symptom: after {STEPS} steps the ranks' BN running means differ by up to "
              f"{before:.2f}: each rank evaluates a different model")
    # the fix, at an epoch end, on every rank
    say_and_fix(model, r, lambda: bnlab.sync_bn_stats(model), "bnlab.sync_bn_stats(model)")


if __name__ == "__main__":
    run(rank)
