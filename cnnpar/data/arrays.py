"""Turning user arrays into the (N, C, H, W) uint8 layout, with errors that name what is wrong."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from cnnpar.config import MAX_CLASSES
from cnnpar.errors import DataError

FEW_ABOVE_ONE = 1e-3  # float pixels: at most this share above 1, the rest in [0, 1], reads as 0..1 data gone astray
# float pixels whose largest value is above 1 but under this round to 0, 1 or 2 when read as 0..255: no picture
AMBIGUOUS_BELOW = 2.5


def to_nchw_uint8(x: np.ndarray, where: str) -> torch.Tensor:
    """Accept (N,H,W), (N,H,W,C) or (N,C,H,W) with C in {1,3}; uint8, or floats in [0,1] or [0,255]."""
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
        raise DataError(f"{where}: holds no images")
    if x.dtype != np.uint8:
        if not np.issubdtype(x.dtype, np.number):
            raise DataError(f"{where}: dtype {x.dtype}: expected uint8 or a numeric type")
        lo, hi = float(x.min()), float(x.max())
        if lo < 0 or hi > 255:
            raise DataError(f"{where}: values span [{lo}, {hi}]: expected pixels in [0, 255] (or [0, 1])")
        if np.issubdtype(x.dtype, np.floating) and hi <= 1.0:
            x = x * 255.0
        x = np.rint(x).astype(np.uint8)
    return torch.from_numpy(np.ascontiguousarray(x))


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
        want = f"a label in 0..{num_classes - 1}" if num_classes > 0 else f"a class index from 0 to {top - 1:,}"
        raise DataError(f"{where}, {pos}: label {y[i]}: expected {want}")


def resize_square(x: torch.Tensor, size: int) -> torch.Tensor:
    """Resize a uint8 batch (N,C,H,W) to size x size (bilinear, antialiased when shrinking)."""
    if size <= 0 or x.shape[-2:] == (size, size):
        return x
    out = F.interpolate(
        x.float(), size=(size, size), mode="bilinear", align_corners=False, antialias=size < x.shape[-1]
    )
    return out.round_().clamp_(0, 255).to(torch.uint8)
