"""A run record that cannot be written (a full disk, a read-only folder) ends `cnnpar train` in one line naming the
file, why, and what the run folder keeps, exit status 2, as a checkpoint's does: config.toml, metrics.csv,
summary.json and resumes.csv ended in a traceback. A run that fails so before any epoch is saved leaves no folder it
made; one that fails after keeps its epochs for `--resume`, and says the epoch it finished first."""

from __future__ import annotations

import errno
import os

import pytest

from cnnpar.cli import main
from cnnpar.engine import checkpoint, resume_checks, trainer
from cnnpar.engine.checkpoint import checkpoint_epoch
from cnnpar.report.files import read_csv

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = ["train", "--device", "cpu", "--max-steps", "2", "--no-progress", "--no-tensorboard", "--workers", "0"]
SMALL += ["--data", "synthetic", "--synthetic-samples", "64", "--image-shape", "1x8x8", "--batch-size", "16"]


def fail_writes_of(monkeypatch, module, writer: str, name: str, code: int = errno.ENOSPC) -> None:
    """`module`'s `writer` raises OSError `code` for a file called `name`, as a full disk (or a read-only folder)
    makes it; every other write goes through."""
    real = getattr(module, writer)

    def write(path, *args, **kwargs):
        if os.path.basename(path) == name:
            raise OSError(code, os.strerror(code), str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(module, writer, write)


def error_line(err: str) -> str:
    assert "Traceback" not in err
    (line,) = err.splitlines()
    return line


@pytest.mark.parametrize(
    ("writer", "name"), [("write_csv_atomic", "metrics.csv"), ("write_json_atomic", "summary.json")]
)
def test_a_record_that_cannot_be_written_after_an_epoch_says_the_epoch_and_what_is_kept(
    tmp_path, monkeypatch, capsys, writer, name
):
    monkeypatch.chdir(tmp_path)
    with monkeypatch.context() as full:
        fail_writes_of(full, trainer, writer, name)
        assert main([*SMALL, "--epochs", "3", "--name", "w"]) == 2
    out, err = capsys.readouterr()
    assert [line.split("  ")[0] for line in out.splitlines() if line.startswith("epoch ")] == ["epoch 1/3"]
    line = error_line(err)
    assert line.startswith(f"cnnpar: error: runs/w/{name}: cannot be written (No space left on device; ")
    assert line.endswith(
        "expected room for the run's records (free disk space, a higher file size limit); "
        "the checkpoint in runs/w holds epoch 1, which --resume runs/w continues"
    )
    run = tmp_path / "runs" / "w"
    assert checkpoint_epoch(run) == 1 and (run / "config.toml").is_file()
    assert not list(run.rglob("*.tmp"))
    assert main([*SMALL, "--resume", "runs/w"]) == 0
    assert [r["epoch"] for r in read_csv(run / "metrics.csv")] == ["1", "2", "3"]


def test_a_config_that_cannot_be_written_at_the_start_leaves_no_run_folder_it_made(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    fail_writes_of(monkeypatch, trainer, "write_text_atomic", "config.toml", errno.EROFS)
    assert main([*SMALL, "--epochs", "2", "--name", "c"]) == 2
    line = error_line(capsys.readouterr().err)
    assert line.startswith("cnnpar: error: runs/c/config.toml: cannot be written (Read-only file system; ")
    assert line.endswith(
        "expected a run folder where files can be written (runs/c is not); no epoch is saved in runs/c"
    )
    assert not (tmp_path / "runs").exists()
    # a folder the user made beforehand is the user's: kept
    (tmp_path / "mine").mkdir()
    assert main([*SMALL, "--epochs", "2", "--out-dir", ".", "--name", "mine"]) == 2
    assert error_line(capsys.readouterr().err).startswith("cnnpar: error: mine/config.toml: cannot be written (")
    assert (tmp_path / "mine").is_dir()


def test_a_first_checkpoint_that_cannot_be_written_leaves_no_run_folder_it_made(tmp_path, monkeypatch, capsys):
    """Epoch 1's row was in the history while its checkpoint was written, so the folder was kept with no epoch."""
    monkeypatch.chdir(tmp_path)
    fail_writes_of(monkeypatch, checkpoint, "atomic_write", "last.pt")
    assert main([*SMALL, "--epochs", "2", "--name", "f"]) == 2
    line = error_line(capsys.readouterr().err)
    assert line.startswith("cnnpar: error: runs/f/ckpt/last.pt: cannot be written (No space left on device; ")
    assert line.endswith("no epoch is saved in runs/f")
    assert not (tmp_path / "runs").exists()


def test_a_resume_whose_resumes_csv_cannot_be_written_keeps_the_run_as_it_was(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main([*SMALL, "--epochs", "1", "--name", "r"]) == 0
    run = tmp_path / "runs" / "r"
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    capsys.readouterr()
    with monkeypatch.context() as read_only:
        fail_writes_of(read_only, resume_checks, "write_csv_atomic", "resumes.csv", errno.EROFS)
        assert main([*SMALL, "--resume", "runs/r", "--epochs", "2"]) == 2
    line = error_line(capsys.readouterr().err)
    assert line.startswith("cnnpar: error: runs/r/resumes.csv: cannot be written (Read-only file system; ")
    assert line.endswith(
        "expected a run folder where files can be written (runs/r is not); "
        "the checkpoint in runs/r holds epoch 1, which --resume runs/r continues"
    )
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    assert main([*SMALL, "--resume", "runs/r", "--epochs", "2"]) == 0
    assert [r["epoch"] for r in read_csv(run / "metrics.csv")] == ["1", "2"]
