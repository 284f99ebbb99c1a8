"""The standard recipe's two choices beyond the rate and schedule: each residual block's last
norm starting at scale 0 (model.zero_init_residual) and no weight decay on norms and biases
(optim.decay_norms=false)."""

from __future__ import annotations

import copy

import pytest
import torch
import torchvision

from bnlab.models import resnet20
from bnlab.net import zero_init_residual
from bnlab.norms import convert
from bnlab.optim import build_optimizer, param_groups

OPTIM = {"name": "sgd", "lr": 0.1, "scale_from": 0, "momentum": 0.9, "weight_decay": 5e-4,
         "nesterov": False, "schedule": "cosine", "warmup_epochs": 0.0,
         "step_milestones": [0.5], "step_gamma": 0.1}


@pytest.mark.parametrize("kind", ["bn", "gn", "gnws", "evonorm", "syncbn"])
def test_every_block_starts_as_its_shortcut_whatever_the_norm(kind):
    torch.manual_seed(0)
    opts = {"groups": 8} if kind in ("gn", "gnws", "evonorm") else {}
    if kind == "evonorm":  # as its authors place it: the block's last one affine only
        opts["placement"] = "norm_act"
    m = convert(resnet20(), kind, **opts).eval()
    assert zero_init_residual(m) == 9  # resnet20: 9 BasicBlocks
    block = m.layers[1]  # 16 -> 16 channels: an identity shortcut
    x = torch.randn(2, 16, 8, 8)
    torch.testing.assert_close(block(x), torch.relu(x), rtol=0, atol=0)
    assert all(float(b.bn2.weight.detach().abs().sum()) == 0 for b in m.layers)


def test_torchvisions_bottlenecks_zero_their_third_norm():
    m = torchvision.models.resnet50(weights=None)
    assert zero_init_residual(m) == 16
    block = m.layer1[0]
    assert float(block.bn3.weight.detach().abs().sum()) == 0
    assert float(block.bn2.weight[0].detach()) == 1


def test_decay_norms_false_leaves_every_norm_parameter_and_bias_undecayed():
    m = convert(resnet20(), "gn", groups=8)
    decayed, plain = param_groups(m, 5e-4, decay_norms=False)
    assert plain["weight_decay"] == 0 and decayed["weight_decay"] == 5e-4
    norm_ids = {id(p) for n, p in m.named_parameters() if "bn" in n or n.endswith("bias")
                or ".shortcut.1." in n}
    assert {id(p) for p in plain["params"]} == norm_ids
    assert {id(p) for p in decayed["params"]} == {id(p) for p in m.parameters()} - norm_ids
    assert all(p.dim() == 4 or p.dim() == 2 for p in decayed["params"])  # convs and fc weight


def test_decay_norms_true_steps_exactly_as_sgd_over_every_parameter():
    torch.manual_seed(0)
    a = resnet20()
    b = copy.deepcopy(a)
    opt_a, _ = build_optimizer(OPTIM, a, steps_per_epoch=10, epochs=1)
    opt_b = torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    for model, opt in ((a, opt_a), (b, opt_b)):
        for _ in range(2):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
