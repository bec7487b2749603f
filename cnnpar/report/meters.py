"""Timers for the host side of a loop, and a device sync helper that says where it syncs."""

from __future__ import annotations

import collections
import contextlib
import gc
import sys
import time
from collections.abc import Iterator

import torch

from cnnpar.report.ranges import DATA_WAIT, span

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
    return peak_rss_mb(), CPU_PEAK_RSS


def peak_rss_mb() -> float:
    """The process's peak resident set size in MB. ru_maxrss is in KiB on Linux and in bytes on macOS; Windows has
    no `resource` module (importing it at the top stopped every command that trains there): psutil's peak working
    set instead."""
    try:
        import resource
    except ImportError:
        import psutil

        memory = psutil.Process().memory_info()
        return getattr(memory, "peak_wset", memory.rss) / 2**20  # peak_wset: Windows' own; rss where psutil lacks it
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def sync(device: torch.device) -> None:
    """Wait for the device: a deliberate CPU-GPU sync point, used only around measured regions."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class DataWait:
    """How long the device waited for the next batch: what every "data wait" figure cnnpar prints
    measures (train's epoch lines, the doctor's end to end, bench's rows).

    On a GPU the host runs ahead of the device, so host time inside `next(loader)` is not what the
    device lost: a host that runs ahead blocks in the loader's launches once CUDA's launch queue is
    full, while the device is still busy with steps queued before (ResNet-18 at 32 px on an H200
    measured 26 % host "data wait" with its end to end within 3 % of the step alone: call ZZZ). So on
    CUDA the wait is device time between two events on the current stream, one recorded before
    `next` and one after: the device reaches the first when the work queued before is done, and the
    second when the batch is there (the loader's device work, its wait on the feeder's hand-over,
    and the idle time while the host had not yet queued it). Read them after a sync (`seconds`).
    On the CPU it is host time inside `next`."""

    PENDING = 64  # event pairs held before the finished ones are read and let go (an epoch may be 10^5 steps)

    def __init__(self, device: torch.device, range_name: str | None = DATA_WAIT) -> None:
        self.on_device = device.type == "cuda"
        self.range_name = range_name  # the profiler/NVTX range around each wait; None: none (the evaluation's)
        self.host_s = 0.0
        self._device_s = 0.0  # from the pairs already read
        self._events: collections.deque[tuple[torch.cuda.Event, torch.cuda.Event]] = collections.deque()
        # pairs already read are recorded again (a pair only once read). Host cost per counted call on an H200
        # (benchmarks/data_wait_cost.py, call ZZZF): 32.5 us reusing, 35.5 us with two new events; recording the
        # two events is most of it (23.6 us). The host runs ahead of the device, so that shows only in a step
        # the host cannot keep ahead of: ResNet-18 at 32 px (a ~6 ms step) trained at 65,580-66,456 img/s with
        # the reused pairs (ZZZF) and 66,338-66,754 with new ones (ZZZD)
        self._spare: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    @contextlib.contextmanager
    def waiting(self, counted: bool = True) -> Iterator[None]:
        """Wrap the call that gets the next batch; `counted` False: a warm-up step, not measured."""
        pair = self._recorded_pair() if counted and self.on_device else None
        t0 = time.perf_counter()
        with span(self.range_name) if self.range_name else contextlib.nullcontext():
            yield
        if counted:
            self.host_s += time.perf_counter() - t0
            if pair is not None:
                pair[1].record()
                self._events.append(pair)
                if len(self._events) > self.PENDING:
                    self._read(only_finished=True)

    def _recorded_pair(self) -> tuple[torch.cuda.Event, torch.cuda.Event]:
        pair = self._spare.pop() if self._spare else (_new_event(), _new_event())
        pair[0].record()
        return pair

    def _read(self, only_finished: bool) -> None:
        # query() asks without waiting; elapsed_time needs both events finished
        while self._events and (not only_finished or self._events[0][1].query()):
            pair = self._events.popleft()
            self._device_s += pair[0].elapsed_time(pair[1]) / 1e3
            self._spare.append(pair)

    def seconds(self) -> float:
        """The wait so far. On CUDA it waits for the last event first: the callers read it after their own sync,
        so that wait is none, but a reading before the device got there must not fail."""
        if not self.on_device:
            return self.host_s
        if self._events:
            self._events[-1][1].synchronize()  # note: a CPU-GPU sync point (a no-op after the caller's)
        self._read(only_finished=False)
        return self._device_s


def _new_event() -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=True)


class EpochClock:
    """Wall time of an epoch and the part of it the device waited for data (`DataWait`). The end of
    an epoch syncs before `summary` reads the wall time, so images/s is what the device achieved."""

    def __init__(self, device: torch.device) -> None:
        self.start = time.perf_counter()
        self.data_wait = DataWait(device)
        self.images = 0

    def count(self, images: int) -> None:
        self.images += images

    def summary(self) -> dict[str, float]:
        wall = time.perf_counter() - self.start
        waited = self.data_wait.seconds()
        return {
            "epoch_s": wall,
            "images_per_s": self.images / wall if wall > 0 else 0.0,
            "data_wait_share": waited / wall if wall > 0 else 0.0,
        }


def free_device_memory(device: torch.device) -> None:
    """Drop what a finished (or failed, e.g. out of memory) measurement left behind before the next one."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
