"""Stopping a launcher with everything it started: torch elastic starts each worker in a session of its own,
out of reach of a `killpg` of the launcher's group (a timed-out `cnnpar compare --devices 2` or ddp_scaling
launch left the workers running on)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil

from cnnpar.process_tree import kill_process_tree, stop_process_tree


def running_with(marker: str) -> list[psutil.Process]:
    """Live processes whose command line holds `marker` (a killed orphan stays a zombie until init reaps it)."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if p.info["status"] != psutil.STATUS_ZOMBIE and marker in " ".join(p.info["cmdline"] or []):
            found.append(p)
    return found


def gone_soon(marker: str, within_s: float = 3.0) -> bool:
    deadline = time.monotonic() + within_s
    while running_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not running_with(marker)


def launcher_of_a_new_session_child(marker: str) -> str:
    """A launcher whose child runs in a session of its own, as torch elastic starts its workers."""
    return (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', {marker!r}],\n"
        "                 start_new_session=True)\n"
        "print('started', flush=True)\n"
        "time.sleep(120)\n"
    )


def start(cmd: list[str]) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
    proc.stdout.readline()  # its worker is up
    return proc


def test_a_killed_launchers_child_in_a_session_of_its_own_dies_with_it(tmp_path):
    marker = f"process-tree-kill-{tmp_path.name}"
    proc = start([sys.executable, "-c", launcher_of_a_new_session_child(marker)])
    try:
        kill_process_tree(proc)
        assert gone_soon(marker)
    finally:
        for p in running_with(marker):
            p.kill()


def test_a_launcher_that_dies_on_sigterm_has_its_child_in_another_session_killed_after_the_grace(tmp_path):
    marker = f"process-tree-stop-{tmp_path.name}"
    proc = start([sys.executable, "-c", launcher_of_a_new_session_child(marker)])
    try:
        t0 = time.monotonic()
        stop_process_tree(proc, grace_s=1.0)
        assert time.monotonic() - t0 < 10
        assert proc.returncode is not None
        assert gone_soon(marker)
    finally:
        for p in running_with(marker):
            p.kill()


def test_a_worker_started_between_the_trees_read_and_the_sigterm_is_stopped_too(tmp_path, monkeypatch):
    """The tree was read while the launcher ran: a worker it started after the read, just before SIGTERM ended it,
    was reparented to init, out of the tree, and ran on (seen once as a flake of a ddp_scaling launch's timeout under
    load). Here the launcher starts its worker on SIGUSR1, sent between the read and the SIGTERM; the tree is now read
    while the launcher is stopped, so no worker can start unseen."""
    import signal

    from cnnpar import process_tree

    marker = f"process-tree-late-{tmp_path.name}"  # in two pieces in the launcher's code: the worker's alone
    launcher = (
        "import signal, subprocess, sys, time\n"
        "def start_worker(*_):\n"
        f"    name = {marker[:8]!r} + {marker[8:]!r}\n"
        "    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', name], start_new_session=True)\n"
        "signal.signal(signal.SIGUSR1, start_worker)\n"
        "print('up', flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = start([sys.executable, "-c", launcher])
    real = process_tree._signal_group

    def worker_started_first(launched, sig):
        if sig == signal.SIGTERM:
            launched.send_signal(signal.SIGUSR1)
            deadline = time.monotonic() + 2.0  # a launcher running starts it at once; a stopped one cannot
            while not running_with(marker) and time.monotonic() < deadline:
                time.sleep(0.02)
        real(launched, sig)

    monkeypatch.setattr(process_tree, "_signal_group", worker_started_first)
    try:
        stop_process_tree(proc, grace_s=1.0)
        assert proc.returncode is not None
        assert gone_soon(marker), "a worker started just before the SIGTERM outlived the stop"
    finally:
        for p in running_with(marker):
            p.kill()


def test_torchruns_worker_is_stopped_with_torchrun(tmp_path):
    """The real case: `torch.distributed.run` (about 3 s to start a worker on 2 cores)."""
    marker = f"process-tree-torchrun-{tmp_path.name}"
    script = tmp_path / f"{marker}.py"
    script.write_text("import time\nprint('worker up', flush=True)\ntime.sleep(120)\n")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", str(script)]
    proc = start(cmd)
    try:
        assert running_with(marker), "the worker should be running before the stop"
        stop_process_tree(proc, grace_s=5.0)
        assert gone_soon(marker)
    finally:
        for p in running_with(marker):
            p.kill()


def test_a_temporary_folder_of_a_process_gone_is_removed_when_the_next_is_made(tmp_path, monkeypatch):
    """A process killed outright (SIGKILL, the OOM killer) runs no clean-up: its TemporaryDirectory stayed in /tmp
    for good. Those of live processes, of another prefix, or without a process id are left."""
    import os

    from cnnpar.process_tree import owned_temp_folder
    from tests.conftest import dead_process_folder

    dead = dead_process_folder(tmp_path, monkeypatch, "cnnpar-x-")
    gone_pid = dead.name.split("-")[2]
    kept = [
        tmp_path / f"cnnpar-x-{os.getpid()}-def",  # alive
        tmp_path / f"cnnpar-y-{gone_pid}-abc",  # another launcher's prefix
        tmp_path / "cnnpar-x-abc",  # no process id: whose it is cannot be told
    ]
    (dead / "note").write_text("x")
    for folder in kept:
        folder.mkdir()
        (folder / "note").write_text("x")
    with owned_temp_folder("cnnpar-x-") as made:
        assert Path(made).name.startswith(f"cnnpar-x-{os.getpid()}-")
        assert not dead.exists() and all(folder.exists() for folder in kept)
    assert not Path(made).exists()
