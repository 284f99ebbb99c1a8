"""Config checks, all in one place, run before any process group or file is created.

Each failure is one sentence that names the key and the allowed values.
"""

from __future__ import annotations

import functools
import os
from numbers import Real
from pathlib import Path

import torch

from bnlab.batchnorm import SYNCBN_IMPLS
from bnlab.bn_sync import BN_SYNC_MODES
from bnlab.data import DATASETS, cifar_missing_message, cifar_present
from bnlab.dist import world_size
from bnlab.errors import BnlabError
from bnlab.models import MODELS
from bnlab.norms import NORMS, PLACEMENTS
from bnlab.optim import OPTIMIZERS, SCHEDULES
from bnlab.precise_bn import ESTIMATORS, POOLINGS
from bnlab.precision import PRECISIONS
from bnlab.rundir import get_dotted

WANDB_MODES = ("auto", "online", "offline", "disabled")
RESUME_MODES = ("auto", "never")
def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool)


def _need(ok: bool, key: str, what: str, value) -> None:
    if not ok:
        raise BnlabError(f"{key} must be {what}, got {value!r}.")


def _pos_int(cfg: dict, key: str, what: str = "a positive integer", minimum: int = 1) -> None:
    v = get_dotted(cfg, key)
    _need(_is_int(v) and v >= minimum, key, what, v)




def _choice(cfg: dict, key: str, allowed) -> None:
    v = get_dotted(cfg, key)
    _need(v in allowed, key, f"one of {', '.join(map(str, allowed))}", v)


def max_local_ranks(device: str) -> int:
    """How many ranks this machine can run: one per GPU, or 4 per CPU core."""
    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        return torch.cuda.device_count()
    return 4 * (os.cpu_count() or 1)


@functools.cache  # read once per process: a sweep composes every cell through validate
def schema() -> dict:
    """Every config key bnlab knows, as nested dicts: configs/train.yaml's own keys and, under
    each group, the keys of all its options (configs/<group>/*.yaml)."""
    import yaml

    from bnlab.paths import CONFIGS

    out = {k: v for k, v in yaml.safe_load((CONFIGS / "train.yaml").read_text()).items()
           if k not in ("defaults", "hydra")}
    for group in sorted(p for p in CONFIGS.iterdir() if p.is_dir() and p.name != "experiment"):
        merged: dict = {}
        for f in sorted(group.glob("*.yaml")):
            merged.update(yaml.safe_load(f.read_text()) or {})
        out[group.name] = merged
    return out


def check_keys(cfg: dict, known: dict, prefix: str = "") -> None:
    """A key no config file declares (a typo after `+`) is refused, not silently ignored."""
    for k, v in cfg.items():
        if k not in known:
            raise BnlabError(f"{prefix}{k} is not a bnlab config key (a misspelling after +?); "
                             f"the keys are declared in configs/ (`python train.py --cfg job` "
                             "lists them).")
        if isinstance(v, dict) and isinstance(known[k], dict):
            check_keys(v, known[k], f"{prefix}{k}.")


def validate(cfg: dict, here: bool = True) -> None:
    """Reject invalid values with one sentence; nothing has been created yet. `here=False`
    (a config composed to be run on another machine: a SLURM sweep's cells on the machine
    that submits them) leaves out what only the machine that trains can check: CUDA, and
    how many local ranks it can run."""
    check_keys(cfg, schema())
    _check_run(cfg)
    _check_data(cfg)
    _check_optim(cfg)
    _check_dist(cfg, here)
    _check_precision(cfg, here)
    _check_records(cfg)
    _check_precise_bn(cfg)


