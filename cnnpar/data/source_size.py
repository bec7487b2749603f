"""The side `--image-size 0` ("keep the source size") means for image folders and stores.

Folders and stores hold images of any size, and the model needs one: when every image shares
one size, that size is kept (the shorter side, as crops are square); when sizes are mixed the
side is MIXED_SIDE, the usual ImageNet input, and the log says so. Sizes come from file
headers (a JPEG's frame header, a PNG's IHDR, else Pillow, which also reads only the header),
for at most SAMPLE files spread evenly over the folder, so a million-photo folder costs seconds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cnnpar.data.folder import check_pixel_count
from cnnpar.data.jpeg_header import read_jpeg_header
from cnnpar.data.png_header import png_size

MIXED_SIDE = 224
SAMPLE = 2000
HEAD_BYTES = 1 << 16  # EXIF blocks (thumbnails) before a JPEG's frame header stay under 64 KiB


def header_size(path: Path) -> tuple[int, int] | None:
    """(height, width) from the file's header, None when no reader understands it."""
    with open(path, "rb") as f:
        head = f.read(HEAD_BYTES)
    jpeg = read_jpeg_header(head)
    if jpeg is not None:
        return jpeg.height, jpeg.width
    png = png_size(head)
    if png is not None:
        return png
    try:
        from PIL import Image

        with Image.open(path) as im:  # opening reads the header, not the pixels
            w, h = im.size
        return h, w
    except Exception:  # an unreadable file is reported by the decoder, with its name, when it is read
        return None


def pick_side(sizes: np.ndarray, sampled: bool) -> tuple[int, str]:
    """(side, why) for an (n, 2) array of (height, width)."""
    if len(sizes) == 0:
        return MIXED_SIDE, f"no image sizes readable: {MIXED_SIDE}"
    lo, hi = sizes.min(axis=0), sizes.max(axis=0)
    which = f"the {len(sizes)} sampled images" if sampled else f"all {len(sizes)} images"
    if (lo == hi).all():
        h, w = int(lo[0]), int(lo[1])
        side = min(h, w)
        crop = "" if h == w else ", square crops of the shorter side"
        return side, f"the source size: {which} are {h}x{w}{crop}"
    which = f"the {len(sizes)} sampled images" if sampled else f"the {len(sizes)} images"
    return MIXED_SIDE, (
        f"{which} differ in size ({int(lo[0])}x{int(lo[1])} to {int(hi[0])}x{int(hi[1])}): {MIXED_SIDE}, "
        "the usual ImageNet input; --image-size N chooses another"
    )


def folder_sizes(files: list[Path], sample: int = SAMPLE) -> tuple[np.ndarray, bool]:
    """(height, width) of at most `sample` files spread over the folder, and whether that is a sample. An image
    of more than MAX_PIXELS among them is refused here, before a run starts (the decoders refuse the others)."""
    step = max(1, -(-len(files) // sample))
    sizes = []
    for f in files[::step]:
        size = header_size(f)
        if size is not None:
            check_pixel_count(f, *size)
            sizes.append(size)
    return np.array(sizes, dtype=np.int64).reshape(-1, 2), step > 1


def folder_side(files: list[Path]) -> tuple[int, str]:
    return pick_side(*folder_sizes(files))


def store_side(hw: np.ndarray) -> tuple[int, str]:
    """A store's index holds every image's size already: no sampling."""
    return pick_side(hw, sampled=False)


def enlarging_note(side: int, sizes: np.ndarray, also: str = "") -> str:
    """A warning when a square crop of `side` enlarges most of the images (their median shorter side is below
    it): the model then trains on blurred pixels (a 16-px store trained at 224, or 4:3 photos stored at a
    longer side of 256, whose 192-px shorter side every 224 crop enlarges), which is said, not done silently."""
    if len(sizes) == 0:
        return ""
    shorter = sizes.min(axis=1)
    median = int(np.median(shorter))
    if median >= side:
        return ""
    share = float((shorter < side).mean())
    return (
        f"warning: image size {side} enlarges most images: their shorter side is {median} px at the median "
        f"({100 * share:.0f} % of them under {side}); --image-size {median} keeps them at their size{also}"
    )
