"""Issue 8 pieces that run on the CPU: tune, the whitened stem, flip TTA, byte-only folder decoding."""

from __future__ import annotations

import csv
import tomllib
import types

import pytest
import torch

from cnnpar.config import Config, ConfigError, SpeedConfig, from_dict, resolve_for_device
from cnnpar.engine.step import eval_batch
from cnnpar.models import build_model
from cnnpar.parallel import Precision


def test_cuda_graphs_on_a_cpu_is_refused_with_the_field_name():
    with pytest.raises(ConfigError, match="cuda_graphs"):
        resolve_for_device(Config(speed=SpeedConfig(cuda_graphs="on")), "cpu", True)


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


def test_flip_tta_averages_the_logits_of_image_and_mirror():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(2 * 4 * 4, 3))
    x = torch.randn(5, 2, 4, 4)
    y = torch.tensor([0, 1, 2, 0, 1])
    prec = Precision("fp32", torch.device("cpu"))
    loss, _ = eval_batch(model, x, y, prec, tta_flip=True)
    want = torch.nn.functional.cross_entropy(0.5 * (model(x) + model(x.flip(-1))), y, reduction="sum")
    assert torch.allclose(loss.float(), want, atol=1e-5)


def test_tune_writes_a_config_that_train_accepts(cli):
    out = cli.cwd / "tuned.toml"
    # budget 0: the start point is measured, every switch after it is listed as skipped; the
    # search itself is checked with a fake clock below, so nothing here depends on machine speed
    res = cli("tune", "--budget-s", "0", "--steps", "2", "--repeats", "1", "--batch-size", "32", "--out", str(out))
    assert res.returncode == 0, res.stderr
    cfg = from_dict(tomllib.loads(out.read_text()))  # a valid config tree, every field checked
    assert cfg.model.name == "cnn3" and cfg.run.batch_size == 32
    rows = list(csv.DictReader((cli.cwd / "tuned.csv").open()))
    assert rows[0]["switch"] == "start" and float(rows[0]["images_per_s"]) > 0
    assert len(rows) >= 3 and all(r["status"] == "skipped" for r in rows[1:])
    assert "time budget spent" in rows[1]["error"]
    train = cli("train", "--config", str(out), "--epochs", "1", "--max-steps", "2", "--no-progress")
    assert train.returncode == 0, train.stderr


def test_tune_keeps_only_clear_gains_and_skips_what_the_budget_leaves(monkeypatch):
    import cnnpar.bench.tune as tune_mod
    from cnnpar.dist import DistInfo

    clock = [0.0]
    rates = {("fp32", True, 32): 100.0}  # (precision, channels_last, batch) -> img/s of the fake run
    rates[("bf16", True, 32)] = 150.0  # a clear gain: kept
    rates[("bf16", False, 32)] = 151.0  # within the 3 % margin: not kept

    def fake_measure(cfg, info, bundle, steps, repeats):
        clock[0] += 1.0  # each measurement costs one fake second
        return rates[(cfg.speed.precision, cfg.speed.channels_last == "on", cfg.run.batch_size)], 0.1

    monkeypatch.setattr(tune_mod, "measure", fake_measure)
    monkeypatch.setattr(tune_mod, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    start = Config(speed=SpeedConfig(precision="fp32", channels_last="on", compile="off"))
    start = tune_mod.with_switch(start, "run", "batch_size", 32)
    best, trials = tune_mod.tune(start, DistInfo(0, 0, 1, torch.device("cpu")), budget_s=2.5, log=lambda *a: None)
    assert [(t.switch, t.value, t.status) for t in trials[:3]] == [
        ("start", "resolved defaults", "ok"),
        ("precision", "bf16", "kept"),
        ("channels_last", "off", "ok"),
    ]
    assert best.speed.precision == "bf16" and best.speed.channels_last == "on"
    assert trials[3:] and all(t.status == "skipped" and t.images_per_s is None for t in trials[3:])


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
