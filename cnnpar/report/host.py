"""Facts about the host that need no torch import (the framework runners must not import torch)."""

from __future__ import annotations

from pathlib import Path

from cnnpar.host_facts import quota_note

# Worker processes per usable core a command starts at most (train's DataLoader workers, prepare's decoders): more
# only wait for the cores, and each fork is slower than the last (multiprocessing polls every child at each start):
# --workers 2000 on 2 cores was still forking after a minute, 18 GB taken, a SIGTERM coming to nothing. Decoding
# that waits on slow storage may use more workers than cores, hence 4.
WORKERS_PER_CORE = 4


def worker_cap_line(asked: int, limit: int, cores: int, share: str = "") -> str:
    """The line a command prints where it starts `limit` workers for --workers `asked` ("" where none are cut)."""
    if asked <= limit:
        return ""
    count = f"{cores} core{'s' * (cores != 1)}{share}"
    if note := quota_note(cores):
        count = f"{count}; {note}"
    return (
        f"--workers {asked} capped to {limit}: {WORKERS_PER_CORE} per usable core ({count}); more only wait for the "
        "cores, and take minutes to start"
    )


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
