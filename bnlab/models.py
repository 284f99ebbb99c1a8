"""Model registry: the config group `model/` picks one entry by name."""

from __future__ import annotations

from collections.abc import Callable

import torch.nn as nn


def resnet18(num_classes: int = 10) -> nn.Module:
    """torchvision's ResNet-18 unchanged (7x7/2 stem + max-pool), as in the reports."""
    import torchvision  # here, not above: importing it costs every process seconds (its ops
    # import torch._dynamo), and resnet20, the planner and refused input never need it

    return torchvision.models.resnet18(weights=None, num_classes=num_classes)


def resnet18_cifar(num_classes: int = 10) -> nn.Module:
    """ResNet-18 with a 3x3 stride-1 stem and no max-pool: the usual CIFAR adaptation."""
    m = resnet18(num_classes)
    m.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    m.maxpool = nn.Identity()
    return m


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu1 = nn.ReLU(inplace=True)  # after bn1 (its own module: a norm-act can take it)
        self.relu = nn.ReLU(inplace=True)   # after the residual add
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNetCifar(nn.Module):
    """He et al. (2016) CIFAR ResNet: 3 stages of 16/32/64 channels, depth = 6n + 2."""

    def __init__(self, depth: int = 20, num_classes: int = 10):
        super().__init__()
        n = (depth - 2) // 6
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        layers, cin = [], 16
        for i, cout in enumerate((16, 32, 64)):
            for j in range(n):
                layers.append(BasicBlock(cin, cout, 2 if (i > 0 and j == 0) else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.layers(self.relu(self.bn1(self.conv1(x))))
        return self.fc(self.pool(x).flatten(1))


def resnet20(num_classes: int = 10) -> nn.Module:
    return ResNetCifar(20, num_classes)


MODELS: dict[str, Callable[..., nn.Module]] = {
    "resnet18": resnet18,
    "resnet18_cifar": resnet18_cifar,
    "resnet20": resnet20,
}


def build_model(name: str, num_classes: int = 10) -> nn.Module:
    return MODELS[name](num_classes=num_classes)
