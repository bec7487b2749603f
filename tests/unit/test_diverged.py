"""A run whose train loss stops being finite ends with a one-line error, keeping its finished epochs;
with fp16 (whose GradScaler skips overflowing steps on purpose) it warns and trains on."""

from __future__ import annotations

import csv

import pytest
import torch

from cnnpar.cli import main
from cnnpar.engine import trainer as trainer_mod

pytestmark = pytest.mark.usefixtures("one_thread")

ARGS = ["train", "--model", "cnn3", "--data", "synthetic", "--image-shape", "1x16x16", "--synthetic-samples", "128"]
ARGS += ["--batch-size", "32", "--epochs", "3", "--max-steps", "2", "--compile", "off", "--no-progress"]
ARGS += ["--no-tensorboard", "--device", "cpu", "--lr", "0.2"]


def poison_weights_at(monkeypatch, epoch: int) -> None:
    """Weights turned to NaN before `epoch`: what a diverged step leaves behind."""
    begin = trainer_mod.Trainer.begin_epoch

    def begin_epoch(self, e):
        if e == epoch:
            with torch.no_grad():
                next(self.raw_model.parameters()).fill_(float("nan"))
        begin(self, e)

    monkeypatch.setattr(trainer_mod.Trainer, "begin_epoch", begin_epoch)


def test_a_diverged_epoch_stops_the_run_and_keeps_the_finished_ones(tmp_path, monkeypatch, capsys):
    poison_weights_at(monkeypatch, 2)
    assert main([*ARGS, "--out-dir", str(tmp_path), "--name", "nan"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("cnnpar: error: epoch 2: train loss nan is not finite")
    assert "--lr 0.1" in err[0] and "--precision fp32" in err[0] and "--compile off" in err[0]
    with open(tmp_path / "nan" / "metrics.csv") as f:
        assert [row["epoch"] for row in csv.DictReader(f)] == ["1"]
    state = torch.load(tmp_path / "nan" / "ckpt" / "last.pt", weights_only=True)
    assert state["epoch"] == 1
    assert all(torch.isfinite(t).all() for t in state["model"].values() if t.is_floating_point())


def test_fp16_warns_and_trains_on(tmp_path, monkeypatch, capsys):
    poison_weights_at(monkeypatch, 3)
    assert main([*ARGS, "--precision", "fp16", "--out-dir", str(tmp_path), "--name", "fp16"]) == 0
    out = capsys.readouterr().out
    assert "warning: epoch 3: train loss nan (fp16 overflows" in out
    with open(tmp_path / "fp16" / "metrics.csv") as f:
        assert [row["epoch"] for row in csv.DictReader(f)] == ["1", "2", "3"]


def test_weights_that_diverge_in_an_epochs_last_steps_stop_the_run_at_its_evaluation(tmp_path, monkeypatch, capsys):
    """The epoch's mean train loss can stay finite while its last steps leave the weights overflowing
    (--lr 1e30 did so): the validation loss is then not finite, and the run must not end as a success."""
    evaluate, calls = trainer_mod.Trainer.evaluate, []

    def evaluate_after_a_bad_last_step(self):
        calls.append(1)
        if len(calls) == 2:  # epoch 2's evaluation: its training ended finite, its weights did not
            with torch.no_grad():
                next(self.raw_model.parameters()).fill_(float("inf"))
        return evaluate(self)

    monkeypatch.setattr(trainer_mod.Trainer, "evaluate", evaluate_after_a_bad_last_step)
    assert main([*ARGS, "--out-dir", str(tmp_path), "--name", "late"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("cnnpar: error: epoch 2: val loss nan is not finite"), err
    with open(tmp_path / "late" / "metrics.csv") as f:
        assert [row["epoch"] for row in csv.DictReader(f)] == ["1"]  # epoch 2's checkpoint never replaced epoch 1's
