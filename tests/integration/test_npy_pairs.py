"""A pair of np.save files, `--data IMAGES.npy --labels LABELS.npy`, read as an .npz's x_train and y_train:
train, resume and predict on them, and each refusal in one line naming the file."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from cnnpar.cli import main
from tests.datafiles import CLASSES, bar_images

pytestmark = pytest.mark.usefixtures("one_thread")

TRAIN = 256
FAST = ["--epochs", "1", "--batch-size", "32", "--device", "cpu", "--no-progress", "--no-tensorboard"]


def _save_pair(folder: Path, n: int, seed: int = 0) -> tuple[Path, Path]:
    x, y = bar_images(n, seed=seed)
    np.save(folder / "x.npy", x)
    np.save(folder / "y.npy", y)
    return folder / "x.npy", folder / "y.npy"


@pytest.fixture(scope="module")
def trained(tmp_path_factory, one_thread):
    """A cnn3 trained through cli.main on x.npy + y.npy (4 bar classes, 16x16 grey), from the folder holding them."""
    folder = tmp_path_factory.mktemp("npy")
    _save_pair(folder, TRAIN)
    said = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(said):
        mp.chdir(folder)
        assert main(["train", "--data", "x.npy", "--labels", "y.npy", "--name", "pair", *FAST]) == 0
    return folder, folder / "runs" / "pair", said.getvalue()


def test_training_on_a_npy_pair_reads_its_images_and_labels_and_holds_out(trained):
    _, run, said = trained
    summary = json.loads((run / "summary.json").read_text())
    assert summary["best_val_acc"] >= 0.9  # the labels went with their images
    config = (run / "config.toml").read_text()
    assert 'source = "x.npy"' in config and 'labels = "y.npy"' in config and 'format = "npy"' in config
    # --val-fraction's seeded hold-out (0.2 of 256), as for an .npz without x_val
    assert "train 205, validation 51: a seeded 20% hold-out" in said, said


def test_a_npy_run_resumes_from_another_folder_with_both_files(trained, tmp_path, monkeypatch, capsys):
    """config.toml records --labels as it records a folder's: a resume from elsewhere reads the same two files."""
    folder, run, _ = trained
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--epochs", "2", "--no-progress"]) == 0
    said = capsys.readouterr().out
    assert f"cnn3 on {folder / 'x.npy'} |" in said and "resumed from" in said, said
    summary = json.loads((run / "summary.json").read_text())
    assert summary["epochs"] == 2 and summary["attempt_epochs"] == [2, 2]
    # the labels file is part of the data's checksum: relabelled, the run is not continued on it
    y = np.load(folder / "y.npy")
    np.save(folder / "y.npy", (y + 1) % CLASSES)
    try:
        line = _refusal(["train", "--resume", str(run), "--epochs", "3", "--no-progress"], capsys)
    finally:
        np.save(folder / "y.npy", y)
    assert "the data changed since the checkpoint" in line, line


def test_predict_on_a_npy_writes_row_numbers_and_scores_a_labels_npy(trained, tmp_path, capsys):
    _, run, _ = trained
    x, y = bar_images(40, seed=7)
    np.save(tmp_path / "test.npy", x)
    np.save(tmp_path / "truth.npy", y)
    out = tmp_path / "p.csv"
    capsys.readouterr()
    assert main(["predict", "--checkpoint", str(run), "--data", str(tmp_path / "test.npy"), "--out", str(out)]) == 0
    assert "accuracy" not in capsys.readouterr().out  # no labels: nothing to score
    rows = list(csv.DictReader(out.open()))
    assert [int(r["id"]) for r in rows] == list(range(40))  # as an .npz's row numbers
    assert sum(int(r["label"]) == t for r, t in zip(rows, y)) / 40 >= 0.9
    labelled = ["--data", str(tmp_path / "test.npy"), "--labels", str(tmp_path / "truth.npy")]
    assert main(["predict", "--checkpoint", str(run), *labelled, "--out", str(tmp_path / "q.csv")]) == 0
    said = capsys.readouterr().out
    assert f"the labels of {tmp_path / 'truth.npy'}" in said
    assert float(said.split("accuracy ")[1].split("%")[0]) >= 90, said


