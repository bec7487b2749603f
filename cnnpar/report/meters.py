"""Timers for the host side of a loop, and a device sync helper that says where it syncs."""

from __future__ import annotations

import gc
import resource
import time

import torch

# What a `peak_mem_mb` figure measures, stored beside it as `peak_mem_kind`: on a GPU the tensors'
# high-water mark; on the CPU the whole process's resident memory (Python, torch's libraries and
# the data included), which is not comparable with the GPU figure.
CUDA_PEAK = "cuda_max_allocated"
CPU_PEAK_RSS = "process_peak_rss"  # ru_maxrss: the process's high-water mark since it started
CPU_RSS = "process_rss"  # the largest RSS sampled during the measurement


def peak_memory(device: torch.device) -> tuple[float, str]:
    """(MB, kind): `torch.cuda.max_memory_allocated` since the caller's reset on CUDA, else the
    process's peak resident set size, which has no reset."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20, CUDA_PEAK
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, CPU_PEAK_RSS  # Linux reports KiB


def sync(device: torch.device) -> None:
    """Wait for the device: a deliberate CPU-GPU sync point, used only around measured regions."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class EpochClock:
    """Wall time of an epoch and the part of it spent waiting for the next batch.

    The data wait is host time inside `next(loader)`. With a GPU the host runs ahead of the
    device, so a nonzero wait means the device may starve; the end of an epoch syncs before
    reading the wall time so images/s is what the device achieved.
    """

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.data_wait = 0.0
        self.images = 0

    def waited(self, seconds: float, images: int) -> None:
        self.data_wait += seconds
        self.images += images

    def summary(self) -> dict[str, float]:
        wall = time.perf_counter() - self.start
        return {
            "epoch_s": wall,
            "images_per_s": self.images / wall if wall > 0 else 0.0,
            "data_wait_share": self.data_wait / wall if wall > 0 else 0.0,
        }


def free_device_memory(device: torch.device) -> None:
    """Drop what a finished (or failed, e.g. out of memory) measurement left behind before the next one."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
