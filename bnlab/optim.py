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


def peak_lr(cfg: dict, images_per_step: int) -> float:
    """The peak rate used: `lr` as given, or, with `scale_from` = B > 0, lr x (images per
    optimizer step) / B (linear scaling: lr is the rate for a global batch of B)."""
    base = cfg.get("scale_from", 0)
    return cfg["lr"] * images_per_step / base if base else cfg["lr"]


def build_optimizer(cfg: dict, model: nn.Module, steps_per_epoch: int, epochs: int,
                    images_per_step: int = 0):
    """Plain SGD over every parameter (as in the reports), or AdamW (`name: adamw`, beta1 =
    `momentum`), at peak_lr, + a per-step LambdaLR schedule."""
    if cfg.get("scale_from", 0) and images_per_step <= 0:
        raise ValueError("optim.scale_from needs the images per optimizer step")
    lr = peak_lr(cfg, images_per_step)
    if cfg.get("name", "sgd") == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=lr,
                                betas=(cfg["momentum"], 0.999), weight_decay=cfg["weight_decay"])
    else:
        opt = torch.optim.SGD(
            model.parameters(), lr=lr, momentum=cfg["momentum"],
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
