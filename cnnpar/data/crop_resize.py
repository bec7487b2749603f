"""Crop boxes and crop-then-resize for a whole batch of differently sized images, in few kernels.

Per image, crop-then-resize costs about six kernel launches and a handful of host RNG calls; at
256 photos a batch that is ~1,500 launches from one Python thread, more than the GPU needs to
decode the batch. Here the boxes of a batch come from one vectorised draw on the host, and the
resampling is two batched matrix products per chunk of images.

How the resampling is done, and why this way:
- A crop resized with `F.interpolate(mode="bilinear", antialias=True)` is separable: out =
  Wy @ crop @ Wx^T, where Wy (size x crop height) and Wx (size x crop width) hold the
  antialiasing triangle filter's weights (the PIL filter PyTorch uses; it widens with the
  downscale factor). Building those matrices per image and applying them with `torch.bmm`
  reproduces the old per-image path to float rounding, and runs on tensor cores in fp16.
- The alternatives were worse: `torchvision.ops.roi_align` (adaptive sampling) only approximates
  the filter (a box average of bilinear samples, narrower support) and needs the same padded
  input; `F.grid_sample` with per-image affine grids has no antialiasing at all, and at
  ImageNet's ~2x downscale that aliases; grouping by size for `F.interpolate` does not group
  anything, as random crops all differ in size.
- Images of different sizes go into one padded canvas per chunk, gathered in one kernel: the
  decoded images are concatenated into one flat uint8 buffer, `unfold` views that buffer as
  overlapping rows of the canvas width (no copy), and `index_select` picks each crop row's start.
  Rows and columns past a crop's edge hold whatever bytes follow in the buffer; their weights are
  zero, and uint8 bytes are finite, so they add nothing.
- Memory stays bounded: the canvas is uint8 (then fp16 on CUDA), holds crops rather than whole
  photos, and a batch is cut into chunks of at most `canvas_budget` elements (images sorted by
  crop size first, so a chunk's padding stays small and one outsized photo gets a chunk alone).

On CUDA the same filter runs by default as two Triton kernels (`resize_kernel.py`: no canvas, no
weight matrices, a few host calls per batch); `KERNEL` chooses. On the CPU kernel launches cost
little and the dense product does far more arithmetic than the banded filter needs (most of each
weight row is zero), so `GpuDecoder` keeps the per-image loop there; all three are here so tests and
`benchmarks/jpeg_decode.py` can compare them.
"""

from __future__ import annotations

import math
import warnings
from functools import cache

import numpy as np
import torch
import torch.nn.functional as F
from torch._utils import _flatten_dense_tensors  # cat of flattened tensors in one call (DDP's own helper)

# Random-resized-crop area range. The lower bound is data.crop_min_scale (--crop-min-scale), 0.25 by default:
# torchvision's RandomResizedCrop (and the classic ImageNet recipe) uses 0.08, which crops harder.
RRC_SCALE = (0.25, 1.0)
RRC_RATIO = (3 / 4, 4 / 3)
RRC_ATTEMPTS = 10  # draws per image before the fall-back below, as torchvision's RandomResizedCrop
CANVAS_BUDGET = 1 << 26  # elements of one chunk's canvas: 64 MiB uint8, 128 MiB in fp16
# Which kernels `resized_crops_flat` runs: "fused" (resize_kernel.py's two Triton kernels), "matmul"
# (the batched products below), or "auto": fused on CUDA where Triton imports. Benchmarks set it.
KERNELS = ("auto", "fused", "matmul")
KERNEL = "auto"
# Under "auto", the first batch proves the kernels (Triton compiles them then); if that fails (no C
# compiler for Triton's launcher, a GPU its version does not know), the run says so once and resizes
# with the products from then on instead of ending. A failure after they have worked is raised.
_fused = {"proven": False, "failed": ""}


@cache
def _triton_importable() -> bool:
    try:
        import cnnpar.data.resize_kernel  # noqa: F401  (Triton comes with torch's CUDA wheels)
    except ImportError:
        return False
    return True