def _check_run(cfg: dict) -> None:
    """The top-level keys: batch, steps, epochs, evaluation, logging, seed, resume."""
    _pos_int(cfg, "batch_per_gpu", "a positive integer (images per rank per micro-batch)")
    _pos_int(cfg, "grad_accum", "a positive integer (micro-batches per optimizer step)")
    _pos_int(cfg, "max_steps", "a whole number of optimizer steps (0 = all epochs)", minimum=0)
    _pos_int(cfg, "checkpoint_every", "a whole number of optimizer steps (0 = epoch ends only)",
             minimum=0)
    _choice(cfg, "resume", RESUME_MODES)
    _choice(cfg, "on_nan", ("stop", "continue"))
    _pos_int(cfg, "epochs")
    _pos_int(cfg, "eval_every", "a positive integer (evaluations per epoch)")
    _pos_int(cfg, "log_every", "a positive integer (optimizer steps between log lines)")
    _pos_int(cfg, "seed", "a non-negative integer", minimum=0)
    sparse = cfg.get("eval_sparse_until", 0.0)
    _need(_is_num(sparse) and 0 <= sparse < 1, "eval_sparse_until", "a fraction of training in "
          "[0, 1)", sparse)


def _check_data(cfg: dict) -> None:
    """The registries' names (model, data, norm) and the data group."""
    _choice(cfg, "model.name", sorted(MODELS))
    _choice(cfg, "data.name", sorted(DATASETS))
    _choice(cfg, "norm.kind", sorted(NORMS))
    ramp = cfg["norm"].get("ramp_of_run") if cfg["norm"]["kind"] == "brn" else None
    _need(ramp is None or (isinstance(ramp, dict) and set(ramp) == {"hold", "r_ramp", "d_ramp"}
                           and all(_is_num(v) and 0 <= v <= 1 for v in ramp.values())),
          "norm.ramp_of_run", "null or {hold, r_ramp, d_ramp}, each a fraction of the run in "
          "[0, 1]", ramp)
    if cfg["norm"]["kind"] == "evonorm" and "placement" in cfg["norm"]:
        _choice(cfg, "norm.placement", PLACEMENTS)
        _need(cfg["norm"]["placement"] == "each_bn" or cfg["model"]["name"] == "resnet20",
              "norm.placement", "each_bn for this model (norm_act knows resnet20's blocks only)",
              cfg["norm"]["placement"])
    for k in ("data.train_limit", "data.val_limit"):
        _pos_int(cfg, k, "a non-negative integer (0 = all)", minimum=0)
    _pos_int(cfg, "data.holdout", "a non-negative integer (training images held out; 0 = none)",
             minimum=0)
    _pos_int(cfg, "data.holdout_seed", "a non-negative integer", minimum=0)
    _pos_int(cfg, "data.image_size", "an integer of at least 8 (pixels a side)", minimum=8)
    _pos_int(cfg, "data.eval_batch")
    for k in ("augment", "rank_skew"):
        v = cfg["data"].get(k, False)
        _need(isinstance(v, bool), f"data.{k}", "true or false", v)


