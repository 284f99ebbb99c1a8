"""The BN doctor: which normalization layers of a model are at risk at a given world size and
per-rank batch, and what fixes them, with numbers. No training, no data, no GPU.

    python -m bnlab doctor --model torchvision:resnet50 --input 3x224x224 --world 8 \\
        --batch-per-rank 2 [--norm syncbn --sync-group 4] [--min-values 16] [--json [PATH]]

`--model` is `torchvision:<name>`, `bnlab:<name>` (bnlab's models), `<module>:<factory>` (a
function that returns the model, imported from the current directory or the installed
packages), or a bnlab checkpoint / run directory. One forward pass of one zero input of
`--input` (per sample, no batch dimension) in eval mode records what each layer sees.

A batch-statistics layer normalizes each channel over N samples, N x (spatial size) values:
N is the per-rank batch for bn and the sync group's batch for syncbn. It is at risk under
`--min-images` samples (default 4: table-practice, over 8 ranks on CIFAR-10, found BN holding
at 8 and 4 images per rank and breaking at 2, and moved it from Wu & He's 8 per GPU by its
rule doctor_change; the pixels of one image are far from independent) or under
`--min-values` values (default 16; at 1 value BN cannot train at all).
GroupNorm, LayerNorm, InstanceNorm, EvoNorm-S0 and frozen BN do not depend on the batch and are
listed for completeness. Exit status: 0 when no layer is at risk, 1 when some are (for CI), 2 for
bad input.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm

from bnlab.advice import WORDS, groups, measured, synced, without_communication
from bnlab.batchnorm import restore_modes, save_modes
from bnlab.caveats import extrapolated, published, thresholds_judged
from bnlab.cli import emit
from bnlab.defaults import MIN_IMAGES, MIN_VALUES
from bnlab.errors import BnlabError
from bnlab.modelref import load_model, parse_input
from bnlab.norms import EvoNormS0
from bnlab.syncbn import group_ranks

# A layer is at risk below MIN_IMAGES or MIN_VALUES per rank (bnlab/defaults.py, torch-free for
# bnlab --help; experiments/values tests them against the data); DOCTOR_KINDS there: what
# --norm converts to.
EVIDENCE = "experiments/values/table.md"  # where bnlab measures BN against these (table-values)


@dataclass
class Layer:
    name: str
    kind: str                 # bnlab's kind (syncbn, evonorm, ...) or torch's class name
    channels: int
    per_rank: int             # values per channel (per group for GN/LN) that one rank sees
    normalized_over: int      # values the layer normalizes over at this setting
    images: int               # samples whose statistics it uses (1 for per-sample norms)
    batch_dependent: bool
    at_risk: bool


# ----------------------------------------------------------------------------------------
# What each layer sees


def _norm_layers(model: nn.Module) -> dict[nn.Module, str]:
    # torchvision's FrozenBatchNorm2d too, where it is imported: a model that holds one has
    # imported it, and importing torchvision costs seconds (its ops import torch._dynamo)
    misc = sys.modules.get("torchvision.ops.misc")
    frozen = (misc.FrozenBatchNorm2d,) if misc is not None else ()
    kinds = (_BatchNorm, nn.GroupNorm, nn.LayerNorm, _InstanceNorm, EvoNormS0, *frozen)
    return {m: n for n, m in model.named_modules() if isinstance(m, kinds)}


def _kind(m: nn.Module) -> str:
    """A layer's kind as bnlab names it (syncbn, brn, evonorm: what convert takes), else its
    class (BatchNorm2d, GroupNorm, BatchNormAct2d)."""
    return "evonorm" if isinstance(m, EvoNormS0) else getattr(m, "kind", type(m).__name__)


def at_risk(images: int, values: int, min_values: int = MIN_VALUES,
            min_images: int = MIN_IMAGES) -> bool:
    """The rule: a batch-statistics layer is at risk below `min_images` images or `min_values`
    values per channel in its group (the doctor, the trainer's warning and make table-values,
    which checks the defaults against its runs)."""
    return values < min_values or images < min_images


def measure(model: nn.Module, shape: tuple[int, ...], world: int, batch: int, norm: str | None,
            sync_group: int, min_values: int, min_images: int) -> list[Layer]:
    """Every normalization layer with the values it normalizes over at this setting."""
    names = _norm_layers(model)
    seen: dict[nn.Module, tuple[int, ...]] = {}

    def hook(mod, inp) -> None:  # a pre-hook that returned a value would replace the input
        seen.setdefault(mod, tuple(inp[0].shape))

    hooks = [m.register_forward_pre_hook(hook) for m in names]
    modes = save_modes(model)
    p = next(model.parameters(), None)
    x = torch.zeros(1, *shape, dtype=p.dtype if p is not None else None,
                    device=p.device if p is not None else None)
    model.eval()
    try:
        with torch.no_grad():
            model(x)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BnlabError(f"the model does not take an input of shape {tuple(x.shape)} "
                         f"({first}); pass --input with the shape of one sample.") from None
    finally:
        for h in hooks:
            h.remove()
        restore_modes(modes)
    out = []
    for m, name in names.items():
        if m not in seen:  # not called for this input
            continue
        s = seen[m]
        spatial = math.prod(s[2:]) if len(s) > 2 else 1
        group = _layer_group(m, world, sync_group, norm)
        if group:
            per_rank = batch * spatial
            over, images = per_rank * group, batch * group
            out.append(Layer(name, _kind(m), m.num_features, per_rank, over, images,
                             True, at_risk(images, over, min_values, min_images)))
        else:
            c = s[1] if len(s) > 1 else 1
            groups = m.num_groups if isinstance(m, nn.GroupNorm) else \
                m.groups if isinstance(m, EvoNormS0) else 1
            per = (c // groups) * spatial if not isinstance(m, nn.LayerNorm) else \
                math.prod(m.normalized_shape)
            if not isinstance(m, (nn.GroupNorm, nn.LayerNorm, EvoNormS0)):  # IN, frozen BN
                per = spatial
            out.append(Layer(name, _kind(m), c, per, per, 1, False, False))
    return out


def bn_value_counts(model: nn.Module, batch_per_gpu: int, image_shape=(3, 32, 32)) -> dict:
    """Values per channel that each batch-statistics layer normalizes over on one rank
    (N x H x W): `measure` at one rank, by layer name."""
    layers = measure(model, tuple(image_shape), 1, batch_per_gpu, None, 0, MIN_VALUES,
                     MIN_IMAGES)
    return {layer.name: layer.per_rank for layer in layers if layer.batch_dependent}


def _group(world: int, sync_group: int, norm: str | None) -> int:
    """How many ranks share statistics: 1 for bn (and a model left as it is), k for syncbn."""
    if norm != "syncbn":
        return 1
    return group_ranks(world, sync_group)


def _layer_group(m: nn.Module, world: int, sync_group: int, norm: str | None) -> int:
    """Ranks whose samples a layer's training statistics come from; 0 for a layer whose
    statistics do not depend on the batch (GN, LN, InstanceNorm, frozen BN)."""
    from bnlab.batchnorm import FrozenBatchNorm, RankBatchNorm
    if not isinstance(m, _BatchNorm) or isinstance(m, FrozenBatchNorm):
        return 0
    if norm:
        return _group(world, sync_group, norm)
    if isinstance(m, nn.SyncBatchNorm):
        return world
    if isinstance(m, RankBatchNorm):
        try:
            return m.group_size(world)
        except BnlabError:
            raise BnlabError(f"the model's BN layers share statistics in groups of "
                             f"{m.sync_group} ranks, which does not divide --world {world}; "
                             f"pass a --world that it divides.") from None
    return 1


# ----------------------------------------------------------------------------------------
# Advice


def recommend(layers: list[Layer], world: int, batch: int, min_values: int,
              min_images: int, grad_accum: int = 1) -> list[str]:
    """The fixes, with numbers: the smallest sync group reaching both thresholds (or `min_images`),
    table-recover's best fix without communication, GN groups, the per-rank batch alone; with
    `grad_accum` micro-batches a step, first that accumulating does not enlarge BN's batch."""
    bns = [layer for layer in layers if layer.batch_dependent]
    if not bns:
        return []
    if grad_accum > 1:
        return [accumulation(batch, grad_accum)] + recommend(layers, world, batch, min_values,
                                                             min_images)
    low = min(bns, key=lambda layer: layer.per_rank)
    spatial = low.per_rank // batch
    # groups of 2 or more ranks, smallest first (a group of 1 is BN)
    samples = [k for k in _divisors(world) if k > 1 and batch * k >= min_images]
    both = [k for k in samples if low.per_rank * k >= min_values]
    tips = []
    if both:
        k = both[0]
        tips.append(said(f"syncbn with --sync-group {k} ({batch * k} samples, at least "
                         f"{low.per_rank * k} values per channel a group)", batch * k,
                         low.per_rank))
    elif samples:
        k = samples[0]
        tips.append(said(f"syncbn with --sync-group {k} gives {batch * k} samples a group; no "
                         f"group gives {low.name} {min_values} values per channel (it gets "
                         f"{low.per_rank * k})", batch * k, low.per_rank))
    elif world > 1:
        tips.append(said(f"syncbn over all {world} ranks gives {batch * world} samples (threshold "
                         f"{min_images}): no sync group reaches it", batch * world,
                         low.per_rank))
    tips.append(without_communication(values=low.per_rank))  # cites the nearest input
    channels = [layer.channels for layer in bns]
    g = max((g for g in range(1, 33) if all(c % g == 0 for c in channels)), default=1)
    chosen, by = groups("gn", low.per_rank)  # what the nearest table ran, its pilot's choice
    if chosen and all(c % chosen == 0 for c in channels):
        head = (f"gn with groups={chosen} ({by}'s count; it "
                "divides every BN layer's channels)")
    elif g > 1:
        head = f"gn with groups={g} (the most, up to 32, dividing all BN layers' channels)"
    else:
        head = "gn: no group count above 1 divides every layer's channels; use ln or " \
            "per-layer groups"
    tips.append(head + measured("gn", low.per_rank, room=WORDS - len(head.split())))
    need = max(min_images, math.ceil(min_values / max(spatial, 1)))
    tips.append(f"or a per-rank batch of {need} or more (each sample gives {low.name} "
                f"{spatial} value{'s' if spatial != 1 else ''} per channel)")
    return tips


