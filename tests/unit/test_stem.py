"""The space-to-depth stem (parallel/stem.py): the same function as the plain stride-2 convolution, values and
gradients, with the module's own parameters, checkpoints unchanged, and only where it is meant to apply."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from cnnpar.config import Config, ConfigError, load_toml, resolve_for_device
from cnnpar.dist import DistInfo
from cnnpar.engine.trainer import Trainer
from cnnpar.models import build_model
from cnnpar.parallel.stem import SpaceToDepthConv2d, space_to_depth_stem, stem_line
from cnnpar.presets import with_overrides

pytestmark = pytest.mark.usefixtures("one_thread")  # one intra-op thread for the in-process runs (conftest)

CPU = DistInfo(0, 0, 1, torch.device("cpu"))


@pytest.mark.parametrize(
    "channels, kernel, padding, height, width, bias",
    [
        (3, 7, 3, 64, 64, False),  # ResNet's stem
        (3, 7, 3, 65, 47, True),  # odd sides: the block grid needs one more zero row or column
        (1, 5, 2, 33, 40, False),
        (4, 7, 0, 31, 30, True),  # no padding: rows no tap reads are cropped
        (2, 6, 2, 17, 18, True),  # an even kernel
    ],
)
def test_values_and_gradients_equal_the_plain_convolutions(channels, kernel, padding, height, width, bias):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(channels, 16, kernel, 2, padding, bias=bias)).double()
    plain = model[0]
    x = torch.randn(2, channels, height, width, dtype=torch.float64, requires_grad=True)
    y = plain(x)
    grad = torch.randn_like(y)
    y.backward(grad)
    want = [plain.weight.grad.clone(), x.grad.clone()] + ([plain.bias.grad.clone()] if bias else [])
    plain.zero_grad(set_to_none=True)
    x.grad = None

    assert space_to_depth_stem(model) == ["0"]
    blocked = model[0]
    assert isinstance(blocked, SpaceToDepthConv2d) and blocked.weight is plain.weight  # the same Parameter
    got_y = blocked(x)
    got_y.backward(grad)
    got = [blocked.weight.grad, x.grad] + ([blocked.bias.grad] if bias else [])
    torch.testing.assert_close(got_y, y, rtol=0, atol=1e-12)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-10)


def test_resnet_stems_are_swapped_at_imagenet_sizes_only_and_checkpoints_stay_the_same():
    torch.manual_seed(0)
    big = build_model("resnet50", 3, 10, 64).eval()
    keys = {k: v.shape for k, v in big.state_dict().items()}
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        before = big(x)
    assert space_to_depth_stem(big) == ["conv1"]
    assert {k: v.shape for k, v in big.state_dict().items()} == keys  # a checkpoint loads into a plain model
    with torch.no_grad():
        torch.testing.assert_close(big(x), before, rtol=1e-4, atol=1e-4)
    small = build_model("resnet18", 3, 10, 32)  # the 3x3 stride-1 stem of small images: nothing to rewrite
    assert space_to_depth_stem(small) == []
    wide = nn.Sequential(nn.Conv2d(16, 8, 7, 2, 3))  # many channels map onto tensor cores already
    assert space_to_depth_stem(wide) == []


def test_a_run_with_the_switch_trains_the_stem_and_says_what_it_swapped(tmp_path):
    cfg = with_overrides(
        Config(),
        data={"source": "synthetic", "image_shape": "3x64x64", "synthetic_samples": 10, "augment": "none"},
        model={"name": "resnet18"},
        speed={"device": "cpu", "precision": "fp32", "channels_last": "off", "stem_space_to_depth": "on"},
        run={"batch_size": 4, "epochs": 1, "out_dir": str(tmp_path), "progress": False, "tensorboard": False},
    )
    lines = []
    trainer = Trainer(cfg, CPU, log=lambda *a, **k: lines.append(" ".join(map(str, a))))
    stem = trainer.raw_model.conv1
    assert isinstance(stem, SpaceToDepthConv2d)
    assert any(p is stem.weight for g in trainer.optimizer.param_groups for p in g["params"])
    before = stem.weight.detach().clone()
    trainer.fit()
    assert not torch.equal(stem.weight, before)  # its gradient reached the 7x7 parameter
    assert "stem: conv1 computed on 2x2 blocks of its input (--stem-space-to-depth; as asked)" in lines


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_in_bf16_channels_last_the_blocked_stem_stays_within_rounding_of_the_plain_one():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False)).cuda().to(memory_format=torch.channels_last)
    x = torch.randn(8, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        want = model(x).float()
        space_to_depth_stem(model)
        got = model(x).float()
    # bf16 inputs and products, fp32 sums in another order: a few bf16 steps of the outputs' size
    assert (got - want).abs().max() <= 0.02 * want.abs().max()


def test_auto_is_on_with_cuda_and_off_on_the_cpu_and_an_explicit_choice_stands():
    assert resolve_for_device(Config(), "cuda", bf16_ok=True).speed.stem_space_to_depth == "on"
    assert resolve_for_device(Config(), "cpu", bf16_ok=False).speed.stem_space_to_depth == "off"
    off = with_overrides(Config(), speed={"stem_space_to_depth": "off"})
    assert resolve_for_device(off, "cuda", bf16_ok=True).speed.stem_space_to_depth == "off"
    with pytest.raises(
        ConfigError, match=r"speed.stem_space_to_depth \(--stem-space-to-depth\) = '1': expected one of auto, on, off"
    ):
        with_overrides(Config(), speed={"stem_space_to_depth": "1"})


def test_a_config_written_when_the_switch_was_a_bool_still_loads(tmp_path):
    # session 12's run folders hold `stem_space_to_depth = true/false`; resuming one must not fail on the type
    path = tmp_path / "config.toml"
    path.write_text("[speed]\nstem_space_to_depth = true\n")
    assert load_toml(path).speed.stem_space_to_depth == "on"
    path.write_text("[speed]\nstem_space_to_depth = false\n")
    assert load_toml(path).speed.stem_space_to_depth == "off"
    path.write_text("[speed]\ncompile_tiling = true\n")  # a switch until session 17
    assert load_toml(path).speed.compile_tiling == "on"
    path.write_text('[speed]\ncudnn_benchmark = "on"\n')  # a real bool field still takes only a bool
    with pytest.raises(ConfigError, match=r"cudnn_benchmark \(--cudnn-benchmark\) = 'on': expected true or false"):
        load_toml(path)


def test_asked_for_where_nothing_fits_the_run_says_so_and_the_cpu_default_swaps_nothing(tmp_path):
    base = with_overrides(
        Config(),
        data={"source": "synthetic", "image_shape": "3x32x32", "synthetic_samples": 8, "augment": "none"},
        model={"name": "resnet18"},  # 32 px: the 3x3 stride-1 stem
        speed={"device": "cpu", "precision": "fp32", "channels_last": "off"},
        run={"batch_size": 4, "epochs": 1, "out_dir": str(tmp_path), "progress": False, "tensorboard": False},
    )
    for setting, expected in (("on", True), ("auto", False)):
        lines: list[str] = []
        cfg = with_overrides(base, speed={"stem_space_to_depth": setting})
        trainer = Trainer(cfg, CPU, log=lambda *a, _lines=lines, **k: _lines.append(" ".join(map(str, a))))
        assert not any(isinstance(m, SpaceToDepthConv2d) for m in trainer.raw_model.modules())
        trainer.fit()  # the run's opening lines are written as it starts
        said = any(line.startswith("stem: --stem-space-to-depth changes nothing here") for line in lines)
        assert said is expected, (setting, lines)
    big = with_overrides(base, data={"image_shape": "3x64x64"})  # the 7x7 stem fits, but auto is off on the CPU
    trainer = Trainer(big, CPU, log=lambda *a, **k: None)
    assert trainer.cfg.speed.stem_space_to_depth == "off"
    assert not any(isinstance(m, SpaceToDepthConv2d) for m in trainer.raw_model.modules())
    trainer.close()


def test_the_stem_line_says_what_was_swapped_and_why_and_auto_stays_quiet_where_nothing_was():
    assert stem_line(["conv1"], "auto") == (
        "stem: conv1 computed on 2x2 blocks of its input (--stem-space-to-depth; auto: on with CUDA)"
    )
    assert stem_line(["conv1"], "on").endswith("(--stem-space-to-depth; as asked)")
    assert stem_line([], "auto") == ""  # a ResNet-18 CIFAR run on a GPU: nothing to say
    assert stem_line([], "on").startswith("stem: --stem-space-to-depth changes nothing here")
