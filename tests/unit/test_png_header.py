"""PNGs through `folder.decode_rgb`: the image-data bound (`png_header.data_shortfall`), which refuses a PNG whose
image data cannot hold its pixels from its chunk lengths while every ordinary PNG (palette, 16-bit, 1-bit,
interlaced, compressed as far as deflate goes) passes; and Pillow's decode (`folder.decode_png`, there because
torchvision 0.29's PNG decoder crashes the process on damaged image data), which gives torchvision's pixels for
every valid PNG. No file that crashes torchvision is handed to it here: that would end pytest itself."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
import torch

from cnnpar.data.folder import decode_rgb, read_encoded
from cnnpar.data.png_header import MAX_DEFLATE_RATIO, data_shortfall, filtered_bytes, read_png_header
from cnnpar.data.tv_codecs import TV_CODEC_DEPRECATION
from cnnpar.errors import DataError
from tests.datafiles import short_png

pytestmark = pytest.mark.filterwarnings(f"ignore:{TV_CODEC_DEPRECATION}:DeprecationWarning")

EXPECTED_TAIL = "expected a readable JPEG or PNG file"
ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(width: int, height: int, idat: bytes | list[bytes], colour: int = 2, interlaced: bool = False) -> bytes:
    """An 8-bit PNG of the given header whose image data is `idat` (one IDAT chunk, or one per item)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, colour, 0, 0, int(interlaced))
    idats = b"".join(chunk(b"IDAT", part) for part in (idat if isinstance(idat, list) else [idat]))
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"gAMA", b"\x00\x00\xb1\x8f") + idats + chunk(b"IEND", b"")
    )


def filtered_rows(pixels: np.ndarray, interlaced: bool) -> bytes:
    """What an (h, w, 3) uint8 picture's image data inflates to: each row of each pass after a filter byte 0."""
    passes = ADAM7 if interlaced else ((0, 0, 1, 1),)
    rows = []
    for x0, y0, dx, dy in passes:
        sub = pixels[y0::dy, x0::dx]
        if sub.size:
            rows += [b"\x00" + row.tobytes() for row in sub]
    return b"".join(rows)


def pillow_png(img, **options) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    (img if isinstance(img, Image.Image) else Image.fromarray(img)).save(buf, format="PNG", **options)
    return buf.getvalue()


def inflated_size(data: bytes) -> int:
    """The bytes a PNG's IDAT chunks inflate to."""
    i, stream = 8, b""
    while i < len(data):
        (length,) = struct.unpack(">I", data[i : i + 4])
        if data[i + 4 : i + 8] == b"IDAT":
            stream += data[i + 8 : i + 8 + length]
        i += 12 + length
    return len(zlib.decompress(stream))


def picture(h: int, w: int) -> np.ndarray:
    return np.random.default_rng(h * 1000 + w).integers(0, 256, (h, w, 3), dtype=np.uint8)


@pytest.mark.parametrize("interlaced", [False, True])
@pytest.mark.parametrize("size", [(1, 1), (3, 5), (5, 3), (8, 8), (7, 13), (9, 17), (1, 40), (40, 1), (33, 64)])
def test_filtered_bytes_is_what_the_image_data_inflates_to(size, interlaced):
    h, w = size
    raw = filtered_rows(picture(h, w), interlaced)
    header = read_png_header(png(w, h, zlib.compress(raw), interlaced=interlaced))
    assert header is not None and header.interlaced == interlaced
    assert filtered_bytes(header) == len(raw)


def pillow_files() -> dict[str, bytes]:
    """Ordinary PNGs as Pillow writes them: every colour type and the bit depths other than 8."""
    from PIL import Image

    rgb = picture(37, 53)
    grey16 = (np.arange(37 * 53, dtype=np.uint32).reshape(37, 53) * 13 % 65536).astype(np.uint16)
    return {
        "rgb": pillow_png(rgb),
        "rgba": pillow_png(np.concatenate([rgb, rgb[..., :1]], -1)),
        "grey": pillow_png(rgb[..., 0]),
        "grey_alpha": pillow_png(Image.fromarray(rgb).convert("LA")),
        "palette": pillow_png(Image.fromarray(rgb).convert("P")),
        "palette_4bit": pillow_png(
            Image.fromarray(rgb).convert("P", palette=Image.Palette.ADAPTIVE, colors=16), bits=4
        ),
        "grey_16bit": pillow_png(Image.fromarray(grey16)),
        "one_bit": pillow_png(Image.fromarray(rgb[..., 0] > 127)),
        # a flat picture: Pillow's level 9 packs 623 bytes of its rows into one (the interlaced test below: 1024)
        "white_2000x2000": pillow_png(np.full((2000, 2000), 255, np.uint8), compress_level=9),
    }


