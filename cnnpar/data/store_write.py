"""`cnnpar prepare`: decode an image folder once into a store (the format is described in `store`).

Worker processes decode chunks of files with Pillow; the main process writes their pixels in the
folder's order, so the store's index order is `scan_splits` order and a seeded hold-out picks the
same images from the store as from the folder. A file that does not decode stops the whole run
with its name, and nothing is left behind: the store is built as `OUT.partial`, made durable
(fsync) and only then renamed to OUT.
"""

from __future__ import annotations

import os
import sys
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cnnpar.data.folder import decode_error, scan_splits
from cnnpar.data.overlap import same_file_groups
from cnnpar.data.store import (
    INDEX_BYTES_PER_IMAGE,
    MAGIC,
    PREFIX,
    VERSION,
    align,
    encode_header,
    index_checksum,
    new_hash,
    pack_index,
    partial_path,
)
from cnnpar.errors import DataError
from cnnpar.report.files import fsync_path
from cnnpar.report.host import usable_cores

MAX_CHUNK = 32  # files per task: enough to amortise the IPC, few enough to keep every worker busy
IN_FLIGHT = 2  # chunks queued per worker: decoded pixels waiting for the writer stay bounded


def fit_within(width: int, height: int, max_side: int = 0, short_side: int = 0) -> tuple[int, int]:
    """(width, height) scaled so the longer side is at most `max_side` and the shorter at most `short_side` (0:
    no bound); aspect kept, never enlarged."""
    scale = 1.0
    if max_side:
        scale = min(scale, max_side / max(width, height))
    if short_side:
        scale = min(scale, short_side / min(width, height))
    if scale >= 1:
        return width, height
    return max(1, round(width * scale)), max(1, round(height * scale))


@dataclass(frozen=True)
class Sides:
    """How `prepare` bounds each image: the shorter side at most `short`, as ImageNet's 256 for 224-px inputs
    (every square crop of a model's input then comes from the photo's own pixels, not enlarged ones), and/or
    the longer side at most `longer` (a bound on the store's size; a 4:3 photo at a longer side of 256 keeps a
    shorter side of 192, which a 224 crop enlarges). 0: no bound."""

    longer: int = 0
    short: int = 0

    def __post_init__(self) -> None:
        for flag, side in (("--max-side", self.longer), ("--short-side", self.short)):
            if side < 0:
                raise DataError(f"{flag} {side}: expected a side in pixels >= 1 (or 0 for no bound), such as 256")
        if not (self.longer or self.short):
            raise DataError(
                "--short-side 0 and --max-side 0: expected a bound on the image size, such as --short-side 256"
            )

    def target(self, width: int, height: int) -> tuple[int, int]:
        return fit_within(width, height, self.longer, self.short)

    def describe(self) -> str:
        bounds = [f"shorter side <= {self.short}"] * bool(self.short) + [f"longer side <= {self.longer}"] * bool(
            self.longer
        )
        return ", ".join(bounds)