def check(model: nn.Module, input_shape: tuple[int, ...], world: int, batch_per_rank: int, *,
          min_values: int = MIN_VALUES, min_images: int = MIN_IMAGES,
          grad_accum: int = 1) -> tuple[list[Layer], list[str]]:
    """The doctor from Python, on the model as it is (its own BN kinds and sync groups):
    the layers at risk and the fixes (both empty when none is at risk). `batch_per_rank` is
    what one forward pass sees; with `grad_accum` micro-batches a step, the first fix line
    says that accumulating does not enlarge BN's batch."""
    layers = measure(model, tuple(input_shape), world, batch_per_rank, None, 0, min_values,
                     min_images)
    risky = [layer for layer in layers if layer.at_risk]
    return risky, recommend(layers, world, batch_per_rank, min_values, min_images,
                            grad_accum) if risky else []


def said(head: str, samples: int, values: int) -> str:
    """A sync-group line: `head`, then what the tables measured for SyncBN at `samples` per
    group (bnlab.advice.synced), its sentence within WORDS words (the inputs cited beside the
    first stay on the evidence lines where it would run longer)."""
    return head + synced(samples, values, room=WORDS - len(head.split()))


def accumulation(batch: int, k: int) -> str:
    """The line on gradient accumulation: BN normalizes each micro-batch, not the step's."""
    return (f"gradient accumulation ({k} micro-batches a step) does not enlarge BN's batch: "
            f"each forward normalizes its own micro-batch of {batch}, not the {batch * k} "
            "images per rank the optimizer steps on; the doctor's fixes count the micro-batch")


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


