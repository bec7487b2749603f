"""A run killed after epoch 2 and resumed ends bit-identical to one that ran 3 epochs straight:
the same weights and the same metrics rows, alone (here) and on 2 gloo ranks
(tests/dist/test_torchrun_resume.py). The augmentation
(random crops and flips) draws random numbers every step, so any generator that restarts from
its seed on resume, instead of where the epoch would have found it, changes epoch 3."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from cnnpar.report.files import read_csv
from tests.conftest import run_cmd

TRAIN = [
    "train",
    "--device",
    "cpu",
    "--data",
    "synthetic",
    "--image-shape",
    "3x16x16",
    "--synthetic-samples",
    "192",
    "--augment",
    "crop+flip",
    "--model",
    "cnn3",
    "--batch-size",
    "16",
    "--epochs",
    "3",
    "--no-progress",
]
SAME = ["epoch", "train_loss", "train_acc", "val_loss", "val_acc", "lr"]  # not the timings


def outcome(run: Path) -> tuple[list[dict], dict]:
    rows = [{k: r[k] for k in SAME} for r in read_csv(run / "metrics.csv")]
    state = torch.load(run / "ckpt" / "last.pt", map_location="cpu", weights_only=True)
    assert state["epoch"] == 3
    return rows, state["model"]


def assert_identical(straight: Path, resumed: Path) -> None:
    rows_a, model_a = outcome(straight)
    rows_b, model_b = outcome(resumed)
    assert rows_a == rows_b
    assert model_a.keys() == model_b.keys()
    differ = [k for k in model_a if not torch.equal(model_a[k], model_b[k])]
    assert not differ, f"tensors that differ after resuming: {differ}"


def explain(proc) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"


@pytest.mark.parametrize("loader", ["fast", "textbook"])
def test_one_process_resumed_after_a_kill_is_bit_identical(tmp_path, loader):
    """textbook: per-sample crops and flips drawn in DataLoader worker processes."""
    py = [sys.executable, "-m", "cnnpar"]
    straight = run_cmd([*py, *TRAIN, "--loader", loader, "--name", "straight"], tmp_path)
    assert straight.returncode == 0, explain(straight)
    killed = run_cmd([*py, *TRAIN, "--loader", loader, "--name", "k"], tmp_path, CNNPAR_FAULT_KILL_AT_EPOCH="3")
    assert killed.returncode == -9, explain(killed)  # SIGKILL half-way through epoch 3
    assert len(read_csv(tmp_path / "runs" / "k" / "metrics.csv")) == 2
    resumed = run_cmd([*py, *TRAIN, "--loader", loader, "--name", "k", "--resume", "runs/k"], tmp_path)
    assert resumed.returncode == 0, explain(resumed)
    assert "resumed from" in resumed.stdout and "after epoch 2" in resumed.stdout
    assert "RNG" not in resumed.stdout  # this checkpoint is of the per-epoch seeds: no note
    assert_identical(tmp_path / "runs" / "straight", tmp_path / "runs" / "k")


SMALL = ["train", "--data", "synthetic", "--image-shape", "1x16x16", "--synthetic-samples", "64", "--no-progress"]


def _resumed_with_rng(tmp_path, rng: str | None, *flags: str):
    """A 1-epoch run whose checkpoint's "rng" is set to `rng` (removed where None), resumed to 2 epochs."""
    py = [sys.executable, "-m", "cnnpar"]
    first = run_cmd([*py, *SMALL, "--epochs", "1", "--name", "old"], tmp_path)
    assert first.returncode == 0, explain(first)
    ckpt = tmp_path / "runs" / "old" / "ckpt" / "last.pt"
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    if rng is None:
        del state["rng"]
    else:
        state["rng"] = rng
    torch.save(state, ckpt)
    again = run_cmd([*py, *SMALL, "--epochs", "2", "--resume", "runs/old", *flags], tmp_path)
    assert again.returncode == 0, explain(again)
    return again


def test_checkpoint_without_rng_scheme_still_resumes_with_a_note(tmp_path):
    """A checkpoint written before per-epoch seeds (no "rng" key) resumes, and the log says its
    resumed epochs cannot repeat an uninterrupted run."""
    again = _resumed_with_rng(tmp_path, None)
    assert "after epoch 1" in again.stdout
    assert "stores no RNG state" in again.stdout
    assert len(read_csv(tmp_path / "runs" / "old" / "metrics.csv")) == 2


def test_a_checkpoint_of_the_earlier_seed_scheme_and_a_changed_crop_scale_are_said_on_resume(tmp_path):
    """The per-sample keys became hashed (transforms.mix_seed): a checkpoint of the earlier scheme resumed without a
    word, and so did a --crop-min-scale other than the checkpoint's, though both change the crops drawn."""
    again = _resumed_with_rng(tmp_path, "per-epoch seeds", "--crop-min-scale", "0.5")
    assert "drew their augmentation by an earlier scheme (per-epoch seeds; now " in again.stdout
    assert "--crop-min-scale 0.25 -> 0.5" in again.stdout
