import pytest
import torch

from bnlab.doctor import bn_value_counts
from bnlab.models import MODELS, build_model

PARAMS = {"resnet18": 11_181_642, "resnet18_cifar": 11_173_962, "resnet20": 272_474}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_builds_with_ten_classes(name):
    m = build_model(name)
    assert m(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    assert sum(p.numel() for p in m.parameters()) == PARAMS[name]


def test_torchvision_resnet18_reaches_1x1_maps_at_32px():
    """The reports' model: 2 images per rank leave its last stage 2 values per channel."""
    counts = bn_value_counts(build_model("resnet18"), batch_per_gpu=2)
    assert counts["layer4.1.bn2"] == 2
    assert counts["bn1"] == 2 * 16 * 16
    assert bn_value_counts(build_model("resnet18_cifar"), 2)["layer4.1.bn2"] == 2 * 4 * 4
