"""load_checkpoint on files torch.save did not write: said what they look like, for predict and resume alike."""

from __future__ import annotations

import argparse
import io
import re

import numpy as np
import pytest
import torch
from PIL import Image

from cnnpar.engine.checkpoint import EXPECTED_FILE, load_checkpoint
from cnnpar.errors import UserError

NOT_TORCH = "not a checkpoint written by torch.save: "


def _jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, "JPEG")
    return buffer.getvalue()


def _npz() -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, x_train=np.zeros((2, 4, 4), np.uint8), y_train=np.zeros(2, np.int64))
    return buffer.getvalue()


LFS = b"version https://git-lfs.github.com/spec/v1\noid sha256:4d7a2146\nsize 1234\n"


@pytest.mark.parametrize(
    ("content", "looks"),
    [
        (b"label,pixel0,pixel1\n1,0,255\n", f"a CSV file, its first line 'label,pixel0,pixel1': {EXPECTED_FILE}"),
        (b"hello\n", f"a text file, its first line 'hello': {EXPECTED_FILE}"),  # was a bare "(101)"
        (b"", f"an empty file: {EXPECTED_FILE}"),
        (b"\0" * 1000, f"binary data, its first bytes 00 00 00 00 00 00 00 00: {EXPECTED_FILE}"),
        (b"\n<!DOCTYPE html><html>404</html>", f"an HTML page (a download that saved a web page?): {EXPECTED_FILE}"),
        (b"CNNPSTOR\1\0\0\0", f"a cnnpar store (cnnpar prepare's images): {EXPECTED_FILE}"),
        (_jpeg(), f"a JPEG image: {EXPECTED_FILE}"),
        (
            _npz(),
            "a zip archive without torch.save's data.pkl (an .npz? its records: x_train.npy, y_train.npy): "
            + EXPECTED_FILE,
        ),
        (
            LFS,
            "a Git LFS pointer, the checkpoint itself never downloaded: expected the file it points to (`git lfs "
            "pull` in its repository fetches it)",
        ),
    ],
    ids=["csv", "text", "empty", "zeros", "html", "store", "jpeg", "npz", "lfs"],
)
def test_a_file_torch_save_did_not_write_is_named_for_what_it_looks_like(tmp_path, content, looks):
    """Each was said to hold "objects other than tensors, numbers, strings, lists and dicts": torch's weights-only
    reader says so of any byte it cannot parse as a pickle."""
    path = tmp_path / "model.pt"
    path.write_bytes(content)
    with pytest.raises(UserError) as e:
        load_checkpoint(path)
    assert str(e.value) == f"{path}: {NOT_TORCH}{looks}"


def test_real_pickles_keep_their_messages_and_torchs_legacy_format_still_loads(tmp_path):
    unsafe = tmp_path / "unsafe.pt"
    torch.save({"model": argparse.Namespace()}, unsafe)
    with pytest.raises(UserError, match="holds objects other than tensors, numbers, strings, lists and dicts"):
        load_checkpoint(unsafe)
    legacy = tmp_path / "legacy.pt"
    torch.save({"epoch": 3, "w": torch.ones(2)}, legacy, _use_new_zipfile_serialization=False)
    assert load_checkpoint(legacy)["epoch"] == 3
    cut = tmp_path / "cut.pt"
    torch.save({"epoch": 3, "w": torch.ones(1000)}, cut)
    cut.write_bytes(cut.read_bytes()[:2000])  # a zip cut short: torch's reason ran on for 200 characters
    with pytest.raises(UserError) as e:
        load_checkpoint(cut)
    assert str(e.value) == (
        f"{cut}: cut short: its zip index, written last, is missing (a copy or a save that did not finish?): "
        "expected a .pt file of cnnpar train (a run folder, or its ckpt/last.pt or ckpt/best.pt)"
    )


def _described(**meta) -> dict:
    base = {"model": "resnet18", "image_shape": [3, 32, 32], "num_classes": 10, "mean": [0.5] * 3, "std": [0.25] * 3}
    return {"model": {}, "meta": {**base, "class_names": [], **meta}, "config": {"data": {}}}


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"num_classes": 10**12}, "num_classes is 1000000000000: expected a whole number from 1 to 1,000,000"),
        ({"num_classes": True}, "num_classes is True"),
        (
            {"image_shape": [3, 10**6, 10**6]},
            "image_shape is [3, 1000000, 1000000]: expected [channels, height, width]",
        ),
        ({"std": [0.25, 0.0, 0.25]}, "std is [0.25, 0.0, 0.25]: expected one number per channel"),
        ({"mean": ["a", 0.5, 0.5]}, "mean is ['a', 0.5, 0.5]"),
        ({"config": ["data"]}, "config is ['data']: expected a dict of sections"),
    ],
)
def test_a_checkpoint_whose_description_lies_is_refused_before_its_model_is_built(tmp_path, change, named):
    """predict builds the model and reads inputs from the checkpoint's meta before its weights: an edited or foreign
    file asked for a classifier of 10**12 classes or inputs of 10**6 x 10**6 (terabytes), or a std of 0 made every
    input inf; a config that is no dict of sections ended in an AttributeError traceback."""
    from cnnpar.engine.checkpoint import require_model_description

    state = _described(**{k: v for k, v in change.items() if k != "config"})
    state["config"] = change.get("config", state["config"])
    path = tmp_path / "lie.pt"
    torch.save(state, path)
    with pytest.raises(
        UserError, match=r"lie.pt: not a checkpoint predict can read \(its (meta's )?" + re.escape(named)
    ):
        require_model_description(load_checkpoint(path), path)


def test_a_training_checkpoint_of_a_negative_epoch_is_refused(tmp_path):
    """A resume from epoch -3 started the schedule before its start and trained epochs -2, -1 and 0."""
    from cnnpar.engine.checkpoint import TRAINING_STATE, require_training_state

    path = tmp_path / "last.pt"
    state = {k: {} for k in TRAINING_STATE} | {"epoch": -3, "history": []}
    with pytest.raises(UserError, match=r"last.pt: not a cnnpar training checkpoint \(epoch -3\)"):
        require_training_state(state, path)
    require_training_state(state | {"epoch": 0}, path)
