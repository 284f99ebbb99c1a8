"""One process standing in for W data-parallel ranks, with DDP's exact semantics.

The global micro-batch (already layout-independent, see bnlab.data) holds the W ranks'
chunks in rank order. `SimulatedDDP` turns each of the model's batch-statistics layers
(RankBatchNorm and its kinds) into its simulated layer (`SimulatedRanks`), which splits the
batch: `bn` normalizes each chunk on its own, `syncbn` the union of its sync group,
`syncbn_naive` mixes chunk statistics the flawed way, `brn` renormalizes each chunk against
its own rank's running statistics; GroupNorm, LayerNorm and frozen BN do not depend on the
batch. The loss is the mean over all W x b samples, which equals DDP's mean over ranks of
per-rank means, so the gradient is DDP's all-reduced gradient.

Running statistics follow DDP: each simulated layer keeps the W ranks' own (buffers
`sim_running_mean` and `sim_running_var`, W x C, left out of the state dict: the model's
state is what a DDP checkpoint holds, rank 0's `running_mean` and `running_var`); with
forward buffer sync on (torch's default), rank 0's buffers overwrite every rank's before a
forward that follows a synchronised backward (so under grad accumulation, once per optimizer
step); with it off, every rank keeps its own EMA. What it does not model: communication cost
and timing, and anything that depends on ranks having different code paths.
"""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from bnlab.batchnorm import TYPED, BatchRenorm, FrozenBatchNorm, RankBatchNorm
from bnlab.errors import BnlabError
from bnlab.syncbn import in_stats_dtype


