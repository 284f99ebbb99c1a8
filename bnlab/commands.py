"""The `bnlab` command's parsers, declared without importing torch or the lab, so that
`bnlab --help` (and a typo's usage line) answers at once; each command's module is imported
only when that command runs (bnlab/__main__.py)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from pathlib import Path

from bnlab.cli import add_json
from bnlab.defaults import DOCTOR_KINDS as KINDS
from bnlab.defaults import MIN_IMAGES, MIN_VALUES, THRESHOLD

DOCTOR = ("The BN doctor: which normalization layers of a model are at risk at a given world "
          "size and per-rank batch, and what fixes them, with numbers. No training, no data, "
          "no GPU.")
LAB = "lab"  # the extra the runs' tools need (matplotlib, Hydra): pip install 'bnlab[lab]'


def lazy(module: str, function: str, extra: str | None = None) -> Callable[[argparse.Namespace],
                                                                            int]:
    """A command's body, imported when it runs; where `extra`'s packages are missing, one line
    that names the extra, exit 2."""
    def run(args: argparse.Namespace) -> int:
        try:
            body = getattr(importlib.import_module(module), function)
        except ModuleNotFoundError as e:
            if extra is None or (e.name or "").startswith("bnlab"):
                raise
            print(f"bnlab {args.command}: needs the {extra} extra ({e.name} is not installed); "
                  f"install it with pip install 'bnlab[{extra}]'.", file=sys.stderr)
            return 2
        return body(args)

    return run


def add_doctor(sub) -> None:
    p = sub.add_parser("doctor", help="which normalization layers are at risk, and the fix",
                       description=DOCTOR)
    p.add_argument("--model", required=True,
                   help="torchvision:<name>, bnlab:<name>, <module>:<factory>, or a checkpoint")
    p.add_argument("--input", help="one sample's shape, e.g. 3x224x224 (default: 3x32x32 for "
                                   "bnlab models, else 3x224x224)")
    p.add_argument("--world", type=int, default=8, help="number of ranks (default 8)")
    p.add_argument("--batch-per-rank", type=int, default=2,
                   help="samples per rank in one forward pass: the micro-batch under gradient "
                   "accumulation (default 2)")
    p.add_argument("--grad-accum", type=int, default=1,
                   help="micro-batches accumulated per optimizer step (default 1): BN still "
                   "normalizes each micro-batch, and the fixes say so")
    p.add_argument("--norm", choices=KINDS, help="convert the BN layers first (default: the "
                                                 "model as built, statistics per rank)")
    p.add_argument("--sync-group", type=int, default=0,
                   help="with --norm syncbn: ranks that share statistics (default all)")
    p.add_argument("--min-values", type=int, default=MIN_VALUES,
                   help=f"values per channel below which a layer is at risk (default {MIN_VALUES})")
    p.add_argument("--min-images", type=int, default=MIN_IMAGES,
                   help=f"samples below which a layer is at risk (default {MIN_IMAGES})")
    p.add_argument("--skip", action="append", default=[], metavar="NAME",
                   help="with --norm: a layer to leave as it is (repeatable; the names of "
                        "model.named_modules(), as a refusal names them)")
    add_json(p)
    p.set_defaults(run=lazy("bnlab.doctor", "report"))


def add_diagnose(sub) -> None:
    p = sub.add_parser("diagnose", help="how much a trained model's BN statistics cost on its "
                       "data, and which layers", description="Is BN the problem in my run? "
                       "What a trained model's BN statistics cost on its own data "
                       "(bnlab.diagnose).")
    p.add_argument("--model", required=True, help="<module>:<factory>, torchvision:<name>, "
                   "or a bnlab run (its folder or checkpoint.pt: its own data, no --loader)")
    p.add_argument("--checkpoint", help="weights for --model: a state dict, or a checkpoint "
                   "holding one under 'model' or 'state_dict'")
    p.add_argument("--loader", help="<module>:<function> returning the training batches of "
                   "(input, target) that PreciseBN reads (and the metric, without "
                   "--val-loader)")
    p.add_argument("--val-loader", help="<module>:<function> returning the batches top-1 "
                   "accuracy is measured on")
    p.add_argument("--batch-per-rank", type=int, help="the per-rank batch the run trained "
                   "with: the train-mode row and the doctor's rule (a bnlab run: its own)")
    p.add_argument("--num-samples", type=int, default=4096,
                   help="samples PreciseBN reads (default 4096)")
    p.add_argument("--threshold", type=float, default=THRESHOLD, help="exit 1 where the "
                   f"statistics cost more than this many points (default {THRESHOLD:g})")
    p.add_argument("--data-root", help="a bnlab run: read CIFAR-10 from here instead of the "
                   "run's own data.root")
    p.add_argument("--per-rank", action="store_true", help="also measure the metric with "
                   "each rank's running statistics and with their average (a bnlab run's "
                   "checkpoint keeps them; for your own DDP model use bnlab.diagnose(..., "
                   "per_rank=True) under torchrun)")
    add_json(p)
    p.set_defaults(run=lazy("bnlab.evaluation", "diagnose_command"))


def add_runs(sub) -> None:
    p = sub.add_parser("runs", help="a table across runs (a multirun's jobs, a folder of runs); "
                       "runs verify RUN re-runs one and compares its floats")
    p.add_argument("paths", nargs="+", type=Path, help="run directories or folders above them")
    p.set_defaults(run=lazy("bnlab.lab.runs", "run_table", LAB))
    p = sub.add_parser("plot", help="runs' val acc and loss curves side by side, with jitter")
    p.add_argument("paths", nargs="+", type=Path, help="run directories or folders above them")
    p.add_argument("--out", type=Path, default=Path("runs.png"), help="the PNG (default runs.png)")
    p.set_defaults(run=lazy("bnlab.lab.runs", "run_plot", LAB))
