"""Is BN the problem in my run? How much a model's BN statistics cost on its own data, and
which layers.

    report = bnlab.diagnose(model, batches, batch_per_rank=2)   # any model with BN layers
    print(report.table())

    python -m bnlab diagnose --model mypkg.models:make_net --checkpoint ckpt.pt \\
        --loader mypkg.data:train_loader [--val-loader mypkg.data:val_loader] \\
        [--batch-per-rank 2] [--json [PATH]]      # the command: bnlab/evaluation.py
    python -m bnlab diagnose --model outputs/train/<run>   # a bnlab run, on its own data

On copies of the model (the caller's parameters, buffers, train/eval flags and RNG state stay
as they were), it measures the metric (`evaluate(model) -> float`; default top-1 accuracy in %
over `batches`) three ways: with the model's running statistics; after PreciseBN over
`num_samples` samples of `batches` (both estimators, bnlab.precise_bn); and with each BN layer
normalizing by the statistics of `batch_per_rank` consecutive samples, the per-rank batch the
run trained with. The statistics' cost is one number: PreciseBN's metric (train estimator)
minus the running statistics'. Per BN layer: how far the running mean and variance sit from
the population statistics PreciseBN measured (scale-free, worst first), and, with
`batch_per_rank`, whether the doctor's rule puts it at risk. Under torchrun (an initialized
process group) PreciseBN's sums are reduced across ranks, the default metric counts every
rank's batches, and the ranks' running statistics are compared with rank 0's (what a DDP
checkpoint holds). One verdict line names the fix.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as tdist
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.parallel import DistributedDataParallel

from bnlab import doctor
from bnlab.advice import without_communication
from bnlab.defaults import THRESHOLD
from bnlab.diagnostics import divergence, gather_running_stats, on_batch_statistics
from bnlab.errors import BnlabError
from bnlab.precise_bn import ESTIMATORS, precise_bn, set_running_stats

EPS = 1e-5
# THRESHOLD (bnlab/defaults.py): points of the metric above which the statistics are a problem
DOCTOR = "bnlab doctor"  # the command the advice names, as a shell runs it


@dataclass
class LayerGap:
    """One BN layer's running statistics against the population's (PreciseBN, train)."""

    name: str
    mean_shift: float   # max over channels of |running mean - population mean| / population sd
    log_var: float      # max over channels of |log(running var / population var)|
    at_risk: bool | None = None  # the doctor's rule at batch_per_rank (None: not asked)

    @property
    def worst(self) -> float:
        return max(self.mean_shift, self.log_var)


@dataclass
class Diagnosis:
    running: float                     # the metric with the model's running statistics
    precise: dict[str, float]          # after PreciseBN, by estimator
    train_mode: float | None           # with each layer on batch_per_rank samples' statistics
    batch_per_rank: int | None
    samples: int                       # what PreciseBN read (this rank)
    layers: list[LayerGap]             # worst first
    ranks: dict[str, float] = field(default_factory=dict)  # layer -> max divergence from rank 0
    world: int = 1
    threshold: float = THRESHOLD
    metric: str = "top-1 accuracy (%)"
    by_rank: list[float] = field(default_factory=list)  # per_rank: with each rank's statistics
    rank_average: float | None = None  # per_rank: with the ranks' statistics averaged
    values: int | None = None  # fewest values per channel per rank at batch_per_rank (the advice's)
    doctor: str = DOCTOR  # the doctor's command as the user calls bnlab ('python -m bnlab doctor')

    @property
    def cost(self) -> float:
        """What the running statistics cost: PreciseBN's metric (train estimator) minus theirs."""
        return self.precise["train"] - self.running

    @property
    def at_risk(self) -> list[LayerGap]:
        return [g for g in self.layers if g.at_risk]

    def verdict(self) -> str:
        """The measured cost's verdict on the first line, as the exit status gives it (a
        problem above the threshold); the structural risk (the doctor's rule) and the ranks'
        agreement each on a line of its own."""
        if self.cost > self.threshold:
            lines = [f"BN's statistics are a problem here: the running statistics cost "
                     f"{self.cost:.2f} points of {self.metric} (threshold {self.threshold:g}; "
                     "PreciseBN recovers them): recalibrate before evaluating, "
                     "bnlab.precise_bn(model, train_batches)."]
        else:
            lines = [f"BN's statistics are not the problem here: PreciseBN changes "
                     f"{self.metric} by {self.cost:+.2f} points (threshold "
                     f"{self.threshold:g})."]
        if self.at_risk:
            lines.append(f"Structural risk: {len(self.at_risk)} of {len(self.layers)} BN layers "
                         f"are at risk at {self.batch_per_rank} samples per rank (the doctor's "
                         "rule): share statistics across ranks, bnlab.convert(model, 'syncbn', "
                         f"sync_group=k), k ranks reaching {doctor.MIN_IMAGES} samples "
                         f"({self.doctor} names k).")
            free = without_communication(f"{self.doctor} lists them", self.values)
            lines.append(f"Or, {free}")
        elif self.batch_per_rank is not None:
            lines.append(f"No layer is at risk at {self.batch_per_rank} samples per rank.")
        spread = max(self.ranks.values(), default=0.0)
        if spread > 1.0:
            lines.append(f"The ranks' running statistics disagree by up to {spread:.2f} "
                         "(rank 0's sd or log variance): sync them at epoch ends, "
                         "bnlab.sync_bn_stats(model).")
        elif self.world > 1:
            lines.append(f"The ranks' running statistics agree within {spread:.2f}.")
        return "\n".join(lines)

    def table(self, top: int = 10) -> str:
        rows = [f"| with the running statistics | {self.running:.2f} |"]
        rows += [f"| after PreciseBN ({est} estimator, {self.samples} samples) | {v:.2f} |"
                 for est, v in self.precise.items()]
        if self.train_mode is not None:
            rows.append(f"| with each layer on {self.batch_per_rank} samples' statistics (train "
                        f"mode) | {self.train_mode:.2f} |")
        rows += [f"| with rank {r}'s running statistics | {v:.2f} |"
                 for r, v in enumerate(self.by_rank)]
        if self.rank_average is not None:
            rows.append(f"| with the ranks' statistics averaged | {self.rank_average:.2f} |")
        lines = [f"| evaluation | {self.metric} |", "|---|---|", *rows, "",
                 f"Statistics' cost (PreciseBN minus running): **{self.cost:+.2f}** points.", "",
                 "| layer | running mean off by (pop. sd) | running var off by (log) | at risk |",
                 "|---|---|---|---|"]
        lines += [f"| {g.name} | {g.mean_shift:.3f} | {g.log_var:.3f} | "
                  f"{'-' if g.at_risk is None else 'yes' if g.at_risk else 'no'} |"
                  for g in self.layers[:top]]
        if len(self.layers) > top:
            lines.append(f"| ({len(self.layers) - top} more, all closer) | | | |")
        if self.world > 1:
            worst = sorted(self.ranks.items(), key=lambda kv: -kv[1])[:3]
            lines += ["", f"Across {self.world} ranks (rank 0's statistics are what a DDP "
                      f"checkpoint holds), the largest divergence from rank 0: " + ", ".join(
                          f"{n} {v:.3f}" for n, v in worst) + "."]
        return "\n".join([*lines, "", self.verdict()])

    def to_json(self) -> dict:
        out = asdict(self)
        del out["doctor"]  # how the text names a command, not a measurement
        out.update(cost=self.cost, verdict=self.verdict())
        return out


