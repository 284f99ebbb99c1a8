"""BN health: values per channel, rank divergence, batch-vs-running gap, train-mode accuracy.

All metrics are flat `bn/...` keys. Per-layer keys name the layer (`bn/div_mean/layer1.0.bn1`);
`..._max` keys take the worst layer.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as tdist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from bnlab import dist
from bnlab.batchnorm import RankBatchNorm
from bnlab.bn_sync import reduce_var_gap
from bnlab.data import Dataset, val_batches
from bnlab.jitter import MISSING
from bnlab.metrics import Meter
from bnlab.simulate import rank_stats, world_of

EPS = 1e-5


def _bns(model: nn.Module) -> list[tuple[str, RankBatchNorm]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, RankBatchNorm)]


# ----------------------------------------------------------------------------------------
# Running statistics of every rank, and how far they are from rank 0's


def rank_running_stats(model: nn.Module, env: dist.DistEnv) -> list[dict[str, tuple]]:
    """Every rank's (running_mean, running_var) per BN layer, on every rank (simulated too)."""
    layers = _bns(model)
    if not layers:
        return []
    world = world_of(layers[0][1])
    if world > 1:
        return [{n: tuple(t.clone() for t in rank_stats(m, r)) for n, m in layers}
                for r in range(world)]
    return gather_running_stats(layers, env.world if env.distributed else 1)


def gather_running_stats(layers: list[tuple[str, nn.Module]],
                         world: int) -> list[dict[str, tuple]]:
    """Every rank's (running_mean, running_var) per named layer, gathered on every rank with one
    all_gather (world > 1, under torch.distributed), else this process's alone."""
    if not layers:
        return []
    flat = torch.cat([t for _, m in layers for t in (m.running_mean, m.running_var)])
    gathered = [flat]
    if world > 1:
        gathered = [torch.empty_like(flat) for _ in range(world)]
        tdist.all_gather(gathered, flat)
    out = []
    for g in gathered:
        parts, i = {}, 0
        for n, m in layers:
            c = m.num_features
            parts[n] = (g[i:i + c].clone(), g[i + c:i + 2 * c].clone())
            i += 2 * c
        out.append(parts)
    return out


def divergence(ranks: list[dict[str, tuple]]) -> dict[str, float]:
    """Per layer, max over ranks and channels of |mean_r - mean_0| / sqrt(var_0) and of
    |log var_r - log var_0|."""
    if len(ranks) < 2:
        return {}
    out: dict[str, float] = {}
    for name, (m0, v0) in ranks[0].items():
        dm = max(((r[name][0] - m0).abs() / (v0 + EPS).sqrt()).max().item() for r in ranks[1:])
        dv = max(((r[name][1] + EPS).log() - (v0 + EPS).log()).abs().max().item()
                 for r in ranks[1:])
        out[f"bn/div_mean/{name}"], out[f"bn/div_logvar/{name}"] = dm, dv
        # what an epoch-end `reduce` (timm's average) would miss of the ranks' union
        out[f"bn/reduce_var_gap/{name}"] = reduce_var_gap(
            torch.stack([r[name][0] for r in ranks]), torch.stack([r[name][1] for r in ranks]))
    return _with_max(out, ("bn/div_mean", "bn/div_logvar", "bn/reduce_var_gap"))


def _with_max(per_layer: dict[str, float], prefixes) -> dict[str, float]:
    for p in prefixes:
        vals = [v for k, v in per_layer.items() if k.startswith(p + "/")]
        if vals:
            per_layer[f"{p}_max"] = max(vals)
    return per_layer


# ----------------------------------------------------------------------------------------
# Gap between the batch statistics a layer normalizes with and its running statistics


