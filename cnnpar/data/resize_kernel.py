"""Crop-and-resize of a whole batch in two Triton kernels: the same antialiased bilinear filter as
`crop_resize.resized_crops_flat`, with a few host calls per batch instead of a dozen per chunk.

Why: a GPU decoder's resize runs in a feeder thread of the training process. Each torch call there
takes the GIL to parse its arguments and again after its launch, and beside a training thread that
runs Python most of the time each retake can wait up to the switch interval (docs/decoding.md). The
batched matrix-product path makes ~50 such calls and a dozen elementwise passes over a padded canvas
per batch; here one pass reads each crop's rows straight from the decoded buffer and filters them
horizontally (kernel 1, one program per crop row), and one filters the result vertically into the
planar uint8 output (kernel 2, one program per output row). The weights are computed in the kernels
from the same formula as PyTorch's `_upsample_bilinear2d_aa` (centre, support, triangle filter, taps
clipped to the crop and normalised), so nothing is padded and no weight matrix is built.

Triton ships with torch's CUDA wheels; `fused_available` says whether this process can use it.
`TRITON_INTERPRET=1` runs the kernels on the CPU (NumPy), which is how the tests check them.
"""

# No `from __future__ import annotations` here: it turns the kernels' `tl.constexpr` annotations into the
# string "tl.constexpr", and Triton 3.1's interpreter (torch 2.5's Triton) takes a parameter as constexpr
# only when its annotation's name is exactly "constexpr", so BLOCK reached `tl.arange` as a tensor and
# the kernels failed there. Compiled kernels were not affected (3.1's JIT tests `"constexpr" in ...`).
import os
from functools import cache

import numpy as np
import torch
import triton
import triton.language as tl

from cnnpar.data.crop_resize import host_array

P = 12  # int64 parameters per image in the metadata buffer (see `_metadata`)


