"""Optimizer and learning-rate schedule (stepped once per optimizer step)."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

SCHEDULES = ("cosine", "step", "constant")
OPTIMIZERS = ("sgd", "adamw")


def lr_factor(step: int, total: int, warmup: int, schedule: str, milestones, gamma: float) -> float:
    """Multiplier of the peak lr at optimizer step `step` (0-based) of `total`."""
    if step < warmup:
        return (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    if schedule == "cosine":
        return 0.5 * (1 + math.cos(math.pi * min(1.0, t)))
    if schedule == "step":
        return gamma ** sum(step >= m * total for m in milestones)
    return 1.0


def build_optimizer(cfg: dict, model: nn.Module, steps_per_epoch: int, epochs: int):
    """Plain SGD over every parameter (as in the reports), or AdamW (`name: adamw`, beta1 =
    `momentum`), + a per-step LambdaLR schedule."""
    if cfg.get("name", "sgd") == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"],
                                betas=(cfg["momentum"], 0.999), weight_decay=cfg["weight_decay"])
    else:
        opt = torch.optim.SGD(
            model.parameters(), lr=cfg["lr"], momentum=cfg["momentum"],
            weight_decay=cfg["weight_decay"], nesterov=cfg["nesterov"],
        )
    total = steps_per_epoch * epochs
    warmup = round(cfg["warmup_epochs"] * steps_per_epoch)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: lr_factor(s, total, warmup, cfg["schedule"], cfg["step_milestones"],
                            cfg["step_gamma"]),
    )
    return opt, sched
