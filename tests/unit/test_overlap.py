"""Validation files that are training files (hard links across the split) are found, named and carried to
the run's last line; a folder of distinct files says nothing."""

from __future__ import annotations

import os
from pathlib import Path

from cnnpar.config import Config, DataConfig
from cnnpar.data import load_data
from cnnpar.data.overlap import same_file_groups, shared_ids
from tests.datafiles import write_image_folder


def linked_copies(src: Path, dst: Path, copies: int) -> Path:
    """`copies` hard links of each of src's images, under the same class folders (a benchmark's x80 folder)."""
    for f in sorted(src.glob("*/*")):
        (dst / f.parent.name).mkdir(parents=True, exist_ok=True)
        for i in range(copies):
            os.link(f, dst / f.parent.name / f"{i}_{f.name}")
    return dst


def test_a_hold_out_of_hard_linked_copies_is_named_with_a_count_and_an_example(tmp_path):
    src = write_image_folder(tmp_path / "src", per_class=4, classes=2)
    rep = linked_copies(src, tmp_path / "rep", copies=5)  # 40 paths, 8 files
    bundle = load_data(DataConfig(source=str(rep), val_fraction=0.5), seed=0)
    val, train = bundle.val.files, bundle.train.files
    files = [*val, *train]
    count, pair = shared_ids(same_file_groups(files), range(len(val), len(files)), range(len(val)))
    v, t = files[pair[0]], files[pair[1]]
    inodes = {os.stat(p).st_ino for p in train}
    assert count == sum(os.stat(p).st_ino in inodes for p in val) > 0  # exactly the val files with a train twin
    assert os.path.samefile(v, t) and v in val and t in train
    assert bundle.val_overlap.startswith(f"warning: {count:,} of {len(val):,} validation files are the same files")
    assert str(v) in bundle.val_overlap and str(t) in bundle.val_overlap


def test_symbolic_links_count_as_the_same_file_too(tmp_path):
    src = write_image_folder(tmp_path / "src", per_class=4, classes=2)
    for f in sorted(src.glob("*/*")):  # 5 symbolic links to each image
        (tmp_path / "sym" / f.parent.name).mkdir(parents=True, exist_ok=True)
        for i in range(5):
            (tmp_path / "sym" / f.parent.name / f"{i}_{f.name}").symlink_to(f)
    bundle = load_data(DataConfig(source=str(tmp_path / "sym"), val_fraction=0.5), seed=0)
    assert bundle.val_overlap.startswith("warning: ") and "validation files are the same files" in bundle.val_overlap
    # a val/ split that is a link to train/: every validation file is a training file
    split = tmp_path / "split"
    split.mkdir()
    (split / "train").symlink_to(src)
    (split / "val").symlink_to(src)
    bundle = load_data(DataConfig(source=str(split)), seed=0)
    assert bundle.val_overlap.startswith(f"warning: {len(bundle.val)} of {len(bundle.val)} validation files")


def test_distinct_files_and_links_within_one_side_say_nothing(tmp_path):
    plain = write_image_folder(tmp_path / "plain", per_class=4, classes=2)
    assert load_data(DataConfig(source=str(plain), val_fraction=0.5), seed=0).val_overlap == ""
    # the folder's own val/ split made of distinct files, while train/ holds links of its own files
    src = write_image_folder(tmp_path / "src", per_class=3, classes=2)
    linked_copies(src, tmp_path / "split" / "train", copies=2)
    write_image_folder(tmp_path / "split" / "val", per_class=2, classes=2)
    bundle = load_data(DataConfig(source=str(tmp_path / "split")), seed=0)
    assert (
        bundle.val_from == "the folder's own validation split (its val/, valid/, validation/ or test/)"
        and bundle.val_overlap == ""
    )
    assert load_data(DataConfig(source=str(plain), val_fraction=0.0), seed=0).val_overlap == ""


def test_the_run_prints_the_warning_and_its_last_line_carries_it(tmp_path, cli):
    src = write_image_folder(tmp_path / "src", per_class=4, classes=2, side=32)
    rep = linked_copies(src, tmp_path / "rep", copies=4)
    res = cli(
        "train",
        "--data",
        str(rep),
        "--model",
        "cnn3",
        "--epochs",
        "1",
        "--batch-size",
        "8",
        "--image-size",
        "32",
        "--no-progress",
        "--no-tensorboard",
        "--out-dir",
        str(tmp_path / "runs"),
    )
    assert res.returncode == 0, res.stderr
    assert "validation files are the same files as training ones (links" in res.stdout
    done = next(line for line in res.stdout.splitlines() if line.startswith("done:"))
    assert "(validation holds training files: see the warning above)" in done
    assert Config().data.val_fraction > 0  # the default hold-out is what put the links on both sides


def test_a_store_keeps_its_linked_files_and_a_hold_out_from_it_is_checked_like_the_folder(tmp_path, cli):
    src = write_image_folder(tmp_path / "src", per_class=4, classes=2, side=24)
    rep = linked_copies(src, tmp_path / "rep", copies=3)  # 24 names, 8 files
    res = cli("prepare", str(rep), "--out", str(tmp_path / "rep.cnnpar"), "--max-side", "32", "--no-progress")
    assert res.returncode == 0, res.stderr
    assert "note: 24 of the images are 8 files under several names (hard or symbolic links)" in res.stdout
    folder = load_data(DataConfig(source=str(rep), val_fraction=0.5), seed=3)
    store = load_data(DataConfig(source=str(tmp_path / "rep.cnnpar"), val_fraction=0.5), seed=3)
    count = int(folder.val_overlap.split()[1])  # "warning: N of M validation files ..."
    assert count > 0  # the same seed holds out the same images from the store as from the folder
    assert store.val_overlap.startswith(f"warning: {count:,} of {len(store.val):,} validation files are the same")
    assert "the store's images" in store.val_overlap
    plain = write_image_folder(tmp_path / "plain", per_class=4, classes=2, side=24)
    res = cli("prepare", str(plain), "--out", str(tmp_path / "plain.cnnpar"), "--max-side", "32", "--no-progress")
    assert res.returncode == 0 and "note:" not in res.stdout
    assert load_data(DataConfig(source=str(tmp_path / "plain.cnnpar"), val_fraction=0.5), seed=3).val_overlap == ""
