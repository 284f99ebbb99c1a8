"""The single-process simulation of W ranks against real multi-process DDP on gloo."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from bnlab import dist
from bnlab.data import Dataset, TrainLoader, make_synthetic
from bnlab.errors import BnlabError
from bnlab.metrics import Meter
from bnlab.models import MODELS, build_model
from bnlab.net import build_net
from bnlab.norms import NORMS, convert
from bnlab.optim import build_optimizer
from bnlab.trainer import train_step, wrap

STEPS, B, LR = 10, 2, 0.02
# Training at 2 images per rank is chaotic: float32 rounding differences between the two
# layouts (reduction order) grow ~1e4-fold in 20 steps. The maths is compared in float64,
# over 10 steps (2 epochs' worth of BN updates and momentum; 20 took twice the CI time).
DTYPE = torch.float64
# (norm, forward buffer sync, grad_accum): every norm, buffer sync on and off, accumulation.
COMBOS = [("bn", True, 1), ("bn", False, 1), ("bn", True, 2), ("bn", False, 2),
          ("syncbn", True, 1), ("syncbn", False, 2), ("syncbn_naive", True, 1),
          ("gn", True, 1), ("gn", True, 2)]
# At 2 ranks (every CI run) each norm, buffer sync on and off and accumulation each appear,
# for bn and syncbn both with and without: 6 of the 9; at 4 ranks (make test-slow) all 9.
EACH = [("bn", True, 1), ("bn", False, 2), ("syncbn", True, 1), ("syncbn", False, 2),
        ("syncbn_naive", True, 1), ("gn", True, 2)]


def _cfg(norm: str, sync: bool, accum: int, simulate: int) -> dict:
    norm_cfg = {"kind": norm}
    if norm == "gn":
        norm_cfg.update(groups=8, cap_groups=True)
    return {"seed": 0, "model": {"name": "resnet20"}, "norm": norm_cfg, "grad_accum": accum,
            "dist": {"broadcast_buffers": sync, "simulate": simulate},
            "optim": {"lr": LR, "momentum": 0.9, "weight_decay": 5e-4, "nesterov": False,
                      "schedule": "constant", "warmup_epochs": 0, "step_milestones": [],
                      "step_gamma": 1.0}}


def _data() -> Dataset:
    """Images seen at 16 px: float64 convolutions are slow on CPU, and the layouts' maths does
    not depend on the image's side. Each rank's BN in the last stage normalizes 32 values per
    channel at 2 images (4x4 maps), a quarter of what 32 px gives, still more than one."""
    train, val = make_synthetic(num_train=STEPS * 2 * 4 * B, num_val=8)
    return Dataset(train, val, (0.5,) * 3, (0.25,) * 3, size=16)


def _train(cfg: dict, env: dist.DistEnv, world: int) -> nn.Module:
    """The trainer's own pieces: build_net, wrap, TrainLoader, optimizer, train_step."""
    model = build_net(cfg).to(DTYPE)
    net = wrap(model, cfg, env)
    sim = cfg["dist"]["simulate"]
    loader = TrainLoader(_data(), env.device, B * sim, env.world, env.rank, cfg["grad_accum"],
                         seed=1, augment=True)
    opt, _ = build_optimizer(cfg["optim"], model, loader.steps_per_epoch, 1)
    meter = Meter(env.device)
    for step, micro in enumerate(loader.epoch(0)):
        if step == STEPS:
            break
        micro = [(x.to(DTYPE), y) for x, y in micro]
        train_step(net, micro, opt, meter, sync_grads=world > 1)
    return net


def _state(model: nn.Module) -> dict:
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()
            if "num_batches" not in k}


def combos(world: int) -> list[tuple]:
    return EACH if world == 2 else COMBOS


def _real_worker(world: int) -> list[dict]:
    env = dist.init("cpu", "gloo", threads=1)
    out = []
    for norm, sync, accum in combos(world):
        net = _train(_cfg(norm, sync, accum, 1), env, world)
        out.append(_state(net.module))  # every rank's own parameters and buffers
    dist.teardown()
    return out


