"""What loading a large array costs in memory: the copies cnnpar makes of a user's images, counted by what is
still alive when the next copy is made (not by timing or RSS, which other processes move)."""

from __future__ import annotations

import weakref

import numpy as np
import pytest
import torch

from cnnpar.config import DataConfig
from cnnpar.data import arrays, load_data, sources
from cnnpar.data.bundle import ArrayDataset
from cnnpar.errors import DataError


def test_an_npz_of_nhwc_images_is_let_go_before_the_hold_out_copies_them(tmp_path, monkeypatch):
    """x_train of (N, H, W, 3) is copied to (N, 3, H, W); the archive's own array stayed alive through the hold-out's
    copies, a third copy at the peak (9.96 GB of RSS loading a 3.1 GB CIFAR-shaped array, 6 GB without it)."""
    rng = np.random.default_rng(0)
    path = tmp_path / "d.npz"
    np.savez(path, x_train=rng.integers(0, 256, (50, 8, 8, 3), dtype=np.uint8), y_train=np.arange(50) % 5)
    read = sources._read_npz
    originals: list[weakref.ref] = []

    def tracked_read(p):
        arrays = read(p)
        originals.append(weakref.ref(arrays["x_train"]))
        return arrays

    alive_at_split: list[bool] = []
    subset = ArrayDataset.subset

    def tracked_subset(self, idx):
        alive_at_split.append(originals[0]() is not None)
        return subset(self, idx)

    monkeypatch.setattr(sources, "_read_npz", tracked_read)
    monkeypatch.setattr(ArrayDataset, "subset", tracked_subset)
    bundle = load_data(DataConfig(source=str(path), val_fraction=0.2), 0)
    assert len(bundle.train) == 40 and len(bundle.val) == 10
    assert alive_at_split == [False, False]


@pytest.mark.parametrize("dtype, scale", [(np.float32, 1.0), (np.float64, 255.0), (np.int64, 255)])
def test_float_or_wide_pixels_are_rounded_to_uint8_a_chunk_at_a_time(monkeypatch, dtype, scale):
    """Floats in [0, 1], in [0, 255] and int64 pixels (np.array of a list of images) are rounded a chunk of images at
    a time, to the same pixels: whole, x * 255 and its rounding were two full-size float copies at once (5.3 GB of
    RSS for a 1.6 GB float32 array)."""
    rng = np.random.default_rng(0)
    x = (rng.random((12, 6, 5, 3)) * scale).astype(dtype)  # N, H, W, C: the conversion reads a transposed view
    monkeypatch.setattr(arrays, "CONVERT_CHUNK_BYTES", 4 * x[0].nbytes, raising=False)
    rint, rounded = np.rint, []

    def counted_rint(a, *args, **kwargs):
        rounded.append(a.size)
        return rint(a, *args, **kwargs)

    monkeypatch.setattr(np, "rint", counted_rint)
    out = arrays.to_nchw_uint8(x, "x")
    monkeypatch.setattr(np, "rint", rint)
    whole = np.rint(x * 255.0 if scale == 1.0 else x).astype(np.uint8).transpose(0, 3, 1, 2)
    assert out.is_contiguous() and torch.equal(out, torch.from_numpy(np.ascontiguousarray(whole)))
    assert max(rounded) == 4 * x[0].size and sum(rounded) >= x.size


@pytest.mark.parametrize("held", [False, True])
def test_an_npz_label_error_comes_before_its_images_are_converted(tmp_path, monkeypatch, held):
    """A label out of --num-classes (or a count that differs) is refused before the images' conversion: it came
    after it, 14.8 s and 6.5 GB of RSS into a 3 GB CIFAR-shaped x_train."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (20, 8, 8, 3), dtype=np.uint8)
    y = np.arange(20) % 4
    extra = {"x_val": x[:5], "y_val": np.full(5, 7)} if held else {}
    path = tmp_path / "d.npz"
    np.savez(path, x_train=x, y_train=y if held else np.full(20, 7), **extra)
    converted: list[tuple] = []
    convert = sources.to_nchw_uint8

    def counted(images, where, notes=None):
        converted.append(images.shape)
        return convert(images, where, notes)

    monkeypatch.setattr(sources, "to_nchw_uint8", counted)
    with pytest.raises(DataError, match=r"\[y_(val|train)\], index 0: label 7: expected a label in 0\.\.4"):
        load_data(DataConfig(source=str(path), num_classes=5), 0)
    assert converted == ([(20, 8, 8, 3)] if held else [])
