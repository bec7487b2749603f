"""`cnnpar prepare` when things go wrong around it: a decoding worker killed, prepare itself stopped or killed,
a write that fails, two runs to one --out, photos past Pillow's decompression-bomb limit. Every way out is one
line, leaves no partial file and no worker behind, and never hangs (each subprocess has a timeout)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cnnpar.data.store import StoreFile, left_partials, verify_store
from cnnpar.data.store_write import prepare_store
from tests.conftest import cli_env
from tests.datafiles import write_image_folder

pytestmark = pytest.mark.usefixtures("one_thread")  # one intra-op thread for the in-process runs (conftest)

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; PR_SET_PDEATHSIG")

# prepare through the CLI with its workers held busy in their first file: each says who it is (its pid and its
# SIGTERM, SIGINT and SIGHUP handlers) in a file of the folder argv[3], then sleeps, as on a huge photo
BUSY_WORKERS = (
    "import os, signal, sys, time\n"
    "from pathlib import Path\n"
    "from cnnpar.cli import main\n"
    "from cnnpar.data import store_write as w\n"
    "prepare = os.getpid()\n"
    "def busy(path, sides):\n"
    "    if os.getpid() != prepare:\n"
    "        said = repr(tuple(signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)))\n"
    "        own = Path(sys.argv[3], f'said-{os.getpid()}')\n"  # one temporary name each: a shared one raced
    "        own.write_text(said)\n"
    "        own.rename(Path(sys.argv[3], str(os.getpid())))\n"
    "        time.sleep(120)\n"
    "w.decode_for_store = busy\n"
    "sys.exit(main(['prepare', sys.argv[1], '--out', sys.argv[2], '--workers', '2', '--no-progress']))\n"
)


def start(args: list[str], cwd: Path) -> subprocess.Popen:
    """A subprocess in a session of its own, so that `end_all` also reaches the workers it forked: a worker
    that outlives it holds its stderr pipe open, and reading that pipe would wait for ever."""
    return subprocess.Popen(args, cwd=cwd, env=cli_env(), stderr=subprocess.PIPE, text=True, start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float) -> str:
    """Its stderr once it ends; a process that runs past `timeout` is ended, with its workers, and fails the test."""
    try:
        return proc.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        end_all(proc)
        pytest.fail(f"still running after {timeout} s")


def end_all(proc: subprocess.Popen) -> None:
    """What a test started is gone whatever it found (a regression must not leave workers behind, or hang)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # the session is empty: prepare and its workers have all ended
    proc.wait()


