"""A TensorBoard event file or a --monitor telemetry CSV that cannot be written during `cnnpar train` (a full disk, a
file size limit) is said once, in one line naming the file, why, and what it keeps, and training goes on: both are
views of the run (metrics.csv keeps every epoch's figures, the checkpoint what --resume needs), where a run record's
failed write stops the run (test_run_record_writes.py). Their failures had ended the run in a traceback: the event
file's in epoch 1's end, before its checkpoint; the telemetry CSV's at the run's end, after its last epoch. Also:
the doctor's telemetry CSV, the event file and the checkpoint failing on one full disk, and a resume that cannot cut
an earlier attempt's event file back."""

from __future__ import annotations

import errno
import io
import json
import os
import pathlib
import re

import pytest
import torch

from cnnpar.cli import main
from cnnpar.dist import DistInfo
from cnnpar.engine import checkpoint, fault
from cnnpar.engine.checkpoint import checkpoint_epoch
from cnnpar.report.files import read_csv
from cnnpar.report.telemetry import monitor_run
from tests.integration.test_result_writes import DOCTOR
from tests.integration.test_tensorboard import read_scalars

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = ["train", "--device", "cpu", "--max-steps", "2", "--no-progress", "--workers", "0", "--epochs", "3"]
SMALL += ["--data", "synthetic", "--synthetic-samples", "64", "--image-shape", "1x8x8", "--batch-size", "16"]


def disk_full_for(monkeypatch, name_part: str, writes_that_fit: int) -> None:
    """Files whose name holds `name_part`, opened to write, get a disk that takes `writes_that_fit` writes of the
    operating system and refuses every later one with ENOSPC: the lowest write, under Python's own buffer, so that a
    flush, and the close that flushes the buffer's rest again, fail as on a disk that has filled up."""
    real_open = pathlib.Path.open

    class FullDisk(io.FileIO):
        fit = writes_that_fit

        def write(self, data) -> int:
            if FullDisk.fit <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            FullDisk.fit -= 1
            return super().write(data)

    def open_(self, mode="r", buffering=-1, encoding=None, errors=None, newline=None):
        if name_part not in self.name or not set(mode) & set("wa"):
            return real_open(self, mode, buffering, encoding, errors, newline)
        buffered = io.BufferedWriter(FullDisk(str(self), mode.replace("b", "")))
        return buffered if "b" in mode else io.TextIOWrapper(buffered, encoding, errors, newline)

    monkeypatch.setattr(pathlib.Path, "open", open_)


def lines_of(out: str, start: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(start)]


def assert_trained_on(tmp_path, out: str, err: str) -> None:
    """Every epoch trained, saved and in metrics.csv; no traceback."""
    assert "Traceback" not in out + err and err == ""
    assert [line.split("  ")[0] for line in lines_of(out, "epoch ")] == ["epoch 1/3", "epoch 2/3", "epoch 3/3"]
    run = tmp_path / "runs" / "w"
    assert checkpoint_epoch(run) == 3
    assert [r["epoch"] for r in read_csv(run / "metrics.csv")] == ["1", "2", "3"]


@pytest.mark.parametrize(("fit", "kept"), [(0, "it keeps no point"), (1, "the points up to step 2 stay in it")])
def test_an_event_file_that_cannot_be_written_is_said_once_and_training_goes_on(
    tmp_path, monkeypatch, capsys, fit, kept
):
    """One write fits: epoch 1's flush (its points, at step 2); epoch 2's is refused."""
    monkeypatch.chdir(tmp_path)
    disk_full_for(monkeypatch, "tfevents", fit)
    assert main([*SMALL, "--name", "w"]) == 0
    out, err = capsys.readouterr()
    assert_trained_on(tmp_path, out, err)
    (line,) = lines_of(out, "tensorboard: runs/w/")
    (events,) = (tmp_path / "runs" / "w").glob("events.out.tfevents.*")
    assert line.startswith(f"tensorboard: runs/w/{events.name}: cannot be written (No space left on device; ")
    assert line.endswith(
        f"): no more TensorBoard points this run ({kept}); metrics.csv keeps every epoch, and training goes on"
    )
    assert (events.stat().st_size > 0) == (fit > 0)


