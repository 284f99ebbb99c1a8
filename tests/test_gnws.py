"""norm=gnws: GroupNorm with the convolutions that feed it weight-standardized, against timm's
StdConv2d + GroupNorm (outputs and gradients); convert keeps raw weights as parameters, revert
leaves a plain model that computes the same function."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

import bnlab
from bnlab.models import build_model
from bnlab.wsconv import WSConv2d, feeding_convs

timm_layers = pytest.importorskip("timm.layers")


def _timm_twin(model: nn.Module) -> nn.Module:
    """The converted model with each WSConv2d replaced by timm's StdConv2d holding the same
    raw weight (eps as ours)."""
    twin = copy.deepcopy(model)
    for name, m in list(twin.named_modules()):
        if isinstance(m, WSConv2d):
            std = timm_layers.StdConv2d(m.in_channels, m.out_channels, m.kernel_size,
                                        stride=m.stride, padding=m.padding,
                                        dilation=m.dilation, groups=m.groups,
                                        bias=m.bias is not None, eps=m.eps)
            std.load_state_dict(m.state_dict())
            parent, _, leaf = name.rpartition(".")
            setattr(twin.get_submodule(parent) if parent else twin, leaf, std)
    return twin


@pytest.mark.parametrize("make,groups", [(lambda: build_model("resnet20"), 8),
                                         (lambda: torchvision.models.resnet18(num_classes=10),
                                          32)])
def test_gnws_equals_timms_stdconv2d_and_groupnorm(make, groups):
    """Every conv that feeds a converted layer is standardized (all of a ResNet's), the raw
    weight stays the parameter, and the model equals timm's StdConv2d + GroupNorm in outputs
    and in every gradient (float64: float32's rounding grows through 20 layers)."""
    torch.manual_seed(0)
    model = bnlab.convert(make(), "gnws", groups=groups, cap_groups=True).double()
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert convs and all(isinstance(m, WSConv2d) for m in convs)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    twin = _timm_twin(model).double()
    x = torch.randn(4, 3, 32, 32, dtype=torch.float64)
    y = torch.randint(0, 10, (4,))
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_a, out_b = model(xa), twin(xb)
    torch.testing.assert_close(out_a, out_b, rtol=1e-10, atol=1e-10)
    F.cross_entropy(out_a, y).backward()
    F.cross_entropy(out_b, y).backward()
    assert (xa.grad - xb.grad).abs().max() <= 1e-9 * xb.grad.abs().max()
    for (na, pa), (nb, pb) in zip(model.named_parameters(), twin.named_parameters(),
                                  strict=True):
        assert na == nb  # rounding, relative to the largest gradient of the tensor
        assert (pa.grad - pb.grad).abs().max() <= 1e-9 * pb.grad.abs().max(), na


def test_the_raw_weight_is_the_parameter_and_revert_bakes_in_the_standardized_one():
    torch.manual_seed(0)
    model = build_model("resnet20")
    raw = model.conv1.weight.detach().clone()
    conv = bnlab.convert(model, "gnws", groups=8, cap_groups=True)
    assert torch.equal(conv.conv1.weight, raw)  # not standardized in place
    w = conv.conv1.standardized()
    flat = w.reshape(w.shape[0], -1)
    torch.testing.assert_close(flat.mean(1), torch.zeros(w.shape[0]), rtol=0, atol=1e-6)
    torch.testing.assert_close(flat.var(1, unbiased=False), torch.ones(w.shape[0]),
                               rtol=1e-4, atol=1e-4)
    x = torch.randn(2, 3, 32, 32)
    back = bnlab.revert(copy.deepcopy(conv))
    assert not any(isinstance(m, WSConv2d) for m in back.modules())
    assert all(type(m) is nn.Conv2d for m in back.modules() if isinstance(m, nn.Conv2d))
    with torch.no_grad():
        torch.testing.assert_close(back(x), conv(x), rtol=0, atol=0)


def test_only_convs_that_feed_a_converted_layer_are_standardized():
    """A conv whose output no BN normalizes (a head), and a BN left by skip=, keep their
    convs plain; a model fx cannot trace falls back to the conv registered before the BN."""
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)
            self.conv2, self.bn2 = nn.Conv2d(8, 8, 3), nn.BatchNorm2d(8)
            self.head = nn.Conv2d(8, 4, 1)

        def forward(self, x):
            x = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
            return self.head(x) if x.sum() > -1e9 else x  # data-dependent: fx cannot trace it

    model = Branchy()
    assert feeding_convs(model, {"bn1", "bn2"}) == {"bn1": "conv1", "bn2": "conv2"}
    conv = bnlab.convert(copy.deepcopy(model), "gnws", groups=4, skip=["bn2"])
    assert isinstance(conv.conv1, WSConv2d) and type(conv.conv2) is nn.Conv2d
    assert type(conv.head) is nn.Conv2d and isinstance(conv.bn2, nn.BatchNorm2d)
    assert conv(torch.randn(2, 3, 8, 8)).shape == (2, 4, 4, 4)


@pytest.mark.slow  # CI time (3 s); in CI the sweep's code-path cells train gnws (test_sweep.py)
def test_gnws_trains_through_train_py(tmp_path):
    from conftest import run_here

    p = run_here("train.py", "model=resnet20", "data=synthetic", "data.num_train=64",
                 "data.num_val=32", "epochs=1", "batch_per_gpu=2", "dist.simulate=4",
                 "norm=gnws", "norm.groups=8", "norm.cap_groups=true", "progress=false",
                 "log_every=4", f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "completed" in (tmp_path / "r" / "status.json").read_text()


def test_skip_and_conv_subclasses_are_left_as_they_are():
    """A conv named in skip= stays plain (skip leaves a layer as it is), and a Conv2d subclass
    with its own forward (timm's Conv2dSame: dynamic padding) is never rebuilt: its layer gets
    GroupNorm alone."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
                          timm_layers.Conv2dSame(8, 8, 3, stride=2), nn.BatchNorm2d(8))
    x = torch.randn(2, 3, 9, 9)
    shape = model.eval()(x).shape
    conv = bnlab.convert(copy.deepcopy(model), "gnws", groups=4)
    assert isinstance(conv[0], WSConv2d) and type(conv[3]) is timm_layers.Conv2dSame
    assert conv(x).shape == shape  # Conv2dSame's padding kept
    kept = bnlab.convert(copy.deepcopy(model), "gnws", groups=4, skip=["0"])
    assert type(kept[0]) is nn.Conv2d and isinstance(kept[1], nn.GroupNorm)
