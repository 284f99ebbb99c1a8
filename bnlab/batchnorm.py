"""The batch-statistics layers bnlab converts BatchNorm into, and their train/eval modes.

`RankBatchNorm` is one class for `bn` (this rank's batch), `syncbn` (the union of all ranks'
samples, or of groups of `sync_group` ranks; bnlab.syncbn computes it) and `syncbn_naive`;
`FrozenBatchNorm` stays in eval mode while the model trains; `BatchRenorm` corrects each
rank's batch statistics towards its running ones (Ioffe 2017); `BatchNormXd` is torch's BN for
inputs of any rank. bnlab.norms swaps them into a model.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as tdist
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

from bnlab.compat import BN_TAKES_BIAS, bias_kw, drop_bias
from bnlab.errors import BnlabError
from bnlab.syncbn import (
    group_ranks,
    in_stats_dtype,
    naive_sync_batch_norm,
    sync_batch_norm,
    sync_group,
    syncbn_impl,
    torch_sync_batch_norm,
)

SYNC_MODES = ("none", "exact", "naive")
SYNCBN_IMPLS = ("auto", "torch", "bnlab")  # exact SyncBN's code: auto = torch's on CUDA


def _check_dims(x: torch.Tensor) -> None:
    if x.dim() < 2:
        raise ValueError(f"expected an input of 2 or more dimensions (N, C, ...), got {x.dim()}")


class BatchNormXd(_BatchNorm):
    """torch's BatchNorm for inputs of any rank from 2 on: what `revert` gives back for a layer
    whose rank is not known (torch's SyncBatchNorm)."""

    def _check_input_dim(self, x: torch.Tensor) -> None:
        _check_dims(x)


class RankBatchNorm(_BatchNorm):
    """BatchNorm whose batch statistics come from one rank, a group of ranks, or the naive mix.

    Takes inputs of any rank from 2 on (N, C, ...), as torch's SyncBatchNorm does. In a real
    process group the statistics are exchanged with collectives. It holds what torch's
    BatchNorm holds; the single-process simulation of W ranks (bnlab.simulate) turns it into
    its own layer, which keeps the W ranks' running statistics.
    """

    def __init__(self, num_features: int, sync: str = "none", sync_group: int = 0,
                 eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, device=None, dtype=None, *,
                 bias: bool = True, impl: str = "auto", process_group=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         device=device, dtype=dtype, **bias_kw(bias, BN_TAKES_BIAS))
        drop_bias(self, bias)
        assert sync in SYNC_MODES, sync
        if impl not in SYNCBN_IMPLS:
            raise BnlabError(f"norm.impl='{impl}' is unknown; choose one of {SYNCBN_IMPLS}.")
        if process_group is not None and (sync != "exact" or sync_group):
            raise BnlabError("process_group is for syncbn alone, in place of sync_group; give "
                             "one of them.")
        if process_group is not None and tdist.is_initialized() and \
                tdist.get_rank(process_group) < 0:  # torch reads its size as -1: no sync at all
            raise BnlabError(
                f"the process_group given does not hold this rank ({tdist.get_rank()}): every "
                "rank must create every group, in the same order (torch.distributed.new_group "
                "is collective), and pass the one that holds it; or give sync_group=k and "
                "bnlab builds them.")
        self.sync, self.sync_group, self.impl = sync, sync_group, impl
        self.process_group = process_group  # the ranks that share statistics (any ranks)
        self.reverts_to: type[_BatchNorm] = nn.BatchNorm2d  # the class `revert` gives back

    def _check_input_dim(self, x: torch.Tensor) -> None:
        _check_dims(x)

    def reset_parameters(self) -> None:  # as torch 2.13 does, also on one without bias=
        self.reset_running_stats()
        if self.affine:
            nn.init.ones_(self.weight)
            if self.bias is not None:
                nn.init.zeros_(self.bias)

    def __deepcopy__(self, memo):
        """A copy of the layer that shares its process group (a group cannot be copied: the
        copy syncs with the same ranks)."""
        if self.process_group is not None:
            memo[id(self.process_group)] = self.process_group
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        new.__dict__.update({k: copy.deepcopy(v, memo) for k, v in self.__dict__.items()})
        return new

    @property
    def kind(self) -> str:
        """The norm this layer computes, as `convert` names it."""
        return {"none": "bn", "exact": "syncbn", "naive": "syncbn_naive"}[self.sync]

    def extra_repr(self) -> str:
        group = "" if self.sync == "none" else \
            ", process_group=given" if self.process_group is not None else \
            f", sync_group={self.sync_group}"
        return f"kind={self.kind}, " + super().extra_repr() + group

    def _ema_factor(self) -> float:
        """Counts this batch and returns its weight in the running statistics, as torch does
        (momentum None: the cumulative average)."""
        self.num_batches_tracked.add_(1)
        if self.momentum is None:
            return 1.0 / float(self.num_batches_tracked)
        return self.momentum

    def group_size(self, world: int) -> int:
        if self.sync == "none":
            return 1
        if self.process_group is not None:
            return tdist.get_world_size(self.process_group)
        return group_ranks(world, self.sync_group)

    # -- forward ------------------------------------------------------------------------------

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # torch's BN by name, not super(): a layer made from timm's BatchNormAct2d has that
        # class after this one, and its forward would apply the activation a second time
        if not self.training:  # running statistics, or the batch's own where none are kept
            return _BatchNorm.forward(self, x)
        return self.forward_train(x)

    def forward_train(self, x: torch.Tensor) -> torch.Tensor:
        """The training step's normalization (bnlab.simulate's layer has its own)."""
        if self.sync == "none" or not (tdist.is_initialized() and tdist.get_world_size() > 1):
            return _BatchNorm.forward(self, x)
        _check_dims(x)
        group = self.process_group if self.process_group is not None else \
            sync_group(self.group_size(tdist.get_world_size()))
        if self.sync == "naive":
            return naive_sync_batch_norm(x, self, group)
        if syncbn_impl(self.impl, x.device) == "torch":
            return torch_sync_batch_norm(x, self, group)
        return sync_batch_norm(x, self, group)


class FrozenBatchNorm(RankBatchNorm):
    """BN that stays in eval mode while the model trains (claim C6's diagnostic).

    Running statistics are used and not updated; the affine parameters still train. With
    `freeze_after` N it trains as plain BN for N epochs first (see `set_epoch`).
    """

    def __init__(self, num_features: int, freeze_after: int = 0, **kw):
        super().__init__(num_features, **kw)
        self.freeze_after = freeze_after
        self.frozen = freeze_after == 0
        self.mode_asked = True  # the model's train/eval flag, which `revert` gives back

    @property
    def kind(self) -> str:
        return "frozen_bn"

    def train(self, mode: bool = True):
        self.mode_asked = mode
        return super().train(mode and not self.frozen)


class BatchRenorm(RankBatchNorm):
    """Batch Renormalization (Ioffe 2017, arXiv:1702.03275), on each rank's own batch.

    Training: x_hat = (x - mu_B) / sigma_B * r + d, with sigma_B = sqrt(var_B + eps) (biased
    var_B), r = clip(sigma_B / sigma, 1 / r_max, r_max) and d = clip((mu_B - mu) / sigma,
    -d_max, d_max) held constant in the backward (no gradient through r and d); mu and sigma
    are the running mean and standard deviation, updated as the paper defines them:
    mu += f (mu_B - mu), sigma += f (sigma_B - sigma), f the momentum (None: the cumulative
    average). `running_var` holds sigma^2 - eps, so evaluation (torch's BN with the running
    statistics) computes (x - mu) / sigma, as the paper's inference does, and `revert` gives a
    plain BN that evaluates the same. r_max and d_max start at 1 and 0 (plain BN) and ramp
    linearly to their values after `hold_steps` training batches, over `r_ramp_steps` and
    `d_ramp_steps` (the paper's ImageNet schedule by default); the layer counts its batches in
    `num_batches_tracked`. Under the simulation (bnlab.simulate) each simulated rank
    renormalizes its own batch against its own running statistics (`renormalize`).
    """

    def __init__(self, num_features: int, r_max: float = 3.0, d_max: float = 5.0,
                 hold_steps: int = 5000, r_ramp_steps: int = 40000, d_ramp_steps: int = 25000,
                 ramp_of_run: dict | None = None, **kw):
        super().__init__(num_features, sync="none", **kw)
        # {hold, r_ramp, d_ramp} as fractions of the run: set_run_length makes them steps
        self.ramp_of_run = dict(ramp_of_run) if ramp_of_run else None
        if r_max < 1 or d_max < 0 or min(hold_steps, r_ramp_steps, d_ramp_steps) < 0:
            raise BnlabError(f"norm=brn needs r_max >= 1, d_max >= 0 and steps >= 0 (got "
                             f"r_max={r_max}, d_max={d_max}, hold_steps={hold_steps}, "
                             f"r_ramp_steps={r_ramp_steps}, d_ramp_steps={d_ramp_steps}).")
        self.r_max, self.d_max, self.hold_steps = r_max, d_max, hold_steps
        self.r_ramp_steps, self.d_ramp_steps = r_ramp_steps, d_ramp_steps

    @property
    def kind(self) -> str:
        return "brn"

    def extra_repr(self) -> str:
        return ("kind=brn, " + _BatchNorm.extra_repr(self) + f", r_max={self.r_max}, "
                f"d_max={self.d_max}, "
                f"hold_steps={self.hold_steps}, r_ramp_steps={self.r_ramp_steps}, "
                f"d_ramp_steps={self.d_ramp_steps}" +
                (f", ramp_of_run={self.ramp_of_run}" if self.ramp_of_run else ""))

    def set_run_length(self, total_steps: int) -> None:
        """The hold and the two ramps from `ramp_of_run`'s fractions of a run of `total_steps`
        training batches (the paper's 5k, 40k and 25k of its 160k steps: 1/32, 1/4, 5/32)."""
        f = self.ramp_of_run
        self.hold_steps = round(f["hold"] * total_steps)
        self.r_ramp_steps = round(f["r_ramp"] * total_steps)
        self.d_ramp_steps = round(f["d_ramp"] * total_steps)

    def limits(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(r_max, d_max) at the batch about to be counted, as float64 tensors: 1 and 0 through
        `hold_steps`, then linear to the configured values. Computed from the step counter
        without reading it on the host, so torch.compile neither breaks the graph nor
        recompiles as the ramp moves; in float64, as Python's floats, so the clamps below see
        the same float32 limits as plain floats would give."""
        done = self.num_batches_tracked.double() - self.hold_steps

        def share(ramp: int) -> torch.Tensor:
            return (done >= 0).double() if ramp == 0 else (done / ramp).clamp(0.0, 1.0)

        return (1 + (self.r_max - 1) * share(self.r_ramp_steps),
                self.d_max * share(self.d_ramp_steps))

    def forward_train(self, x: torch.Tensor) -> torch.Tensor:
        c = self.num_features
        return self.renormalize(x, lambda: (self.running_mean.view(1, c),
                                            self.running_var.view(1, c)))

    def renormalize(self, x: torch.Tensor, running) -> torch.Tensor:
        """The training step on a batch of W ranks' samples in rank order, each rank against
        its own running statistics: `running()` gives them as (W, C) views, updated in place
        (W = 1 here; bnlab.simulate's layer passes its W ranks')."""
        _check_dims(x)
        if not self.track_running_stats:
            raise BnlabError("norm=brn needs layers that track running statistics "
                             "(track_running_stats=True): r and d are measured against them.")
        rm, rv = running()
        w, c = rm.shape[0], self.num_features
        if x.shape[0] % w:
            raise BnlabError(f"a simulated batch of {x.shape[0]} does not split into {w} ranks.")
        r_max, d_max = self.limits()
        factor = self._ema_factor()
        xs = in_stats_dtype(x).reshape(w, x.shape[0] // w, c, -1)  # rank, sample, channel, px
        mean = xs.mean((1, 3))                                        # (w, c)
        std = (xs.var((1, 3), unbiased=False) + self.eps).sqrt()
        with torch.no_grad():
            sigma = (rv.to(std.dtype) + self.eps).sqrt()
            lo, hi, dm = ((1 / r_max).to(std.dtype), r_max.to(std.dtype),
                          d_max.to(std.dtype))
            r = torch.minimum(torch.maximum(std / sigma, lo), hi)
            d = torch.minimum(torch.maximum((mean - rm.to(mean.dtype)) / sigma, -dm), dm)
            new_sigma = sigma + factor * (std - sigma)
            rm.add_(factor * (mean.to(rm.dtype) - rm))
            rv.copy_(new_sigma.square() - self.eps)
        xhat = (xs - mean[:, None, :, None]) * (r / std)[:, None, :, None] + d[:, None, :, None]
        if self.weight is not None:
            xhat = xhat * self.weight.to(xs.dtype)[:, None]
        if self.bias is not None:
            xhat = xhat + self.bias.to(xs.dtype)[:, None]
        return xhat.reshape(x.shape).to(x.dtype)



# ----------------------------------------------------------------------------------------
# Type identity: a layer converted from nn.BatchNorm2d stays an nn.BatchNorm2d (1d and 3d
# likewise), so code keyed on the type (weight-decay filters, timm's freeze_batch_norm_2d,
# isinstance checks in a user's training loop) still finds it. torch's SyncBatchNorm has no
# rank, so a layer converted from it is the base class alone.

PLAIN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
TYPED: dict[tuple[type, type], type] = {}  # (base, torch's class) -> the typed class
for _base in (RankBatchNorm, FrozenBatchNorm, BatchRenorm):
    for _plain in PLAIN:
        _name = _base.__name__ + _plain.__name__.removeprefix("BatchNorm")  # RankBatchNorm2d
        TYPED[_base, _plain] = type(_name, (_base, _plain), {
            "__module__": __name__, "__qualname__": _name,
            "__doc__": f"{_base.__name__} that is also an nn.{_plain.__name__}."})
        globals()[_name] = TYPED[_base, _plain]  # importable, and so picklable


def typed(base: type[RankBatchNorm], plain: type[_BatchNorm]) -> type[RankBatchNorm]:
    """`base` made an instance of `plain` too (RankBatchNorm, nn.BatchNorm2d ->
    RankBatchNorm2d); `base` itself where `plain` is not one of torch's 1d, 2d or 3d BN."""
    return TYPED.get((base, plain), base)


def set_run_length(model: nn.Module, total_steps: int) -> dict | None:
    """Give every BatchRenorm layer converted with `ramp_of_run` its hold and ramps in steps
    of a run of `total_steps` training batches; returns those steps (None: no such layer)."""
    layers = [m for m in model.modules() if isinstance(m, BatchRenorm) and m.ramp_of_run]
    for m in layers:
        m.set_run_length(total_steps)
    return {"hold_steps": layers[0].hold_steps, "r_ramp_steps": layers[0].r_ramp_steps,
            "d_ramp_steps": layers[0].d_ramp_steps} if layers else None


def set_epoch(model: nn.Module, epoch: int) -> None:
    """Freeze FrozenBatchNorm layers once `epoch` (0-based) reaches their freeze_after."""
    for m in model.modules():
        if isinstance(m, FrozenBatchNorm):
            m.frozen = epoch >= m.freeze_after
            m.train(m.mode_asked)


def save_modes(model: nn.Module) -> dict:
    """Every module's train/eval flag (and the mode a frozen BN layer was asked for)."""
    return {m: (m.training, m.__dict__.get("mode_asked")) for m in model.modules()}


def restore_modes(saved: dict) -> None:
    for m, (training, asked) in saved.items():
        m.training = training
        if asked is not None:
            m.mode_asked = asked
