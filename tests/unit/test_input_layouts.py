"""Data laid out as people download it (Kaggle's split folders, sorted CSV columns, byte-string names, odd file
names): read as meant, or refused in one line that says what was expected."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from cnnpar.config import DataConfig
from cnnpar.data import load_data, load_predict_data
from cnnpar.data.csv_source import read_pixel_csv
from cnnpar.data.folder import scan_splits, unread_splits_note
from cnnpar.data.store_write import prepare_store
from cnnpar.errors import DataError
from tests.datafiles import bar_images, write_image_folder

pytestmark = pytest.mark.usefixtures("one_thread")  # one intra-op thread for the in-process runs (conftest)


@pytest.mark.parametrize(("train", "held"), [("Training", "Testing"), ("Train", "Test"), ("TRAIN", "Val")])
def test_split_folders_in_any_case_and_kaggles_training_testing_are_splits_not_classes(tmp_path, train, held):
    """Kaggle's brain-tumour MRI set (Training/ + Testing/) trained as two classes, its four merged."""
    root = tmp_path / "mri"
    write_image_folder(root / train, per_class=2, classes=3)
    write_image_folder(root / held, per_class=1, classes=3)
    bundle = load_data(DataConfig(source=str(root), image_size=8))
    assert bundle.class_names == ["class0", "class1", "class2"]
    assert (len(bundle.train), len(bundle.val)) == (6, 3)
    header = prepare_store(root, tmp_path / "mri.cnnpar", 32, workers=1, progress=False)
    assert header["class_names"] == ["class0", "class1", "class2"] and header["splits"] == {"train": 6, "val": 3}
    _, ids, _ = load_predict_data(str(root))  # predict lists every image under the folder, split folders and all
    assert len(ids) == 9 and all(i.startswith((train + "/", held + "/")) for i in ids)


def test_a_second_held_out_folder_in_another_case_is_named_and_a_second_train_folder_refused(tmp_path):
    root = tmp_path / "d"
    write_image_folder(root / "Training", per_class=2, classes=2)
    write_image_folder(root / "Testing", per_class=1, classes=2)
    write_image_folder(root / "Validation", per_class=1, classes=2)
    _, _, splits, _ = scan_splits(root)
    assert sum(splits) == 2  # Validation/ comes before Testing/ in the preference order
    assert unread_splits_note(root).startswith(f"warning: {root}: validates on Validation/; Testing/ beside it")
    shutil.copytree(root / "Training", root / "train")
    with pytest.raises(DataError, match=r"holds Training/ beside train/: expected train/ with at most one"):
        scan_splits(root)


def test_class_folders_that_each_hold_the_same_subfolders_and_no_image_are_warned_about(tmp_path):
    """Splits under names not known (fold1/, fold2/ inside each class, or the other way round) would train the
    splits as the classes, or merge the classes, without a word; cat/2019/, cat/2020/, dog/2019/, ... is a layout
    of classes too, so it is a warning, not a refusal."""
    root = tmp_path / "photos"
    for fold in ("x", "y"):
        write_image_folder(root / "A" / fold, per_class=1, classes=2)
        write_image_folder(root / "B" / fold, per_class=1, classes=2)
    bundle = load_data(DataConfig(source=str(root), image_size=8))
    assert bundle.class_names == ["A", "B"]  # read as the layout says
    assert (
        f"warning: {root}: its class folders A/, B/ each hold the same subfolders x/, y/ and no image: if those are "
        "splits, the classes are merged; expected root/<class>/<image>.jpg|png or "
        "root/train|val/<class>/<image>.jpg|png"
    ) in bundle.load_note
    for cls in ("A", "B"):  # one subfolder each (cat/images/) is a layout, not splits: no warning
        shutil.rmtree(root / cls / "y")
    assert "same subfolders" not in load_data(DataConfig(source=str(root), image_size=8)).load_note


