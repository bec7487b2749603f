"""Turning user arrays into the (N, C, H, W) uint8 layout, with errors that name what is wrong."""

from __future__ import annotations

import math
import tokenize
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from cnnpar.config import MAX_CLASSES
from cnnpar.errors import DataError, first_line
from cnnpar.host_facts import memory_available

FEW_ABOVE_ONE = 1e-3  # float pixels: at most this share above 1, the rest in [0, 1], reads as 0..1 data gone astray
# float pixels whose largest value is above 1 but under this round to 0, 1 or 2 when read as 0..255: no picture
AMBIGUOUS_BELOW = 2.5
# float pixels that are not whole numbers, largest under this: read as 0..255 they round to at most 32 grey levels
# (3.0 to 4, 10.0 to 11), so a smooth image is posterised without a word; whole numbers (0..16 digits) are kept.
# 32: floats scaled to [0, 32) or less are no 0..255 pixels; a whole data set of 0..255 pixels under 32 is black
FEW_LEVELS_BELOW = 32
RESIZE_CHUNK_BYTES = 1 << 28  # the float work of one chunk of an in-memory resize (256 MiB)
CONVERT_CHUNK_BYTES = 1 << 26  # the input of one chunk of a conversion to uint8 (64 MiB)


def to_nchw_uint8(x: np.ndarray, where: str, notes: list[str] | None = None) -> torch.Tensor:
    """Accept (N,H,W), (N,H,W,C) or (N,C,H,W) with C in {1,3}; uint8, or floats in [0,1] or [0,255].

    A line on how the values were read goes to `notes` (where given) when that is not plain 0..255 pixels:
    floats in [0, 1] scaled by 255, or pixels that span only a few levels (0..16) read as dark 0..255 ones."""
    if np.issubdtype(x.dtype, np.complexfloating):  # numpy's cast to a real type drops the imaginary part
        raise DataError(f"{where}: dtype {x.dtype}: expected uint8 or real numbers (not complex)")
    if np.issubdtype(x.dtype, np.inexact) and not np.isfinite(x).all():
        # min/max of an array holding NaN are NaN: the range check and the [0,1] scaling would both skip
        # it, and every pixel would silently round to 0 or 1
        at = tuple(int(i) for i in np.argwhere(~np.isfinite(x))[0])
        raise DataError(f"{where}: value {x[at]} at index {at}: expected finite pixel values (no NaN or inf)")
    if np.issubdtype(x.dtype, np.floating) and x.size:
        above = int(np.count_nonzero(x > 1.0))
        if 0 < above <= FEW_ABOVE_ONE * x.size and float(x.min()) >= 0:
            # read as 0..255, the rest of a 0..1 array would round to 0 or 1: every picture lost, no error
            at = tuple(int(i) for i in np.argwhere(x > 1.0)[0])
            raise DataError(
                f"{where}: {above:,} of {x.size:,} float values above 1 (the first {x[at]:g} at index {at}), the "
                "rest in [0, 1]: expected every value in [0, 1] (np.clip(x, 0, 1)) or pixels in [0, 255]"
            )
        lo, hi = float(x.min()), float(x.max())
        if 1.0 < hi < AMBIGUOUS_BELOW and lo >= 0:
            # more than a few above 1, so not 0..1 data; read as 0..255 they round to 0, 1 or 2: every picture lost
            raise DataError(
                f"{where}: float values in [{lo:g}, {hi:g}]: neither pixels in [0, 1] nor in [0, 255] (read as "
                "0..255, every value rounds to 0, 1 or 2): expected every value in [0, 1] (x / x.max() or "
                "np.clip(x, 0, 1)) or pixels in [0, 255]"
            )
        if 1.0 < hi < FEW_LEVELS_BELOW and lo >= 0 and not np.array_equal(x, np.rint(x)):
            raise DataError(
                f"{where}: float values in [{lo:g}, {hi:g}], not whole numbers: neither pixels in [0, 1] nor in "
                f"[0, 255] (read as 0..255 they round to {round(hi) + 1} grey levels): expected every value in "
                "[0, 1] (x / x.max()) or pixels in [0, 255] (x * 255 / x.max())"
            )
    if x.ndim == 3:
        x = x[:, None]
    elif x.ndim == 4:
        if x.shape[-1] in (1, 3) and x.shape[1] not in (1, 3):
            x = x.transpose(0, 3, 1, 2)
        elif x.shape[1] not in (1, 3):
            raise DataError(f"{where}: shape {x.shape}: expected (N,H,W), (N,H,W,C) or (N,C,H,W) with C 1 or 3")
    else:
        raise DataError(f"{where}: shape {x.shape}: expected (N,H,W), (N,H,W,C) or (N,C,H,W)")
    if len(x) == 0:
        raise DataError(f"{where}: holds no images (its first axis, N, is 0): expected at least one image")
    if x.dtype != np.uint8:
        if not np.issubdtype(x.dtype, np.number):
            raise DataError(f"{where}: dtype {x.dtype}: expected uint8 or a numeric type")
        lo, hi = float(x.min()), float(x.max())
        if lo < 0 or hi > 255:
            raise DataError(f"{where}: values span [{lo}, {hi}]: expected pixels in [0, 255] (or [0, 1])")
        if np.issubdtype(x.dtype, np.floating) and hi <= 1.0:
            _note(notes, f"note: {where}: float pixels in [{lo:g}, {hi:g}], read as [0, 1]: scaled by 255")
            return torch.from_numpy(_rounded_uint8(x, 255.0))
        x = _rounded_uint8(x, 1.0)
    top = int(x.max()) if notes is not None else 255
    if top < FEW_LEVELS_BELOW:
        _note(
            notes,
            f"note: {where}: pixel values 0..{top} only, read as they are on the 0..255 scale (dark: training "
            "normalises each channel, so it learns alike; x * 255 / x.max() fills the range)",
        )
    # a copy only where `x` is not already contiguous and writable: a .npy mapped read-only from its file
    # (sources._read_npy) is read into memory here, once, rather than trained from the file's pages
    return torch.from_numpy(np.require(x, requirements=("C", "W")))


