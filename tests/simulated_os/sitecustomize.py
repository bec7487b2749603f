"""Another operating system's Python, as far as cnnpar can tell, on this Linux machine (test_platforms.py).

Put this folder first on PYTHONPATH and set CNNPAR_SIMULATED_OS to `windows` or `macos`: every Python process that
starts then (the command, its spawned workers) imports this first. What it takes away is what cnnpar's own code
could reach on those systems and Linux has: POSIX-only modules, functions and signals, and the /proc, /sys and
/dev/shm folders; on Windows, too, no folder opens as a file, fsync needs a file opened for writing, and a file this
process holds open cannot be renamed, replaced or deleted. Multiprocessing spawns (macOS's default since Python 3.8,
Windows' only way). Torch and psutil keep their Linux code: what differs inside them there is not simulated.
"""

import builtins
import fcntl  # this module's own, taken before the simulated Windows has none
import io
import multiprocessing
import os
import signal
import sys

SIMULATED = os.environ.get("CNNPAR_SIMULATED_OS", "")
GONE_FOLDERS = ("/proc", "/sys", "/dev/shm")  # neither system has them (macOS has shm_open, but no folder of its files)

WINDOWS_GONE_MODULES = ("fcntl", "resource", "termios", "pty", "tty")
WINDOWS_GONE_OS = (
    "O_DIRECTORY",
    "fork",
    "sched_getaffinity",
    "get_blocking",
    "set_blocking",
    "getuid",
    "geteuid",
    "killpg",
    "getpgid",
    "getloadavg",
    "setsid",
)  # get_blocking/set_blocking: Windows' Python 3.11 has neither
WINDOWS_GONE_SIGNALS = ("SIGHUP", "SIGPIPE", "SIGKILL", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGQUIT")


def _in_psutil() -> bool:
    """psutil called: its Linux backend reads /proc, where those systems' backends ask the system itself."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_globals.get("__name__", "").startswith("psutil"):
            return True
        frame = frame.f_back
    return False


def _without_gone_folders(func):
    def checked(path, *args, **kwargs):
        try:
            name = os.fsdecode(path) if not isinstance(path, int) else ""
        except TypeError:
            name = ""
        if any(name == f or name.startswith(f + "/") for f in GONE_FOLDERS) and not _in_psutil():
            raise FileNotFoundError(2, "No such file or directory", name)
        return func(path, *args, **kwargs)

    return checked


def _no_folders_opened(func):
    """Windows' os.open refuses a folder (EACCES): only files open as file descriptors there."""

    def opened(path, flags, *args, **kwargs):
        if kwargs.get("dir_fd") is None and os.path.isdir(path):
            raise PermissionError(13, "Permission denied", os.fsdecode(path))
        return func(path, flags, *args, **kwargs)

    return opened


def _no_read_only_fsync(func):
    """Windows' fsync (FlushFileBuffers) needs a file opened for writing: EBADF on one opened read-only."""

    def synced(fd):
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
            raise OSError(9, "Bad file descriptor")
        return func(fd)

    return synced


_listdir, _readlink = os.listdir, os.readlink  # the simulation's own, which still see /proc


def _open_here(*paths) -> str:
    """The first of `paths` that this process holds open (a descriptor, a memory map's), or ''."""
    held = set()
    for fd in _listdir("/proc/self/fd"):
        try:
            held.add(_readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return next((p for p in paths if os.path.realpath(p) in held), "")


def _not_while_open(func):
    """Windows renames, replaces and deletes no file a process holds open (PermissionError, sharing violation);
    checked for this process's own descriptors."""

    def changed(*paths, **kwargs):
        opened = _open_here(*(p for p in paths if isinstance(p, (str, bytes, os.PathLike))))
        if opened:
            raise PermissionError(13, "The process cannot access the file: it is being used", os.fsdecode(opened))
        return func(*paths, **kwargs)

    return changed


def _simulate(which: str) -> None:
    if which == "windows":
        import psutil  # noqa: F401  its Linux backend needs fcntl and resource; Windows' has a backend of its own

        os.environ.setdefault("USERNAME", "simulated")  # Windows sets it; getpass.getuser reads it before pwd
        for name in WINDOWS_GONE_MODULES:
            sys.modules[name] = None  # `import fcntl` raises ImportError, as it does there
        for name in WINDOWS_GONE_OS:
            if hasattr(os, name):
                delattr(os, name)
        for name in WINDOWS_GONE_SIGNALS:
            if hasattr(signal, name):
                delattr(signal, name)
        os.open = _no_folders_opened(os.open)
        import shutil

        shutil._use_fd_functions = False  # rmtree by names, as on Windows: its fd-based walk opens folders
        os.fsync = _no_read_only_fsync(os.fsync)
        for name in ("replace", "rename", "unlink", "remove"):
            setattr(os, name, _not_while_open(getattr(os, name)))
    elif which == "macos":
        del os.sched_getaffinity
    else:
        raise SystemExit(f"CNNPAR_SIMULATED_OS={which}: expected windows or macos")
    for module, name in (
        (builtins, "open"),
        (io, "open"),
        (os, "open"),
        (os, "stat"),
        (os, "lstat"),
        (os, "listdir"),
        (os, "scandir"),
        (os, "statvfs"),
    ):
        if hasattr(module, name):
            setattr(module, name, _without_gone_folders(getattr(module, name)))
    multiprocessing.set_start_method("spawn", force=True)
    spawn = multiprocessing.get_context("spawn")
    # cnnpar asks for "fork" only where sys.platform says Linux, which it still says here: the system's default
    # (spawn) is what it takes on those systems
    multiprocessing.get_context = lambda method=None: spawn if method in (None, "fork") else _get_context(method)


_get_context = multiprocessing.get_context


if SIMULATED:
    _simulate(SIMULATED)
