"""What a preset brings to the start of a run: its lr read at the batch it was tuned for when --batch-size auto
picks another, the augmentation it trains with (and a warning where that mirrors grey digits), and its --data
named as its own when the file is missing."""

from __future__ import annotations

import numpy as np
import pytest

from cnnpar.cli import build_parser, main
from cnnpar.cliargs import config_from_args
from cnnpar.config import Config, load_toml, resolve_for_device
from cnnpar.presets import cifar10_record, cifar10_resnet18, cifar10_speed, get_preset, with_overrides

pytestmark = pytest.mark.usefixtures("one_thread")
TINY = ["--device", "cpu", "--max-steps", "1", "--epochs", "1", "--no-progress", "--no-tensorboard"]


def _parsed(*words: str) -> Config:
    return config_from_args(build_parser().parse_args(["train", *words]))


# ---- 1. the lr is scaled from the batch it was tuned for ---------------------------------------------------------
def test_a_presets_lr_is_scaled_from_its_own_batch_on_the_cpus_auto_batch():
    """`--preset cifar10-resnet18 --batch-size auto` trained at lr 0.2 at batch 64: the lr tuned for 512."""
    cfg = _parsed("--preset", "cifar10-resnet18", "--batch-size", "auto")
    assert (cfg.run.batch_size, cfg.optim.lr, cfg.optim.lr_batch) == (0, 0.2, 512)
    cpu = resolve_for_device(cfg, "cpu", bf16_ok=False)
    assert cpu.run.batch_size == 64 and cpu.optim.lr == pytest.approx(0.025) and cpu.optim.lr_batch == 512
    speed = resolve_for_device(_parsed("--preset", "cifar10-speed", "--batch-size", "auto"), "cpu", bf16_ok=False)
    assert speed.optim.lr == pytest.approx(1.5 * 64 / 1024)
    # as the presets train them, nothing changes; nor for the defaults' auto (lr 0.002 at batch 64)
    fixed = resolve_for_device(cifar10_resnet18(), "cuda", bf16_ok=True)
    assert (fixed.run.batch_size, fixed.optim.lr, fixed.optim.lr_batch) == (512, 0.2, 512)
    default = resolve_for_device(Config(), "cpu", bf16_ok=False)
    assert (default.run.batch_size, default.optim.lr, default.optim.lr_batch) == (64, 0.002, 64)


def test_every_preset_with_a_fixed_batch_names_it_as_its_lrs_batch():
    for make in (cifar10_resnet18, cifar10_speed, cifar10_record):
        cfg = make()
        assert cfg.optim.lr_batch == cfg.run.batch_size, make.__name__
    for name in ("mnist", "throughput"):
        assert get_preset(name).optim.lr_batch == get_preset(name).run.batch_size, name


def test_muons_lr_drives_sgd_groups_and_follows_the_batch_linearly():
    """--optimizer muon was scaled by the square root (AdamW's rule); its --lr is the SGD groups' lr."""
    from cnnpar.config import batch_lr_factor

    assert batch_lr_factor("muon", 4000, 2000) == 2.0 and batch_lr_factor("sgd", 512) == 8.0
    assert batch_lr_factor("adamw", 256) == pytest.approx(2.0)
    from cnnpar.engine.batch_size import lr_line

    assert lr_line("muon", 1.656, 2000, 1000) == (
        "lr 1.656 at batch 2000 x linear (Muon's SGD groups; --muon-lr not scaled) of 1000/2000 = 0.828"
    )


