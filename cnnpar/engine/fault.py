"""Test-only fault injection, so the distributed tests can fail a worker mid-epoch on purpose.

    CNNPAR_FAULT_KILL_AT_EPOCH=E    the last rank sends itself SIGKILL half-way through epoch E
    CNNPAR_FAULT_RAISE_AT_EPOCH=E   the last rank raises RuntimeError there instead
    CNNPAR_FAULT_OOM_AT_EPOCH=E     the last rank raises torch's out-of-memory error there (CUDA's wording)

Both act only in torchrun's first attempt (DistInfo.attempt 0, which every node agrees on), so a job
restarted with --max-restarts runs clean and shows whether it resumed. Unset (the normal case), the hook
costs one integer comparison per step.
"""

from __future__ import annotations

import os
import signal
from functools import lru_cache

from cnnpar.dist import DistInfo

KILL_ENV = "CNNPAR_FAULT_KILL_AT_EPOCH"
RAISE_ENV = "CNNPAR_FAULT_RAISE_AT_EPOCH"
OOM_ENV = "CNNPAR_FAULT_OOM_AT_EPOCH"
# as torch 2.14's caching allocator words it, so that the line cnnpar makes of it is the one a real one gives
OOM_TEXT = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is "
    "free. Of the allocated memory 75.50 GiB is allocated by PyTorch, and 1.20 GiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)


@lru_cache(maxsize=1)
def _plan() -> tuple[int, int]:
    return int(os.environ.get(KILL_ENV, "0") or 0), int(os.environ.get(RAISE_ENV, "0") or 0)


@lru_cache(maxsize=1)
def _oom_at() -> int:
    return int(os.environ.get(OOM_ENV, "0") or 0)


def maybe_inject_fault(epoch: int, step: int, steps: int, info: DistInfo) -> None:
    if info.attempt > 0:
        return
    kill_at, raise_at = _plan()
    oom_at = _oom_at()
    if epoch not in (kill_at, raise_at, oom_at) or step != steps // 2 or info.rank != info.world_size - 1:
        return
    if epoch == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    if epoch == oom_at:
        import torch

        raise torch.cuda.OutOfMemoryError(OOM_TEXT)
    raise RuntimeError(f"injected fault ({RAISE_ENV}={raise_at}) in epoch {epoch}, step {step}")
