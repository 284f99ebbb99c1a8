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

import sys

from ranks_disagree import batches, net, run, say_and_fix, spread
from torch.nn.parallel import DistributedDataParallel as DDP

import bnlab

try:
    from fvcore.nn.precise_bn import update_bn_stats  # the symptom is fvcore's own
except ImportError:
    print("precise_bn_per_rank.py: this case reproduces fvcore's PreciseBN and needs fvcore; "
          "install it (pip install fvcore; make install has it), then run it again.",
          file=sys.stderr)
    sys.exit(2)


def rank(r: int) -> None:
    model = DDP(net())                       # identical weights and buffers on every rank
    shard = batches(r, 8)                    # each rank's own part of the training data
    update_bn_stats(model.module, [x for x, _ in shard], num_iters=len(shard))  # the cause
    before = spread(model.module)            # a collective: every rank calls it
    if r == 0:
        print(f"symptom: after fvcore's update_bn_stats the ranks' BN running means differ "
              f"by up to {before:.2f}")
    # the fix: bnlab.precise_bn's sums are reduced across ranks
    say_and_fix(model, r, lambda: bnlab.precise_bn(model, shard, num_samples=None),
                "bnlab.precise_bn(model, batches)")


if __name__ == "__main__":
    run(rank)
