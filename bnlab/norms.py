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
| brn          | this rank's batch, renormalized towards the running statistics (Ioffe 2017)  |
| evonorm      | none: EvoNorm-S0 (Liu et al. 2020), x sigmoid(v x) / its group's std       |
| gnws         | none: GroupNorm, and the convolution feeding it weight-standardized (WS)   |

The batch-free kind is EvoNorm-S0 rather than Filter Response Normalization: FRN divides each
channel by its mean square over the pixels of one sample, which at a 1x1 map (resnet18's last
stage on 32 px images) is the value itself, so it outputs little more than the sign; EvoNorm-S0
takes its statistics over a group of channels and their pixels, as GroupNorm does, which stays
defined there.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Iterable

import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.parallel import DistributedDataParallel

from bnlab.batchnorm import PLAIN, BatchNormXd, BatchRenorm, FrozenBatchNorm, RankBatchNorm, typed
from bnlab.compat import BN_TAKES_BIAS, GN_TAKES_BIAS, bias_kw, drop_bias
from bnlab.errors import BnlabError
from bnlab.normact import NormAct, is_norm_act, with_act
from bnlab.wsconv import WSConv2d, feeding_convs, from_conv, to_conv

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


def _reverts_to(bn: _BatchNorm) -> type[_BatchNorm]:
    if isinstance(bn, RankBatchNorm):
        return bn.reverts_to
    return next((c for c in PLAIN if isinstance(bn, c)), BatchNormXd)


def _batch_stat_layer(cls, bn: _BatchNorm, eps, momentum, **kw) -> RankBatchNorm:
    plain = next((c for c in PLAIN if isinstance(bn, c)), None)  # it stays one (typed)
    layer = typed(cls, plain)(bn.num_features, eps=bn.eps if eps is _KEEP else eps,
                momentum=bn.momentum if momentum is _KEEP else momentum, affine=bn.affine,
                track_running_stats=bn.track_running_stats, bias=bn.bias is not None, **kw,
                **_factory(bn))
    layer.reverts_to = _reverts_to(bn)
    return _carry(bn, layer, BN_STATE)


def _bn(bn, name, eps=_KEEP, momentum=_KEEP):
    return _batch_stat_layer(RankBatchNorm, bn, eps, momentum, sync="none")


def _syncbn(bn, name, eps=_KEEP, momentum=_KEEP, sync_group=0, impl="auto", process_group=None):
    return _batch_stat_layer(RankBatchNorm, bn, eps, momentum, sync="exact",
                             sync_group=sync_group, impl=impl, process_group=process_group)


def _syncbn_naive(bn, name, eps=_KEEP, momentum=_KEEP, sync_group=0):
    return _batch_stat_layer(RankBatchNorm, bn, eps, momentum, sync="naive",
                             sync_group=sync_group)


def _frozen_bn(bn, name, eps=_KEEP, momentum=_KEEP, freeze_after=0):
    return _batch_stat_layer(FrozenBatchNorm, bn, eps, momentum, freeze_after=freeze_after)


def _brn(bn, name, eps=_KEEP, momentum=_KEEP, r_max=3.0, d_max=5.0, hold_steps=5000,
         r_ramp_steps=40000, d_ramp_steps=25000, ramp_of_run=None):
    return _batch_stat_layer(BatchRenorm, bn, eps, momentum, r_max=r_max, d_max=d_max,
                             hold_steps=hold_steps, r_ramp_steps=r_ramp_steps,
                             d_ramp_steps=d_ramp_steps, ramp_of_run=ramp_of_run)


class EvoNormS0(nn.Module):
    """EvoNorm-S0 (Liu et al. 2020, arXiv:2004.02967): y = x sigmoid(v x) / s(x) weight + bias,
    s(x) the standard deviation (biased, + eps under the root) of each sample's group of
    `groups` channel groups over their channels and pixels. No batch statistics, no running
    buffers; it is a normalization and an activation in one (the paper puts it in place of
    BN + ReLU; converted into a model it replaces BN alone, and the model's ReLU stays)."""

    def __init__(self, num_features: int, groups: int = 32, eps: float = 1e-5,
                 nonlinearity: bool = True, device=None, dtype=None):
        super().__init__()
        if num_features % groups:
            raise ValueError(f"{groups} groups do not divide {num_features} channels")
        kw = {"device": device, "dtype": dtype}
        self.num_features, self.groups, self.eps = num_features, groups, eps
        self.nonlinearity = nonlinearity
        self.weight = nn.Parameter(torch.ones(num_features, **kw))
        self.bias = nn.Parameter(torch.zeros(num_features, **kw))
        self.v = nn.Parameter(torch.ones(num_features, **kw))

    def extra_repr(self) -> str:
        return f"{self.num_features}, groups={self.groups}, eps={self.eps}" + \
            ("" if self.nonlinearity else ", nonlinearity=False")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c = x.shape[:2]
        per = (1, c) + (1,) * (x.dim() - 2)
        if not self.nonlinearity:  # the authors' (and timm's apply_act=False): affine only
            return x * self.weight.view(per).to(x.dtype) + self.bias.view(per).to(x.dtype)
        grouped = x.reshape(n, self.groups, -1).float()
        std = (grouped.var(2, unbiased=False, keepdim=True) + self.eps).sqrt()
        std = std.expand_as(grouped).reshape(x.shape).to(x.dtype)
        y = x * torch.sigmoid(self.v.view(per).to(x.dtype) * x) / std
        return y * self.weight.view(per).to(x.dtype) + self.bias.view(per).to(x.dtype)


