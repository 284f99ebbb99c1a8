"""PreciseBN: running statistics recomputed as population statistics of the current model.

Wu & Johnson (2021): the EMA of batch statistics is a poor population estimate when the
model moves fast or batches are small. PreciseBN freezes the model and measures, per
channel, count-weighted E[x] and E[x^2] over `num_samples` training images:
var = E[x^2] - E[x]^2, with the unbiased correction BN expects. Under DDP every rank
measures its share and the sums are all-reduced, so all ranks end with identical
statistics. `pooling="averaged"` (the mean of per-batch variances, as pycls does) exists to
show its bias at small batches; it is not the default.

Estimators:
- `train`: one pass with every layer in train mode (as fvcore/pycls): upstream BN layers
  normalize with the PreciseBN batch's statistics.
- `eval`: layer by layer in forward order, each layer measured on the activations it sees in
  eval mode, with the layers before it already recalibrated.

`precise_bn(model, batches, ...)` is the entry point for any model and any loader; bnlab's
trainer calls `recalibrate` with its own batches.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterable

import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm
from tqdm import tqdm

from bnlab import dist
from bnlab.batchnorm import BatchNormXd, RankBatchNorm, restore_modes, save_modes
from bnlab.errors import BnlabError
from bnlab.simulate import SimulatedRanks
from bnlab.syncbn import in_stats_dtype

ESTIMATORS = ("train", "eval")
POOLINGS = ("pooled", "averaged")


class _Stop(Exception):
    """Raised by a hook to end a forward pass once the layer of interest has been seen."""


def bn_layers(model: nn.Module, image_shape=(3, 32, 32),
              sample: torch.Tensor | None = None) -> list[tuple[str, _BatchNorm]]:
    """BN layers that keep running statistics, in the order one forward pass (in eval mode,
    of `sample`, or of a zero image of `image_shape`) calls them. A layer called more than
    once per pass is refused: its statistics would mix different inputs."""
    names = {m: n for n, m in model.named_modules()}
    order: list[_BatchNorm] = []
    hooks = [m.register_forward_pre_hook(lambda mod, inp: order.append(mod))
             for m in names if isinstance(m, _BatchNorm) and m.running_mean is not None]
    modes = save_modes(model)
    if sample is None:
        p = next(model.parameters())
        sample = torch.zeros(1, *image_shape, device=p.device, dtype=p.dtype)
    try:
        model.eval()
        with torch.no_grad():
            model(sample)
    finally:
        for h in hooks:
            h.remove()
        restore_modes(modes)
    calls = {m: order.count(m) for m in dict.fromkeys(order)}
    for m, n in calls.items():
        if n > 1:
            raise BnlabError(
                f"BN layer '{names[m]}' is called {n} times in one forward pass, so its running "
                f"statistics serve different inputs; PreciseBN cannot measure it: give each "
                f"call its own BN layer."
            )
    return [(names[m], m) for m in calls]


class _Moments:
    """Per-channel sums over every sample seen (and per-batch sums for `averaged`)."""

    def __init__(self, c: int, device):
        self.t = torch.zeros(4 * c + 2, dtype=torch.float64, device=device)
        self.c = c

    def add(self, x: torch.Tensor) -> None:
        c = self.c
        n = x.numel() // c
        if n == 0:
            return
        # Two passes per batch in the input's precision (its mean, then the squared deviations
        # from it: accurate, and fast on channel-strided data), then float64 sums across
        # batches and ranks: sum x = n * mean, sum x^2 = M2 + n * mean^2.
        dims = (0, *range(2, x.dim()))
        x = in_stats_dtype(x.detach())  # half types: sums of squares in fp32 (fp16 would overflow)
        m = x.mean(dims, keepdim=True)
        r = x - m
        m2 = (r * r).sum(dims).double()
        mean = m.reshape(c).double()
        self.t[:c] += n * mean
        self.t[c:2 * c] += m2 + n * mean.pow(2)
        self.t[2 * c:3 * c] += mean
        self.t[3 * c:4 * c] += m2 / (n - 1) if n > 1 else m2
        self.t[4 * c] += n
        self.t[4 * c + 1] += 1

    def result(self, pooling: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, unbiased variance) per channel."""
        c, t = self.c, self.t
        n, batches = t[4 * c], t[4 * c + 1]
        if pooling == "averaged":
            return t[2 * c:3 * c] / batches, t[3 * c:4 * c] / batches
        mean = t[:c] / n
        var = (t[c:2 * c] / n - mean.pow(2)).clamp_min(0)
        return mean, var * n / (n - 1)


