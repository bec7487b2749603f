"""Test-only fault injection, so the distributed tests can fail a worker mid-epoch on purpose.

    CNNPAR_FAULT_KILL_AT_EPOCH=E    the last rank sends itself SIGKILL half-way through epoch E
    CNNPAR_FAULT_RAISE_AT_EPOCH=E   the last rank raises RuntimeError there instead

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


@lru_cache(maxsize=1)
def _plan() -> tuple[int, int]:
    return int(os.environ.get(KILL_ENV, "0") or 0), int(os.environ.get(RAISE_ENV, "0") or 0)


def maybe_inject_fault(epoch: int, step: int, steps: int, info: DistInfo) -> None:
    if info.attempt > 0:
        return
    kill_at, raise_at = _plan()
    if epoch not in (kill_at, raise_at) or step != steps // 2 or info.rank != info.world_size - 1:
        return
    if epoch == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError(f"injected fault ({RAISE_ENV}={raise_at}) in epoch {epoch}, step {step}")
