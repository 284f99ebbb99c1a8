"""`convert` and `revert` on models users have: state kept, same function, torch's choices."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torchvision
from torch.nn.modules.batchnorm import _BatchNorm

import bnlab
from bnlab.batchnorm import BatchNormXd, FrozenBatchNorm, RankBatchNorm
from bnlab.compat import BN_TAKES_BIAS, bias_kw, drop_bias
from bnlab.errors import BnlabError
from bnlab.norms import NORMS

# The norms with batch statistics: every kind whose layer is a RankBatchNorm (a new one joins)
BATCH_STAT_KINDS = [k for k in NORMS if isinstance(
    bnlab.convert(nn.Sequential(nn.BatchNorm2d(64)), k)[0], RankBatchNorm)]
# train like BN on one rank (brn: its outputs do while its limits are 1 and 0, its running
# variance never: tests/test_renorm.py)
STATE_KINDS = [k for k in BATCH_STAT_KINDS if k not in ("frozen_bn", "brn")]


def _trained(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give every BN layer state that a fresh layer does not have, as training would."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for i, m in enumerate(m for m in model.modules() if isinstance(m, _BatchNorm)):
            c = m.num_features
            m.running_mean.copy_(torch.randn(c, generator=g))
            m.running_var.copy_(torch.rand(c, generator=g) + 0.5)
            m.num_batches_tracked.fill_(100 + i)
            if m.affine:
                m.weight.copy_(torch.rand(c, generator=g) + 0.5)
                m.bias.copy_(torch.randn(c, generator=g))
                m.bias.requires_grad_(i % 2 == 0)  # a partly frozen model
            m.momentum = None if i % 3 == 0 else 0.01 * (i % 7 + 1)
            m.eps = 1e-3 if i % 2 else 1e-5
    return model


class Head1d(nn.Module):
    """A conv trunk and a BatchNorm1d head, as many classifiers and projection heads have."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
                                   nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 4))

    def forward(self, x):
        return self.head(self.trunk(x))


MODELS = {
    "resnet50": (lambda: torchvision.models.resnet50(num_classes=10), (2, 3, 32, 32)),
    "mobilenet_v3_small": (lambda: torchvision.models.mobilenet_v3_small(num_classes=10),
                           (2, 3, 32, 32)),
    "r3d_18": (lambda: torchvision.models.video.r3d_18(num_classes=10), (2, 3, 2, 16, 16)),
    "head1d": (Head1d, (6, 3, 10, 10)),
}


def _bns(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, _BatchNorm)]


def _same_state(a: nn.Module, b: nn.Module) -> None:
    """The same state dict (keys, dtypes, values) and, layer by layer, the same BN settings,
    train/eval flags and requires_grad."""
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sb:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k
    for m, o in zip(_bns(a), _bns(b), strict=True):
        assert (m.eps, m.momentum, m.affine, m.track_running_stats, m.training) == \
            (o.eps, o.momentum, o.affine, o.track_running_stats, o.training)
        assert [p.requires_grad for p in m.parameters()] == \
            [p.requires_grad for p in o.parameters()]


@pytest.fixture(scope="module", params=list(MODELS))
def original(request):
    make, shape = MODELS[request.param]
    torch.manual_seed(0)
    return _trained(make()), torch.randn(shape)


@pytest.mark.parametrize("kind", BATCH_STAT_KINDS)
def test_converted_model_computes_the_same_function_in_eval_mode(original, kind):
    model, x = original
    ref = copy.deepcopy(model).eval()
    conv = bnlab.convert(copy.deepcopy(model).eval(), kind)
    assert all(isinstance(m, RankBatchNorm) for m in _bns(conv))
    with torch.no_grad():
        torch.testing.assert_close(conv(x), ref(x), rtol=0, atol=0)


@pytest.mark.parametrize("kind", STATE_KINDS)
def test_converted_model_trains_as_the_original_on_one_rank(original, kind):
    model, x = original
    ref = copy.deepcopy(model).train()
    conv = bnlab.convert(copy.deepcopy(model).train(), kind)
    torch.manual_seed(1)  # dropout draws the same masks in both
    y = conv(x)
    torch.manual_seed(1)
    torch.testing.assert_close(y, ref(x), rtol=0, atol=0)
    # the same update of running statistics, momentum None (cumulative average) included
    for a, b in zip(_bns(conv), _bns(ref), strict=True):
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=0, atol=0)