def alive(pid: int) -> bool:
    """A process that still runs (a zombie waiting for a parent to reap it has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def start_busy_prepare(tmp_path: Path) -> tuple[subprocess.Popen, Path, dict[int, str]]:
    """prepare of 16 small photos with 2 workers, both busy: (the process, its --out, {worker pid: handlers})."""
    write_image_folder(tmp_path / "p", per_class=8, classes=2, side=64)
    (tmp_path / "workers").mkdir()
    out = tmp_path / "p.cnnpar"
    args = [sys.executable, "-c", BUSY_WORKERS, str(tmp_path / "p"), str(out), str(tmp_path / "workers")]
    proc = start(args, tmp_path)
    deadline = time.monotonic() + 60
    while len(workers := [p for p in (tmp_path / "workers").iterdir() if p.name.isdigit()]) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, "the workers never started"
        time.sleep(0.05)
    return proc, out, {int(p.name): p.read_text() for p in workers}


def assert_nothing_left(out: Path) -> None:
    assert sorted(p.name for p in out.parent.iterdir() if p.name.startswith(out.name)) == []


@linux_only
def test_a_worker_killed_while_handing_over_its_pixels_is_one_line_not_a_hang(tmp_path):
    """The OOM killer ended a worker while it sent its chunk's pixels through the pool's pipe: the pool's reader
    waited for the rest of the message for ever, at 0 % CPU, and SIGTERM could not stop prepare. Here the worker
    is killed in its first send of a result, after what the kernel may already have passed on: a pipe write
    is whole only up to PIPE_BUF bytes."""
    write_image_folder(tmp_path / "p", per_class=8, classes=2, side=64)
    out = tmp_path / "p.cnnpar"
    script = (
        "import os, select, signal, struct, sys\n"
        "from multiprocessing.connection import Connection\n"
        "from cnnpar.cli import main\n"
        "prepare = os.getpid()\n"
        "def killed_while_sending(self, buf):\n"
        "    if os.getpid() != prepare:\n"
        "        message = struct.pack('!i', len(buf)) + bytes(buf)\n"
        "        if len(message) > select.PIPE_BUF:\n"
        "            os.write(self.fileno(), message[: len(message) // 2])\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    real(self, buf)\n"
        "real, Connection._send_bytes = Connection._send_bytes, killed_while_sending\n"
        "sys.exit(main(['prepare', sys.argv[1], '--out', sys.argv[2], '--workers', '2', '--no-progress']))\n"
    )
    proc = start([sys.executable, "-c", script, str(tmp_path / "p"), str(out)], tmp_path)
    err = finish(proc, timeout=60)
    assert proc.returncode == 2, err
    assert err.strip() == (
        f"cnnpar: error: {out}: not written: a decoding worker was killed by SIGKILL before it finished (the "
        "system's out-of-memory killer does this): expected every worker to finish; run again, with fewer "
        "--workers if memory is short"
    )
    assert_nothing_left(out)


@linux_only
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_a_stop_ends_prepare_at_once_while_its_workers_are_busy(tmp_path, sig, stops_reach_children):
    """The clean-up waited for the workers to finish their chunks (for ever when the pool was stuck). A closing
    terminal sends SIGHUP to prepare's whole group: it ended prepare at once, as a SIGKILL would, no line said."""
    proc, out, workers = start_busy_prepare(tmp_path)
    try:
        if sig == "SIGHUP":
            os.killpg(proc.pid, signal.SIGHUP)  # the terminal's foreground group: prepare and its workers
        else:
            proc.send_signal(signal.SIGTERM)
        err = finish(proc, timeout=30)
        assert proc.returncode == 128 + getattr(signal, sig) and err.strip() == f"cnnpar: stopped ({sig})", err
        assert not any(alive(pid) for pid in workers)
        assert_nothing_left(out)
    finally:
        end_all(proc)


@linux_only
def test_a_group_sigterm_whose_raise_prepare_dropped_still_stops_it_not_a_killed_worker(tmp_path):
    """`timeout` signals prepare's whole group: its workers die of it (SIG_DFL), and where prepare's own raise landed
    in a finaliser and was dropped, the broken pool read as "a decoding worker was killed by SIGTERM ... (the
    system's out-of-memory killer does this)", exit 2."""
    write_image_folder(tmp_path / "p", per_class=8, classes=2, side=64)
    out = tmp_path / "p.cnnpar"
    script = (
        "import os, signal, sys, time\n"
        "import tqdm.auto\n"
        "from cnnpar.cli import main\n"
        "class Finaliser:\n"
        "    def __del__(self):\n"
        "        os.killpg(0, signal.SIGTERM)\n"
        "        time.sleep(5)\n"  # prepare's handler runs here: its Terminated goes nowhere
        "class Bar:\n"
        "    def __init__(self, *a, **k): self.n = 0\n"
        "    def update(self, n):\n"
        "        self.n += n\n"
        "        if self.n == 1: Finaliser()\n"
        "    def close(self): pass\n"
        "tqdm.auto.tqdm = Bar\n"  # prepare's progress bar: its first image is written
        "sys.exit(main(['prepare', sys.argv[1], '--out', sys.argv[2], '--workers', '2', '--no-progress']))\n"
    )
    proc = start([sys.executable, "-c", script, str(tmp_path / "p"), str(out)], tmp_path)
    err = finish(proc, timeout=60)
    assert proc.returncode == 128 + 15 and err.strip() == "cnnpar: stopped (SIGTERM)", err
    assert_nothing_left(out)