@pytest.mark.parametrize("fit", [0, 1])
def test_a_telemetry_csv_that_cannot_be_written_is_said_once_and_training_goes_on(tmp_path, monkeypatch, capsys, fit):
    """One write fits: the first sample's (with the header); the next is refused, the run's last at the latest."""
    monkeypatch.chdir(tmp_path)
    disk_full_for(monkeypatch, "telemetry", fit)
    assert main([*SMALL, "--monitor", "--no-tensorboard", "--name", "w"]) == 0
    out, err = capsys.readouterr()
    assert_trained_on(tmp_path, out, err)
    (line,) = lines_of(out, "telemetry: runs/w/")
    kept = r"the samples up to [0-9.]+ s stay in it" if fit else "it keeps no sample"
    pattern = r"telemetry: runs/w/telemetry\.csv: cannot be written \(No space left on device; .*\): sampling "
    assert re.fullmatch(pattern + rf"stopped \({kept}\), and training goes on", line)
    assert len(read_csv(tmp_path / "runs" / "w" / "telemetry.csv")) == fit  # the one sample that fitted, or none
    assert not (tmp_path / "runs" / "w" / "telemetry.png").exists()  # no timeline of a CSV cut short


def test_another_machines_telemetry_csv_that_cannot_be_written_is_said_on_its_stderr(tmp_path, monkeypatch, capsys):
    """The run log of a rank other than 0 says nothing: its own failed CSV is said on its standard error."""
    disk_full_for(monkeypatch, "telemetry", 0)
    said: list[str] = []
    info = DistInfo(rank=1, local_rank=0, world_size=2, device=torch.device("cpu"))
    with monitor_run(True, info, tmp_path, said.append):
        pass
    err = capsys.readouterr().err
    assert not [line for line in said if "cannot be written" in line]
    (line,) = err.splitlines()
    assert line.startswith(f"rank 1: telemetry: {tmp_path / 'telemetry_rank1.csv'}: cannot be written (No space left")
    assert line.endswith("sampling stopped (it keeps no sample), and training goes on")