def _refusal(args: list[str], capsys) -> str:
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cnnpar: error: ") and "Traceback" not in err, err
    return lines[0]


def _bad_pairs(folder: Path) -> dict[str, tuple[dict, list[str]]]:
    x, y = bar_images(20)
    return {
        "label_count": ({"x": x, "y": y[:5]}, ["y.npy: shape (5,): expected (20,), one label per image"]),
        "flat_images": ({"x": x.reshape(-1), "y": y}, ["x.npy: shape (5120,): expected (N,H,W)"]),
        "one_number": ({"x": np.array(3.0), "y": y}, ["x.npy: shape (): expected (N,H,W)"]),
        "fractional_labels": ({"x": x, "y": y + 0.5}, ["y.npy: dtype float64: expected integer class labels"]),
        "object_labels": (
            {"x": x, "y": np.array(list(y), dtype=object)},
            ["y.npy: an object array (saved pickled, which cnnpar does not load): expected numbers"],
        ),
    }


@pytest.mark.parametrize("case", sorted(_bad_pairs(Path("."))))
def test_a_bad_npy_pair_is_refused_in_one_line_naming_the_file(tmp_path, capsys, monkeypatch, case):
    arrays, fragments = _bad_pairs(tmp_path)[case]
    np.save(tmp_path / "x.npy", arrays["x"])
    np.save(tmp_path / "y.npy", arrays["y"], allow_pickle=True)
    monkeypatch.chdir(tmp_path)
    line = _refusal(["train", "--data", "x.npy", "--labels", "y.npy", *FAST], capsys)
    for fragment in fragments:
        assert fragment in line, line
    assert not (tmp_path / "runs").exists()


def test_a_npy_without_its_labels_npy_is_refused_for_training_alone(tmp_path, capsys, monkeypatch):
    _save_pair(tmp_path, 20)
    (tmp_path / "labels.csv").write_text("id,label\n0,1\n")
    monkeypatch.chdir(tmp_path)
    line = _refusal(["train", "--data", "x.npy", *FAST], capsys)
    assert "--data x.npy: a .npy holds images only: expected --labels LABELS.npy" in line
    line = _refusal(["train", "--data", "x.npy", "--labels", "labels.csv", *FAST], capsys)
    assert "--labels labels.csv: --data x.npy is a .npy of images: expected --labels LABELS.npy" in line
    line = _refusal(["train", "--data", "x.npy", "--labels", "nothing.npy", *FAST], capsys)
    assert line == "cnnpar: error: --labels nothing.npy: file not found"
    assert not (tmp_path / "runs").exists()


def test_a_npy_s_images_are_read_into_memory_once_not_trained_from_the_file(tmp_path):
    """The images are mapped from the file (no copy read whole before the conversion makes one), and the
    conversion's copy is what trains: the tensor was the file's read-only pages (torch warned), so a file written
    over during the run changed the images under it."""
    from cnnpar.config import DataConfig
    from cnnpar.data.sources import load_data

    images, labels = _save_pair(tmp_path, 32)
    bundle = load_data(DataConfig(source=str(images), labels=str(labels), val_fraction=0))
    kept = bundle.train.x.clone()
    assert bundle.train.x.numpy().flags.writeable
    with images.open("r+b") as f:  # the pixels after the .npy header, written over in place
        f.seek(-1000, 2)
        f.write(b"\xff" * 1000)
    assert np.array_equal(bundle.train.x.numpy(), kept.numpy())


