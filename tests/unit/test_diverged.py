"""A run whose train loss, validation loss, weights or outputs stop being finite ends with a one-line error,
keeping its finished epochs; with fp16 (whose GradScaler skips overflowing steps on purpose) a non-finite train
loss only warns while the weights and buffers stay finite."""

from __future__ import annotations

import csv

import pytest
import torch

from cnnpar.cli import main
from cnnpar.engine import trainer as trainer_mod
from cnnpar.errors import Diverged

pytestmark = pytest.mark.usefixtures("one_thread")

ARGS = ["train", "--model", "cnn3", "--data", "synthetic", "--image-shape", "1x16x16", "--synthetic-samples", "128"]
ARGS += ["--batch-size", "32", "--epochs", "3", "--max-steps", "2", "--compile", "off", "--no-progress"]
ARGS += ["--no-tensorboard", "--device", "cpu", "--lr", "0.2"]
FP16 = ["--precision", "fp16", "--lr", "0.02"]  # at 0.2 the fp16 logits overflow (fp32's val loss is 1e5)
# fp16's backward on the CPU (no fast fp16 kernels) was ~0.6 s a step at 32 images of 16x16, nearly all of each fp16
# test: 8 images of 8x8 a step are as many steps (--max-steps 2 of an epoch's 12), and what these tests check is the
# run's handling of the losses, weights and scores the hooks set, not a size's numerics
FP16 += ["--batch-size", "8", "--image-shape", "1x8x8"]


def poison_weights_at(monkeypatch, epoch: int) -> None:
    """Weights turned to NaN before `epoch`: what a diverged step leaves behind."""
    begin = trainer_mod.Trainer.begin_epoch

    def begin_epoch(self, e):
        if e == epoch:
            with torch.no_grad():
                next(self.raw_model.parameters()).fill_(float("nan"))
        begin(self, e)

    monkeypatch.setattr(trainer_mod.Trainer, "begin_epoch", begin_epoch)


def after_training(monkeypatch, epoch: int, change) -> None:
    """`change(model)` once epoch `epoch` has trained, before it is checked: what its last update left behind."""
    train_epoch = trainer_mod.Trainer.train_epoch

    def wrapped(self, e):
        row = train_epoch(self, e)
        if e == epoch:
            with torch.no_grad():
                change(self.raw_model)
        return row

    monkeypatch.setattr(trainer_mod.Trainer, "train_epoch", wrapped)


def kept_epochs(run) -> list[str]:
    with open(run / "metrics.csv") as f:
        epochs = [row["epoch"] for row in csv.DictReader(f)]
    state = torch.load(run / "ckpt" / "last.pt", weights_only=True)
    assert state["epoch"] == int(epochs[-1])
    assert all(torch.isfinite(t).all() for t in state["model"].values() if t.is_floating_point())
    return epochs