# ----------------------------------------------------------------------------------------
# The pieces


def bn_of(model: nn.Module) -> dict[str, _BatchNorm]:
    """The BN layers that keep running statistics, by name."""
    out = {n: m for n, m in model.named_modules()
           if isinstance(m, _BatchNorm) and m.running_mean is not None}
    if not out:
        raise BnlabError("the model has no BatchNorm layer with running statistics: there is "
                         "nothing for bnlab.diagnose to measure.")
    return out


def accuracy(batches: Iterable, input_fn: Callable, target_fn: Callable) -> Callable:
    """The default metric: top-1 accuracy (%) over `batches`, every rank's counted."""

    @torch.no_grad()
    def evaluate(model: nn.Module) -> float:
        p = next(model.parameters())
        right = torch.zeros(2, dtype=torch.float64, device=p.device)
        for b in batches:
            x, y = input_fn(b).to(p.device), target_fn(b).to(p.device)
            right[0] += (model(x).argmax(1) == y).sum()
            right[1] += len(y)
        if tdist.is_initialized():
            tdist.all_reduce(right)
        if right[1] == 0:
            raise BnlabError("the batches held no sample to evaluate.")
        return float(100 * right[0] / right[1])

    return evaluate


def gaps(model: nn.Module, population: dict[str, tuple]) -> list[LayerGap]:
    """Each layer's running statistics against the population's, worst first."""
    out = []
    for name, bn in bn_of(model).items():
        mean, var = (t.to(bn.running_mean.device, torch.float64) for t in population[name])
        rm, rv = bn.running_mean.double(), bn.running_var.double()
        shift = ((rm - mean).abs() / (var + EPS).sqrt()).max().item()
        log_var = ((rv + EPS).log() - (var + EPS).log()).abs().max().item()
        out.append(LayerGap(name, shift, log_var))
    return sorted(out, key=lambda g: -g.worst)


