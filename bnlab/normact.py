"""timm's norm-act layers: a BatchNorm, its drop path and its activation in one module.

timm fuses a norm with what follows it (`BatchNormAct2d`: BN, then `drop`, then `act`, both
child modules; `SyncBatchNormAct` after timm's `convert_sync_batchnorm`). `convert` rebuilds
the norm as any kind and keeps the two children: the converted layer is the kind's layer with
a `drop` and an `act` (`with_act`), under the same parameter and buffer names, so a timm
checkpoint loads into it. `revert` gives timm's class back (`reverts_to`), drop and act
included. Nothing here imports
timm: its layers are known by their forward's module and class name.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from bnlab.batchnorm import RankBatchNorm

# (module, class) of the timm forwards that are a BN followed by self.drop then self.act
_TIMM_NORM_ACT = {("timm.layers.norm_act", "BatchNormAct2d"),
                  ("timm.layers.norm_act", "SyncBatchNormAct")}


class NormAct:
    """Mixin: the layer's own forward, then its drop path, then its activation (timm's)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.drop(super().forward(x)))


def is_norm_act(module: nn.Module) -> bool:
    """A timm norm-act layer (its forward is timm's BatchNormAct2d's or SyncBatchNormAct's),
    or one that `convert` made from one."""
    forward = type(module).forward
    return isinstance(module, NormAct) or \
        (forward.__module__, forward.__qualname__.split(".")[0]) in _TIMM_NORM_ACT


def origin(module: nn.Module) -> type:
    """timm's class of a norm-act layer, also once converted."""
    return module.reverts_to if isinstance(module, NormAct) else type(module)


_CLASSES: dict[tuple[type, ...], type] = {}


def _act_name(cls: type) -> str:
    """RankBatchNorm2d -> RankBatchNormAct2d, GroupNorm -> GroupNormAct (timm's naming)."""
    name = cls.__name__
    return f"{name[:-2]}Act{name[-2:]}" if name[-2:] in ("1d", "2d", "3d") else f"{name}Act"


def with_act(layer: nn.Module, src: nn.Module) -> nn.Module:
    """`layer` (what convert built from the norm-act layer `src`) with `src`'s drop path and
    activation after its own forward. A batch-statistics layer built from a BatchNormAct2d
    stays an instance of it, so timm's type-keyed tools (freeze_batch_norm_2d) keep the act."""
    bases = (NormAct, type(layer))
    if isinstance(layer, RankBatchNorm) and issubclass(origin(src), nn.BatchNorm2d):
        bases += (origin(src),)
    if bases not in _CLASSES:
        name = _act_name(type(layer))
        _CLASSES[bases] = type(name, bases, {"__module__": __name__, "__qualname__": name})
    layer.__class__ = _CLASSES[bases]
    layer.drop, layer.act = src.drop, src.act
    if isinstance(layer, RankBatchNorm):
        layer.reverts_to = origin(src)
    return layer