def test_a_diverged_epoch_stops_the_run_and_keeps_the_finished_ones(tmp_path, monkeypatch, capsys):
    poison_weights_at(monkeypatch, 2)
    assert main([*ARGS, "--precision", "fp32", "--out-dir", str(tmp_path), "--name", "nan"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("cnnpar: error: epoch 2: train loss nan is not finite")
    # fp32 and --compile off already: the lr is the one thing to change
    assert err[0].endswith(f"(epoch 1 is kept in {tmp_path / 'nan'}): try a lower lr (--lr 0.1)")
    assert kept_epochs(tmp_path / "nan") == ["1"]


@pytest.mark.parametrize(
    ("precision", "compile_mode", "advice"),
    [
        ("fp32", "off", "a lower lr (--lr 0.1)"),
        ("bf16", "off", "a lower lr (--lr 0.1) or --precision fp32"),
        ("fp32", "default", "a lower lr (--lr 0.1) or --compile off"),
        ("fp16", "default", "a lower lr (--lr 0.1), --precision fp32 or --compile off"),
    ],
)
def test_the_divergence_advice_names_only_what_would_change(precision, compile_mode, advice):
    from types import SimpleNamespace

    # the lr that trained is the typed 0.2 scaled (x2: a searched batch of twice --lr-batch under SGD); the advice
    # halves what the user typed, or it would name the typed value itself
    cfg = SimpleNamespace(
        optim=SimpleNamespace(lr=0.4), speed=SimpleNamespace(precision=precision, compile=compile_mode)
    )
    trainer = SimpleNamespace(cfg=cfg, history=[], requested_cfg=SimpleNamespace(optim=SimpleNamespace(lr=0.2)))
    trainer._half_the_lr = lambda: trainer_mod.Trainer._half_the_lr(trainer)
    with pytest.raises(Diverged) as e:
        trainer_mod.Trainer._diverged(trainer, 3, "val loss", float("nan"))
    assert str(e.value) == f"epoch 3: val loss nan is not finite, training diverged: try {advice}"


def test_fp16_warns_and_trains_on_while_the_weights_stay_finite(tmp_path, monkeypatch, capsys):
    """An epoch holding a step the GradScaler skipped (its loss inf) has a mean train loss of inf: the skip is
    the scaler's own remedy, and the weights it left alone are fine."""
    train_epoch = trainer_mod.Trainer.train_epoch

    def one_overflowing_step(self, e):
        row = train_epoch(self, e)
        return {**row, "train_loss": float("inf")} if e == 2 else row

    monkeypatch.setattr(trainer_mod.Trainer, "train_epoch", one_overflowing_step)
    assert main([*ARGS, *FP16, "--out-dir", str(tmp_path), "--name", "fp16"]) == 0
    out = capsys.readouterr().out
    assert "warning: epoch 2: train loss inf (fp16 overflows" in out
    assert kept_epochs(tmp_path / "fp16") == ["1", "2", "3"]


def last_epoch_scores(monkeypatch, train_loss: float, val_loss: float, val_acc: float) -> None:
    """The 3-epoch run's last epoch reports `train_loss`, and its evaluation `val_loss` and `val_acc`."""
    train_epoch, evaluate = trainer_mod.Trainer.train_epoch, trainer_mod.Trainer.evaluate

    def last_epoch(self, e):
        row = train_epoch(self, e)
        return {**row, "train_loss": train_loss} if e == 3 else row

    def last_evaluation(self):
        row = evaluate(self)
        return {**row, "val_loss": val_loss, "val_acc": val_acc} if self.scheduler.last_epoch == 6 else row  # epoch 3's

    monkeypatch.setattr(trainer_mod.Trainer, "train_epoch", last_epoch)
    monkeypatch.setattr(trainer_mod.Trainer, "evaluate", last_evaluation)


def test_fp16_whose_last_epoch_ends_overflowing_stops_as_diverged_and_keeps_its_finite_epochs(
    tmp_path, monkeypatch, capsys
):
    """The GradScaler skipped the last epoch's overflowing steps, its train and validation losses were NaN, and the
    run ended "done" with exit 0 and a chance-level best accuracy after a warning whose "if it stays so" could not
    apply any more (bf16 stops with exit 2). The weights are finite: the last epoch's checkpoint is kept."""
    # an overflowed model scores at chance (10 classes)
    last_epoch_scores(monkeypatch, train_loss=float("nan"), val_loss=float("nan"), val_acc=0.1)
    assert main([*ARGS, *FP16, "--out-dir", str(tmp_path), "--name", "fp16"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(
        "cnnpar: error: epoch 3: train loss nan, val loss nan at the run's end (fp16 overflows: the GradScaler skipped "
    ), err
    assert err[0].endswith(
        f"the weights and buffers are finite), training diverged (epochs 1-3 are kept in {tmp_path / 'fp16'}): try "
        "a lower lr (--lr 0.01) or --precision fp32"
    ), err
    assert "warning: epoch 3" not in captured.out and "done: " not in captured.out
    assert kept_epochs(tmp_path / "fp16") == ["1", "2", "3"]
    with open(tmp_path / "fp16" / "summary.json") as f:
        assert '"epochs": 3' in f.read()


def test_fp16_whose_last_epoch_skipped_a_step_but_scores_finite_ends_as_done(tmp_path, monkeypatch, capsys):
    """One overflowing step makes the epoch's mean train loss inf; a finite validation loss of the weights it ends
    on is the run's result all the same: a warning, as in earlier epochs."""
    train_epoch = trainer_mod.Trainer.train_epoch

    def one_overflowing_step(self, e):
        row = train_epoch(self, e)
        return {**row, "train_loss": float("inf")} if e == 3 else row

    monkeypatch.setattr(trainer_mod.Trainer, "train_epoch", one_overflowing_step)
    assert main([*ARGS, *FP16, "--out-dir", str(tmp_path), "--name", "fp16"]) == 0
    assert "warning: epoch 3: train loss inf (fp16 overflows" in capsys.readouterr().out


def test_fp16_whose_last_epoch_overflows_but_whose_model_scores_above_chance_ends_as_done(
    tmp_path, monkeypatch, capsys
):
    """One validation sample whose logits pass fp16's range makes the val loss inf, and one skipped step the mean
    train loss: a model that still classifies above chance learned (report.chance), so the last epoch only warns."""
    last_epoch_scores(monkeypatch, train_loss=float("inf"), val_loss=float("inf"), val_acc=0.9)
    assert main([*ARGS, *FP16, "--out-dir", str(tmp_path), "--name", "fp16"]) == 0
    out = capsys.readouterr().out
    assert "warning: epoch 3: train loss inf, val loss inf (fp16 overflows" in out and "done: " in out
    assert kept_epochs(tmp_path / "fp16") == ["1", "2", "3"]


def test_fp16_stops_once_the_weights_are_not_finite(tmp_path, monkeypatch, capsys):
    """No skipped step undoes weights (or BatchNorm statistics a NaN forward wrote) that are NaN already: the run
    finished "done" with a NaN model in last.pt and best.pt."""
    poison_weights_at(monkeypatch, 3)
    assert main([*ARGS, *FP16, "--out-dir", str(tmp_path), "--name", "fp16"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(
        "cnnpar: error: epoch 3: train loss nan is not finite and neither are the weights or buffers, training diverged"
    ), err
    assert kept_epochs(tmp_path / "fp16") == ["1", "2"]


def test_fp16_stops_at_a_validation_loss_that_is_not_finite(tmp_path, monkeypatch, capsys):
    """Evaluation has no GradScaler: its NaN (BatchNorm statistics turned NaN in training) is divergence under fp16
    as under any precision, not a warning."""
    after_training(monkeypatch, 2, lambda model: model.features[1].running_var.fill_(float("nan")))
    assert main([*ARGS, *FP16, "--out-dir", str(tmp_path), "--name", "fp16"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("cnnpar: error: epoch 2: val loss nan is not finite"), err
    assert kept_epochs(tmp_path / "fp16") == ["1"]


@pytest.mark.parametrize("unevaluated", [["--eval-every", "3"], ["--val-fraction", "0"]])
def test_an_unevaluated_epoch_whose_last_update_blew_up_the_outputs_is_not_kept(
    tmp_path, monkeypatch, capsys, unevaluated
):
    """Each step's loss is read before its update: weights of 1e28 (finite; --lr 1e30 left them so) after an
    epoch's last step went unseen where the epoch was not evaluated, and its checkpoint replaced the last good one."""
    after_training(monkeypatch, 2, lambda model: [p.mul_(1e20) for p in model.parameters()])
    assert main([*ARGS, "--precision", "fp32", *unevaluated, "--out-dir", str(tmp_path), "--name", "big"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("cnnpar: error: epoch 2: after its last update the loss on its last batch is "), err
    assert f"(epoch 1 is kept in {tmp_path / 'big'})" in err[0]
    assert kept_epochs(tmp_path / "big") == ["1"]


def test_an_unevaluated_epoch_that_left_nan_batchnorm_statistics_is_not_kept(tmp_path, monkeypatch, capsys):
    """Training normalises by the batch's own statistics: NaN running statistics leave its losses finite."""
    after_training(monkeypatch, 2, lambda model: model.features[1].running_var.fill_(float("nan")))
    assert main([*ARGS, "--precision", "fp32", "--eval-every", "3", "--out-dir", str(tmp_path), "--name", "bn"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("cnnpar: error: epoch 2: the weights or buffers are not finite"), err
    assert kept_epochs(tmp_path / "bn") == ["1"]


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
    assert main([*ARGS, "--precision", "fp32", "--out-dir", str(tmp_path), "--name", "late"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("cnnpar: error: epoch 2: val loss nan is not finite"), err
    with open(tmp_path / "late" / "metrics.csv") as f:
        assert [row["epoch"] for row in csv.DictReader(f)] == ["1"]  # epoch 2's checkpoint never replaced epoch 1's


def test_fp16_logits_past_its_range_warn_while_the_weights_stay_finite(tmp_path, monkeypatch, capsys):
    """Validation logits above fp16's 65,504 give an inf loss with finite weights (at --lr 0.2 fp32's val loss is 1e5;
    here the evaluation's loss is made inf); the run had been stopped as diverged, where before (and in fp32) it
    trained on."""
    evaluate = trainer_mod.Trainer.evaluate

    def overflowing_evaluation(self):
        row = evaluate(self)
        return {**row, "val_loss": float("inf")}

    monkeypatch.setattr(trainer_mod.Trainer, "evaluate", overflowing_evaluation)
    assert main([*ARGS, *FP16, "--out-dir", str(tmp_path), "--name", "fp16"]) == 0
    out = capsys.readouterr().out
    assert "warning: epoch 1: val loss inf (fp16 overflows" in out and "the weights and buffers are finite" in out
    assert kept_epochs(tmp_path / "fp16") == ["1", "2", "3"]


def test_outputs_of_live_weights_are_checked_where_evaluation_scored_the_weight_average(tmp_path, monkeypatch, capsys):
    """With --ema the evaluation scores the average, not the weights the last update changed: weights of 1e20 after
    an evaluated epoch passed, and that epoch's checkpoint replaced the last good one."""
    after_training(monkeypatch, 2, lambda model: [p.mul_(1e20) for p in model.parameters()])
    ema = ["--ema", "0.9", "--ema-start", "0"]
    assert main([*ARGS, "--precision", "fp32", *ema, "--out-dir", str(tmp_path), "--name", "ema"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "after its last update the loss on its last batch is " in err[0], err
    assert kept_epochs(tmp_path / "ema") == ["1"]
