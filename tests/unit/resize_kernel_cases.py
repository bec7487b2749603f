"""Checks of the fused crop-and-resize kernels (cnnpar/data/resize_kernel.py), run by
test_resize_kernel.py in a child process with TRITON_INTERPRET=1: Triton reads that variable when a
kernel is defined, so it must be set before cnnpar's kernels are imported, and only in a process of
their own (a CUDA test in the same session must get compiled kernels). Prints "ok NAME" per check."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
warnings.filterwarnings("ignore", category=DeprecationWarning)  # torchvision 0.29's codec notice

import torch  # noqa: E402
from torch._utils import _flatten_dense_tensors  # noqa: E402

from cnnpar.data import crop_resize  # noqa: E402
from cnnpar.data.crop_resize import draw_crop_boxes, resized_crops, resized_crops_loop  # noqa: E402
from cnnpar.data.gpu_decode import GpuDecoder  # noqa: E402
from cnnpar.data.resize_kernel import fused_resized_crops, interpreter_fault  # noqa: E402
from tests.unit.test_gpu_decode import decoded, encoded, jpeg_bytes, smooth_image  # noqa: E402

# small photos of the shapes photos have (landscape, portrait, a strip, one smaller than the output).
# Triton's interpreter runs the grid one program at a time, each kernel op a few Python-level calls
# (type checks, broadcasts) whatever BLOCK is: the time goes with the programs, one per crop row and
# one per output row, and with the taps each loops over, not with the pixels. The larger two photos
# were 60 x 80 and 80 x 54 (downscaled up to 6.7x, 15 taps): halved, they still downscale 3.3x
# (8 taps) and the interpreted kernels take half the CPU (18 -> 9 s on 2 cores)
SIZES = [(30, 40), (40, 27), (24, 18), (13, 60), (11, 9)]


def flat_of(images: list[torch.Tensor], hwc: bool, gap: int = 0):
    """The images in one flat buffer (interleaved or planar), `gap` unused bytes before each, and
    their starts and sizes: what the JPEG engines, a prepared store or the gather hand over."""
    parts, starts, at = [], [], 0
    for img in images:
        pixels = (img.permute(1, 2, 0) if hwc else img).contiguous().view(-1)
        parts += [torch.full((gap,), 255, dtype=torch.uint8, device=img.device), pixels]
        starts.append(at + gap)
        at += gap + pixels.numel()
    hw = torch.tensor([img.shape[1:] for img in images])
    return _flatten_dense_tensors(parts), torch.tensor(starts), hw


def check(name: str, ok: bool, detail: str = "") -> None:
    if not ok:
        raise AssertionError(f"{name}: {detail}")
    print("ok", name, flush=True)


def matches_the_per_image_reference() -> None:
    """Both layouts, random-resized and centre crops, down- and upscaling: the same filter as the
    per-image F.interpolate(antialias=True), to a one-level rounding flip now and then."""
    images = decoded([jpeg_bytes(smooth_image(h, w, phase=i)) for i, (h, w) in enumerate(SIZES)])
    g = torch.Generator().manual_seed(2)
    for train, size in ((True, 16), (False, 12), (False, 20)):  # 20 upscales the 11 x 9 photo
        boxes = draw_crop_boxes(torch.tensor([img.shape[1:] for img in images]), train, g)
        reference = resized_crops_loop(images, boxes, size).int()
        for hwc in (True, False):
            flat, starts, hw = flat_of(images, hwc, gap=7)  # gaps: images need not be packed
            out = fused_resized_crops(flat, starts, hw, boxes, size, hwc=hwc, tmp_dtype=torch.float32)
            diff = (out.int() - reference).abs()
            label = f"train={train} size={size} hwc={hwc}"
            check(f"reference {label}", out.shape == reference.shape and out.dtype == torch.uint8, str(out.shape))
            check(f"within one level {label}", diff.max() <= 1 and (diff > 0).float().mean() < 2e-3, str(diff.max()))
        # fp16 rows, as on CUDA: sums keep ~0.1 of a level, so a few percent of pixels flip by one
        out = fused_resized_crops(*flat_of(images, True), boxes, size, hwc=True)
        diff = (out.int() - reference).abs()
        check(f"fp16 rows size={size}", diff.max() <= 1 and diff.float().mean() < 0.1, str(diff.float().mean()))


def an_empty_batch_is_empty() -> None:
    nothing = torch.zeros(0, 4)
    out = fused_resized_crops(torch.zeros(8, dtype=torch.uint8), nothing[:, 0], nothing[:, :2], nothing, 24)
    check("empty batch", out.shape == (0, 3, 24, 24))


def the_switch_routes_the_decoder_through_the_kernels() -> None:
    """`KERNEL = "fused"` sends GpuDecoder's batched resize (and every `resized_crops_flat` caller)
    through the kernels; "auto" keeps them to CUDA; a wrong name is refused."""
    blobs = [jpeg_bytes(smooth_image(h, w, phase=i)) for i, (h, w) in enumerate(SIZES)]
    files = [Path(f"img{i}.jpg") for i in range(len(blobs))]
    cpu = torch.device("cpu")
    check("auto keeps the CPU on the products", not crop_resize.uses_fused_kernels(cpu))
    loop = GpuDecoder(files, 16, cpu, False, resize="loop")(encoded(blobs))
    crop_resize.KERNEL = "fused"
    try:
        check("fused on request", crop_resize.uses_fused_kernels(cpu))
        calls = []
        import cnnpar.data.resize_kernel as rk

        original = rk.fused_resized_crops
        rk.fused_resized_crops = lambda *a, **k: calls.append(len(a[1])) or original(*a, **k)
        try:
            fused = GpuDecoder(files, 16, cpu, False, resize="batched")(encoded(blobs))
        finally:
            rk.fused_resized_crops = original
        check("the decoder called the kernels", calls == [len(blobs)], str(calls))
        check("the decoder's output", (fused.int() - loop.int()).abs().max() <= 1)
        g = torch.Generator().manual_seed(0)
        images = decoded(blobs)
        boxes = draw_crop_boxes(torch.tensor([i.shape[1:] for i in images]), True, g)
        mixed = resized_crops(images, boxes, 16)  # the planar gather, then the kernels
        check("planar gather", (mixed.int() - resized_crops_loop(images, boxes, 16).int()).abs().max() <= 1)
        crop_resize.KERNEL = "bilinear"
        try:
            crop_resize.uses_fused_kernels(cpu)
            check("a wrong name is refused", False, "no error")
        except ValueError as e:
            check("a wrong name is refused", "expected one of auto, fused, matmul" in str(e), str(e))
    finally:
        crop_resize.KERNEL = "auto"


def an_interpreter_that_loads_garbage_is_not_used() -> None:
    """Triton 3.1's interpreter under NumPy 2 loads garbage (its pybind11 predates NumPy 2): the probe
    must notice, and then even a request for the kernels gets the products, not noise."""
    import numpy as np
    from triton.runtime import interpreter

    real = interpreter._interpreter
    interpreter._interpreter = SimpleNamespace(
        load=lambda ptrs, mask, other, dtype: np.full(ptrs.shape, 7, dtype=dtype), store=real.store
    )
    interpreter_fault.cache_clear()
    crop_resize.KERNEL = "fused"
    try:
        fault = interpreter_fault()
        check("a garbage-loading interpreter is named", "interpreter does not move data" in fault, fault)
        check("and not used", not crop_resize.uses_fused_kernels(torch.device("cpu")))
    finally:
        interpreter._interpreter = real
        interpreter_fault.cache_clear()
        crop_resize.KERNEL = "auto"


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run by test_resize_kernel.py, under Triton's interpreter"
    if fault := interpreter_fault():  # Triton 3.1 with NumPy 2: nothing the kernels compute could be checked
        print("skip", fault)
        sys.exit(0)
    matches_the_per_image_reference()
    an_empty_batch_is_empty()
    the_switch_routes_the_decoder_through_the_kernels()
    an_interpreter_that_loads_garbage_is_not_used()
