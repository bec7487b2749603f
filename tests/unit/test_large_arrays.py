"""What loading a large array costs in memory: the copies cnnpar makes of a user's images, counted by what is
still alive when the next copy is made (not by timing or RSS, which other processes move)."""

from __future__ import annotations

import weakref

import numpy as np

from cnnpar.config import DataConfig
from cnnpar.data import load_data, sources
from cnnpar.data.bundle import ArrayDataset


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