def test_the_searched_batch_scales_a_presets_lr_from_the_presets_batch(monkeypatch, tmp_path):
    """The GPU's search (faked: auto stays 0 on the CPU as on a GPU) chose 256 for a preset tuned at 512: the lr
    is halved, not multiplied by 256/64, and the start of the run says from which batch."""
    import cnnpar.config as config
    import cnnpar.engine.trainer as trainer_mod
    from cnnpar.dist import init_distributed
    from cnnpar.engine.batch_size import BatchChoice

    monkeypatch.setattr(config, "resolve_batch_size", lambda batch, device_type: batch)
    monkeypatch.setattr(trainer_mod, "search_on_device", lambda *a, **k: BatchChoice(256, "faked"))
    cfg = with_overrides(
        cifar10_resnet18(),
        data={"source": "synthetic", "image_shape": "3x8x8", "synthetic_samples": 512},
        model={"name": "cnn3"},
        speed={"device": "cpu"},
        run={"batch_size": 0, "epochs": 1, "out_dir": str(tmp_path), "name": "r", "progress": False},
    )
    tr = trainer_mod.Trainer(cfg, init_distributed("cpu", debug_single=True), log=lambda *a, **k: None)
    try:
        assert tr.cfg.run.batch_size == 256 and tr.cfg.optim.lr == pytest.approx(0.1)
        assert tr.batch_line.endswith("lr 0.2 at batch 512 x linear (SGD) of 256/512 = 0.1")
    finally:
        tr.close()


def test_a_records_fixed_batch_is_what_its_lr_is_scaled_from_with_batch_size_auto(tmp_path, capsys):
    """A run at a fixed batch 32 stores the batch its lr trained at; `--config` of it with `--batch-size auto`
    scaled that lr as if it were the lr at batch 64 (no `# requested:` line to go back to)."""
    common = [*TINY, "--out-dir", str(tmp_path)]
    assert main(["train", *common, "--batch-size", "32", "--lr", "0.01", "--optimizer", "sgd", "--name", "r"]) == 0
    record = tmp_path / "r" / "config.toml"
    assert load_toml(record).optim.lr_batch == 32
    capsys.readouterr()
    again = _parsed("--config", str(record), "--batch-size", "auto")
    assert (again.run.batch_size, again.optim.lr, again.optim.lr_batch) == (0, 0.01, 32)
    assert resolve_for_device(again, "cpu", bf16_ok=False).optim.lr == pytest.approx(0.02)
    assert main(["train", *common, "--config", str(record), "--batch-size", "auto", "--name", "r2"]) == 0
    out = capsys.readouterr().out
    assert "batch size auto: 64 (the CPU's); lr 0.01 at batch 32 x linear (SGD) of 64/32 = 0.02" in out
    second = load_toml(tmp_path / "r2" / "config.toml")
    assert (second.run.batch_size, second.optim.lr, second.optim.lr_batch) == (64, pytest.approx(0.02), 32)


# ---- 2. the augmentation is said, and mirrored digits warned about --------------------------------------------------
def test_the_start_says_the_augmentation_and_warns_where_a_flip_meets_the_digits(tmp_path, capsys):
    common = [*TINY, "--out-dir", str(tmp_path)]
    assert main(["train", *common, "--augment", "crop+flip", "--name", "flip"]) == 0
    out = capsys.readouterr().out
    data = next(ln for ln in out.splitlines() if ln.startswith("data: "))
    assert data.endswith("; augment crop+flip"), data
    warning = [ln for ln in out.splitlines() if ln.startswith("warning: augment crop+flip mirrors")]
    assert len(warning) == 1 and "scikit-learn digits" in warning[0] and "--augment none" in warning[0]
    assert main(["train", *common, "--name", "auto"]) == 0  # auto: none for grey digits, and no warning
    out = capsys.readouterr().out
    assert "; augment none" in out and "warning: augment" not in out


def test_the_start_names_the_random_resized_crop_of_photos(tmp_path, capsys):
    """Photos are cropped where they are decoded: `augment flip` alone hid the random-resized crop."""
    from tests.datafiles import write_image_folder

    photos = write_image_folder(tmp_path / "photos", per_class=4)
    common = [*TINY, "--out-dir", str(tmp_path), "--data", str(photos), "--image-size", "16", "--model", "cnn3"]
    assert main(["train", *common, "--name", "auto"]) == 0
    out = capsys.readouterr().out
    assert next(ln for ln in out.splitlines() if ln.startswith("data: ")).endswith(
        "; augment random-resized crop (25-100 % of the area, --crop-min-scale) + flip"
    )


