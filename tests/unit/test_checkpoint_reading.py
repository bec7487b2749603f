"""load_checkpoint on files torch.save did not write: said what they look like, for predict and resume alike."""

from __future__ import annotations

import argparse
import io

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
    cut.write_bytes(cut.read_bytes()[:2000])  # a zip cut short: torch's own reason
    with pytest.raises(UserError, match="not a readable cnnpar checkpoint"):
        load_checkpoint(cut)
