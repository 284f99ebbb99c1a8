"""Case: BN under gradient accumulation normalizes the micro-batch, not the batch SGD steps on.

Asked in Lightning-AI's issue #17446 (SyncBN or BN with `accumulate_grad_batches`). Cause:
each forward pass normalizes its own micro-batch; accumulating k of them gives the optimizer
k times the images but BN still sees one micro-batch at a time, so the step is not the step of
the large batch, and at a few images per micro-batch BN is at risk.

    python examples/cases/accumulation.py     # one process on the CPU, a few seconds

It reproduces the symptom with plain PyTorch (4 accumulated micro-batches of 2 against one
batch of the same 8 images: different gradients), then shows what bnlab says about it
(`bnlab.doctor.check(..., grad_accum=4)`) and a fix working (`bnlab.convert(model, "gn")`:
with no batch statistics the accumulated step is the large batch's). Its last lines:
`symptom: ...`, `bnlab: ...`, `fixed: ...`.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

import bnlab
from bnlab.doctor import check

MICRO, K = 2, 4


def gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor, micro: int) -> torch.Tensor:
    """All parameters' gradient of the mean loss over x, accumulated over micro-batches."""
    model = copy.deepcopy(model).train()
    for xs, ys in zip(x.split(micro), y.split(micro), strict=True):
        (F.cross_entropy(model(xs), ys) * len(ys) / len(y)).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def gap(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """How far k accumulated micro-batches' gradient is from one batch's (relative)."""
    big, acc = gradient(model, x, y, len(y)), gradient(model, x, y, MICRO)
    return ((acc - big).norm() / big.norm()).item()


if __name__ == "__main__":
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    x, y = torch.randn(MICRO * K, 3, 32, 32), torch.randint(0, 10, (MICRO * K,))
    print(f"symptom: {K} accumulated micro-batches of {MICRO} give a gradient that differs "
          f"from one batch's of the same {MICRO * K} images by {gap(model, x, y):.0f} times "
          "that gradient's norm (layer4 normalizes 2 values per channel)")
    risky, tips = check(model, (3, 32, 32), 1, MICRO, grad_accum=K)
    print(f"bnlab: {len(risky)} BN layers at risk; {tips[0]}")
    gn = bnlab.convert(copy.deepcopy(model), "gn", groups=32)
    print(f"fixed: with bnlab.convert(model, 'gn', groups=32) the accumulated gradient is "
          f"{gap(gn, x, y):.1g} (relative) from the batch's")