# ----------------------------------------------------------------------------------------
# The command


def report(args: argparse.Namespace) -> int:
    model, known_shape = load_model(args.model)
    shape = parse_input(args.input or known_shape or "3x224x224")
    for key in ("world", "batch_per_rank", "min_values", "min_images", "grad_accum"):
        if getattr(args, key) < 1:
            raise BnlabError(f"--{key.replace('_', '-')} must be a positive integer, got "
                             f"{getattr(args, key)}.")
    if args.sync_group < 0:
        raise BnlabError(f"--sync-group must be a positive integer, got {args.sync_group}.")
    if args.sync_group and args.norm != "syncbn":
        raise BnlabError(f"--sync-group {args.sync_group} applies to --norm syncbn only; add "
                         "--norm syncbn, or leave --sync-group out.")
    if args.sync_group and args.world % args.sync_group:
        raise BnlabError(f"--sync-group {args.sync_group} does not divide --world {args.world}; "
                         f"give a divisor of {args.world} "
                         f"({', '.join(map(str, _divisors(args.world)))}).")
    if args.norm:
        from bnlab.norms import convert
        convert(model, args.norm, skip=args.skip,
                **({"sync_group": args.sync_group} if args.sync_group else {}))
    layers = measure(model, shape, args.world, args.batch_per_rank, args.norm,
                     args.sync_group, args.min_values, args.min_images)
    risky = [layer for layer in layers if layer.at_risk]
    tips = recommend(layers, args.world, args.batch_per_rank, args.min_values,
                     args.min_images, args.grad_accum) if risky else []
    setting = {"model": args.model, "input": "x".join(map(str, shape)), "world": args.world,
               "batch_per_rank": args.batch_per_rank, "norm": args.norm or "as built",
               "sync_group": _group(args.world, args.sync_group, args.norm),
               "min_values": args.min_values, "min_images": args.min_images}
    emit(args.json, render(setting, layers, risky, tips),
         {**setting, "layers": [asdict(layer) for layer in layers], "at_risk": len(risky),
          "recommendations": tips, "notes": notes(setting) if risky else [],
          "thresholds_evidence": EVIDENCE, "thresholds_judged": thresholds_judged()})
    return 1 if risky else 0


