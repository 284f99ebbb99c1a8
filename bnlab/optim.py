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


def is_norm(module: nn.Module) -> bool:
    """A normalization layer of any kind bnlab converts to (BN and its variants, GroupNorm,
    LayerNorm, EvoNorm): its parameters are a scale, a shift and, for EvoNorm, v."""
    from torch.nn.modules.batchnorm import _BatchNorm

    name = type(module).__name__
    return isinstance(module, _BatchNorm | nn.GroupNorm | nn.LayerNorm) or "Norm" in name


def param_groups(model: nn.Module, weight_decay: float, decay_norms: bool) -> list[dict]:
    """Every parameter at `weight_decay`, or, with decay_norms false, the normalization
    layers' parameters and every bias in a second group without it (timm's practice)."""
    if decay_norms:
        return [{"params": list(model.parameters()), "weight_decay": weight_decay}]
    plain, decayed = [], []
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            (plain if is_norm(module) or name == "bias" else decayed).append(p)
    return [{"params": decayed, "weight_decay": weight_decay},
            {"params": plain, "weight_decay": 0.0}]


def build_optimizer(cfg: dict, model: nn.Module, steps_per_epoch: int, epochs: int,
                    images_per_step: int = 0):
    """Plain SGD (as in the reports), or AdamW (`name: adamw`, beta1 = `momentum`), at peak_lr,
    with weight decay on every parameter or (`decay_norms: false`) on all but the
    normalization layers' and the biases, + a per-step LambdaLR schedule."""
    if cfg.get("scale_from", 0) and images_per_step <= 0:
        raise ValueError("optim.scale_from needs the images per optimizer step")
    lr = peak_lr(cfg, images_per_step)
    groups = param_groups(model, cfg["weight_decay"], cfg.get("decay_norms", True))
    if cfg.get("name", "sgd") == "adamw":
        opt = torch.optim.AdamW(groups, lr=lr, betas=(cfg["momentum"], 0.999))
    else:
        opt = torch.optim.SGD(groups, lr=lr, momentum=cfg["momentum"], nesterov=cfg["nesterov"])
    total = steps_per_epoch * epochs
    warmup = round(cfg["warmup_epochs"] * steps_per_epoch)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: lr_factor(s, total, warmup, cfg["schedule"], cfg["step_milestones"],
                            cfg["step_gamma"]),
    )
    return opt, sched
