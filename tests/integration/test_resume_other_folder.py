"""A run started with a relative --data resumes from any folder: its record says where it was started."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from cnnpar.engine.checkpoint import load_checkpoint
from cnnpar.report.files import read_csv
from tests.conftest import main_in
from tests.datafiles import write_image_folder, write_npz, write_train_test_csv

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def run_cli(monkeypatch, capsys):
    """`cnnpar ARGS` started in `cwd`, called in this process (cli.main, as a notebook calls it, which resolves a
    relative --data against the working folder when it runs, as a process started there does): its exit code and
    stderr, as a completed subprocess gives them."""

    def _run(args: list[str], cwd) -> subprocess.CompletedProcess:
        return main_in(cwd, monkeypatch, capsys, args)

    return _run


ARGS = ["--image-size", "16", "--batch-size", "8", "--workers", "0", "--no-progress", "--name", "r"]


def _start_then_resume_elsewhere(run_cli, tmp_path, data_args: list[str]):
    start, other = tmp_path / "start", tmp_path / "other"
    other.mkdir(exist_ok=True)
    first = run_cli(["train", *data_args, "--epochs", "1", *ARGS], start)
    assert first.returncode == 0, first.stderr
    run = start / "runs" / "r"
    again = run_cli(["train", "--resume", str(run), "--epochs", "2", "--no-progress", "--workers", "0"], other)
    return run, again


def test_resume_from_another_folder_reads_the_npz_the_run_started_with(run_cli, tmp_path):
    (tmp_path / "start").mkdir()
    write_npz(tmp_path / "start" / "d.npz", n_train=64, n_test=16)
    run, again = _start_then_resume_elsewhere(run_cli, tmp_path, ["--data", "d.npz"])
    assert again.returncode == 0, again.stderr
    assert [int(r["epoch"]) for r in read_csv(run / "metrics.csv")] == [1, 2]


def test_resume_auto_from_another_folder_reads_the_image_folder(run_cli, tmp_path):
    write_image_folder(tmp_path / "start" / "photos", per_class=4)
    start, other = tmp_path / "start", tmp_path / "other"
    other.mkdir()
    first = run_cli(["train", "--data", "photos", "--epochs", "1", *ARGS], start)
    assert first.returncode == 0, first.stderr
    again = run_cli(["train", "--resume", "auto", "--out-dir", str(start / "runs"), "--epochs", "2", *ARGS[4:]], other)
    assert again.returncode == 0, again.stderr
    assert [int(r["epoch"]) for r in read_csv(start / "runs" / "r" / "metrics.csv")] == [1, 2]


def test_an_old_record_without_its_start_folder_names_the_path_and_the_flag(run_cli, tmp_path):
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


def _resumes_on_the_start_folders_data(run_cli, tmp_path, data_args: list[str], data: str):
    """Started in start/ on relative paths, resumed by absolute path from other/, which holds other data under the
    same names (a resume that read its paths from the working folder would train on, or refuse, those)."""
    run, again = _start_then_resume_elsewhere(run_cli, tmp_path, data_args)
    assert again.returncode == 0, again.stderr
    assert [int(r["epoch"]) for r in read_csv(run / "metrics.csv")] == [1, 2]
    meta = load_checkpoint(run / "ckpt" / "last.pt")["meta"]
    assert meta["data_path"] == str((tmp_path / "start" / data).resolve())


def _flat_labelled(folder, names: list[str], bright: int) -> None:
    """folder/train/<name>.png and folder/labels.csv (Kaggle's layout), classes by brightness"""
    from PIL import Image

    (folder / "train").mkdir(parents=True)
    for i, name in enumerate(names):
        Image.fromarray(np.full((8, 8, 3), bright * (i % 2), np.uint8)).save(folder / "train" / f"{name}.png")
    (folder / "labels.csv").write_text("id,label\n" + "".join(f"{n},{i % 2}\n" for i, n in enumerate(names)))


def test_resume_from_another_folder_reads_the_relative_labels_csv(run_cli, tmp_path):
    _flat_labelled(tmp_path / "start", [f"a{i}" for i in range(16)], 200)
    _flat_labelled(tmp_path / "other", [f"b{i}" for i in range(6)], 100)  # other ids: the start's images unlabelled
    _resumes_on_the_start_folders_data(run_cli, tmp_path, ["--data", "train", "--labels", "labels.csv"], "train")


def test_resume_from_another_folder_reads_the_kaggle_csv(run_cli, tmp_path):
    (tmp_path / "start").mkdir()
    (tmp_path / "other").mkdir()
    write_train_test_csv(tmp_path / "start", n_train=64, n_test=8)
    write_train_test_csv(tmp_path / "other", n_train=24, n_test=8)
    _resumes_on_the_start_folders_data(run_cli, tmp_path, ["--data", "train.csv"], "train.csv")


def _png_classes(root, per_class: int) -> None:
    """root/<class>/<i>.png: two classes of tiny photos, one brightness each"""
    from PIL import Image

    for k in range(2):
        (root / f"c{k}").mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(np.full((12, 12, 3), 40 + 150 * k + i, np.uint8)).save(root / f"c{k}" / f"{i}.png")


def test_resume_from_another_folder_reads_the_prepared_store(run_cli, tmp_path):
    _png_classes(tmp_path / "start" / "photos", per_class=8)
    _png_classes(tmp_path / "other" / "photos", per_class=3)
    for folder in ("start", "other"):
        made = run_cli(["prepare", "photos", "--out", "d.cnnpar", "--no-progress"], tmp_path / folder)
        assert made.returncode == 0, made.stderr
    _resumes_on_the_start_folders_data(run_cli, tmp_path, ["--data", "d.cnnpar"], "d.cnnpar")
