"""Epoch-end BN sync: make every rank's running statistics agree before evaluating or saving.

Ranks that train BN on their own batches end an epoch with different running statistics
(unless DDP's forward buffer sync has just given them rank 0's). Three ways to agree:

- broadcast: rank 0's statistics (what DDP's buffer sync does at each forward);
- reduce: the average of the ranks' means and of their variances (timm's distribute_bn);
- pooled: the union of equal-weight ranks: the mean of the means, and the mean of the
  variances plus the spread of the means, which `reduce` drops.

Works across real ranks (one all_gather per layer) and across the simulated ranks of
`bnlab.simulate`. Returns how far `reduce` lands from `pooled`, the share of the pooled
variance that averaging the variances misses.
"""

from __future__ import annotations

import torch
import torch.distributed as tdist
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

from bnlab.errors import BnlabError
from bnlab.simulate import SimulatedRanks

BN_SYNC_MODES = ("none", "broadcast", "reduce", "pooled")


def _rank_stats(bn: _BatchNorm) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(W, C) running means and variances of every rank, and whether they are simulated."""
    if isinstance(bn, SimulatedRanks):
        return (*bn.ranks_running(), True)
    if tdist.is_initialized() and tdist.get_world_size() > 1:
        w = tdist.get_world_size()
        packed = torch.cat([bn.running_mean, bn.running_var]).double()
        gathered = [torch.empty_like(packed) for _ in range(w)]
        tdist.all_gather(gathered, packed)
        g = torch.stack(gathered)
        c = bn.num_features
        means, variances = g[:, :c].to(bn.running_mean.dtype), g[:, c:].to(bn.running_var.dtype)
        return means, variances, False
    return bn.running_mean.view(1, -1), bn.running_var.view(1, -1), False


def _pool(means: torch.Tensor, variances: torch.Tensor):
    """From (W, C) per-rank means and variances, in float64: the mean of the means, the mean
    of the variances (`reduce`) and the spread of the means (what `pooled` adds)."""
    means, variances = means.double(), variances.double()
    mean = means.mean(0)
    return mean, variances.mean(0), (means - mean).pow(2).mean(0)


def _gap(reduced: torch.Tensor, spread: torch.Tensor) -> float:
    return (spread / (reduced + spread).clamp_min(1e-12)).mean().item()


def reduce_var_gap(means: torch.Tensor, variances: torch.Tensor) -> float:
    """From (W, C) per-rank running means and variances: the share of the pooled variance
    that `reduce` misses (the spread of the rank means), averaged over channels."""
    _, reduced, spread = _pool(means, variances)
    return _gap(reduced, spread)


@torch.no_grad()
def sync_bn_stats(model: nn.Module, mode: str = "pooled") -> dict[str, float]:
    """Give every rank the same BN running statistics, by `mode` (see the module's table).

    Every rank must call it (a collective per BN layer). Returns `bn_sync/reduce_var_gap`:
    over layers, the mean share of the pooled variance that `reduce` misses (0 where the
    ranks' means agree), and its largest value over layers.
    """
    if mode not in BN_SYNC_MODES:
        raise BnlabError(f"dist.bn_sync={mode!r} is unknown; choose one of {BN_SYNC_MODES}.")
    if mode == "none":
        return {}
    model = getattr(model, "module", model)  # a DDP or simulated-DDP wrapper
    gaps = []
    for m in model.modules():
        if not isinstance(m, _BatchNorm) or m.running_mean is None:
            continue
        means, variances, simulated = _rank_stats(m)
        mean, reduced, spread = _pool(means, variances)
        pooled = reduced + spread
        gaps.append(_gap(reduced, spread))
        if mode == "broadcast":
            new_mean, new_var = means[0].clone(), variances[0].clone()
        else:
            new_mean, new_var = mean, pooled if mode == "pooled" else reduced
        m.running_mean.copy_(new_mean.to(m.running_mean.dtype))
        m.running_var.copy_(new_var.to(m.running_var.dtype))
        if simulated:
            m.take_running()
    if not gaps:
        return {}
    return {"bn_sync/reduce_var_gap": sum(gaps) / len(gaps),
            "bn_sync/reduce_var_gap_max": max(gaps)}
