"""Facts about the host that every layer may need, from the standard library (and errors.chain) alone.

The bottom layer, so that dist counts its CPU ranks against the same cores as the loaders and prepare's decoders
above it (report.host, which holds the lines they print about them, lies a layer above dist).
"""

from __future__ import annotations

import errno
import os

from cnnpar.errors import chain


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, as taskset or a container sets it): what the processes
    a command starts are counted against (dist's CPU ranks, train's DataLoader workers, prepare's decoders)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# The open-files limit the loaders need: a DataLoader worker hands each batch's tensors over as file descriptors
# (torch's file_descriptor sharing strategy), held open in the worker until the main process takes them, and each
# worker holds pipes in the main process. Two workers ran out under a limit of 32, eight with --prefetch-factor 8
# under 64; Linux's usual soft limit is 1024 under a hard one of 2**19 or more.
OPEN_FILES_WANTED = 65536


def raise_open_files_limit(wanted: int = OPEN_FILES_WANTED) -> None:
    """Raise this process's soft limit on open files (ulimit -n) towards `wanted`, as far as the hard limit allows;
    children (DataLoader workers, torchrun's ranks) inherit it. Kept for the process: a higher soft limit changes
    nothing else, and a low one ended a run in "Too many open files" tracebacks from torch's workers."""
    try:
        import resource
    except ImportError:  # Windows
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):  # macOS refuses more than OPEN_MAX under an unlimited hard limit: keep its own
            pass


def too_many_open_files(e: BaseException) -> bool:
    """Whether `e`, or an error behind it, is the open-files limit running out (EMFILE), as OSError or as torch's
    DataLoader says it ("Too many open files. Communication with the workers is no longer possible")."""
    return any(
        (isinstance(x, OSError) and x.errno == errno.EMFILE) or "Too many open files" in str(x) for x in chain(e)
    )


def higher_limit() -> str:
    """The open-files limit to ask for, as every line that says the limit ran out ends: train's, prepare's, a
    decoder's."""
    return (
        f"a higher limit (ulimit -n {OPEN_FILES_WANTED} in the shell that starts cnnpar, or docker run --ulimit "
        f"nofile={OPEN_FILES_WANTED})"
    )


def open_files_line() -> str:
    """The one line for a command that ran out of open files."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        hard_text = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
        limit = (
            f"this process may have {soft} files open at once (ulimit -n; its hard limit, ulimit -Hn, is {hard_text})"
        )
    except ImportError:
        limit = "the open-files limit is reached"
    return (
        f"too many open files: {limit}, and DataLoader workers hand each batch over as open files: expected "
        f"{higher_limit()}, or fewer --workers or a smaller --prefetch-factor"
    )