@linux_only
def test_the_workers_end_with_a_killed_prepare_and_keep_no_cnnpar_signal_handler(tmp_path):
    """kill -9 on prepare left its workers running for ever, children of init, and each ran cnnpar's SIGTERM
    handler (a traceback when stopped) and took the terminal's Ctrl-C as its own."""
    proc, out, workers = start_busy_prepare(tmp_path)
    try:
        proc.kill()
        proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(pid) for pid in workers)
        # SIGINT and SIGHUP reach the terminal's whole group: prepare stops its workers itself
        assert set(workers.values()) == {"(<Handlers.SIG_DFL: 0>, <Handlers.SIG_IGN: 1>, <Handlers.SIG_IGN: 1>)"}
    finally:
        end_all(proc)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_write_that_fails_is_one_line_and_leaves_nothing(tmp_path, workers):
    """A full disk printed a 15-line traceback of OSError. A file size limit fails the same write (EFBIG
    where a full disk gives ENOSPC) without filling a disk."""
    write_image_folder(tmp_path / "p", per_class=8, classes=2, side=64)  # 16 x 12 KB of pixels
    out = tmp_path / "p.cnnpar"
    script = (
        "import resource, signal, sys\n"
        "from cnnpar.cli import main\n"
        "import cnnpar.data.store_write\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"  # the write fails instead of ending the process
        "resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, 50_000))\n"
        "sys.exit(main(['prepare', sys.argv[1], '--out', sys.argv[2], '--workers', sys.argv[3], '--no-progress']))\n"
    )
    proc = start([sys.executable, "-c", script, str(tmp_path / "p"), str(out), str(workers)], tmp_path)
    err = finish(proc, timeout=180)  # a guard against a hang, not a timing: torch's import alone can take 30 s loaded
    assert proc.returncode == 2, err
    assert err.strip() == (
        f"cnnpar: error: {out}: cannot write the store (File too large): expected room for it and permission to "
        f"write in {tmp_path}"
    )
    assert_nothing_left(out)