def _groups(bn, name: str, groups: int, cap_groups: bool) -> int:
    """The group count for this layer: `groups` (or at most its channels with `cap_groups`),
    refused in one sentence where it does not divide the layer's channels."""
    c = bn.num_features
    g = min(groups, c) if cap_groups else groups
    if c % g:
        fix = "set cap_groups=True (the trainer: norm.cap_groups=true; min(groups, channels) " \
            "per layer) or choose" if c < groups else "choose"
        best = max(d for d in range(1, g + 1) if c % d == 0)
        raise BnlabError(
            f"groups={groups} does not divide the {c} channels of layer '{name}'; "
            f"{fix} a group count that divides every layer's channels (here at most {best}; "
            "bnlab doctor names one for the whole model)."
        )
    return g


def _evonorm(bn, name, groups=32, cap_groups=True, eps=_KEEP, placement="each_bn"):
    g = _groups(bn, name, groups, cap_groups)  # placement: convert's, after every layer
    layer = EvoNormS0(bn.num_features, g, bn.eps if eps is _KEEP else eps, **_factory(bn))
    return _carry(bn, layer, ("weight", "bias"))  # BN's per-channel affine is EvoNorm's


def _group_norm(bn, groups: int, eps) -> nn.GroupNorm:
    bias = bn.bias is not None
    gn = drop_bias(nn.GroupNorm(groups, bn.num_features, eps=bn.eps if eps is _KEEP else eps,
                                affine=bn.affine, **bias_kw(bias, GN_TAKES_BIAS),
                                **_factory(bn)), bias)
    return _carry(bn, gn, ("weight", "bias"))  # BN's per-channel affine is GN's


def _gn(bn, name, groups=32, cap_groups=False, eps=_KEEP):
    return _group_norm(bn, _groups(bn, name, groups, cap_groups), eps)


def _ln(bn, name, eps=_KEEP):
    return _group_norm(bn, 1, eps)


def _gnws(bn, name, groups=32, cap_groups=False, eps=_KEEP, ws_eps=1e-6):
    """GroupNorm in place of BN; `convert` standardizes the conv that feeds it (ws_eps)."""
    return _gn(bn, name, groups, cap_groups, eps)


NORMS: dict[str, Callable[..., nn.Module]] = {
    "bn": _bn,
    "syncbn": _syncbn,
    "syncbn_naive": _syncbn_naive,
    "gn": _gn,
    "ln": _ln,
    "frozen_bn": _frozen_bn,
    "brn": _brn,
    "evonorm": _evonorm,
    "gnws": _gnws,
}

