"""What differs between the torch versions bnlab runs on: any torch >= 2.4 with its
torchvision (uv.lock pins 2.13 here; GPU machines often have older ones). Each difference is
read once from the signature, not from a version number, and bridged here.

- `bias=` of BatchNorm and GroupNorm (a layer without a shift: 2.13 has it, 2.4 does not):
  on an older torch the layer is built with one and its `bias` then removed, as the newer
  torch leaves it. bnlab's own layers reset such a layer as the newer torch does; torch's
  own (what `revert` gives back, GroupNorm) fail in `reset_parameters()` there.
- DistributedDataParallel's `forward_sync_buffers` (2.13; `broadcast_buffers` before) turns
  the buffer sync at every forward on or off. With it off, 2.13 still copies rank 0's buffers
  once when wrapping and the older flag does not; bnlab's ranks build identical buffers from
  one seed and restore checkpoints after wrapping, so nothing it runs differs.
"""

from __future__ import annotations

import inspect

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.parallel import DistributedDataParallel as DDP


def _takes(fn, name: str) -> bool:
    return name in inspect.signature(fn).parameters


BN_TAKES_BIAS = _takes(_BatchNorm.__init__, "bias")
GN_TAKES_BIAS = _takes(nn.GroupNorm.__init__, "bias")
DDP_SYNC_BUFFERS = "forward_sync_buffers" if _takes(DDP.__init__, "forward_sync_buffers") \
    else "broadcast_buffers"


def bias_kw(bias: bool, takes: bool) -> dict:
    """The `bias=` keyword for a norm layer's constructor where it takes one, else none."""
    return {"bias": bias} if takes else {}


def drop_bias(layer: nn.Module, bias: bool) -> nn.Module:
    """`layer` without its shift where `bias` is False and the constructor could not leave it
    out (an older torch): `layer.bias` is then None, as the newer torch makes it."""
    if not bias and getattr(layer, "bias", None) is not None:
        layer.register_parameter("bias", None)
    return layer


def ddp(model: nn.Module, device_ids, sync_buffers: bool) -> DDP:
    """DDP with its forward buffer sync on or off, under the name this torch gives it."""
    return DDP(model, device_ids=device_ids, **{DDP_SYNC_BUFFERS: sync_buffers})