def uses_fused_kernels(device: torch.device) -> bool:
    """Whether `resized_crops_flat` runs the Triton kernels on `device` (see KERNEL)."""
    if KERNEL not in KERNELS:
        raise ValueError(f"crop_resize.KERNEL: expected one of {', '.join(KERNELS)}, got {KERNEL!r}")
    if KERNEL == "matmul" or (KERNEL == "auto" and (device.type != "cuda" or _fused["failed"])):
        return False
    if not _triton_importable():
        if KERNEL == "fused":
            raise RuntimeError("crop_resize.KERNEL = 'fused' needs Triton, which does not import here")
        return False
    from cnnpar.data.resize_kernel import fused_available

    return fused_available(device)


def host_array(values) -> np.ndarray:
    """A tensor or array as a NumPy array: a host tensor without a torch call (in a decode thread each
    one is a GIL round trip, `draw_crop_boxes` says what that costs), a device tensor copied."""
    if isinstance(values, torch.Tensor):
        return values.numpy() if values.device.type == "cpu" else values.cpu().numpy()
    return np.asarray(values)


def check_min_scale(min_scale: float) -> None:
    """Refuse a random-resized crop's lower area bound outside (0, 1] (data.crop_min_scale checks it for a run)."""
    if not 0.0 < min_scale <= 1.0:
        raise ValueError(f"crop min scale {min_scale}: expected 0 < value <= 1")


