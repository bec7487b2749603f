"""Links that read one part of a data set as another: a class folder linked into the other split (`train/dog ->
../val/dog`), which was only reported as "validation files that are training files", and a link inside a class
folder to a sibling class (`photos/Z/dirlink -> ../b`), which read b's images as Z too without a word. Both are
refused in one line naming the link, by the scan train and prepare use (folder.scan_splits); links to folders
outside the data set are read as given."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cnnpar.data.folder import scan_splits
from cnnpar.errors import DataError
from tests.conftest import run_cli
from tests.datafiles import write_image_folder


def two_splits(root: Path) -> Path:
    write_image_folder(root / "train", per_class=2, classes=2)
    write_image_folder(root / "val", per_class=1, classes=2)
    return root


@pytest.mark.parametrize(
    "link, target, said",
    [
        ("train/dog", "../val/class1", "{root}/train/dog: a link to {real}/val/class1, which is inside {root}/val"),
        ("train/dog", "../val", "{root}/train/dog: a link to {real}/val, which is {root}/val"),
        ("train/dog", "..", "{root}/train/dog: a link to {real}, which holds {root}/val"),
        ("val/cat", "../train/class0", "{root}/val/cat: a link to {real}/train/class0, which is inside {root}/train"),
    ],
    ids=["into-val-class", "to-val", "to-data-root", "val-into-train"],
)
def test_a_class_folder_linked_into_the_other_split_is_refused_naming_the_link(tmp_path, link, target, said):
    root = two_splits(tmp_path / "photos")
    os.symlink(target, root / link)
    with pytest.raises(DataError) as e:
        scan_splits(root)
    assert str(e.value).startswith(said.format(root=root, real=os.path.realpath(root)))
    assert "\n" not in str(e.value) and "split's images would be read as" in str(e.value)


def test_class_folders_linked_outside_the_data_set_stay_classes_in_both_splits(tmp_path):
    root = two_splits(tmp_path / "photos")
    outside = write_image_folder(tmp_path / "more", per_class=1, classes=1) / "class0"
    os.symlink(outside, root / "train" / "extra")
    os.symlink(outside, root / "val" / "extra")
    _, labels, splits, classes = scan_splits(root)
    assert classes == ["class0", "class1", "extra"]
    assert [s for s, k in zip(splits, labels) if k == 2] == [0, 1]


@pytest.mark.parametrize("command", [["train", "--epochs", "1", "--workers", "0"], ["prepare", "--out", "p.cnnpar"]])
def test_train_and_prepare_stop_in_one_line_on_a_class_linked_across_splits(tmp_path, command):
    two_splits(tmp_path / "photos")
    os.symlink("../val/class1", tmp_path / "photos" / "train" / "dog")
    data = ["--data", "photos"] if command[0] == "train" else ["photos"]
    done = run_cli([command[0], *data, *command[1:]], tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "photos/train/dog: a link to" in done.stderr and "which is inside" in done.stderr
    assert not (tmp_path / "p.cnnpar").exists() and not list((tmp_path / "runs").glob("*/ckpt/*.pt"))


@pytest.mark.parametrize(
    "layout, link, target, inside",
    [
        ("flat", "class0/dirlink", "../class1", "class1"),  # a sibling class: its images would be class0's too
        ("flat", "class0/sub/deep", "../../class1", "class1"),
        ("flat", "class0/pool", "../__pool", "."),  # a folder of the data set that is no class
        ("split", "train/class0/other", "../../val/class1", "val"),  # the other split
    ],
    ids=["sibling", "deeper", "split-folder", "other-split"],
)
def test_a_link_inside_a_class_folder_into_the_data_set_is_refused_naming_it(tmp_path, layout, link, target, inside):
    root = tmp_path / "photos"
    if layout == "flat":
        write_image_folder(root, per_class=2, classes=2)
        write_image_folder(root / "__pool", per_class=1, classes=1)
        (root / "class0" / "sub").mkdir()
    else:
        two_splits(root)
    os.symlink(target, root / link)
    with pytest.raises(DataError) as e:
        scan_splits(root)
    where = os.path.normpath(root / inside)
    assert str(e.value).startswith(f"{root / link}: a link to {os.path.realpath(root / link)}, inside {where}: ")
    assert "\n" not in str(e.value)


def test_a_link_in_a_class_up_to_the_data_set_root_is_not_followed(tmp_path):
    # the walk does not go back up into a folder it is inside (image_files): val/ is not read through it
    root = two_splits(tmp_path / "photos")
    os.symlink("../..", root / "train" / "class0" / "up")
    files, _, splits, _ = scan_splits(root)
    assert len(files) == 6 and splits.count(1) == 2 and not any("up" in f.parts for f in files)


def test_links_inside_a_class_folder_to_its_own_folders_or_outside_are_read(tmp_path):
    root = write_image_folder(tmp_path / "photos", per_class=2, classes=2)
    write_image_folder(root / "class0" / "sub", per_class=1, classes=1)
    os.symlink("sub/class0", root / "class0" / "again")  # within the class: its own images twice, one label
    os.symlink(write_image_folder(tmp_path / "more", per_class=1, classes=1) / "class0", root / "class1" / "more")
    files, labels, _, _ = scan_splits(root)
    assert root / "class0" / "again" / "0.jpg" in files and root / "class1" / "more" / "0.jpg" in files
    assert labels.count(0) == 4 and labels.count(1) == 3


def test_a_class_linked_into_a_hidden_folder_of_another_class_is_a_class(tmp_path):
    # the walk skips hidden folders, so class0 never reads class2's images
    root = write_image_folder(tmp_path / "photos", per_class=2, classes=2)
    write_image_folder(root / "class0" / ".cache", per_class=1, classes=1)
    os.symlink("class0/.cache/class0", root / "class2")
    files, labels, _, classes = scan_splits(root)
    assert classes == ["class0", "class1", "class2"] and labels.count(2) == 1
    assert len({os.path.realpath(f) for f in files}) == len(files)


def test_a_class_inside_another_is_still_refused_beside_one_linked_into_its_hidden_folder(tmp_path):
    root = write_image_folder(tmp_path / "photos", per_class=2, classes=2)
    write_image_folder(root / "class0" / ".cache", per_class=1, classes=1)
    write_image_folder(root / "class0" / "sub", per_class=1, classes=1)
    os.symlink("class0/.cache/class0", root / "class2")
    os.symlink("class0/sub/class0", root / "class3")
    with pytest.raises(DataError, match=r"photos/class3: a link to .*class0/sub/class0, which is inside .*/class0: "):
        scan_splits(root)
