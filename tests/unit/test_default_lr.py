"""`--lr auto` (the default): each optimizer's own peak lr, said at the start of the run. One default for all three
trained `--optimizer sgd` at AdamW's 0.002 (75 % on the digits in 3 epochs, 98.5 % at 0.025) without a word.
A typed --lr, a preset's and a file's stand as they were, and a run recorded before keeps the lr it trained at."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

import pytest

from cnnpar.cli import build_parser, main
from cnnpar.cliargs import config_from_args, float_or_auto
from cnnpar.config import DEFAULT_LRS, Config, from_dict, resolve_for_device
from cnnpar.errors import ConfigError

QUICK = ["--data", "synthetic", "--image-shape", "1x8x8", "--synthetic-samples", "128", "--device", "cpu"]
QUICK += ["--epochs", "1", "--max-steps", "1", "--no-progress", "--no-tensorboard"]


def _parsed(*words: str) -> Config:
    return config_from_args(build_parser().parse_args(["train", *words]))


def _resolved(*words: str) -> Config:
    return resolve_for_device(_parsed(*words), "cpu", bf16_ok=True)


@pytest.mark.parametrize("optimizer,lr", [("adamw", 0.002), ("sgd", 0.025), ("muon", 0.025)])
def test_each_optimizer_trains_at_its_own_default_lr(optimizer, lr):
    asked = _parsed("--optimizer", optimizer)
    assert asked.optim.lr == 0  # auto, until the run resolves it
    assert DEFAULT_LRS[optimizer] == lr
    assert _resolved("--optimizer", optimizer).optim.lr == pytest.approx(lr)  # at the CPU's batch 64: as it is
    # --batch-size auto scales it from --lr-batch as it scales a typed lr: linear for sgd, square root for adamw
    half = _resolved("--optimizer", optimizer, "--lr-batch", "128").optim.lr
    assert half == pytest.approx(lr * (0.5**0.5 if optimizer == "adamw" else 0.5))


def test_a_typed_lr_a_presets_and_a_files_stand_as_they_were(tmp_path):
    assert _resolved("--optimizer", "sgd", "--lr", "0.002").optim.lr == 0.002
    assert _resolved("--lr", "0.3").optim.lr == 0.3
    preset = _parsed("--preset", "cifar10-resnet18", "--batch-size", "512")
    assert (preset.optim.optimizer, preset.optim.lr) == ("sgd", 0.2)
    assert _parsed("--preset", "cifar10-speed").optim.lr == 1.5
    file = tmp_path / "c.toml"
    file.write_text('[optim]\noptimizer = "sgd"\nlr = 0.01\n')
    assert _resolved("--config", str(file)).optim.lr == 0.01
    file.write_text('[optim]\noptimizer = "sgd"\nlr = "auto"\n')  # a file may ask for auto as the flag does
    assert _resolved("--config", str(file)).optim.lr == pytest.approx(0.025)


def test_lr_auto_is_typed_as_a_word_and_a_typed_zero_is_refused(capsys):
    assert _parsed("--optimizer", "sgd", "--lr", "auto").optim.lr == 0
    assert float_or_auto("AUTO") == 0.0 and float_or_auto("0.1") == 0.1
    for bad, why in (("0", "expected a number > 0 or auto"), ("fast", "expected a number or auto")):
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            float_or_auto(bad)
    with pytest.raises(ConfigError, match=r'optim.lr \(--lr\) = \[1\]: expected a number or "auto"'):
        from_dict({"optim": {"lr": [1]}})
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help's lines
    assert "--lr LR|auto" in help_text and "adamw 0.002, sgd 0.025" in help_text and "(default: auto)" in help_text


def test_the_start_line_says_the_lr_is_the_optimizers_default(tmp_path, capsys):
    assert main(["train", *QUICK, "--out-dir", str(tmp_path), "--name", "auto", "--optimizer", "sgd"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("batch "))
    assert line.endswith("lr 0.025 (not scaled with the world size: --lr-scaling none); --lr auto: sgd's default, "
                         "0.025 at batch 64")  # fmt: skip
    record = (tmp_path / "auto" / "config.toml").read_text()
    assert "# requested: optim.lr = auto\n# resolved: optim.lr = 0.025\n" in record
    assert tomllib.loads(record)["optim"]["lr"] == 0.025
    typed = ["--name", "typed", "--optimizer", "sgd", "--lr", "0.025"]
    assert main(["train", *QUICK, "--out-dir", str(tmp_path), *typed]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("batch "))
    assert "--lr auto" not in line and "lr 0.025 (not scaled" in line  # a typed lr is the user's: nothing to say


def _old_style_record(tmp_path: Path) -> Path:
    """A `--optimizer sgd` run without --lr as cnnpar wrote it before --lr auto: it trained at the one default,
    0.002, and its record stores that lr with no `# requested:` line for it (0.002 asked, 0.002 resolved). A run
    typed `--lr 0.002` now writes the same record."""
    assert main(["train", *QUICK, "--out-dir", str(tmp_path), "--name", "old", "--optimizer", "sgd",
                 "--lr", "0.002"]) == 0  # fmt: skip
    record = (tmp_path / "old" / "config.toml").read_text()
    assert "optim.lr " not in record and tomllib.loads(record)["optim"]["lr"] == 0.002
    return tmp_path / "old"


def test_a_resumed_run_recorded_before_the_default_changed_keeps_its_lr(tmp_path, capsys):
    run = _old_style_record(tmp_path)
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--epochs", "2", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "lr 0.002 (not scaled" in out and "--lr auto" not in out and "--lr 0.002 -> " not in out
    assert tomllib.loads((run / "config.toml").read_text())["optim"]["lr"] == 0.002
    # a search asked for again goes back to the lr the run asked for, which was 0.002, not the new default
    assert main(["train", "--resume", str(run), "--epochs", "3", "--no-progress", "--batch-size", "auto"]) == 0
    assert tomllib.loads((run / "config.toml").read_text())["optim"]["lr"] == 0.002


def test_a_record_re_run_with_another_optimizer_takes_that_optimizers_default(tmp_path):
    assert main(["train", *QUICK, "--out-dir", str(tmp_path), "--name", "r", "--optimizer", "sgd"]) == 0
    record = str(tmp_path / "r" / "config.toml")
    assert _parsed("--config", record).optim.lr == 0.025  # the same optimizer: the lr it trained at
    other = _parsed("--config", record, "--optimizer", "adamw")
    assert other.optim.lr == 0  # auto again: AdamW's own, not sgd's 0.025
    assert resolve_for_device(other, "cpu", bf16_ok=True).optim.lr == pytest.approx(0.002)
    typed = _old_style_record(tmp_path / "old")  # an lr the run was given stays, whatever the optimizer
    assert _parsed("--config", str(typed / "config.toml"), "--optimizer", "adamw").optim.lr == 0.002


def test_the_divergence_hint_halves_the_optimizers_default_and_tune_scales_it():
    from cnnpar.bench.tune import batch_lr
    from cnnpar.engine.trainer import Trainer

    hint = Trainer._half_the_lr.__get__(argparse.Namespace(requested_cfg=_parsed("--optimizer", "sgd")))
    assert hint() == "--lr 0.0125"
    lr, note = batch_lr(_parsed("--optimizer", "sgd"), 4)  # a batch 4x larger: linear for SGD
    assert lr == pytest.approx(0.1) and note.startswith("lr 0.025 -> 0.1")