# W=2 in every CI run (EACH: 6 settings); W=4 (about 2 minutes, all 9) in `make test-slow`.
@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_simulation_equals_real_ddp(world):
    real = dist.launch_local(_real_worker, world, world)
    env = dist.DistEnv(0, 1, 0, torch.device("cpu"), None)
    for i, (norm, sync, accum) in enumerate(combos(world)):
        net = _train(_cfg(norm, sync, accum, world), env, world)
        what = f"{norm} sync_buffers={sync} grad_accum={accum} W={world}"
        sim = _state(net.module)
        for k, v in real[0][i].items():
            if "running" not in k:
                np.testing.assert_allclose(sim[k], v, rtol=1e-5, atol=1e-6, err_msg=f"{what}: {k}")
        for r in range(world):
            bufs = net.rank_buffers(r)
            assert len(bufs) == (0 if norm == "gn" else 2 * 19 + 2 * 2)  # 21 BN layers
            for k, v in bufs.items():
                np.testing.assert_allclose(v.numpy(), real[r][i][k], rtol=1e-5, atol=1e-6,
                                           err_msg=f"{what}: rank {r} {k}")
        if norm == "bn":  # the ranks' statistics really differ: the check above has teeth
            a, b = net.rank_buffers(0), net.rank_buffers(1)
            assert any(not torch.allclose(a[k], b[k]) for k in a)


@pytest.mark.parametrize("kind", sorted(NORMS))
@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_every_norm_converts_every_model_and_trains_a_step(kind, model_name):
    base = build_model(model_name)
    opts = {"groups": 8, "cap_groups": True} if kind in ("gn", "gnws") else {}
    model = convert(copy.deepcopy(base), kind, **opts)
    assert not any(type(m) is nn.BatchNorm2d for m in model.modules())
    # Every norm has a per-channel scale and shift, so the parameter count is unchanged, but
    # for evonorm's per-channel v (one more parameter per channel of each converted layer).
    extra = sum(m.num_features for m in base.modules() if isinstance(m, nn.BatchNorm2d)) \
        if kind == "evonorm" else 0
    assert sum(p.numel() for p in model.parameters()) == \
        sum(p.numel() for p in base.parameters()) + extra
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))


def test_converting_after_ddp_wrapping_is_refused(tmp_path):
    store = torch.distributed.FileStore(str(tmp_path / "store"), 1)
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        ddp = DistributedDataParallel(build_model("resnet20"))
        with pytest.raises(BnlabError, match="already wrapped in DistributedDataParallel"):
            convert(ddp, "syncbn")
    finally:
        torch.distributed.destroy_process_group()


def test_the_simulated_ranks_statistics_live_in_the_simulations_layers_alone():
    """A converted model holds what torch's holds; SimulatedDDP turns its layers into their
    simulated layers (still nn.BatchNorm2d and the same kind), whose W ranks' statistics are
    buffers outside the state dict: the state dict's keys stay the bare model's, each rank's
    statistics travel with the buffers a resume restores, and a checkpoint written before
    (its state dict held them too) still resumes."""
    from bnlab.batchnorm import RankBatchNorm
    from bnlab.resume import rank_state, restore
    from bnlab.simulate import SimulatedDDP, SimulatedRanks

    torch.manual_seed(0)
    model = convert(build_model("resnet20"), "bn")
    keys = list(model.state_dict())
    assert not [n for n, _ in model.named_buffers() if "sim_" in n]
    net = SimulatedDDP(model, 4)
    bns = [m for m in model.modules() if isinstance(m, RankBatchNorm)]
    assert bns and all(isinstance(m, SimulatedRanks) and isinstance(m, nn.BatchNorm2d)
                       and m.kind == "bn" for m in bns)
    net.train()
    net(torch.randn(8, 3, 32, 32)).sum().backward()
    assert list(model.state_dict()) == keys
    assert list(net.state_dict()) == [f"module.{k}" for k in keys]
    first = bns[0]
    assert not torch.equal(first.rank_stats(0)[0], first.rank_stats(1)[0])  # own batches
    assert torch.equal(first.running_mean, first.rank_stats(0)[0])  # rank 0's, as DDP saves
    env = dist.DistEnv(0, 1, 0, torch.device("cpu"), None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    old = {**net.state_dict(), **{f"module.{n}": b for n, b in model.named_buffers()
                                  if "sim_running" in n}}  # as written before
    for written in (net.state_dict(), old):
        ckpt = {"resume": {"ranks": rank_state(net, [], env), "model": written, "epoch": 1,
                           "step_in_epoch": 0}, "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict(), "step": 5}
        again = SimulatedDDP(convert(build_model("resnet20"), "bn"), 4)
        assert restore(ckpt, again, opt, sched, [], env) == (1, 0, 5)
        layer = next(m for m in again.module.modules() if isinstance(m, RankBatchNorm))
        for r in range(4):
            assert torch.equal(layer.rank_stats(r)[1], first.rank_stats(r)[1])
    copied = pickle.loads(pickle.dumps(net))  # the simulated layers' classes are importable
    assert torch.equal(copied.module.state_dict()[keys[1]], model.state_dict()[keys[1]])
