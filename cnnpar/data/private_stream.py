"""CUDA streams made for one user alone, through the CUDA runtime torch itself loaded.

`torch.cuda.Stream()` does not make a stream: it hands out the streams of a fixed pool (32 per device
and priority) in turn, and every stage of cnnpar's data pipeline draws its streams from the same
pool, so after some epochs two stages hold the same stream. That matters where a library ignores
stream order, as nvJPEG does when it writes decoded images: the decoders allocate their outputs on
a stream no kernel is ever queued on, so that the caching allocator's pool for that stream holds
only their earlier outputs (data/nvjpeg_hw.py, data/gpu_decode.py).
"""

from __future__ import annotations

import ctypes
from functools import cache

import torch

STREAM_NON_BLOCKING = 1  # cudaStreamNonBlocking: no implicit wait on the legacy default stream


@cache
def _cuda_runtime() -> ctypes.CDLL | None:
    """The CUDA runtime torch itself loaded (libcudart, found again by its soname), None if not found."""
    major = (torch.version.cuda or "").split(".")[0]
    if not major:
        return None
    try:
        cudart = ctypes.CDLL(f"libcudart.so.{major}")
    except OSError:
        return None
    cudart.cudaStreamCreateWithFlags.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
    cudart.cudaStreamDestroy.argtypes = [ctypes.c_void_p]
    cudart.cudaStreamCreateWithFlags.restype = cudart.cudaStreamDestroy.restype = ctypes.c_int
    return cudart


def private_stream(device: torch.device) -> torch.cuda.Stream | None:
    """A CUDA stream made for its caller alone (not one of torch's pool: the module's docstring says
    why), or None where none could be made (no CUDA runtime found by its soname, or its call failed)."""
    cudart = _cuda_runtime()
    if cudart is None:
        return None
    handle = ctypes.c_void_p()
    with torch.cuda.device(device):
        status = cudart.cudaStreamCreateWithFlags(ctypes.byref(handle), STREAM_NON_BLOCKING)
    if status != 0 or not handle.value:
        return None
    return torch.cuda.ExternalStream(handle.value, device=device)


def destroy_private_stream(stream: torch.cuda.Stream) -> None:
    """Free a stream `private_stream` made, once the work queued on it is done."""
    stream.synchronize()
    cudart = _cuda_runtime()
    if cudart is not None:
        cudart.cudaStreamDestroy(ctypes.c_void_p(stream.cuda_stream))
