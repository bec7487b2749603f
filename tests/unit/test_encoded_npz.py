"""An .npz of encoded images (`train_jpeg` + `train_offsets`, the layout of the shared CIFAR-10 copy) trains as its
decoded arrays would; every malformed part is one line naming the array and the image."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from cnnpar.config import DataConfig
from cnnpar.data import load_data, load_predict_data, sources
from cnnpar.errors import DataError
from tests.datafiles import bar_images


def _encoded(images, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    files = []
    for img in images:
        out = io.BytesIO()
        Image.fromarray(img).save(out, format=fmt)
        files.append(np.frombuffer(out.getvalue(), np.uint8))
    offsets = np.cumsum([0] + [len(f) for f in files]).astype(np.int64)
    return np.concatenate(files), offsets


def _write(path, **arrays):
    np.savez(path, **arrays)
    return path


def test_encoded_images_load_as_their_pixels_with_the_archives_class_names(tmp_path, monkeypatch):
    x, y = bar_images(40, classes=4, side=16, channels=3)
    x_test, y_test = bar_images(12, classes=4, side=16, channels=3, seed=1)
    train, train_off = _encoded(x, "PNG")  # lossless: the decoded pixels are the arrays themselves
    test, test_off = _encoded(x_test, "JPEG")
    names = np.array(["ant", "bee", "cat", "dog"])
    path = _write(tmp_path / "enc.npz", train_png=train, train_offsets=train_off, y_train=y, test_jpeg=test,
                  test_offsets=test_off, y_test=y_test, class_names=names)  # fmt: skip
    bundle = load_data(DataConfig(source=str(path)), 0)
    assert bundle.shape == (3, 16, 16) and bundle.class_names == ["ant", "bee", "cat", "dog"]
    assert np.array_equal(bundle.train.x.permute(0, 2, 3, 1).numpy(), x)
    assert len(bundle.val) == 12 and bundle.val_from.startswith("the data's own test split")
    assert bundle.load_note.startswith("data: 52 encoded images decoded from train_png and test_jpeg in ")
    assert " s (JPEGs by simplejpeg), at every start" in bundle.load_note  # the test extra installs it
    monkeypatch.setattr(sources, "simplejpeg_module", lambda: None)
    without = load_data(DataConfig(source=str(path)), 0).load_note
    faster = "simplejpeg, a dependency of cnnpar, is faster: pip install simplejpeg"
    assert f" s (by torchvision; {faster}), at every start" in without
    with Image.open(io.BytesIO(test[test_off[3] : test_off[4]].tobytes())) as im:
        assert np.array_equal(bundle.val.x[3].permute(1, 2, 0).numpy(), np.asarray(im.convert("RGB")))
    ds, ids, labels_from = load_predict_data(str(path))  # predict reads the test images the same way
    assert len(ds) == 12 and labels_from == "y_test"


def test_grey_images_stay_one_channel(tmp_path):
    x, y = bar_images(10, classes=2, side=12)  # (N, H, W): grey
    data, offsets = _encoded(x, "PNG")
    path = _write(tmp_path / "grey.npz", train_png=data, train_offsets=offsets, y_train=y)
    bundle = load_data(DataConfig(source=str(path)), 0)
    assert bundle.shape == (1, 12, 12)


@pytest.mark.parametrize(
    "break_it, message",
    [
        ("size", r"enc.npz\[train_png\] image 3: 20x16 pixels, image 0 16x16: expected one size for every image"),
        ("corrupt", r"enc.npz\[train_png\] image 2: cannot decode as an image .*expected a readable JPEG or PNG"),
        ("offsets", r"enc.npz\[train_png\]: offsets 0..\d+ for \d+ bytes \(offset 5 is below offset 4\)"),
        ("names", r"enc.npz\[class_names\]: 2 names for 3 classes \(labels' max \+ 1\): expected one name a class"),
        ("no images", r"missing key\(s\) x_train .*or train_jpeg \+ train_offsets"),
    ],
)
def test_a_malformed_encoded_archive_is_one_line_naming_the_array_and_image(tmp_path, break_it, message):
    x, y = bar_images(8, classes=2, side=16, channels=3)
    images = list(x)
    if break_it == "size":
        images[3] = np.zeros((16, 20, 3), np.uint8)
    data, offsets = _encoded(images, "PNG")
    arrays = dict(train_png=data, train_offsets=offsets, y_train=y)
    if break_it == "corrupt":
        data[offsets[2] + 20 : offsets[3]] = 7
    if break_it == "offsets":
        offsets[5] = offsets[4] - 1
    if break_it == "names":  # fewer names than labels (more are the class count: test_sources)
        arrays.update(class_names=np.array(["a", "b"]), y_train=np.arange(len(y)) % 3)
    if break_it == "no images":
        del arrays["train_png"]
    path = _write(tmp_path / "enc.npz", **arrays)
    with pytest.raises(DataError, match=message):
        load_data(DataConfig(source=str(path)), 0)


@pytest.mark.parametrize("channels", [1, 3])
def test_encoded_images_three_pixels_tall_are_not_transposed(tmp_path, channels):
    """Decoded N, H, W, C images with H = 3 were taken for N, C, H, W and transposed."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (8, 3, 5, channels), dtype=np.uint8)
    images = x[..., 0] if channels == 1 else x
    buf, offsets = _encoded(images, "PNG")
    path = _write(tmp_path / "tall3.npz", train_png=buf, train_offsets=offsets, y_train=np.arange(8) % 2)
    bundle = load_data(DataConfig(source=str(path), val_fraction=0))
    assert bundle.train.x.shape == (8, channels, 3, 5)
    assert np.array_equal(bundle.train.x.numpy(), x.transpose(0, 3, 1, 2))
    ds, _, _ = load_predict_data(str(path))
    assert np.array_equal(ds.x.numpy(), x.transpose(0, 3, 1, 2))