def test_a_read_only_out_folder_is_the_one_line_alone_not_a_clean_up_traceback(tmp_path, monkeypatch, capsys):
    """On a read-only file system, unlinking a partial file that was never made raises EROFS, not the ENOENT that
    missing_ok covers: the clean-up's traceback followed the good one-line error. Simulated (tests may not mount):
    the partial's open and every unlink of a .partial raise EROFS."""
    import errno

    from cnnpar.cli import main

    write_image_folder(tmp_path / "p", per_class=2, classes=2)
    out = tmp_path / "p.cnnpar"
    opened, unlinked = Path.open, Path.unlink

    def read_only(path: Path) -> bool:
        return path.name.endswith(".partial")

    def open_(self, *a, **k):
        if read_only(self):
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return opened(self, *a, **k)

    def unlink(self, missing_ok=False):
        if read_only(self):
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return unlinked(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "open", open_)
    monkeypatch.setattr(Path, "unlink", unlink)
    assert main(["prepare", str(tmp_path / "p"), "--out", str(out), "--workers", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cnnpar: error: {out}: cannot write the store (Read-only file system at {out}."), err
    assert err.endswith(f".partial): expected room for it and permission to write in {tmp_path}\n"), err
    assert err.count("\n") == 1
    assert_nothing_left(out)


def test_two_prepares_to_one_out_each_leave_a_whole_store(tmp_path, monkeypatch):
    """Both wrote OUT.partial: the second truncated the first's file and renamed it to OUT, then the first went
    on writing into it (a store that opened and trained on a mix of both folders) and failed its own rename.
    Here the second runs to completion while the first is half-way."""
    from cnnpar.data import store_write

    write_image_folder(tmp_path / "first", per_class=6, classes=2, side=32)
    write_image_folder(tmp_path / "second", per_class=6, classes=2, side=24)
    out = tmp_path / "p.cnnpar"
    real, seen = store_write.decode_for_store, []

    def second_prepare_half_way(path, sides):
        seen.append(path)
        if len(seen) == 6:
            prepare_store(tmp_path / "second", out, 64, workers=1, progress=False)
            assert StoreFile(out).header["source"] == str((tmp_path / "second").resolve())
        return real(path, sides)

    monkeypatch.setattr(store_write, "decode_for_store", second_prepare_half_way)
    prepare_store(tmp_path / "first", out, 64, workers=1, progress=False)
    monkeypatch.undo()
    assert verify_store(out, progress=False)["source"] == str((tmp_path / "first").resolve())
    alone = tmp_path / "alone.cnnpar"
    prepare_store(tmp_path / "first", alone, 64, workers=1, progress=False)
    assert np.array_equal(StoreFile(out).pixels, StoreFile(alone).pixels)
    assert not left_partials(out)


@pytest.mark.parametrize("workers", [1, 2])
def test_photos_past_pillows_bomb_limit_are_prepared_as_the_folder_trains_on_them(tmp_path, monkeypatch, workers):
    """A 14000x13200 JPEG trained from the folder, but prepare refused it ("could be decompression bomb DOS
    attack"), and printed a DecompressionBombWarning at half that. The limit is made small here: a 64x64 photo is
    past it, a 40x40 one past the warning; cnnpar's other uses of Pillow keep it."""
    for name, side in (("cats/big.png", 64), ("dogs/warned.png", 40)):
        (tmp_path / "p" / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((side, side, 3), 90, np.uint8)).save(tmp_path / "p" / name)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        header = prepare_store(tmp_path / "p", tmp_path / "p.cnnpar", 0, workers, progress=False, short_side=256)
    assert header["count"] == 2 and sorted(StoreFile(tmp_path / "p.cnnpar").hw[:, 0].tolist()) == [40, 64]
    assert Image.MAX_IMAGE_PIXELS == 1000


def test_workers_the_system_will_not_start_are_said_as_such_not_as_a_write_failure(tmp_path, monkeypatch):
    """A fork refused (EAGAIN: a process limit) was reported as "cannot write the store"."""
    import errno

    from cnnpar.errors import UserError

    write_image_folder(tmp_path / "p", per_class=4, classes=2, side=32)
    out = tmp_path / "p.cnnpar"

    def refused_fork():
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", refused_fork)
    with pytest.raises(UserError) as e:
        prepare_store(tmp_path / "p", out, 0, workers=2, progress=False)
    assert str(e.value) == (
        f"{tmp_path / 'p'}: could not start 2 decoding processes (Resource temporarily unavailable): expected the "
        "system to allow them, or fewer --workers (--workers 1 decodes in this process)"
    )
    assert_nothing_left(out)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_decoder_out_of_open_files_is_said_as_the_limit_not_as_a_bad_photo(tmp_path, monkeypatch, workers):
    """Under ulimit -n 17 a worker's Pillow could not open what it needed, and prepare said the photo "cannot decode as
    an image ([Errno 24] ...)": the user was sent to a photo that was fine. Forked workers inherit the patch. Fewer
    workers is advised only where there were some."""
    import errno

    from cnnpar.errors import TooManyOpenFiles

    write_image_folder(tmp_path / "p", per_class=4, classes=2, side=32)
    out = tmp_path / "p.cnnpar"

    def no_files_left(*args, **kwargs):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(Image, "open", no_files_left)
    with pytest.raises(TooManyOpenFiles) as e:
        prepare_store(tmp_path / "p", out, 0, workers=workers, progress=False)
    assert "not decoded: the open-files limit ran out" in str(e.value) and "ulimit -n 65536" in str(e.value)
    assert "cannot decode as an image" not in str(e.value)
    # --workers 1 decodes in prepare's own process: "or fewer --workers" named a flag with nothing left to give
    assert ("fewer --workers" in str(e.value)) == (workers > 1), str(e.value)
    assert_nothing_left(out)
