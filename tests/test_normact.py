"""`convert` on timm's models (their norm-act layers) and type identity: a converted layer stays
what type-keyed tools look for (torch.ao's fusion, timm's freeze_batch_norm_2d and weight-decay
groups). timm's own conversion to SyncBN is the reference on the concatenated batch."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import bnlab
from bnlab.batchnorm import RankBatchNorm
from bnlab.normact import NormAct
from bnlab.norms import NORMS, EvoNormS0
from bnlab.simulate import SimulatedDDP

timm = pytest.importorskip("timm")
timm_layers = pytest.importorskip("timm.layers")
timm_optim = pytest.importorskip("timm.optim")

GROUPED = {"groups": 8, "cap_groups": True}  # divides every width of the three models


def _opts(kind: str) -> dict:
    return GROUPED if kind in ("gn", "gnws", "evonorm") else {}


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False).double()


def _x(n: int = 8, px: int = 32) -> torch.Tensor:
    return torch.randn(n, 3, px, px, generator=torch.Generator().manual_seed(1),
                       dtype=torch.double)


@pytest.mark.parametrize("name", ["efficientnet_b0", "regnety_008"])
@pytest.mark.parametrize("kind", sorted(NORMS))
def test_every_kind_converts_timms_norm_act_models_and_keeps_their_activation(name, kind):
    """Every BatchNormAct2d is converted (none left of timm's class unless it is one of ours),
    keeps its activation, and the model trains one step with finite gradients."""
    model = _model(name)
    acts = [type(m.act) for m in model.modules() if isinstance(m, timm_layers.BatchNormAct2d)]
    bnlab.convert(model, kind, **_opts(kind))
    converted = [m for m in model.modules() if isinstance(m, NormAct)]
    assert len(converted) == len(acts) > 40
    assert [type(m.act) for m in converted] == acts
    assert not [m for m in model.modules() if type(m) is timm_layers.BatchNormAct2d]
    model.train()
    model(_x(4)).square().mean().backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("name", ["efficientnet_b0", "regnety_008", "resnet50"])
def test_syncbn_equals_timms_convert_sync_batchnorm_on_the_concatenated_batch(name):
    """Over 4 simulated ranks x 2 images, bnlab's syncbn computes BN on the 8 images: timm's
    SyncBatchNormAct out of a process group computes the same. Outputs, every gradient and
    every running statistic agree (float64)."""
    ref = _model(name)
    ours = copy.deepcopy(ref)
    ref = timm_layers.convert_sync_batchnorm(ref).train()
    sim = SimulatedDDP(bnlab.convert(ours, "syncbn"), 4).train()
    x = _x()
    a, b = ref(x), sim(x)
    a.square().sum().backward()
    b.square().sum().backward()
    torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-10)
    for (n, p), q in zip(ref.named_parameters(), ours.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-9, atol=1e-9, msg=n)
    theirs = ref.state_dict()
    for k, v in ours.state_dict().items():
        if k in theirs:
            torch.testing.assert_close(v, theirs[k], rtol=1e-10, atol=1e-10, msg=k)
    # and per-rank BN is not that: the check can fail
    per_rank = SimulatedDDP(bnlab.convert(copy.deepcopy(ref), "bn"), 4).train()
    assert (per_rank(x) - a).abs().max() > 1e-3


@pytest.mark.parametrize("kind", ["gn", "evonorm"])
def test_batch_free_kinds_on_a_norm_act_layer_equal_timms_own_layer(kind):
    """gn in place of BatchNormAct2d(SiLU) is timm's GroupNormAct(SiLU); evonorm with
    placement=norm_act is timm's EvoNorm2dS0 (its activation in place of the SiLU):
    outputs and gradients."""
    torch.manual_seed(0)
    src = timm_layers.BatchNormAct2d(16, act_layer=nn.SiLU).double()
    with torch.no_grad():
        src.weight.uniform_(0.5, 1.5)
        src.bias.normal_()
    ours = bnlab.convert(nn.Sequential(copy.deepcopy(src)), kind, groups=4,
                         **({"placement": "norm_act"} if kind == "evonorm" else {}))[0]
    if kind == "gn":
        ref = timm_layers.GroupNormAct(16, 4, act_layer=nn.SiLU).double()
    else:
        ref = timm_layers.EvoNorm2dS0(16, groups=4).double()
        assert isinstance(ours.act, nn.Identity) and ours.nonlinearity
    with torch.no_grad():
        ref.weight.copy_(src.weight)
        ref.bias.copy_(src.bias)
    x = torch.randn(3, 16, 5, 5, dtype=torch.double, requires_grad=True)
    a, b = ref(x), ours(x)
    # timm's EvoNorm2dS0 takes its group variance in float32 (group_std: x.float().var), so
    # in double it matches only to float32's precision; the CPU's kernels move those bits
    tol = {"rtol": 1.3e-6, "atol": 1e-5} if kind == "evonorm" else {}
    torch.testing.assert_close(b, a, **tol)
    ga = torch.autograd.grad(a.square().sum(), (x, ref.weight))
    gb = torch.autograd.grad(b.square().sum(), (x, ours.weight))
    for u, v in zip(ga, gb, strict=True):
        torch.testing.assert_close(v, u, **tol)


def test_evonorm_norm_act_placement_on_a_timm_model_takes_each_activation():
    """A norm-act layer with an activation gives it to EvoNorm-S0; one without (timm's
    apply_act=False, before the residual add) runs EvoNorm-S0 affine only."""
    model = _model("efficientnet_b0")
    had_act = [not isinstance(m.act, nn.Identity) for m in model.modules()
               if isinstance(m, timm_layers.BatchNormAct2d)]
    bnlab.convert(model, "evonorm", placement="norm_act", **GROUPED)
    evo = [m for m in model.modules() if isinstance(m, EvoNormS0)]
    assert [m.nonlinearity for m in evo] == had_act and any(had_act) and not all(had_act)
    assert all(isinstance(m.act, nn.Identity) for m in evo)


@pytest.mark.parametrize("kind", ["bn", "syncbn", "frozen_bn", "brn"])
def test_revert_gives_timms_class_back_with_its_activation_and_state(kind):
    model = _model("regnety_008")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    acts = [m.act for m in model.modules() if isinstance(m, timm_layers.BatchNormAct2d)]
    bnlab.revert(bnlab.convert(model, kind))
    layers = [m for m in model.modules() if isinstance(m, timm_layers.BatchNormAct2d)]
    assert {type(m) for m in layers} == {timm_layers.BatchNormAct2d}
    assert [m.act for m in layers] == acts  # the same modules
    after = model.state_dict()
    assert after.keys() == before.keys()
    for k, v in before.items():
        assert torch.equal(after[k], v), k


# -- type identity ---------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["bn", "syncbn", "frozen_bn", "brn"])
def test_a_converted_layer_stays_an_instance_of_the_torch_class_it_replaced(kind):
    model = nn.Sequential(nn.BatchNorm1d(4), nn.BatchNorm2d(4), nn.BatchNorm3d(4),
                          nn.SyncBatchNorm(4))
    bnlab.convert(model, kind)
    plain = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
    assert [isinstance(m, c) for m, c in zip(model[:3], plain, strict=True)] == [True] * 3
    assert not isinstance(model[1], (nn.BatchNorm1d, nn.BatchNorm3d))
    assert all(isinstance(m, RankBatchNorm) and m.kind == kind for m in model)
    assert not isinstance(model[3], nn.BatchNorm2d)  # torch's SyncBatchNorm has no rank


def test_timms_freeze_batch_norm_keeps_the_activation_of_a_converted_layer():
    """A layer converted from BatchNormAct2d is still one, so timm freezes it as one."""
    model = bnlab.convert(_model("efficientnet_b0"), "bn")
    frozen = timm_layers.freeze_batch_norm_2d(model)
    assert isinstance(frozen.bn1, timm_layers.FrozenBatchNormAct2d)
    assert isinstance(frozen.bn1.act, nn.SiLU)


def test_torch_ao_fuses_conv_and_bn_after_convert_and_revert():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
    with torch.no_grad():
        model[1].running_mean.normal_()
        model[1].running_var.uniform_(0.5, 2)
    model.eval()
    x = torch.randn(2, 3, 8, 8)
    want = model(x)
    bnlab.revert(bnlab.convert(model, "syncbn"))
    fused = torch.ao.quantization.fuse_modules(model, [["0", "1"]])
    assert isinstance(fused[1], nn.Identity)
    torch.testing.assert_close(fused(x), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["bn", "syncbn", "gn", "evonorm"])
def test_timms_weight_decay_groups_find_the_same_norm_parameters_after_convert(kind):
    def no_decay(model):
        groups = timm_optim.param_groups_weight_decay(model, weight_decay=1e-4)
        ids = {id(p) for g in groups if g["weight_decay"] == 0 for p in g["params"]}
        return sorted(n for n, p in model.named_parameters() if id(p) in ids)

    model = _model("regnety_008")
    before = no_decay(model)
    bnlab.convert(model, kind, **_opts(kind))
    after = [n for n in no_decay(model) if not n.endswith(".v")]  # EvoNorm's own parameter
    assert after == before