@pytest.mark.parametrize("kind", BATCH_STAT_KINDS)
def test_revert_of_convert_restores_the_state_dict_and_the_classes(original, kind):
    model, _ = original
    before = copy.deepcopy(model)
    back = bnlab.revert(bnlab.convert(copy.deepcopy(model), kind))
    _same_state(back, before)
    assert [type(m) for m in back.modules()] == [type(m) for m in before.modules()]


def test_syncbn_carries_what_torch_convert_sync_batchnorm_carries():
    torch.manual_seed(0)
    model = _trained(Head1d())
    model.trunk.eval()  # a flag that differs between layers must survive too
    ours = bnlab.convert(copy.deepcopy(model), "syncbn")
    theirs = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(model))
    assert all(isinstance(t, nn.SyncBatchNorm) for t in _bns(theirs))
    _same_state(ours, theirs)


def test_the_worked_example_keeps_state_flag_and_output():
    """Conv2d, BatchNorm2d(momentum=None), BatchNorm1d; running mean 2, weight 3, eval mode."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, momentum=None), nn.Flatten(),
                      nn.Linear(4 * 6 * 6, 5), nn.BatchNorm1d(5))
    with torch.no_grad():
        for bn in (m[1], m[4]):
            bn.running_mean.fill_(2.0)
            bn.weight.fill_(3.0)
    m.eval()
    x = torch.randn(4, 3, 8, 8)
    with torch.no_grad():
        y = m(x)
        bnlab.convert(m, "syncbn")
        assert isinstance(m[1], RankBatchNorm) and isinstance(m[4], RankBatchNorm)
        assert m[1].momentum is None and not m[1].training and not m[4].training
        assert torch.equal(m[1].running_mean, torch.full((4,), 2.0))
        assert torch.equal(m[4].weight, torch.full((5,), 3.0))
        assert torch.equal(m(x), y)
        bnlab.revert(m)
    assert type(m[1]) is nn.BatchNorm2d and type(m[4]) is nn.BatchNorm1d


def test_group_and_layer_norm_take_the_affine_parameters():
    torch.manual_seed(0)
    model = _trained(Head1d())
    gn = bnlab.convert(copy.deepcopy(model), "gn", groups=4)
    ln = bnlab.convert(copy.deepcopy(model), "ln")
    for conv in (gn, ln):
        norms = [m for m in conv.modules() if isinstance(m, nn.GroupNorm)]
        assert [n.num_groups for n in norms] == ([4, 4] if conv is gn else [1, 1])
        for n, bn in zip(norms, _bns(model), strict=True):
            assert torch.equal(n.weight, bn.weight) and torch.equal(n.bias, bn.bias)
            assert n.eps == bn.eps and n.bias.requires_grad == bn.bias.requires_grad
        conv.train()(torch.randn(3, 3, 10, 10))  # a (N, C) input works through GroupNorm
    assert bnlab.revert(gn) is gn and not _bns(gn)  # no statistics to give back


def test_layer_options_dtype_and_device_are_kept():
    layers = [nn.BatchNorm2d(3, affine=False), nn.BatchNorm2d(3, track_running_stats=False),
              drop_bias(nn.BatchNorm2d(3, **bias_kw(False, BN_TAKES_BIAS)), False),
              nn.BatchNorm3d(3, dtype=torch.float64)]
    for bn in layers:
        new = bnlab.convert(bn, "syncbn")  # a BN layer on its own: the new layer is returned
        assert isinstance(new, RankBatchNorm)
        assert (new.affine, new.track_running_stats, new.bias is None, new.running_mean is None) \
            == (bn.affine, bn.track_running_stats, bn.bias is None, bn.running_mean is None)
        assert all(t.dtype == bn.running_var.dtype for t in new.buffers()
                   if t.is_floating_point()) if bn.running_var is not None else True
        x = torch.randn(4, 3, *([2] * (3 if isinstance(bn, nn.BatchNorm3d) else 2)),
                        dtype=torch.float64 if isinstance(bn, nn.BatchNorm3d) else None)
        for mode in (True, False):
            torch.testing.assert_close(new.train(mode)(x), bn.train(mode)(x), rtol=0, atol=0)
        assert type(bnlab.revert(new)) is type(bn)


def test_torch_syncbatchnorm_converts_and_reverts_to_any_rank_batchnorm():
    model = nn.SyncBatchNorm.convert_sync_batchnorm(_trained(Head1d()))
    bnlab.revert(model)
    assert [type(m) for m in _bns(model)] == [BatchNormXd, BatchNormXd]
    model.eval()(torch.randn(2, 3, 10, 10))  # runs on CPU, 4d and 2d inputs alike
    frozen = bnlab.convert(_trained(Head1d()), "frozen_bn")
    assert all(isinstance(m, FrozenBatchNorm) and not m.training for m in _bns(frozen.train()))


def test_instance_norm_is_left_alone():
    m = nn.Sequential(nn.InstanceNorm2d(3, affine=True), nn.BatchNorm2d(3))
    bnlab.convert(m, "syncbn")
    assert type(m[0]) is nn.InstanceNorm2d and isinstance(m[1], RankBatchNorm)


class BatchNormAct2d(nn.BatchNorm2d):
    """A BN subclass with its own forward and a child module, as timm's."""

    def __init__(self, c):
        super().__init__(c)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(super().forward(x))