def _check_optim(cfg: dict) -> None:
    o = cfg["optim"]
    _need(o.get("name", "sgd") in OPTIMIZERS, "optim.name",
          f"one of {', '.join(OPTIMIZERS)} (pick it with optim=<name>)", o.get("name"))
    _need(_is_num(o["lr"]) and o["lr"] > 0, "optim.lr", "a positive number", o["lr"])
    _need(_is_num(o["momentum"]) and 0 <= o["momentum"] < 1, "optim.momentum",
          "a number in [0, 1)", o["momentum"])
    _need(_is_num(o["weight_decay"]) and o["weight_decay"] >= 0, "optim.weight_decay",
          "a non-negative number", o["weight_decay"])
    _need(isinstance(o["nesterov"], bool), "optim.nesterov", "true or false", o["nesterov"])
    _need(isinstance(o.get("decay_norms", True), bool), "optim.decay_norms", "true or false",
          o.get("decay_norms"))
    z = cfg["model"].get("zero_init_residual", False)
    _need(isinstance(z, bool), "model.zero_init_residual", "true or false", z)
    _need(not o["nesterov"] or o.get("name", "sgd") == "sgd", "optim.nesterov",
          "false with AdamW (Nesterov momentum is SGD's)", o["nesterov"])
    _need(not o["nesterov"] or o["momentum"] > 0, "optim.nesterov",
          "false when optim.momentum is 0 (Nesterov needs momentum)", o["nesterov"])
    _pos_int(cfg, "optim.scale_from", "a non-negative integer (the global batch lr is given for; "
             "0 = lr as given)", minimum=0)
    _choice(cfg, "optim.schedule", SCHEDULES)
    w = o["warmup_epochs"]
    _need(_is_num(w) and 0 <= w < cfg["epochs"], "optim.warmup_epochs",
          f"a number in [0, epochs={cfg['epochs']})", w)
    ms = o["step_milestones"]
    _need(isinstance(ms, list) and all(_is_num(m) and 0 < m <= 1 for m in ms),
          "optim.step_milestones", "a list of fractions of training in (0, 1]", ms)
    _need(_is_num(o["step_gamma"]) and 0 < o["step_gamma"] <= 1, "optim.step_gamma",
          "a number in (0, 1]", o["step_gamma"])


def _check_dist(cfg: dict, here: bool) -> None:
    """Devices, backends and ranks (`here`: on the machine that trains), and the logger."""
    d = cfg["dist"]
    _choice(cfg, "dist.device", ("auto", "cpu", "cuda"))
    _choice(cfg, "dist.backend", ("auto", "gloo", "nccl"))
    _choice(cfg, "dist.bn_sync", BN_SYNC_MODES)
    if here and d["device"] == "cuda" and not torch.cuda.is_available():
        raise BnlabError("dist.device=cuda but no CUDA device is visible; use dist.device=auto.")
    cuda = d["device"] == "cuda" or (d["device"] == "auto" and
                                     (not here or torch.cuda.is_available()))
    if d["backend"] == "nccl" and not cuda:
        raise BnlabError("dist.backend=nccl needs CUDA; use dist.backend=auto (gloo on CPU).")
    if cfg["norm"]["kind"] == "syncbn":
        _choice(cfg, "norm.impl", SYNCBN_IMPLS)
        if cfg["norm"]["impl"] == "torch" and not cuda:
            raise BnlabError("norm.impl=torch needs CUDA (torch's SyncBatchNorm kernels have no "
                             "CPU version); use norm.impl=auto, which runs bnlab's on CPU.")
    _pos_int(cfg, "dist.nproc_per_node")
    _pos_int(cfg, "dist.simulate", "a positive integer (ranks simulated in one process; 1 = off)")
    if d["simulate"] > 1 and d["nproc_per_node"] > 1:
        raise BnlabError("dist.simulate and dist.nproc_per_node cannot both exceed 1; "
                         "simulate W ranks in one process, or run real ranks.")
    if here and "RANK" not in os.environ:  # torchrun's or SLURM's tasks: each is one rank
        limit = max_local_ranks(d["device"])
        _need(d["nproc_per_node"] <= limit, "dist.nproc_per_node",
              f"at most {limit} on this machine", d["nproc_per_node"])
    _need(_is_num(d["timeout_s"]) and d["timeout_s"] > 0, "dist.timeout_s", "a positive number",
          d["timeout_s"])
    _pos_int(cfg, "dist.threads", "a non-negative integer (0 = cores / local ranks)", minimum=0)
    _choice(cfg, "logger.wandb.mode", WANDB_MODES)


