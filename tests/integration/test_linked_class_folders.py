"""A class folder that is a link to another class folder of the same split, or to a folder holding one or inside one,
is the same images under two labels: refused in one line naming the link, by the one scan that train, prepare and
their checks use (folder.scan_folder). A class folder linked to a folder outside the data set (or above it) is a class
of its own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cnnpar.data.folder import scan_splits
from cnnpar.errors import DataError
from tests.conftest import run_cli
from tests.datafiles import write_image_folder


@pytest.mark.parametrize(
    "target, said, labels",
    [
        # dog -> class0: class0's images would be read again as dog
        ("class0", "{root}/dog: the same folder as {root}/class0 (a link)", "class0 and dog"),
        # dog -> . : every other class's images would be read again as dog
        (".", "{root}/dog: a link to {root}, which holds {root}/class0", "dog and class0"),
    ],
    ids=["sibling-class", "split-folder"],
)
def test_a_class_linked_to_a_sibling_class_or_its_split_folder_is_refused_naming_the_link(
    tmp_path, target, said, labels
):
    root = write_image_folder(tmp_path / "photos", per_class=2, classes=2)
    os.symlink(target, root / "dog")
    with pytest.raises(DataError) as e:
        scan_splits(root)
    assert str(e.value).startswith(said.format(root=root))
    assert f"two labels ({labels})" in str(e.value)


def test_a_linked_class_inside_train_is_refused_too(tmp_path):
    root = tmp_path / "photos"
    write_image_folder(root / "train", per_class=2, classes=2)
    write_image_folder(root / "val", per_class=1, classes=2)
    os.symlink("class1", root / "train" / "zebra")  # sorts after the folder it leads to
    with pytest.raises(DataError, match="train/zebra: the same folder as .*train/class1"):
        scan_splits(root)


def test_a_class_linked_to_a_folder_outside_the_data_set_is_a_class(tmp_path):
    root = write_image_folder(tmp_path / "photos", per_class=2, classes=2)
    outside = write_image_folder(tmp_path / "more", per_class=3, classes=1) / "class0"
    os.symlink(outside, root / "extra")
    files, labels, _, classes = scan_splits(root)
    assert classes == ["class0", "class1", "extra"]
    assert labels.count(2) == 3 and all(
        os.path.realpath(f).startswith(str(outside)) for f, k in zip(files, labels) if k == 2
    )


def test_a_class_linked_into_another_class_is_refused(tmp_path):
    root = tmp_path / "photos"
    write_image_folder(root / "train", per_class=2, classes=2)
    write_image_folder(root / "val", per_class=1, classes=3)
    write_image_folder(root / "train" / "class0", per_class=1, classes=1)  # train/class0/class0/0.jpg
    os.symlink("class0/class0", root / "train" / "class2")
    with pytest.raises(
        DataError, match=r"train/class2: a link to .*train/class0/class0, which is inside .*train/class0"
    ):
        scan_splits(root)


def test_a_class_linked_to_a_folder_above_the_data_set_is_a_class(tmp_path):
    # the walk does not go back down into photos/ (image_files), so no class is read twice
    root = write_image_folder(tmp_path / "photos", per_class=2, classes=2)
    write_image_folder(tmp_path, per_class=1, classes=1)  # tmp_path/class0/0.jpg beside photos/
    os.symlink("..", root / "up")
    files, labels, _, classes = scan_splits(root)
    assert classes == ["class0", "class1", "up"]
    assert [f.relative_to(root) for f, k in zip(files, labels) if k == 2] == [Path("up", "class0", "0.jpg")]
    assert len({os.path.realpath(f) for f in files}) == len(files)


def test_a_class_linked_to_a_folder_outside_trains(tmp_path):
    write_image_folder(tmp_path / "photos", per_class=2, classes=2)
    outside = write_image_folder(tmp_path / "more", per_class=2, classes=1) / "class0"
    os.symlink(outside, tmp_path / "photos" / "extra")
    done = run_cli(["train", "--data", "photos", "--epochs", "1", "--workers", "0"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert list((tmp_path / "runs").glob("*/ckpt/*.pt"))


@pytest.mark.parametrize("command", [["train", "--epochs", "1", "--workers", "0"], ["prepare", "--out", "p.cnnpar"]])
def test_train_and_prepare_stop_in_one_line_before_any_work(tmp_path, command):
    write_image_folder(tmp_path / "photos", per_class=2, classes=2)
    os.symlink("class1", tmp_path / "photos" / "cat")
    data = ["--data", "photos"] if command[0] == "train" else ["photos"]
    done = run_cli([command[0], *data, *command[1:]], tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert (
        "photos/cat: the same folder as" in done.stderr and "expected each class in a folder of its own" in done.stderr
    )
    assert not (tmp_path / "p.cnnpar").exists() and not list((tmp_path / "runs").glob("*/ckpt/*.pt"))