def decode_for_store(path: Path, sides: Sides) -> tuple[bytes, int, int]:
    """RGB uint8 HWC bytes of one file, within `sides`, and its height and width."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            target = sides.target(*im.size)
            if 2 * target[0] <= im.size[0] and 2 * target[1] <= im.size[1]:
                # JPEG only (a no-op elsewhere): libjpeg decodes at 1/2, 1/4 or 1/8 scale in the DCT,
                # never below `target`; far cheaper than decoding every pixel to throw most away.
                im.draft("RGB", target)
            rgb = _as_rgb(im)
        if rgb.size != target:
            rgb = rgb.resize(target, Image.Resampling.BILINEAR)  # Pillow widens the filter: antialiased
    except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError) as e:
        raise decode_error(path, e) from None
    return rgb.tobytes(), rgb.height, rgb.width


def _as_rgb(im):
    """Grey, CMYK, palette and RGBA files as RGB. 16-bit grey (Pillow's "I;16" and "I" modes) keeps its top 8
    bits, as a folder's decode does (folder.decode_rgb): Pillow's own conversion clips every value above 255,
    which made such a photo pure white in the store while the folder trained on its pixels."""
    from PIL import Image

    if im.mode.startswith("I;16") or im.mode == "I":
        top = (np.asarray(im).astype(np.int64) >> 8).clip(0, 255).astype(np.uint8)
        return Image.fromarray(top, "L").convert("RGB")
    return im.convert("RGB")


def decode_chunk(paths: list[Path], sides: Sides) -> list[tuple[bytes, int, int]]:
    return [decode_for_store(p, sides) for p in paths]


class OrderedDecode:
    """Every file's pixels, in order, decoded `workers` processes wide, a bounded window ahead.

    A context manager: entering forks the workers and queues the first chunks, so they exist before
    any thread does (tqdm's monitor; forking a threaded process can deadlock); leaving cancels what
    is still queued, on the error path too.
    """

    def __init__(self, files: list[Path], sides: Sides, workers: int) -> None:
        self.files, self.sides, self.workers = files, sides, workers
        size = max(1, min(MAX_CHUNK, -(-len(files) // (4 * workers))))
        self.chunks = (files[i : i + size] for i in range(0, len(files), size))
        self.pool, self.pending = None, deque()

    def __enter__(self) -> OrderedDecode:
        if self.workers > 1:
            self.pool = ProcessPoolExecutor(self.workers)
            for _ in range(IN_FLIGHT * self.workers):
                self._submit()
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)

    def _submit(self) -> None:
        chunk = next(self.chunks, None)
        if chunk is not None:
            self.pending.append(self.pool.submit(decode_chunk, chunk, self.sides))

    def __iter__(self) -> Iterator[tuple[bytes, int, int]]:
        if self.pool is None:
            yield from (decode_for_store(f, self.sides) for f in self.files)
            return
        while self.pending:
            done = self.pending.popleft().result()  # re-raises a worker's DataError here
            self._submit()
            yield from done


def check_store_out(out: Path, src: Path) -> None:
    """Refuse, before any decoding, an --out that is not a store path: a folder, a name `--data` would not read
    as a store, or an existing file that is not a store (the rename at the end would replace a user's CSV or
    one of the photos without a word)."""
    if out.is_dir():
        raise DataError(f"--out {out}: is a folder: expected the store file to write, such as {out / src.name}.cnnpar")
    if not out.name.lower().endswith(".cnnpar"):
        raise DataError(
            f"--out {out}: expected a name ending in .cnnpar (what --data reads as a store), such as {out}.cnnpar"
        )
    if out.exists():
        with out.open("rb") as f:
            start = f.read(len(MAGIC))
        if start != MAGIC:
            raise DataError(
                f"--out {out}: exists and is not a cnnpar store (starts {start!r}): expected a new file, or a store "
                "to replace; move the file away first"
            )


def prepare_store(
    src: str | Path, out: str | Path, max_side: int = 0, workers: int = 0, progress: bool = True, short_side: int = 0
) -> dict:
    """Decode the image folder `src` into the store `out`, each image within `max_side` (its longer side) and
    `short_side` (its shorter; `Sides`); returns the store's header."""
    from tqdm.auto import tqdm

    src, out = Path(src), Path(out)
    sides = Sides(max_side, short_side)
    check_store_out(out, src)
    files, labels, splits, classes = scan_splits(src)
    n = len(files)
    header = {
        "format": "cnnpar image store",
        "version": VERSION,
        "count": n,
        "max_side": max_side,  # 0: no bound on the longer side
        "short_side": short_side,  # 0: none on the shorter (stores before session 21 lack the key)
        "layout": "HWC",
        "class_names": classes,
        "splits": {"train": n - sum(splits), "val": sum(splits)},
        "source": str(src.resolve()),
        # files under two names (hard or symbolic links): a hold-out drawn at train time is checked against them
        "same_file_groups": same_file_groups(files),
        "index_bytes": n * INDEX_BYTES_PER_IMAGE,
        # placeholders as long as any real value: the header's length is fixed before the pixels
        "data_start": 10**15,
        "pixel_bytes": 10**19,
        "data_checksum": "0" * 64,
        "index_checksum": "0" * 64,
    }
    header_len = len(encode_header(header))
    header["data_start"] = align(PREFIX.size + header_len + header["index_bytes"])
    offsets, hw = np.zeros(n, np.int64), np.zeros((n, 2), np.int64)
    digest, pos = new_hash(), 0
    partial = partial_path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    workers = workers or usable_cores()
    try:
        with partial.open("wb") as f, OrderedDecode(files, sides, workers) as images:
            # disable=None: a bar only on a terminal, never \r fragments in a log file
            bar = tqdm(
                total=n, unit="img", desc=f"prepare {src.name}", file=sys.stderr, disable=None if progress else True
            )
            f.seek(header["data_start"])  # the pixels first; the prefix, header and index last
            for k, (pixels, h, w) in enumerate(images):
                f.write(pixels)
                digest.update(pixels)
                offsets[k], hw[k] = pos, (h, w)
                pos += len(pixels)
                bar.update(1)
            bar.close()
            header.update(pixel_bytes=pos, data_checksum=digest.hexdigest())
            index = pack_index(offsets, hw[:, 0], hw[:, 1], labels, splits)
            header["index_checksum"] = index_checksum(header, index)
            f.seek(0)
            f.write(PREFIX.pack(MAGIC, VERSION, header_len) + encode_header(header, header_len) + index)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, out)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    fsync_path(out.parent)  # makes the rename itself durable
    return header
