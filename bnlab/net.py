"""The network a run trains: the registry's model (bnlab.models) with the configured
normalization swapped in (bnlab.norms), the same initial weights on every rank."""

from __future__ import annotations

import torch
import torch.nn as nn

from bnlab.models import build_model
from bnlab.norms import convert

# Each residual block's last normalization, by the block's class (bnlab's and torchvision's).
LAST_NORM = {"BasicBlock": "bn2", "Bottleneck": "bn3"}


def build_net(cfg: dict) -> nn.Module:
    """Model with its normalization converted (before any DDP wrapping)."""
    torch.manual_seed(cfg["seed"])  # same initial weights on every rank and every layout
    model = build_model(cfg["model"]["name"])
    norm = {k: v for k, v in cfg["norm"].items() if k != "kind"}
    model = convert(model, cfg["norm"]["kind"], **norm)
    if cfg["model"].get("zero_init_residual", False):
        zero_init_residual(model)
    return model


def zero_init_residual(model: nn.Module) -> int:
    """Set the scale of each residual block's last normalization layer to 0, whatever kind it
    was converted to, so that every block starts as its shortcut (Goyal et al. 2017; Wu and He
    2018, section 4.1); returns how many layers it set."""
    n = 0
    with torch.no_grad():
        for block in model.modules():
            last = getattr(block, LAST_NORM.get(type(block).__name__, ""), None)
            if last is not None and getattr(last, "weight", None) is not None:
                last.weight.zero_()
                n += 1
    return n
