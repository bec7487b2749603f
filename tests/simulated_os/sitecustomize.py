"""Another operating system's Python, as far as cnnpar can tell, on this Linux machine (tests/unit/test_platforms.py).

Put this folder first on PYTHONPATH and set CNNPAR_SIMULATED_OS to `windows` or `macos`: every Python process that
starts then (the command, its spawned DataLoader workers) imports this first. What it takes away is what cnnpar's
own code could reach on those systems and Linux has: POSIX-only modules, functions and signals, and the /proc and
/dev/shm folders. Multiprocessing starts by spawning there (macOS's default since Python 3.8, Windows' only way).
Torch itself keeps its Linux build: what differs inside torch on those systems is not simulated.
"""

import builtins
import io
import multiprocessing
import os
import signal
import sys

SIMULATED = os.environ.get("CNNPAR_SIMULATED_OS", "")
GONE_FOLDERS = ("/proc", "/sys", "/dev/shm")  # neither system has them (macOS has shm_open, but no folder of its files)

WINDOWS_GONE_MODULES = ("fcntl", "resource", "termios", "pty", "tty")
WINDOWS_GONE_OS = (
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
