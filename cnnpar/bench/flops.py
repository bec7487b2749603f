"""Model FLOPs per image and the device's peak, both measured in the run that uses them.

Model FLOP utilisation (MFU) = FLOPs per image x images/s / peak FLOP/s. The FLOPs come from
`torch.utils.flop_counter` on one forward and backward; the peak is a large matrix product timed
here and now (bf16 on CUDA; on a CPU the faster of fp32 and, where it is native, bf16), not a
datasheet figure, so MFU stays comparable between rungs of one run even when clocks or the machine
differ between runs.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from cnnpar.models import build_model
from cnnpar.report.meters import sync

FLOP_BATCH = 2  # BatchNorm in train mode needs more than one sample per channel
PEAK_SIDE = {"cuda": 8192, "cpu": 1024}
PEAK_MIN_SECONDS = 0.3


def flops_per_image(model_name: str, shape: tuple[int, int, int], num_classes: int, device: torch.device) -> float:
    """Forward + backward FLOPs of one image (a multiply-add counts as two)."""
    c, h, w = shape
    model = build_model(model_name, c, num_classes, h, w).to(device)
    x = torch.randn(FLOP_BATCH, c, h, w, device=device)
    y = torch.randint(0, num_classes, (FLOP_BATCH,), device=device)
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(x), y).backward()
    return counter.get_total_flops() / FLOP_BATCH


def peak_flops(device: torch.device) -> tuple[float, str]:
    """FLOP/s of a large square matmul in the fastest precision the device multiplies in hardware: bf16 on
    CUDA (the tensor-core peak); on a CPU fp32, and bf16 too where it has AVX512-BF16 or AMX, keeping the
    faster. A bf16 step measured against an fp32 peak could otherwise show an MFU above 100 %."""
    if device.type == "cuda":
        return _matmul_flops(device, torch.bfloat16, PEAK_SIDE["cuda"])
    from cnnpar.parallel.precision import cpu_has_native_bf16

    dtypes = (torch.float32, torch.bfloat16) if cpu_has_native_bf16() else (torch.float32,)
    return max(_matmul_flops(device, dtype, PEAK_SIDE["cpu"]) for dtype in dtypes)


def _matmul_flops(device: torch.device, dtype: torch.dtype, n: int) -> tuple[float, str]:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    iters, elapsed = 0, 0.0
    start = time.perf_counter()
    while elapsed < PEAK_MIN_SECONDS or iters < 5:
        for _ in range(5):
            a @ b
        iters += 5
        sync(device)  # note: a CPU-GPU sync point, outside any rung's measured region
        elapsed = time.perf_counter() - start
    kind = f"{str(dtype).removeprefix('torch.')} matmul {n}x{n}"
    return 2.0 * n**3 * iters / elapsed, kind
