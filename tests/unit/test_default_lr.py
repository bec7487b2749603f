"""`--lr auto` (the default): each optimizer's own peak lr, said at the start of the run. One default for all three
trained `--optimizer sgd` at AdamW's 0.002 (75 % on the digits in 3 epochs, 98.5 % at 0.025) without a word.
A typed --lr, a preset's and a file's stand as they were, and a run recorded before keeps the lr it trained at; a
preset's lr beside another --optimizer (typed or a file's), where no lr is asked for, gives way to that optimizer's
own: it was tuned for the preset's optimizer."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

import pytest

from cnnpar.cli import build_parser, main
from cnnpar.cliargs import config_and_set_aside_lr, config_from_args, float_or_auto
from cnnpar.config import DEFAULT_LRS, Config, default_lr_note, from_dict, resolve_for_device
from cnnpar.errors import ConfigError
from cnnpar.presets import get_preset

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


# A preset's lr is tuned for its optimizer; another --optimizer beside it takes its own default (--lr auto)
OTHER_OPTIMIZER = [("cifar10-resnet18", "adamw", "sgd", 0.2), ("cifar10-record", "adamw", "muon", 1.656)]
OTHER_OPTIMIZER += [("cifar10-speed", "adamw", "sgd", 1.5)]


@pytest.mark.parametrize("preset,optimizer,tuned_for,preset_lr", OTHER_OPTIMIZER)
def test_a_presets_lr_is_set_aside_for_another_optimizers_default(preset, optimizer, tuned_for, preset_lr):
    cfg, set_aside = config_and_set_aside_lr(build_parser().parse_args(["train", "--preset", preset,
                                                                        "--optimizer", optimizer]))  # fmt: skip
    assert cfg.optim.lr == 0  # auto: resolved to the optimizer's own, not the preset's lr for another optimizer
    # airbench's bias lr x64 goes with the preset's SGD-style lr: AdamW's biases and norms trained at 64x its lr
    bias = ", as is its bias lr x64 (x1 now)" if get_preset(preset).optim.bias_lr_scale == 64 else ""
    assert set_aside == f"--preset {preset}'s lr {preset_lr:g} is {tuned_for}'s{bias}"
    assert cfg.optim.bias_lr_scale == 1.0
    resolved = resolve_for_device(cfg, "cpu", bf16_ok=True).optim
    # at the preset's own batch, the batch its lr is for (a fixed batch: the default as it is)
    assert resolved.lr == DEFAULT_LRS[optimizer] and resolved.lr_batch == get_preset(preset).optim.lr_batch
    note = default_lr_note(cfg.optim, resolved, set_aside)
    assert note == f"--lr auto: {optimizer}'s default, {DEFAULT_LRS[optimizer]:g} at batch {resolved.lr_batch} " \
                   f"(--preset {preset}'s lr {preset_lr:g} is {tuned_for}'s{bias})"  # fmt: skip
    # the preset's own optimizer, or an lr typed beside it, keeps what is asked
    assert config_and_set_aside_lr(build_parser().parse_args(["train", "--preset", preset, "--optimizer",
                                                              tuned_for])) == (get_preset(preset), "")  # fmt: skip
    typed = _parsed("--preset", preset, "--optimizer", optimizer, "--lr", "0.01")
    assert typed.optim.lr == 0.01


def test_a_preset_whose_lr_is_auto_sets_nothing_aside():
    cfg, set_aside = config_and_set_aside_lr(build_parser().parse_args(["train", "--preset", "mnist",
                                                                        "--optimizer", "sgd"]))  # fmt: skip
    assert (cfg.optim.lr, set_aside) == (0, "")
    assert resolve_for_device(cfg, "cpu", bf16_ok=True).optim.lr == pytest.approx(0.025)


def test_a_config_file_on_a_preset_follows_the_same_rule(tmp_path):
    file = tmp_path / "c.toml"

    def parsed(text: str, *words: str) -> tuple[Config, str]:
        file.write_text(text)
        args = ["train", "--preset", "cifar10-resnet18", "--config", str(file), *words]
        return config_and_set_aside_lr(build_parser().parse_args(args))

    cfg, set_aside = parsed('[optim]\noptimizer = "adamw"\n')  # another optimizer, no lr: adamw's own
    assert (cfg.optim.optimizer, cfg.optim.lr) == ("adamw", 0)
    assert set_aside == "--preset cifar10-resnet18's lr 0.2 is sgd's"
    assert resolve_for_device(cfg, "cpu", bf16_ok=True).optim.lr == pytest.approx(0.002)
    assert parsed("[optim]\nweight_decay = 0.01\n", "--optimizer", "adamw")[0].optim.lr == 0  # typed beside it
    for text, typed in (
        ('[optim]\noptimizer = "adamw"\nlr = 0.01\n', ()),
        ("[optim]\nlr = 0.01\n", ("--optimizer", "adamw")),
    ):
        assert parsed(text, *typed)[0].optim.lr == 0.01  # the file's lr stands, with its optimizer or a typed one
        assert parsed(text, *typed)[1] == ""
    assert parsed('[optim]\noptimizer = "sgd"\n')[0].optim.lr == 0.2  # the preset's own optimizer: its lr
    assert parsed('[optim]\noptimizer = "adamw"\n', "--optimizer", "sgd")[0].optim.lr == 0.2


def test_the_lr_line_says_why_and_a_resume_keeps_the_stored_lr(tmp_path, capsys):
    words = ["train", "--preset", "cifar10-resnet18", "--optimizer", "adamw", "--data", "synthetic"]
    words += ["--image-shape", "3x8x8", "--synthetic-samples", "128", "--batch-size", "32", "--device", "cpu"]
    words += ["--max-steps", "1", "--no-progress", "--no-tensorboard", "--workers", "0"]
    words += ["--out-dir", str(tmp_path), "--name", "r"]
    assert main([*words, "--epochs", "1"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("batch "))
    # a fixed --batch-size trains at the default as it is, as at a typed lr
    assert line.endswith("lr 0.002 (not scaled with the world size: --lr-scaling none); --lr auto: adamw's "
                         "default, 0.002 at batch 512 (--preset cifar10-resnet18's lr 0.2 is sgd's)")  # fmt: skip
    record = tmp_path / "r" / "config.toml"
    assert "# requested: optim.lr = auto\n" in record.read_text()
    assert tomllib.loads(record.read_text())["optim"]["lr"] == 0.002
    # the same command resumed: the run's own record, its lr; the preset is not used, so nothing set aside
    assert main([*words, "--epochs", "2", "--resume", "auto"]) == 0
    out = capsys.readouterr().out
    assert "lr 0.002 (not scaled" in out and "is sgd's" not in out
    assert tomllib.loads(record.read_text())["optim"]["lr"] == 0.002


@pytest.mark.parametrize("preset,optimizer", [("cifar10-speed", "muon"), ("cifar10-record", "sgd")])
def test_sgd_and_muon_keep_each_others_preset_lr(preset, optimizer):
    # muon's --lr drives its SGD groups: the same kind of lr as sgd's (the two presets train one model at 1.5, 1.656)
    cfg, set_aside = config_and_set_aside_lr(build_parser().parse_args(["train", "--preset", preset,
                                                                        "--optimizer", optimizer]))  # fmt: skip
    assert (cfg.optim.optimizer, cfg.optim.lr, set_aside) == (optimizer, get_preset(preset).optim.lr, "")


def test_a_bias_lr_scale_typed_beside_a_set_aside_preset_lr_stands():
    cfg, set_aside = config_and_set_aside_lr(build_parser().parse_args(["train", "--preset", "cifar10-speed",
                                                                        "--optimizer", "adamw", "--bias-lr-scale",
                                                                        "8"]))  # fmt: skip
    assert (cfg.optim.lr, cfg.optim.bias_lr_scale) == (
        0,
        8.0,
    ) and set_aside == "--preset cifar10-speed's lr 1.5 is sgd's"
    # the preset's own optimizer keeps its bias lr, as its lr
    assert config_from_args(build_parser().parse_args(["train", "--preset", "cifar10-speed"])).optim.bias_lr_scale == 64
