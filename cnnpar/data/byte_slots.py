"""Encoded batches in shared-memory slots made once per loader, not a new shared segment per batch.

Why: a DataLoader worker hands each batch's bytes to the main process as a new shared-memory segment,
which the main process maps on arrival and unmaps when the batch is freed. On an H200 the unmapping of
the ~28 MB a batch of 256 ImageNet photos takes ran in the decode thread, with the GIL held (it happens
while Python frees the tensor): about 9 % of the wall time of the timed epochs, ~5 ms a batch during which the
training thread could launch nothing (py-spy with native frames, benchmarks/results/2026-12-01-h200/
call-zf/).

Here the main process makes one shared buffer of `count` slots before the workers start (forked or
spawned, they map it once), and hands each batch of indices a free slot as the DataLoader dispatches it
(`SlottedBatches`). The worker writes the batch's files into that slot and sends back only the slot's
number and offsets; the decoder reads the bytes in place and gives the slot back once the decode has
consumed them (the decode call synchronises). A batch that finds no free slot, or does not fit one,
travels the old way, so a slot count or size that is too small costs speed, never correctness.

Slots are taken and given back in the main process only. Each new pass over the loader starts with every
slot free: by the time a pass draws its first batch of indices, the DataLoader has stopped the workers'
tasks of the pass before (persistent workers acknowledge the new pass after their older tasks; the
loader uses slots only with persistent workers), and the decode thread of the pass before has been
joined, so no batch of it is still being written or read. That also returns the slots of batches a pass
dropped unread.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import psutil
import torch

from cnnpar.host_facts import memory_total

ENABLED = True  # benchmarks/jpeg_pipeline.py's slots=0 measures the old way
# Not page-locked by default: in one H200 call (call-zg) slots locked with cudaHostRegister ran 5,934 img/s end to
# end against 5,877 left pageable, within the calls' noise, for up to 4 GiB of locked memory per loader and a
# failed registration that would leave CUDA's last error set for the next kernel launch to report.
# benchmarks/jpeg_pipeline.py's slots=locked sets PAGE_LOCK to measure it again beside the engines' cut calls
# (nvjpeg_hw.EngineSettings.chunk), whose per-image copies from pageable memory all queue at once.
PAGE_LOCK = False

# Budget for all slots of one loader: at most this share of the host's memory and half of /dev/shm's
# free space, split between the processes of this node (they plan at about the same time); below what the
# prefetched batches need, the rest travel the old way
MEMORY_SHARE = 1 / 32
SHM_SHARE = 0.5
MAX_BYTES = 4 << 30
SIZE_MARGIN = 1.5  # a slot holds 1.5x a batch of average-sized files
SAMPLE_FILES = 512  # files whose sizes estimate the average


def host_memory_bytes() -> int:
    """The host's memory, or a container's limit where that is smaller (the slots' share is of what this process
    may hold)."""
    return memory_total()


def shm_free_bytes() -> int:
    try:
        return psutil.disk_usage("/dev/shm").free
    except OSError:  # no /dev/shm (not Linux): no slots
        return 0


def plan_slots(files, batch_size: int, wanted: int) -> tuple[int, int, str]:
    """(count, slot_bytes, why fewer or none) for a loader over `files` that keeps `wanted` batches in flight."""
    if not files or wanted <= 0:
        return 0, 0, "no files or no batches in flight"
    step = max(1, len(files) // SAMPLE_FILES)
    sizes = []
    for f in files[::step][:SAMPLE_FILES]:
        try:
            sizes.append(os.path.getsize(f))
        except OSError:
            continue
    if not sizes:
        return 0, 0, "no file size could be read"
    slot = int(batch_size * float(np.mean(sizes)) * SIZE_MARGIN)
    slot = (slot + 4095) // 4096 * 4096
    ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))  # set by torchrun
    budget = min(MAX_BYTES, int(host_memory_bytes() * MEMORY_SHARE), int(shm_free_bytes() * SHM_SHARE)) // ranks
    count = min(wanted, budget // slot) if slot else 0
    why = "" if count == wanted else f"{count} of {wanted} slots of {slot / 2**20:.0f} MiB fit the memory budget"
    return count, slot, why


class ByteSlots:
    """`count` slots of `slot_bytes` in one shared uint8 buffer. Main process: `take`, `release`, `reset`,
    `view`; a worker: `write`."""

    def __init__(self, count: int, slot_bytes: int) -> None:
        self.count, self.slot_bytes = count, slot_bytes
        self.buffer = torch.empty(count * slot_bytes, dtype=torch.uint8).share_memory_()
        self._free = list(range(count))
        self._lock = threading.Lock()
        self.want_lock, self.locked = PAGE_LOCK, ""

    def __getstate__(self) -> dict:  # to a spawned worker: the buffer (by handle), not the bookkeeping
        return {"count": self.count, "slot_bytes": self.slot_bytes, "buffer": self.buffer}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _free=[], _lock=threading.Lock(), want_lock=False, locked="")

    def page_lock_once(self) -> None:
        """Page-lock the buffer where it lies (`cudaHostRegister`) where PAGE_LOCK asked for it, once, from the
        decoder's first batch: by then the loader's persistent workers exist (mapped from their parent), so
        none is forked from a process holding the range locked. A refusal leaves the slots pageable (slower
        copies, not wrong ones) and is said in `describe`."""
        if not self.want_lock:
            return
        self.want_lock = False
        err = torch.cuda.cudart().cudaHostRegister(self.buffer.data_ptr(), self.buffer.numel(), 0)
        self.locked = "page-locked" if int(err) == 0 else f"page-lock refused ({err})"

    def unlock(self) -> None:
        """Undo `page_lock_once` while the buffer still lives (the decoder's close). A range freed while still
        registered stays in CUDA's table, and a later page-locked allocation placed over it fails (my reading of call
        ZZZY on an H200, where every benchmark variant after a locked one failed with cudaErrorAlreadyMapped)."""
        if self.locked == "page-locked":
            torch.cuda.cudart().cudaHostUnregister(self.buffer.data_ptr())
        self.locked = ""

    # ---- main process ----
    def take(self) -> int | None:
        with self._lock:
            return self._free.pop() if self._free else None

    def release(self, slot: int) -> None:
        with self._lock:
            if slot not in self._free:
                self._free.append(slot)

    def reset(self) -> None:
        """Every slot free: at the start of a pass over the loader (see the module docstring)."""
        with self._lock:
            self._free = list(range(self.count))

    def free_count(self) -> int:
        with self._lock:
            return len(self._free)

    def view(self, slot: int, nbytes: int) -> torch.Tensor:
        start = slot * self.slot_bytes
        return self.buffer[start : start + nbytes]

    def describe(self) -> str:
        locked = f", {self.locked}" if self.locked else ""
        return f"{self.count} shared slots of {self.slot_bytes / 2**20:.0f} MiB, made once{locked}"

    # ---- a worker ----
    def write(self, slot: int, parts: list[np.ndarray]) -> int:
        """The parts one after another into `slot`; their total bytes, or -1 if they do not fit."""
        total = sum(p.nbytes for p in parts)
        if total > self.slot_bytes:
            return -1
        out = self.view(slot, total).numpy()
        if parts:
            np.concatenate(parts, out=out)
        return total


class SlottedBatches:
    """A batch sampler's index lists, each with a free slot (or None): `(indices, slot)`. Every pass
    starts with all slots free (see the module docstring)."""

    def __init__(self, batches, slots: ByteSlots) -> None:
        self.batches, self.slots = batches, slots

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        self.slots.reset()  # runs at the pass's first draw, once the pass before is over
        for indices in self.batches:
            yield indices, self.slots.take()
