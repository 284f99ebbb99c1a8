"""Case: SyncBN over subgroups of ranks, given a group the rank is not in.

Reported as pytorch/pytorch#48804: to sync BN within groups of ranks, every rank must create
every group (torch.distributed.new_group is collective, even for ranks outside the group) and
pass in only the group that holds it. Cause of the silent failure: a rank given a group it is
not in reads the group's size as -1, so torch's SyncBatchNorm skips the sync and runs as plain
BN on that rank's images, with no error, and a collective over that group does nothing there.

    python examples/cases/subgroups.py     # 4 gloo ranks on the CPU, groups {0, 1} and {2, 3}

It reproduces the symptom with plain PyTorch (every rank passes the first group, as code that
indexes the groups wrongly does), then shows what bnlab says about it
(`bnlab.convert(model, "syncbn", process_group=...)` refuses a group that does not hold the
rank) and the fix working (`sync_group=2`, whose groups bnlab builds on every rank). Its last
lines: `symptom: ...`, `bnlab: ...`, `fixed: ...`.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from ranks_disagree import run  # the cases' one spawn

import bnlab
from bnlab.errors import BnlabError

WORLD, GROUP = 4, 2  # ranks, ranks per group


def images(rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(rank)
    return torch.randn(2, 4, 5, 5, generator=g) + 2.0 * rank  # each rank's 2 images


def rank(r: int) -> None:
    groups = [dist.new_group(list(range(k, k + GROUP))) for k in range(0, WORLD, GROUP)]
    wrong = groups[0]  # the mistake: every rank passes the first group
    size = dist.get_world_size(wrong)
    t = torch.ones(1)
    with warnings.catch_warnings():  # torch warns on the rank outside the group, then returns
        warnings.simplefilter("ignore")
        dist.all_reduce(t, group=wrong)
    sizes = [torch.zeros(2) for _ in range(WORLD)]
    dist.all_gather(sizes, torch.tensor([float(size), t.item()]))
    try:
        bnlab.convert(nn.BatchNorm2d(4), "syncbn", process_group=wrong)
        said = "nothing"
    except BnlabError as e:
        said = str(e)
    # the fix: bnlab builds every group on every rank; each rank syncs with its own
    layer = bnlab.convert(nn.BatchNorm2d(4), "syncbn", sync_group=GROUP)
    y = layer(images(r))
    k = r // GROUP * GROUP
    ref = nn.BatchNorm2d(4)(torch.cat([images(i) for i in range(k, k + GROUP)]))
    off = (y - ref[(r - k) * 2:(r - k + 1) * 2]).abs().max().reshape(1)
    offs, words = [torch.zeros(1) for _ in range(WORLD)], [None] * WORLD
    dist.all_gather(offs, off)
    dist.all_gather_object(words, said)
    if r == 0:
        s2, t2 = sizes[2].tolist()
        print(f"symptom: rank 2, given group {{0, 1}}, reads its size as {s2:.0f} and an "
              f"all_reduce of 1 over it leaves {t2:g} (ranks 0 and 1 get "
              f"{sizes[0][1].item():g}): torch's SyncBatchNorm there runs as plain BN, silently")
        print(f"bnlab: on rank 2, {words[2]}")
        print(f"fixed: with sync_group={GROUP} each rank's output is BatchNorm's on its group's "
              f"{2 * GROUP} images within {max(o.item() for o in offs):.1g}")


if __name__ == "__main__":
    run(rank, WORLD)
