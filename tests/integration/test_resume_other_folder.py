"""A run started with a relative --data resumes from any folder: its record says where it was started."""

from __future__ import annotations

from cnnpar.report.files import read_csv
from tests.conftest import run_cli
from tests.datafiles import write_image_folder, write_npz

ARGS = ["--image-size", "16", "--batch-size", "8", "--workers", "0", "--no-progress", "--name", "r"]


def _start_then_resume_elsewhere(tmp_path, data_args: list[str]):
    start, other = tmp_path / "start", tmp_path / "other"
    other.mkdir()
    first = run_cli(["train", *data_args, "--epochs", "1", *ARGS], start)
    assert first.returncode == 0, first.stderr
    run = start / "runs" / "r"
    again = run_cli(["train", "--resume", str(run), "--epochs", "2", "--no-progress", "--workers", "0"], other)
    return run, again


def test_resume_from_another_folder_reads_the_npz_the_run_started_with(tmp_path):
    (tmp_path / "start").mkdir()
    write_npz(tmp_path / "start" / "d.npz", n_train=64, n_test=16)
    run, again = _start_then_resume_elsewhere(tmp_path, ["--data", "d.npz"])
    assert again.returncode == 0, again.stderr
    assert [int(r["epoch"]) for r in read_csv(run / "metrics.csv")] == [1, 2]


def test_resume_auto_from_another_folder_reads_the_image_folder(tmp_path):
    write_image_folder(tmp_path / "start" / "photos", per_class=4)
    start, other = tmp_path / "start", tmp_path / "other"
    other.mkdir()
    first = run_cli(["train", "--data", "photos", "--epochs", "1", *ARGS], start)
    assert first.returncode == 0, first.stderr
    again = run_cli(["train", "--resume", "auto", "--out-dir", str(start / "runs"), "--epochs", "2", *ARGS[4:]], other)
    assert again.returncode == 0, again.stderr
    assert [int(r["epoch"]) for r in read_csv(start / "runs" / "r" / "metrics.csv")] == [1, 2]


def test_an_old_record_without_its_start_folder_names_the_path_and_the_flag(tmp_path):
    (tmp_path / "start").mkdir()
    write_npz(tmp_path / "start" / "d.npz", n_train=64, n_test=16)
    start, other = tmp_path / "start", tmp_path / "other"
    other.mkdir()
    assert run_cli(["train", "--data", "d.npz", "--epochs", "1", *ARGS], start).returncode == 0
    record = start / "runs" / "r" / "config.toml"
    record.write_text("".join(x for x in record.read_text().splitlines(True) if not x.startswith("# started in:")))
    again = run_cli(["train", "--resume", str(start / "runs" / "r"), "--epochs", "2", "--no-progress"], other)
    assert again.returncode != 0
    assert "--data d.npz is relative and not found from" in again.stderr and "Traceback" not in again.stderr
    # from its own folder it resumes as it always did
    assert run_cli(["train", "--resume", "runs/r", "--epochs", "2", "--no-progress"], start).returncode == 0