class ChildOnly(nn.BatchNorm2d):
    def __init__(self, c):
        super().__init__(c)
        self.drop = nn.Dropout(0.1)


def test_a_subclass_with_its_own_forward_or_children_is_refused_by_name():
    for layer, what in ((BatchNormAct2d(3), "its own forward"), (ChildOnly(3), "child modules")):
        m = nn.Sequential(nn.Conv2d(3, 3, 1), layer, nn.BatchNorm2d(3))
        with pytest.raises(BnlabError, match=f"layer '1' is a {type(layer).__name__}.*{what}"
                                             r".*skip=\['1'\]"):
            bnlab.convert(m, "syncbn")
        assert isinstance(m[2], nn.BatchNorm2d) and type(m[2]) is nn.BatchNorm2d
        bnlab.convert(m, "syncbn", skip=["1"])  # the way out the message names
        assert m[1] is layer and isinstance(m[2], RankBatchNorm)


def test_a_shared_layer_stays_shared_and_a_refused_model_says_so():
    shared = nn.BatchNorm2d(3)
    m = nn.Sequential(nn.Sequential(shared), nn.Sequential(shared))
    bnlab.convert(m, "syncbn")
    assert m[0][0] is m[1][0] and isinstance(m[0][0], RankBatchNorm)
    with pytest.raises(BnlabError, match="the model is itself a BatchNormAct2d"):
        bnlab.convert(BatchNormAct2d(3), "syncbn")


class PlainSubclass(nn.BatchNorm2d):
    pass


def test_a_subclass_without_its_own_forward_converts():
    m = nn.Sequential(PlainSubclass(3))
    bnlab.convert(m, "bn")
    assert isinstance(m[0], RankBatchNorm) and m[0].reverts_to is nn.BatchNorm2d


def test_bad_calls_are_one_sentence():
    m = nn.Sequential(nn.BatchNorm2d(3))
    with pytest.raises(BnlabError, match="unknown; choose one of"):
        bnlab.convert(m, "batchnorm")
    with pytest.raises(BnlabError, match=r"skip names \['2'\], which the model does not have"):
        bnlab.convert(m, "bn", skip=["2"])
    with pytest.raises(BnlabError, match=r"convert\(model, 'bn'\) takes no option groups; "
                                         "its options are eps, momentum"):
        bnlab.convert(m, "bn", groups=4)
    with pytest.raises(BnlabError, match="does not divide the 3 channels of layer '0'"):
        bnlab.convert(m, "gn", groups=2)
    lazy = nn.Sequential(nn.LazyBatchNorm2d())
    with pytest.raises(BnlabError, match="lazy BatchNorm that has not seen an input yet"):
        bnlab.convert(lazy, "syncbn")
    assert type(m[0]) is nn.BatchNorm2d  # nothing changed by a refused call