def risk_line(layers: list[Layer], min_values: int, min_images: int) -> str:
    """How many batch-statistics layers are at risk and how far: the doctor's verdict in one
    line, which the trainer's start-of-run warning also prints."""
    bns = [layer for layer in layers if layer.batch_dependent]
    risky = [layer for layer in layers if layer.at_risk]
    worst = min(layer.normalized_over for layer in risky)
    fewest = min(layer.images for layer in risky)
    by_samples = sum(layer.images < min_images for layer in risky)
    by_values = sum(layer.normalized_over < min_values for layer in risky)
    fatal = " At 1 value BN cannot train at all." if worst <= 1 else ""
    return (f"{len(risky)} of {len(bns)} batch-statistics layers are at risk: {by_samples} by "
            f"samples (fewest {fewest}, threshold {min_images}), {by_values} by values per "
            f"channel (fewest {worst}, threshold {min_values}).{fatal}")


def render(setting: dict, layers: list[Layer], risky: list[Layer], tips: list[str]) -> str:
    s = setting
    group = f", statistics shared by {s['sync_group']} ranks" if s["sync_group"] > 1 else ""
    lines = [f"{s['model']}, input {s['input']}, {s['world']} ranks x {s['batch_per_rank']} "
             f"per rank, norm: {s['norm']}{group}",
             "", "| layer | kind | channels | values per channel, one rank | samples | "
             "values normalized over | at risk |", "|---|---|---|---|---|---|---|"]
    for layer in layers:
        per = layer.per_rank if layer.batch_dependent else f"{layer.per_rank} (per sample)"
        images = layer.images if layer.batch_dependent else "1 (each alone)"
        lines.append(f"| {layer.name} | {layer.kind} | {layer.channels} | {per} | {images} | "
                     f"{layer.normalized_over} | {'yes' if layer.at_risk else ''} |")
    bns = [layer for layer in layers if layer.batch_dependent]
    lines.append("")
    if not risky:
        lines.append(f"No layer at risk: every batch-statistics layer sees {s['min_images']} "
                     f"samples or more and {s['min_values']} values per channel or more "
                     f"({len(bns)} batch-statistics layers, {len(layers)} normalization "
                     f"layers).")
    else:
        lines.append(risk_line(layers, s["min_values"], s["min_images"]))
        lines.append("Fixes:")
        lines += [f"- {tip}" for tip in tips]
        # on every fix above, not on the last alone: after a blank line, unindented
        lines += ["", *(n[0].upper() + n[1:] for n in notes(s))] if notes(s) else []
    return "\n".join(lines + ["", evidence(s["min_images"], s["min_values"])])


def notes(setting: dict) -> list[str]:
    """Under the fixes: that they are extrapolated where the input is not what bnlab measured,
    and a published measurement of this layout, labelled as such, where one matches."""
    shape = tuple(int(v) for v in setting["input"].split("x"))
    return [n for n in (extrapolated(shape), published(setting["batch_per_rank"], shape)) if n]


def evidence(min_images: int, min_values: int) -> str:
    """Where the thresholds come from, for the doctor's report."""
    mine = (min_images, min_values) == (MIN_IMAGES, MIN_VALUES)
    which = "bnlab's defaults" if mine else (f"yours; bnlab's defaults are {MIN_IMAGES} and "
                                             f"{MIN_VALUES}")
    return (f"Thresholds: {min_images} samples and {min_values} values per channel ({which}); "
            f"on CIFAR-10, {thresholds_judged()}.")
