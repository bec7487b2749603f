"""Issue 8 pieces that run on the CPU: the whitened stem, flip TTA, byte-only folder decoding (tune: test_tune.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from cnnpar.config import Config, ConfigError, SpeedConfig, resolve_for_device
from cnnpar.engine.step import eval_batch
from cnnpar.models import build_model
from cnnpar.parallel import Precision

pytestmark = pytest.mark.usefixtures("one_thread")  # one intra-op thread for the in-process runs (conftest)


def test_cuda_graphs_on_a_cpu_is_refused_with_the_field_name():
    with pytest.raises(ConfigError, match=r"speed\.cuda_graphs \(--cuda-graphs\) = 'on' needs a CUDA device \(on cpu"):
        resolve_for_device(Config(speed=SpeedConfig(cuda_graphs="on")), "cpu", True)


def test_tf32_on_a_cpu_is_refused_rather_than_run_as_fp32_under_its_name():
    with pytest.raises(
        ConfigError, match=r"speed\.precision \(--precision\) = 'tf32' needs a CUDA device \(on cpu: expected fp32"
    ):
        resolve_for_device(Config(speed=SpeedConfig(precision="tf32")), "cpu", True)
    assert resolve_for_device(Config(speed=SpeedConfig(precision="tf32")), "cuda", True).speed.precision == "tf32"


def test_switches_that_would_not_run_are_refused_rather_than_recorded_as_on():
    """On a CPU, pinned memory and the prefetch stream do nothing; with compile off, compile tiling and tuning do
    nothing. Each was accepted and stored as "on" in config.toml (and the doctor's report) though it never ran."""
    from cnnpar.config import DataConfig

    for data in (DataConfig(pin_memory="on"), DataConfig(prefetch_stream="on")):
        with pytest.raises(
            ConfigError, match=r"data\.\w+ \(--[\w-]+\) = 'on' needs a CUDA device \(on cpu: expected auto or off\)"
        ):
            resolve_for_device(Config(data=data), "cpu", True)
        on_cuda = resolve_for_device(Config(data=data), "cuda", True).data
        assert "on" in (on_cuda.pin_memory, on_cuda.prefetch_stream)
    for speed in (SpeedConfig(compile_tiling="on"), SpeedConfig(compile_tuning="on")):
        with pytest.raises(
            ConfigError,
            match=r"speed\.compile_t\w+ \(--compile-t\w+\) = 'on' tunes torch\.compile's kernels, and compile is off",
        ):
            resolve_for_device(Config(speed=speed), "cpu", True)  # compile auto: off on a CPU
        on = replace(speed, compile="default")
        assert resolve_for_device(Config(speed=on), "cpu", True).speed.compile == "default"


def test_cuda_graphs_auto_resolves_on_with_cuda_and_off_on_a_cpu():
    assert resolve_for_device(Config(), "cuda", True).speed.cuda_graphs == "on"
    assert resolve_for_device(Config(), "cpu", True).speed.cuda_graphs == "off"


def test_whitened_stem_decorrelates_patches():
    torch.manual_seed(0)
    base = torch.randn(256, 3, 16, 16)
    x = base + 0.8 * base.roll(1, dims=1)  # correlated channels
    model = build_model("fastnet", 3, 10, 32)
    model.init_from_data(x)
    with torch.no_grad():
        out = torch.nn.functional.conv2d(x, model.stem.weight[:12], None)
    feats = out.permute(0, 2, 3, 1).reshape(-1, 12)
    cov = torch.cov(feats.T)
    off_diag = cov - torch.diag(torch.diag(cov))
    assert off_diag.abs().max() < 0.05 * torch.diag(cov).mean()
    assert torch.allclose(model.stem.weight[12:24], -model.stem.weight[:12])


def test_the_stem_is_whitened_from_a_folder_as_from_the_same_images_in_memory(tmp_path):
    """fastnet's stem is initialised from the training images whatever holds them: from a folder of PNGs, as from
    the same images in an npz, its filters decorrelate the 2x2 patches of the images as the model sees them (a
    folder once kept the random init, which --whiten-frozen then froze)."""
    import numpy as np
    from PIL import Image

    from cnnpar.config import Config, DataConfig, ModelConfig, RunConfig
    from cnnpar.dist import DistInfo
    from cnnpar.engine.trainer import Trainer

    g = torch.Generator().manual_seed(0)
    base = torch.rand(48, 3, 16, 16, generator=g)
    x = ((base + 0.8 * base.roll(1, dims=1)) / 1.8 * 255).to(torch.uint8)  # correlated channels
    y = torch.arange(48) % 2
    for i in range(48):
        (tmp_path / "pics" / f"c{y[i]}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(x[i].permute(1, 2, 0).numpy()).save(tmp_path / "pics" / f"c{y[i]}" / f"{i:02d}.png")
    np.savez(tmp_path / "same.npz", x_train=x.permute(0, 2, 3, 1).numpy(), y_train=y.numpy())
    for name in ("pics", "same.npz"):
        cfg = Config(
            data=DataConfig(source=str(tmp_path / name), val_fraction=0.0, workers=0),
            model=ModelConfig(name="fastnet"),
            speed=SpeedConfig(device="cpu"),
            run=RunConfig(epochs=1, batch_size=16, out_dir=str(tmp_path / "runs"), name=name, progress=False),
        )
        trainer = Trainer(cfg, DistInfo(0, 0, 1, torch.device("cpu")), log=lambda *a, **k: None)
        seen = trainer._normalised_sample()
        assert len(seen) == 48
        stem = trainer.raw_model.stem.weight.detach()
        assert torch.allclose(stem[12:24], -stem[:12]), name  # the whitening's +/- pairs, not a random init
        with torch.no_grad():
            feats = torch.nn.functional.conv2d(seen, stem[:12]).permute(0, 2, 3, 1).reshape(-1, 12)
        cov = torch.cov(feats.T)
        off_diag = cov - torch.diag(torch.diag(cov))
        assert off_diag.abs().max() < 0.05 * torch.diag(cov).mean(), name


def test_flip_tta_averages_the_logits_of_image_and_mirror():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(2 * 4 * 4, 3))
    x = torch.randn(5, 2, 4, 4)
    y = torch.tensor([0, 1, 2, 0, 1])
    prec = Precision("fp32", torch.device("cpu"))
    loss, _ = eval_batch(model, x, y, prec, tta_flip=True)
    want = torch.nn.functional.cross_entropy(0.5 * (model(x) + model(x.flip(-1))), y, reduction="sum")
    assert torch.allclose(loss.float(), want, atol=1e-5)


def test_folder_decoded_from_bytes_on_the_device_path(cli, tmp_path):
    from torchvision.io import write_jpeg, write_png

    from cnnpar.data.tv_codecs import tv_codecs

    for i in range(8):
        (tmp_path / "pics" / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        img = (torch.rand(3, 40 + i, 50) * 255).to(torch.uint8)
        path = tmp_path / "pics" / f"c{i % 2}" / f"{i}"
        with tv_codecs():  # torchvision 0.29's codec notice, known: docs/decoding.md
            write_jpeg(img, f"{path}.jpg") if i % 3 else write_png(img, f"{path}.png")
    args = [
        "train",
        "--data",
        "pics",
        "--decode",
        "gpu",
        "--image-size",
        "16",
        "--epochs",
        "1",
        "--batch-size",
        "4",
        "--workers",
        "1",
        "--no-progress",
    ]
    ok = cli(*args)
    assert ok.returncode == 0, ok.stderr
    batched = cli(*args, "--gpu-resize", "batched", "--name", "batched")  # the switch reaches the decoder
    assert batched.returncode == 0, batched.stderr
    (tmp_path / "pics" / "c0" / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    bad = cli(*args, "--val-fraction", "0", "--name", "bad")
    assert bad.returncode == 2
    assert "broken.jpg" in bad.stderr and "Traceback" not in bad.stderr


def test_a_gpu_decoder_asked_for_on_a_cpu_says_what_decodes_there(tmp_path):
    """`--decode gpu` on a CPU printed "torchvision nvJPEG on the device" while libjpeg-turbo decoded on the CPU."""
    from PIL import Image

    from cnnpar.config import DataConfig
    from cnnpar.data import load_data
    from cnnpar.data.loader import decode_line
    from cnnpar.dist import DistInfo

    for k in range(4):
        (tmp_path / f"c{k % 2}").mkdir(exist_ok=True)
        Image.new("RGB", (20, 20), (k, 9, 9)).save(tmp_path / f"c{k % 2}" / f"{k}.jpg")
    cfg = Config(data=DataConfig(source=str(tmp_path), decode="gpu", val_fraction=0.0))
    line = decode_line(cfg, load_data(cfg.data, 0), DistInfo(0, 0, 1, torch.device("cpu")))
    assert line.startswith("decode: gpu (the nvJPEG path without CUDA: torchvision decodes with libjpeg-turbo on")
