"""A device that runs out of memory in a run's training step, its evaluation or a prediction, said in one line: the
phase, the batch per process and the image shape, the device and its memory, and the flags that make it fit. torch's
own error is a traceback of a dozen lines whose last one names none of cnnpar's flags. The batch search
(engine/batch_size.py) and bench's and tune's trials handle it themselves, as a measurement: they are not wrapped."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import torch

from cnnpar.errors import DeviceMemoryFull, chain

_SIZE = r"([\d.]+ (?:bytes|[KMGTP]iB))"  # c10's format_size: "2.00 GiB", "512 bytes"
_TRIED = re.compile(rf"Tried to allocate {_SIZE}")
_CAPACITY = re.compile(rf"GPU (\d+) has a total capacity of {_SIZE}")
_UNALLOCATED = re.compile(rf"{_SIZE} is reserved by PyTorch but unallocated")
_FREE = re.compile(rf"has a total capacity of {_SIZE} of which {_SIZE} is free")
_THIS_PROCESS = re.compile(rf"Including non-PyTorch memory, this process has {_SIZE} memory in use")
_UNITS = {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "PiB": 2**50}

# the ways out of a training step that does not fit; an evaluation's batch is the training's (--batch-size)
TRAINING_WAYS = (
    "a smaller --batch-size, --batch-size auto (measures what fits), --grad-accum N with a batch N times smaller "
    "(the same batch per step), or a smaller --image-size"
)
EVALUATION_WAYS = "a smaller --batch-size (the evaluation's batch is the training's), or a smaller --image-size"


# Device memory that ran out outside the caching allocator, which torch raises as a plain RuntimeError (its
# AcceleratorError, CuDNNError): only texts that say nothing else. c10_cuda_check's "CUDA error: " + cudaGetErrorString
# (cudaErrorMemoryAllocation: "out of memory"); TORCH_CUDABLAS_CHECK's cuBLAS status; cuDNN's status (8's ALLOC_FAILED,
# 9's device allocation; 9's HOST_ALLOCATION_FAILED is the host's memory, not the device's); cuDNN SDPA's own line; the
# MPS allocator's TORCH_CHECK. ("Not enough memory for workspace!" is raised as OutOfMemoryError itself.)
_ALLOCATION_FAILED = re.compile(
    r"CUDA error: out of memory|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED"
    r"|CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED|CUDA ran out of memory outside PyTorch's allocator"
    r"|MPS backend out of memory"
)


def out_of_memory(e: BaseException) -> RuntimeError | None:
    """torch's out-of-memory error behind `e` (itself, or one it was raised from or over: a compiled step's): its
    OutOfMemoryError, or a RuntimeError that says the device's memory ran out outside the caching allocator."""
    return next((x for x in chain(e) if _memory_ran_out(x)), None)


def _memory_ran_out(e: BaseException) -> bool:
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(e, RuntimeError) and _ALLOCATION_FAILED.search(str(e)) is not None


def _bytes(size: str) -> float:
    number, unit = size.split()
    return float(number) * _UNITS[unit]


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def device_words(device: torch.device | None, text: str) -> str:
    """The device and its memory in all, from torch's message where it says them ("GPU 0 has a total capacity of
    79.19 GiB"), else from the device."""
    capacity = _CAPACITY.search(text)
    total = capacity.group(2) if capacity else None
    if device is not None and device.type == "cuda" and torch.cuda.is_available():
        name = f"{device} ({torch.cuda.get_device_name(device)}, "
        total = total or _gib(torch.cuda.get_device_properties(device).total_memory)
    else:
        name = f"GPU {capacity.group(1)} (" if capacity else f"{device or 'the device'}"
    return f"{name}{total} in all)" if total else name


def torch_detail(text: str) -> str:
    """torch's own detail in one clause: the allocation it tried, and its hint about fragmentation only where it
    applies (the memory reserved but unallocated would have held that allocation: expandable segments can use it);
    then what other processes held (`_others_held`)."""
    tried = _TRIED.search(text)
    if not tried:
        return ""
    detail = f"tried to allocate {tried.group(1)}"
    spare = _UNALLOCATED.search(text)
    if spare and _bytes(spare.group(1)) >= _bytes(tried.group(1)):
        detail += (
            f" while {spare.group(1)} was reserved but unallocated: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
            "may let it fit"
        )
    return detail + _others_held(text, _bytes(tried.group(1)))


def _others_held(text: str, tried: float) -> str:
    """Where other processes held the memory the allocation needed (the device's total less its free memory and
    this process's use, from torch's message): said, as torch's own lines named each process; else "". The ways out
    (a smaller batch) then ask the wrong run to shrink. A share under 1 % of the device is the sizes' rounding."""
    total, this = _FREE.search(text), _THIS_PROCESS.search(text)
    if not (total and this):
        return ""
    capacity = _bytes(total.group(1))
    others = capacity - _bytes(total.group(2)) - _bytes(this.group(1))
    if others < max(tried, capacity / 100):
        return ""
    return f"; other processes held {_gib(others)} of the device (nvidia-smi names them)"


def memory_full_line(
    e: BaseException, phase: str, batch: int, shape: tuple[int, ...], device: torch.device | None, ways: str
) -> str:
    """The one line for `e`, an out-of-memory error in `phase` ("the training step", "the evaluation", "the
    prediction") of batches of `batch` images of `shape` (C, H, W) per process on `device`."""
    text = str(e)
    detail = torch_detail(text)
    images = "x".join(map(str, shape))
    where = device_words(device, text)
    return (
        f"{phase} ran out of memory: batch {batch}/process of {images} images on {where}"
        f"{f'; torch {detail}' if detail else ''}; expected settings that fit: {ways}"
    )


@contextlib.contextmanager
def memory_full_said(
    phase: str, batch: int, shape: tuple[int, ...], device: torch.device | None, ways: str
) -> Iterator[None]:
    """Turn an out-of-memory error in the block into DeviceMemoryFull, its one line (`memory_full_line`)."""
    try:
        yield
    except Exception as e:
        if out_of_memory(e) is None:
            raise
        raise DeviceMemoryFull(memory_full_line(out_of_memory(e), phase, batch, shape, device, ways)) from None
