"""A `--nproc 2` run (gloo on the CPU) started on a relative --data resumes from another folder: each rank reads the
data of the folder the run was started in (the one-process cases: tests/integration/test_resume_other_folder.py).

`cnnpar train --nproc 2` runs in this process (cli.main, from each folder in turn as a shell's `cd` would): only its
torchrun and the ranks need processes of their own, and they are started as the command starts them."""

from __future__ import annotations

import pytest

from cnnpar.engine.checkpoint import load_checkpoint
from cnnpar.report.files import read_csv
from tests.conftest import main_in
from tests.datafiles import write_npz
from tests.dist.test_torchrun_cli import environment_of_a_subprocess

ARGS = ["--nproc", "2", "--device", "cpu", "--batch-size", "8", "--workers", "0", "--no-progress", "--no-tensorboard"]


@pytest.mark.slow  # over 20 s on 2 CPU cores (CI durations): `-m 'not slow'` leaves it out
def test_nproc_resume_from_another_folder_reads_the_start_folders_npz(tmp_path, monkeypatch, capfd):
    start, other = tmp_path / "start", tmp_path / "other"
    start.mkdir()
    other.mkdir()
    write_npz(start / "d.npz", n_train=64, n_test=16)
    write_npz(other / "d.npz", n_train=24, n_test=8)  # the same name here: a resume reading it would be refused
    environment_of_a_subprocess(monkeypatch)  # the ranks' environment, as a subprocess launcher would pass it on
    first = main_in(start, monkeypatch, capfd, ["train", "--data", "d.npz", "--epochs", "1", "--name", "r", *ARGS])
    assert first.returncode == 0, first.stderr[-3000:]
    run = start / "runs" / "r"
    again = main_in(other, monkeypatch, capfd, ["train", "--resume", str(run), "--epochs", "2", *ARGS])
    assert again.returncode == 0, again.stderr[-3000:]
    assert "after epoch 1" in again.stdout, again.stdout[-3000:]
    assert [int(r["epoch"]) for r in read_csv(run / "metrics.csv")] == [1, 2]
    state = load_checkpoint(run / "ckpt" / "last.pt")
    assert state["meta"]["data_path"] == str((start / "d.npz").resolve())
    assert not (other / "runs").exists()  # nothing written where the resume was typed
