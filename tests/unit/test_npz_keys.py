"""An .npz's keys and values as cnnpar reads them: a validation split under the names an image folder's takes,
every key it does not read named, and a line wherever the pixels' reading is not plain 0..255."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from cnnpar.config import DataConfig
from cnnpar.data import load_data, load_predict_data
from cnnpar.data.arrays import to_nchw_uint8
from cnnpar.errors import DataError
from tests.datafiles import bar_images, damaged_jpeg, stray_bytes

UNREAD = (
    "cnnpar reads x_train, y_train, one held-out split (x_val, y_val; or valid, validation, test, testing), "
    "class_names, and train_jpeg|png + train_offsets in place of x_train"
)


def _load(path, **cfg):
    return load_data(DataConfig(source=str(path), **cfg), 0)


@pytest.mark.parametrize("split", ["val", "valid", "validation", "test"])
def test_a_held_out_split_under_any_folder_name_validates(tmp_path, split):
    """x_val/y_val were left unread without a word, and 20 % of x_train was held out instead."""
    x, y = bar_images(40)
    path = tmp_path / "d.npz"
    np.savez(path, x_train=x[:30], y_train=y[:30], **{f"x_{split}": x[30:], f"y_{split}": y[30:]})
    bundle = _load(path)
    assert len(bundle.train) == 30 and torch.equal(bundle.val.x[:, 0], torch.from_numpy(x[30:]))
    word = "test" if split == "test" else f"validation split (x_{split})"
    assert bundle.val_from.startswith(f"the data's own {word}") and bundle.load_note == ""
    dataset, _, labels_from = load_predict_data(str(path))  # predict reads the split training validated on
    assert len(dataset) == 10 and labels_from == f"y_{split}"
    from cnnpar.config import Config
    from cnnpar.flag_effects import unused_flags

    (line,) = unused_flags(Config(data=DataConfig(source=str(path), val_fraction=0.1)), {"data.val_fraction"})
    word = "test" if split == "test" else "validation"
    assert f"validates on its own {word} split (x_{split}, y_{split})" in line


def test_a_second_held_out_split_is_named_not_read_and_an_incomplete_first_is_refused(tmp_path):
    x, y = bar_images(40)
    path = tmp_path / "two.npz"
    np.savez(path, x_train=x[:20], y_train=y[:20], x_test=x[20:30], y_test=y[20:30], x_val=x[30:], y_val=y[30:])
    bundle = _load(path)
    assert torch.equal(bundle.val.x[:, 0], torch.from_numpy(x[30:]))  # val first, as a folder's val/ before test/
    assert bundle.load_note == (
        f"warning: {path}: key(s) x_test, y_test not read (val validates, the first of "
        f"val|valid|validation|test|testing): {UNREAD}"
    )
    np.savez(path, x_train=x[:20], y_train=y[:20], x_val=x[30:], x_test=x[20:30], y_test=y[20:30])
    with pytest.raises(DataError, match=r"two\.npz: has only one of x_val / y_val: expected both or neither"):
        _load(path)


def test_keys_that_are_not_read_are_named(tmp_path):
    x, y = bar_images(20)
    path = tmp_path / "extra.npz"
    np.savez(path, x_train=x, y_train=y, mean=x.mean(0), foo=np.arange(3))
    assert _load(path).load_note == f"warning: {path}: key(s) mean, foo not read: {UNREAD}"
    from PIL import Image  # x_train beside train_jpeg: x_train is read, and train_jpeg was dropped unsaid

    jpeg = tmp_path / "a.jpg"
    Image.fromarray(x[0]).save(jpeg)
    data = np.frombuffer(jpeg.read_bytes(), np.uint8)
    np.savez(path, x_train=x, y_train=y, train_jpeg=data, train_offsets=np.array([0, len(data)]))
    assert _load(path).load_note == (
        f"warning: {path}: key(s) train_jpeg, train_offsets not read (x_train is read, not train_jpeg): {UNREAD}"
    )


@pytest.mark.parametrize("top", [3.0, 10.0, 31.0])
def test_float_pixels_of_a_few_levels_that_are_not_whole_numbers_are_refused(top):
    """Floats over [0, 3] read as 0..255 rounded to 4 grey levels ([0, 10] to 11) and trained without a note."""
    x = np.random.default_rng(0).random((20, 8, 8)) * top
    x.flat[0] = top
    with pytest.raises(DataError) as e:
        to_nchw_uint8(x, "d.npz[x_train]")
    assert str(e.value) == (
        f"d.npz[x_train]: float values in [{x.min():g}, {top:g}], not whole numbers: neither pixels in [0, 1] nor "
        f"in [0, 255] (read as 0..255 they round to {int(top) + 1} grey levels): expected every value in [0, 1] "
        "(x / x.max()) or pixels in [0, 255] (x * 255 / x.max())"
    )


def test_whole_or_wide_floats_are_read_and_the_reading_is_said_where_it_is_not_plain():
    rng = np.random.default_rng(0)
    notes: list[str] = []
    assert to_nchw_uint8(rng.random((20, 8, 8)) * 40, "w", notes).max() == 40 and notes == []  # 32 and above
    digits = np.rint(rng.random((20, 8, 8)) * 16)  # scikit-learn's digits: floats of whole numbers 0..16
    assert torch.equal(to_nchw_uint8(digits, "d", notes)[:, 0], torch.from_numpy(digits.astype(np.uint8)))
    to_nchw_uint8(np.rint(rng.random((20, 8, 8)) * 16).astype(np.int64), "i", notes)
    to_nchw_uint8(rng.random((20, 8, 8)).astype(np.float32), "f", notes)
    to_nchw_uint8(rng.integers(0, 256, (20, 8, 8), dtype=np.uint8), "u", notes)  # plain pixels: nothing to say
    dark = "only, read as they are on the 0..255 scale (dark: training normalises each channel, so it learns alike"
    assert [n.split(": ", 2)[1:] for n in notes] == [
        ["d", f"pixel values 0..16 {dark}; x * 255 / x.max() fills the range)"],
        ["i", f"pixel values 0..16 {dark}; x * 255 / x.max() fills the range)"],
        ["f", "float pixels in [" + notes[2].split("[", 1)[1]],
    ]
    assert notes[2].endswith("], read as [0, 1]: scaled by 255")


def test_an_npz_run_says_how_its_pixels_were_read_once(tmp_path):
    x, y = bar_images(20)
    path = tmp_path / "f.npz"
    np.savez(path, x_train=x / 255.0, y_train=y, x_test=x / 255.0, y_test=y)
    assert (
        _load(path).load_note == f"note: {path}[x_train]: float pixels in [0, 0.901961], read as [0, 1]: scaled by 255"
    )


def test_a_damaged_jpeg_in_an_encoded_archive_is_named_and_counted_as_torchvision_s(tmp_path):
    """simplejpeg (strict) declined it and torchvision decoded it: libjpeg's own line named no image, and the load
    line said every JPEG was simplejpeg's."""
    from cnnpar.data.cpu_decode import simplejpeg_module

    if simplejpeg_module() is None:
        pytest.skip("simplejpeg is not installed: every JPEG is torchvision's")
    files = [damaged_jpeg(seed=k) if k == 2 else _good_jpeg(k) for k in range(6)]
    offsets = np.cumsum([0] + [len(f) for f in files])
    path = tmp_path / "enc.npz"
    np.savez(path, train_jpeg=np.frombuffer(b"".join(files), np.uint8), train_offsets=offsets, y_train=np.arange(6) % 2)
    lines = _load(path, val_fraction=0).load_note.splitlines()
    assert "(JPEGs by simplejpeg, 1 of 6 by torchvision: files simplejpeg declines)" in lines[0]
    assert lines[1].startswith(f"warning: {path}[train_jpeg] image 2: damaged JPEG data (libjpeg: Corrupt JPEG data")
    assert lines[1].endswith("), decoded anyway by torchvision") and len(lines) == 2


