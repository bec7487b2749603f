"""A TMPDIR too long for a Unix socket path under it (socket_folder): DataLoader workers hand their batches on all
the same, or the run stops with one line before training; never a hang."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from cnnpar import socket_folder
from cnnpar.bench.trial import run_child
from cnnpar.errors import UserError
from tests.conftest import cli_env

TIMEOUT_S = 120  # a few seconds' work: a run past it waits for a batch that never comes


@pytest.fixture
def short(tmp_path: Path):
    """A folder of a few characters under /tmp for the long ones below: pytest's own tmp_path runs to 70-80
    characters under xdist (pytest-of-root/pytest-N/popen-gwK/<test name>), longer than some of them."""
    if not os.path.isdir("/tmp"):
        pytest.skip("no /tmp for a short folder")
    folder = Path(tempfile.mkdtemp(prefix="sf", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def long_folder(base: Path, length: int) -> Path:
    """A new folder under `base` whose path is `length` characters long."""
    assert length > len(str(base)) + 1, (base, length)
    folder = base / ("d" * (length - len(str(base)) - 1))
    folder.mkdir()
    assert len(str(folder)) == length
    return folder


def run_or_fail_on_hang(cmd: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """`cmd` in a session of its own, killed with its workers (and the test failed) where it runs past TIMEOUT_S."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=cli_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        pytest.fail(f"hung for {TIMEOUT_S} s; its last output: {(out + err)[-2000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def test_train_with_workers_under_a_long_tmpdir_finishes_and_says_where_the_sockets_go(tmp_path, short):
    temp = long_folder(short, 100)
    done = run_or_fail_on_hang(
        [sys.executable, "-m", "cnnpar", "train", "--workers", "1", "--epochs", "1", "--no-progress",
         "--out-dir", str(tmp_path / "runs")],
        tmp_path, TMPDIR=str(temp),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "AF_UNIX" not in done.stderr
    said = [line for line in done.stdout.splitlines() if "too long for the DataLoader workers' sockets" in line]
    assert len(said) == 1 and f"(TMPDIR) {temp} is 100 characters" in said[0] and "at most 75" in said[0]
    assert "done: best val acc" in done.stdout


def test_a_worker_whose_parent_made_no_socket_folder_makes_a_short_one_itself(tmp_path, short):
    """The path other commands and spawned workers take: no cli.main before the DataLoader."""
    script = textwrap.dedent(
        """
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        from cnnpar.data.loader import init_loader_worker

        data = TensorDataset(torch.arange(64.0).reshape(16, 4))
        loader = DataLoader(data, batch_size=4, num_workers=1, worker_init_fn=init_loader_worker, timeout=60)
        print("batches", sum(1 for _ in loader))
        """
    )
    done = run_or_fail_on_hang([sys.executable, "-c", script], tmp_path, TMPDIR=str(long_folder(short, 100)))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "batches 4" in done.stdout


def test_no_short_root_to_write_stops_with_one_line_naming_tmpdir_its_length_and_the_limit(
    tmp_path, short, monkeypatch
):
    temp = long_folder(short, 90)
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.setattr(socket_folder, "SHORT_ROOTS", (str(tmp_path / "absent"),))
    with pytest.raises(UserError) as e:
        socket_folder.init_socket_folder()
    text = str(e.value)
    assert "\n" not in text
    assert f"(TMPDIR) {temp} is 90 characters" in text
    assert "set TMPDIR to a folder of at most 75 bytes" in text


def test_a_tmpdir_that_holds_sockets_is_left_alone(short, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(long_folder(short, 75)))
    assert socket_folder.init_socket_folder() is None


def test_a_trial_child_under_a_tmpdir_its_trial_folder_pushes_past_the_limit_gets_its_batches(
    tmp_path, short, monkeypatch
):
    """The trial's folder (cnnpar-trial-<pid>-XXXXXXXX/tmp), the child's TMPDIR, adds some 34 characters to a TMPDIR
    that trains: its DataLoader workers' sockets go in a short root all the same, each worker's init making it
    (bench/trial.main's own call, which makes one folder for all the child's workers, is not what this runs)."""
    temp = long_folder(short, 70)
    assert socket_folder.holds_sockets(str(temp))
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    monkeypatch.setenv("PYTHONPATH", cli_env()["PYTHONPATH"])  # the child imports this checkout's cnnpar
    said = tmp_path / "said.txt"
    script = textwrap.dedent(
        f"""
        import os, torch
        from torch.utils.data import DataLoader, TensorDataset
        from cnnpar.data.loader import init_loader_worker

        data = TensorDataset(torch.arange(64.0).reshape(16, 4))
        loader = DataLoader(data, batch_size=4, num_workers=1, worker_init_fn=init_loader_worker, timeout=60)
        open({str(said)!r}, "w").write(f"{{len(os.environ['TMPDIR'])}} {{sum(1 for _ in loader)}}")
        """
    )
    run_child({}, TIMEOUT_S, log=lambda s: None, command=lambda spec, res: [sys.executable, "-c", script])
    length, batches = said.read_text().split()
    assert not socket_folder.holds_sockets("x" * int(length))  # the child's TMPDIR: too long for a socket
    assert batches == "4"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's sun_path")
def test_the_longest_temp_folder_is_the_longest_under_which_a_listener_binds(tmp_path, short):
    script = textwrap.dedent(
        """
        from multiprocessing.connection import Listener
        try:
            Listener(family="AF_UNIX").close()
            print("bound")
        except OSError as e:
            print(e)
        """
    )
    longest = socket_folder.LONGEST_TEMP_FOLDER
    for length, said in ((longest, "bound"), (longest + 1, "AF_UNIX path too long")):
        folder = short / str(length)
        folder.mkdir()
        done = run_or_fail_on_hang([sys.executable, "-c", script], tmp_path, TMPDIR=str(long_folder(folder, length)))
        assert done.stdout.strip() == said, (length, done.stdout, done.stderr)


def test_a_tmpdir_is_measured_in_bytes_as_the_kernel_measures_a_socket_path(short, monkeypatch):
    """A review's 48 characters, 30 of them é: 78 bytes in UTF-8, too long for a socket under it; counted in
    characters it passed, and the workers hung as under any TMPDIR too long."""
    temp = short / ("é" * 35)
    temp.mkdir()
    assert len(str(temp)) < socket_folder.LONGEST_TEMP_FOLDER < len(os.fsencode(str(temp)))
    assert not socket_folder.holds_sockets(str(temp))
    assert f"is {len(os.fsencode(str(temp)))} bytes ({len(str(temp))} characters)" in socket_folder.too_long_text(
        str(temp)
    )
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    folder = socket_folder.init_socket_folder()
    assert folder is not None and socket_folder.holds_sockets(os.path.dirname(folder))
