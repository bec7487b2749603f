"""Every registered model trains: a forward pass of the right shape, a finite loss, gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cnnpar.errors import ConfigError
from cnnpar.models import build_model, describe_models
from cnnpar.models.fastnet import LOGIT_SCALE

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


def test_inputs_cnn3_cannot_take_are_user_errors_naming_model_size_and_need():
    with pytest.raises(ConfigError) as e:
        build_model("cnn3", 1, 10, 4)
    assert str(e.value) == (
        "model cnn3: input images 4x4: expected at least 8x8 (its three 2x2 max-pools); give --image-size 8 or more"
    )
    with pytest.raises(ConfigError, match=r"^model cnn3: input images 8x16 \(HxW\): expected square images"):
        build_model("cnn3", 1, 10, 8, 16)
    assert build_model("resnet18", 1, 3, 8, 16)(torch.zeros(2, 1, 8, 16)).shape == (2, 3)  # pooled: any shape


@pytest.mark.parametrize("data,extra,want", [
    ("rect.npz", [], "model cnn3: input images 8x16 (HxW): expected square images"),
    ("small.csv", [], "model cnn3: input images 4x4: expected at least 8x8"),
    ("square.npz", ["--image-size", "4"], "model cnn3: input images 4x4: expected at least 8x8"),
])  # fmt: skip
def test_train_refuses_them_in_one_line_before_a_run_folder(tmp_path, capsys, data, extra, want):
    """A non-square npz failed mid-epoch (mat1 and mat2 shapes) and left a run folder; small ones a traceback."""
    import numpy as np

    from cnnpar.cli import main
    from tests.datafiles import write_pixel_csv

    rng = np.random.default_rng(0)
    y = np.arange(20) % 2
    np.savez(tmp_path / "rect.npz", x_train=rng.integers(0, 256, (20, 8, 16), dtype=np.uint8), y_train=y)
    np.savez(tmp_path / "square.npz", x_train=rng.integers(0, 256, (20, 8, 8), dtype=np.uint8), y_train=y)
    write_pixel_csv(tmp_path / "small.csv", rng.integers(0, 256, (20, 4, 4)), y)
    runs = tmp_path / "runs"
    args = ["train", "--data", str(tmp_path / data), *extra, "--out-dir", str(runs), "--no-progress"]
    assert main([*args, "--no-tensorboard"]) == 2 and not runs.exists()
    err = capsys.readouterr().err
    assert err.startswith(f"cnnpar: error: {want}") and err.count("\n") == 1


def test_fastnet_logits_have_finite_gradients_when_compiled_in_bf16():
    """torch.compile + bf16 autocast on the CPU (Inductor's C++ backend) gave fastnet NaN gradients
    on its first backward when the maps were pooled with torch.amax: every cifar10-record epoch
    trained at loss nan. The layers in front of the pool are a conv and GELU, as in fastnet."""
    torch.manual_seed(0)
    model = build_model("fastnet", 3, 10, 32)
    conv = torch.nn.Conv2d(8, model.head.in_features, 1)
    x = torch.randn(4, 8, 4, 4, requires_grad=True)
    y = torch.tensor([0, 3, 6, 9])

    def logits(t):
        return model.classify(F.gelu(conv(t)))

    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = torch.compile(logits)(x)
    F.cross_entropy(out.float(), y).backward()
    assert torch.isfinite(x.grad).all()
    assert x.grad.abs().sum() > 0
    # the same forward as the largest value of each map
    with torch.no_grad():
        maps = torch.randn(2, model.head.in_features, 4, 4)
        assert torch.allclose(model.classify(maps), model.head(torch.amax(maps, dim=(2, 3))) * LOGIT_SCALE)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fastnet_compiled_in_bf16_on_cuda_has_finite_gradients():
    """The whole of fastnet, as cifar10-record trains it (channels_last, compiled, bf16, batch 2000)."""
    torch.manual_seed(0)
    model = build_model("fastnet", 3, 10, 32).cuda().to(memory_format=torch.channels_last)
    x = torch.randn(2000, 3, 32, 32, device="cuda").contiguous(memory_format=torch.channels_last)
    model.init_from_data(x[:500])
    y = torch.randint(0, 10, (2000,), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = torch.compile(model)(x)
    F.cross_entropy(out.float(), y, label_smoothing=0.2).backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