def test_a_jpeg_with_stray_bytes_between_its_segments_in_an_encoded_archive_is_named_in_training_and_predict(tmp_path):
    """Stray bytes hide its frame header from jpeg_header, so simplejpeg never saw it and torchvision decoded it with
    libjpeg's bare "Corrupt JPEG data: 7 extraneous bytes before marker 0xdb", naming no archive, array or image (an
    image folder's file was named: test_odd_images), and the load line said every JPEG was simplejpeg's."""
    from cnnpar.data.cpu_decode import simplejpeg_module

    if simplejpeg_module() is None:
        pytest.skip("simplejpeg is not installed: every JPEG is torchvision's, and its header reader finds the damage")
    files = [stray_bytes(_good_jpeg(k)) if k in (1, 4) else _good_jpeg(k) for k in range(6)]
    offsets = np.cumsum([0] + [len(f) for f in files])
    path = tmp_path / "enc.npz"
    np.savez(path, train_jpeg=np.frombuffer(b"".join(files), np.uint8), train_offsets=offsets, y_train=np.arange(6) % 2)
    said = (
        f"warning: {path}[train_jpeg] image 1: damaged JPEG data (libjpeg: Corrupt JPEG data: 7 extraneous bytes "
        f"before marker 0xdb), decoded anyway by torchvision; 1 more such image(s), the first {path}[train_jpeg] "
        "image 4"
    )
    lines = _load(path, val_fraction=0).load_note.splitlines()
    assert "(JPEGs by simplejpeg, 2 of 6 by torchvision: files simplejpeg declines)" in lines[0]
    assert lines[1:] == [said]
    notes: list[str] = []
    load_predict_data(str(path), notes=notes)
    assert notes == [said]


