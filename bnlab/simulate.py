"""One process standing in for W data-parallel ranks, with DDP's exact semantics.

The global micro-batch (already layout-independent, see bnlab.data) holds the W ranks'
chunks in rank order. BN layers (RankBatchNorm) split it: `bn` normalizes each chunk on
its own, `syncbn` the union of its sync group, `syncbn_naive` mixes chunk statistics the
flawed way; GroupNorm, LayerNorm and frozen BN do not depend on the batch. The loss is the
mean over all W x b samples, which equals DDP's mean over ranks of per-rank means, so the
gradient is DDP's all-reduced gradient.

Running statistics follow DDP: with forward buffer sync on (torch's default), rank 0's
buffers overwrite every rank's before a forward that follows a synchronised backward (so
under grad accumulation, once per optimizer step); with it off, every rank keeps its own
EMA. What it does not model: communication cost and timing, and anything that depends on
ranks having different code paths.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn

from bnlab.batchnorm import RankBatchNorm


class SimulatedDDP(nn.Module):
    """Wraps a model like DistributedDataParallel, but the W ranks live in one process."""

    def __init__(self, module: nn.Module, world: int, forward_sync_buffers: bool = True):
        super().__init__()
        self.module, self.world, self.forward_sync_buffers = module, world, forward_sync_buffers
        self.bns = [m for m in module.modules() if isinstance(m, RankBatchNorm)]
        for m in self.bns:
            m.simulate(world)
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
                    m.sync_rank_buffers_from_rank0()
        out = self.module(x)
        self.require_forward_param_sync = torch.is_grad_enabled() and self._grad_sync
        return out

    def rank_buffers(self, rank: int) -> dict[str, torch.Tensor]:
        """Simulated rank `rank`'s running statistics, named as in the bare model."""
        out = {}
        for name, m in self.module.named_modules():
            if isinstance(m, RankBatchNorm):
                mean, var = m.rank_stats(rank)
                out[f"{name}.running_mean"], out[f"{name}.running_var"] = mean, var
        return out