def _csv(path, header: list[str], rows) -> str:
    lines = [",".join(header)] + [",".join(str(v) for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_pixel_columns_sorted_as_text_are_read_by_the_numbers_in_their_names(tmp_path):
    """label,pixel0,pixel1,pixel10,pixel100,... read by position scrambled every image (a model that scored
    100 % on the file in order predicted 0 %)."""
    x, y = bar_images(12)
    flat = x.reshape(len(x), -1)
    names = [f"pixel{i}" for i in range(flat.shape[1])]
    by_text = sorted(range(len(names)), key=lambda j: names[j])
    path = _csv(tmp_path / "sorted.csv", ["label"] + [names[j] for j in by_text], np.c_[y, flat[:, by_text]])
    bundle = load_data(DataConfig(source=path, val_fraction=0))
    assert torch.equal(bundle.train.x[:, 0], torch.from_numpy(x))
    assert bundle.load_note == (
        f"note: {path}: pixel columns read in the order of their numbers (pixel2, pixel3, pixel4, ...), not the "
        "file's (pixel10, pixel100, pixel101, ...): the file's columns look sorted as text"
    )
    notes: list[str] = []
    got, _ = read_pixel_csv(path, require_label=False, notes=notes)  # predict reads the same way
    assert torch.equal(got[:, 0], torch.from_numpy(x)) and notes == [bundle.load_note]


def test_pixel_columns_in_another_order_are_not_said_to_be_sorted_as_text(tmp_path):
    """Reversed pixel columns are read by their numbers too; the note said "look sorted as text" of them."""
    x, y = bar_images(12)
    flat = x.reshape(len(x), -1)
    names = [f"pixel{i}" for i in range(flat.shape[1])]
    order = list(reversed(range(len(names))))
    path = _csv(tmp_path / "reversed.csv", ["label"] + [names[j] for j in order], np.c_[y, flat[:, order]])
    bundle = load_data(DataConfig(source=path, val_fraction=0))
    assert torch.equal(bundle.train.x[:, 0], torch.from_numpy(x))
    last = len(names) - 1
    assert bundle.load_note == (
        f"note: {path}: pixel columns read in the order of their numbers (pixel0, pixel1, pixel2, ...), not the "
        f"file's (pixel{last}, pixel{last - 1}, pixel{last - 2}, ...): the file's columns are in another order"
    )


def test_row_by_column_names_sorted_as_text_are_read_in_rows_and_other_orders_kept(tmp_path):
    x, y = bar_images(8)
    side = x.shape[1]
    names = [f"{r}x{c}" for r in range(1, side + 1) for c in range(1, side + 1)]  # Kaggle's 1x1..28x28
    flat = x.reshape(len(x), -1)
    by_text = sorted(range(len(names)), key=lambda j: names[j])
    path = _csv(tmp_path / "rxc.csv", ["label"] + [names[j] for j in by_text], np.c_[y, flat[:, by_text]])
    assert torch.equal(read_pixel_csv(path)[0][:, 0], torch.from_numpy(x))
    # in file order (as written), or named column first (x3y0) and written row by row: read as written
    kept = _csv(tmp_path / "kept.csv", ["label"] + names, np.c_[y, flat])
    assert torch.equal(read_pixel_csv(kept)[0][:, 0], torch.from_numpy(x))
    xy = [f"x{c}y{r}" for r in range(side) for c in range(side)]
    notes: list[str] = []
    col_first = _csv(tmp_path / "xy.csv", ["label"] + xy, np.c_[y, flat])
    assert torch.equal(read_pixel_csv(col_first, notes=notes)[0][:, 0], torch.from_numpy(x)) and not notes


@pytest.mark.parametrize("data", ["csv", "synthetic"])
def test_an_image_shape_typed_height_width_channels_is_refused_naming_the_order(tmp_path, capsys, data):
    """16x16x3 (numpy's HWC) was read as 16 channels of 16x3 images, and trained."""
    from cnnpar.cli import main

    source = "synthetic"
    if data == "csv":
        x, y = bar_images(8, channels=3)
        source = _csv(tmp_path / "rgb.csv", ["label"] + [f"pixel{i}" for i in range(768)], np.c_[y, x.reshape(8, -1)])
    runs = tmp_path / "runs"
    argv = ["train", "--data", source, "--image-shape", "16x16x3", "--out-dir", str(runs), "--no-progress"]
    assert main([*argv, "--no-tensorboard"]) == 2 and not runs.exists()
    assert capsys.readouterr().err.strip() == (
        "cnnpar: error: data.image_shape (--image-shape) = '16x16x3': channels come first: expected 3x16x16"
    )


def test_byte_string_class_names_in_an_npz_are_decoded_not_written_as_b_quotes(tmp_path):
    x, y = bar_images(40)
    names = np.array(["tl", "tr", "café".encode(), b"\xff"], dtype="S")  # the last one no UTF-8: replaced
    np.savez(tmp_path / "b.npz", x_train=x, y_train=y, class_names=names)
    assert load_data(DataConfig(source=str(tmp_path / "b.npz"))).class_names == ["tl", "tr", "café", "\ufffd"]


def test_a_file_name_that_is_not_utf8_is_listed_checksummed_and_predicted_as_its_bytes(tmp_path):
    """Latin-1 caf\\xe9.jpg stopped train and prepare (the listing checksum) and predict (its CSV) with a
    UnicodeEncodeError."""
    import hashlib
    import os

    from cnnpar.data.folder import listing_checksum
    from cnnpar.report.files import write_csv_atomic

    root = write_image_folder(tmp_path / "ph", per_class=3, classes=2)
    first = sorted((root / "class0").iterdir())[0]
    os.rename(first, os.path.join(os.fsencode(root / "class0"), b"caf\xe9" + os.fsencode(first.suffix)))
    files, labels, splits, _ = scan_splits(root)
    digest = hashlib.sha256()  # the bytes on disk, and for UTF-8 names the bytes the checksum always hashed
    for f, label, split in zip(files, labels, splits):
        digest.update(os.fsencode(f.relative_to(root)) + f"\0{label}\0{split}\n".encode())
    assert listing_checksum(root, files, labels, splits) == digest.hexdigest()
    assert load_data(DataConfig(source=str(root), image_size=8)).fingerprint == digest.hexdigest()
    assert prepare_store(root, tmp_path / "ph.cnnpar", 32, workers=1, progress=False)["count"] == 6
    notes: list[str] = []
    _, ids, _ = load_predict_data(str(root), notes=notes)
    assert "class0/caf\\xe9.png" in ids
    assert notes == [
        f"note: 1 file name(s) under {root} are not UTF-8 (first: class0/caf\\xe9.png): their ids write those bytes "
        "as \\xNN"
    ]
    write_csv_atomic(tmp_path / "p.csv", [{"id": i} for i in ids])


def test_a_linked_folder_inside_a_class_folder_is_read_and_a_link_back_up_is_not_followed(tmp_path):
    """`class0/more -> elsewhere/` dropped its images without a word, while a linked class folder was read."""
    import os

    root = write_image_folder(tmp_path / "ph", per_class=3, classes=2)
    write_image_folder(tmp_path / "elsewhere", per_class=2, classes=1)
    os.symlink(tmp_path / "elsewhere" / "class0", root / "class0" / "more")
    os.symlink("..", root / "class1" / "up")  # back up to ph/: not followed (it would read class0 as class1)
    files, labels, _, _ = scan_splits(root)
    assert [f.relative_to(root).as_posix() for f, k in zip(files, labels) if k == 0][-2:] == [
        "class0/more/0.jpg",
        "class0/more/1.png",
    ]
    assert len(files) == 8


def test_a_root_macosx_folder_is_no_class_and_loose_images_beside_class_folders_are_named(tmp_path, capsys):
    """A zip's `__MACOSX/` became a class (empty: its `._x.jpg` are skipped); images beside the class folders were
    left out without a word."""
    from cnnpar.cli import main

    root = write_image_folder(tmp_path / "photos", per_class=3, classes=2)
    (root / "__MACOSX" / "class0").mkdir(parents=True)
    (root / "__MACOSX" / "class0" / "._0.jpg").write_bytes(b"\0\5\26\7")
    for name in ("b.png", "a.png"):
        shutil.copy(next((root / "class0").glob("*.png")), root / name)
    bundle = load_data(DataConfig(source=str(root), image_size=8))
    assert bundle.class_names == ["class0", "class1"] and len(bundle.train) + len(bundle.val) == 6
    note = (
        f"warning: {root}: 2 image(s) beside the class folders are not read (first: {root / 'a.png'}): expected "
        "them inside a class folder"
    )
    assert bundle.load_note == note
    assert main(["prepare", str(root), "--out", str(tmp_path / "p.cnnpar"), "--no-progress"]) == 0
    assert note in capsys.readouterr().out
    write_image_folder(tmp_path / "s" / "train", per_class=2, classes=2)  # beside train/'s class folders too
    shutil.copy(root / "a.png", tmp_path / "s" / "train" / "c.png")
    assert load_data(DataConfig(source=str(tmp_path / "s"), image_size=8)).load_note.startswith(
        f"warning: {tmp_path / 's'}: 1 image(s) beside the class folders are not read (first: "
        f"{tmp_path / 's' / 'train' / 'c.png'})"
    )


def test_a_class_folder_named_with_a_leading_double_underscore_is_skipped_and_said_once(tmp_path, capsys):
    """`__background__/` (24 images) was dropped as `__MACOSX/` is, without a word; it is still skipped (the run's
    classes stay those its checkpoints hold), and named with its image count once."""
    from cnnpar.cli import main

    root = write_image_folder(tmp_path / "bg", per_class=3, classes=2)
    shutil.copytree(root / "class0", root / "__background__")
    (root / "__MACOSX").mkdir()
    (root / "__MACOSX" / "._0.jpg").write_bytes(b"\0\5\26\7")  # a fork, no image: not named
    bundle = load_data(DataConfig(source=str(root), image_size=8))
    assert bundle.class_names == ["class0", "class1"]
    note = (
        f"warning: 1 folder(s) named __*, skipped as __MACOSX/ is: {root / '__background__'}/ (3 image(s)): their "
        "images are not read; rename them without the leading __ to train on them as classes"
    )
    assert bundle.load_note == note
    args = ["--epochs", "1", "--workers", "0", "--max-steps", "1", "--out-dir", str(tmp_path / "runs")]
    assert main(["train", "--data", str(root), "--image-size", "8", *args]) == 0
    out, err = capsys.readouterr()
    assert (out + err).count(note) == 1
    split = tmp_path / "split"  # inside train/ too
    write_image_folder(split / "train", per_class=2, classes=2)
    write_image_folder(split / "val", per_class=1, classes=2)
    shutil.copytree(split / "train" / "class0", split / "train" / "__extra")
    assert load_data(DataConfig(source=str(split), image_size=8)).load_note == (
        f"warning: 1 folder(s) named __*, skipped as __MACOSX/ is: {split / 'train' / '__extra'}/ (2 image(s)): their "
        "images are not read; rename them without the leading __ to train on them as classes"
    )


def test_val_class_folders_spelled_in_another_unicode_form_are_matched_by_name(tmp_path):
    """val/café copied from macOS (NFD) beside train/café (NFC) was refused with two lists that print the same.
    The names match in NFC; the classes keep train/'s spelling and order, and val's labels follow the names (NFD
    sorts before cafz, NFC after it)."""
    import unicodedata

    nfc, nfd = "caf\u00e9", "cafe\u0301"
    root = tmp_path / "d"
    for split, name in (("train", nfc), ("val", nfd)):
        write_image_folder(root / split, per_class=2, classes=2)
        (root / split / "class0").rename(root / split / name)
        (root / split / "class1").rename(root / split / "cafz")
    files, labels, splits, classes = scan_splits(root)
    assert classes == ["cafz", nfc]
    val = [(f, k) for f, k, s in zip(files, labels, splits) if s == 1]
    assert len(val) == 4 and all(unicodedata.normalize("NFC", f.parent.name) == classes[k] for f, k in val)
    (root / "val" / "cafz").rename(root / "val" / "other")  # differs otherwise: refused, naming the twin pair
    with pytest.raises(DataError) as e:
        scan_splits(root)
    assert str(e.value) == (
        f"{root / 'val'}: class folders ['{nfd}', 'other'] differ from {root / 'train'}'s ['cafz', '{nfc}'] "
        "(val/'cafe\\u0301', NFD, and train/'caf\\xe9', NFC, differ only in Unicode normalisation: rename one so "
        "that both are spelled alike)"
    )
    # the other way round (train/ copied from macOS): each side's form named as it is, not "NFD against NFC" always
    for split, name in (("train", "cafz"), ("val", nfd)):
        (root / split / name).rename(root / split / "swap")
    (root / "train" / nfc).rename(root / "train" / nfd)
    (root / "val" / "swap").rename(root / "val" / nfc)
    (root / "train" / "swap").rename(root / "train" / "cafz")
    with pytest.raises(DataError, match=r"\(val/'caf\\xe9', NFC, and train/'cafe\\u0301', NFD, differ only in"):
        scan_splits(root)


def test_an_object_array_in_an_npz_is_named_by_its_key_with_how_to_save_it(tmp_path):
    """`class_names=df.col.unique()` (an object array) was refused as 'not a readable .npz archive (Object arrays
    cannot be loaded...)'."""
    x, y = bar_images(20)
    np.savez(tmp_path / "o.npz", x_train=x, y_train=y, class_names=np.array(["a", "b", "c", "d"], dtype=object))
    with pytest.raises(DataError) as e:
        load_data(DataConfig(source=str(tmp_path / "o.npz")))
    assert str(e.value) == (
        f"{tmp_path / 'o.npz'}[class_names]: an object array: save it with np.array(names, dtype=str)"
    )
    np.savez(tmp_path / "x.npz", x_train=np.array(list(x), dtype=object), y_train=y)
    with pytest.raises(DataError, match=r"x\.npz\[x_train\]: an object array \(saved pickled"):
        load_data(DataConfig(source=str(tmp_path / "x.npz")))


def test_a_csv_without_a_header_line_is_named_as_such_not_as_a_repeated_column(tmp_path):
    """np.savetxt without header= gave "column name '28' is repeated in the header"."""
    x, y = bar_images(8)
    np.savetxt(tmp_path / "n.csv", np.c_[y, x.reshape(8, -1)], fmt="%d", delimiter=",")
    with pytest.raises(DataError) as e:
        load_data(DataConfig(source=str(tmp_path / "n.csv")))
    first = np.c_[y, x.reshape(8, -1)][0][:3]
    assert str(e.value) == (
        f"{tmp_path / 'n.csv'}: the first line holds numbers ({', '.join(map(str, first))}, ...), not column names: "
        "expected a header line (label,pixel0,pixel1,...; np.savetxt(..., header=..., comments='') writes one)"
    )
    # pandas' header for a frame without column names (0,1,2,...) names the pixels: read
    _csv(tmp_path / "pd.csv", [str(i) for i in range(256)], x.reshape(8, -1))
    assert torch.equal(read_pixel_csv(tmp_path / "pd.csv", require_label=False)[0][:, 0], torch.from_numpy(x))


@pytest.mark.parametrize("require_label", [True, False])
def test_a_semicolon_separated_csv_is_named_as_such_in_a_short_line(tmp_path, require_label):
    """The error repeated the whole header (about 6,000 characters for 28x28 images)."""
    x, y = bar_images(4)
    np.savetxt(tmp_path / "s.csv", np.c_[y, x.reshape(4, -1)], fmt="%d", delimiter=";", header="label;" + ";".join(
        f"pixel{i}" for i in range(256)), comments="")  # fmt: skip
    with pytest.raises(DataError) as e:
        read_pixel_csv(tmp_path / "s.csv", require_label=require_label)
    assert str(e.value) == (
        f"{tmp_path / 's.csv'}: the header (label;pixel0;pixel1..., 257 names) looks semicolon-separated: expected "
        "commas (pandas: pd.read_csv(path, sep=';').to_csv(path, index=False))"
    )


def test_a_header_without_label_names_a_few_columns_and_the_count(tmp_path):
    _csv(tmp_path / "n.csv", ["Lab", "a_rather_long_column_name_that_goes_on_and_on"] + [f"p{i}" for i in range(9)], [])
    with pytest.raises(DataError) as e:
        read_pixel_csv(tmp_path / "n.csv")
    assert str(e.value) == (
        f"{tmp_path / 'n.csv'}: no 'label' column in the header (found Lab, a_rather_long_column_name_t..., p0, p1, "
        "p2, ...; 11 in all): expected label,pixel0,pixel1,..."
    )


def test_labels_of_shape_n_1_are_read_and_one_hot_labels_are_refused_saying_so(tmp_path):
    x, y = bar_images(20)
    np.savez(tmp_path / "col.npz", x_train=x, y_train=y[:, None])  # Keras' cifar10.load_data() labels: (N, 1)
    bundle = load_data(DataConfig(source=str(tmp_path / "col.npz"), val_fraction=0))
    assert torch.equal(bundle.train.y, torch.from_numpy(y))
    np.savez(tmp_path / "hot.npz", x_train=x, y_train=np.eye(4, dtype=np.float32)[y])
    with pytest.raises(DataError) as e:
        load_data(DataConfig(source=str(tmp_path / "hot.npz")))
    assert str(e.value) == (
        f"{tmp_path / 'hot.npz'}[y_train]: shape (20, 4) (it looks one-hot: save y.argmax(1)): expected (20,), one "
        "label per image"
    )


@pytest.mark.parametrize("name", ["Label", "LABEL"])
def test_a_label_column_named_in_another_case_is_the_label_column(tmp_path, name):
    x, y = bar_images(8)
    path = _csv(tmp_path / "l.csv", [name] + [f"pixel{i}" for i in range(256)], np.c_[y, x.reshape(8, -1)])
    got_x, got_y = read_pixel_csv(path)
    assert torch.equal(got_x[:, 0], torch.from_numpy(x)) and torch.equal(got_y, torch.from_numpy(y))
    _, labels_from = load_predict_data(path)[1:]
    assert labels_from == "its 'label' column"


def test_predict_skips_dunder_folders_as_train_does_and_scores_the_class_folders(tmp_path):
    """`cnnpar predict --data photos/` read photos/__MACOSX/ as a class folder of no class of the run, predicted
    its images and scored nothing, where train's scan skips it (the README: `__MACOSX/` is skipped)."""
    from PIL import Image

    root = write_image_folder(tmp_path / "photos", per_class=3)
    (root / "__MACOSX" / "class0").mkdir(parents=True)
    Image.new("RGB", (20, 20)).save(root / "__MACOSX" / "class0" / "x.png")
    notes: list[str] = []
    unscored: list[str] = []
    ds, ids, origin = load_predict_data(
        str(root), "folder", image_size=8, notes=notes, class_names=["class0", "class1"], unscored=unscored
    )
    assert unscored == [] and origin == "its class folders' names"
    assert len(ids) == 6 and not any(i.startswith("__MACOSX") for i in ids)
    assert sorted(ds.y.tolist()) == [0, 0, 0, 1, 1, 1]
    assert notes == [
        f"warning: 1 folder(s) named __*, skipped as cnnpar train skips __MACOSX/: {root / '__MACOSX'}/ (1 image(s)): "
        "their images are not predicted"
    ]


def test_predict_of_a_folder_whose_images_all_lie_under_a_dunder_folder_names_that_folder(tmp_path):
    """`cnnpar predict --data photos/` where photos/__pending/ held every image said "photos: no .jpg, .jpeg or .png
    files" (the warning naming __pending/ was never printed): false, and no way to learn where the images went."""
    from PIL import Image

    root = tmp_path / "photos"
    (root / "__pending").mkdir(parents=True)
    for i in range(2):
        Image.new("RGB", (20, 20)).save(root / "__pending" / f"{i}.png")
    with pytest.raises(DataError) as e:
        load_predict_data(str(root), "folder", image_size=8, notes=[])
    assert str(e.value) == (
        f"{root}: no .jpg, .jpeg or .png files outside its folder(s) named __* ({root / '__pending'}/ (2 image(s))), "
        f"which are skipped as cnnpar train skips __MACOSX/: expected --data {root / '__pending'} to predict that "
        "folder's images"
    )
    _, ids, _ = load_predict_data(str(root / "__pending"), "folder", image_size=8)  # the command it names reads them
    assert ids == ["0.png", "1.png"]


def test_train_of_a_folder_whose_class_folders_all_lie_under_a_dunder_folder_names_the_folder_to_pass(tmp_path):
    """`cnnpar train --data only/` where only/__x/ held every class folder said "only: no class folders": false of a
    folder of 4 images, and silent on the __x/ it skipped; predict names such folders, train now does too."""
    root = tmp_path / "only"
    write_image_folder(root / "__x", per_class=2, classes=2)
    with pytest.raises(DataError) as e:
        load_data(DataConfig(source=str(root), image_size=8))
    assert str(e.value) == (
        f"{root}: no class folders outside its folder(s) named __* ({root / '__x'}/ (4 image(s))), which are skipped "
        f"as cnnpar train skips __MACOSX/: expected {root / '__x'} (which holds the class folders) in its place"
    )
    bundle = load_data(DataConfig(source=str(root / "__x"), image_size=8))  # the folder it names trains
    assert bundle.class_names == ["class0", "class1"]


def test_dunder_only_refusal_names_the_dunder_folder_of_classes_and_keeps_a_flat_folders_labels_hint(tmp_path):
    """only/__a/ of loose images sorted before only/__b/{class0,class1}: the line said to rename them as classes,
    where __b was the folder to pass; and a flat folder's own images beside a __pending/ lost the plain refusal's
    --labels CSV hint."""
    from PIL import Image

    two = tmp_path / "only"
    write_image_folder(two / "__b", per_class=2, classes=2)
    (two / "__a").mkdir()
    Image.new("RGB", (20, 20)).save(two / "__a" / "0.png")
    with pytest.raises(DataError, match=r"expected \S+/__b \(which holds the class folders\) in its place$"):
        load_data(DataConfig(source=str(two), image_size=8))
    flat = tmp_path / "flat"
    for name in ("0.png", "__pending/1.png"):
        (flat / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (20, 20)).save(flat / name)
    with pytest.raises(DataError) as e:
        load_data(DataConfig(source=str(flat), image_size=8))
    assert str(e.value).startswith(f"{flat}: no class folders outside its folder(s) named __* ({flat / '__pending'}/")
    assert f"to read them as classes, or, as {flat} holds 1 image(s) itself, --labels CSV: " in str(e.value)


def test_train_whose_images_or_val_classes_all_lie_under_dunder_folders_says_to_rename_them(tmp_path):
    """only/__pending/ holding the images themselves, and a val/ whose class folders are all __-named, each said
    "no class folders"; the line names the folders and that they are read once renamed."""
    flat = tmp_path / "only"
    write_image_folder(flat, per_class=3, classes=1)
    (flat / "class0").rename(flat / "__pending")
    split = tmp_path / "d"
    write_image_folder(split / "train", per_class=2, classes=2)
    write_image_folder(split / "val", per_class=1, classes=2)
    for name in ("class0", "class1"):
        (split / "val" / name).rename(split / "val" / f"__{name}")
    rename = "expected them renamed without the leading __ to read them as classes"
    for root, where, shown in [
        (flat, flat, f"{flat / '__pending'}/ (3 image(s))"),
        (
            split,
            split / "val",
            f"{split / 'val' / '__class0'}/ (1 image(s)), {split / 'val' / '__class1'}/ (1 image(s))",
        ),
    ]:
        with pytest.raises(DataError) as e:
            load_data(DataConfig(source=str(root), image_size=8))
        assert str(e.value) == (
            f"{where}: no class folders outside its folder(s) named __* ({shown}), which are skipped as cnnpar train "
            f"skips __MACOSX/: {rename}"
        )
    # __MACOSX/ holding only macOS's ._ forks (no images) is not named: the plain refusal stands
    mac = tmp_path / "mac"
    (mac / "__MACOSX").mkdir(parents=True)
    (mac / "__MACOSX" / "._0.jpg").write_bytes(b"\x00\x05\x16\x07")
    with pytest.raises(DataError, match=r"^\S+mac: no class folders: expected root/<class>/<image>\.jpg\|png$"):
        load_data(DataConfig(source=str(mac), image_size=8))


def test_a_split_whose_class_folders_lie_under_a_dunder_folder_says_to_move_them_up_not_to_pass_it(tmp_path):
    """photos/train/__x/{class0,class1} beside photos/val/ said "expected photos/train/__x (which holds the class
    folders) in its place": passed as --data, that folder trains without photos/val/ (and val/__x in its place,
    without train/). The line now says to move the class folders up into the split, and the layout it names loads
    both splits."""
    for split, other in (("train", "val"), ("val", "train")):
        root = tmp_path / split / "photos"
        write_image_folder(root / split / "__x", per_class=2, classes=2)
        write_image_folder(root / other, per_class=2, classes=2)
        with pytest.raises(DataError) as e:
            load_data(DataConfig(source=str(root), image_size=8))
        assert str(e.value) == (
            f"{root / split}: no class folders outside its folder(s) named __* ({root / split / '__x'}/ (4 image(s))), "
            f"which are skipped as cnnpar train skips __MACOSX/: expected the class folders of {root / split / '__x'} "
            f"moved up into {root / split}"
        )
        for name in ("class0", "class1"):
            (root / split / "__x" / name).rename(root / split / name)
        _, _, splits, _ = scan_splits(root)  # as the line says: both splits read, val/ validating
        assert sorted(set(splits)) == [0, 1]


def test_a_dunder_folder_of_splits_is_said_to_hold_the_splits_not_the_class_folders(tmp_path):
    """photos/__x/{train,val} was said to be "__x (which holds the class folders)": it holds the splits, and
    passing it reads both."""
    root = tmp_path / "photos"
    write_image_folder(root / "__x" / "train", per_class=2, classes=2)
    write_image_folder(root / "__x" / "val", per_class=1, classes=2)
    with pytest.raises(DataError) as e:
        load_data(DataConfig(source=str(root), image_size=8))
    assert str(e.value) == (
        f"{root}: no class folders outside its folder(s) named __* ({root / '__x'}/ (6 image(s))), which are skipped "
        f"as cnnpar train skips __MACOSX/: expected {root / '__x'} (which holds the splits train/, val/) in its place"
    )
    _, _, splits, classes = scan_splits(root / "__x")
    assert classes == ["class0", "class1"] and sorted(set(splits)) == [0, 1]


def test_a_skipped_dunder_folder_of_class_folders_is_told_to_merge_them_not_to_be_renamed_as_a_class(tmp_path):
    """photos/train/__old/{class0,class1} beside the class folders was told "rename them without the leading __ to
    train on them as classes": renamed, old/ trains as one class of both classes' images. The note now says to move
    their images into the class folders of the same names, which reads them under their own classes; a folder of
    loose images beside it is still told to be renamed."""
    root = tmp_path / "photos"
    write_image_folder(root / "train", per_class=2, classes=2)
    write_image_folder(root / "val", per_class=1, classes=2)
    write_image_folder(root / "train" / "__old", per_class=1, classes=2)
    old = root / "train" / "__old"
    move = "move their class folders' images up into class folders of the same names beside them to train on them"
    assert load_data(DataConfig(source=str(root), image_size=8)).load_note == (
        f"warning: 1 folder(s) named __*, skipped as __MACOSX/ is: {old}/ (2 image(s)): their images are not read; "
        f"{move}"
    )
    shutil.copytree(root / "train" / "class0", root / "train" / "__background__")
    assert load_data(DataConfig(source=str(root), image_size=8)).load_note.endswith(
        "their images are not read; rename those of loose images without the leading __ to train on them as classes, "
        "and move the class folders' images in the others up into class folders of the same names beside them"
    )
    shutil.rmtree(root / "train" / "__background__")
    for name in ("class0", "class1"):  # as the note says
        for f in (old / name).iterdir():
            f.rename(root / "train" / name / f"old-{f.name}")
    _, labels, splits, classes = scan_splits(root)
    assert classes == ["class0", "class1"] and sum(s == 0 for s in splits) == 6 and sorted(set(labels)) == [0, 1]
