"""Batch statistics shared across ranks: the exact SyncBN and the naive (biased) sync.

Exact: each rank sends (count, mean, M2) per channel in one all_gather; the statistics of
the union are merged by count (Chan et al.), which stays accurate where sum / sum-of-squares
in fp32 would cancel. Backward sends the two per-channel gradient sums in one all_reduce.
Everything is computed in fp32 whatever the input dtype (as torch's BN does under autocast),
works on CPU/gloo and CUDA/NCCL, and handles unequal batches and ranks with no samples (all of
them too: an empty output, as torch's SyncBatchNorm gives).

Naive (wrong on purpose, `syncbn_naive`): all-reduce each rank's mean and biased variance and
divide by the number of ranks. Its variance misses the spread of the per-rank means:
var_union = mean_r(var_r) + mean_r((mean_r - mean)^2) for equal counts.
"""

from __future__ import annotations

import torch
import torch.distributed as tdist

from bnlab.errors import BnlabError

_GROUPS: dict[tuple[int, int], tdist.ProcessGroup | None] = {}


def group_ranks(world: int, sync_group: int) -> int:
    """How many ranks share batch statistics: groups of `sync_group` consecutive ranks out of
    `world` (0: all of them). The one rule for the layers, their process groups and the doctor."""
    size = world if sync_group in (0, world) else sync_group
    if world % size:
        raise BnlabError(f"norm.sync_group={size} must divide the number of ranks ({world}).")
    return size


def sync_group(size: int) -> tdist.ProcessGroup | None:
    """The process group of `size` consecutive ranks that holds this rank (0 = all ranks).

    Every rank must call this the first time in the same order (new_subgroups is collective).
    """
    world = tdist.get_world_size()
    size = group_ranks(world, size)
    key = (world, size)
    if key not in _GROUPS:
        _GROUPS[key] = None if size == world else tdist.new_subgroups(group_size=size)[0]
    return _GROUPS[key]


def in_stats_dtype(x: torch.Tensor) -> torch.Tensor:
    """The input in the dtype statistics are computed in: fp32 for half types, else as is."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _dims(x: torch.Tensor) -> list[int]:
    return [0, *range(2, x.dim())]


def _shape(x: torch.Tensor) -> list[int]:
    return [1, -1] + [1] * (x.dim() - 2)


def local_moments(xf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-channel (count, mean, M2) of this rank's fp32 input; zeros when it has no samples."""
    c = xf.shape[1]
    n = xf.numel() // c if c else 0
    if n == 0:
        z = xf.new_zeros(c)
        return xf.new_tensor(0.0), z, z.clone()
    mean = xf.mean(_dims(xf))
    m2 = (xf - mean.view(_shape(xf))).pow(2).sum(_dims(xf))
    return xf.new_tensor(float(n)), mean, m2


def merge_moments(counts: torch.Tensor, means: torch.Tensor, m2s: torch.Tensor):
    """Union statistics from per-rank (count, mean, M2): returns count, mean, M2."""
    n = counts.sum()
    mean = (counts[:, None] * means).sum(0) / n
    m2 = m2s.sum(0) + (counts[:, None] * (means - mean).pow(2)).sum(0)
    return n, mean, m2


def update_running(bn, mean: torch.Tensor, var_unbiased: torch.Tensor) -> None:
    """EMA update of running statistics and num_batches_tracked, as torch's BN does."""
    if not bn.track_running_stats:
        return
    bn.num_batches_tracked.add_(1)
    m = bn.momentum if bn.momentum is not None else 1.0 / float(bn.num_batches_tracked)
    bn.running_mean.mul_(1 - m).add_(mean.to(bn.running_mean.dtype), alpha=m)
    bn.running_var.mul_(1 - m).add_(var_unbiased.to(bn.running_var.dtype), alpha=m)