def _good_jpeg(seed: int) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


def test_predict_reads_the_test_images_beside_a_validation_split(tmp_path):
    """x_val validates in training, but predict is for the test images: with x_val first in the folder order it
    predicted the 10 validation images and never the test ones, without a word (the session 33 review)."""
    x, y = bar_images(45)
    path = tmp_path / "d.npz"
    np.savez(path, x_train=x[:25], y_train=y[:25], x_val=x[25:35], y_val=y[25:35], x_test=x[35:])  # test unlabelled
    notes: list[str] = []
    dataset, _, labels_from = load_predict_data(str(path), notes=notes)
    assert torch.equal(dataset.x[:, 0], torch.from_numpy(x[35:])) and labels_from == ""
    assert notes == [f"images: x_test of {path} (10); the archive also holds x_val, not predicted"]


def _npz_of(path, members: dict[str, bytes], compression=None):
    import zipfile

    with zipfile.ZipFile(path, "w", compression or zipfile.ZIP_STORED) as z:
        for key, data in members.items():
            z.writestr(key + ".npy", data)
    return path


def _npy(shape, dtype="|u1", data=b"") -> bytes:
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buf.getvalue() + data


def test_an_array_whose_header_claims_more_than_its_member_holds_is_refused_before_it_is_allocated(tmp_path):
    """numpy allocates the shape an .npy header claims: 10**12 elements over 100 bytes stopped in a MemoryError
    traceback (a claim that fits in memory allocated it, then failed reading)."""
    y = _npy((4,), "<i8", np.arange(4).tobytes())
    path = _npz_of(tmp_path / "lie.npz", {"x_train": _npy((10**12,), data=bytes(100)), "y_train": y})
    for read in (lambda: _load(path), lambda: load_predict_data(str(path))):
        with pytest.raises(DataError, match=r"lie.npz\[x_train\]: its header claims shape \(1000000000000,\) of uint8"):
            read()