# Layers whose forward is known: a BN subclass with another forward, or with child modules
# (timm's BatchNormAct2d: BN + activation), would lose that behaviour if rebuilt.
_KNOWN_FORWARDS = {c.forward for c in (*PLAIN, nn.SyncBatchNorm, BatchNormXd, RankBatchNorm)}


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

    `opts` are the kind's options (`sync_group`, or for syncbn a torch `process_group` of any
    ranks, as torch's `convert_sync_batchnorm` takes; `groups`, `cap_groups`, `freeze_after`;
    brn's `r_max`, `d_max` and ramp; gnws's `ws_eps`);
    `eps` or `momentum`, when given, replace the layers' own. `skip` names layers to leave as
    they are. InstanceNorm and other norms are left alone. Returns the model (a new module
    only when `model` is itself a BatchNorm layer).
    """
    _refuse_ddp(model, "convert")
    if kind not in NORMS:
        raise BnlabError(f"kind='{kind}' is unknown; choose one of {sorted(NORMS)}.")
    skip = set(skip)
    names = {n for n, _ in model.named_modules()}
    if skip - names:
        raise BnlabError(f"skip names {sorted(skip - names)}, which the model does not have; "
                         f"name layers as model.named_modules() does.")
    make = NORMS[kind]
    takes = [p for p in inspect.signature(make).parameters if p not in ("bn", "name")]
    if set(opts) - set(takes):
        raise BnlabError(f"convert(model, '{kind}') takes no option "
                         f"{', '.join(sorted(set(opts) - set(takes)))}; its options are "
                         f"{', '.join(takes)}.")
    # gnws: the convolutions whose outputs the converted layers normalize, standardized
    ws = set(feeding_convs(model, {n for n, m in model.named_modules()
                                   if isinstance(m, _BatchNorm) and n not in skip}).values()) \
        if kind == "gnws" else set()

    def pick(module: nn.Module, name: str) -> nn.Module | None:
        if name in ws and name not in skip and not isinstance(module, WSConv2d):
            return from_conv(module, opts.get("ws_eps", 1e-6))
        if not isinstance(module, _BatchNorm):
            return None
        if name in skip:
            return module
        if not is_norm_act(module):
            _refuse_unknown(module, name)
        layer = make(module, name, **opts)
        return with_act(layer, module) if is_norm_act(module) else layer

    out = _swap(model, pick)
    if kind == "evonorm" and opts.get("placement", "each_bn") != "each_bn":
        if opts["placement"] not in PLACEMENTS:
            raise BnlabError(f"placement='{opts['placement']}' is unknown; choose one of "
                             f"{', '.join(PLACEMENTS)}.")
        place_norm_act(out)
    return out


# EvoNorm-S0 as its authors place it (Liu et al. 2020's TPU ResNet; timm's norm-act layers):
# (norm, activation) pairs of a block class whose norm is followed by that activation alone.
NORM_ACT = {"BasicBlock": (("bn1", "relu1"),), "ResNetCifar": (("bn1", "relu"),)}
PLACEMENTS = ("each_bn", "norm_act")


def place_norm_act(model: nn.Module) -> int:
    """EvoNorm-S0 where its authors put it, in a model whose BNs `convert` made EvoNorm-S0:
    each one followed by its block's ReLU, or made from a timm norm-act layer with an
    activation, takes the activation's place too (it becomes an Identity), every other one
    (the block's last, the projection shortcut's) runs without its nonlinearity, affine only.
    Refused for a model with no block or layer it knows (NORM_ACT). Returns how many
    activations it took."""
    paired = set()
    for block in model.modules():
        for norm, act in NORM_ACT.get(type(block).__name__, ()):
            layer = getattr(block, norm, None)
            if isinstance(layer, EvoNormS0) and isinstance(getattr(block, act, None), nn.ReLU):
                paired.add(id(layer))
                setattr(block, act, nn.Identity())
    for layer in model.modules():  # made from timm's norm-act layers: their act, if any
        if isinstance(layer, EvoNormS0) and isinstance(layer, NormAct) and \
                not isinstance(layer.act, nn.Identity):
            paired.add(id(layer))
            layer.act = nn.Identity()
    if not paired:
        raise BnlabError(
            "norm.placement=norm_act knows the blocks of bnlab's resnet20 (a BN followed by its "
            "own ReLU module) and timm's norm-act layers (BatchNormAct2d) only; use "
            "norm.placement=each_bn (EvoNorm-S0 in place of every BN, the model's activations "
            "kept) for this model.")
    for m in model.modules():
        if isinstance(m, EvoNormS0):
            m.nonlinearity = id(m) in paired
            if not m.nonlinearity:
                m.v = None  # unused there: no parameter DDP would wait for
    return len(paired)


def revert(model: nn.Module) -> nn.Module:
    """Give back plain torch BatchNorm (1d, 2d or 3d as converted; BatchNormXd for torch's
    SyncBatchNorm) for every bnlab BN layer and torch SyncBatchNorm, state included.

    GroupNorm, LayerNorm and EvoNorm keep no batch statistics, so a model converted to gn, ln
    or evonorm stays as it is; gnws's weight-standardized convolutions become plain ones that
    hold the standardized weights (the same function). A simulated model gives back rank 0's
    running statistics.
    """
    _refuse_ddp(model, "revert")

    def pick(module: nn.Module, name: str) -> nn.Module | None:
        if isinstance(module, WSConv2d):
            return to_conv(module)
        if not isinstance(module, (RankBatchNorm, nn.SyncBatchNorm)) or \
                is_norm_act(module) and not isinstance(module, RankBatchNorm):
            return None  # timm's SyncBatchNormAct stays: bnlab did not make it
        cls = _reverts_to(module)
        bias = module.bias is not None
        kw = {} if isinstance(module, NormAct) else bias_kw(bias, BN_TAKES_BIAS)  # timm's: no bias=
        plain = drop_bias(cls(module.num_features, module.eps, module.momentum, module.affine,
                              module.track_running_stats, **kw, **_factory(module)), bias)
        if isinstance(module, NormAct):  # timm's class back, with its drop path and activation
            plain.drop, plain.act = module.drop, module.act
        return _carry(module, plain, BN_STATE)

    return _swap(model, pick)
