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

from cnnpar.cli import main
from cnnpar.report.files import read_csv
from tests.conftest import run_cmd

pytestmark = pytest.mark.usefixtures("one_thread")

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


def in_process(args: list[str], capsys) -> str:
    """`cnnpar ARGS` called in this process (cli.main, as a notebook calls it), in the working folder; returns its
    stdout, having checked its exit code. Only the run killed by CNNPAR_FAULT_KILL_AT_EPOCH needs a process of its own
    (it sends itself SIGKILL)."""
    capsys.readouterr()
    code = main(args)
    out, err = capsys.readouterr()
    assert code == 0, f"exit {code}\n--- stdout\n{out[-3000:]}\n--- stderr\n{err[-3000:]}"
    return out


@pytest.mark.parametrize("loader", ["fast", "textbook"])
def test_one_process_resumed_after_a_kill_is_bit_identical(tmp_path, loader, monkeypatch, capsys):
    """textbook: per-sample crops and flips drawn in DataLoader worker processes. The straight run and the resume run
    in this process, the killed run in one of its own: the same numbers whichever process draws them."""
    py = [sys.executable, "-m", "cnnpar"]
    monkeypatch.chdir(tmp_path)
    in_process([*TRAIN, "--loader", loader, "--name", "straight"], capsys)
    killed = run_cmd([*py, *TRAIN, "--loader", loader, "--name", "k"], tmp_path, CNNPAR_FAULT_KILL_AT_EPOCH="3")
    assert killed.returncode == -9, explain(killed)  # SIGKILL half-way through epoch 3
    assert len(read_csv(tmp_path / "runs" / "k" / "metrics.csv")) == 2
    resumed = in_process([*TRAIN, "--loader", loader, "--name", "k", "--resume", "runs/k"], capsys)
    assert "resumed from" in resumed and "after epoch 2" in resumed
    assert "RNG" not in resumed  # this checkpoint is of the per-epoch seeds: no note
    assert_identical(tmp_path / "runs" / "straight", tmp_path / "runs" / "k")


SMALL = ["train", "--data", "synthetic", "--image-shape", "1x16x16", "--synthetic-samples", "64", "--no-progress"]


def _resumed_with_rng(tmp_path, monkeypatch, capsys, rng: str | None, *flags: str) -> str:
    """A 1-epoch run whose checkpoint's "rng" is set to `rng` (removed where None), resumed to 2 epochs: the
    resume's stdout."""
    monkeypatch.chdir(tmp_path)
    in_process([*SMALL, "--epochs", "1", "--name", "old"], capsys)
    ckpt = tmp_path / "runs" / "old" / "ckpt" / "last.pt"
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    if rng is None:
        del state["rng"]
    else:
        state["rng"] = rng
    torch.save(state, ckpt)
    return in_process([*SMALL, "--epochs", "2", "--resume", "runs/old", *flags], capsys)


def test_checkpoint_without_rng_scheme_still_resumes_with_a_note(tmp_path, monkeypatch, capsys):
    """A checkpoint written before per-epoch seeds (no "rng" key) resumes, and the log says its
    resumed epochs cannot repeat an uninterrupted run."""
    again = _resumed_with_rng(tmp_path, monkeypatch, capsys, None)
    assert "after epoch 1" in again
    assert "stores no RNG state" in again
    assert len(read_csv(tmp_path / "runs" / "old" / "metrics.csv")) == 2


def test_a_checkpoint_of_the_earlier_seed_scheme_and_a_changed_crop_scale_are_said_on_resume(
    tmp_path, monkeypatch, capsys
):
    """The per-sample keys became hashed (transforms.mix_seed): a checkpoint of the earlier scheme resumed without a
    word, and so did a --crop-min-scale other than the checkpoint's, though both change the crops drawn."""
    again = _resumed_with_rng(tmp_path, monkeypatch, capsys, "per-epoch seeds", "--crop-min-scale", "0.5")
    assert "drew their augmentation by an earlier scheme (per-epoch seeds; now " in again
    assert "--crop-min-scale 0.25 -> 0.5" in again
