"""Messages that misled users (an audit): help defaults, help that left out what a flag does, TOML "auto", range
errors without the flag, a misspelt model found late, a batch larger than the data reported as it was asked."""

from __future__ import annotations

import argparse
import json
import tomllib
from dataclasses import fields

import numpy as np
import pytest

from cnnpar import cli, dist
from cnnpar.config import Config, DataConfig, ModelConfig, load_toml
from cnnpar.data.sources import load_data
from cnnpar.data.transforms import resolve_augment
from cnnpar.errors import ConfigError

QUICK = ["--epochs", "1", "--max-steps", "1", "--no-progress", "--no-tensorboard"]


def _train_actions() -> dict[str, argparse.Action]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: a for a in sub.choices["train"]._actions}


def _help(section: str, name: str) -> str:
    return next(f for f in fields(getattr(Config(), section)) if f.name == name).metadata["help"]


# 1. --help of a 0-means-auto field


def test_auto_fields_show_auto_as_their_default_in_help_not_0():
    actions = _train_actions()
    auto = [
        f"{sec}.{f.name}"
        for sec in ("data", "model", "optim", "speed", "dist", "run")
        for f in fields(getattr(Config(), sec))
        if f.metadata.get("auto_zero")
    ]
    assert "run.batch_size" in auto and "optim.lr_batch" in auto
    for dest in auto:
        text = actions[dest].help
        assert text.endswith("(default: auto)"), (dest, text)
        assert "(default: 0)" not in text
    assert actions["run.epochs"].help.endswith("(default: 6)")  # the other fields keep their value


def test_name_help_states_its_default_once_as_the_name_it_makes():
    """--name read "(default: model-date, or the torchrun job id) (default: '')": two defaults, one of them ''."""
    text = _train_actions()["run.name"].help
    assert text.count("default") == 1 and "(default: '')" not in text
    assert text.endswith("(default: MODEL-YYYYMMDD-HHMMSS, or MODEL-JOBID under a torchrun job id: a new folder)")
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert "MODEL-JOBID under a torchrun job id" in " ".join(sub.choices["train"].format_help().split())


# 2. --image-size and --augment say what they do


def test_image_size_help_names_every_source_it_resizes():
    text = _help("data", "image_size")
    for source in ("folders", "stores", "CSV", ".npz", "synthetic", "digits"):
        assert source in text, source


def test_image_size_resizes_synthetic_npz_and_digits_as_the_help_says(tmp_path):
    assert load_data(DataConfig(source="synthetic", synthetic_samples=20, image_size=8)).shape == (3, 8, 8)
    path = tmp_path / "a.npz"
    rng = np.random.default_rng(0)
    np.savez(path, x_train=rng.integers(0, 255, (20, 12, 12), dtype=np.uint8), y_train=np.arange(20) % 2)
    assert load_data(DataConfig(source=str(path), image_size=6)).shape == (1, 6, 6)
    assert load_data(DataConfig(image_size=10)).shape == (1, 10, 10)
    assert load_data(DataConfig()).shape == (1, 16, 16)  # 0: the digits' 16, as the help says


def test_augment_help_says_what_auto_picks():
    text = _help("data", "augment")
    assert "auto: crop+flip for colour (3-channel) images, none for grey ones" in text
    assert "flip alone for image folders and stores" in text
    assert resolve_augment("auto", (3, 32, 32)) == "crop+flip"
    assert resolve_augment("auto", (1, 16, 16)) == "none"
    assert resolve_augment("auto", (3, 224, 224), loader_crops=True) == "flip"


# 3. "auto" in a TOML file


