"""Every config composes and validates; bad values are refused with one sentence."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from bnlab import hydra_setup
from bnlab.config import validate
from bnlab.errors import BnlabError
from conftest import ROOT

CONFIGS = ROOT / "configs"
GROUPS = [p.name for p in CONFIGS.iterdir() if p.is_dir() and p.name != "experiment"]
EXPERIMENTS = sorted(p.stem for p in (CONFIGS / "experiment").glob("*.yaml"))


def compose_train(overrides: list[str]) -> dict:
    hydra_setup.register()
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    return OmegaConf.to_container(cfg, resolve=True)


def group_choices():
    for g in GROUPS:
        for f in sorted((CONFIGS / g).glob("*.yaml")):
            yield f"{g}={f.stem}"


@pytest.mark.parametrize("choice", list(group_choices()))
def test_every_group_option_composes_and_validates(choice):
    validate(compose_train([choice]))


@pytest.mark.parametrize("exp", EXPERIMENTS)
def test_every_experiment_composes_and_validates(exp):
    cfg = compose_train([f"experiment={exp}"])
    validate(cfg)
    assert cfg["name"] == exp


def test_every_key_has_a_comment():
    """Config declared once: every key of every YAML file carries a one-line comment."""
    missing = []
    for f in CONFIGS.rglob("*.yaml"):
        if f.parent.name == "experiment":
            continue
        in_hydra = False
        for line in f.read_text().splitlines():
            if line.startswith("hydra:") or line.startswith("defaults:"):
                in_hydra = True
            elif line and not line.startswith((" ", "#")):
                in_hydra = False
            if in_hydra or not line.strip() or line.lstrip().startswith(("#", "-")):
                continue
            if ":" in line and "#" not in line:
                missing.append(f"{f.relative_to(CONFIGS)}: {line.strip()}")
    assert not missing, missing


BAD = [
    ("batch_per_gpu=0", "batch_per_gpu"),
    ("batch_per_gpu=-3", "batch_per_gpu"),
    ("batch_per_gpu=2.5", "batch_per_gpu"),
    ("batch_per_gpu=abc", "batch_per_gpu"),
    ("grad_accum=0", "grad_accum"),
    ("epochs=0", "epochs"),
    ("eval_every=0", "eval_every"),
    ("optim.lr=0", "optim.lr"),
    ("optim.momentum=1.5", "optim.momentum"),
    ("optim.schedule=linear", "optim.schedule"),
    ("optim.warmup_epochs=9", "optim.warmup_epochs"),
    ("optim.momentum=0 optim.nesterov=true", "optim.nesterov"),
    ("optim.name=adam", "optim.name"),
    ("optim=adamw optim.nesterov=true", "optim.nesterov"),
    ("record.decompose=true record.decompose_samples=8", "record.decompose_samples"),
    ("record.decompose=true record.decompose_after=1.5", "record.decompose_after"),
    ("record.predictions=yes", "record.predictions"),
    ("dist.nproc_per_node=0", "dist.nproc_per_node"),
    ("dist.nproc_per_node=100000", "dist.nproc_per_node"),
    ("dist.backend=mpi", "dist.backend"),
    ("dist.backend=nccl dist.device=cpu", "dist.backend"),
    ("logger=wandb logger.wandb.mode=sometimes", "logger.wandb.mode"),
    ("norm=syncbn norm.impl=cudnn", "norm.impl"),
    ("norm=syncbn norm.impl=torch dist.device=cpu", "norm.impl"),
]


@pytest.mark.parametrize(("override", "key"), BAD)
def test_bad_values_are_refused_naming_the_key(override, key):
    cfg = compose_train(override.split())
    with pytest.raises(BnlabError) as e:
        validate(cfg)
    msg = str(e.value)
    assert msg.startswith(key + " ") or f"{key}=" in msg, msg
    assert msg.count("\n") == 0




def test_what_only_the_training_machine_can_check_waits_for_it(monkeypatch):
    """A SLURM sweep composes its cells on the machine that submits them (here=False): CUDA
    and the local ranks are the compute node's to check. A task that torchrun or SLURM
    started is one rank, whatever dist.nproc_per_node the run has in all."""
    gpu_cell = compose_train(["dist.device=cuda", "norm=syncbn", "norm.impl=torch",
                              "dist.nproc_per_node=100000"])
    with pytest.raises(BnlabError):
        validate(gpu_cell)
    validate(gpu_cell, here=False)
    for wrong in (["dist.backend=nccl", "dist.device=cpu"],
                  ["norm=syncbn", "norm.impl=torch", "dist.device=cpu"]):
        with pytest.raises(BnlabError):
            validate(compose_train(wrong), here=False)  # wrong on any machine
    many = compose_train(["dist.nproc_per_node=100000"])
    monkeypatch.setenv("RANK", "3")
    validate(many)


def test_adamw_is_torch_adamw_with_beta1_from_momentum():
    import torch

    from bnlab.optim import build_optimizer

    cfg = compose_train(["optim=adamw", "optim.lr=0.002"])
    validate(cfg)
    opt, _ = build_optimizer(cfg["optim"], torch.nn.Linear(2, 2), 10, 1)
    assert isinstance(opt, torch.optim.AdamW)
    g = opt.param_groups[0]
    assert (g["betas"], g["weight_decay"]) == ((0.9, 0.999), 0.05)


def test_the_default_rate_scales_with_the_global_batch_and_reports_is_literal():
    from bnlab.optim import peak_lr

    for ov, images, rate in (([], 32, 0.025), (["dist.simulate=4", "batch_per_gpu=2"], 8, 0.00625),
                             (["batch_per_gpu=2", "grad_accum=4"], 8, 0.00625)):
        cfg = compose_train(ov)
        assert peak_lr(cfg["optim"], images) == pytest.approx(rate)
        assert cfg["optim"]["warmup_epochs"] == 0.5
    rep = compose_train(["experiment=reports"])
    assert peak_lr(rep["optim"], 8) == 0.1 and rep["optim"]["warmup_epochs"] == 0
    assert rep["optim"]["schedule"] == "constant" and rep["batch_per_gpu"] == 2


def test_the_demos_words_match_its_config():
    """configs/experiment/demo.yaml's steps, evaluations and test images, as its comment,
    bnlab/lab/demo.py and docs/training.md state them (they once said 500 where it ran 250)."""
    import yaml

    from bnlab.paths import ROOT

    path = ROOT / "configs" / "experiment" / "demo.yaml"
    c = yaml.safe_load(path.read_text())
    steps = c["data"]["train_limit"] // (c["batch_per_gpu"] * c["dist"]["simulate"]) * c["epochs"]
    evals, images = c["epochs"] * c["eval_every"], c["data"]["val_limit"]
    comment = " ".join(line.lstrip("# ") for line in path.read_text().splitlines()[:5])
    assert f"{steps} steps" in comment and f"{evals} evaluations of {images} test images" \
        in comment
    docs = " ".join((ROOT / "docs" / "training.md").read_text().split())
    assert f"({steps} steps, {evals} evaluations of {images} test images)" in docs
    for text in (docs, (ROOT / "bnlab" / "lab" / "demo.py").read_text()):
        assert not any(f"{n} steps" in text for n in (2 * steps, steps // 2))
