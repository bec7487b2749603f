"""`cnnpar predict --data holdout/ --labels holdout.csv`: a hold-out of the Kaggle layout a run trained on (a flat
folder labelled by a CSV) scored as `cnnpar train --labels` reads it, its classes matched to the run's by name."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from PIL import Image

from cnnpar.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")  # one intra-op thread for the in-process runs (conftest)


def _flat(root, names, suffix=".jpg"):
    root.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        Image.fromarray(np.full((12, 12, 3), 40 * (i % 3), np.uint8)).save(root / f"{name}{suffix}")
    return root


def _run(tmp, labels_of, suffix=".jpg"):
    """A run trained one epoch on tmp/train + train.csv; the hold-out tmp/test + test.csv of the same layout."""
    paths = {}
    for split, n in (("train", 9), ("test", 6)):
        names = [f"{split}{i:02d}" for i in range(n)]
        _flat(tmp / split, names, suffix)
        labels = tmp / f"{split}.csv"
        labels.write_text("id,breed\n" + "".join(f"{name},{labels_of(i)}\n" for i, name in enumerate(names)))
        paths[split] = labels
    args = ["--epochs", "1", "--workers", "0", "--image-size", "8", "--device", "cpu", "--no-tensorboard"]
    train = ["train", "--data", str(tmp / "train"), "--labels", str(paths["train"]), "--out-dir", str(tmp / "runs")]
    assert main([*train, "--name", "r", *args]) == 0
    return tmp / "runs" / "r", paths["test"]


def _predict(tmp, run, *more):
    return main(["predict", "--checkpoint", str(run), "--data", str(tmp / "test"), "--device", "cpu", *more])


def _rows(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _accuracy_line(out):
    return next(line for line in out.splitlines() if line.startswith("accuracy"))


def test_predict_scores_a_labelled_flat_holdout_against_its_csv(tmp_path, capsys):
    breeds = ["pug", "beagle", "husky"]
    run, labels = _run(tmp_path, lambda i: breeds[i % 3])
    Image.fromarray(np.zeros((12, 12, 3), np.uint8)).save(tmp_path / "test" / "extra.jpg")  # not in the CSV
    capsys.readouterr()
    out = tmp_path / "p.csv"
    assert _predict(tmp_path, run, "--labels", str(labels), "--out", str(out)) == 0
    seen = capsys.readouterr()
    rows = _rows(out)
    assert [r["id"] for r in rows] == [f"test{i:02d}.jpg" for i in range(6)]  # the CSV's images, in its order
    right = sum(r["class_name"] == breeds[i % 3] for i, r in enumerate(rows))
    assert _accuracy_line(seen.out) == (
        f"accuracy {100 * right / 6:.2f}% ({right}/6) against the labels of {labels} of {tmp_path / 'test'}"
    )
    assert f"1 image(s) that {labels} does not name are not read (extra.jpg)" in seen.err


def test_predict_labels_of_numbered_classes_are_matched_by_name(tmp_path, capsys):
    # classes '1', '2', '10' (numeric order): the label 10 is class index 2, written as 10, scored as 10
    run, labels = _run(tmp_path, lambda i: [1, 2, 10][i % 3], suffix=".png")
    capsys.readouterr()
    out = tmp_path / "p.csv"
    assert _predict(tmp_path, run, "--labels", str(labels), "--out", str(out)) == 0
    rows = _rows(out)
    assert {r["label"] for r in rows} <= {"1", "2", "10"}
    right = sum(int(r["label"]) == [1, 2, 10][i % 3] for i, r in enumerate(rows))
    assert f"({right}/6) against the labels of {labels}" in _accuracy_line(capsys.readouterr().out)


def test_predict_refuses_a_csv_class_the_run_never_had(tmp_path, capsys):
    run, labels = _run(tmp_path, lambda i: "ab"[i % 2])
    labels.write_text(labels.read_text().replace("test03,b", "test03,corgi"))
    capsys.readouterr()
    assert _predict(tmp_path, run, "--labels", str(labels), "--out", str(tmp_path / "p.csv")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"{labels}: line 5: column 'breed' 'corgi': not a class of the model (it was trained on 2: 'a', 'b')" in err
    assert not (tmp_path / "p.csv").exists()


def test_predict_without_labels_on_a_flat_folder_predicts_every_image_unscored(tmp_path, capsys):
    run, _ = _run(tmp_path, lambda i: "ab"[i % 2])
    capsys.readouterr()
    out = tmp_path / "p.csv"
    assert _predict(tmp_path, run, "--out", str(out)) == 0
    assert len(_rows(out)) == 6 and "accuracy" not in capsys.readouterr().out


def test_predict_labels_beside_data_that_is_not_a_folder_is_refused(tmp_path, capsys):
    run, labels = _run(tmp_path, lambda i: "ab"[i % 2])
    capsys.readouterr()
    assert main(["predict", "--checkpoint", str(run), "--data", "digits", "--labels", str(labels)]) == 2
    assert "--data digits is not an image folder" in capsys.readouterr().err


def test_predict_writes_the_signed_numbers_a_labels_csv_trained_on(tmp_path, capsys):
    """Labels -1, 0, 3 train as classes named '-1', '0', '3' (indices 0, 1, 2); predict took only unsigned digits
    as numbers, so its `label` column held the index 0 beside the class_name -1, where labels 1, 2, 10 wrote 10."""
    run, labels = _run(tmp_path, lambda i: [-1, 0, 3][i % 3], suffix=".png")
    capsys.readouterr()
    out = tmp_path / "p.csv"
    assert _predict(tmp_path, run, "--out", str(out)) == 0
    assert "note: the model's classes are named by numbers (-1, 0, 3)" in capsys.readouterr().err
    rows = _rows(out)
    assert len(rows) == 6 and all(r["label"] == r["class_name"] for r in rows)
    assert {r["label"] for r in rows} <= {"-1", "0", "3"}


def test_class_numbers_read_class_names_as_training_reads_labels():
    from cnnpar.engine.predict import class_numbers

    assert class_numbers(["-1", "0", "3"]) == [-1, 0, 3]  # a labels CSV's classes, in numeric order
    assert class_numbers(["0", "1", "10", "2"]) == [0, 1, 10, 2]  # class folders, sorted as text
    assert class_numbers(["-1", "0", "1"]) == [-1, 0, 1]
    assert class_numbers(["0", "1", "2"]) is None  # every number its index: the index is written
    assert class_numbers(["07", "7"]) is None  # two folders of one number: written as indices
    assert class_numbers(["-1", "cat"]) is None