def test_a_npy_is_told_from_an_npz_by_its_first_bytes_not_by_a_zip_record_in_its_pixels(tmp_path, capsys):
    """np.load's own test: an .npz renamed x.npy is refused naming it, and a .npy whose last pixels happen to hold a
    zip's end-record signature (zipfile.is_zipfile searches a file's last 64 KiB for it) trains as the .npy it is:
    it was refused as "a zip archive (an .npz?)"."""
    from cnnpar.config import DataConfig
    from cnnpar.data.sources import load_data

    x, y = bar_images(32)
    x[-1, -3, :4] = np.frombuffer(b"PK\x05\x06", np.uint8)  # 48 bytes before the end: the rest reads as its record
    np.save(tmp_path / "x.npy", x)
    assert zipfile.is_zipfile(tmp_path / "x.npy")  # what the reader asked
    np.save(tmp_path / "y.npy", y)
    bundle = load_data(DataConfig(source=str(tmp_path / "x.npy"), labels=str(tmp_path / "y.npy"), val_fraction=0))
    assert np.array_equal(bundle.train.x[:, 0].numpy(), x)
    np.savez(tmp_path / "d.npz", x_train=x, y_train=y)
    (tmp_path / "d.npz").rename(tmp_path / "z.npy")
    line = _refusal(["train", "--data", str(tmp_path / "z.npy"), "--labels", str(tmp_path / "y.npy"), *FAST], capsys)
    assert line.endswith("z.npy: a zip archive (an .npz?), not a .npy array: expected numpy.save output"), line


def _npy_bytes(array: np.ndarray, version=None) -> bytes:
    f = io.BytesIO()
    np.lib.format.write_array(f, array, version=version)
    return f.getvalue()


@pytest.mark.parametrize(
    "which, cut",
    [("x", "tail"), ("x", "second_array"), ("x", "short"), ("y", "tail"), ("x_v2", "tail"), ("x_fortran", "tail")],
)
def test_a_npy_whose_size_is_not_its_declared_array_is_refused_naming_both(tmp_path, capsys, monkeypatch, which, cut):
    """numpy reads the count a .npy's header declares and ignores the rest: a file cut from a bigger one, or two
    np.save calls into one file, trained on part of the data without a word; one too short failed in mmap's words."""
    x, y = bar_images(20)
    arrays = {"x": (x, None), "y": (y, None), "x_v2": (x, (2, 0)), "x_fortran": (np.asfortranarray(x), None)}
    array, version = arrays[which]
    whole = _npy_bytes(array, version)
    start = len(whole) - array.nbytes
    body = {"tail": whole + whole[start : start + 40], "second_array": whole + whole, "short": whole[:-40]}[cut]
    name = "x.npy" if which.startswith("x") else "y.npy"
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    (tmp_path / name).write_bytes(body)
    monkeypatch.chdir(tmp_path)
    line = _refusal(["train", "--data", "x.npy", "--labels", "y.npy", *FAST], capsys)
    shape = f"shape {array.shape} {array.dtype}, {array.nbytes:,} bytes after its {start:,}-byte header"
    expected = f"{name}: its header declares {shape} ({len(whole):,} in all), and the file holds {len(body):,}"
    assert expected in line, line
    assert not (tmp_path / "runs").exists()
    # as it saved them, the same arrays train
    (tmp_path / name).write_bytes(whole)
    assert main(["train", "--data", "x.npy", "--labels", "y.npy", "--name", "whole", *FAST]) == 0


def test_predict_refuses_a_npy_longer_than_its_declared_array(trained, tmp_path, capsys):
    _, run, _ = trained
    x, y = bar_images(40, seed=7)
    np.save(tmp_path / "test.npy", x)
    np.save(tmp_path / "truth.npy", y)
    with (tmp_path / "truth.npy").open("ab") as f:  # a second np.save into the same file
        np.save(f, y)
    args = ["predict", "--checkpoint", str(run), "--data", str(tmp_path / "test.npy"), "--out", str(tmp_path / "p.csv")]
    line = _refusal([*args, "--labels", str(tmp_path / "truth.npy")], capsys)
    assert f"truth.npy: its header declares shape (40,) {y.dtype}" in line, line
    assert not (tmp_path / "p.csv").exists()