def _rounded_uint8(x: np.ndarray, scale: float) -> np.ndarray:
    """`x * scale` rounded to uint8, contiguous, CONVERT_CHUNK_BYTES of `x` at a time. Whole, x * 255 and its
    rounding were two full-size float copies at once: 5.3 GB of RSS for a 1.6 GB float32 array, 0.4 GB as uint8."""
    out = np.empty(x.shape, dtype=np.uint8)
    step = max(1, CONVERT_CHUNK_BYTES // max(1, x[0].nbytes))
    for i in range(0, len(x), step):
        chunk = x[i : i + step]
        out[i : i + step] = np.rint(chunk * scale if scale != 1.0 else chunk)
    return out


def _note(notes: list[str] | None, line: str) -> None:
    if notes is not None:
        notes.append(line)


def to_labels(y: np.ndarray, n: int, where: str, num_classes: int = 0) -> torch.Tensor:
    if y.ndim == 2 and y.shape[1] == 1:  # (N, 1), as Keras' cifar10.load_data() gives them: one label a row
        y = y[:, 0]
    if y.ndim != 1 or len(y) != n:
        one_hot = " (it looks one-hot: save y.argmax(1))" if _looks_one_hot(y, n) else ""
        raise DataError(f"{where}: shape {y.shape}{one_hot}: expected ({n},), one label per image")
    if not np.issubdtype(y.dtype, np.integer) and not (
        np.issubdtype(y.dtype, np.floating) and np.all(np.mod(y, 1) == 0)
    ):
        raise DataError(f"{where}: dtype {y.dtype}: expected integer class labels")
    check_label_range(y, where, num_classes)  # before the cast: a uint64 past 2**63 would turn negative
    return torch.from_numpy(y.astype(np.int64))


def _looks_one_hot(y: np.ndarray, n: int) -> bool:
    """(N, K) of 0s and 1s with one 1 a row: labels one-hot encoded (to_categorical), which argmax undoes."""
    if y.ndim != 2 or len(y) != n or y.shape[1] < 2 or not np.issubdtype(y.dtype, np.number):
        return False
    return bool(np.isin(y, (0, 1)).all() and (y.sum(axis=1) == 1).all())


def check_label_range(
    y: np.ndarray, where: str, num_classes: int, position: Callable[[int], str] = lambda i: f"index {i}"
) -> None:
    """Labels must be 0..num_classes-1 (or merely >= 0 when the class count is inferred).

    `position(i)` names the i-th label for the message (an array index, or a CSV line).
    """
    top = num_classes if num_classes > 0 else MAX_CLASSES
    bad = (y < 0) | (y >= top)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        pos = position(i)
        # the bound a label broke names its setting: "expected a label in 0..9" left where the 9 came from unsaid
        want = (
            f"a label in 0..{num_classes - 1} (--num-classes {num_classes})"
            if num_classes > 0
            else f"a class index from 0 to {top - 1:,}"
        )
        raise DataError(f"{where}, {pos}: label {y[i]}: expected {want}")


def resize_square(x: torch.Tensor, size: int) -> torch.Tensor:
    """Resize a uint8 batch (N,C,H,W) to size x size (bilinear, antialiased when shrinking).

    In chunks of about RESIZE_CHUNK_BYTES of floats: the whole batch as floats, in and out, took nine times the
    result's bytes. Each image is resized alone either way, so the pixels do not depend on the chunking."""
    if size <= 0 or x.shape[-2:] == (size, size):
        return x
    n, c, h, w = x.shape
    check_fits(n * c * size * size, f"--image-size {size}: {n:,} images of {c}x{size}x{size}")
    out = torch.empty((n, c, size, size), dtype=torch.uint8)
    step = max(1, RESIZE_CHUNK_BYTES // (4 * c * (h * w + size * size)))
    for i in range(0, n, step):
        chunk = F.interpolate(
            x[i : i + step].float(), size=(size, size), mode="bilinear", align_corners=False, antialias=size < w
        )
        out[i : i + step] = chunk.round_().clamp_(0, 255)
    return out


def check_npz_members(path: Path) -> None:
    """Each array of the archive at `path` as large as its member holds, and all of them within the memory available,
    checked from the .npy headers before any is read. numpy allocates the shape a header claims: a header claiming
    10**12 elements over a few bytes stopped in a MemoryError traceback, and an honest archive whose arrays cannot
    fit in memory (a few MB of zeros expand to GBs) was read until the system ran out."""
    total, seen, fmt = 0, {}, np.lib.format
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            key = info.filename.removesuffix(".npy")  # the key np.load's NpzFile reads the member by
            where = f"{path}[{key}]"
            if key in seen:  # a zip appended to (mode "a") keeps both: numpy read one of them, without a word
                raise DataError(
                    f"{where}: two members of the archive hold it ({seen[key]} and {info.filename}), of which numpy "
                    "reads one: expected one member per array, as numpy.savez writes"
                )
            seen[key] = info.filename
            with z.open(info) as f:
                # numpy reads a member as an array by its first bytes, whatever its name: one named x_train, not
                # x_train.npy, went unchecked, its tail ignored. Others it hands over as their bytes, whole (and
                # _read_npz reads every member); a .npy-named one that is no array is refused below
                if not info.filename.endswith(".npy") and f.read(len(fmt.MAGIC_PREFIX)) != fmt.MAGIC_PREFIX:
                    total += info.file_size
                    continue
                f.seek(0)
                try:
                    v1 = fmt.read_magic(f) == (1, 0)
                    shape, _, dtype = (fmt.read_array_header_1_0 if v1 else fmt.read_array_header_2_0)(f)
                except (ValueError, tokenize.TokenError) as e:  # numpy tokenizes a 1.0 header: unbalanced, it raises
                    why = first_line(e)  # numpy's refusal of a long header runs over three lines
                    raise DataError(
                        f"{where}: not a readable .npy array ({why}): expected numpy.savez output"
                    ) from None
                start = f.tell()
            if dtype.hasobject:
                continue  # pickled: refused by its key when it is read (sources._npz_array)
            nbytes = math.prod(shape) * dtype.itemsize
            if start + nbytes != info.file_size:
                raise DataError(
                    f"{where}: its header claims shape {shape} of {dtype} ({nbytes:,} bytes) where the archive holds "
                    f"{info.file_size - start:,} bytes of it: expected numpy.savez output"
                )
            total += nbytes
    check_fits(total, f"{path}: its arrays", "expected an archive whose arrays fit in memory")


def check_fits(nbytes: int, what: str, expected: str = "expected a smaller --image-size") -> None:
    """Refuse an array that cannot fit in the memory available now, in one line, before allocating it (torch's
    allocator stopped in a traceback, after minutes of swapping where it could not tell)."""
    available, why = memory_available()
    if nbytes > available:
        why = f" under {why}" if why else ""
        raise DataError(
            f"{what} take {nbytes / 1e9:,.1f} GB, more than the {available / 1e9:,.1f} GB of memory available{why}: "
            f"{expected}"
        )
