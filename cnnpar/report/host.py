"""Facts about the host that need no torch import (the framework runners must not import torch)."""

from __future__ import annotations

import os
from pathlib import Path


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, as taskset or a container sets it)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo ('' where it cannot be read); platform.processor()
    is often just the architecture on Linux."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""