def test_a_disk_that_fills_under_the_event_file_and_the_checkpoint_stops_in_the_checkpoints_line(
    tmp_path, monkeypatch, capsys
):
    """Epoch 1's points and checkpoint fit; then the disk is full for both: the event file's failure is said once
    (it is a view), and the run stops in the checkpoint's one line, epoch 1 kept for --resume, which loses none."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "w"
    with monkeypatch.context() as full:
        disk_full_for(full, "tfevents", 1)
        real_write, saved = checkpoint.atomic_write, []

        def after_epoch_1(path, *args, **kwargs):  # epoch 1 writes last.pt, then best.pt; epoch 2's last.pt fails
            saved.append(os.path.basename(path))
            if saved.count("last.pt") > 1:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
            real_write(path, *args, **kwargs)

        full.setattr(checkpoint, "atomic_write", after_epoch_1)
        assert main([*SMALL, "--name", "w"]) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert [line.split("  ")[0] for line in lines_of(out, "epoch ")] == ["epoch 1/3"]
    (events,) = run.glob("events.out.tfevents.*")
    (said,) = [line for line in out.splitlines() if "cannot be written" in line]
    assert said.startswith(f"tensorboard: runs/w/{events.name}: cannot be written (No space left on device; ")
    (line,) = err.splitlines()
    assert line.startswith("cnnpar: error: runs/w/ckpt/last.pt: cannot be written (No space left on device; ")
    assert line.endswith("the checkpoint in runs/w holds epoch 1, which --resume runs/w continues")
    assert checkpoint_epoch(run) == 1 and not list(run.rglob("*.tmp"))

    assert main([*SMALL, "--resume", "runs/w"]) == 0
    assert "Traceback" not in "".join(capsys.readouterr())
    assert checkpoint_epoch(run) == 3
    assert [r["epoch"] for r in read_csv(run / "metrics.csv")] == ["1", "2", "3"]
    assert read_scalars(run)["train/epoch"] == [(2, 1.0), (4, 2.0), (6, 3.0)]  # one point per epoch, none lost


@pytest.mark.parametrize("fit", [0, 1])
def test_a_doctors_telemetry_csv_that_cannot_be_written_is_said_once_and_the_report_is_written(
    tmp_path, monkeypatch, capsys, fit
):
    """`cnnpar doctor --monitor` samples with the same sampler: its line said "training goes on" in a command that
    trains nothing, and the report's timeline was drawn from the CSV cut short."""
    disk_full_for(monkeypatch, "telemetry", fit)
    rep = tmp_path / "rep"
    assert main([*DOCTOR, "--report-dir", str(rep), "--monitor"]) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and err == ""
    (line,) = [ln for ln in out.splitlines() if "cannot be written" in ln]
    kept = r"the samples up to [0-9.]+ s stay in it" if fit else "it keeps no sample"
    pattern = rf"telemetry: {re.escape(str(rep / 'telemetry.csv'))}: cannot be written \(No space left on device; "
    assert re.fullmatch(pattern + rf".*\): sampling stopped \({kept}\), and the doctor goes on", line), line
    assert {"report.md", "doctor.json", "phases.csv", "doctor.png"} <= {p.name for p in rep.iterdir()}
    assert len(read_csv(rep / "telemetry.csv")) == fit  # the one sample that fitted, or none
    assert not (rep / "telemetry.png").exists()  # no timeline of a CSV cut short
    # the report's files say the CSV is cut short, not only the log
    assert json.loads((rep / "doctor.json").read_text())["telemetry_failed"] == line
    assert f"**{line}**" in (rep / "report.md").read_text()


@pytest.mark.parametrize(
    ("flags", "board"),
    [
        ([], "tensorboard: event files in runs/w (tensorboard --logdir runs); "),
        (["--no-tensorboard"], "tensorboard: off; "),
    ],
)
def test_a_resume_whose_earlier_event_file_cannot_be_cut_says_it_in_its_line_and_goes_on(
    tmp_path, monkeypatch, capsys, flags, board
):
    """The resume cuts an earlier attempt's event file back to the checkpoint's step, with the board off too; a file
    it may not rewrite (read-only) ended the resume in a PermissionError traceback before its first epoch."""
    monkeypatch.chdir(tmp_path)
    with monkeypatch.context() as failing:  # epoch 2 fails after its first step's points: past the checkpoint's step 2
        failing.setenv(fault.RAISE_ENV, "2")
        fault._plan.cache_clear()
        with pytest.raises(RuntimeError, match="injected fault"):
            main([*SMALL, "--name", "w"])
    fault._plan.cache_clear()
    (events,) = (tmp_path / "runs" / "w").glob("events.out.tfevents.*")
    before = events.read_bytes()
    if os.geteuid() == 0:  # root writes a file whatever its mode: its refusal, as the kernel gives it
        real_truncate = os.truncate

        def refused(path, length):
            if "tfevents" in str(path):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
            return real_truncate(path, length)

        monkeypatch.setattr(os, "truncate", refused)
    else:
        events.chmod(0o444)
    capsys.readouterr()
    assert main([*SMALL, "--resume", "runs/w", *flags]) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and err == ""
    (line,) = lines_of(out, "tensorboard:")
    assert line.startswith(board)
    assert f"; runs/w/{events.name}: cannot be cut back to step 2 (Permission denied; " in line
    assert line.endswith("): the points an earlier attempt wrote past step 2 stay in it, beside this run's at the "
                         "same steps")  # fmt: skip
    assert events.read_bytes() == before
    assert checkpoint_epoch(tmp_path / "runs" / "w") == 3
    assert [r["epoch"] for r in read_csv(tmp_path / "runs" / "w" / "metrics.csv")] == ["1", "2", "3"]