class _SyncBatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, bn, group):
        xf = in_stats_dtype(x)
        n, mean, m2 = local_moments(xf)
        world = tdist.get_world_size(group)
        packed = torch.cat([n.view(1), mean, m2]).double()
        gathered = [torch.empty_like(packed) for _ in range(world)]
        tdist.all_gather(gathered, packed, group=group)
        g = torch.stack(gathered)
        c = x.shape[1]
        total = g[:, 0].sum()
        if total == 0:
            # No sample on any rank: as torch's SyncBatchNorm (pytorch/pytorch#36530), an empty
            # output, zero gradients for weight and bias, running statistics left as they are
            # (the batch is still counted in num_batches_tracked, as torch's module counts it).
            if bn.track_running_stats:
                bn.num_batches_tracked.add_(1)
            gmean, var, total = xf.new_zeros(c), xf.new_ones(c), total.new_tensor(1.0)
        else:
            if total == 1:
                raise BnlabError(
                    "SyncBN got 1 value per channel over all ranks; it needs more than 1."
                )
            total, gmean, gm2 = merge_moments(g[:, 0], g[:, 1:c + 1], g[:, c + 1:])
            gmean, var = gmean.to(xf.dtype), (gm2 / total).to(xf.dtype)
            with torch.no_grad():
                update_running(bn, gmean, (gm2 / (total - 1)).to(xf.dtype))
        invstd = torch.rsqrt(var + bn.eps)
        xhat = (xf - gmean.view(_shape(x))) * invstd.view(_shape(x))
        y = _affine(xhat, bn)
        ctx.save_for_backward(xhat, weight, invstd)
        ctx.total, ctx.group = float(total), group
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        xhat, weight, invstd = ctx.saved_tensors
        dyf = dy.to(xhat.dtype)
        dims, shape = _dims(dyf), _shape(dyf)
        sum_dy = dyf.sum(dims)
        sum_dy_xhat = (dyf * xhat).sum(dims)
        dx = None
        if ctx.needs_input_grad[0]:
            red = torch.cat([sum_dy, sum_dy_xhat])
            tdist.all_reduce(red, group=ctx.group)  # the one collective of the backward pass
            c = sum_dy.numel()
            scale = invstd if weight is None else invstd * weight.to(xhat.dtype)
            dx = scale.view(shape) * (dyf - red[:c].view(shape) / ctx.total
                                      - xhat * red[c:].view(shape) / ctx.total)
            dx = dx.to(dy.dtype)
        dw = sum_dy_xhat.to(weight.dtype) if weight is not None and ctx.needs_input_grad[1] \
            else None
        db = sum_dy.to(weight.dtype) if weight is not None and ctx.needs_input_grad[2] else None
        return dx, dw, db, None, None


def sync_batch_norm(x, bn, group):
    """Exact SyncBN forward in training mode (statistics of the union of the group's ranks)."""
    return _SyncBatchNorm.apply(x, bn.weight, bn.bias, bn, group)


def syncbn_impl(asked: str, device: torch.device | str) -> str:
    """Whose code computes exact SyncBN for tensors on `device`: torch's SyncBatchNorm kernels
    (`batch_norm_stats`, `batch_norm_gather_stats_with_counts`, `batch_norm_elemt`, one
    all_gather) where they exist, that is on CUDA, unless `asked` is "bnlab"; bnlab's own
    function elsewhere (CPU/gloo: torch has no CPU kernels for them). "torch" on another
    device is refused."""
    on_cuda = torch.device(device).type == "cuda"
    if asked == "torch" and not on_cuda:
        raise BnlabError(f"norm.impl=torch needs CUDA tensors (torch's SyncBatchNorm kernels "
                         f"have no {torch.device(device).type} version); use norm.impl=auto.")
    return "torch" if on_cuda and asked != "bnlab" else "bnlab"


def torch_sync_batch_norm(x, bn, group):
    """Exact SyncBN through torch's own autograd function (what nn.SyncBatchNorm runs in
    training mode), with bnlab's momentum rule (None: the cumulative average)."""
    from torch.nn.modules._functions import SyncBatchNorm as TorchSyncBN

    factor = bn._ema_factor() if bn.track_running_stats else 0.0
    group = group or tdist.group.WORLD
    tracked = bn.track_running_stats
    # torch's function gathers an empty rank's zeros in the input's dtype but the other ranks'
    # statistics in float32 (half and bfloat16 inputs): an empty rank computes in float32 too.
    xs = x.float() if x.numel() == 0 and x.dtype in (torch.float16, torch.bfloat16) else x
    y = TorchSyncBN.apply(xs, bn.weight, bn.bias, bn.running_mean if tracked else None,
                          bn.running_var if tracked else None, bn.eps, factor, group,
                          tdist.get_world_size(group))
    return y.to(x.dtype)


def _affine(xhat: torch.Tensor, bn) -> torch.Tensor:
    s = _shape(xhat)
    if bn.weight is not None:
        xhat = xhat * bn.weight.to(xhat.dtype).view(s)
    if bn.bias is not None:
        xhat = xhat + bn.bias.to(xhat.dtype).view(s)
    return xhat


class _AllReduceSum(torch.autograd.Function):
    """Sum over ranks whose gradient is again the sum over ranks (one collective each way)."""

    @staticmethod
    def forward(ctx, t, group):
        t = t.clone()
        tdist.all_reduce(t, group=group)
        ctx.group = group
        return t

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        tdist.all_reduce(g, group=ctx.group)
        return g, None


def naive_sync_batch_norm(x, bn, group):
    """The flawed sync: average of per-rank means and biased variances (differentiable)."""
    xf = in_stats_dtype(x)
    dims, s = _dims(xf), _shape(xf)
    mean = xf.mean(dims)
    var = xf.var(dims, unbiased=False)
    n = xf.numel() // xf.shape[1]
    world = tdist.get_world_size(group)
    stats = _AllReduceSum.apply(torch.cat([mean, var]), group) / world
    c = xf.shape[1]
    gmean, gvar = stats[:c], stats[c:]
    with torch.no_grad():  # running var: the average of the ranks' unbiased variances
        update_running(bn, gmean, gvar * n / max(n - 1, 1))
    xhat = (xf - gmean.view(s)) * torch.rsqrt(gvar + bn.eps).view(s)
    return _affine(xhat, bn).to(x.dtype)
