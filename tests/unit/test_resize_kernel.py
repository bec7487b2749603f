"""The fused crop-and-resize kernels (Triton) against the per-image reference, on the CPU under
Triton's interpreter, in a child process of their own (resize_kernel_cases.py says why)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")  # shipped with torch's CUDA wheels, which CI installs

CASES = Path(__file__).with_name("resize_kernel_cases.py")


@pytest.mark.slow  # over 20 s on 2 CPU cores (CI durations): `-m 'not slow'` leaves it out
def test_the_fused_kernels_match_the_reference_and_the_switch_routes_to_them():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, str(CASES)], env=env, capture_output=True, text=True, timeout=300, cwd=CASES.parents[2]
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    if done.stdout.startswith("skip "):
        pytest.skip(done.stdout.strip().removeprefix("skip "))
    passed = {line[3:] for line in done.stdout.splitlines() if line.startswith("ok ")}
    for train, size in ((True, 16), (False, 12), (False, 20)):  # every layout and size was checked
        for hwc in (True, False):
            assert f"within one level train={train} size={size} hwc={hwc}" in passed
        assert f"fp16 rows size={size}" in passed
    assert {"empty batch", "the decoder called the kernels", "the decoder's output", "planar gather"} <= passed
    assert {"auto keeps the CPU on the products", "fused on request", "a wrong name is refused"} <= passed
    assert {"a garbage-loading interpreter is named", "and not used"} <= passed


def test_the_kernels_constexpr_parameters_are_annotated_with_the_object_not_a_string():
    """Triton 3.1's interpreter (torch 2.5's) takes a parameter as constexpr only when its annotation's
    name is exactly "constexpr": under `from __future__ import annotations` it was the string
    "tl.constexpr", BLOCK reached `tl.arange` as a tensor and both kernels failed."""
    import triton.language as tl

    from cnnpar.data import resize_kernel

    for kernel in (resize_kernel._rows_kernel, resize_kernel._columns_kernel):
        annotations = kernel.fn.__annotations__
        assert annotations["BLOCK"] is tl.constexpr and annotations["P"] is tl.constexpr, annotations


@pytest.mark.gpu
@pytest.mark.parametrize("hwc", [True, False])
def test_on_cuda_the_compiled_kernels_match_the_reference_on_photo_sizes(hwc):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from cnnpar.data import crop_resize
    from cnnpar.data.crop_resize import draw_crop_boxes, resized_crops_flat, resized_crops_loop
    from tests.unit.resize_kernel_cases import flat_of
    from tests.unit.test_gpu_decode import SIZES, smooth_image

    assert crop_resize.uses_fused_kernels(torch.device("cuda"))  # the default on CUDA
    images = [smooth_image(h, w, phase=i).cuda() for i, (h, w) in enumerate(SIZES * 8)]
    g = torch.Generator().manual_seed(3)
    for train in (True, False):
        boxes = draw_crop_boxes(torch.tensor([img.shape[1:] for img in images]), train, g)
        reference = resized_crops_loop(images, boxes, 224).int()
        flat, starts, hw = flat_of(images, hwc, gap=5)
        out = resized_crops_flat(flat, starts, hw, boxes, 224, hwc=hwc)
        diff = (out.int() - reference).abs()
        assert out.shape == reference.shape and diff.max() <= 1 and diff.float().mean() < 0.1, (train, diff.max())
