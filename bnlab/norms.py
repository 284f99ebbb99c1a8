"""Normalization registry: the config group `norm/` picks one entry by `kind`.

Models are built with `nn.BatchNorm2d`; `convert_norm` swaps every BN layer for the kind
under test before DDP wraps the model.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.parallel import DistributedDataParallel

from bnlab.errors import BnlabError


def _bn(bn: nn.BatchNorm2d, name: str, eps: float = 1e-5, momentum: float = 0.1) -> nn.Module:
    """Plain BatchNorm: statistics of this rank's batch only."""
    return nn.BatchNorm2d(bn.num_features, eps=eps, momentum=momentum)


def _gn(bn: nn.BatchNorm2d, name: str, groups: int = 32, cap_groups: bool = False,
        eps: float = 1e-5) -> nn.Module:
    """GroupNorm: per-sample statistics over groups of channels; independent of the batch."""
    c = bn.num_features
    g = min(groups, c) if cap_groups else groups
    if c % g:
        raise BnlabError(
            f"norm.groups={groups} does not divide the {c} channels of layer '{name}'; "
            f"choose a divisor of every layer's channels or set norm.cap_groups=true."
        )
    return nn.GroupNorm(g, c, eps=eps)


NORMS: dict[str, Callable[..., nn.Module]] = {
    "bn": _bn,
    "gn": _gn,
}


def convert_norm(model: nn.Module, kind: str, **opts) -> nn.Module:
    """Replace every BatchNorm2d of `model` (in place) by the normalization `kind`."""
    if isinstance(model, DistributedDataParallel):
        raise BnlabError(
            "convert_norm was called on a model already wrapped in DistributedDataParallel; "
            "convert the bare model first, then wrap it (DDP must see the final layers)."
        )
    if kind not in NORMS:
        raise BnlabError(f"norm.kind='{kind}' is unknown; choose one of {sorted(NORMS)}.")
    make = NORMS[kind]
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, nn.BatchNorm2d):
                full = f"{parent_name}.{child_name}".lstrip(".")
                setattr(parent, child_name, make(child, full, **opts))
    return model


def bn_value_counts(model: nn.Module, batch_per_gpu: int, image_shape=(3, 32, 32)) -> dict:
    """Values per channel that each BN layer normalizes over on one rank (N x H x W)."""
    counts: dict[str, int] = {}
    hooks = [
        m.register_forward_hook(
            lambda mod, inp, out, n=name: counts.__setitem__(
                n, batch_per_gpu * inp[0].shape[2:].numel()
            )
        )
        for name, m in model.named_modules()
        if isinstance(m, _BatchNorm)
    ]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(torch.zeros(1, *image_shape))
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    return counts