def ranks_of(model: nn.Module, ranks: list[dict] | None = None) -> list[dict]:
    """Every rank's running statistics (per rank, layer -> (mean, var)): `ranks` where a
    checkpoint kept them, else, under torchrun, gathered from every rank's model; else []."""
    if ranks is not None:
        return ranks
    if not (tdist.is_initialized() and tdist.get_world_size() > 1):
        return []
    return gather_running_stats(list(bn_of(model).items()), tdist.get_world_size())


def rank_spread(ranks: list[dict]) -> dict[str, float]:
    """Per layer, the largest divergence of any rank's running statistics from rank 0's: max
    over channels of |mean_r - mean_0| / sd_0 and |log var_r / var_0| (the trainer's own
    measures, bn/div_mean and bn/div_logvar); {} for fewer than 2 ranks."""
    if len(ranks) < 2:
        return {}
    div = divergence(ranks)
    return {name: max(div[f"bn/div_mean/{name}"], div[f"bn/div_logvar/{name}"])
            for name in ranks[0]}


def with_statistics(model: nn.Module, stats: dict) -> nn.Module:
    """A copy of `model` holding these running statistics (layer -> (mean, var): one rank's,
    or their average) in the layers they name."""
    m = copy.deepcopy(model)
    for name, bn in bn_of(m).items():
        if name in stats:
            set_running_stats(bn, *stats[name])
    return m


def rank_average(ranks: list[dict]) -> dict:
    """The ranks' running statistics averaged, layer by layer (mean and variance each)."""
    return {n: tuple(torch.stack([r[n][i] for r in ranks]).mean(0) for i in (0, 1))
            for n in ranks[0]}


def risk(model: nn.Module, batch, input_fn: Callable, batch_per_rank: int
         ) -> tuple[dict, int | None]:
    """The doctor's rule per layer at `batch_per_rank` samples per rank (bnlab.doctor), for
    samples shaped as `batch`'s, and the fewest values per channel per rank it finds."""
    shape = tuple(input_fn(batch).shape[1:])
    layers = doctor.measure(copy.deepcopy(model), shape, 1, batch_per_rank, None, 0,
                            doctor.MIN_VALUES, doctor.MIN_IMAGES)
    fewest = min((layer.per_rank for layer in layers if layer.batch_dependent), default=None)
    return {layer.name: layer.at_risk for layer in layers}, fewest


# ----------------------------------------------------------------------------------------
# The entry point


def _first(batch):
    return batch if torch.is_tensor(batch) else batch[0]


def _second(batch):
    if torch.is_tensor(batch) or len(batch) < 2:
        raise BnlabError("a batch holds no target for the default metric (its second item); "
                         "pass target_fn, or evaluate=your_metric.")
    return batch[1]