def test_an_archive_whose_arrays_expand_past_the_memory_available_is_refused_before_decompressing(
    tmp_path, monkeypatch
):
    """A few MB of deflated zeros expand to GBs: the arrays' sizes, read from their headers, are held against the
    memory available before any is decompressed (here 100 KB of zeros against 50 KB available)."""
    import zipfile

    import psutil

    x = _npy((100, 32, 32, 1), data=bytes(100 * 32 * 32))
    y = _npy((100,), "<i8", bytes(800))
    path = _npz_of(tmp_path / "bomb.npz", {"x_train": x, "y_train": y}, zipfile.ZIP_DEFLATED)
    assert path.stat().st_size < 2000
    real = psutil.virtual_memory()
    monkeypatch.setattr(psutil, "virtual_memory", lambda: real._replace(available=50_000))
    monkeypatch.setattr(np.lib.npyio.NpzFile, "__getitem__", lambda *a: pytest.fail("an array was decompressed"))
    with pytest.raises(
        DataError,
        match=r"bomb.npz: its arrays take .* GB, more than the .* GB of memory available: expected an archive whose",
    ):
        _load(path)


def test_a_member_that_is_no_array_counts_against_the_memory_available_as_it_is_read_whole(tmp_path, monkeypatch):
    """np.load hands a member not named .npy over as its bytes, whole, and every member is read: 100 KB of deflated
    zeros in notes.txt beside two small arrays, against 50 KB available, is refused before anything is decompressed."""
    import zipfile

    import psutil

    path = _npz_of(
        tmp_path / "notes.npz",
        {"x_train": _npy((4, 2, 2, 1), data=bytes(16)), "y_train": _npy((4,), "<i8", bytes(32))},
        zipfile.ZIP_DEFLATED,
    )
    with zipfile.ZipFile(path, "a", zipfile.ZIP_DEFLATED) as z:
        z.writestr("notes.txt", bytes(100_000))
    real = psutil.virtual_memory()
    monkeypatch.setattr(psutil, "virtual_memory", lambda: real._replace(available=50_000))
    monkeypatch.setattr(np.lib.npyio.NpzFile, "__getitem__", lambda *a: pytest.fail("a member was decompressed"))
    with pytest.raises(DataError, match=r"notes.npz: its arrays take .* GB, more than the .* GB of memory available"):
        _load(path)


def test_a_damaged_header_or_compressed_member_is_refused_in_one_line(tmp_path):
    """An .npy 1.0 header with an unclosed bracket (numpy's tokenizer raised TokenError), one longer than numpy reads
    (its refusal spans three lines), and a deflated member whose stream is damaged (zlib.error): each a traceback, or
    a message of several lines, where a DataError of one line names the archive."""
    import io
    import struct
    import zipfile

    y = _npy((4,), "<i8", bytes(32))
    text = b"{'descr': '|u1', 'fortran_order': False, 'shape': (4,"
    unclosed = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text) + 1) + text + b"\n" + bytes(4)
    long_header = io.BytesIO()
    np.save(long_header, np.zeros(2, np.dtype([(f"f{i}", np.int8) for i in range(2000)])))
    cases = {"unclosed": _npz_of(tmp_path / "unclosed.npz", {"x_train": unclosed, "y_train": y})}
    cases["long"] = _npz_of(tmp_path / "long.npz", {"x_train": long_header.getvalue(), "y_train": y})
    good = tmp_path / "good.npz"
    np.savez_compressed(good, x_train=np.arange(4000, dtype=np.uint8).reshape(10, 20, 20, 1), y_train=np.arange(10))
    raw = bytearray(good.read_bytes())
    with zipfile.ZipFile(good) as z:
        at = z.getinfo("x_train.npy").header_offset
    name_len, extra_len = struct.unpack("<HH", raw[at + 26 : at + 30])
    data = at + 30 + name_len + extra_len
    raw[data : data + 3] = bytes(b ^ 0xA5 for b in raw[data : data + 3])  # the deflate stream's first block header
    (tmp_path / "deflate.npz").write_bytes(bytes(raw))
    cases["deflate"] = tmp_path / "deflate.npz"
    for name, path in cases.items():
        with pytest.raises(DataError, match=rf"{name}.npz.*expected numpy.savez output") as e:
            _load(path)
        assert "\n" not in str(e.value), name