def test_a_refused_conversion_leaves_the_model_exactly_as_it_was():
    """All or nothing: the 32-channel layer converts, the 48-channel one is refused, and the
    model keeps both BatchNorms (it was left half converted before)."""
    import torch.nn as nn

    from bnlab.norms import convert

    model = nn.Sequential(nn.Conv2d(3, 32, 1), nn.BatchNorm2d(32), nn.Conv2d(32, 48, 1),
                          nn.BatchNorm2d(48))
    before = [type(m) for m in model.modules()]
    with pytest.raises(BnlabError, match=r"48 channels of layer '3'; choose a group count .*"
                                         r"\(here at most 24"):
        convert(model, "gn")
    assert [type(m) for m in model.modules()] == before
    capping = r"set cap_groups=True \(the trainer: norm.cap_groups=true"  # 16 < 32: it helps
    with pytest.raises(BnlabError, match=capping):
        convert(nn.Sequential(nn.Conv2d(3, 16, 1), nn.BatchNorm2d(16)), "gn")


def test_layers_without_a_shift_come_out_the_same_on_a_torch_without_bias_keywords(monkeypatch):
    """torch 2.4 has no `bias=` on BatchNorm or GroupNorm (bnlab.compat, 2.13 has): there the
    layer is built with a shift and the shift removed. Both ways give the same layers, state
    and outputs (the older torch stood in for by the flags compat reads)."""
    import bnlab.batchnorm
    import bnlab.norms

    def layers() -> list[tuple]:
        torch.manual_seed(0)
        x, out = torch.randn(4, 8, 3, 3), []
        for kind in ("bn", "syncbn", "frozen_bn", "gn", "ln"):
            bn = drop_bias(nn.BatchNorm2d(8, **bias_kw(False, BN_TAKES_BIAS)), False)
            opts = {"groups": 4} if kind == "gn" else {}
            layer = bnlab.convert(bn, kind, **opts)
            back = bnlab.revert(layer)
            out.append((kind, type(layer).__name__, layer.bias, sorted(layer.state_dict()),
                        layer.train()(x), back.bias, sorted(back.state_dict())))
        return out

    new = layers()
    for module, names in ((bnlab.batchnorm, ["BN_TAKES_BIAS"]),
                          (bnlab.norms, ["BN_TAKES_BIAS", "GN_TAKES_BIAS"])):
        for name in names:
            monkeypatch.setattr(module, name, False)
    old = layers()
    for a, b in zip(new, old, strict=True):
        assert a[:4] == b[:4] and a[5:] == b[5:] and a[2] is None, (a[:2], b[:2])
        assert torch.equal(a[4], b[4]), a[0]


def test_ddp_gets_its_buffer_sync_under_the_name_this_torch_gives_it(monkeypatch):
    from bnlab import compat

    got = {}
    monkeypatch.setattr(compat, "DDP", lambda model, **kw: got.update(kw))
    for name in ("forward_sync_buffers", "broadcast_buffers"):  # torch 2.13 / before
        monkeypatch.setattr(compat, "DDP_SYNC_BUFFERS", name)
        got.clear()
        compat.ddp(nn.Linear(2, 2), None, False)
        assert got == {"device_ids": None, name: False}


def test_each_layer_names_its_kind_and_a_syncbn_state_dict_loads_into_the_plain_model():
    torch.manual_seed(0)
    plain = torchvision.models.resnet18(num_classes=10)
    for kind in ("bn", "syncbn", "syncbn_naive", "frozen_bn", "brn"):
        layer = bnlab.convert(copy.deepcopy(plain), kind).bn1
        assert layer.kind == kind and repr(layer).split("(", 2)[1].startswith(f"kind={kind},")
    synced = _trained(bnlab.convert(copy.deepcopy(plain), "syncbn"))
    fresh = torchvision.models.resnet18(num_classes=10)
    fresh.load_state_dict(synced.state_dict())  # strict: the same keys and shapes
    assert torch.equal(fresh.bn1.running_var, synced.bn1.running_var)


