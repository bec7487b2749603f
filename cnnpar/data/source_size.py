"""The side `--image-size 0` ("keep the source size") means for image folders and stores.

Folders and stores hold images of any size, and the model needs one: when every image shares
one size up to KEPT_UP_TO, that size is kept (the shorter side, as crops are square); when sizes
are mixed, or the shared one is larger, the side is MIXED_SIDE, the usual ImageNet input, and the
log says so. Sizes come from file
headers (a JPEG's frame header, a PNG's IHDR, else Pillow, which also reads only the header),
for at most SAMPLE files spread evenly over the folder, so a million-photo folder costs seconds.
The same headers say whether the files are grey (`FolderSample.grey`): they decode to three equal
RGB channels, and --augment auto must not mirror them as it mirrors colour photos.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cnnpar.config import KEPT_UP_TO, MIXED_SIDE  # (why those sizes: there)
from cnnpar.data.encoded_arrays import grey_file
from cnnpar.data.folder import check_pixel_count
from cnnpar.data.jpeg_header import read_jpeg_header
from cnnpar.data.png_header import png_size

SAMPLE = 2000
HEAD_BYTES = 1 << 16  # EXIF blocks (thumbnails) before a JPEG's frame header stay under 64 KiB


def header_facts(path: Path) -> tuple[tuple[int, int] | None, bool]:
    """((height, width), or None where no reader understands the header; whether the file says it is grey, by
    `grey_file`'s rule on the same bytes). A file only Pillow reads counts as colour, as every file did before."""
    with open(path, "rb") as f:
        head = f.read(HEAD_BYTES)
    jpeg = read_jpeg_header(head)
    if jpeg is not None:
        # a frame header's height of 0 leaves it to a DNL marker later in the file, which no decoder cnnpar uses
        # reads (the decoder refuses the file by name): no size, as png_size says of an IHDR without one; taken
        # for one, it was the run's "smallest 32x0" image
        size = (jpeg.height, jpeg.width) if jpeg.height and jpeg.width else None
        return size, grey_file(head, jpeg)
    png = png_size(head)
    if png is not None:
        return png, grey_file(head, None)
    try:
        from PIL import Image

        with Image.open(path) as im:  # opening reads the header, not the pixels
            w, h = im.size
        return ((h, w) if h and w else None), False
    except Exception:  # an unreadable file is reported by the decoder, with its name, when it is read
        return None, False


def width_by_height(hw) -> str:
    """A (height, width) as cnnpar prints image sizes elsewhere: width x height ("40x30": 40 wide, 30 high)."""
    return f"{int(hw[1])}x{int(hw[0])}"


def pick_side(sizes: np.ndarray, sampled: bool) -> tuple[int, str]:
    """(side, why) for an (n, 2) array of (height, width). Sizes are said width x height, as the rest of cnnpar
    and a file browser say them (height x width read as portrait photos of landscape ones); where they differ,
    the smallest and the largest image by area (per-axis minima and maxima made sizes no image had)."""
    if len(sizes) == 0:
        return MIXED_SIDE, f"no image sizes readable: {MIXED_SIDE}"
    lo, hi = sizes.min(axis=0), sizes.max(axis=0)
    which = f"the {len(sizes)} sampled images" if sampled else f"all {len(sizes)} images"
    if (lo == hi).all():
        h, w = int(lo[0]), int(lo[1])
        side = min(h, w)
        crop = "" if h == w else ", square crops of the shorter side"
        shape = f"{w}x{h}" if h == w else f"{w} wide x {h} high"
        if side > KEPT_UP_TO:
            return MIXED_SIDE, (
                f"{which} are {shape}, larger than the {KEPT_UP_TO} a source size is kept up to: {MIXED_SIDE}, the "
                f"usual ImageNet input; --image-size N chooses another (--image-size {side} their own)"
            )
        return side, f"the source size: {which} are {shape}{crop}"
    which = f"the {len(sizes)} sampled images" if sampled else f"the {len(sizes)} images"
    area = sizes[:, 0] * sizes[:, 1]
    smallest, largest = sizes[int(np.argmin(area))], sizes[int(np.argmax(area))]
    return MIXED_SIDE, (
        f"{which} differ in size (by area, the smallest {width_by_height(smallest)} and the largest "
        f"{width_by_height(largest)}, width x height): {MIXED_SIDE}, the usual ImageNet input; --image-size N "
        "chooses another"
    )


@dataclass(frozen=True)
class FolderSample:
    """What the headers of a folder's sampled files say: their (height, width)s, whether they are a sample of the
    folder, and whether every one of them is grey (grey digit PNGs: they decode to three equal channels, which
    --augment auto must not mirror; one colour file among them makes the folder colour)."""

    sizes: np.ndarray
    sampled: bool
    grey: bool


def _sample_step(files: list[Path], sample: int) -> int:
    return max(1, -(-len(files) // sample))


def sample_count(files: list[Path], sample: int = SAMPLE) -> int:
    """How many of `files` folder_sample reads the header of."""
    return len(files[:: _sample_step(files, sample)])


def folder_sample(files: list[Path], sample: int = SAMPLE, read=None) -> FolderSample:
    """The headers of at most `sample` files spread over the folder. An image of more than MAX_PIXELS among them
    is refused here, before a run starts (the decoders refuse the others). `read(n)`, where given, is told the
    headers read so far (a Heartbeat's update: 2,000 files' first 64 KiB on a cold network disk take a while)."""
    step = _sample_step(files, sample)
    sizes, grey = [], True
    for k, f in enumerate(files[::step], 1):
        size, grey_one = header_facts(f)
        grey = grey and grey_one  # an unreadable header counts as colour, as every file did before
        if size is not None:
            check_pixel_count(f, *size)
            sizes.append(size)
        if read is not None:
            read(k)
    return FolderSample(np.array(sizes, dtype=np.int64).reshape(-1, 2), step > 1, grey and bool(sizes))


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
