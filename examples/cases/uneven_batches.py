"""Case: SyncBN with uneven or empty per-rank batches.

Reported as pytorch/pytorch#22192 (the running variance weighted wrongly when ranks hold
different numbers of samples) and #36530 (a crash on an empty per-rank batch, as the last
batch of a sharded evaluation set gives). Cause: statistics merged as if every rank held the
same count, and no path for a rank with no samples.

    python examples/cases/uneven_batches.py    # 2 gloo ranks on the CPU, a few seconds

It reproduces the symptom with plain PyTorch (each rank's mean and variance averaged over the
ranks, the merge that ignores the counts: torch's own SyncBatchNorm has no CPU kernels), then
shows bnlab's SyncBN (`bnlab.convert(model, "syncbn")`) equal to BatchNorm on the concatenated
batch, counts weighted, and running with an empty rank. Its last lines: `symptom: ...`,
`bnlab: ...`, `fixed: ...`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from ranks_disagree import run  # the cases' one spawn

import bnlab

WORLD, SIZES = 2, (3, 1)  # images per rank: uneven (and, second, rank 1 empty)


def images(n: int, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(rank)
    return torch.randn(n, 4, 5, 5, generator=g) * 2 + 3 * rank


def gathered(t: torch.Tensor) -> list[torch.Tensor]:
    every = [torch.empty_like(t) for _ in range(WORLD)]
    dist.all_gather(every, t)
    return every


def rank(r: int) -> None:
    x = images(SIZES[r], r)
    union = torch.cat([images(n, i) for i, n in enumerate(SIZES)])
    ref = nn.BatchNorm2d(4, momentum=None)(union)  # BatchNorm on the concatenated batch
    # the symptom: each rank's mean and variance averaged over the ranks, counts ignored
    mean, var = x.mean((0, 2, 3)), x.var((0, 2, 3), unbiased=False)
    naive_var = torch.stack(gathered(var)).mean(0) + torch.stack(gathered(mean)).var(0, False)
    wrong = (naive_var - union.var((0, 2, 3), unbiased=False)).abs().max().item()
    layer = bnlab.convert(nn.BatchNorm2d(4, momentum=None), "syncbn")
    y = layer(x)
    lo = sum(SIZES[:r])
    right = (y - ref[lo:lo + SIZES[r]]).abs().max().item()
    empty = bnlab.convert(nn.BatchNorm2d(4, momentum=None), "syncbn")
    out = empty(images(sum(SIZES) if r == 0 else 0, 0))  # rank 1 has no image at all
    own = images(sum(SIZES), 0).mean((0, 2, 3))            # rank 0's images' mean
    off = max(d.item() for d in gathered((empty.running_mean - own).abs().max().reshape(1)))
    if r == 0:
        print(f"symptom: averaging the ranks' statistics over {SIZES[0]} + {SIZES[1]} images "
              f"misses the batch's variance by up to {wrong:.2f}")
        print(f"bnlab: bnlab.convert(model, 'syncbn') merges the ranks' (count, mean, M2): "
              f"its output is BatchNorm's on the concatenated batch within {right:.1g}")
        print(f"fixed: with rank 1 empty it runs too ({tuple(out.shape)} here, an empty output "
              f"there), every rank's running mean that of rank 0's images within {off:.1g}")


if __name__ == "__main__":
    run(rank, WORLD)
