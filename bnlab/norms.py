"""Normalization registry: the config group `norm/` picks one entry by `kind`.

Models are built with `nn.BatchNorm2d`; `convert_norm` swaps every BN layer for the kind
under test before DDP wraps the model.

| kind         | batch statistics                                                          |
|--------------|---------------------------------------------------------------------------|
| bn           | this rank's batch only (torch BatchNorm)                                  |
| syncbn       | the union of all ranks' samples (or of groups of `sync_group` ranks)      |
| syncbn_naive | WRONG on purpose: average of per-rank means and variances (claim C12)     |
| gn           | none: GroupNorm, per sample over groups of channels                       |
| ln           | none: GroupNorm with one group (per sample over C, H, W)                  |
| frozen_bn    | none: BN kept in eval mode (running statistics, not updated) while training |
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.parallel import DistributedDataParallel

from bnlab.errors import BnlabError
from bnlab.syncbn import acc, naive_sync_batch_norm, sync_batch_norm, sync_group

SYNC_MODES = ("none", "exact", "naive")


class RankBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm whose batch statistics come from one rank, a group of ranks, or the naive mix.

    In a real process group the statistics are exchanged with collectives. Under the
    single-process simulation of W ranks (`simulate(W)`), the batch holds all W ranks'
    samples in rank order and the layer keeps W sets of running statistics; `running_mean`
    and `running_var` then mirror rank 0's, as a DDP checkpoint would.
    """

    def __init__(self, num_features: int, sync: str = "none", sync_group: int = 0,
                 eps: float = 1e-5, momentum: float = 0.1):
        super().__init__(num_features, eps=eps, momentum=momentum)
        assert sync in SYNC_MODES, sync
        self.sync, self.sync_group = sync, sync_group
        self.sim_world = 1

    def extra_repr(self) -> str:
        return super().extra_repr() + f", sync={self.sync}, sync_group={self.sync_group}"

    # -- simulation -------------------------------------------------------------------------

    def simulate(self, world: int) -> None:
        """Stand in for `world` ranks: one set of running statistics per simulated rank."""
        self.sim_world = world
        self.register_buffer("sim_running_mean", self.running_mean.repeat(world))
        self.register_buffer("sim_running_var", self.running_var.repeat(world))

    def rank_stats(self, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Running (mean, var) of one simulated rank."""
        c = self.num_features
        if self.sim_world == 1:
            return self.running_mean, self.running_var
        return (self.sim_running_mean.view(-1, c)[rank], self.sim_running_var.view(-1, c)[rank])

    def sync_rank_buffers_from_rank0(self) -> None:
        """What DDP's forward buffer sync does: every rank takes rank 0's buffers."""
        c = self.num_features
        for buf in (self.sim_running_mean, self.sim_running_var):
            b = buf.view(-1, c)
            b[1:] = b[0]

    def group_size(self, world: int) -> int:
        if self.sync == "none":
            return 1
        k = world if self.sync_group in (0, world) else self.sync_group
        if world % k:
            raise BnlabError(f"norm.sync_group={k} must divide the number of ranks ({world}).")
        return k

    def _forward_simulated(self, x: torch.Tensor) -> torch.Tensor:
        w, c = self.sim_world, self.num_features
        if x.shape[0] % w:
            raise BnlabError(f"a simulated batch of {x.shape[0]} does not split into {w} ranks.")
        k = self.group_size(w)
        g, b, rest = w // k, x.shape[0] // w, x.shape[2:]
        rm, rv = self.sim_running_mean.view(w, c), self.sim_running_var.view(w, c)
        self.num_batches_tracked.add_(1)
        if self.sync == "naive":
            y = self._naive_simulated(x, w, k, rm, rv)
        else:
            # Groups of k consecutive ranks share statistics: lay the G groups side by side
            # as G*C channels and let one BN kernel normalize each group on its own.
            xs = x.view(g, k * b, c, *rest).transpose(0, 1).reshape(k * b, g * c, *rest)
            grm, grv = rm[::k].reshape(-1).clone(), rv[::k].reshape(-1).clone()
            weight = self.weight.repeat(g) if self.weight is not None else None
            bias = self.bias.repeat(g) if self.bias is not None else None
            ys = F.batch_norm(xs, grm, grv, weight, bias, True, self.momentum, self.eps)
            y = ys.view(k * b, g, c, *rest).transpose(0, 1).reshape(x.shape)
            rm.view(g, k, c).copy_(grm.view(g, 1, c).expand(g, k, c))
            rv.view(g, k, c).copy_(grv.view(g, 1, c).expand(g, k, c))
        self.running_mean.copy_(rm[0])
        self.running_var.copy_(rv[0])
        return y

    def _naive_simulated(self, x, w, k, rm, rv) -> torch.Tensor:
        c, g = self.num_features, w // k
        xs = acc(x).view(w, x.shape[0] // w, c, -1)  # (rank, sample, channel, pixels)
        mean_r = xs.mean((1, 3))
        var_r = xs.var((1, 3), unbiased=False)
        n = xs.shape[1] * xs.shape[3]
        gm = mean_r.view(g, k, c).mean(1).repeat_interleave(k, 0)  # (w, c): each rank's group
        gv = var_r.view(g, k, c).mean(1).repeat_interleave(k, 0)
        with torch.no_grad():
            m = self.momentum
            rm.mul_(1 - m).add_(gm, alpha=m)
            rv.mul_(1 - m).add_(gv * n / max(n - 1, 1), alpha=m)
        xhat = (xs - gm[:, None, :, None]) * torch.rsqrt(gv + self.eps)[:, None, :, None]
        if self.weight is not None:
            xhat = xhat * self.weight.to(xs.dtype)[:, None] + self.bias.to(xs.dtype)[:, None]
        return xhat.reshape(x.shape).to(x.dtype)

    # -- forward ------------------------------------------------------------------------------

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                False, 0.0, self.eps)
        if self.sim_world > 1:
            return self._forward_simulated(x)
        if self.sync == "none" or not (dist.is_initialized() and dist.get_world_size() > 1):
            return super().forward(x)
        group = sync_group(self.group_size(dist.get_world_size()))
        if self.sync == "exact":
            return sync_batch_norm(x, self, group)
        return naive_sync_batch_norm(x, self, group)


class FrozenBatchNorm2d(RankBatchNorm2d):
    """BN that stays in eval mode while the model trains (claim C6's diagnostic).

    Running statistics are used and not updated; the affine parameters still train. With
    `freeze_after` N it trains as plain BN for N epochs first (see `set_epoch`).
    """

    def __init__(self, num_features: int, freeze_after: int = 0, **kw):
        super().__init__(num_features, **kw)
        self.freeze_after = freeze_after
        self.frozen = freeze_after == 0

    def train(self, mode: bool = True):
        return super().train(mode and not self.frozen)


def set_epoch(model: nn.Module, epoch: int) -> None:
    """Freeze FrozenBatchNorm2d layers once `epoch` (0-based) reaches their freeze_after."""
    for m in model.modules():
        if isinstance(m, FrozenBatchNorm2d):
            m.frozen = epoch >= m.freeze_after
            m.train(m.training)


# ----------------------------------------------------------------------------------------
# Registry


def _bn(bn, name, eps=1e-5, momentum=0.1):
    return RankBatchNorm2d(bn.num_features, "none", eps=eps, momentum=momentum)


def _syncbn(bn, name, eps=1e-5, momentum=0.1, sync_group=0):
    return RankBatchNorm2d(bn.num_features, "exact", sync_group, eps, momentum)


def _syncbn_naive(bn, name, eps=1e-5, momentum=0.1, sync_group=0):
    return RankBatchNorm2d(bn.num_features, "naive", sync_group, eps, momentum)


def _frozen_bn(bn, name, eps=1e-5, momentum=0.1, freeze_after=0):
    return FrozenBatchNorm2d(bn.num_features, freeze_after, eps=eps, momentum=momentum)


def _gn(bn, name, groups=32, cap_groups=False, eps=1e-5):
    c = bn.num_features
    g = min(groups, c) if cap_groups else groups
    if c % g:
        raise BnlabError(
            f"norm.groups={groups} does not divide the {c} channels of layer '{name}'; "
            f"choose a divisor of every layer's channels or set norm.cap_groups=true."
        )
    return nn.GroupNorm(g, c, eps=eps)


def _ln(bn, name, eps=1e-5):
    return nn.GroupNorm(1, bn.num_features, eps=eps)


NORMS: dict[str, Callable[..., nn.Module]] = {
    "bn": _bn,
    "syncbn": _syncbn,
    "syncbn_naive": _syncbn_naive,
    "gn": _gn,
    "ln": _ln,
    "frozen_bn": _frozen_bn,
}
BATCH_STAT_KINDS = ("bn", "syncbn", "syncbn_naive", "frozen_bn")


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
            if type(child) is nn.BatchNorm2d:
                full = f"{parent_name}.{child_name}".lstrip(".")
                try:
                    setattr(parent, child_name, make(child, full, **opts))
                except TypeError as e:
                    raise BnlabError(f"norm={kind} got an option it does not take ({e}).") \
                        from None
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

