"""The network a run trains: the registry's model (bnlab.models) with the configured
normalization swapped in (bnlab.norms), the same initial weights on every rank."""

from __future__ import annotations

import torch
import torch.nn as nn

from bnlab.models import build_model
from bnlab.norms import convert


def build_net(cfg: dict) -> nn.Module:
    """Model with its normalization converted (before any DDP wrapping)."""
    torch.manual_seed(cfg["seed"])  # same initial weights on every rank and every layout
    model = build_model(cfg["model"]["name"])
    norm = {k: v for k, v in cfg["norm"].items() if k != "kind"}
    return convert(model, cfg["norm"]["kind"], **norm)
