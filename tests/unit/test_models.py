"""Every registered model trains: a forward pass of the right shape, a finite loss, gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cnnpar.errors import ConfigError
from cnnpar.models import build_model, describe_models

# (name, channels, image size): the small sizes each model is meant for, plus the grey 64 px stem.
CASES = [
    ("cnn3", 1, 16),
    ("cnn3", 3, 32),
    ("fastnet", 3, 32),
    ("resnet18", 3, 32),
    ("resnet18", 1, 64),
    ("resnet50", 3, 32),
]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("name,channels,size", CASES)
def test_forward_backward_gives_finite_loss_and_gradients(name, channels, size):
    torch.manual_seed(0)
    model = build_model(name, channels, 7, size)
    x = torch.randn(2, channels, size, size)
    y = torch.tensor([0, 6])
    logits = model(x)
    assert logits.shape == (2, 7)
    loss = F.cross_entropy(logits, y)
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


def test_resnet_stem_follows_image_size():
    small = build_model("resnet18", 3, 10, 32)
    assert small.conv1.kernel_size == (3, 3) and small.conv1.stride == (1, 1)
    assert isinstance(small.maxpool, torch.nn.Identity)
    large = build_model("resnet18", 1, 10, 224)
    assert large.conv1.kernel_size == (7, 7) and large.conv1.in_channels == 1


def test_cnn3_is_three_conv_blocks_and_three_linear_layers():
    model = build_model("cnn3", 1, 10, 28)
    kinds = [type(m).__name__ for m in model.modules()]
    assert kinds.count("Conv2d") == 3 and kinds.count("Linear") == 3 and kinds.count("BatchNorm2d") == 3


def test_registry_lists_models_and_refuses_unknown_names():
    names = [n for n, _ in describe_models()]
    assert {"cnn3", "fastnet", "resnet18", "resnet50"} <= set(names)
    with pytest.raises(ConfigError, match=r"model 'vgg99': expected one of .*cnn3"):
        build_model("vgg99", 3, 10, 32)


def test_cnnpar_models_prints_one_line_per_model(capsys):
    from cnnpar.cli import main

    assert main(["models"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [ln.split()[0] for ln in lines] == [n for n, _ in describe_models()]
