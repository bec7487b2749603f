"""torchvision ResNets, with a small-image stem below 64 px.

At 32x32 the ImageNet stem (7x7 stride-2 conv, then a stride-2 max pool) leaves an 8x8 map
before the first block; a 3x3 stride-1 conv and no pool keep the resolution the residual
stages need, as CIFAR ResNets do.
"""

from __future__ import annotations

import torch.nn as nn

from cnnpar.models.registry import register

SMALL_IMAGE = 64


def _adapt(model: nn.Module, in_channels: int, image_size: int) -> nn.Module:
    if image_size < SMALL_IMAGE:
        model.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    elif in_channels != 3:
        model.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
    return model


@register("resnet18", "torchvision ResNet-18 (3x3 stem without max pool below 64 px)")
def build_resnet18(in_channels: int, num_classes: int, image_size: int) -> nn.Module:
    from torchvision import models as tvm  # here, not at the top: importing torchvision costs ~1 s

    return _adapt(tvm.resnet18(num_classes=num_classes), in_channels, image_size)


@register("resnet50", "torchvision ResNet-50 (3x3 stem without max pool below 64 px)")
def build_resnet50(in_channels: int, num_classes: int, image_size: int) -> nn.Module:
    from torchvision import models as tvm

    return _adapt(tvm.resnet50(num_classes=num_classes), in_channels, image_size)