PILLOW_FILES = pillow_files()


@pytest.mark.parametrize("name", PILLOW_FILES)
def test_an_ordinary_png_passes_and_decodes_as_pillow_reads_it(tmp_path, name):
    from PIL import Image

    data = PILLOW_FILES[name]
    header = read_png_header(data)
    assert header is not None and filtered_bytes(header) == inflated_size(data)
    assert data_shortfall(data, header) is None
    path = tmp_path / f"{name}.png"
    path.write_bytes(data)
    with Image.open(path) as im:
        expected = np.asarray(im.convert("RGB")) if im.mode not in ("I;16", "I") else None
        if expected is None:  # 16-bit grey: decode_rgb keeps the top 8 bits
            expected = np.repeat((np.asarray(im).astype(np.int64) >> 8).astype(np.uint8)[..., None], 3, -1)
    assert torch.equal(decode_rgb(read_encoded(path), path).permute(1, 2, 0), torch.from_numpy(expected.copy()))


SAMPLES = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # per pixel, by colour type: grey, RGB, palette, grey + alpha, RGBA
DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}  # every depth PNG allows


def packed_rows(samples: np.ndarray, depth: int) -> list[bytes]:
    """The rows of an (h, w, samples) array of `depth`-bit values as PNG packs them: big-endian 16-bit samples,
    sub-byte ones from the high bits down, each row padded to a whole byte."""
    flat = samples.reshape(len(samples), -1)
    if depth >= 8:
        return [row.astype(">u2" if depth == 16 else np.uint8).tobytes() for row in flat]
    bits = ((flat[..., None] >> np.arange(depth - 1, -1, -1)) & 1).reshape(len(flat), -1).astype(np.uint8)
    return [row.tobytes() for row in np.packbits(bits, axis=1)]


def any_png(samples: np.ndarray, depth: int, colour: int, interlaced: bool, chunks: bytes = b"") -> bytes:
    """A PNG of `samples` in any colour type and bit depth, Adam7 or not (filter 0), `chunks` before its data."""
    h, w = samples.shape[:2]
    passes = ADAM7 if interlaced else ((0, 0, 1, 1),)
    subs = [samples[y0::dy, x0::dx] for x0, y0, dx, dy in passes]
    raw = b"".join(b"\x00" + row for sub in subs if sub.size for row in packed_rows(sub, depth))
    ihdr = struct.pack(">IIBBBBB", w, h, depth, colour, 0, 0, int(interlaced))
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunks + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    )


