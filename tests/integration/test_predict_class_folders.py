"""`cnnpar predict --data photos/val`: a hold-out of class folders, the layout `cnnpar train` reads, is labelled by
its folders' names. It was predicted with no accuracy; now it is scored as a CSV's labels or an .npz's y_test are,
where its folders are the run's classes (all or some), and a folder that is no class of the run is named in one
line, with no accuracy, rather than scored against labels that are not the run's."""

from __future__ import annotations

import csv
import shutil
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cnnpar.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

CLASSES = ("cat", "dog", "owl")


def _photos(root: Path, classes=CLASSES) -> Path:
    """root/train|val/<class>/: seeded noise around a grey level of its own per class, so the run learns some."""
    g = np.random.default_rng(0)
    for split, n in (("train", 6), ("val", 3)):
        for k, name in enumerate(classes):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(n):
                pixels = np.clip(g.normal(30 + 90 * k, 20, (12, 14, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
    return root


def _train(root: Path, runs: Path, name: str) -> Path:
    args = ["--epochs", "2", "--workers", "0", "--image-size", "8", "--device", "cpu", "--no-tensorboard"]
    assert main(["train", "--data", str(root), "--out-dir", str(runs), "--name", name, *args]) == 0
    return runs / name


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("classfolders")
    root = _photos(tmp / "photos")
    return root, _train(root, tmp / "runs", "r")


def _predict(run_dir: Path, data: Path, out: Path) -> int:
    return main(["predict", "--checkpoint", str(run_dir), "--data", str(data), "--device", "cpu", "--out", str(out)])


def _rows(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _scored(rows: list[dict]) -> tuple[int, int]:
    """Right and total, each row's true class the folder its id names."""
    return sum(r["class_name"] == r["id"].split("/")[0] for r in rows), len(rows)


def _said(out: str) -> list[str]:
    return [line for line in out.splitlines() if not line.startswith(("checkpoint:", "wrote "))]


def _assert_scored(run_dir: Path, folder: Path, out: Path, capsys, images: int) -> None:
    """predict on `folder` exits 0, writes `images` rows and says only the accuracy line of those rows."""
    capsys.readouterr()
    assert _predict(run_dir, folder, out) == 0
    right, n = _scored(_rows(out))
    assert n == images
    assert _said(capsys.readouterr().out) == [
        f"accuracy {100 * right / n:.2f}% ({right}/{n}) against its class folders' names of {folder}"
    ]


def test_predict_scores_a_split_s_class_folders_against_their_names(tmp_path, capsys, run):
    root, run_dir = run
    _assert_scored(run_dir, root / "val", tmp_path / "p.csv", capsys, images=9)


def test_predict_scores_a_hold_out_that_lacks_a_class(tmp_path, capsys, run):
    root, run_dir = run
    held = shutil.copytree(root / "val", tmp_path / "held")
    shutil.rmtree(held / "cat")  # owl stays index 2 though it is the folder's second class
    _assert_scored(run_dir, held, tmp_path / "p.csv", capsys, images=6)


def test_predict_names_folders_that_are_no_class_of_the_run_and_scores_nothing(tmp_path, capsys, run):
    root, run_dir = run
    held = shutil.copytree(root / "val", tmp_path / "held")
    (held / "owl").rename(held / "Owl")
    shutil.copytree(held / "dog", held / "emu")
    capsys.readouterr()
    out = tmp_path / "p.csv"
    assert _predict(run_dir, held, out) == 0
    assert len(_rows(out)) == 12  # every image still predicted
    assert _said(capsys.readouterr().out) == [
        f"{held}: not scored: its folder(s) 'Owl', 'emu' are not among the model's classes ('cat', 'dog', 'owl'): "
        "expected class folders named as the run's classes"
    ]


def test_predict_on_a_split_layout_names_its_held_out_split(tmp_path, capsys, run):
    root, run_dir = run
    capsys.readouterr()
    assert _predict(run_dir, root, tmp_path / "p.csv") == 0
    said = _said(capsys.readouterr().out)
    assert said == [
        f"{root}: not scored: its folder(s) 'train', 'val' are not among the model's classes ('cat', 'dog', 'owl'): "
        f"expected class folders named as the run's classes (--data {root / 'val'} scores its held-out split)"
    ]


def test_predict_does_not_score_images_beside_the_class_folders(tmp_path, capsys, run):
    root, run_dir = run
    held = shutil.copytree(root / "val", tmp_path / "held")
    shutil.copy(held / "cat" / "0.png", held / "stray.png")
    capsys.readouterr()
    assert _predict(run_dir, held, tmp_path / "p.csv") == 0
    assert _said(capsys.readouterr().out) == [
        f"{held}: not scored: 1 image(s) lie beside its class folders, without a label (first: stray.png): expected "
        "every image inside a class folder"
    ]


def test_predict_on_a_flat_folder_stays_unscored_and_silent(tmp_path, capsys, run):
    root, run_dir = run
    flat = tmp_path / "flat"
    flat.mkdir()
    for f in (root / "val" / "dog").iterdir():
        shutil.copy(f, flat / f.name)
    (flat / "thumbs").mkdir()  # a subfolder named as no class, beside loose images: still a flat folder
    shutil.copy(flat / "0.png", flat / "thumbs" / "0.png")
    capsys.readouterr()
    assert _predict(run_dir, flat, tmp_path / "p.csv") == 0
    assert _said(capsys.readouterr().out) == []


def test_predict_on_the_run_s_own_training_folder_says_it_is_not_held_out(tmp_path, capsys, run):
    root, run_dir = run
    capsys.readouterr()
    assert _predict(run_dir, root / "train", tmp_path / "p.csv") == 0
    (line,) = _said(capsys.readouterr().out)
    assert line.startswith("accuracy ") and line.endswith(
        ": the folder the run trained on, its training images among them, so not a held-out score"
    )


def test_predict_scores_numbered_class_folders_by_their_names(tmp_path, capsys):
    """Folders 1, 2, 10 sort as text (1, 10, 2): folder 10 is class index 1. Its labels are indices already; read as
    class numbers they were mapped again, and scored against the wrong classes."""
    root = _photos(tmp_path / "photos", classes=("1", "2", "10"))
    run_dir = _train(root, tmp_path / "runs", "n")
    capsys.readouterr()
    out = tmp_path / "p.csv"
    assert _predict(run_dir, root / "val", out) == 0
    rows = _rows(out)
    right, n = _scored(rows)
    assert {r["label"] for r in rows} <= {"1", "2", "10"}
    assert f"({right}/{n}) against its class folders' names of {root / 'val'}" in capsys.readouterr().out


def test_class_folder_names_match_the_run_s_classes_as_val_matches_train():
    from cnnpar.data.sources import class_folder_labels

    root = Path("/held")
    nfd = unicodedata.normalize("NFD", "café")  # copied from macOS
    files = [root / nfd / "a.jpg", root / "07" / "b.jpg", root / "dog" / "deep" / "c.png"]
    assert class_folder_labels(root, files, ["café", "dog", "7"]) == [0, 2, 1]
    unscored: list[str] = []
    assert class_folder_labels(root, files, ["cat", "dog"], unscored) is None
    assert len(unscored) == 1 and f"its folder(s) '07', {nfd!r} are not among" in unscored[0]
    assert class_folder_labels(root, files, None) is None  # a checkpoint without class names: nothing to match


def test_predict_knows_the_run_s_training_folder_whatever_folder_it_runs_in(tmp_path, capsys, monkeypatch):
    """A run trained on `--data photos` (a relative path) records "photos": predict read it from its own working
    folder, so the run's folder given from elsewhere was scored as a hold-out, and another folder named photos where
    predict ran was called the run's training folder."""
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    _photos(home / "photos")
    monkeypatch.chdir(home)
    run_dir = _train(Path("photos"), tmp_path / "runs", "r")
    note = ": the folder the run trained on, its training images among them, so not a held-out score"
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert _predict(run_dir, home / "photos" / "train", tmp_path / "p.csv") == 0
    (line,) = _said(capsys.readouterr().out)
    assert line.startswith("accuracy ") and line.endswith(note)
    shutil.copytree(home / "photos" / "val", elsewhere / "photos" / "train")  # held out, named as the run's folder
    monkeypatch.chdir(elsewhere)
    assert _predict(run_dir, Path("photos") / "train", tmp_path / "q.csv") == 0
    (line,) = _said(capsys.readouterr().out)
    assert line.startswith("accuracy ") and not line.endswith(note)
