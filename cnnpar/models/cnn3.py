"""cnn3: the founding document's "cnn2d, 3 conv layers + 3 fully connected layers".

conv3x3 -> BN -> ReLU -> maxpool2, three times (32, 64, 128 channels), then three linear
layers (256, 128, classes). The layer sizes are fixed module attributes so the framework
runners (Keras, TensorFlow, PyTensor) can build the identical network.
"""

from __future__ import annotations

import torch.nn as nn

from cnnpar.errors import ConfigError
from cnnpar.models.registry import register

CONV_CHANNELS = (32, 64, 128)
FC_UNITS = (256, 128)


def flat_features(image_size: int) -> int:
    side = image_size
    for _ in CONV_CHANNELS:
        side //= 2
    if side < 1:  # bad input (a small --image-size, --max-side or array), so a user error, raised before any run
        raise ConfigError(
            f"model cnn3: input images {image_size}x{image_size}: expected at least 8x8 (its three 2x2 max-pools); "
            "give --image-size 8 or more"
        )
    return CONV_CHANNELS[-1] * side * side


class CNN3(nn.Module):
    def __init__(self, in_channels: int, num_classes: int, image_size: int) -> None:
        super().__init__()
        layers, c = [], in_channels
        for out in CONV_CHANNELS:
            layers += [
                nn.Conv2d(c, out, 3, padding=1, bias=False),
                nn.BatchNorm2d(out),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(2),
            ]
            c = out
        self.features = nn.Sequential(*layers)
        f = flat_features(image_size)
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(f, FC_UNITS[0]),
            nn.ReLU(inplace=True),
            nn.Linear(FC_UNITS[0], FC_UNITS[1]),
            nn.ReLU(inplace=True),
            nn.Linear(FC_UNITS[1], num_classes),
        )

    def forward(self, x):
        return self.classifier(self.features(x))


@register("cnn3", "3x (conv3x3-BN-ReLU-maxpool) + 3 linear layers; the founding document's small CNN", square_only=True)
def build_cnn3(in_channels: int, num_classes: int, image_size: int) -> nn.Module:
    return CNN3(in_channels, num_classes, image_size)
