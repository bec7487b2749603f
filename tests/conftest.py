"""Shared test helpers: run the CLI in a subprocess against *this* checkout's package."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _no_device_queue_setting(monkeypatch):
    """Every `cli.main` sets CUDA_DEVICE_MAX_CONNECTIONS in this process's environment (dist.widen_device_queues),
    and graphs beside a GPU decoder depend on it: each test starts without it, as a fresh shell does."""
    for name in ("CUDA_DEVICE_MAX_CONNECTIONS", "CNNPAR_SET_DEVICE_QUEUES"):
        monkeypatch.setenv(name, "x")  # recorded, so that the test's own value is undone after it too
        monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def _stop_handlers_put_back():
    """The stop handlers, unraisable hook and pending stop as each test found them: a test that installs cnnpar's
    handlers in this process and leaves them (errors.stop_on_signals, a framework runner's main called in-process)
    handed them to the next test in the same xdist worker, whose own Ctrl-C then counted as a pending stop, and a
    train later in that worker stopped at its first step."""
    from cnnpar import errors

    handlers, hook = {s: signal.getsignal(s) for s in errors.STOP_SIGNALS}, sys.unraisablehook
    yield
    for s, handler in handlers.items():
        if handler is not None:  # None: a handler not set from Python, which cannot be put back
            signal.signal(s, handler)
    sys.unraisablehook = hook
    errors.forget_stop()


@pytest.fixture
def stops_reach_children():
    """Processes the test starts begin with SIGTERM, SIGHUP and SIGINT at their defaults, as a terminal's own processes
    do, and this process's own Ctrl-C is Python's KeyboardInterrupt. A suite run under nohup ignores SIGHUP, and one
    started in the background by a script (`(pytest ... &)` with no job control) ignores SIGINT; an ignored signal
    stays ignored across exec, so the tests of a closing terminal's SIGHUP skipped there, and a Ctrl-C test's launcher
    trained on through its SIGINT. A handler set here is reset to the default in every child that execs. SIGTERM's
    and SIGHUP's keep this process as deaf to a stray signal as the ignored one did; SIGINT gets Python's own, which
    an interactive start gives it: cnnpar's commands called in this process put their Ctrl-C handler only in its place
    (errors.stop_on_signals), and no Ctrl-C reaches a suite run in the background but a test's own."""
    ignored = [
        s
        for s in (signal.SIGTERM, getattr(signal, "SIGHUP", None), signal.SIGINT)
        if s and signal.getsignal(s) is signal.SIG_IGN
    ]
    for s in ignored:
        signal.signal(s, signal.default_int_handler if s == signal.SIGINT else lambda signum, frame: None)
    yield
    for s in ignored:
        signal.signal(s, signal.SIG_IGN)


def cli_env(**extra: str) -> dict[str, str]:
    """Environment for subprocesses: this checkout first on PYTHONPATH, small thread counts."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "TORCHELASTIC", "CNNPAR_"))
    }
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def run_cmd(cmd: list[str], cwd: Path, timeout: float = 180, **env: str) -> subprocess.CompletedProcess:
    """Any command (torchrun, horovodrun, a script) with the test environment; never raises on exit code."""
    return subprocess.run(cmd, cwd=cwd, env=cli_env(**env), capture_output=True, text=True, timeout=timeout)


def run_cli(args: list[str], cwd: Path, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    """`python -m cnnpar ARGS` in `cwd`; returns the completed process (never raises on exit code)."""
    return run_cmd([sys.executable, "-m", "cnnpar", *args], cwd, timeout, **env)


def main_in(cwd: Path, monkeypatch, capture, args) -> subprocess.CompletedProcess:
    """`cnnpar ARGS` run by `cli.main` in this process from the folder `cwd` (left there until the test ends, as a
    shell's `cd`), for a test that needs no process of its own (no signal, kill, limit or start-up environment; a
    subprocess paid ~3-4 s of imports): its exit code and what it printed, as a finished subprocess gives them. Pass
    pytest's `capfd` as `capture` where DataLoader workers write: a forked worker's writes reach the file
    descriptors, never this process's `sys.stderr` that `capsys` reads."""
    from cnnpar.cli import main

    monkeypatch.chdir(cwd)
    capture.readouterr()  # only this call's output
    code = main(list(args))
    out, err = capture.readouterr()
    return subprocess.CompletedProcess(list(args), code, out, err)


def torchrun_cmd(nproc: int = 2, *extra: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", *extra]


@pytest.fixture
def cli(tmp_path):
    """run_cli bound to a fresh temporary working folder."""

    def _run(*args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
        return run_cli(list(args), tmp_path, timeout=timeout, **env)

    _run.cwd = tmp_path
    return _run


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module's in-process training, as the CLI subprocesses get
    (OMP_NUM_THREADS=1 above): on a shared 2-core machine two OpenMP threads spin against other
    work and make tiny steps 10-20x slower. Modules take it with
    `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def dead_process_folder(tmp_path: Path, monkeypatch, prefix: str) -> Path:
    """A folder named as `process_tree.owned_temp_folder` names them, `<prefix><pid>-abc`, of a process that has
    ended, in a TMPDIR of the test's own (tempfile made to read TMPDIR again): what a launcher killed outright left."""
    import tempfile

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    folder = tmp_path / f"{prefix}{gone.pid}-abc"
    folder.mkdir()
    return folder
