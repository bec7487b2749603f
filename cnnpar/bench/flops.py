"""Model FLOPs per image and the device's peak, both measured in the run that uses them.

Model FLOP utilisation (MFU) = FLOPs per image x images/s / peak FLOP/s. The FLOPs come from
`torch.utils.flop_counter` on one forward and backward; the peak is a large matrix product timed
here and now (bf16 on CUDA, fp32 on the CPU), not a datasheet figure, so MFU stays comparable
between rungs of one run even when clocks or the machine differ between runs.
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
    model = build_model(model_name, c, num_classes, h).to(device)
    x = torch.randn(FLOP_BATCH, c, h, w, device=device)
    y = torch.randint(0, num_classes, (FLOP_BATCH,), device=device)
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(x), y).backward()
    return counter.get_total_flops() / FLOP_BATCH


def peak_flops(device: torch.device) -> tuple[float, str]:
    """FLOP/s of a large square matmul: bf16 on CUDA (the tensor-core peak), fp32 on the CPU."""
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    n = PEAK_SIDE[device.type if cuda else "cpu"]
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
