"""Facts about the host that every layer may need, from the standard library alone.

The bottom layer, so that dist counts its CPU ranks against the same cores as the loaders and prepare's decoders
above it (report.host, which holds the lines they print about them, lies a layer above dist).
"""

from __future__ import annotations

import os


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, as taskset or a container sets it): what the processes
    a command starts are counted against (dist's CPU ranks, train's DataLoader workers, prepare's decoders)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
