"""A batch of 1 per process where a BatchNorm layer sees 1x1 maps is refused at the start, in one line and with no
run folder (it died in the first step's traceback, leaving an empty run folder); the note on the samples an epoch
leaves out counts the sampler's cut to equal shares as well as the dropped partial batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cnnpar.cli import main
from cnnpar.config import Config
from cnnpar.data import load_data
from cnnpar.dist import DistInfo
from cnnpar.engine.trainer import Trainer, left_out_note
from cnnpar.errors import ConfigError
from cnnpar.presets import with_overrides
from tests.datafiles import bar_images

pytestmark = pytest.mark.usefixtures("one_thread")

QUICK = ["--epochs", "1", "--max-steps", "1", "--device", "cpu", "--precision", "fp32", "--compile", "off"]
QUICK += ["--no-progress", "--no-tensorboard"]


def npz(path, n: int, side: int = 8):
    x, y = bar_images(n, classes=2, side=side)
    np.savez(path, x_train=x, y_train=y)
    return str(path)


@pytest.mark.parametrize(
    ("model", "size", "layer"), [("resnet18", [], "layer4.0.bn1"), ("fastnet", ["--image-size", "9"], "stages.2.bn1")]
)
def test_a_batch_of_1_before_a_1x1_batchnorm_is_refused_leaving_no_run_folder(tmp_path, capsys, model, size, layer):
    data = npz(tmp_path / "d.npz", 10)
    runs = tmp_path / "runs"
    args = ["train", "--data", data, "--model", model, *size, "--batch-size", "1", "--out-dir", str(runs)]
    assert main([*args, "--name", "r", *QUICK]) == 2
    side = 9 if size else 8
    assert capsys.readouterr().err == (
        f"cnnpar: error: model {model} at {side}x{side} px reduces to 1x1 maps before a BatchNorm layer ({layer}), "
        "which cannot train on a batch of 1 per process (one value per channel): give --batch-size 2 or more, or a "
        "larger --image-size\n"
    )
    assert not (runs / "r").exists()


@pytest.mark.parametrize(("model", "batch", "side"), [("resnet18", "2", 8), ("cnn3", "1", 16)])
def test_batchnorm_with_two_values_per_channel_trains(tmp_path, model, batch, side):
    """Two images of 1x1 maps, or one of cnn3's 2x2 maps at 16 px: BatchNorm has what it needs."""
    data = npz(tmp_path / "d.npz", 10, side)
    args = ["train", "--data", data, "--model", model, "--batch-size", batch, "--out-dir", str(tmp_path)]
    assert main([*args, "--name", "r", *QUICK]) == 0


def test_a_batch_capped_to_1_by_the_processes_share_says_what_would_help(tmp_path, monkeypatch):
    """3 images over 2 processes: each trains a share of 1, whatever --batch-size says. Refused at the ranks'
    settings agreement, which every rank reaches with it (tests/dist/test_torchrun_cli.py runs two): with a
    stand-in for it that raises the refusal, one process can stand for the two."""
    from cnnpar.engine import trainer as trainer_mod

    def agreement(fields, info, what, refusal=None):
        if refusal is not None:
            raise refusal

    monkeypatch.setattr(trainer_mod, "refuse_disagreeing_ranks", agreement)
    cfg = with_overrides(
        Config(),
        data={"source": npz(tmp_path / "d.npz", 3), "val_fraction": 0.0},
        model={"name": "resnet18"},
        speed={"device": "cpu"},
        run={"batch_size": 8, "out_dir": str(tmp_path)},
    )
    with pytest.raises(ConfigError) as e:
        Trainer(cfg, DistInfo(0, 0, 2, torch.device("cpu")), bundle=load_data(cfg.data, cfg.run.seed))
    assert str(e.value).endswith(
        "(one value per channel): this process's share of the 3 training samples is 1: use more training data, "
        "fewer processes, or a larger --image-size"
    )


def test_the_left_out_note_counts_the_samples_the_sampler_cuts():
    """3 images on 2 processes trained 2 an epoch without a word: the note counted only each process's own
    remainder (share % batch), 0 there."""
    assert left_out_note(3, 2, 1) == (
        "batch 1 of this process's 1 (of 3) training samples: 1 step(s) per epoch, 1 samples (33%) left out of each "
        "epoch (the 2 processes' shares are cut to equal length; other samples each epoch)"
    )
    assert left_out_note(80, 1, 64) == (
        "batch 64 of this process's 80 training samples: 1 step(s) per epoch, 16 samples (20%) left out of each "
        "epoch (the last partial batch is dropped; other samples each epoch)"
    )
    assert left_out_note(201, 2, 100) == ""  # one left out: under the 10% a note is for
    assert left_out_note(3, 4, 1) == ""  # a set smaller than the world is padded: none left out
