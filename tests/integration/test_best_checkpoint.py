"""ckpt/best.pt: the weights of the epoch with the best validation accuracy. Only ckpt/last.pt was kept, so a run
whose accuracy peaked early kept only its later, worse weights. Real CPU runs; the validation accuracies are
scripted (Trainer.evaluate), so which epoch is best does not hang on how a tiny model happens to train."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from cnnpar.engine.checkpoint import BEST, LAST

pytestmark = pytest.mark.usefixtures("one_thread")  # the runs below train in this process

ARGS = [
    "--device",
    "cpu",
    "--model",
    "cnn3",
    "--workers",
    "0",
    "--no-progress",
    "--no-tensorboard",
    "--batch-size",
    "16",
]


def scripted(monkeypatch, accuracies: dict[int, float]) -> None:
    """Trainer.evaluate returns accuracies[epoch] (the epoch being evaluated: one more than the rows so far)."""
    from cnnpar.engine.trainer import Trainer

    real = Trainer.evaluate

    def evaluate(self):
        out = real(self)
        return {**out, "val_acc": accuracies[len(self.history) + 1]}

    monkeypatch.setattr(Trainer, "evaluate", evaluate)


def data(tmp_path: Path) -> Path:
    """64 grey 8x8 training images and 16 test ones, 4 classes, with labels."""
    path = tmp_path / "d.npz"
    if not path.exists():
        rng = np.random.default_rng(0)
        x, y = rng.integers(0, 256, (80, 8, 8), dtype=np.uint8), np.arange(80) % 4
        np.savez(path, x_train=x[:64], y_train=y[:64], x_test=x[64:], y_test=y[64:])
    return path


def train(tmp_path: Path, *more: str) -> int:
    from cnnpar.cli import main

    return main(["train", *ARGS, "--data", str(data(tmp_path)), "--out-dir", str(tmp_path), "--name", "r", *more])


def epoch_of(path: Path) -> int:
    return torch.load(path, map_location="cpu", weights_only=True)["epoch"]


def test_best_pt_holds_the_best_epochs_weights_and_predict_reads_it(tmp_path, monkeypatch, capsys):
    scripted(monkeypatch, {1: 0.3, 2: 0.6, 3: 0.5, 4: 0.6})  # best at 2 (4 ties it: the earlier is kept)
    weights = {}
    from cnnpar.engine.trainer import Trainer

    real_end = Trainer._end_epoch

    def end_epoch(self, epoch, row):
        weights[epoch] = {k: v.clone() for k, v in self.raw_model.state_dict().items()}
        real_end(self, epoch, row)

    monkeypatch.setattr(Trainer, "_end_epoch", end_epoch)
    assert train(tmp_path, "--epochs", "4") == 0
    run = tmp_path / "r"
    best = torch.load(run / "ckpt" / BEST, map_location="cpu", weights_only=True)
    assert best["epoch"] == 2 and epoch_of(run / "ckpt" / LAST) == 4
    assert all(torch.equal(best["model"][k], v) for k, v in weights[2].items())
    assert not any(k in best for k in ("optimizer", "scheduler", "precision"))  # weights for predict, not a resume
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["best_epoch"], summary["best_ckpt_epoch"]) == (2, 2)

    from cnnpar.engine.predict import predict

    said: list[str] = []
    out = predict(str(run / "ckpt" / BEST), str(data(tmp_path)), str(tmp_path / "p.csv"), 16, log=said.append)
    assert len(out.read_text().splitlines()) == 1 + 16  # a header and the 16 test images
    assert any("accuracy" in line for line in said), said  # scored against y_test, from the best epoch's weights
    assert f"checkpoint: {run / 'ckpt' / BEST} (epoch 2)" in said
    # a run folder predicts from last.pt, and says so, naming the file that holds the best epoch
    said.clear()
    predict(str(run), str(data(tmp_path)), str(tmp_path / "p2.csv"), 16, log=said.append)
    best = run / "ckpt" / BEST
    line = (
        f"checkpoint: {run / 'ckpt' / LAST} (epoch 4); {best} holds the best validation epoch, 2: --checkpoint {best}"
    )
    assert any(s.startswith(line) for s in said), said
    capsys.readouterr()
    assert train(tmp_path, "--epochs", "5", "--resume", str(run / "ckpt" / BEST)) == 2
    assert (
        "best.pt: holds the best epoch's weights, for `cnnpar predict`, not a training state" in capsys.readouterr().err
    )
    assert epoch_of(run / "ckpt" / LAST) == 4  # refused before anything changed


def test_a_resume_keeps_the_best_of_the_whole_run_and_drops_a_best_past_the_checkpoint(tmp_path, monkeypatch, capsys):
    scripted(monkeypatch, {1: 0.5, 2: 0.4, 3: 0.45, 4: 0.9})
    assert train(tmp_path, "--epochs", "2") == 0
    run = tmp_path / "r"
    assert epoch_of(run / "ckpt" / BEST) == 1
    assert train(tmp_path, "--epochs", "3", "--resume", str(run)) == 0
    # epoch 3's 0.45 is below the first attempt's epoch 1: best.pt stays epoch 1's
    assert epoch_of(run / "ckpt" / BEST) == 1
    assert json.loads((run / "summary.json").read_text())["best_ckpt_epoch"] == 1

    # an attempt stopped between last.pt and a later best.pt: a best.pt from an epoch the checkpoint does not hold
    best = torch.load(run / "ckpt" / BEST, map_location="cpu", weights_only=True)
    torch.save({**best, "epoch": 7}, run / "ckpt" / BEST)
    capsys.readouterr()
    assert train(tmp_path, "--epochs", "4", "--resume", str(run)) == 0
    assert f"removed {run / 'ckpt' / BEST}: it held epoch 7, past the 3 epochs" in capsys.readouterr().out
    assert epoch_of(run / "ckpt" / BEST) == 4  # the next best epoch wrote it again