def test_a_flip_warns_only_where_auto_would_not_flip():
    from cnnpar.data.transforms import mirror_warning

    assert mirror_warning("translate+altflip", (1, 16, 16), False, "digits")
    assert mirror_warning("flip", (1, 28, 28), False, "mnist.npz")
    assert not mirror_warning("crop", (1, 16, 16), False, "digits")  # no mirror
    assert not mirror_warning("crop+flip", (3, 32, 32), False, "cifar10.npz")  # colour arrays: auto flips too
    assert not mirror_warning("flip", (1, 64, 64), True, "photos/")  # photos with the loader's crops: auto flips


def test_mirrored_test_time_views_warn_where_auto_would_not_flip(tmp_path, capsys):
    """--tta-level flip on the digits scored far below the same model without it, and nothing said so."""
    from cnnpar.data.transforms import tta_mirror_warning

    assert tta_mirror_warning("flip+translate", (1, 16, 16), False, "digits").startswith(
        "warning: test-time views flip+translate mirror the 1-channel images of digits"
    )
    assert not tta_mirror_warning("none", (1, 16, 16), False, "digits")
    assert not tta_mirror_warning("flip", (3, 32, 32), False, "cifar10.npz")
    assert main(["train", *TINY, "--out-dir", str(tmp_path), "--tta-level", "flip"]) == 0
    assert "warning: test-time views flip mirror the 1-channel images of" in capsys.readouterr().out


# ---- 3. a preset's missing --data says it is the preset's --------------------------------------------------------
def test_a_presets_missing_data_names_the_preset_and_a_typed_path_does_not(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--preset", "cifar10-speed", "--epochs", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("cnnpar: error: .devdata/cifar10.npz: file not found (the --data of --preset cifar10-speed: ")
    for typed in (".devdata/cifar10.npz", "other.npz"):  # typed: as before, even the preset's own path
        assert main(["train", "--preset", "cifar10-speed", "--data", typed]) == 2
        assert capsys.readouterr().err.strip() == f"cnnpar: error: {typed}: file not found"
    # the doctor and the bench load the preset's data as train does, and say the same
    for command in (["doctor"], ["bench"]):
        assert main([*command, "--preset", "mnist"]) == 2, command
        err = capsys.readouterr().err.strip()
        assert err.startswith("cnnpar: error: mnist.npz: file not found (the --data of --preset mnist: "), err


def test_a_presets_data_trains_and_resumes_as_a_plain_path(tmp_path, monkeypatch):
    """A preset's data found where it names it trains, and the run resumes from its record."""
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 255, (160, 8, 8), dtype=np.uint8), np.arange(160) % 10
    np.savez("mnist.npz", x_train=x[:128], y_train=y[:128], x_test=x[128:], y_test=y[128:])
    assert main(["train", "--preset", "mnist", *TINY, "--name", "m"]) == 0
    assert load_toml(tmp_path / "runs" / "m" / "config.toml").data.source == "mnist.npz"
    assert main(["train", "--resume", "runs/m", "--epochs", "2", "--no-progress"]) == 0


def test_the_cpus_automatic_batch_is_said_where_the_lr_needs_no_scaling(tmp_path, capsys):
    """The CPU's 64 was announced only where the lr was scaled to it: the default run chose it without a word."""
    common = [*TINY, "--out-dir", str(tmp_path), "--name", "auto", "--data", "synthetic", "--synthetic-samples", "256"]
    assert main(["train", *common]) == 0
    out = capsys.readouterr().out
    assert "batch size auto: 64 (the CPU's fixed size: a GPU's is searched, a CPU's not)" in out
    assert main(["train", *TINY, "--out-dir", str(tmp_path), "--name", "typed", "--batch-size", "32"]) == 0
    assert "batch size auto" not in capsys.readouterr().out  # typed: no choice to explain
