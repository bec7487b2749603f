"""A run killed after epoch 2 and resumed ends bit-identical to one that ran 3 epochs straight:
the same weights and the same metrics rows, alone and on 2 gloo ranks. The augmentation
(random crops and flips) draws random numbers every step, so any generator that restarts from
its seed on resume, instead of where the epoch would have found it, changes epoch 3."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from cnnpar.report.files import read_csv
from tests.conftest import run_cmd, torchrun_cmd

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


def test_one_process_resumed_after_a_kill_is_bit_identical(tmp_path):
    py = [sys.executable, "-m", "cnnpar"]
    straight = run_cmd([*py, *TRAIN, "--name", "straight"], tmp_path)
    assert straight.returncode == 0, explain(straight)
    killed = run_cmd([*py, *TRAIN, "--name", "k"], tmp_path, CNNPAR_FAULT_KILL_AT_EPOCH="3")
    assert killed.returncode == -9, explain(killed)  # SIGKILL half-way through epoch 3
    assert len(read_csv(tmp_path / "runs" / "k" / "metrics.csv")) == 2
    resumed = run_cmd([*py, *TRAIN, "--name", "k", "--resume", "runs/k"], tmp_path)
    assert resumed.returncode == 0, explain(resumed)
    assert "resumed from" in resumed.stdout and "after epoch 2" in resumed.stdout
    assert "RNG" not in resumed.stdout  # this checkpoint is of the per-epoch seeds: no note
    assert_identical(tmp_path / "runs" / "straight", tmp_path / "runs" / "k")


def test_two_gloo_ranks_restarted_after_a_kill_are_bit_identical(tmp_path):
    """torchrun restarts the group after rank 1 SIGKILLs itself in epoch 3 (engine/fault.py)."""
    launch = [*torchrun_cmd(2, "--standalone", "--max-restarts=1"), "-m", "cnnpar"]
    straight = run_cmd([*launch, *TRAIN, "--name", "straight"], tmp_path)
    assert straight.returncode == 0, explain(straight)
    restarted = run_cmd([*launch, *TRAIN, "--name", "k"], tmp_path, CNNPAR_FAULT_KILL_AT_EPOCH="3")
    assert restarted.returncode == 0, explain(restarted)
    assert "after epoch 2" in restarted.stdout, explain(restarted)
    assert_identical(tmp_path / "runs" / "straight", tmp_path / "runs" / "k")