class GapProbe:
    """While active, records rank 0's batch statistics against its running statistics.

    Measured on this process's first rank (rank 0, or simulated rank 0), before the layer
    updates its running statistics. Use as a context manager around one training step.
    """

    def __init__(self, model: nn.Module):
        self.layers = _bns(model)
        self.gaps: dict[str, float] = {}
        self.hooks = []

    def _hook(self, name):
        def hook(mod: RankBatchNorm, inp):
            if not mod.training:
                return
            x = inp[0].detach()
            x = x[: x.shape[0] // world_of(mod)].float()
            bm, bv = x.mean((0, 2, 3)), x.var((0, 2, 3), unbiased=False)
            rm, rv = (t.float() for t in rank_stats(mod, 0))
            self.gaps[f"bn/gap_mean/{name}"] = ((bm - rm).abs() / (rv + EPS).sqrt()).max().item()
            self.gaps[f"bn/gap_logvar/{name}"] = ((bv + EPS).log() - (rv + EPS).log()) \
                .abs().max().item()
        return hook

    def __enter__(self):
        self.hooks = [m.register_forward_pre_hook(self._hook(n)) for n, m in self.layers]
        return self

    def __exit__(self, *exc):
        for h in self.hooks:
            h.remove()

    def result(self) -> dict[str, float]:
        return _with_max(dict(self.gaps), ("bn/gap_mean", "bn/gap_logvar"))


# ----------------------------------------------------------------------------------------
# Train-mode accuracy: BN with the statistics of each evaluation batch


def ghost_batch_norm(bn: _BatchNorm, x: torch.Tensor, group: int) -> torch.Tensor:
    """Train-mode BN with each run of `group` consecutive images normalized by its own
    statistics: what `x.split(group)` through the layer one batch at a time computes, in one
    kernel call (the groups laid side by side as channels). A last run shorter than `group`
    (at least 2 images) is normalized on its own; running statistics are not touched."""
    n, c, rest = x.shape[0], x.shape[1], x.shape[2:]
    whole = n - n % group
    out = []
    if whole:
        k = whole // group
        xs = x[:whole].view(k, group, c, *rest).transpose(0, 1).reshape(group, k * c, *rest)
        w = bn.weight.repeat(k) if bn.weight is not None else None
        b = bn.bias.repeat(k) if bn.bias is not None else None
        ys = F.batch_norm(xs, None, None, w, b, True, 0.0, bn.eps)
        out.append(ys.view(group, k, c, *rest).transpose(0, 1).reshape(whole, c, *rest))
    if n > whole:
        out.append(F.batch_norm(x[whole:], None, None, bn.weight, bn.bias, True, 0.0, bn.eps))
    return torch.cat(out) if len(out) > 1 else out[0]


def on_batch_statistics(model: nn.Module, batch: int) -> nn.Module:
    """A copy whose BN layers normalize each run of `batch` consecutive samples by its own
    statistics (ghost_batch_norm; running statistics untouched), as training at `batch`
    samples per rank computes it: a layer that training keeps in eval mode (frozen BN) keeps
    its running statistics. The rest of the model stays in its mode. Used by
    train_mode_accuracy (bnlab's runs) and bnlab.diagnose (any model)."""
    m = copy.deepcopy(model)
    modes = {mod: mod.training for mod in m.modules()}
    m.train()  # a layer that stays in eval mode here is one training keeps there
    frozen = {bn for bn in m.modules() if isinstance(bn, _BatchNorm) and not bn.training}
    for mod, training in modes.items():
        mod.training = training
    for bn in m.modules():
        if isinstance(bn, _BatchNorm) and bn not in frozen:
            bn.forward = lambda x, bn=bn: ghost_batch_norm(bn, x, batch)
    return m


@torch.no_grad()
def train_mode_accuracy(model: nn.Module, data: Dataset, val, env: dist.DistEnv,
                        batch: int, preds: list | None = None,
                        eval_batch: int = 256) -> dict[str, float]:
    """Validation accuracy with BN in train mode at evaluation batch `batch` (on a copy):
    each run of `batch` consecutive images of this rank's share normalized by its own
    statistics, computed `eval_batch // batch` runs at a time (ghost_batch_norm). `preds`
    collects this rank's predicted classes (MISSING for a last image left alone)."""
    m = on_batch_statistics(model, batch)
    m.train()
    meter = Meter(env.device)
    per = max(batch, eval_batch // batch * batch)
    for x, y in val_batches(data, val, env.device, per, env.world, env.rank):
        lone = x.shape[0] % batch == 1  # BN cannot normalize one image: leave it out
        if lone:
            x, y = x[:-1], y[:-1]
        if x.shape[0]:
            logits = m(x)
            meter.add(F.cross_entropy(logits, y), logits, y)
            if preds is not None:
                preds.append(logits.argmax(1))
        if lone and preds is not None:
            preds.append(torch.full((1,), MISSING, device=x.device))
    return meter.reduce("bn/train_mode")