def _check_precision(cfg: dict, here: bool) -> None:
    """precision, channels_last and compile; fp16 needs CUDA (`here`: where it trains)."""
    _choice(cfg, "precision", tuple(PRECISIONS))
    for key in ("channels_last", "compile"):
        v = cfg.get(key, False)
        _need(isinstance(v, bool), key, "true or false", v)
    d = cfg["dist"]["device"]
    cpu = d == "cpu" or (here and d == "auto" and not torch.cuda.is_available())
    if cfg["precision"] == "fp16" and cpu:
        raise BnlabError("precision=fp16 needs CUDA (its gradient scaler and half kernels are "
                         "the GPU's); use precision=bf16 on the CPU.")
    if cfg["precision"] == "bf16" and here and not cpu and torch.cuda.is_available() \
            and not torch.cuda.is_bf16_supported():
        raise BnlabError("precision=bf16 needs a GPU with bfloat16 (Ampere or newer); use "
                         "precision=fp16 on this one.")


def _check_records(cfg: dict) -> None:
    """What evaluations measure and keep: diagnostics and record."""
    _need(isinstance(cfg["diagnostics"]["enabled"], bool), "diagnostics.enabled",
          "true or false", cfg["diagnostics"]["enabled"])
    _pos_int(cfg, "diagnostics.min_values")
    _pos_int(cfg, "diagnostics.train_mode_batch", "a non-negative integer (0 = batch_per_gpu)",
             minimum=0)
    rec = cfg.get("record", {})
    for k in ("predictions", "decompose", "decompose_batch"):
        v = rec.get(k, False)
        _need(isinstance(v, bool), f"record.{k}", "true or false", v)
    if rec.get("decompose", False):
        _pos_int(cfg, "record.decompose_samples",
                 "a positive integer (training images for the decomposition's PreciseBN)")
        after = rec.get("decompose_after", 0.0)
        _need(_is_num(after) and 0 <= after < 1, "record.decompose_after",
              "a fraction of training in [0, 1)", after)
        _one_precise_batch(cfg, "record.decompose_samples")


def _check_precise_bn(cfg: dict) -> None:
    _pos_int(cfg, "precise_bn.every", "a non-negative integer (epochs between runs; 0 = never)",
             minimum=0)
    _need(isinstance(cfg["precise_bn"].get("before_eval", False), bool), "precise_bn.before_eval",
          "true or false", cfg["precise_bn"].get("before_eval"))
    _need(isinstance(cfg["precise_bn"]["at_end"], bool), "precise_bn.at_end", "true or false",
          cfg["precise_bn"]["at_end"])
    _choice(cfg, "precise_bn.mode", ("apply", "measure"))
    _choice(cfg, "precise_bn.estimator", ESTIMATORS)
    _choice(cfg, "precise_bn.pooling", POOLINGS)
    _pos_int(cfg, "precise_bn.num_samples")
    _pos_int(cfg, "precise_bn.batch", "a positive integer (PreciseBN images per rank per batch)")
    if precise_bn_runs(cfg):
        _one_precise_batch(cfg, "precise_bn.num_samples")
    _need(isinstance(cfg["precise_bn"]["augment"], bool), "precise_bn.augment", "true or false",
          cfg["precise_bn"]["augment"])


def _one_precise_batch(cfg: dict, key: str) -> None:
    """A count of images that PreciseBN measures (`key`) must fill one batch over all ranks."""
    one, v = cfg["precise_bn"]["batch"] * world_size(cfg), get_dotted(cfg, key)
    _need(_is_int(v) and v >= one, key, f"at least one PreciseBN batch over all ranks ({one} "
          "images; or lower precise_bn.batch)", v)


def precise_bn_runs(cfg: dict) -> bool:
    """Whether PreciseBN runs during training (every few epochs, before each evaluation or at
    the end)."""
    pb = cfg["precise_bn"]
    return pb["every"] > 0 or pb["at_end"] or pb.get("before_eval", False)


def check_data(cfg: dict) -> None:
    """A missing dataset with downloads off is an error before anything starts."""
    d = cfg["data"]
    if d["name"] == "cifar10" and not d["download"] and not cifar_present(Path(d["root"])):
        raise BnlabError(cifar_missing_message(Path(d["root"])) + " (data.download=false)")
