"""CUDA streams made for one user alone, through the CUDA runtime torch itself loaded.

`torch.cuda.Stream()` does not make a stream: it hands out the streams of a fixed pool (32 per device
and priority) in turn, and every stage of cnnpar's data pipeline draws its streams from the same
pool, so after some epochs two stages hold the same stream: with a two-stage JPEG decoder and an
evaluation every epoch the feeders drew 4 pool streams an epoch, so every 8th epoch (or never,
depending on where the run's draws began) a stage held the training thread's own stream and queued
its work behind the step's (hence `DeviceFeeder`'s stage streams, made once per feeder).

It matters more where a library ignores stream order, as nvJPEG does when it writes decoded images:
the decoders allocate their outputs on a stream no kernel is ever queued on, so that the caching
allocator's pool for that stream holds only their earlier outputs, each held by `record_stream`
until its readers are done (data/nvjpeg_hw.py, data/gpu_decode.py). The JPEG engines' work on
theirs is waited for before each call returns; on torchvision's path's stream runs whatever that
library queues on the current stream (waits on events, in RGB mode).
"""

from __future__ import annotations

import ctypes
from functools import cache

import torch

STREAM_NON_BLOCKING = 1  # cudaStreamNonBlocking: no implicit wait on the legacy default stream


@cache
def _cuda_runtime() -> ctypes.CDLL | None:
    """The CUDA runtime torch itself loaded (libcudart, found again by its soname: libcudart.so.12 and
    .13, libcudart.so.11.0 for CUDA 11), None if not found (a ROCm build, say)."""
    major = (torch.version.cuda or "").split(".")[0]
    if not major:
        return None
    for name in (f"libcudart.so.{major}", f"libcudart.so.{major}.0"):
        try:
            cudart = ctypes.CDLL(name)
        except OSError:
            continue
        cudart.cudaStreamCreateWithPriority.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint, ctypes.c_int]
        cudart.cudaStreamCreateWithPriority.restype = ctypes.c_int
        return cudart
    return None


def private_stream(device: torch.device, priority: int = 0) -> torch.cuda.Stream | None:
    """A new CUDA stream for its caller alone (not one of torch's pool: the module's docstring says why);
    None where none could be made (no CUDA runtime found by its soname, or its call failed): the callers
    then wait for their own stream before the library's call.

    Never destroyed: the caching allocator keeps each block's stream handle, and with expandable segments
    or the cudaMallocAsync backend it calls CUDA on that stream when it frees the block, which on a
    destroyed handle is undefined (a review of session 16's change). Callers make one per decoder or
    pipeline stage and keep it: a training run holds a few (two stages per feeder, one per engines
    handle); a process that builds many feeders (the ladder's rungs) holds two more for each."""
    cudart = _cuda_runtime()
    if cudart is None:
        return None
    handle = ctypes.c_void_p()
    with torch.cuda.device(device):
        # priority as torch.cuda.Stream's: 0 the default, lower numbers higher (CUDA clamps to its range)
        status = cudart.cudaStreamCreateWithPriority(ctypes.byref(handle), STREAM_NON_BLOCKING, priority)
    if status != 0 or not handle.value:
        return None
    return torch.cuda.ExternalStream(handle.value, device=device)