def _collect(model, layers, batches: Iterable[torch.Tensor], train_mode: bool,
             stop_at: nn.Module | None, bar: tqdm | None) -> dict[nn.Module, _Moments]:
    moments = {m: _Moments(m.num_features, m.running_mean.device) for _, m in layers}

    def hook(mod, inp):
        moments[mod].add(inp[0])
        if mod is stop_at:
            raise _Stop

    hooks = [m.register_forward_pre_hook(hook) for m in moments]
    model.train(train_mode)
    try:
        for x in batches:
            with contextlib.suppress(_Stop):
                model(x)
            if bar is not None:
                bar.update(1)
    finally:
        for h in hooks:
            h.remove()
    for m in moments.values():  # every rank measured its share: add the shares up
        dist.all_reduce_sum(m.t)
    return moments


def set_running_stats(bn: _BatchNorm, mean: torch.Tensor, var: torch.Tensor) -> None:
    """Overwrite a BN layer's running statistics (every simulated rank's too)."""
    bn.running_mean.copy_(mean.to(bn.running_mean.dtype))
    bn.running_var.copy_(var.to(bn.running_var.dtype))
    if isinstance(bn, SimulatedRanks):  # simulated ranks all hold the reduced statistics
        bn.take_running()


@torch.no_grad()
def recalibrate(model: nn.Module, batches: Callable[[], Iterable[torch.Tensor]],
                estimator: str = "train", pooling: str = "pooled",
                progress: bool = False, sample: torch.Tensor | None = None
                ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Replace every BN layer's running statistics by PreciseBN's; returns them by layer name.

    `batches()` yields this rank's input batches (called once per pass); `sample` is one
    input the model takes (default: a 32x32 image). Parameters and anything outside the BN
    running statistics are left untouched (random draws, as dropout's, come from a forked
    generator); the train/eval mode of every module is restored.
    """
    assert estimator in ESTIMATORS and pooling in POOLINGS, (estimator, pooling)
    with _forked_rng(model):
        return _recalibrate(model, batches, estimator, pooling, progress, sample)


def _forked_rng(model: nn.Module):
    """Random draws inside (dropout in a train-mode pass, a DataLoader's seed) leave the
    caller's generators as they were: CPU and every CUDA device the model is on."""
    cuda = sorted({t.device.index or 0 for t in itertools.chain(model.parameters(),
                                                                 model.buffers()) if t.is_cuda})
    return torch.random.fork_rng(devices=cuda)


def _recalibrate(model, batches, estimator, pooling, progress, sample):
    modes = save_modes(model)
    layers = bn_layers(model, sample=sample)
    saved = {m: (m.running_mean.clone(), m.running_var.clone(), m.num_batches_tracked.clone())
             for _, m in layers}
    out = {}
    try:
        passes = [layers] if estimator == "train" else [[layer] for layer in layers]
        with tqdm(desc=f"PreciseBN ({estimator})", leave=False,
                  disable=not progress) as bar:
            for group in passes:
                stop = group[-1][1] if estimator == "eval" else None
                moments = _collect(model, group, batches(), estimator == "train", stop, bar)
                for name, m in group:
                    mean, var = moments[m].result(pooling)
                    out[name] = (mean, var)
                    if estimator == "eval":
                        set_running_stats(m, mean, var)  # later layers see it recalibrated
        for name, m in layers:
            m.num_batches_tracked.copy_(saved[m][2])  # a train-mode pass must not count
            set_running_stats(m, *out[name])
    except BaseException:
        for m, (rm, rv, nbt) in saved.items():
            m.running_mean.copy_(rm)
            m.running_var.copy_(rv)
            m.num_batches_tracked.copy_(nbt)
        raise
    finally:
        restore_modes(modes)
    return out


# ----------------------------------------------------------------------------------------
# The public entry point: any model, any iterable of batches


def _model_input(batch):
    """The model's input in a batch: a tensor, or the first item of a tuple or list."""
    if torch.is_tensor(batch):
        return batch
    if isinstance(batch, (tuple, list)) and batch and torch.is_tensor(batch[0]):
        return batch[0]
    raise BnlabError(
        f"a batch is a {type(batch).__name__}, which holds no tensor where PreciseBN looks "
        f"(the batch itself, or its first item); pass input_fn, e.g. "
        f"input_fn=lambda b: b['image'], to pick the model's input."
    )


def precise_bn(model: nn.Module, batches: Iterable, num_samples: int | None = 4096,
               estimator: str = "train", pooling: str = "pooled",
               input_fn: Callable | None = None, progress: bool = False
               ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Recompute every BN layer's running statistics as population statistics of `model`.

    `batches`: this rank's batches (tensors, tuples or lists whose first item is the input,
    or anything with `input_fn` picking the input, e.g. dicts). Each rank reads at most
    `num_samples` samples of its own batches (None: all of them); the per-channel sums are
    reduced across ranks, so every rank ends with the statistics of the union. `estimator`:
    "train" (one pass in train mode, as fvcore and pycls) or "eval" (layer by layer, reads the
    batches once per layer: give a list or a DataLoader). `pooling`: "pooled" (E[x^2] - E[x]^2
    over every sample) or "averaged" (the mean of per-batch variances, as
    torch.optim.swa_utils.update_bn). Returns (mean, unbiased variance) per layer name.
    Only BN running statistics change; every module's train/eval mode is restored.
    """
    if estimator not in ESTIMATORS:
        raise BnlabError(f"estimator='{estimator}' is unknown; choose one of {ESTIMATORS}.")
    if pooling not in POOLINGS:
        raise BnlabError(f"pooling='{pooling}' is unknown; choose one of {POOLINGS}.")
    if num_samples is not None and num_samples < 1:
        raise BnlabError(f"num_samples={num_samples} reads nothing; give a positive count "
                         f"or None for every batch.")
    if estimator == "eval" and iter(batches) is batches:
        raise BnlabError("the eval estimator reads the batches once per BN layer, and a "
                         "generator or iterator can be read only once; pass a list or a "
                         "DataLoader, or use estimator='train'.")
    with _forked_rng(model), _local_statistics(model):
        return _precise_bn(model, batches, num_samples, estimator, pooling,
                           input_fn or _model_input, progress)


def _precise_bn(model, batches, num_samples, estimator, pooling, pick, progress):
    device = next(itertools.chain(model.parameters(), model.buffers())).device
    if iter(batches) is batches:  # read once: keep the batch looked at first
        head = next(batches, None)
        rest = batches

        def source():
            return itertools.chain([head], rest) if head is not None else iter(())
    else:
        head = next(iter(batches), None)

        def source():
            return iter(batches)
    # Every rank learns whether any rank has nothing, so all refuse together (none waits).
    empty = torch.tensor([float(head is None)], device=device)
    dist.all_reduce_max(empty)
    if empty.item():
        raise BnlabError("a rank's batches gave no batch; PreciseBN needs at least one on "
                         "every rank.")

    def inputs() -> Iterable[torch.Tensor]:
        left = num_samples
        for batch in source():
            x = pick(batch).to(device, non_blocking=True)
            if left is not None:
                x, left = x[:left], left - min(left, len(x))
            if len(x):
                yield x
            if left == 0:
                return

    sample = pick(head)[:1].to(device)
    return recalibrate(model, inputs, estimator, pooling, progress, sample=sample)


@contextlib.contextmanager
def _local_statistics(model: nn.Module):
    """SyncBN layers normalize with this rank's batch during PreciseBN's passes, so ranks with
    different numbers of batches never wait on each other's collectives (the statistics
    PreciseBN measures are reduced once, at the end)."""
    synced = [m for m in model.modules() if isinstance(m, RankBatchNorm) and m.sync != "none"]
    torch_sync = [m for m in model.modules() if type(m) is nn.SyncBatchNorm]
    old = [m.sync for m in synced]
    for m in synced:
        m.sync = "none"
    for m in torch_sync:
        m.__class__ = BatchNormXd  # the same layer and state, without the collective
    try:
        yield
    finally:
        for m, sync in zip(synced, old, strict=True):
            m.sync = sync
        for m in torch_sync:
            m.__class__ = nn.SyncBatchNorm