def diagnose(model: nn.Module, batches: Iterable, *, evaluate: Callable | None = None,
             num_samples: int = 4096, batch_per_rank: int | None = None,
             input_fn: Callable = _first, target_fn: Callable = _second,
             threshold: float = THRESHOLD, rank_stats: list[dict] | None = None,
             per_rank: bool = False) -> Diagnosis:
    """How much `model`'s BN statistics cost on `batches` (see the module's docstring).

    `batches`: this rank's batches of (input, target) (or anything `input_fn` and `target_fn`
    read); a one-shot iterator is read once into a list. `evaluate(model) -> float`: the
    metric, higher is better (default: top-1 accuracy in % over `batches`); it is called on
    copies in eval mode. `batch_per_rank`: the per-rank batch the run trained with (adds the
    train-mode row and the doctor's rule). `rank_stats`: every rank's running statistics
    (per rank, layer -> (mean, var)) where a checkpoint kept them; under torchrun they are
    gathered. `per_rank`: also the metric with each rank's running statistics and with their
    average (one evaluation per rank). The caller's model is left exactly as it was.
    """
    bare = model.module if isinstance(model, DistributedDataParallel) else model
    bn_of(bare)
    if num_samples < 1:
        raise BnlabError(f"num_samples={num_samples} reads nothing; give a positive count.")
    if batch_per_rank is not None and batch_per_rank < 2:
        raise BnlabError(f"batch_per_rank={batch_per_rank}: BN needs at least 2 samples to "
                         "normalize; give the per-rank batch the run trained with.")
    data = list(batches) if iter(batches) is batches else batches
    if not any(True for _ in data):
        raise BnlabError("the batches are empty; give the loader of the data to diagnose on.")
    evaluate = evaluate or accuracy(data, input_fn, target_fn)
    devices = [next(bare.parameters()).device] if next(bare.parameters()).is_cuda else []
    with torch.random.fork_rng(devices=devices):
        running = _measure(copy.deepcopy(bare), evaluate)
        precise, population, samples = {}, None, 0
        for est in ESTIMATORS:
            m = copy.deepcopy(bare)
            stats = precise_bn(m, data, num_samples, est, input_fn=input_fn)
            precise[est] = _measure(m, evaluate)
            if est == "train":
                population = stats
                samples = _count(data, num_samples, input_fn)
        train_mode = None if batch_per_rank is None else \
            _measure(on_batch_statistics(bare, batch_per_rank), evaluate)
        layers, values = gaps(bare, population), None
        if batch_per_rank is not None:
            flagged, values = risk(bare, next(iter(data)), input_fn, batch_per_rank)
            for g in layers:
                g.at_risk = flagged.get(g.name)
        ranks = ranks_of(bare, rank_stats)
        if per_rank and len(ranks) < 2:
            raise BnlabError(f"per_rank: {len(ranks)} rank's running statistics to compare; "
                             "give rank_stats (a bnlab checkpoint keeps them) or run under "
                             "torchrun with 2 or more ranks.")
        by_rank = [_measure(with_statistics(bare, r), evaluate) for r in ranks] \
            if per_rank else []
        average = _measure(with_statistics(bare, rank_average(ranks)), evaluate) \
            if per_rank else None
    return Diagnosis(running, precise, train_mode, batch_per_rank, samples, layers,
                     rank_spread(ranks), max(1, len(ranks)), threshold, by_rank=by_rank,
                     rank_average=average, values=values)


def _measure(model: nn.Module, evaluate: Callable) -> float:
    """The metric of `model`, a copy of the caller's, in eval mode."""
    value = float(evaluate(model.eval()))
    if not math.isfinite(value):
        raise BnlabError(f"the metric gave {value}; evaluate(model) must return a number.")
    return value


def _count(data, num_samples: int, input_fn: Callable) -> int:
    n = 0
    for b in data:
        n += len(input_fn(b))
        if n >= num_samples:
            return num_samples
    return n