def fused_available(device: torch.device) -> bool:
    """The kernels can run on `device`: a CUDA device, or any device under a Triton interpreter that
    moves data correctly (`interpreter_fault`)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return not interpreter_fault()
    return device.type == "cuda"


@triton.jit
def _copy_kernel(src, dst):
    tl.store(dst, tl.load(src))


@cache
def interpreter_fault() -> str:
    """Why Triton's interpreter cannot run the kernels here, or "" when it can. Triton 3.1's interpreter
    (torch 2.5's) was built with a pybind11 older than NumPy 2 (it imports `numpy.core.multiarray`), so
    under NumPy 2 its loads return garbage and its stores write nothing: the kernels would return noise,
    not fail. Compiled kernels never use the interpreter. One copied int32 tells; asked only under
    TRITON_INTERPRET=1 (the probe kernel is then interpreted too)."""
    src, dst = torch.tensor([123456789], dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    _copy_kernel[(1,)](src, dst)
    if dst.item() == src.item():
        return ""
    return (
        f"Triton {triton.__version__}'s interpreter does not move data with NumPy {np.__version__} "
        f"(a copy of {src.item()} gave {dst.item()}): its pybind11 predates NumPy 2; compiled GPU kernels "
        "do not use the interpreter"
    )


@triton.jit(do_not_specialize=["row_meta", "size"])
def _rows_kernel(flat, meta, row_meta, tmp, size, BLOCK: tl.constexpr, P: tl.constexpr):
    """Horizontal pass: crop row r of its image -> `size` x 3 filtered values in `tmp` row r."""
    r = tl.program_id(0)
    i = tl.load(meta + row_meta + r)  # which image this row belongs to
    p = meta + i * P
    base, sy, sx, sc = tl.load(p + 0), tl.load(p + 1), tl.load(p + 2), tl.load(p + 3)
    top, left, cw = tl.load(p + 4), tl.load(p + 5), tl.load(p + 7)
    row0, taps = tl.load(p + 8), tl.load(p + 9)
    lane = tl.arange(0, BLOCK)
    live = lane < size * 3
    x, c = lane // 3, lane % 3
    scale = cw.to(tl.float32) / size
    support = tl.maximum(scale, 1.0)
    inv = 1.0 / support
    centre = scale * (x.to(tl.float32) + 0.5)
    lo = tl.maximum((centre - support + 0.5).to(tl.int32), 0)  # trunc, as aten's kernel
    hi = tl.minimum((centre + support + 0.5).to(tl.int32), cw.to(tl.int32))
    src = flat + base + (top + r - row0) * sy + c * sc
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for k in range(0, taps):
        j = lo + k
        inside = live & (j < hi)
        w = tl.where(inside, tl.maximum(1.0 - tl.abs((j.to(tl.float32) - centre + 0.5) * inv), 0.0), 0.0)
        v = tl.load(src + (left + j) * sx, mask=inside, other=0).to(tl.float32)
        acc += w * v
        total += w
    row = r.to(tl.int64) * size * 3  # int64: a big evaluation batch's rows pass 2**31 values (~3.2M rows at 224)
    tl.store(tmp + row + lane, (acc / tl.maximum(total, 1e-12)).to(tmp.dtype.element_ty), mask=live)


@triton.jit(do_not_specialize=["size"])
def _columns_kernel(tmp, meta, out, size, BLOCK: tl.constexpr, P: tl.constexpr):
    """Vertical pass: output row y of image i from its horizontally filtered rows, rounded to uint8
    into the planar (N, 3, size, size) output."""
    i = tl.program_id(0).to(tl.int64)  # int64 offsets into `out` and `tmp`, as in the horizontal pass
    y = tl.program_id(1)
    p = meta + i * P
    ch, row0, taps = tl.load(p + 6), tl.load(p + 8), tl.load(p + 10)
    lane = tl.arange(0, BLOCK)
    live = lane < size * 3
    scale = ch.to(tl.float32) / size
    support = tl.maximum(scale, 1.0)
    inv = 1.0 / support
    centre = scale * (y.to(tl.float32) + 0.5)
    lo = tl.maximum((centre - support + 0.5).to(tl.int32), 0)
    hi = tl.minimum((centre + support + 0.5).to(tl.int32), ch.to(tl.int32))
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    total = 0.0
    for k in range(0, taps):
        j = lo + k
        inside = j < hi
        w = tl.where(inside, tl.maximum(1.0 - tl.abs((j.to(tl.float32) - centre + 0.5) * inv), 0.0), 0.0)
        v = tl.load(tmp + (row0 + j).to(tl.int64) * size * 3 + lane, mask=live & inside, other=0.0).to(tl.float32)
        acc += w * v
        total += w
    value = acc / tl.maximum(total, 1e-12)
    rounded = tl.floor(value + 0.5)
    # halves to even, as torch.round (upscaled crops average two pixels, and x.5 is then common)
    rounded = tl.where((rounded - value == 0.5) & (rounded % 2 == 1), rounded - 1.0, rounded)
    value = tl.minimum(tl.maximum(rounded, 0.0), 255.0)
    x, c = lane // 3, lane % 3
    tl.store(out + i * 3 * size * size + c * size * size + y * size + x, value.to(tl.uint8), mask=live)


def _taps(lengths: np.ndarray, size: int) -> np.ndarray:
    """Filter taps a crop side needs at most per output position: ceil(2 x support) + 1."""
    support = np.maximum(lengths / size, 1.0)
    return np.ceil(2 * support).astype(np.int64) + 1


def _metadata(starts, hw, boxes, size: int, hwc: bool) -> tuple[np.ndarray, int]:
    """One int64 host buffer for both kernels: per image (P values) its buffer offset, strides (row,
    column, channel), crop top, left, height, width, first intermediate row, horizontal and vertical
    taps; then, per intermediate row, its image. Returns it and the number of intermediate rows."""
    starts, hw, boxes = (np.asarray(t, dtype=np.int64) for t in (starts, hw, boxes))
    n = len(starts)
    h, w = hw[:, 0], hw[:, 1]
    per = np.zeros((n, P), dtype=np.int64)
    per[:, 0] = starts
    if hwc:  # interleaved: (y, x, c) at y * 3W + x * 3 + c
        per[:, 1], per[:, 2], per[:, 3] = 3 * w, 3, 1
    else:  # planar: (c, y, x) at c * H * W + y * W + x
        per[:, 1], per[:, 2], per[:, 3] = w, 1, h * w
    per[:, 4:8] = boxes  # top, left, crop height, crop width
    ch = boxes[:, 2]
    per[:, 8] = np.cumsum(ch) - ch
    per[:, 9] = _taps(boxes[:, 3], size)
    per[:, 10] = _taps(ch, size)
    rows = int(ch.sum())
    return np.concatenate([per.ravel(), np.repeat(np.arange(n, dtype=np.int64), ch)]), rows


def fused_resized_crops(
    flat: torch.Tensor,
    starts: torch.Tensor,
    hw: torch.Tensor,
    boxes: torch.Tensor,
    size: int,
    hwc: bool = False,
    tmp_dtype: torch.dtype = torch.float16,
) -> torch.Tensor:
    """`crop_resize.resized_crops_flat`'s contract (flat uint8 buffer, host `starts`, `hw`, `boxes`;
    (N, 3, size, size) uint8 out) in two kernel launches and one host-to-device copy. The horizontal
    pass's rows are kept in `tmp_dtype` (fp16: pixel sums to ~0.1 of a level, half the traffic)."""
    dev = flat.device
    n = len(starts)
    out = torch.empty(n, 3, size, size, dtype=torch.uint8, device=dev)
    if n == 0:
        return out
    meta_host, rows = _metadata(host_array(starts), host_array(hw), host_array(boxes), size, hwc)
    meta = torch.from_numpy(meta_host).to(dev, non_blocking=True)
    tmp = torch.empty(rows * size * 3, dtype=tmp_dtype, device=dev)
    block = triton.next_power_of_2(3 * size)
    _rows_kernel[(rows,)](flat, meta, n * P, tmp, size, BLOCK=block, P=P)
    _columns_kernel[(n, size)](tmp, meta, out, size, BLOCK=block, P=P)
    return out