def every_kind_of_png() -> dict[str, bytes]:
    """Noise in every colour type and bit depth, plain and interlaced, plain and with a tRNS or gAMA chunk (which
    neither decoder applies: libpng as torchvision drives it, Pillow's convert to RGB)."""
    rng = np.random.default_rng(0)
    files = {}
    for colour, depths in DEPTHS.items():
        for depth in depths:
            top = (1 << depth) - 1
            palette = chunk(b"PLTE", rng.integers(0, 256, 3 << depth, dtype=np.uint8).tobytes()) if colour == 3 else b""
            extras = {"": palette, "_gama": palette + chunk(b"gAMA", struct.pack(">I", 45455))}
            if colour == 3:
                extras["_trns"] = palette + chunk(b"tRNS", bytes(range(0, 256, 64))[: 1 << depth])
            elif colour in (0, 2):
                extras["_trns"] = chunk(
                    b"tRNS", struct.pack(">" + "H" * SAMPLES[colour], *[top // 2] * SAMPLES[colour])
                )
            for interlaced in (False, True):
                for extra, chunks in extras.items():
                    samples = rng.integers(0, top + 1, (19, 23, SAMPLES[colour]), dtype=np.uint32)
                    name = f"colour{colour}_{depth}bit{'_adam7' * interlaced}{extra}"
                    files[name] = any_png(samples, depth, colour, interlaced, chunks)
    return files


EVERY_KIND = every_kind_of_png()


@pytest.mark.parametrize("name", EVERY_KIND)
def test_every_kind_of_png_decodes_to_torchvisions_pixels(name):
    """decode_rgb decoded PNGs with torchvision until its crashes on damaged files moved them to Pillow: the pixels
    (16-bit: the top 8 bits) and their layout (a permuted view of interleaved pixels) are what they were."""
    from torchvision.io import ImageReadMode, decode_image

    data = torch.frombuffer(bytearray(EVERY_KIND[name]), dtype=torch.uint8)
    before = decode_image(data, mode=ImageReadMode.RGB)
    if before.dtype != torch.uint8:
        before = (before.to(torch.int32) >> 8).to(torch.uint8)
    now = decode_rgb(data, name)
    assert torch.equal(now, before) and now.stride() == before.stride()


def test_an_interlaced_png_compressed_as_far_as_deflate_goes_passes_and_decodes(tmp_path):
    """Pillow writes no interlaced PNG: one made here (Adam7, filter 0), black (its rows all zero bytes, filter
    bytes included) at zlib's level 9."""
    pixels = np.zeros((1500, 1000, 3), np.uint8)
    raw = filtered_rows(pixels, interlaced=True)
    data = png(1000, 1500, zlib.compress(raw, 9), interlaced=True)
    assert len(raw) / len(zlib.compress(raw, 9)) > 1020  # 1024, near the bound's 1032: a count 1 % too high refuses it
    assert data_shortfall(data, read_png_header(data)) is None
    path = tmp_path / "interlaced.png"
    path.write_bytes(data)
    assert torch.equal(decode_rgb(read_encoded(path), path), torch.from_numpy(pixels).permute(2, 0, 1))


def test_the_bound_is_one_in_1032_of_the_filtered_rows_summed_over_every_idat_chunk():
    header = read_png_header(png(100, 100, b""))
    fewest = -(-100 * (1 + 300) // MAX_DEFLATE_RATIO)  # 30
    for parts, refused in (
        ([b"x" * fewest], False),
        ([b"x" * (fewest - 1)], True),
        ([b"x" * 10, b"x" * 10, b"x" * (fewest - 20)], False),  # split over three chunks: their sum counts
        ([b"x" * 10, b"x" * (fewest - 11)], True),
    ):
        data = png(100, 100, parts)
        assert (data_shortfall(data, header) is not None) == refused, parts
    whole = png(100, 100, b"x" * 100)
    cut = whole[: whole.index(b"IDAT") + 4 + fewest - 1]  # the file ends inside its IDAT chunk: the bytes it holds
    assert data_shortfall(cut, header) == (fewest - 1, fewest)
    assert data_shortfall(whole[: whole.index(b"IDAT") + 4 + fewest], header) is None


SHORT = {
    # the zlib stream is whole, and inflates to 100 bytes where the header's rows need 30,100
    "100x100_with_100_bytes": (short_png(100, 100, 100), "100x100", "12", "30"),
    # 169 megapixels: under the pixel limit, so only the data bound refuses it
    "13000x13000_with_100_bytes": (short_png(13000, 13000, 100), "13000x13000", "12", "491,292"),
}


@pytest.mark.parametrize("name", SHORT)
def test_a_png_whose_data_cannot_hold_its_pixels_is_named_before_torchvision_sees_it(tmp_path, monkeypatch, name):
    import torchvision.io

    data, size, held, fewest = SHORT[name]

    def crashes(*args, **kwargs):  # what torchvision 0.29 does with it: a SIGSEGV that would end pytest
        raise AssertionError("torchvision was handed a PNG it crashes on")

    monkeypatch.setattr(torchvision.io, "decode_image", crashes)
    path = tmp_path / f"{name}.png"
    path.write_bytes(data)
    with pytest.raises(DataError) as e:
        decode_rgb(read_encoded(path), path)
    assert str(e.value) == (
        f"{path}: cannot decode as an image (PNG image data of {held} bytes, where its {size} pixels need at least "
        f"{fewest} however compressed: cut short or damaged): {EXPECTED_TAIL}"
    )
