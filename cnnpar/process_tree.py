"""Stopping a launched process together with every process it started, whatever session each runs in.

`os.killpg` on a child started with `start_new_session=True` reaches only that session: torch elastic (torchrun)
starts each worker in a session of its own, so a killed torchrun's workers ran on, reparented to init, measuring
or writing results beside a run reported as stopped. Here the tree is read from the process table (psutil)
before any signal, since a worker whose launcher has died is no longer anyone's descendant, and read again while
it is stopped, since a worker may start processes of its own (DataLoader workers, compile workers) meanwhile.

A child that cnnpar launches ends with its launcher however the launcher ends (`end_with_parent_named_in`, given
the launcher's id in the environment by `parent_env`), and a launcher's temporary folder carries the launcher's
id (`owned_temp_folder`), so that the next launch removes the folder of one killed outright (SIGKILL, the OOM killer),
whose clean-up never ran.

The bottom layer: only the standard library and psutil, so that the launchers above (dist, bench, frameworks)
share this one way of stopping.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

PR_SET_PDEATHSIG = 1  # Linux prctl(2): a signal the kernel sends the caller when its parent ends
GRACE_S = 5.0  # time for torchrun to stop its workers itself after a SIGTERM (they keep no state worth more)
POLL_S = 0.1
STOP_WAIT_S = 1.0  # for a SIGSTOPped process to show stopped before its children are read


def end_with_parent(parent: int, sig: int) -> None:
    """`sig` for this process when its parent, process `parent`, ends however it ends (Linux's PR_SET_PDEATHSIG):
    a launcher killed outright (SIGKILL, the OOM killer) runs no clean-up, and a child in a session of its own ran
    on without it. Called first thing in the child, after exec (a preexec_fn can deadlock a child forked from a
    process with threads). Where the parent ended before the call, `sig` now, as no signal will come. Nothing off
    Linux. The signal comes when the thread that started the child ends: start it from the main thread."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, sig)
    if os.getppid() != parent:  # it died before the prctl took effect: reparented already
        os.kill(os.getpid(), sig)


def parent_env(name: str) -> dict[str, str]:
    """The environment entry `name` that makes a child this process launches end with it
    (`end_with_parent_named_in`)."""
    return {name: str(os.getpid())}


def end_with_parent_named_in(name: str, sig: int) -> None:
    """`end_with_parent` for the parent whose id the environment variable `name` holds (`parent_env`), first thing
    in the child. Popped: what this process starts has another parent. Nothing where the variable is not set (a
    process started by hand)."""
    parent = os.environ.pop(name, "")
    if parent.isdigit():
        end_with_parent(int(parent), sig)


def owned_temp_folder(prefix: str) -> tempfile.TemporaryDirectory:
    """A TemporaryDirectory named `<prefix><this process's id>-...`, made after removing those of `prefix` whose
    process is gone (`remove_dead_folders`): a process killed outright runs no clean-up, and its folder stayed in
    /tmp for good."""
    remove_dead_folders(prefix)
    return tempfile.TemporaryDirectory(prefix=f"{prefix}{os.getpid()}-")


def remove_dead_folders(prefix: str, root: str | None = None) -> None:
    """Remove the folders `<prefix><pid>-...` in `root` (default: the temporary folder) of processes that are gone
    (`owned_temp_folder`). A folder without a process id after `prefix` is left: whose it is cannot be told."""
    for folder in Path(root or tempfile.gettempdir()).glob(f"{glob.escape(prefix)}*-*"):
        pid = folder.name.removeprefix(prefix).split("-")[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except PermissionError:  # alive, another user's
            pass


def stop_process_tree(proc: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    """SIGTERM to the launcher (and its process group), up to `grace_s` for it and everything it started to
    leave, then SIGKILL to whatever of the tree is left; the launcher is reaped on return.

    SIGTERM first because torchrun answers it by stopping its workers in order; the SIGKILL after it covers a
    launcher that dies on SIGTERM without passing it on (a plain Python runner above torchrun) or one stuck.
    The tree is read while it is stopped (SIGSTOP, SIGTERM held, SIGCONT): a worker the launcher started between a
    read of a running tree and the launcher's death would be reparented to init, out of reach, and ran on."""
    tree = _frozen(_processes([proc.pid]))  # now: once the launcher dies its workers go to init
    _signal_group(proc, signal.SIGTERM)  # pending until the SIGCONT below
    for p in tree:
        _send(p, signal.SIGCONT)
    deadline = time.monotonic() + grace_s
    while _living(tree) and time.monotonic() < deadline:
        time.sleep(POLL_S)
        tree = _with_descendants(tree)
    _kill(tree)
    _signal_group(proc, signal.SIGKILL)  # anything of the launcher's session that left the tree (a daemon)
    proc.wait()


def kill_process_tree(proc: subprocess.Popen) -> None:
    """SIGKILL at once to the launcher and every process it started, in any session; the launcher is reaped."""
    _kill(_with_descendants(_processes([proc.pid])))
    _signal_group(proc, signal.SIGKILL)
    proc.wait()


def _kill(tree: set[psutil.Process]) -> None:
    """SIGKILL to all of the tree, read while it is stopped (`_frozen`)."""
    for p in _frozen(tree):
        _send(p, signal.SIGKILL)


def _frozen(tree: set[psutil.Process]) -> set[psutil.Process]:
    """The tree with every process it has started, SIGSTOPped until reading it again finds nothing new (a stopped
    process cannot start another). Each is waited for until it shows stopped (up to STOP_WAIT_S): SIGSTOP takes
    effect when the process next runs, and a fork it is inside of ends first."""
    while True:
        for p in _living(tree):
            _send(p, signal.SIGSTOP)
        _wait_stopped(tree)
        grown = _with_descendants(tree)
        if grown == tree:
            return tree
        tree = grown


def _wait_stopped(tree: set[psutil.Process]) -> None:
    """Until every living process of the tree shows stopped, or STOP_WAIT_S has passed (one in an uninterruptible
    wait, on a disk or a driver, stops only when that wait ends)."""
    deadline = time.monotonic() + STOP_WAIT_S
    while time.monotonic() < deadline:
        running = []
        for p in _living(tree):
            try:
                if p.status() not in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
                    running.append(p)
            except psutil.NoSuchProcess:
                pass
        if not running:
            return
        time.sleep(0.005)


def _processes(pids: list[int]) -> set[psutil.Process]:
    found = set()
    for pid in pids:
        try:
            found.add(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    return found


def _with_descendants(tree: set[psutil.Process]) -> set[psutil.Process]:
    grown = set(tree)
    for p in _living(tree):
        try:
            grown.update(p.children(recursive=True))
        except psutil.NoSuchProcess:
            pass
    return grown


def _living(tree: set[psutil.Process]) -> list[psutil.Process]:
    """The processes still running: a zombie has ended and waits only for its parent to read its status."""
    living = []
    for p in tree:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                living.append(p)
        except psutil.NoSuchProcess:
            pass
    return living


def _send(p: psutil.Process, sig: int) -> None:
    try:
        p.send_signal(sig)  # psutil checks the id still names the same process (no reused pid is signalled)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    """`sig` to the launcher's process group where it leads one of its own (start_new_session), else to it alone.
    Not once it is reaped: its id may name another process by then (until then its id cannot be reused)."""
    if proc.returncode is not None:
        return
    try:
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
    except ProcessLookupError:
        pass