def test_an_encrypted_member_or_a_compression_zipfile_does_not_read_is_refused_in_one_line(tmp_path):
    """zipfile raised RuntimeError (password required) and NotImplementedError (compression method 95): tracebacks."""
    import zipfile

    plain = tmp_path / "plain.npz"
    np.savez(plain, x_train=np.zeros((4, 2, 2, 1), np.uint8), y_train=np.arange(4))
    for name, (local, central, value) in {"encrypted": (6, 8, 1), "method": (8, 10, 95)}.items():
        raw = bytearray(plain.read_bytes())
        at, entry = raw.index(b"PK\x03\x04"), raw.index(b"PK\x01\x02")  # the first member's two headers
        raw[at + local] |= value
        raw[entry + central] |= value
        (tmp_path / f"{name}.npz").write_bytes(bytes(raw))
        with pytest.raises(DataError, match=rf"{name}.npz: not a readable .npz archive \(.*\): expected numpy.savez"):
            _load(tmp_path / f"{name}.npz")
    assert zipfile.is_zipfile(tmp_path / "method.npz")


def test_an_array_member_with_a_tail_or_short_data_is_refused_whatever_its_name_ends_with(tmp_path):
    """numpy reads a member as an array by its first bytes, not its name, and reads only the count its header
    declares: an x_train member (no .npy) holding two arrays trained on the first's 20 images of 40 without a word,
    and one cut short failed in numpy's words ("EOF: reading array data"), naming no shape."""
    import zipfile

    x = np.arange(40 * 8 * 8, dtype=np.uint8).reshape(40, 8, 8, 1)
    half, y = x[:20], np.arange(40) % 4
    save = {k: _npy(a.shape, a.dtype.str, a.tobytes()) for k, a in {"half": half, "x": x, "y": y}.items()}
    cases = {
        "tail": ("x_train.npy", save["half"] + save["half"], "(20, 8, 8, 1) of uint8 (1,280 bytes)", "2,688"),
        "named": ("x_train", save["half"] + save["half"], "(20, 8, 8, 1) of uint8 (1,280 bytes)", "2,688"),
        "short": ("x_train", save["x"][:-50], "(40, 8, 8, 1) of uint8 (2,560 bytes)", "2,510"),
    }
    for name, (member, data, claim, held) in cases.items():
        path = tmp_path / f"{name}.npz"
        with zipfile.ZipFile(path, "w") as z:
            z.writestr(member, data)
            z.writestr("y_train.npy", save["y"])
        said = rf"{name}.npz\[x_train\]: its header claims shape {re.escape(claim)} where the archive holds {held} "
        for read in (_load, lambda p: load_predict_data(str(p))):
            with pytest.raises(DataError, match=said + "bytes of it: expected numpy.savez output"):
                read(path)


@pytest.mark.parametrize("names", [("x_train.npy", "x_train.npy"), ("x_train", "x_train.npy")])
def test_two_members_that_numpy_reads_as_one_array_are_refused_not_one_of_them_trained_on(tmp_path, names):
    """A zip appended to (zipfile mode "a") keeps the array it replaced: numpy read one of the two x_train members,
    here the 20 images of the second, where the archive held 40 in the first."""
    import warnings
    import zipfile

    x = np.zeros((40, 8, 8, 1), np.uint8)
    path = tmp_path / "twice.npz"
    with warnings.catch_warnings(), zipfile.ZipFile(path, "w") as z:
        warnings.simplefilter("ignore")  # zipfile's "Duplicate name"
        z.writestr(names[0], _npy(x.shape, "|u1", x.tobytes()))
        z.writestr("y_train.npy", _npy((40,), "<i8", bytes(320)))
        z.writestr(names[1], _npy((20, 8, 8, 1), "|u1", bytes(1280)))
    said = rf"twice.npz\[x_train\]: two members of the archive hold it \({names[0]} and {names[1]}\), of which numpy"
    with pytest.raises(DataError, match=said + " reads one: expected one member per array, as numpy.savez writes"):
        _load(path)
