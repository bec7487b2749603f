"""Item 12.8: atomic writes create files as the umask says and fsync the file and its folder."""

from __future__ import annotations

import errno
import json
import math
import os
import stat

import pytest
import torch

from cnnpar.engine.checkpoint import save_checkpoint
from cnnpar.errors import UserError
from cnnpar.report import files
from cnnpar.report.files import (
    atomic_write,
    write_csv_atomic,
    write_errors_explained,
    write_json_atomic,
    write_text_atomic,
)


@pytest.fixture
def umask():
    old = os.umask(0o022)
    yield os.umask
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_written_files_follow_the_umask(tmp_path, umask, mask, expected):
    umask(mask)
    write_csv_atomic(tmp_path / "metrics.csv", [{"epoch": 1, "acc": 0.5}])
    save_checkpoint(tmp_path / "ckpt" / "last.pt", {"w": torch.zeros(2)})
    write_text_atomic(tmp_path / "submission.csv", "id,label\n")
    for name in ("metrics.csv", "ckpt/last.pt", "submission.csv"):
        assert mode(tmp_path / name) == expected, name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "metrics.csv", "submission.csv"]  # no temp left


def test_atomic_write_fsyncs_the_file_then_its_folder(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    write_text_atomic(tmp_path / "summary.json", "{}")
    assert len(synced) == 2
    assert os.path.basename(synced[0]).startswith(".summary.json.")  # the temp file, before the rename
    assert synced[1] == str(tmp_path)


def test_a_failed_write_leaves_nothing(tmp_path):
    def boom(p):
        p.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        files.atomic_write(tmp_path / "x.csv", boom)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_block_removes_its_report_folder_and_only_the_parents_it_made_that_stayed_empty(tmp_path):
    from cnnpar.report.files import removed_on_failure

    report = tmp_path / "runs" / "doctor" / "r1"
    with pytest.raises(RuntimeError), removed_on_failure(report):
        (report / "telemetry.csv").write_text("t\n")
        (tmp_path / "runs" / "cnn3-x").mkdir()  # another command's run, written meanwhile beside it
        raise RuntimeError("bad data at the first batch")
    assert not (tmp_path / "runs" / "doctor").exists()  # made by the block, empty again: removed
    assert (tmp_path / "runs" / "cnn3-x").is_dir()  # not this command's: kept, and so its parent
    with pytest.raises(RuntimeError), removed_on_failure(tmp_path / "new" / "r2"):
        raise RuntimeError("again")
    assert not (tmp_path / "new").exists()


def test_a_failed_block_keeps_its_folders_for_an_error_that_when_refuses(tmp_path):
    """Training keeps a run whose error came after a finished epoch (engine/trainer.py's fit): it resumes."""
    from cnnpar.report.files import removed_on_failure

    report = tmp_path / "runs" / "r1"
    with pytest.raises(KeyboardInterrupt), removed_on_failure(report, lambda e: isinstance(e, RuntimeError)):
        (report / "metrics.csv").write_text("epoch\n1\n")
        raise KeyboardInterrupt
    assert (report / "metrics.csv").is_file()


# writes PATH atomically, the temp file holding some bytes when it signals itself (SIGKILL: no clean-up runs; SIGSTOP:
# a live writer in the middle of its write)
WRITER = """
import os, signal, sys
from pathlib import Path
from cnnpar.report.files import atomic_write
def write(p):
    Path(p).write_text("half a file")
    os.kill(os.getpid(), getattr(signal, sys.argv[2]))
atomic_write(sys.argv[1], write)
"""


def _writer(target, how):
    import subprocess
    import sys

    from tests.conftest import cli_env

    return subprocess.Popen([sys.executable, "-c", WRITER, str(target), how], env=cli_env())


def _temps(target):
    return sorted(target.parent.glob(f".{target.name}.*.tmp"))


@pytest.mark.skipif(files.fcntl is None, reason="no flock: temps of dead writers are not told apart")
def test_a_write_removes_what_a_killed_writer_of_the_same_file_left_and_not_a_live_writers(tmp_path):
    """A killed `cnnpar predict` left a hidden `.predictions.csv.<hex>.tmp` that no later write removed: only a
    run's own folder was ever cleaned (remove_orphan_temps)."""
    import signal
    import time

    target = tmp_path / "predictions.csv"
    assert _writer(target, "SIGKILL").wait(timeout=60) == -signal.SIGKILL
    (dead,) = _temps(target)
    other = tmp_path / ".submission.csv.0badc0de.tmp"  # another file's temp: not this write's to judge
    other.write_text("x")
    live = _writer(target, "SIGSTOP")
    try:
        deadline = time.monotonic() + 60
        while len(_temps(target)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        (held,) = set(_temps(target)) - {dead}
        while held.stat().st_size == 0 and time.monotonic() < deadline:  # stopped once its bytes are written
            time.sleep(0.05)
        write_text_atomic(target, "id,label\n")
        assert set(_temps(target)) == {dead, held}  # both written to just now: either may be a live writer's
        quiet = time.time() - 2 * files.QUIET_S  # as if nothing had written to either for two minutes: the lock alone
        for temp in (dead, held):  # tells them apart now
            os.utime(temp, (quiet, quiet))
        write_text_atomic(target, "id,label\n")
        assert _temps(target) == [held] and other.exists()  # the dead writer's went; the live one's stays
        assert target.read_text() == "id,label\n"
    finally:
        live.send_signal(signal.SIGCONT)
        assert live.wait(timeout=60) == 0
    assert _temps(target) == [] and target.read_text() == "half a file"


def test_a_stop_inside_torch_save_stays_a_stop_not_a_failed_write(tmp_path, monkeypatch):
    """A SIGTERM inside torch.save, with its zip writer's "unexpected pos" error raised over it while it unwound, was
    reported as a checkpoint that could not be written for want of room."""
    from cnnpar.errors import Terminated

    def save(state, f):
        try:
            raise Terminated
        finally:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(Terminated):
        save_checkpoint(tmp_path / "ckpt" / "last.pt", {"w": torch.zeros(2)})
    assert list((tmp_path / "ckpt").iterdir()) == []


def test_an_error_that_is_not_the_files_keeps_its_own_traceback(tmp_path, monkeypatch):
    """A CUDA error met in torch.save's copy to the host was reported as a checkpoint without room on its disk."""

    def save(state, f):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        save_checkpoint(tmp_path / "ckpt" / "last.pt", {"w": torch.zeros(2)})
    assert list((tmp_path / "ckpt").iterdir()) == []


def test_check_out_file_refuses_a_path_under_a_file_or_where_none_can_be_made_and_leaves_nothing(tmp_path):
    from cnnpar.errors import UserError

    (tmp_path / "data.csv").write_text("x")
    with pytest.raises(UserError, match=r"^--out .*data\.csv/sub/p\.csv: lies under .*data\.csv, a file: expected"):
        files.check_out_file(tmp_path / "data.csv" / "sub" / "p.csv", "--out")
    files.check_out_file(tmp_path / "new" / "deeper" / "p.csv", "--out")  # folders a write will make
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.csv"]  # its trial file gone, no folder made
    if os.path.isdir("/proc/self"):
        with pytest.raises(UserError, match=r"^--out /proc/p\.csv: cannot be written \("):
            files.check_out_file("/proc/p.csv", "--out")


def test_a_write_that_fails_for_lack_of_room_names_the_file_and_the_free_space(tmp_path):
    target = tmp_path / "metrics.csv"

    def full_disk(p):
        raise OSError(errno.ENOSPC, "No space left on device", str(p))

    with pytest.raises(UserError) as caught:
        with write_errors_explained(target, "expected room for it"):
            atomic_write(target, full_disk)
    message = str(caught.value)
    assert message.startswith(f"{target}: cannot be written (No space left on device; ")
    assert "MB free on its disk" in message and message.endswith("): expected room for it")
    assert list(tmp_path.iterdir()) == []  # the temp went with the failed write


def test_errors_other_than_the_files_pass_through_the_explanation(tmp_path):
    with pytest.raises(ValueError, match="not a write"):
        with write_errors_explained(tmp_path / "x", "expected room for it"):
            raise ValueError("not a write")


def strict_json(text: str):
    """json.loads as jq and JavaScript's JSON.parse read: NaN, Infinity and -Infinity are no JSON."""

    def refuse(token):
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def test_json_records_hold_no_nan_or_infinity_a_strict_reader_refuses(tmp_path):
    record = {
        "val_loss": math.nan,
        "budget_s": math.inf,
        "rows": [{"gain": -math.inf, "acc": 0.5}],
        "pair": (1.0, math.nan),
    }
    write_json_atomic(tmp_path / "summary.json", record)
    read = strict_json((tmp_path / "summary.json").read_text())
    assert read == {"val_loss": None, "budget_s": None, "rows": [{"gain": None, "acc": 0.5}], "pair": [1.0, None]}


def test_json_between_cnnpars_own_processes_keeps_a_measured_nan(tmp_path):
    write_json_atomic(tmp_path / "result.json", {"images_per_s": math.nan}, strict=False)
    assert math.isnan(json.loads((tmp_path / "result.json").read_text())["images_per_s"])