class SimulatedRanks:
    """The simulated layer of a RankBatchNorm kind: the same layer (its class, parameters and
    state dict), standing in for `world` ranks, each with its own running statistics;
    `running_mean` and `running_var` mirror rank 0's. Made by `simulate`."""

    world: int

    def _hold_ranks(self, world: int) -> None:
        self.world = world
        if self.track_running_stats:  # the forward says why it refuses a layer without them
            self.register_buffer("sim_running_mean", self.running_mean.repeat(world),
                                 persistent=False)
            self.register_buffer("sim_running_var", self.running_var.repeat(world),
                                 persistent=False)

    def ranks_running(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every rank's running (mean, var) as (W, C) views, updated in place."""
        w, c = self.world, self.num_features
        return self.sim_running_mean.view(w, c), self.sim_running_var.view(w, c)

    def rank_stats(self, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Running (mean, var) of one simulated rank."""
        rm, rv = self.ranks_running()
        return rm[rank], rv[rank]

    def sync_from_rank0(self) -> None:
        """What DDP's forward buffer sync does: every rank takes rank 0's buffers."""
        if self.track_running_stats:
            for buf in self.ranks_running():
                buf[1:] = buf[0]

    def take_running(self) -> None:
        """Every rank takes `running_mean` and `running_var` (PreciseBN's and sync_bn_stats'
        result, which all ranks hold)."""
        rm, rv = self.ranks_running()
        rm.copy_(self.running_mean.expand_as(rm))
        rv.copy_(self.running_var.expand_as(rv))

    def forward_train(self, x: torch.Tensor) -> torch.Tensor:
        """The layer's forward in training (RankBatchNorm.forward calls it), on W ranks."""
        y = self.renormalize(x, self.ranks_running) if isinstance(self, BatchRenorm) else \
            _forward(self, x)
        rm, rv = self.ranks_running()  # rank 0's, as a DDP checkpoint holds
        self.running_mean.copy_(rm[0])
        self.running_var.copy_(rv[0])
        return y


def _forward(bn: SimulatedRanks, x: torch.Tensor) -> torch.Tensor:
    """bn, syncbn or syncbn_naive on W ranks' batches: groups of k consecutive ranks share
    statistics (k = 1 for bn)."""
    w, c = bn.world, bn.num_features
    if x.shape[0] % w:
        raise BnlabError(f"a simulated batch of {x.shape[0]} does not split into {w} ranks.")
    if not bn.track_running_stats:
        raise BnlabError("the simulation of ranks needs BN layers that track running "
                         "statistics (track_running_stats=True).")
    if bn.process_group is not None:
        raise BnlabError("a layer given a process_group syncs across real processes; the "
                         "simulation groups ranks by sync_group instead.")
    k = bn.group_size(w)
    g, b, rest = w // k, x.shape[0] // w, x.shape[2:]
    rm, rv = bn.ranks_running()
    factor = bn._ema_factor()
    if bn.sync == "naive":
        return _naive(bn, x, w, k, rm, rv, factor)
    # Lay the G groups side by side as G*C channels and let one BN kernel normalize each
    # group on its own.
    xs = x.view(g, k * b, c, *rest).transpose(0, 1).reshape(k * b, g * c, *rest)
    grm, grv = rm[::k].reshape(-1).clone(), rv[::k].reshape(-1).clone()
    weight = bn.weight.repeat(g) if bn.weight is not None else None
    bias = bn.bias.repeat(g) if bn.bias is not None else None
    ys = F.batch_norm(xs, grm, grv, weight, bias, True, factor, bn.eps)
    y = ys.view(k * b, g, c, *rest).transpose(0, 1).reshape(x.shape)
    rm.view(g, k, c).copy_(grm.view(g, 1, c).expand(g, k, c))
    rv.view(g, k, c).copy_(grv.view(g, 1, c).expand(g, k, c))
    return y


def _naive(bn, x, w, k, rm, rv, factor) -> torch.Tensor:
    """syncbn_naive: each group normalizes with the mean of its ranks' means and variances."""
    c, g = bn.num_features, w // k
    xs = in_stats_dtype(x).view(w, x.shape[0] // w, c, -1)  # (rank, sample, channel, pixels)
    mean_r = xs.mean((1, 3))
    var_r = xs.var((1, 3), unbiased=False)
    n = xs.shape[1] * xs.shape[3]
    gm = mean_r.view(g, k, c).mean(1).repeat_interleave(k, 0)  # (w, c): each rank's group
    gv = var_r.view(g, k, c).mean(1).repeat_interleave(k, 0)
    with torch.no_grad():
        rm.mul_(1 - factor).add_(gm, alpha=factor)
        rv.mul_(1 - factor).add_(gv * n / max(n - 1, 1), alpha=factor)
    xhat = (xs - gm[:, None, :, None]) * torch.rsqrt(gv + bn.eps)[:, None, :, None]
    if bn.weight is not None:
        xhat = xhat * bn.weight.to(xs.dtype)[:, None]
    if bn.bias is not None:
        xhat = xhat + bn.bias.to(xs.dtype)[:, None]
    return xhat.reshape(x.shape).to(x.dtype)


@functools.cache
def _simulated_class(cls: type) -> type:
    """The simulated layer of a RankBatchNorm class (RankBatchNorm2d -> SimulatedRankBatchNorm2d):
    still an instance of that class, so type-keyed code keeps finding it. SimulatedRanks comes
    first in the order: its forward_train is the layer's (a timm norm-act layer's forward,
    bnlab.normact's, still wraps the layer's own). Named in this module, so a model pickles."""
    name = f"Simulated{cls.__name__}"
    made = type(name, (SimulatedRanks, cls), {"__module__": __name__, "__qualname__": name})
    globals().setdefault(name, made)
    return made


for _cls in (RankBatchNorm, FrozenBatchNorm, BatchRenorm, *TYPED.values()):
    _simulated_class(_cls)  # bnlab's own classes' simulated layers, importable from the start


def simulate(layer: RankBatchNorm, world: int) -> SimulatedRanks:
    """Turn `layer` into its simulated layer for `world` ranks, in place (every rank starting
    from the layer's running statistics)."""
    if not isinstance(layer, SimulatedRanks):
        layer.__class__ = _simulated_class(type(layer))
    layer._hold_ranks(world)
    return layer


def world_of(layer: nn.Module) -> int:
    """The ranks a layer stands in for: its world under the simulation, else 1."""
    return layer.world if isinstance(layer, SimulatedRanks) else 1


def rank_stats(layer: _BatchNorm, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Running (mean, var) of one rank: a simulated rank's, or the layer's own."""
    if isinstance(layer, SimulatedRanks):
        return layer.rank_stats(rank)
    return layer.running_mean, layer.running_var


class SimulatedDDP(nn.Module):
    """Wraps a model like DistributedDataParallel, but the W ranks live in one process."""

    def __init__(self, module: nn.Module, world: int, forward_sync_buffers: bool = True):
        super().__init__()
        self.module, self.world, self.forward_sync_buffers = module, world, forward_sync_buffers
        self.bns = [simulate(m, world) for m in module.modules()
                    if isinstance(m, RankBatchNorm)]
        # As in DDP: buffers are synced before a forward iff the previous forward was not
        # under no_sync() (and at the first forward).
        self.require_forward_param_sync = True
        self._grad_sync = True

    @contextlib.contextmanager
    def no_sync(self):
        old, self._grad_sync = self._grad_sync, False
        try:
            yield
        finally:
            self._grad_sync = old

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.require_forward_param_sync and self.forward_sync_buffers:
            with torch.no_grad():
                for m in self.bns:
                    m.sync_from_rank0()
        out = self.module(x)
        self.require_forward_param_sync = torch.is_grad_enabled() and self._grad_sync
        return out

    def rank_buffers(self, rank: int) -> dict[str, torch.Tensor]:
        """Simulated rank `rank`'s running statistics, named as in the bare model."""
        out = {}
        for name, m in self.module.named_modules():
            if isinstance(m, SimulatedRanks):
                mean, var = m.rank_stats(rank)
                out[f"{name}.running_mean"], out[f"{name}.running_var"] = mean, var
        return out
