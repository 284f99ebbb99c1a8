"""Case: after PreciseBN, the ranks hold different BN statistics.

Reported as facebookresearch/detectron2#5398. Cause: fvcore's `update_bn_stats` (which
detectron2's PreciseBN hook calls) averages the statistics of the batches each rank reads,
with no all-reduce, so every rank keeps the statistics of its own shard of the data.

    python examples/cases/precise_bn_per_rank.py   # 2 gloo ranks on the CPU; needs fvcore

It reproduces the symptom with fvcore, then shows what bnlab says about it (`bnlab.diagnose`,
which gathers every rank's statistics) and the fix working (`bnlab.precise_bn`, whose
per-channel sums are reduced across ranks: every rank ends with the statistics of the union).
Its last lines: `symptom: ...`, `bnlab: ...`, `fixed: ...`.
"""

from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from fvcore.nn.precise_bn import update_bn_stats
from ranks_disagree import WORLD, batches, net, spread
from torch.nn.parallel import DistributedDataParallel as DDP

import bnlab


def rank(r: int, store_path: str) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store_path, WORLD), rank=r,
                            world_size=WORLD)
    model = DDP(net())                       # identical weights and buffers on every rank
    shard = batches(r, 8)                    # each rank's own part of the training data
    update_bn_stats(model.module, [x for x, _ in shard], num_iters=len(shard))  # the cause
    before = spread(model.module)            # a collective: every rank calls it
    if r == 0:
        print(f"symptom: after fvcore's update_bn_stats the ranks' BN running means differ "
              f"by up to {before:.2f}")
    verdict = bnlab.diagnose(model, batches(r, 4), num_samples=32, train_batch=8).verdict()
    if r == 0:
        print(f"bnlab: {verdict}")
    bnlab.precise_bn(model, shard, num_samples=None)   # the fix: sums reduced across ranks
    after = spread(model.module)
    if r == 0:
        print(f"fixed: after bnlab.precise_bn(model, batches) they differ by up to {after:.2g}")
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(rank, args=(os.path.join(tmp, "store"),), nprocs=WORLD)
