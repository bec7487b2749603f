"""A flat folder of images labelled by a CSV (`--data train/ --labels labels.csv`, Kaggle's layout): trained through
the class folders' own path, or refused in one line naming the CSV, its line and its column."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from cnnpar.cli import main
from cnnpar.config import DataConfig
from cnnpar.data import load_data
from cnnpar.data.store import StoreFile
from cnnpar.data.store_write import prepare_store
from cnnpar.errors import DataError

pytestmark = pytest.mark.usefixtures("one_thread")  # one intra-op thread for the in-process runs (conftest)


def _flat(tmp, names, suffix=".jpg"):
    """tiny images under tmp/train, one a name, brighter by their index so that classes differ"""
    root = tmp / "train"
    root.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        pixels = np.full((12, 12, 3), 20 * (i % 5), np.uint8)
        Image.fromarray(pixels).save(root / f"{name}{suffix}")
    return root


def _csv(tmp, text, name="labels.csv"):
    path = tmp / name
    path.write_text(text)
    return path


def _train(tmp, root, labels, *more):
    args = ["--epochs", "1", "--workers", "0", "--image-size", "8", "--out-dir", str(tmp / "runs"), "--no-tensorboard"]
    return main(["train", "--data", str(root), "--labels", str(labels), *args, *more])


def test_string_labels_kaggle_ids_without_extension_train_one_epoch(tmp_path, capsys):
    ids = [f"000bec18{i:02d}" for i in range(10)]
    root = _flat(tmp_path, ids)
    breeds = ["pug", "beagle", "husky"]
    labels = _csv(tmp_path, "id,breed\n" + "".join(f"{n},{breeds[i % 3]}\n" for i, n in enumerate(ids)))
    bundle = load_data(DataConfig(source=str(root), labels=str(labels), image_size=8, val_fraction=0.2))
    assert bundle.class_names == ["beagle", "husky", "pug"]  # sorted, as class folders are
    assert len(bundle.train) + len(bundle.val) == 10 and len(bundle.val) == 2  # the --val-fraction hold-out
    assert bundle.classes_from == f"the labels of {labels}"
    pairs = dict(zip(bundle.train.files + bundle.val.files, bundle.train.labels.tolist() + bundle.val.labels.tolist()))
    assert pairs[root / f"{ids[0]}.jpg"] == 2 and pairs[root / f"{ids[1]}.jpg"] == 0
    assert _train(tmp_path, root, labels) == 0
    assert "classes: 3 (the labels of" in capsys.readouterr().out


def test_integer_labels_are_classes_in_numeric_order_and_a_label_column_wins(tmp_path):
    root = _flat(tmp_path, [str(n) for n in range(1, 13)], suffix=".png")  # CIFAR-10 on Kaggle: train/<n>.png
    rows = "".join(f"{n},x,{[2, 10, 1][n % 3]}\n" for n in range(1, 13))
    labels = _csv(tmp_path, "id,other,Label\n" + rows)
    bundle = load_data(DataConfig(source=str(root), labels=str(labels), image_size=8, val_fraction=0))
    assert bundle.class_names == ["1", "2", "10"]  # numeric order, not text order (1, 10, 2)
    by_file = dict(zip(bundle.train.files, bundle.train.labels.tolist()))
    assert by_file[root / "3.png"] == 1 and by_file[root / "1.png"] == 2 and by_file[root / "2.png"] == 0
    assert _train(tmp_path, root, labels) == 0


def test_cactus_style_zero_one_labels_with_file_names_train(tmp_path):
    names = [f"c{i}" for i in range(8)]
    root = _flat(tmp_path, names)
    labels = _csv(tmp_path, "id,has_cactus\n" + "".join(f"{n}.jpg,{i % 2}\n" for i, n in enumerate(names)))
    bundle = load_data(DataConfig(source=str(root), labels=str(labels), image_size=8))
    assert bundle.class_names == ["0", "1"]
    assert _train(tmp_path, root, labels) == 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("id,breed\na,pug\nb,husky\nzz,pug\nyy,pug\n", "labels.csv: line 4: column 'id' 'zz': no image of that name"),
        ("id,breed\na,pug\nb,husky\na,pug\n", "labels.csv: line 4: column 'id' 'a' names a.jpg, as line 2 does"),
        ("id,breed\na,pug\nb,\n", "labels.csv: line 3: column 'breed' is empty for 'b': expected its label"),
        # an unquoted comma in a label ("Yorkshire, terrier") was read as its first half, the rest dropped unsaid
        ("id,breed\na,pug\nb,Yorkshire, terrier\n", "labels.csv: line 3: 3 values: expected 2, one per column of"),
        ("id,breed\na,pug\nb,husky\nc,pug\n", "labels.csv: line 4: column 'id' 'c' matches 2 images"),
        ("id,cat,dog,pug\na,1,0,0\n", "labels.csv: line 1: columns 'id', 'cat', 'dog', 'pug': no column named 'label'"),
    ],
)
def test_bad_labels_csv_is_refused_in_one_line_naming_file_line_and_column(tmp_path, text, expected):
    root = _flat(tmp_path, ["a", "b", "c"])
    Image.fromarray(np.zeros((12, 12, 3), np.uint8)).save(root / "c.png")  # c.jpg and c.png: one id, two files
    labels = _csv(tmp_path, text)
    with pytest.raises(DataError) as e:
        load_data(DataConfig(source=str(root), labels=str(labels), image_size=8))
    message = str(e.value)
    assert "\n" not in message and str(tmp_path / expected) in message
    if "no image" in expected:
        assert "2 row(s) have none: zz, yy" in message


def test_empty_values_past_the_header_are_no_dropped_values(tmp_path):
    """A trailing comma on each row (`a,pug,`, as some exports write them) drops no value: the rows are read, while
    a value there is refused (the cases above)."""
    root = _flat(tmp_path, ["a", "b"])
    labels = _csv(tmp_path, "id,breed\na,pug,\nb,husky, ,\n")
    bundle = load_data(DataConfig(source=str(root), labels=str(labels), image_size=8, val_fraction=0))
    assert dict(zip(bundle.train.files, bundle.train.labels.tolist())) == {root / "a.jpg": 1, root / "b.jpg": 0}


def test_bad_labels_csv_stops_train_with_its_line(tmp_path, capsys):
    root = _flat(tmp_path, ["a", "b"])
    labels = _csv(tmp_path, "id,breed\na,pug\nb,\n")
    assert _train(tmp_path, root, labels) == 2
    assert f"{labels}: line 3: column 'breed' is empty" in capsys.readouterr().err


def test_images_the_csv_does_not_name_are_warned_about_and_not_read(tmp_path):
    root = _flat(tmp_path, ["a", "b", "c", "d", "e", "f"])
    labels = _csv(tmp_path, "file,label\na,x\nb,y\n")
    bundle = load_data(DataConfig(source=str(root), labels=str(labels), image_size=8, val_fraction=0))
    assert sorted(bundle.train.files) == [root / "a.jpg", root / "b.jpg"]
    assert (
        bundle.load_note
        == f"warning: {root}: 4 image(s) that {labels} does not name are not read (c.jpg, d.jpg, e.jpg, ...)"
    )


def test_labels_beside_data_that_is_not_a_folder_is_refused(tmp_path, capsys):
    npz = tmp_path / "d.npz"
    np.savez(npz, x_train=np.zeros((4, 8, 8), np.uint8), y_train=np.array([0, 1, 0, 1]))
    labels = _csv(tmp_path, "id,label\na,1\n")
    with pytest.raises(DataError, match=r"^--labels .*labels\.csv: --data .*d\.npz is not an image folder"):
        load_data(DataConfig(source=str(npz), labels=str(labels)))
    assert _train(tmp_path, npz, labels) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_prepare_from_a_labelled_flat_folder_and_a_changed_csv_is_noticed(tmp_path):
    names = [f"p{i}" for i in range(6)]
    root = _flat(tmp_path, names)
    labels = _csv(tmp_path, "id,label\n" + "".join(f"{n},{'ab'[i % 2]}\n" for i, n in enumerate(names)))
    out = tmp_path / "s.cnnpar"
    header = prepare_store(root, out, workers=1, progress=False, labels=labels)
    assert header["class_names"] == ["a", "b"] and StoreFile(out).labels.tolist() == [0, 1, 0, 1, 0, 1]
    assert load_data(DataConfig(source=str(out), image_size=8)).load_note == ""
    labels.write_text(labels.read_text().replace("p0,a", "p0,b"))
    assert "changed since" in load_data(DataConfig(source=str(out), image_size=8)).load_note


def test_resume_notices_a_changed_labels_csv(tmp_path, capsys):
    names = [f"r{i}" for i in range(8)]
    root = _flat(tmp_path, names)
    labels = _csv(tmp_path, "id,label\n" + "".join(f"{n},{'ab'[i % 2]}\n" for i, n in enumerate(names)))
    assert _train(tmp_path, root, labels, "--name", "r") == 0
    labels.write_text(labels.read_text().replace("r0,a", "r0,b"))
    assert _train(tmp_path, root, labels, "--name", "r", "--resume", "auto", "--epochs", "2") == 2
    assert "the data changed since the checkpoint" in capsys.readouterr().err


def test_a_flat_folder_without_labels_is_told_of_labels(tmp_path, capsys):
    root = _flat(tmp_path, ["a", "b", "c"])
    args = ["--epochs", "1", "--workers", "0", "--out-dir", str(tmp_path / "runs"), "--no-tensorboard"]
    assert main(["train", "--data", str(root), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"{root}: no class folders: expected root/<class>/<image>.jpg|png, or, as {root} holds 3 image(s) " in err
    assert "itself, --labels CSV: a CSV naming each image and its label" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match=r"no class folders: expected root/<class>/<image>\.jpg\|png$"):
        load_data(DataConfig(source=str(empty)))  # no images there either: no word of --labels


def test_a_row_naming_an_image_of_a_kind_not_read_says_so(tmp_path):
    root = _flat(tmp_path, ["a", "b", "c"])
    Image.fromarray(np.zeros((12, 12, 3), np.uint8)).save(root / "w.webp")
    labels = _csv(tmp_path, "id,breed\na,pug\nb,husky\nc,pug\nw,husky\n")
    with pytest.raises(DataError) as e:
        load_data(DataConfig(source=str(root), labels=str(labels), image_size=8))
    assert str(e.value) == (
        f"{labels}: line 5: column 'id' 'w' names w.webp, an image of a kind cnnpar does not read (1 row(s) name "
        ".webp files): expected a .jpg, .jpeg or .png file (convert them, e.g. Pillow's "
        "Image.open(f).save(f.with_suffix('.png')))"
    )


def test_resume_naming_the_same_csv_by_another_path_records_no_change(tmp_path, monkeypatch):
    names = [f"r{i}" for i in range(8)]
    root = _flat(tmp_path, names)
    _csv(tmp_path, "id,label\n" + "".join(f"{n},{'ab'[i % 2]}\n" for i, n in enumerate(names)))
    monkeypatch.chdir(tmp_path)
    assert _train(tmp_path, root, "labels.csv", "--name", "r") == 0
    assert _train(tmp_path, root, tmp_path / "labels.csv", "--name", "r", "--resume", "auto", "--epochs", "2") == 0
    # where the CSV is, as --data's path, is no training setting: resumes.csv keeps what the epochs trained with
    rows = (tmp_path / "runs" / "r" / "resumes.csv").read_text().splitlines()
    assert rows == ["from_epoch,setting,before,after,note", "2,run.epochs,1,2,"]
