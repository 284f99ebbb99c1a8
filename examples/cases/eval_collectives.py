"""Case: validation hangs when ranks evaluate different numbers of batches.

Reported as pytorch/pytorch#48988 (SyncBatchNorm synchronizing in eval; torch no longer does
where the layer is in eval mode). Cause, still live in torch 2.13: any collective in the
evaluation forward. DDP's wrapper, run with gradients on, broadcasts the BN buffers before each
forward; a rank with one batch more then waits at that broadcast for a rank that has finished.

    python examples/cases/eval_collectives.py   # 2 gloo ranks on the CPU, about 30 seconds

It reproduces the symptom with plain PyTorch (rank 0 evaluates 3 batches, rank 1 evaluates 2,
through the wrapper without torch.no_grad(); a 15-second timeout stands in for the hang: a
5-second one ran out once in 20 runs while a loaded machine built the wrapper), then shows
what bnlab says about it (`bnlab.count_collectives`, around one evaluation step) and the
fix working (the unwrapped model under torch.no_grad()). Its last lines: `symptom: ...`,
`bnlab: ...`, `fixed: ...`.
"""

from __future__ import annotations

import datetime
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from ranks_disagree import leave
from torch.nn.parallel import DistributedDataParallel as DDP

import bnlab

WORLD, EVAL_BATCHES, TIMEOUT = 2, (3, 2), 15.0  # rank r evaluates EVAL_BATCHES[r] batches


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))


def batch(rank: int, i: int) -> torch.Tensor:
    return torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(10 * rank + i))


def rank(r: int, store_path: str) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store_path, WORLD), rank=r,
                            world_size=WORLD)
    # the wrapper's own group, with a short timeout: its wait ends in an error, not a hang
    short = dist.new_group(timeout=datetime.timedelta(seconds=TIMEOUT))
    dist.barrier()  # both ranks here before the short group's first collective (DDP's own):
    model = DDP(net(), process_group=short)  # on a loaded machine one can start seconds late
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for i in range(3):  # training: gradients on, every rank the same number of steps
        opt.zero_grad()
        F.cross_entropy(model(batch(r, i)), torch.zeros(4, dtype=torch.long)).backward()
        opt.step()
    model.eval()
    with bnlab.count_collectives() as seen:  # one evaluation step, as the loop below runs it
        model(batch(r, 200))
    said = seen.say()
    with bnlab.count_collectives() as after, torch.no_grad():  # the fix: no wrapper, no grad
        for i in range(EVAL_BATCHES[r]):
            model.module(batch(r, 100 + i))
    start, waited = time.monotonic(), ""
    try:  # the symptom, last (a timed-out group is broken): through the wrapper, gradients on
        for i in range(EVAL_BATCHES[r]):
            model(batch(r, 100 + i))
    except RuntimeError:
        waited = f"{time.monotonic() - start:.1f} s"
    dist.barrier()  # the default group: both ranks past the failed evaluation
    waits = [None] * WORLD
    dist.all_gather_object(waits, (waited, sum(after.values())))
    if r == 0:
        print(f"symptom: through the DDP wrapper with gradients on, rank 0 ({EVAL_BATCHES[0]} "
              f"batches) failed after {waits[0][0] or 'no wait'} at its batch "
              f"{EVAL_BATCHES[1] + 1}, waiting for rank 1 ({EVAL_BATCHES[1]} batches) "
              "(a hang without the timeout)")
        print(f"bnlab: bnlab.count_collectives around one evaluation step: {said}")
        print(f"fixed: model.module under torch.no_grad() issues {waits[0][1]} and "
              f"{waits[1][1]} collectives on ranks 0 and 1: each evaluated its own number of "
              "batches")
    del model, opt  # tear down as the other cases do (ranks_disagree.leave)
    leave()


if __name__ == "__main__":
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(rank, args=(os.path.join(tmp, "store"),), nprocs=WORLD)
