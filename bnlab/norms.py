"""Normalization layers and the one function that swaps them into any model.

`convert(model, kind)` replaces every BatchNorm layer (1d, 2d, 3d, torch's SyncBatchNorm) by the
kind under test and carries its state over: weight, bias, running statistics,
`num_batches_tracked`, eps, momentum (None included), affine, `track_running_stats`,
`requires_grad`, the train/eval flag, device and dtype. `revert(model)` gives plain torch
BatchNorm back, statistics included. bnlab's trainer builds its models with `nn.BatchNorm2d`
and converts them with the same function; the config group `norm/` picks one entry of `NORMS`.

| kind         | batch statistics                                                          |
|--------------|---------------------------------------------------------------------------|
| bn           | this rank's batch only (as torch BatchNorm)                               |
| syncbn       | the union of all ranks' samples (or of groups of `sync_group` ranks)      |
| syncbn_naive | WRONG on purpose: average of per-rank means and variances (claim C12)     |
| gn           | none: GroupNorm, per sample over groups of channels                       |
| ln           | none: GroupNorm with one group (per sample over every channel and pixel)  |
| frozen_bn    | none: BN kept in eval mode (running statistics, not updated) while training |
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.parallel import DistributedDataParallel

from bnlab.errors import BnlabError
from bnlab.syncbn import (
    acc,
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
    process group the statistics are exchanged with collectives. Under the single-process
    simulation of W ranks (`simulate(W)`), the batch holds all W ranks' samples in rank order
    and the layer keeps W sets of running statistics; `running_mean` and `running_var` then
    mirror rank 0's, as a DDP checkpoint would.
    """

    def __init__(self, num_features: int, sync: str = "none", sync_group: int = 0,
                 eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, device=None, dtype=None, *,
                 bias: bool = True, impl: str = "auto"):
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         device=device, dtype=dtype, bias=bias)
        assert sync in SYNC_MODES, sync
        if impl not in SYNCBN_IMPLS:
            raise BnlabError(f"norm.impl='{impl}' is unknown; choose one of {SYNCBN_IMPLS}.")
        self.sync, self.sync_group, self.impl = sync, sync_group, impl
        self.sim_world = 1
        self.reverts_to: type[_BatchNorm] = nn.BatchNorm2d  # the class `revert` gives back

    def _check_input_dim(self, x: torch.Tensor) -> None:
        _check_dims(x)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", sync={self.sync}, sync_group={self.sync_group}"

    def _ema_factor(self) -> float:
        """Counts this batch and returns its weight in the running statistics, as torch does
        (momentum None: the cumulative average)."""
        self.num_batches_tracked.add_(1)
        if self.momentum is None:
            return 1.0 / float(self.num_batches_tracked)
        return self.momentum

    # -- simulation -------------------------------------------------------------------------

    def simulate(self, world: int) -> None:
        """Stand in for `world` ranks: one set of running statistics per simulated rank."""
        self.sim_world = world
        if self.track_running_stats:
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
        if not self.track_running_stats:  # nothing to sync; the forward says why it refuses
            return
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
        if not self.track_running_stats:
            raise BnlabError("the simulation of ranks needs BN layers that track running "
                             "statistics (track_running_stats=True).")
        k = self.group_size(w)
        g, b, rest = w // k, x.shape[0] // w, x.shape[2:]
        rm, rv = self.sim_running_mean.view(w, c), self.sim_running_var.view(w, c)
        factor = self._ema_factor()
        if self.sync == "naive":
            y = self._naive_simulated(x, w, k, rm, rv, factor)
        else:
            # Groups of k consecutive ranks share statistics: lay the G groups side by side
            # as G*C channels and let one BN kernel normalize each group on its own.
            xs = x.view(g, k * b, c, *rest).transpose(0, 1).reshape(k * b, g * c, *rest)
            grm, grv = rm[::k].reshape(-1).clone(), rv[::k].reshape(-1).clone()
            weight = self.weight.repeat(g) if self.weight is not None else None
            bias = self.bias.repeat(g) if self.bias is not None else None
            ys = F.batch_norm(xs, grm, grv, weight, bias, True, factor, self.eps)
            y = ys.view(k * b, g, c, *rest).transpose(0, 1).reshape(x.shape)
            rm.view(g, k, c).copy_(grm.view(g, 1, c).expand(g, k, c))
            rv.view(g, k, c).copy_(grv.view(g, 1, c).expand(g, k, c))
        self.running_mean.copy_(rm[0])
        self.running_var.copy_(rv[0])
        return y

    def _naive_simulated(self, x, w, k, rm, rv, factor) -> torch.Tensor:
        c, g = self.num_features, w // k
        xs = acc(x).view(w, x.shape[0] // w, c, -1)  # (rank, sample, channel, pixels)
        mean_r = xs.mean((1, 3))
        var_r = xs.var((1, 3), unbiased=False)
        n = xs.shape[1] * xs.shape[3]
        gm = mean_r.view(g, k, c).mean(1).repeat_interleave(k, 0)  # (w, c): each rank's group
        gv = var_r.view(g, k, c).mean(1).repeat_interleave(k, 0)
        with torch.no_grad():
            rm.mul_(1 - factor).add_(gm, alpha=factor)
            rv.mul_(1 - factor).add_(gv * n / max(n - 1, 1), alpha=factor)
        xhat = (xs - gm[:, None, :, None]) * torch.rsqrt(gv + self.eps)[:, None, :, None]
        if self.weight is not None:
            xhat = xhat * self.weight.to(xs.dtype)[:, None]
        if self.bias is not None:
            xhat = xhat + self.bias.to(xs.dtype)[:, None]
        return xhat.reshape(x.shape).to(x.dtype)

    # -- forward ------------------------------------------------------------------------------

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:  # running statistics, or the batch's own where none are kept
            return super().forward(x)
        if self.sim_world > 1:
            return self._forward_simulated(x)
        if self.sync == "none" or not (dist.is_initialized() and dist.get_world_size() > 1):
            return super().forward(x)
        _check_dims(x)
        group = sync_group(self.group_size(dist.get_world_size()))
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

    def train(self, mode: bool = True):
        self.mode_asked = mode
        return super().train(mode and not self.frozen)


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


# ----------------------------------------------------------------------------------------
# Registry: each entry builds the new layer from the BN layer it replaces, keeping its state.

_KEEP = object()  # an option left out: the converted layer keeps the BN layer's own value


def _factory(bn: nn.Module) -> dict:
    """The device and dtype of a layer's tensors (None for a layer without any)."""
    t = next(itertools.chain(bn.parameters(), bn.buffers()), None)
    return {"device": t.device if t is not None else None,
            "dtype": t.dtype if t is not None and t.is_floating_point() else None}


def _carry(src: nn.Module, dst: nn.Module, names: Iterable[str]) -> nn.Module:
    """Copy the named tensors (values and requires_grad) and the train/eval flag."""
    with torch.no_grad():
        for name in names:
            s, d = getattr(src, name, None), getattr(dst, name, None)
            if s is None or d is None:
                continue
            d.copy_(s)
            if isinstance(d, nn.Parameter):
                d.requires_grad_(s.requires_grad)
    dst.train(getattr(src, "mode_asked", src.training))
    return dst


BN_STATE = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
_PLAIN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def _reverts_to(bn: _BatchNorm) -> type[_BatchNorm]:
    if isinstance(bn, RankBatchNorm):
        return bn.reverts_to
    return next((c for c in _PLAIN if isinstance(bn, c)), BatchNormXd)


def _batch_stat_layer(cls, bn: _BatchNorm, eps, momentum, **kw) -> RankBatchNorm:
    layer = cls(bn.num_features, eps=bn.eps if eps is _KEEP else eps,
                momentum=bn.momentum if momentum is _KEEP else momentum, affine=bn.affine,
                track_running_stats=bn.track_running_stats, bias=bn.bias is not None, **kw,
                **_factory(bn))
    layer.reverts_to = _reverts_to(bn)
    return _carry(bn, layer, BN_STATE)


def _bn(bn, name, eps=_KEEP, momentum=_KEEP):
    return _batch_stat_layer(RankBatchNorm, bn, eps, momentum, sync="none")


def _syncbn(bn, name, eps=_KEEP, momentum=_KEEP, sync_group=0, impl="auto"):
    return _batch_stat_layer(RankBatchNorm, bn, eps, momentum, sync="exact",
                             sync_group=sync_group, impl=impl)


def _syncbn_naive(bn, name, eps=_KEEP, momentum=_KEEP, sync_group=0):
    return _batch_stat_layer(RankBatchNorm, bn, eps, momentum, sync="naive",
                             sync_group=sync_group)


def _frozen_bn(bn, name, eps=_KEEP, momentum=_KEEP, freeze_after=0):
    return _batch_stat_layer(FrozenBatchNorm, bn, eps, momentum, freeze_after=freeze_after)


def _group_norm(bn, groups: int, eps) -> nn.GroupNorm:
    gn = nn.GroupNorm(groups, bn.num_features, eps=bn.eps if eps is _KEEP else eps,
                      affine=bn.affine, bias=bn.bias is not None, **_factory(bn))
    return _carry(bn, gn, ("weight", "bias"))  # BN's per-channel affine is GN's


def _gn(bn, name, groups=32, cap_groups=False, eps=_KEEP):
    c = bn.num_features
    g = min(groups, c) if cap_groups else groups
    if c % g:
        fix = "set norm.cap_groups=true (min(groups, channels) per layer) or choose" \
            if c < groups else "choose"
        best = max(d for d in range(1, g + 1) if c % d == 0)
        raise BnlabError(
            f"norm.groups={groups} does not divide the {c} channels of layer '{name}'; "
            f"{fix} a group count that divides every layer's channels (here at most {best}; "
            "python -m bnlab doctor names one for the whole model)."
        )
    return _group_norm(bn, g, eps)


def _ln(bn, name, eps=_KEEP):
    return _group_norm(bn, 1, eps)


NORMS: dict[str, Callable[..., nn.Module]] = {
    "bn": _bn,
    "syncbn": _syncbn,
    "syncbn_naive": _syncbn_naive,
    "gn": _gn,
    "ln": _ln,
    "frozen_bn": _frozen_bn,
}
BATCH_STAT_KINDS = ("bn", "syncbn", "syncbn_naive", "frozen_bn")

# Layers whose forward is known: a BN subclass with another forward, or with child modules
# (timm's BatchNormAct2d: BN + activation), would lose that behaviour if rebuilt.
_KNOWN_FORWARDS = {c.forward for c in (*_PLAIN, nn.SyncBatchNorm, BatchNormXd, RankBatchNorm)}


def _refuse_unknown(bn: _BatchNorm, name: str) -> None:
    what = None
    if isinstance(bn, nn.modules.lazy.LazyModuleMixin) and bn.has_uninitialized_params():
        raise BnlabError(f"layer '{name or type(bn).__name__}' is a lazy BatchNorm that has "
                         f"not seen an input yet; run one forward pass first, then convert.")
    if type(bn).forward not in _KNOWN_FORWARDS:
        what = "its own forward"
    elif any(True for _ in bn.children()):
        what = "child modules"
    if what and not name:
        raise BnlabError(
            f"the model is itself a {type(bn).__name__}, a BatchNorm subclass with {what} that "
            f"converting would drop; replace it by a plain BatchNorm (and its extra parts as "
            f"their own modules) first."
        )
    if what:
        raise BnlabError(
            f"layer '{name}' is a {type(bn).__name__}, a BatchNorm subclass with {what} that "
            f"converting would drop; pass skip=['{name}'] to convert() (the doctor: --skip "
            f"{name}) to leave it as it is, or replace it "
            f"by a plain BatchNorm (and its extra parts as their own modules) first."
        )


def _refuse_ddp(model: nn.Module, what: str) -> None:
    if isinstance(model, DistributedDataParallel):
        raise BnlabError(
            f"{what} was called on a model already wrapped in DistributedDataParallel; "
            f"call it on the bare model (DDP must see the final layers), then wrap it."
        )


def _swap(model: nn.Module, pick: Callable[[nn.Module, str], nn.Module | None]) -> nn.Module:
    """Replace, depth first, every module for which `pick` returns a new one (a module that
    two parents share is replaced once, and stays shared). All or nothing: every replacement
    is made before any is put in place, so a `pick` that refuses a layer leaves the model
    exactly as it was."""
    done: dict[int, nn.Module] = {}
    swaps: list[tuple[nn.Module, str, nn.Module]] = []

    def visit(module: nn.Module, name: str) -> nn.Module:
        if id(module) in done:
            return done[id(module)]
        new = pick(module, name)
        if new is not None:
            done[id(module)] = new
            return new
        for child_name, child in list(module.named_children()):
            new_child = visit(child, f"{name}.{child_name}" if name else child_name)
            if new_child is not child:
                swaps.append((module, child_name, new_child))
        return module

    out = visit(model, "")
    for parent, child_name, new_child in swaps:
        setattr(parent, child_name, new_child)
    return out


def convert(model: nn.Module, kind: str, *, skip: Iterable[str] = (), **opts) -> nn.Module:
    """Replace every BatchNorm of `model` (in place) by `kind`, keeping each layer's state.

    `opts` are the kind's options (`sync_group`, `groups`, `cap_groups`, `freeze_after`);
    `eps` or `momentum`, when given, replace the layers' own. `skip` names layers to leave as
    they are. InstanceNorm and other norms are left alone. Returns the model (a new module
    only when `model` is itself a BatchNorm layer).
    """
    _refuse_ddp(model, "convert")
    if kind not in NORMS:
        raise BnlabError(f"norm.kind='{kind}' is unknown; choose one of {sorted(NORMS)}.")
    skip = set(skip)
    names = {n for n, _ in model.named_modules()}
    if skip - names:
        raise BnlabError(f"skip names {sorted(skip - names)}, which the model does not have; "
                         f"name layers as model.named_modules() does.")
    make = NORMS[kind]

    def pick(module: nn.Module, name: str) -> nn.Module | None:
        if not isinstance(module, _BatchNorm):
            return None
        if name in skip:
            return module
        _refuse_unknown(module, name)
        try:
            return make(module, name, **opts)
        except TypeError as e:
            raise BnlabError(f"norm={kind} got an option it does not take ({e}).") from None

    return _swap(model, pick)


def revert(model: nn.Module) -> nn.Module:
    """Give back plain torch BatchNorm (1d, 2d or 3d as converted; BatchNormXd for torch's
    SyncBatchNorm) for every bnlab BN layer and torch SyncBatchNorm, state included.

    GroupNorm and LayerNorm keep no batch statistics, so a model converted to gn or ln stays
    as it is. A simulated model gives back rank 0's running statistics.
    """
    _refuse_ddp(model, "revert")

    def pick(module: nn.Module, name: str) -> nn.Module | None:
        if not isinstance(module, (RankBatchNorm, nn.SyncBatchNorm)):
            return None
        cls = _reverts_to(module)
        plain = cls(module.num_features, module.eps, module.momentum, module.affine,
                    module.track_running_stats, bias=module.bias is not None,
                    **_factory(module))
        return _carry(module, plain, BN_STATE)

    return _swap(model, pick)


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