def test_toml_takes_auto_for_a_0_means_auto_field(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[run]\nbatch_size = "auto"\n[optim]\nlr_batch = "Auto"\n')
    cfg = load_toml(path)
    assert cfg.run.batch_size == 0 and cfg.optim.lr_batch == 0


def test_toml_word_other_than_auto_says_the_field_takes_a_number_or_auto(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[run]\nbatch_size = "big"\n')
    with pytest.raises(ConfigError) as e:
        load_toml(path)
    assert (
        str(e.value)
        == f"{path}: run.batch_size (--batch-size) = 'big': expected a whole number or \"auto\" (0 means auto)"
    )
    path.write_text('[run]\nepochs = "auto"\n')  # not a 0-means-auto field: the type as before
    with pytest.raises(ConfigError, match=r"run\.epochs \(--epochs\) = 'auto': expected a whole number$"):
        load_toml(path)


# 4. range errors name the flag beside the key


def test_range_errors_name_the_key_and_the_flag(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "--epochs", "0"]) == 2
    assert capsys.readouterr().err == "cnnpar: error: run.epochs (--epochs) = 0: expected a number > 0\n"
    (tmp_path / "c.toml").write_text("[optim]\nwarmup = 1.5\n")
    assert cli.main(["train", "--config", "c.toml"]) == 2
    # the value came from the file, which the line names (a typed flag's error names the flag alone, as above)
    assert capsys.readouterr().err == "cnnpar: error: c.toml: optim.warmup (--warmup) = 1.5: expected 0 <= value < 1\n"
    with pytest.raises(ConfigError, match=r"^data\.workers \(--workers\) = -2: expected -1 \(auto\)"):
        DataConfig(workers=-2)
    with pytest.raises(ConfigError, match=r"^data\.augment \(--augment\) = 'spin': expected one of auto, none"):
        DataConfig(augment="spin")
    with pytest.raises(ConfigError, match=r"^model\.name \(--model\) is empty"):
        ModelConfig(name="")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml"]  # no run folder


def test_epochs_past_a_64_bit_integer_are_refused_naming_the_flag_and_the_largest(tmp_path, capsys, monkeypatch):
    """`--epochs 10**400` ended in an OverflowError traceback from the lr schedule's float maths, once the data had
    loaded; 2**63 trained, and its record held an integer TOML's 64 bits cannot: both are refused in one line that
    names the largest value taken, from the command line and from a config file alike."""
    from cnnpar.config import RunConfig

    monkeypatch.chdir(tmp_path)
    rest = ["--max-steps", "1", "--workers", "0", "--no-progress", "--no-tensorboard", "--out-dir", "runs"]
    largest = "expected 1..9,223,372,036,854,775,807 (2**63 - 1)"
    for epochs in (10**400, 2**63):
        assert cli.main(["train", "--epochs", str(epochs), *rest]) == 2
        assert capsys.readouterr().err == f"cnnpar: error: run.epochs (--epochs) = {epochs}: {largest}\n"
    (tmp_path / "c.toml").write_text(f"[run]\nepochs = {2**63}\n")
    assert cli.main(["train", "--config", "c.toml", *rest]) == 2
    assert capsys.readouterr().err == f"cnnpar: error: c.toml: run.epochs (--epochs) = {2**63}: {largest}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml"]  # no run folder
    assert RunConfig(epochs=2**63 - 1).epochs == 2**63 - 1  # the largest named is taken


# 5. a misspelt model, before the data loads or torchrun starts