def test_a_process_group_is_for_syncbn_alone_in_place_of_sync_group():
    with pytest.raises(BnlabError, match="process_group is for syncbn alone"):
        bnlab.convert(nn.Sequential(nn.BatchNorm2d(4)), "syncbn", sync_group=2,
                      process_group=object())
    with pytest.raises(BnlabError, match="takes no option process_group"):
        bnlab.convert(nn.Sequential(nn.BatchNorm2d(4)), "bn", process_group=object())


# ----------------------------------------------------------------------------------------
# EvoNorm-S0 as its authors place it (norm.placement=norm_act), against timm's EvoNorm2dS0


def _timm_block(ours):
    """bnlab's converted block rebuilt from timm's layers: EvoNorm2dS0 with its activation in
    place of bn1 + ReLU, apply_act=False for bn2 and the shortcut, ReLU after the add."""
    timm_layers = pytest.importorskip("timm.layers")

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = copy.deepcopy(ours.conv1), copy.deepcopy(ours.conv2)
            self.n1 = timm_layers.EvoNorm2dS0(ours.bn1.num_features, groups=ours.bn1.groups)
            self.n2 = timm_layers.EvoNorm2dS0(ours.bn2.num_features, groups=ours.bn2.groups,
                                              apply_act=False)
            conv, norm = ours.shortcut
            self.sc = torch.nn.Sequential(copy.deepcopy(conv), timm_layers.EvoNorm2dS0(
                norm.num_features, groups=norm.groups, apply_act=False))
            with torch.no_grad():
                for dst, src in ((self.n1, ours.bn1), (self.n2, ours.bn2), (self.sc[1], norm)):
                    dst.weight.copy_(src.weight)
                    dst.bias.copy_(src.bias)
                self.n1.v.copy_(ours.bn1.v)

        def forward(self, x):
            out = self.n2(self.conv2(self.n1(self.conv1(x))))
            return torch.relu(out + self.sc(x))

    return Block()


def test_evonorm_as_its_authors_place_it_equals_timms_residual_block():
    from bnlab.models import resnet20

    torch.manual_seed(0)
    m = bnlab.convert(resnet20(), "evonorm", groups=8, placement="norm_act")
    ours = m.layers[3]  # 16 -> 32 channels, stride 2: a projection shortcut
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(0.1 * torch.randn_like(p))  # away from the initial ones and zeros
    assert isinstance(ours.relu1, torch.nn.Identity) and ours.bn1.nonlinearity
    assert not ours.bn2.nonlinearity and ours.bn2.v is None and not ours.shortcut[1].nonlinearity
    theirs = _timm_block(ours)
    x = torch.randn(4, 16, 8, 8, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    a, b = ours(x), theirs(x2)
    torch.testing.assert_close(a, b)
    a.square().sum().backward()
    b.square().sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(ours.bn1.v.grad, theirs.n1.v.grad)
    torch.testing.assert_close(ours.conv1.weight.grad, theirs.conv1.weight.grad)
    torch.testing.assert_close(ours.shortcut[1].weight.grad, theirs.sc[1].weight.grad)


def test_norm_act_placement_takes_every_relu_after_a_norm_and_keeps_those_after_the_add():
    from bnlab.models import resnet20

    m = bnlab.convert(resnet20(), "evonorm", groups=8, placement="norm_act")
    kinds = [type(mod).__name__ for name, mod in m.named_modules() if name.endswith("relu1")]
    assert kinds == ["Identity"] * 9 and isinstance(m.relu, torch.nn.Identity)  # the stem's too
    assert all(isinstance(b.relu, torch.nn.ReLU) for b in m.layers)  # after the add: kept
    evo = [mod for mod in m.modules() if type(mod).__name__ == "EvoNormS0"]
    assert sum(e.nonlinearity for e in evo) == 10 and len(evo) == 21  # stem + 9 bn1; 9 bn2 + 2


def test_norm_act_placement_refuses_a_model_whose_blocks_it_does_not_know():
    import torchvision

    with pytest.raises(BnlabError, match="norm.placement=norm_act knows the blocks"):
        bnlab.convert(torchvision.models.resnet18(), "evonorm", placement="norm_act")