def fallback_boxes(h: np.ndarray, w: np.ndarray) -> np.ndarray:
    """(N, 4) boxes where ten draws found no crop: torchvision's RandomResizedCrop fall-back, the whole image where
    its aspect ratio lies in RRC_RATIO, else the largest centred box of the nearest ratio in it (full height of a
    wide image, full width of a tall one). The centre square used here before, under a comment saying it did as
    torchvision does, was a 1:1 box where torchvision keeps 4:3 (or 3:4)."""
    lo, hi = RRC_RATIO
    wide, tall = w > hi * h, w < lo * h
    # np.round halves to even, as Python's round() in torchvision; clamped so a 1-pixel side stays in the image
    ch = np.where(tall, np.minimum(h, np.maximum(1, np.round(w / lo))), h).astype(np.int64)
    cw = np.where(wide, np.minimum(w, np.maximum(1, np.round(h * hi))), w).astype(np.int64)
    return np.stack([(h - ch) // 2, (w - cw) // 2, ch, cw], 1)


def draw_crop_boxes(
    sizes, train: bool, generator: torch.Generator | None = None, min_scale: float = RRC_SCALE[0]
) -> torch.Tensor:
    """(N, 4) int64 boxes (top, left, height, width) for images of `sizes` (N, 2: height, width; a
    host tensor or array).

    Training: a random-resized crop, area a uniform fraction (min_scale, 1) of the image (RRC_SCALE's
    0.25 by default, data.crop_min_scale), aspect ratio log-uniform in RRC_RATIO, the first of
    RRC_ATTEMPTS draws that fits, else torchvision's fall-back (`fallback_boxes`). Otherwise (evaluation):
    the centre square. All draws for the batch at once, on the host (no device sync).

    Two torch calls whatever N (one draw from torch's generator, seeded per rank and reproducible;
    one tensor made of the result); the arithmetic is NumPy's. In a decode thread every torch call
    gives the GIL up and must win it back from the training thread: the torch version of this
    function cost ~120 ms a batch beside a spinning Python thread, where it took 0.5 ms alone (on the
    CPU; docs/decoding.md). NumPy's element-wise calls keep the GIL, and on a 16-core host torch's
    took ~28 ms per 256-image batch besides.
    """
    hw = host_array(sizes).astype(np.int64).reshape(-1, 2)
    h, w = hw[:, 0], hw[:, 1]
    n = len(hw)
    if not train or n == 0:
        side = np.minimum(h, w)
        return torch.from_numpy(np.stack([(h - side) // 2, (w - side) // 2, side, side], 1))
    check_min_scale(min_scale)
    u = torch.rand(n, 2 * RRC_ATTEMPTS + 2, dtype=torch.float64, generator=generator).numpy()
    scale = min_scale + (RRC_SCALE[1] - min_scale) * u[:, :RRC_ATTEMPTS]
    log_lo, log_hi = math.log(RRC_RATIO[0]), math.log(RRC_RATIO[1])
    ratio = np.exp(log_lo + (log_hi - log_lo) * u[:, RRC_ATTEMPTS : 2 * RRC_ATTEMPTS])
    hn, wn = h[:, None], w[:, None]
    target = hn * wn * scale
    cw = np.round(np.sqrt(target * ratio))  # round half to even, like Python's round() before
    ch = np.round(np.sqrt(target / ratio))
    fits = (cw > 0) & (cw <= wn) & (ch > 0) & (ch <= hn)
    first = fits.argmax(1)[:, None]  # argmax returns the first of equal maxima
    found = fits.any(1)
    ch = np.take_along_axis(ch, first, 1)[:, 0].astype(np.int64)
    cw = np.take_along_axis(cw, first, 1)[:, 0].astype(np.int64)
    top = np.minimum(np.floor(u[:, -2] * (h - ch + 1)).astype(np.int64), np.maximum(h - ch, 0))
    left = np.minimum(np.floor(u[:, -1] * (w - cw + 1)).astype(np.int64), np.maximum(w - cw, 0))
    rrc = np.stack([top, left, ch, cw], 1)
    return torch.from_numpy(np.where(found[:, None], rrc, fallback_boxes(h, w)))


def resized_crops_loop(images: list[torch.Tensor], boxes: torch.Tensor, size: int) -> torch.Tensor:
    """The per-image reference: crop each (3, H, W) uint8 image, resize with antialiased bilinear."""
    out = torch.empty(len(images), 3, size, size, dtype=torch.uint8, device=images[0].device)
    for i, (img, (top, left, ch, cw)) in enumerate(zip(images, boxes.tolist())):
        crop = img[None, :, top : top + ch, left : left + cw].float()
        resized = F.interpolate(crop, size=(size, size), mode="bilinear", antialias=True)
        out[i] = resized[0].round_().clamp_(0, 255).to(torch.uint8)
    return out


def aa_weights(lengths: torch.Tensor, padded: int, size: int) -> torch.Tensor:
    """(N, size, padded) float32 resampling matrices: row i of image n holds the weights with which
    input positions 0..lengths[n]-1 make output position i, zero beyond lengths[n].

    The same formula as PyTorch's `_upsample_bilinear2d_aa` (align_corners=False): centre
    scale * (i + 0.5), support max(scale, 1), triangle filter of width support, taps clipped to
    the input and normalised to sum to one.
    """
    length = lengths.to(torch.float32).view(-1, 1, 1)
    scale = length / size
    support = scale.clamp(min=1.0)
    inv_scale = 1.0 / support  # 1/scale when downscaling, 1 when upscaling
    dev = lengths.device
    centre = scale * (torch.arange(size, dtype=torch.float32, device=dev).view(1, -1, 1) + 0.5)
    lo = (centre - support + 0.5).trunc_().clamp_(min=0)
    hi = torch.minimum((centre + support + 0.5).trunc_(), length)
    j = torch.arange(padded, dtype=torch.float32, device=dev).view(1, 1, -1)
    w = (1 - ((j - centre + 0.5) * inv_scale).abs_()).clamp_(min=0)
    w = torch.where((j >= lo) & (j < hi), w, torch.zeros((), device=dev))
    return w / w.sum(-1, keepdim=True).clamp_(min=1e-12)


def _round8(x: int) -> int:
    return (x + 7) // 8 * 8


def tail_room(max_width: int) -> int:
    """Bytes a flat buffer of interleaved (HWC) images should hold after its last image so that
    `resized_crops_flat` reads every row window in place (3 x the widest row rounded up to 8
    pixels) instead of copying the buffer to pad it."""
    return 3 * _round8(max_width)


def _chunks(area: list[int], rows: list[int], cols: list[int], budget: int) -> list[tuple[int, int]]:
    """Cut images (already sorted by crop area, largest first) into runs whose padded canvas
    (count x max rows x 3 x max cols) fits the budget; an image too big alone still gets a run."""
    runs, start, max_r, max_c = [], 0, 0, 0
    for i in range(len(area)):
        r, c = max(max_r, rows[i]), max(max_c, cols[i])
        if i > start and (i - start + 1) * r * 3 * c > budget:
            runs.append((start, i))
            start, r, c = i, rows[i], cols[i]
        max_r, max_c = r, c
    runs.append((start, len(area)))
    return runs


def resized_crops(
    images: list[torch.Tensor],
    boxes: torch.Tensor,
    size: int,
    hwc: bool = False,
    canvas_budget: int = CANVAS_BUDGET,
    compute_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Crop `boxes` (N, 4: top, left, height, width; on the host) out of (3, H, W) uint8 `images`
    and resize each crop to size x size with antialiased bilinear filtering, batched.

    One copy gathers the images into a flat buffer, in the layout most of them already have:
    `hwc` for views of interleaved memory (nvImageCodec's outputs), planar otherwise (torchvision's),
    so that copy is the only pass over the decoded pixels; `resized_crops_flat` does the rest.
    """
    n = len(images)
    hw = torch.tensor([img.shape[1:] for img in images], dtype=torch.int64).view(n, 2)
    numel = 3 * hw[:, 0] * hw[:, 1]
    starts = torch.cumsum(numel, 0) - numel
    # One call gathers the planar images (a per-image reshape is a GIL round trip each, which a decode
    # thread pays dearly beside a busy training thread: docs/decoding.md); interleaved views are
    # permuted back to their memory order first, so that gather copies each pixel once.
    flat = _flatten_dense_tensors([img.permute(1, 2, 0) for img in images] if hwc else images)
    return resized_crops_flat(flat, starts, hw, boxes, size, hwc, canvas_budget, compute_dtype)


def resized_crops_flat(
    flat: torch.Tensor,
    starts: torch.Tensor,
    hw: torch.Tensor,
    boxes: torch.Tensor,
    size: int,
    hwc: bool = False,
    canvas_budget: int = CANVAS_BUDGET,
    compute_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Crop-and-resize N images that lie in one flat uint8 buffer, to (N, 3, size, size) uint8.

    `flat` is 1-D on the device the work runs on; image k starts at byte `starts[k]`, has height
    and width `hw[k]` and is stored as 3 planes (CHW) or, with `hwc`, as interleaved RGB (HWC: what
    JPEG decoders and the prepared store produce). `starts`, `hw` and `boxes` (N, 4: top, left,
    height, width) are host tensors or arrays. The buffer need not be packed: a resident store passes its
    whole pixel area and the batch's offsets into it, so a batch is resized without being gathered
    first. About a dozen kernels per chunk, whatever N. `compute_dtype` defaults to fp16 on CUDA
    (pixel values and their weighted sums fit fp16's 11-bit mantissa to ~0.1 of a level; tensor
    cores) and float32 elsewhere.
    """
    dev = flat.device
    if uses_fused_kernels(dev):
        from cnnpar.data.resize_kernel import fused_resized_crops

        if _fused["proven"] or KERNEL == "fused":
            return fused_resized_crops(flat, starts, hw, boxes, size, hwc)
        try:
            out = fused_resized_crops(flat, starts, hw, boxes, size, hwc)
        except Exception as e:  # noqa: BLE001 - the first use only, said once, then the products
            _fused["failed"] = repr(e)[:300]
            warnings.warn(
                f"the fused resize kernels (Triton) failed on {dev}: {_fused['failed']}; "
                "resizing with batched matrix products instead",
                stacklevel=2,
            )
        else:
            _fused["proven"] = True
            return out
    dtype = compute_dtype or (torch.float16 if dev.type == "cuda" else torch.float32)
    n = len(starts)
    boxes, hw, starts = (torch.as_tensor(t).to(torch.int64).cpu() for t in (boxes, hw, starts))
    order = torch.argsort(boxes[:, 2] * boxes[:, 3], descending=True, stable=True)
    # Per image, sorted: offset, width, top, left, crop height, crop width, plane size (H*W).
    params = torch.stack([starts, hw[:, 1], boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3], hw[:, 0] * hw[:, 1]], 1)
    params = params[order]
    crop_h, crop_w = params[:, 4].tolist(), params[:, 5].tolist()
    runs = _chunks([a * b for a, b in zip(crop_h, crop_w)], crop_h, crop_w, canvas_budget)
    # Every unfolded row window must lie inside the buffer: pad the tail (a copy) only when the
    # caller left too little room after the last image.
    max_rows, max_cols = _round8(max(crop_h)), _round8(max(crop_w))
    window = tail_room(max(crop_w)) if hwc else max_cols
    need = int((starts + 3 * hw[:, 0] * hw[:, 1]).max()) + window
    if flat.numel() < need:
        flat = torch.cat([flat, flat.new_zeros(need - flat.numel())])
    # What does not depend on a chunk's padded size is computed once for the batch, and each chunk's
    # height and width weights in one call: fewer torch calls per chunk, and in a decode thread each
    # call is a GIL round trip against the training thread (docs/decoding.md).
    p = params.to(dev, non_blocking=True).t().reshape(7, n, 1, 1)
    base_, width, top, left, ch, cw, plane = p.unbind(0)
    order_dev = order.to(dev, non_blocking=True)
    y = torch.minimum(torch.arange(max_rows, device=dev).view(1, max_rows, 1), ch - 1)  # past the crop: repeat a row
    if hwc:
        row_starts = (base_ + ((top + y) * width + left) * 3).view(n, max_rows)  # canvas (m, rows, cols, 3)
    else:
        c = torch.arange(3, device=dev).view(1, 1, 3)
        row_starts = base_ + c * plane + (top + y) * width + left  # (n, rows, 3): canvas (m, rows, 3, cols)
    lengths = p[4:6].view(2, n)  # crop heights, crop widths
    out = torch.empty(n, 3, size, size, dtype=torch.uint8, device=dev)
    for a, b in runs:
        m = b - a
        # Multiples of 8 keep the fp16 products on tensor-core kernels; the extra weights are zero.
        rows, cols = _round8(max(crop_h[a:b])), _round8(max(crop_w[a:b]))
        # heights and widths through one filter call, padded to this chunk's sizes only (one large
        # photo must not widen every image's weights): (2m, size, padded)
        weights = aa_weights(lengths[:, a:b].reshape(2 * m), max(rows, cols), size).to(dtype)
        wy, wx_t = weights[:m, :, :rows], weights[m:, :, :cols].transpose(1, 2)  # (m, size, rows), (m, cols, size)
        if hwc:
            canvas = flat.unfold(0, 3 * cols, 1).index_select(0, row_starts[a:b, :rows].reshape(-1)).to(dtype)
            canvas = canvas.view(m, rows, cols, 3).permute(0, 1, 3, 2).reshape(m, rows, 3 * cols)
        else:
            canvas = flat.unfold(0, cols, 1).index_select(0, row_starts[a:b, :rows].reshape(-1))
            canvas = canvas.view(m, rows, 3 * cols).to(dtype)
        # Either order gives the same result; the first product is the same size, the second
        # costs size^2 * 3 * (rows or cols), so resize along the longer side first.
        if rows <= cols:
            tmp = torch.bmm(canvas.view(m, rows * 3, cols), wx_t)  # (m, rows*3, size)
            res = torch.bmm(wy, tmp.view(m, rows, 3 * size)).view(m, size, 3, size)
        else:
            tmp = torch.bmm(wy, canvas)  # (m, size, 3*cols)
            res = torch.bmm(tmp.view(m, size * 3, cols), wx_t).view(m, size, 3, size)
        res = res.permute(0, 2, 1, 3).round_().clamp_(0, 255).to(torch.uint8)
        out.index_copy_(0, order_dev[a:b], res)
    return out
