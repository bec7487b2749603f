"""Where multiprocessing puts its Unix sockets: a folder short enough to hold one.

A DataLoader worker hands each batch's tensors to the main process as file descriptors (torch's file_descriptor
sharing strategy), through a multiprocessing listener whose socket is
`<temporary folder>/pymp-XXXXXXXX/listener-XXXXXXXX`. Linux keeps a socket's path in 108 bytes (sockaddr_un's
sun_path, the closing NUL included), so under a TMPDIR of more than 75 characters the worker's bind failed ("AF_UNIX
path too long") in its queue's feeder thread, the batch was never sent, and training waited for it for good.
CPython 3.14 falls back to /tmp itself (python/cpython#132124); this does the same before it. Only the sockets'
folder moves: torch.compile's cache and cnnpar's own folders stay where TMPDIR says.

The bottom layer: only the standard library and cnnpar.errors.
"""

from __future__ import annotations

import os
import sys
import tempfile

from cnnpar.errors import UserError

SUN_PATH_MAX = 108 if sys.platform.startswith("linux") else 104  # the BSDs' and macOS's sockaddr_un is shorter
# multiprocessing.util.get_temp_dir's folder, then connection.arbitrary_address's name in it (8 random characters
# each, tempfile's fixed length)
SOCKET_TAIL = len("/pymp-XXXXXXXX/listener-XXXXXXXX")
LONGEST_TEMP_FOLDER = SUN_PATH_MAX - 1 - SOCKET_TAIL  # 75 on Linux
SHORT_ROOTS = ("/tmp", "/var/tmp", "/dev/shm")  # CPython 3.14's fallbacks, /dev/shm for a container without them


def path_bytes(folder: str) -> int:
    """A path's length as the kernel counts it: bytes, not characters (é is two in UTF-8)."""
    return len(os.fsencode(folder))


def holds_sockets(folder: str) -> bool:
    """Whether multiprocessing's socket paths under `folder` fit in a Unix socket address."""
    return path_bytes(folder) + SOCKET_TAIL <= SUN_PATH_MAX - 1


def too_long_text(folder: str) -> str:
    size = path_bytes(folder)
    length = f"{size} characters" if size == len(folder) else f"{size} bytes ({len(folder)} characters)"
    return (
        f"the temporary folder (TMPDIR) {folder} is {length}, too long for the DataLoader workers' "
        f"sockets under it (at most {LONGEST_TEMP_FOLDER} bytes: a Unix socket path holds {SUN_PATH_MAX - 1})"
    )


def init_socket_folder() -> str | None:
    """Make this process's multiprocessing socket folder (`multiprocessing.util.get_temp_dir`: made once per process,
    inherited by forked children) under a short root where the temporary folder is too long to hold a socket. The
    folder moved to, or None where the temporary folder holds sockets. Call it before anything starts a worker.

    Raises UserError where no short root can be written, or where this process made its folder under the long root
    before this call (a forked child inherits its parent's): no worker could hand a batch on."""
    chosen = tempfile.gettempdir()
    if os.name == "nt" or holds_sockets(chosen):  # Windows' multiprocessing uses named pipes
        return None
    from multiprocessing import util

    root = next((r for r in SHORT_ROOTS if os.path.isdir(r) and os.access(r, os.W_OK | os.X_OK)), None)
    if root is None:
        raise UserError(
            f"{too_long_text(chosen)}, and none of {', '.join(SHORT_ROOTS)} can be written to hold them: set TMPDIR "
            f"to a folder of at most {LONGEST_TEMP_FOLDER} bytes"
        )
    saved = tempfile.tempdir
    tempfile.tempdir = root  # get_temp_dir makes its folder with mkdtemp's default root
    try:
        folder = util.get_temp_dir()
    finally:
        tempfile.tempdir = saved
    if not holds_sockets(os.path.dirname(folder)):
        raise UserError(f"{too_long_text(chosen)}: set TMPDIR to a folder of at most {LONGEST_TEMP_FOLDER} bytes")
    return folder