def test_a_misspelt_model_is_refused_before_the_data_loads(tmp_path, capsys, monkeypatch):
    import cnnpar.engine.trainer as trainer

    def no_data(*a, **k):
        raise AssertionError("the data was loaded")

    monkeypatch.setattr(trainer, "load_data", no_data)
    assert cli.main(["train", "--model", "resnet5", "--out-dir", str(tmp_path), *QUICK]) == 2
    err = capsys.readouterr().err
    assert err == (
        "cnnpar: error: model.name (--model) = 'resnet5': expected one of cnn3, fastnet, resnet18, resnet50 "
        "(see `cnnpar models`)\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_misspelt_model_is_refused_before_nproc_launches(tmp_path, capsys, monkeypatch):
    def no_launch(cmd, env):
        raise AssertionError("torchrun was started")

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(dist, "run_launcher", no_launch)
    assert cli.main(["train", "--model", "resnet5", "--nproc", "2", "--out-dir", str(tmp_path)]) == 2
    assert "model.name (--model) = 'resnet5': expected one of cnn3" in capsys.readouterr().err


def test_a_misspelt_model_is_refused_before_bench_loads_data(tmp_path, capsys, monkeypatch):
    import cnnpar.bench.run as bench_run

    def no_bench(*a, **k):
        raise AssertionError("the bench started")

    monkeypatch.setattr(bench_run, "run_bench", no_bench)
    assert cli.main(["bench", "--model", "resnet5", "--out-dir", str(tmp_path)]) == 2
    assert "model.name (--model) = 'resnet5': expected one of cnn3" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


# 6. a batch larger than the training split


def _stored(run_dir) -> tuple[dict, str]:
    text = (run_dir / "config.toml").read_text()
    return tomllib.loads(text), text


def test_a_batch_larger_than_the_training_split_is_capped_and_said_and_stored(tmp_path, capsys):
    args = ["train", "--data", "synthetic", "--synthetic-samples", "20", "--batch-size", "1024", "--name", "r"]
    assert cli.main([*args, "--out-dir", str(tmp_path), *QUICK]) == 0
    out = capsys.readouterr().out
    # 20 samples: 16 train, 4 validation
    assert "batch 16/process x 1 process(es) x 1 accumulation = 16 per step" in out
    assert "batch size 1024 capped to 16: all 16 training samples, one step per epoch" in out
    stored, text = _stored(tmp_path / "r")
    assert stored["run"]["batch_size"] == 16 and stored["optim"]["lr_batch"] == 16
    assert stored["optim"]["lr"] == 0.002  # a fixed batch trains at --lr as it is
    assert "# requested: run.batch_size = 1024" in text


def test_an_accumulation_longer_than_an_epoch_is_capped_and_said_and_stored(tmp_path, capsys):
    # 40 samples: 32 train in 4 micro-batches of 8; --grad-accum 6 would need 6 of them per step
    args = ["train", "--data", "synthetic", "--synthetic-samples", "40", "--batch-size", "8", "--grad-accum", "6"]
    args += ["--lr-scaling", "linear", "--name", "r", "--out-dir", str(tmp_path)]
    assert cli.main([*args, *QUICK]) == 0
    out = capsys.readouterr().out
    assert "batch 8/process x 1 process(es) x 4 accumulation = 32 per step" in out
    assert "--grad-accum 6 capped to 4: an epoch has 4 micro-batch(es) of 8 per process" in out
    assert "lr 0.002 x 1 process x 4 accumulation steps = 0.008 (--lr-scaling linear)" in out
    stored, text = _stored(tmp_path / "r")
    assert stored["optim"]["grad_accum"] == 4
    assert "# requested: optim.grad_accum = 6" in text
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["global_batch"] == 32


@pytest.mark.parametrize("max_steps, said", [(3, True), (2, False), (1, False)])
def test_a_max_steps_past_an_epochs_steps_says_it_stops_nothing(tmp_path, capsys, max_steps, said):
    """--max-steps limits each epoch (other trainers' max_steps limits the run): one past an epoch's steps ran
    every step without a word, so a --max-steps meant as the run's total trained another number of steps."""
    # 40 samples: 32 train in 4 micro-batches of 8, 2 optimizer steps an epoch with --grad-accum 2
    args = ["train", "--data", "synthetic", "--synthetic-samples", "40", "--batch-size", "8", "--grad-accum", "2"]
    args += ["--epochs", "2", "--max-steps", str(max_steps), "--no-progress", "--no-tensorboard"]
    assert cli.main([*args, "--name", "r", "--out-dir", str(tmp_path)]) == 0
    line = (
        "--max-steps 3 stops nothing: an epoch has 2 optimizer step(s), all of them run (2 epoch(s): 4 steps); "
        "it limits each epoch, not the run"
    )
    out = capsys.readouterr().out
    assert (line in out) if said else ("stops nothing" not in out)
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["images_trained"] == 2 * 2 * 8 * min(max_steps, 2)  # epochs x micro-batches x 8 x steps


def test_an_accumulation_that_fits_an_epoch_is_kept(tmp_path, capsys):
    args = ["train", "--data", "synthetic", "--synthetic-samples", "40", "--batch-size", "8", "--grad-accum", "4"]
    assert cli.main([*args, "--name", "r", "--out-dir", str(tmp_path), *QUICK]) == 0
    out = capsys.readouterr().out
    assert "x 4 accumulation = 32 per step" in out and "capped" not in out


def test_the_cpus_automatic_batch_is_capped_with_the_lr_scaled_to_the_batch_that_runs(tmp_path, capsys):
    args = ["train", "--data", "synthetic", "--synthetic-samples", "40", "--name", "r", "--out-dir", str(tmp_path)]
    assert cli.main([*args, *QUICK]) == 0
    out = capsys.readouterr().out
    assert "batch 32/process" in out
    assert "batch size auto: 64 (the CPU's), capped to 32: all 32 training samples, one step per epoch" in out
    stored, text = _stored(tmp_path / "r")
    assert stored["run"]["batch_size"] == 32 and stored["optim"]["lr_batch"] == 64
    assert stored["optim"]["lr"] == pytest.approx(0.002 * (32 / 64) ** 0.5)  # adamw: square root
    assert "# requested: run.batch_size = auto" in text


def test_a_batch_that_leaves_much_of_each_epoch_out_says_so(tmp_path, capsys):
    args = ["train", "--data", "synthetic", "--synthetic-samples", "100", "--batch-size", "64", "--name", "r"]
    assert cli.main([*args, "--out-dir", str(tmp_path), *QUICK]) == 0
    out = capsys.readouterr().out
    assert "batch 64/process" in out
    assert (
        "batch 64 of this process's 80 training samples: 1 step(s) per epoch, 16 samples (20%) left out of each "
        "epoch" in out
    )
    assert _stored(tmp_path / "r")[0]["run"]["batch_size"] == 64


def test_a_typed_batch_of_0_is_refused_not_read_as_auto(capsys):
    from cnnpar.cli import build_parser

    for typed in ("0", "-3"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["train", "--batch-size", typed])
        assert f"argument --batch-size: '{typed}': expected a whole number > 0 or auto" in capsys.readouterr().err
    assert getattr(build_parser().parse_args(["train", "--batch-size", "auto"]), "run.batch_size") == 0
    assert getattr(build_parser().parse_args(["train", "--lr-batch", "128"]), "optim.lr_batch") == 128
