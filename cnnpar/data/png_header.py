"""Read a PNG's header (IHDR) and the lengths of its chunks without decoding it.

Two checks run on a PNG before any decoder sees it (folder.decode_rgb): the size its IHDR gives
(folder.check_pixel_count), and whether its image data could hold that many pixels at all
(`data_shortfall`), refused before a decoder allocates every pixel the header claims. Deflate packs
at most 1032 bytes into one (a 258-byte match coded in two bits), so IDAT chunks holding fewer than
1/1032 of the filtered rows' bytes cannot hold the picture: found from the chunk lengths alone,
nothing inflated. A stream short by less, or damaged inside, goes to the decoder, Pillow
(folder.decode_png), which raises "image file is truncated" or "broken data stream", naming the
file: torchvision 0.29's PNG decoder, which cnnpar used before, killed the process (SIGSEGV) on
any such file instead.
"""

from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# the most bytes deflate can make of one byte of its stream: a 258-byte match in a 1-bit length and a 1-bit distance
# code (zlib level 9 reaches 1029 on 50 MB of zeros)
MAX_DEFLATE_RATIO = 1032
# samples per pixel by colour type: grey, RGB, palette index, grey + alpha, RGBA (others are not PNG: libpng says so)
_SAMPLES = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
# signature, IHDR length, "IHDR", width, height, bit depth, colour type, compression, filter, interlace, checksum
_IHDR = struct.Struct(">8sI4sIIBBBBBI")
_CHUNK_HEAD = struct.Struct(">I4s")  # a chunk's data length and type
# Adam7's seven passes: (first column, first row, column step, row step)
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


class PngHeader(NamedTuple):
    height: int
    width: int
    bit_depth: int
    colour_type: int
    interlaced: bool


def png_size(data) -> tuple[int, int] | None:
    """(height, width) from a PNG's IHDR chunk, or None when `data` does not start like a PNG, or its IHDR fails
    its checksum (where `data` holds it): a damaged size is left for the decoder to refuse as damage, not taken
    for a size (2 x 117,901,063 pixels, refused as too many)."""
    if len(data) >= _IHDR.size:
        h = read_png_header(data)
        return None if h is None else (h.height, h.width)
    if len(data) < 24 or bytes(data[:8]) != PNG_SIGNATURE or bytes(data[12:16]) != b"IHDR":
        return None
    w, h = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    return (h, w) if h > 0 and w > 0 else None


def read_png_header(data) -> PngHeader | None:
    """The IHDR of a PNG in `data` (bytes, bytearray or a contiguous memoryview), or None where `data` does not
    start like a PNG, ends before the IHDR's checksum, fails it, or gives no size."""
    if len(data) < _IHDR.size:
        return None
    signature, _, kind, w, h, depth, colour, _, _, interlace, crc = _IHDR.unpack_from(data)
    if signature != PNG_SIGNATURE or kind != b"IHDR" or zlib.crc32(data[12:29]) != crc or not (h and w):
        return None
    return PngHeader(h, w, depth, colour, interlace == 1)


def filtered_bytes(h: PngHeader) -> int | None:
    """The bytes the image data inflates to: each row of each pass (one pass, or Adam7's seven) is a filter-type
    byte and its pixels' bits rounded up to whole bytes. None for a colour type that PNG does not have."""
    samples = _SAMPLES.get(h.colour_type)
    if samples is None:
        return None
    bits = samples * h.bit_depth
    passes = _ADAM7 if h.interlaced else ((0, 0, 1, 1),)
    total = 0
    for x0, y0, dx, dy in passes:
        cols, rows = -(-(h.width - x0) // dx), -(-(h.height - y0) // dy)
        if cols > 0 and rows > 0:  # a pass without pixels has no rows, not even their filter bytes
            total += rows * (1 + -(-cols * bits // 8))
    return total


def idat_bytes(data, enough: int) -> int:
    """The bytes of the IDAT chunks of the PNG in `data`, counted from the chunk lengths until `enough` are found,
    the IEND chunk, or the data's end (a chunk that runs past it counts the bytes it still has)."""
    n, i, held = len(data), len(PNG_SIGNATURE), 0
    while i + 8 <= n and held < enough:
        length, kind = _CHUNK_HEAD.unpack_from(data, i)
        if kind == b"IDAT":
            held += min(length, n - i - 8)
        elif kind == b"IEND":
            break
        i += 12 + length  # length, type, data, checksum
    return held


def data_shortfall(data, h: PngHeader) -> tuple[int, int] | None:
    """(bytes of image data, the fewest bytes that could hold the pixels) for the PNG in `data`, whose header is
    `h`, where its IDAT chunks are too short for its pixels however they were compressed; None where they could
    hold them."""
    raw = filtered_bytes(h)
    if raw is None:
        return None
    fewest = -(-raw // MAX_DEFLATE_RATIO)
    held = idat_bytes(data, fewest)
    return (held, fewest) if held < fewest else None
