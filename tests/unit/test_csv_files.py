"""What a CSV reader meets besides good CSV: gzip, files that are no text, fields past the csv module's limit,
and colour rows flattened pixel by pixel. Each is read, or refused in one line naming the file."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
import torch

from cnnpar.config import DataConfig
from cnnpar.data import load_data
from cnnpar.data.csv_source import read_ids, read_pixel_csv
from cnnpar.data.sources import detect_format
from cnnpar.data.store import MAGIC as STORE_MAGIC
from cnnpar.errors import DataError
from tests.datafiles import bar_images, photo_crops, write_pixel_csv


@pytest.mark.parametrize("name", ["train.csv.gz", "gzipped.csv"])
def test_a_gzip_compressed_csv_is_read_as_the_csv_it_holds(tmp_path, name):
    """train.csv.gz was "cannot tell its format", and with --format csv (or named .csv) its bytes were printed as
    column names; pyarrow reads gzip."""
    x, y = bar_images(12)
    plain = write_pixel_csv(tmp_path / "plain.csv", x, y)
    text = plain.read_text().replace("label,", "id,label,", 1).splitlines()
    text = [text[0]] + [f"{i:03d},{line}" for i, line in enumerate(text[1:])]  # an id column, for read_ids
    path = tmp_path / name
    path.write_bytes(gzip.compress(("\n".join(text) + "\n").encode()))
    assert detect_format(str(path), "auto") == "csv"
    got_x, got_y = read_pixel_csv(path)
    assert torch.equal(got_x[:, 0], torch.from_numpy(x)) and torch.equal(got_y, torch.from_numpy(y))
    assert read_ids(path) == ("id", [f"{i:03d}" for i in range(12)])


# a PNG's signature and IHDR chunk (a 1x1 RGB image), as a PNG saved under a .csv name begins
PNG_HEAD = (
    b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x02\x00\x00\x00" + b"\x90wS\xde"
)


@pytest.mark.parametrize(
    "head,gzipped,message",
    [
        (b"PK\x03\x04\x14\x00\x00\x00", False, r"a zip archive \(an \.npz, or a zipped CSV\), not CSV text"),
        (STORE_MAGIC + b"\x00\x01\x02", False, r"a \.cnnpar store, not CSV text"),
        ("label,pixel0\n1,2\n".encode("utf-16"), False, r"UTF-16 text \(Excel's \"Unicode Text\"\): expected a UTF-8"),
        ("label,pixel0\n1,2\n".encode("utf-16"), True, r"UTF-16 text \(inside its gzip compression\)"),
        (bytes(range(256)) * 4, False, r"control bytes in its first 1,024 bytes: a binary file \(an image\?\)"),
        # a PNG's first line, b"\x89PNG\r", holds no control byte: it was read as a header naming "\ufffdPNG"
        (PNG_HEAD, False, r"control bytes in its first 33 bytes: a binary file \(an image\?\), not CSV text"),
    ],
    ids=["zip", "store", "utf16", "utf16_gzipped", "binary", "png"],
)
def test_a_file_that_is_no_csv_text_is_named_for_what_it_is(tmp_path, head, gzipped, message):
    """These printed their bytes (NUL bytes and all) as the header's "column names"; a store named .csv stopped
    in a _csv.Error traceback."""
    path = tmp_path / "data.csv"
    path.write_bytes(gzip.compress(head) if gzipped else head)
    with pytest.raises(DataError, match=rf"^{path}: {message}"):
        read_pixel_csv(path)


def test_a_header_wider_than_the_csv_field_limit_gets_the_separator_line_not_a_traceback(tmp_path):
    """30,000 semicolon-separated names are one field of 190,000 characters: past the csv module's 131,072, which
    raised _csv.Error before the "looks semicolon-separated" check could run."""
    path = tmp_path / "wide.csv"
    path.write_text(";".join(["label"] + [f"pixel{i}" for i in range(30_000)]) + "\n" + ";".join(["0"] * 30_001) + "\n")
    with pytest.raises(DataError, match=r"wide\.csv: the header \(label;pixel0;pixel1\.\.\., 30,001 names\) looks "):
        read_pixel_csv(path, image_shape="3x100x100")


def test_a_data_row_with_a_huge_field_is_named_with_the_value_cut_short(tmp_path):
    """A 200,000-character field: pyarrow failed, then the row-by-row diagnosis raised _csv.Error (and int() of
    200,000 digits a ValueError)."""
    x, y = bar_images(4)
    lines = write_pixel_csv(tmp_path / "t.csv", x, y).read_text().splitlines()
    lines[2] = "1," + "9" * 200_000 + lines[2][lines[2].index(",", 2) :]
    path = tmp_path / "huge.csv"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as e:
        read_pixel_csv(path)
    assert str(e.value) == (
        f"{path}, line 3 (data row 2), column 'pixel0': {'9' * 37}...: expected a pixel value 0..255"
    )


def _colour_csv(tmp_path, images: np.ndarray, layout: str) -> str:
    """images (N, H, W, 3) written one row each, channel by channel (CHW) or pixel by pixel (HWC)."""
    flat = images.transpose(0, 3, 1, 2) if layout == "chw" else images
    y = np.arange(len(images)) % 2
    return str(write_pixel_csv(tmp_path / f"{layout}.csv", flat, y))


@pytest.mark.parametrize("side", [8, 32])
def test_colour_rows_stored_pixel_by_pixel_are_warned_about_and_channel_by_channel_ones_not(tmp_path, side):
    """x.reshape(N, -1) of (N, H, W, 3) photos (numpy's, PIL's and Keras' layout) trained as scrambled CHW images
    without a word."""
    photos = photo_crops(60, side)
    shape = f"3x{side}x{side}"
    notes: list[str] = []
    read_pixel_csv(_colour_csv(tmp_path, photos, "chw"), shape, notes=notes)
    assert notes == []
    hwc = _colour_csv(tmp_path, photos, "hwc")
    read_pixel_csv(hwc, shape, notes=notes)
    assert notes == [
        f"warning: {hwc}: the rows look stored pixel by pixel (r,g,b of each pixel together: x.reshape(N, -1) of "
        "(N, H, W, 3) images), and are read channel by channel (CHW), which scrambles every image: "
        f"np.transpose(x.reshape(N, {side}, {side}, 3), (0, 3, 1, 2)).reshape(N, -1) writes CHW rows"
    ]
    bundle = load_data(DataConfig(source=hwc, image_shape=shape), 0)  # said where a run says how data was read
    assert bundle.load_note == notes[0]


@pytest.mark.parametrize("layout", ["chw", "hwc"])
def test_the_layout_check_keeps_quiet_on_noise_and_on_images_alike_in_every_channel(tmp_path, layout):
    noise = np.random.default_rng(1).integers(0, 256, (60, 16, 16, 3), dtype=np.uint8)
    bars, _ = bar_images(60, channels=3)  # grey bars: the three channels equal
    for images in (noise, bars):
        notes: list[str] = []
        read_pixel_csv(_colour_csv(tmp_path, images, layout), "3x16x16", notes=notes)
        assert notes == [], layout
    # the auditor's case: red noise, green 0, blue 255, pixel by pixel: its channel means came out 129, 127, 129
    red = np.random.default_rng(2).integers(0, 256, (40, 8, 8), dtype=np.uint8)
    split = np.stack([red, np.zeros_like(red), np.full_like(red, 255)], axis=-1)
    notes = []
    x, _ = read_pixel_csv(_colour_csv(tmp_path, split, layout), "3x8x8", notes=notes)
    assert len(notes) == (layout == "hwc")
    if layout == "chw":
        assert x.float().mean(dim=(0, 2, 3)).round().tolist() == [float(red.mean().round()), 0.0, 255.0]
