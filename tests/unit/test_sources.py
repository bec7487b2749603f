"""Each input format read correctly: pixels, labels, shapes, splits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cnnpar.config import DataConfig
from cnnpar.data import load_data, load_predict_data
from cnnpar.data.bundle import class_lines
from cnnpar.data.csv_source import read_pixel_csv
from cnnpar.data.folder import ImageFolderDataset, scan_folder
from cnnpar.data.sources import detect_format
from cnnpar.errors import DataError
from tests.datafiles import bar_images, write_image_folder, write_npz, write_pixel_csv, write_train_test_csv


def test_csv_train_and_test_read_exact_pixels(tmp_path):
    train, test, _ = write_train_test_csv(tmp_path, n_train=40, n_test=8)
    x, y = read_pixel_csv(train)
    want_x, want_y = bar_images(48)
    assert x.dtype == torch.uint8 and x.shape == (40, 1, 16, 16)
    assert torch.equal(x[:, 0], torch.from_numpy(want_x[:40]))
    assert torch.equal(y, torch.from_numpy(want_y[:40]))
    xt, yt = read_pixel_csv(test, require_label=False)
    assert yt is None and torch.equal(xt[:, 0], torch.from_numpy(want_x[40:]))


def test_csv_colour_rows_need_and_honour_image_shape(tmp_path):
    x, y = bar_images(6, side=8, channels=3)  # (N, H, W, C)
    chw = x.transpose(0, 3, 1, 2)
    path = write_pixel_csv(tmp_path / "rgb.csv", chw, y)
    # the shape it suggests fits the columns (it suggested 3x32x32, which the next run refused for 192 columns)
    with pytest.raises(
        DataError, match=r"rgb\.csv: 192 pixel columns is not a square grey image: .*--image-shape 3x8x8"
    ):
        read_pixel_csv(path)
    got, _ = read_pixel_csv(path, image_shape="3x8x8")
    assert torch.equal(got, torch.from_numpy(np.ascontiguousarray(chw)))
    with pytest.raises(DataError, match=r"do not fit --image-shape 3x4x4"):
        read_pixel_csv(path, image_shape="3x4x4")


def test_csv_header_with_spaces_or_a_bom_reads_as_usual(tmp_path):
    """`label, pixel0, ...` and Excel's "CSV UTF-8" (a BOM first) gave KeyError tracebacks."""
    x, y = bar_images(6, side=8)
    path = write_pixel_csv(tmp_path / "plain.csv", x, y)
    header, body = path.read_text().split("\n", 1)
    (tmp_path / "spaces.csv").write_text(header.replace(",", " , ") + "\n" + body)
    (tmp_path / "bom.csv").write_text(header + "\n" + body, encoding="utf-8-sig")
    test = write_pixel_csv(tmp_path / "test.csv", x, None)
    (tmp_path / "test_bom.csv").write_text(test.read_text(), encoding="utf-8-sig")
    for name in ("spaces.csv", "bom.csv"):
        got_x, got_y = read_pixel_csv(tmp_path / name)
        assert torch.equal(got_x[:, 0], torch.from_numpy(x)) and torch.equal(got_y, torch.from_numpy(y)), name
    got_x, got_y = read_pixel_csv(tmp_path / "test_bom.csv", require_label=False)
    assert got_y is None and torch.equal(got_x[:, 0], torch.from_numpy(x))


def _with_column(path, name: str, value, at: int = 0):
    """`path`'s lines with a column `name` inserted at position `at`, holding `value(k)` in data row k."""
    lines = path.read_text().splitlines()
    rows = [[name, *lines[0].split(",")]] + [[value(k), *line.split(",")] for k, line in enumerate(lines[1:])]
    return "\n".join(",".join(r[1 : at + 1] + r[:1] + r[at + 1 :]) for r in rows) + "\n"


def test_an_id_or_imageid_column_is_never_a_pixel(tmp_path):
    """Kaggle's id (Kannada MNIST's test.csv) or ImageId, in any case and place: 'id,pixel0..' was refused as
    '257 pixel columns is not a square grey image' (and a count that made a square trained on the id)."""
    x, y = bar_images(6)
    train = write_pixel_csv(tmp_path / "train.csv", x, y)
    test = write_pixel_csv(tmp_path / "test.csv", x, None)
    for name in ("id", "ImageId", "ID"):
        with_id = tmp_path / f"train_{name}.csv"
        with_id.write_text(_with_column(train, name, lambda k: f"img{k}", at=1))  # label,id,pixel0,...: text ids
        got_x, got_y = read_pixel_csv(with_id)
        assert torch.equal(got_x[:, 0], torch.from_numpy(x)) and torch.equal(got_y, torch.from_numpy(y)), name
        with_id = tmp_path / f"test_{name}.csv"
        with_id.write_text(_with_column(test, name, lambda k: str(1000 + k)))  # id,pixel0,...
        got_x, got_y = read_pixel_csv(with_id, require_label=False)
        assert torch.equal(got_x[:, 0], torch.from_numpy(x)) and got_y is None, name
    two = tmp_path / "two.csv"
    two.write_text(_with_column(tmp_path / "test_id.csv", "ImageId", str))
    with pytest.raises(DataError) as e:
        read_pixel_csv(two, require_label=False)
    assert str(e.value) == f"{two}: 2 id columns ('ImageId', 'id'): expected one id or ImageId column at most"


def test_a_column_that_is_no_pixel_is_named_with_the_expected_layout(tmp_path):
    """pandas' to_csv keeps its index as an unnamed first column: it was counted as a pixel and the file refused
    as '257 pixel columns is not a square grey image'. A file name column whose count happens to make a square
    is named by its first value, with the layout the file should have."""
    x, y = bar_images(6)
    train = write_pixel_csv(tmp_path / "train.csv", x, y)
    indexed = tmp_path / "indexed.csv"
    indexed.write_text(_with_column(train, "", str))
    with pytest.raises(DataError) as e:
        read_pixel_csv(indexed)
    assert str(e.value) == (
        f"{indexed}: column '' (number 1 in the header) is not a pixel column: expected a label column, an optional "
        "id or ImageId column and pixel columns pixel0, pixel1, ..."
    )
    lines = write_pixel_csv(tmp_path / "test.csv", x, None).read_text().splitlines()
    named = tmp_path / "named.csv"  # the last pixel's column replaced by a file name: still 256 columns
    named.write_text(
        "\n".join([lines[0].replace("pixel255", "file")] + [r.rsplit(",", 1)[0] + ",a.png" for r in lines[1:]])
    )
    with pytest.raises(DataError) as e:
        read_pixel_csv(named, require_label=False)
    assert str(e.value) == (
        f"{named}, line 2 (data row 1), column 'file': 'a.png' is not an integer: expected a pixel value 0..255 here, "
        "or no such column (an optional label column, an optional id or ImageId column and pixel columns pixel0, "
        "pixel1, ...)"
    )


def test_csv_bundle_holds_out_a_seeded_fraction(tmp_path):
    train, _, _ = write_train_test_csv(tmp_path, n_train=100, n_test=1)
    cfg = DataConfig(source=str(train), val_fraction=0.25, num_classes=4)
    a, b, c = load_data(cfg, seed=1), load_data(cfg, seed=1), load_data(cfg, seed=2)
    assert (len(a.train), len(a.val)) == (75, 25)
    assert a.shape == (1, 16, 16) and a.num_classes == 4
    assert torch.equal(a.val.x, b.val.x)
    assert not torch.equal(a.val.x, c.val.x)
    # train and val together are exactly the file's rows
    assert sorted(torch.cat([a.train.y, a.val.y]).tolist()) == sorted(read_pixel_csv(train)[1].tolist())


def test_npz_with_test_split_uses_it_as_validation(tmp_path):
    path = write_npz(tmp_path / "d.npz", n_train=64, n_test=16)
    bundle = load_data(DataConfig(source=str(path)))
    x, y = bar_images(80)
    assert len(bundle.train) == 64 and len(bundle.val) == 16
    assert torch.equal(bundle.val.x[:, 0], torch.from_numpy(x[64:]))
    assert torch.equal(bundle.val.y, torch.from_numpy(y[64:]))


def test_npz_without_test_split_holds_out_val_fraction(tmp_path):
    path = write_npz(tmp_path / "d.npz", n_train=50, n_test=None)
    bundle = load_data(DataConfig(source=str(path), val_fraction=0.2))
    assert (len(bundle.train), len(bundle.val)) == (40, 10)


def test_npz_channels_last_and_float_arrays_become_nchw_uint8(tmp_path):
    x, y = bar_images(10, side=8, channels=3)
    np.savez(tmp_path / "f.npz", x_train=x.astype(np.float32) / 255.0, y_train=y)
    bundle = load_data(DataConfig(source=str(tmp_path / "f.npz"), val_fraction=0.0))
    assert bundle.shape == (3, 8, 8) and bundle.train.x.dtype == torch.uint8
    assert torch.equal(bundle.train.x, torch.from_numpy(x.transpose(0, 3, 1, 2).copy()))


def test_a_non_finite_pixel_is_named_with_its_file_key_and_index(tmp_path):
    """One NaN made min/max NaN: the [0,1] data was not scaled and trained as pixels 0 and 1 only."""
    x, y = bar_images(10, side=8, channels=3)
    x = x.astype(np.float32) / 255.0
    x[5, 0, 1, 2] = np.nan
    np.savez(tmp_path / "nan.npz", x_train=x, y_train=y)
    path = tmp_path / "nan.npz"
    with pytest.raises(DataError) as e:
        load_data(DataConfig(source=str(path)))
    assert str(e.value) == (
        f"{path}[x_train]: value nan at index (5, 0, 1, 2): expected finite pixel values (no NaN or inf)"
    )
    x[5, 0, 1, 2] = 0.5
    x_test = x[:2].copy()
    x_test[1, 7, 7, 0] = np.inf
    np.savez(path, x_train=x, y_train=y, x_test=x_test, y_test=y[:2])
    with pytest.raises(DataError, match=r"nan\.npz\[x_test\]: value inf at index \(1, 7, 7, 0\): expected finite"):
        load_predict_data(str(path))


def test_synthetic_has_the_asked_shape_and_classes():
    bundle = load_data(DataConfig(source="synthetic", image_shape="3x12x12", num_classes=5, synthetic_samples=100))
    assert bundle.shape == (3, 12, 12) and bundle.num_classes == 5
    labels = torch.cat([bundle.train.y, bundle.val.y])
    assert len(labels) == 100 and 0 <= int(labels.min()) and int(labels.max()) < 5


def test_synthetic_data_of_up_to_96_classes_is_what_it_was(tmp_path):
    """The brightness offset runs, tests and benchmarks trained on: bit for bit the same."""
    bundle = load_data(DataConfig(source="synthetic", image_shape="3x8x8", synthetic_samples=64, val_fraction=0), 3)
    g = torch.Generator().manual_seed(3)
    y = torch.randint(0, 10, (64,), generator=g)
    x = (
        torch.randint(0, 160, (64, 3, 8, 8), generator=g, dtype=torch.uint8)
        + (y * 10).to(torch.uint8)[:, None, None, None]
    )
    assert torch.equal(bundle.train.x, x) and torch.equal(bundle.train.y, y)


def test_synthetic_classes_past_96_differ_from_each_other():
    """The offset step 95 // (classes - 1) is 0 past 96 classes: 200 classes were one distribution of noise."""
    cfg = DataConfig(source="synthetic", image_shape="3x8x8", num_classes=200, synthetic_samples=6000)
    bundle = load_data(cfg, 0)
    x, y = bundle.train.x.float().flatten(1), bundle.train.y
    means = torch.stack([x[y == k].mean(0) for k in range(200)])
    val_x = bundle.val.x.float().flatten(1)
    nearest = torch.cdist(val_x, means).argmin(1)  # the class whose mean image is nearest
    accuracy = float((nearest == bundle.val.y).float().mean())
    assert accuracy > 0.5, accuracy  # chance is 0.5 %


def test_an_in_memory_resize_that_cannot_fit_is_refused_and_one_that_fits_is_chunked(monkeypatch):
    """--image-size 20000 on the digits asked torch's allocator for 2.9 TB and stopped in a traceback."""
    import psutil
    import torch.nn.functional as F

    from cnnpar.data import arrays

    class Little:
        available = 10**8

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Little)
    with pytest.raises(DataError) as e:
        load_data(DataConfig(source="digits", image_size=300), 0)
    assert str(e.value) == (
        "--image-size 300: 1,797 images of 1x300x300 take 0.2 GB, more than the 0.1 GB of memory available: "
        "expected a smaller --image-size"
    )
    monkeypatch.undo()
    x = torch.randint(0, 256, (20, 3, 12, 12), dtype=torch.uint8)
    monkeypatch.setattr(arrays, "RESIZE_CHUNK_BYTES", 4 * 3 * (12 * 12 + 30 * 30) * 3)  # 3 images a chunk
    for size in (30, 5):
        whole = F.interpolate(x.float(), size=(size, size), mode="bilinear", antialias=size < 12)
        assert torch.equal(arrays.resize_square(x, size), whole.round_().clamp_(0, 255).to(torch.uint8))


def test_digits_are_built_in_and_upscaled():
    bundle = load_data(DataConfig(source="digits"))
    assert bundle.shape == (1, 16, 16) and bundle.num_classes == 10
    assert len(bundle.train) + len(bundle.val) == 1797
    assert int(bundle.train.x.max()) > 200  # scaled from sklearn's 0..16 to 0..255


def test_digits_are_scikit_learns_read_without_importing_it(monkeypatch, tmp_path):
    """The built-in digits come from scikit-learn's own CSV without its ~1.3 s import (every digits run paid it), the
    same arrays as its loader; where the file is not where the package keeps it, its loader reads them."""
    import sys

    from sklearn.datasets import load_digits as sk_digits

    from cnnpar.data import sources
    from tests.conftest import run_cmd

    want = sk_digits()
    images, labels = sources.digits_arrays()
    assert np.array_equal(images, want.images) and np.array_equal(labels, want.target)
    code = "import sys; from cnnpar.data.sources import digits_arrays; digits_arrays(); print('sklearn' in sys.modules)"
    done = run_cmd([sys.executable, "-c", code], tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr
    monkeypatch.setattr(sources.importlib.util, "find_spec", lambda name: None)  # no file found: sklearn's loader
    images, labels = sources.digits_arrays()
    assert np.array_equal(images, want.images) and np.array_equal(labels, want.target)


def test_digits_with_too_few_classes_is_refused_in_one_line_before_a_run_folder(tmp_path, capsys):
    """--num-classes 5 on labels 0..9 crashed mid-epoch (IndexError in the loss) and left a run folder."""
    from cnnpar.cli import main

    runs = tmp_path / "runs"
    code = main(["train", "--num-classes", "5", "--out-dir", str(runs), "--no-progress", "--no-tensorboard"])
    assert code == 2 and not runs.exists()
    assert capsys.readouterr().err.strip() == (
        "cnnpar: error: scikit-learn digits (labels 0..9), index 5: label 5: expected a label in 0..4 (--num-classes 5)"
    )
    assert load_data(DataConfig(source="digits", num_classes=12)).num_classes == 12  # more classes: allowed


def test_image_folder_decodes_png_and_jpeg_to_the_model_size(tmp_path):
    root = write_image_folder(tmp_path / "imgs", per_class=3, classes=2, side=20)
    files, labels, classes = scan_folder(root)
    assert classes == ["class0", "class1"] and len(files) == 6
    assert {f.suffix for f in files} == {".png", ".jpg"}
    ds = ImageFolderDataset(files, labels, size=12)
    for i in range(len(ds)):
        img, label = ds[i]
        assert img.dtype == torch.uint8 and img.shape == (3, 12, 12)
        assert int(label) == labels[i]
    bundle = load_data(DataConfig(source=str(root), image_size=12, val_fraction=0.5))
    assert bundle.num_classes == 2 and bundle.shape == (3, 12, 12)
    assert len(bundle.train) == 3 and len(bundle.val) == 3


def test_image_folder_with_train_and_val_subfolders(tmp_path):
    write_image_folder(tmp_path / "d" / "train", per_class=2, classes=3)
    write_image_folder(tmp_path / "d" / "val", per_class=1, classes=3)
    bundle = load_data(DataConfig(source=str(tmp_path / "d"), image_size=8))
    assert (len(bundle.train), len(bundle.val), bundle.num_classes) == (6, 3, 3)


@pytest.mark.parametrize("val_name", ["valid", "validation", "test"])
def test_split_folders_under_their_common_names_are_splits_not_classes(tmp_path, val_name):
    write_image_folder(tmp_path / "d" / "train", per_class=2, classes=3)
    write_image_folder(tmp_path / "d" / val_name, per_class=1, classes=3)
    bundle = load_data(DataConfig(source=str(tmp_path / "d"), image_size=8))
    assert bundle.class_names == ["class0", "class1", "class2"]
    assert (len(bundle.train), len(bundle.val)) == (6, 3)


def test_a_root_holding_only_train_is_that_folder_with_a_seeded_hold_out(tmp_path):
    write_image_folder(tmp_path / "d" / "train", per_class=5, classes=2)
    bundle = load_data(DataConfig(source=str(tmp_path / "d"), image_size=8, val_fraction=0.2), seed=0)
    assert bundle.class_names == ["class0", "class1"]
    assert (len(bundle.train), len(bundle.val)) == (8, 2) and bundle.val_from.startswith("a seeded 20% hold-out")


def test_one_class_folder_is_refused_in_one_line_before_a_run_folder(tmp_path, capsys):
    from cnnpar.cli import main

    write_image_folder(tmp_path / "one" / "train", per_class=4, classes=1)
    runs = tmp_path / "runs"
    code = main(["train", "--data", str(tmp_path / "one"), "--out-dir", str(runs), "--no-progress", "--no-tensorboard"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and not runs.exists()
    assert err == (
        f"cnnpar: error: {tmp_path / 'one' / 'train'}: images in one class folder ('class0'): expected at least 2 "
        "class folders with images, <class>/<image>.jpg|png (or train/<class>/... beside "
        "val|valid|validation|test|testing/<class>/...)"
    )


def test_train_beside_another_folder_is_refused_and_an_empty_class_folder_does_not_make_a_second_class(tmp_path):
    """`train/` beside `extra/` made the classes ['extra', 'train']; an empty `__MACOSX/` or class folder beside
    one real class passed the one-class check."""
    write_image_folder(tmp_path / "a" / "train", per_class=3, classes=3)
    (tmp_path / "a" / "extra").mkdir()
    (tmp_path / "a" / "__MACOSX").mkdir()
    with pytest.raises(DataError, match=r"holds train/ beside extra/: expected train/ with at most one of"):
        load_data(DataConfig(source=str(tmp_path / "a"), image_size=8), seed=0)
    (tmp_path / "a" / "extra").rmdir()  # __MACOSX alone beside train/ is ignored
    assert load_data(DataConfig(source=str(tmp_path / "a"), image_size=8), seed=0).class_names == [
        "class0",
        "class1",
        "class2",
    ]
    write_image_folder(tmp_path / "b", per_class=3, classes=1)
    (tmp_path / "b" / "empty").mkdir()
    with pytest.raises(DataError, match=r"images in one class folder \('class0'\)"):
        load_data(DataConfig(source=str(tmp_path / "b"), image_size=8), seed=0)


def test_predict_inputs_keep_file_order(tmp_path):
    _, test, _ = write_train_test_csv(tmp_path, n_train=4, n_test=5)
    ds, ids, labels_from = load_predict_data(str(test))
    assert ids == ["1", "2", "3", "4", "5"] and ds.x.shape == (5, 1, 16, 16) and labels_from == ""


def test_predict_refuses_a_store_with_a_store_s_reason(tmp_path):
    """It ended "(synthetic data has nothing to predict)" for a store too."""
    with pytest.raises(DataError) as e:
        load_predict_data(str(tmp_path / "split.cnnpar"))
    assert str(e.value) == (
        f"{tmp_path / 'split.cnnpar'}: predict reads a .csv, an .npz, a .npy, an image folder or 'digits', not "
        "'store' (a .cnnpar store is prepare's copy of training images: give predict the image folder itself)"
    )
    with pytest.raises(DataError, match=r"not 'synthetic' \(synthetic data has nothing to predict\)$"):
        load_predict_data("synthetic")


def test_format_detection_and_unknown_paths(tmp_path):
    assert detect_format("digits", "auto") == "digits"
    assert detect_format(str(tmp_path), "auto") == "folder"
    with pytest.raises(DataError, match="nothere.bin: no such file or folder"):
        detect_format(str(tmp_path / "nothere.bin"), "auto")
    (tmp_path / "x.bin").write_bytes(b"1")
    with pytest.raises(DataError, match=r"x\.bin: cannot tell its format"):
        detect_format(str(tmp_path / "x.bin"), "auto")


@pytest.mark.parametrize("name,content", [("garbage.jpg", b"not an image"), ("cut.png", None)])
def test_unreadable_images_raise_a_data_error_naming_the_file(tmp_path, name, content):
    from cnnpar.data.folder import decode_resized

    if content is None:
        root = write_image_folder(tmp_path / "src", per_class=2, classes=1)
        content = sorted(root.rglob("*.png"))[0].read_bytes()[:60]
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(DataError) as e:
        decode_resized(path, 8)
    message = str(e.value)
    assert message.startswith(f"{path}: cannot decode as an image (") and ".cpp:" not in message


def test_class_count_names_its_origin_and_warns_about_empty_classes(tmp_path):
    """Labels 0..9 plus one stray 12 train as 13 classes: said, with 10 and 11 named as empty."""
    x, _ = bar_images(60)
    y = np.arange(60) % 10
    y[7] = 12
    np.savez(tmp_path / "stray.npz", x_train=x, y_train=y)
    bundle = load_data(DataConfig(source=str(tmp_path / "stray.npz")))
    assert class_lines(bundle) == [
        "classes: 13 (labels' max + 1)",
        "warning: 2 of 13 classes have no examples: 10, 11 (expected labels 0..K-1 with every class present; "
        "pass --num-classes K or relabel)",
    ]
    given = load_data(DataConfig(source=str(tmp_path / "stray.npz"), num_classes=20))
    assert class_lines(given)[0] == "classes: 20 (--num-classes)"
    assert "9 of 20 classes have no examples: 10, 11, 13, 14, 15, ..." in class_lines(given)[1]


def test_an_npz_s_class_names_set_the_class_count_where_they_cover_the_labels(tmp_path):
    """CIFAR-10's first 5 classes with its 10 class_names were refused ("10 names for 5 classes"), with no remedy;
    --num-classes 10 then named the empty classes by index with the names at hand."""
    x, y = bar_images(24)  # labels 0..3
    names = np.array(["plane", "car", "bird", "cat", "deer", "dog"])
    np.savez(tmp_path / "first4.npz", x_train=x, y_train=y, class_names=names)
    bundle = load_data(DataConfig(source=str(tmp_path / "first4.npz")))
    assert bundle.num_classes == 6 and bundle.class_names == names.tolist()
    assert class_lines(bundle) == [
        "classes: 6 (the archive's class_names)",
        "warning: 2 of 6 classes have no examples: 4 (deer), 5 (dog) (the archive's class_names name them, and no "
        "label is theirs: give them examples or drop their names)",
    ]
    given = load_data(DataConfig(source=str(tmp_path / "first4.npz"), num_classes=6))  # the flag that worked
    named = "classes: 6 (--num-classes; names from the archive's class_names)"
    assert class_lines(given)[0] == named and "4 (deer), 5 (dog)" in class_lines(given)[1]
    # names for exactly the labels' classes: the count is the labels', the names the archive's, and the line says both
    np.savez(tmp_path / "four.npz", x_train=x, y_train=y, class_names=names[:4])
    assert class_lines(load_data(DataConfig(source=str(tmp_path / "four.npz")))) == [
        "classes: 4 (labels' max + 1; names from the archive's class_names)"
    ]
    np.savez(tmp_path / "few.npz", x_train=x, y_train=y, class_names=names[:3])  # fewer names than labels: refused
    with pytest.raises(DataError, match=r"few\.npz\[class_names\]: 3 names for 4 classes \(labels' max \+ 1\)"):
        load_data(DataConfig(source=str(tmp_path / "few.npz")))


def test_the_data_line_names_the_statistics_that_normalise(tmp_path):
    """Folders and stores are normalised with ImageNet's mean/std whatever they hold, arrays with their own: the
    run said neither."""
    from cnnpar.data.bundle import split_line

    folder = load_data(DataConfig(source=str(write_image_folder(tmp_path / "photos"))))
    assert folder.mean == (0.485, 0.456, 0.406) and "; normalised with ImageNet's mean/std" in split_line(folder)
    arrays = load_data(DataConfig(source=str(write_npz(tmp_path / "d.npz", n_train=40, n_test=8))))
    assert split_line(arrays).endswith("the data's own test split; normalised with the training images' mean/std")
    folder = load_data(DataConfig(source=str(write_image_folder(tmp_path / "photos"))))
    assert class_lines(folder) == ["classes: 2 (the class folders)"]


def test_image_size_0_keeps_a_folders_and_a_stores_shared_source_size(tmp_path):
    """32x32 PNGs stay 32x32 (not enlarged to 224); mixed sizes get the stated 224."""
    from cnnpar.data.store_write import prepare_store

    same = write_image_folder(tmp_path / "same", side=32)
    bundle = load_data(DataConfig(source=str(same)))
    assert bundle.shape == (3, 32, 32) and "all 12 images are 32x32" in bundle.size_from
    x, _ = bundle.train[0]
    assert tuple(x.shape) == (3, 32, 32)
    store = tmp_path / "same.cnnpar"
    prepare_store(same, store, 256, workers=1, progress=False)
    from_store = load_data(DataConfig(source=str(store)))
    assert from_store.shape == (3, 32, 32) and class_lines(from_store) == ["classes: 2 (the store's header)"]

    mixed = write_image_folder(tmp_path / "mixed", side=20)
    write_image_folder(tmp_path / "mixed2", side=40)
    for f in (tmp_path / "mixed2").rglob("*.*"):
        f.rename(f.parent.parent.parent / "mixed" / f.parent.name / f"big{f.name}")
    bundle = load_data(DataConfig(source=str(mixed)))
    assert bundle.shape == (3, 224, 224)
    assert "differ in size (by area, the smallest 20x20 and the largest 40x40, width x height): 224" in bundle.size_from
    assert load_data(DataConfig(source=str(mixed), image_size=48)).shape == (3, 48, 48)


def test_photos_sharing_a_size_above_256_train_at_224_and_256_is_kept(tmp_path):
    """A folder of one camera's photos, all 1600x1200, trained at its whole 1200-px shorter side (29x the activations
    of 224): a doctor run of cnn3 on such photos grew to 24 GB and was killed without a word. Up to 256 the shared
    size is still kept; --image-size still chooses any size."""
    from PIL import Image

    for name, (w, h) in {"camera": (400, 300), "kept": (256, 256)}.items():
        for i in range(4):
            (tmp_path / name / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (w, h), (i * 40, 0, 0)).save(tmp_path / name / f"c{i % 2}" / f"{i}.jpg")
    bundle = load_data(DataConfig(source=str(tmp_path / "camera")))
    assert bundle.shape == (3, 224, 224)
    assert bundle.size_from == (
        "all 4 images are 400 wide x 300 high, larger than the 256 a source size is kept up to: 224, the usual "
        "ImageNet input; --image-size N chooses another (--image-size 300 their own)"
    )
    assert load_data(DataConfig(source=str(tmp_path / "camera"), image_size=300)).shape == (3, 300, 300)
    kept = load_data(DataConfig(source=str(tmp_path / "kept")))
    assert kept.shape == (3, 256, 256) and kept.size_from == "the source size: all 4 images are 256x256"


def test_image_sizes_are_said_width_by_height_and_a_range_by_real_images(tmp_path):
    """Photos 40 wide and 30 high were said to be "30x40"; 75x56 and 2400x1600 photos were "56x75 to 1600x2400", and
    the range's ends were per-axis minima and maxima, sizes that no image need have."""
    from PIL import Image

    for i, (w, h) in enumerate([(40, 30)] * 4):
        (tmp_path / "land" / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (w, h), (i * 40, 0, 0)).save(tmp_path / "land" / f"c{i % 2}" / f"{i}.png")
    bundle = load_data(DataConfig(source=str(tmp_path / "land")))
    assert bundle.shape == (3, 30, 30)
    assert bundle.size_from == "the source size: all 4 images are 40 wide x 30 high, square crops of the shorter side"
    # a tall narrow image and a wide short one: per axis, 10x10 to 60x60, neither of them
    for i, (w, h) in enumerate([(60, 10), (10, 60), (20, 25), (30, 30)]):
        (tmp_path / "odd" / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (w, h), (i * 40, 0, 0)).save(tmp_path / "odd" / f"c{i % 2}" / f"{i}.png")
    why = load_data(DataConfig(source=str(tmp_path / "odd"))).size_from
    assert why.startswith("the 4 images differ in size (by area, the smallest 20x25 and the largest 30x30, width x ")


def test_channel_stats_read_a_bounded_number_of_pixels(monkeypatch):
    """Large images: the statistics come from as many images as fit STATS_MAX_VALUES values, spread
    over the set (a float copy of 10,000 ImageNet-sized images took seconds of start-up; the first
    few hundred of an array in class order would be one class); small ones: the first 10,000."""
    from cnnpar.data import bundle

    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (40, 3, 16, 16), dtype=torch.uint8, generator=g)
    x[:20] //= 4  # "class order": the first half is darker; which images were read shows in the mean
    monkeypatch.setattr(bundle, "STATS_MAX_VALUES", 10 * 3 * 16 * 16)
    spread = bundle.channel_stats(x)
    assert spread == bundle.channel_stats(x[torch.linspace(0, 39, 10).round().long()].contiguous())
    assert bundle.channel_stats(x[:10])[0][0] < spread[0][0] < bundle.channel_stats(x[20:])[0][0]
    monkeypatch.setattr(bundle, "STATS_MAX_VALUES", 1)  # never fewer than one image
    assert bundle.channel_stats(x) == bundle.channel_stats(x[:1])
    monkeypatch.undo()
    cifar_sized = torch.zeros(10001, 3, 32, 32, dtype=torch.uint8)
    cifar_sized[10000] = 255  # the 10,001st image is beyond the 10,000 read
    assert bundle.channel_stats(cifar_sized)[0] == (0.0, 0.0, 0.0)


def test_arrays_whose_training_labels_are_all_one_class_are_refused(tmp_path):
    """One label trains to loss 0 and 100 % accuracy (an npz of one image did, with --val-fraction 0)."""
    x, _ = bar_images(6, side=8)
    np.savez(tmp_path / "one.npz", x_train=x, y_train=np.full(6, 3))
    with pytest.raises(DataError, match=r"one\.npz.*: every training label is 3: expected at least 2 classes"):
        load_data(DataConfig(source=str(tmp_path / "one.npz"), val_fraction=0.0))


def test_a_hold_out_that_leaves_one_class_to_train_on_is_refused_naming_the_hold_out(tmp_path):
    """A hold-out that happens to take every image of a class leaves one class to train on: that run's score
    would mean nothing, so it is refused, naming the seed and fraction that did it (another seed trains)."""
    from cnnpar.data.bundle import holdout

    x, _ = bar_images(6, side=8)
    np.savez(tmp_path / "six.npz", x_train=x, y_train=np.array([0, 0, 0, 0, 0, 1]))
    seed = next(s for s in range(100) if 5 in holdout(6, 0.2, s)[1].tolist())  # holds out the one label 1
    cfg = DataConfig(source=str(tmp_path / "six.npz"), val_fraction=0.2)
    named = rf"six\.npz.* after the seeded hold-out \(--val-fraction 0\.2, --seed {seed}\): every training label is 0: "
    with pytest.raises(DataError, match=named + r"expected at least 2 classes .*: lower --val-fraction"):
        load_data(cfg, seed)
    other = next(s for s in range(100) if 5 not in holdout(6, 0.2, s)[1].tolist())
    assert load_data(cfg, other).train.y.tolist().count(1) == 1


def test_float_pixels_mostly_in_0_1_with_a_few_above_are_refused_not_rounded_to_two_levels(tmp_path):
    from cnnpar.data.arrays import to_nchw_uint8

    x = np.random.default_rng(0).random((40, 8, 8)).astype(np.float32)
    assert to_nchw_uint8(x, "x").float().std() > 50  # 0..1 floats scaled to 0..255
    x[3, 2, 1] = 1.0001
    with pytest.raises(
        DataError,
        match=r"f\[x_train\]: 1 of 2,560 float values above 1 \(the first 1\.0001 at index "
        r"\(3, 2, 1\)\), the rest in \[0, 1\]: expected every value in \[0, 1\]",
    ):
        to_nchw_uint8(x, "f[x_train]")
    x[3, 2, 1] = 1.0
    assert to_nchw_uint8(x * 255, "x").float().std() > 50  # 0..255 floats read as they are


def test_float_pixels_brightened_past_1_are_refused_not_read_as_0_255_and_rounded_to_three_levels(tmp_path):
    """0..1 images scaled by 1.1 (many values above 1) passed the few-above-1 check, were read as 0..255 and
    trained on pictures of 0s, 1s and 2s without a word."""
    from cnnpar.data.arrays import to_nchw_uint8

    x = np.random.default_rng(0).random((40, 8, 8)).astype(np.float32) * 1.1
    refused = r"f\[x_train\]: float values in \[[0-9.e-]+, 1\.09\d*\]: neither pixels in \[0, 1\] nor in \[0, 255\] "
    with pytest.raises(DataError, match=refused + r".*expected every value in \[0, 1\]"):
        to_nchw_uint8(x, "f[x_train]")
    # read as 0..255 these round to four levels: refused too, where whole numbers (dark pixels) are read as they are
    with pytest.raises(DataError, match=r"x: float values in \[[0-9.e-]+, 3\.29\d*\], not whole numbers: .* to 4 grey"):
        to_nchw_uint8(x * 3, "x")
    assert to_nchw_uint8(np.rint(x * 3), "x").max() == 3
    np.savez(tmp_path / "b.npz", x_train=x, y_train=np.arange(40) % 2)
    with pytest.raises(DataError, match=r"b\.npz\[x_train\]: float values in"):
        load_data(DataConfig(source=str(tmp_path / "b.npz")), 0)


def test_images_in_formats_not_read_are_named_by_train_prepare_and_predict_not_dropped_unsaid(tmp_path):
    """A .webp and a .bmp among the PNGs and JPEGs: every path counted 12 images of 14 and said nothing; a class
    folder of BMPs alone was "empty"."""
    from PIL import Image

    from cnnpar.data.store_write import prepare_store

    root = write_image_folder(tmp_path / "imgs", per_class=6, classes=2, side=20)
    Image.new("RGB", (20, 20)).save(root / "class1" / "x.webp")
    Image.new("RGB", (20, 20)).save(root / "class0" / "y.bmp")
    (root / "class0" / ".z.bmp").write_bytes(b"hidden")  # hidden files stay unsaid
    bundle = load_data(DataConfig(source=str(root), val_fraction=0), 0)
    assert len(bundle.train) == 12
    assert bundle.skipped_note.startswith(
        f"warning: 2 image file(s) skipped, .bmp, .webp (first: {root / 'class0' / 'y.bmp'}): cnnpar reads .jpg, "
        ".jpeg and .png"
    )
    skipped = []
    ds, ids, _ = load_predict_data(str(root), image_size=20, skipped=skipped)
    assert len(ids) == 12 and sorted(f.name for f in skipped) == ["x.webp", "y.bmp"]
    skipped = []
    header = prepare_store(root, tmp_path / "s.cnnpar", progress=False, workers=1, skipped=skipped)
    assert header["count"] == 12 and len(skipped) == 2
    only_bmp = tmp_path / "bmp" / "a"
    only_bmp.mkdir(parents=True)
    Image.new("RGB", (20, 20)).save(only_bmp / "1.bmp")
    with pytest.raises(DataError, match=r"no \.jpg, \.jpeg or \.png files under its class folders \(only \.bmp files"):
        load_data(DataConfig(source=str(tmp_path / "bmp")), 0)


def test_a_blank_id_in_a_test_csv_is_named_not_written_to_the_submission_as_no_id(tmp_path):
    from cnnpar.data.csv_source import read_ids

    f = tmp_path / "t.csv"
    f.write_text("ImageId,pixel0,pixel1,pixel2,pixel3\n1,0,0,0,0\n2,9,9,9,9\n , 1,1,1,1\n4,0,0,0,0\n")
    with pytest.raises(DataError, match=r"t\.csv, line 4\b.*column 'ImageId': empty: expected the row's id"):
        read_ids(f)
    f.write_text("id,pixel0,pixel1,pixel2,pixel3\n007,0,0,0,0\n2,9,9,9,9\n")
    assert read_ids(f) == ("id", ["007", "2"])


def test_complex_pixels_are_refused_rather_than_losing_their_imaginary_part(tmp_path):
    from cnnpar.data.arrays import to_nchw_uint8

    x = np.ones((4, 8, 8), dtype=np.complex64) * (3 + 1j)
    with pytest.raises(DataError, match=r"c\[x_train\]: dtype complex64: expected uint8 or real numbers"):
        to_nchw_uint8(x, "c[x_train]")


def test_a_label_too_large_for_a_class_index_is_named_not_an_out_of_memory(tmp_path):
    """The class count is the largest label + 1: one stray 2**32-1 made a 4-billion-class run that the kernel
    killed without a word; a uint64 past 2**63 turned negative in the cast, after the range check."""
    from cnnpar.data.arrays import to_labels

    for y in (np.array([0, 1, 4294967295], np.uint32), np.array([0, 1, 2**63 + 5], np.uint64), np.array([0, 1, 1e20])):
        with pytest.raises(DataError, match=r"y_train, index 2: label .*: expected a class index from 0 to 999,999"):
            to_labels(y, 3, "y_train")
    x, y = bar_images(4, side=4)
    y[2] = 2**40
    path = write_pixel_csv(tmp_path / "big.csv", x, y)
    with pytest.raises(DataError, match=r"big\.csv, line 4 \(data row 3\): label 1099511627776: expected a class"):
        read_pixel_csv(path)


def test_a_folders_classes_are_its_class_folders_another_num_classes_is_refused_and_empty_ones_named(tmp_path):
    """--num-classes was silently ignored for a folder, while the empty-class warning told the user to pass it."""
    write_image_folder(tmp_path / "f", per_class=3, classes=3)
    (tmp_path / "f" / "dogs").mkdir()
    with pytest.raises(DataError, match=r"--num-classes 3: .*f has 4 class folders, which decide the classes: "
                       r"expected 4 or none"):  # fmt: skip
        load_data(DataConfig(source=str(tmp_path / "f"), image_size=8, num_classes=3), seed=0)
    bundle = load_data(DataConfig(source=str(tmp_path / "f"), image_size=8, num_classes=4), seed=0)
    assert class_lines(bundle)[1] == (
        "warning: 1 of 4 classes have no examples: 3 (empty class folders: dogs; expected images in each class "
        "folder: add some or remove it)"
    )


def test_empty_class_folders_whose_names_hold_commas_or_spaces_are_listed_quoted(tmp_path):
    """`com,ma, x, y` could not be split back into the folders 'com,ma' and 'x, y'."""
    write_image_folder(tmp_path / "f", per_class=3, classes=2)
    for name in ("com,ma", "x, y", "plain"):
        (tmp_path / "f" / name).mkdir()
    bundle = load_data(DataConfig(source=str(tmp_path / "f"), image_size=8), seed=0)
    assert "(empty class folders: 'com,ma', plain, 'x, y'; expected" in class_lines(bundle)[1]


def test_hidden_files_and_folders_inside_class_folders_are_not_images(tmp_path):
    """macOS leaves `._x.jpg` resource forks (no image: the whole run stopped on one) and tools leave `.thumbs/`."""
    write_image_folder(tmp_path / "f", per_class=2, classes=2)
    (tmp_path / "f" / "class0" / "._0.jpg").write_bytes(b"\x00\x05\x16\x07 not an image")
    (tmp_path / "f" / "class1" / ".thumbs").mkdir()
    (tmp_path / "f" / "class1" / ".thumbs" / "3.png").write_bytes((tmp_path / "f" / "class1" / "3.png").read_bytes())
    files, labels, _ = scan_folder(tmp_path / "f")
    assert [f.relative_to(tmp_path / "f").as_posix() for f in files] == [
        "class0/0.jpg", "class0/1.png", "class1/2.jpg", "class1/3.png"
    ]  # fmt: skip
    ds, ids, _ = load_predict_data(str(tmp_path / "f"), image_size=8)
    assert ids == ["class0/0.jpg", "class0/1.png", "class1/2.jpg", "class1/3.png"]


def test_a_format_that_cannot_be_what_data_is_is_refused_in_its_own_terms(tmp_path):
    arrays = write_npz(tmp_path / "d.npz", n_train=8, n_test=None)
    (tmp_path / "f").mkdir()
    with pytest.raises(DataError, match=r"d\.npz: --format csv but this is a zip archive .*: expected --format npz"):
        detect_format(str(arrays), "csv")
    with pytest.raises(DataError, match=r"f: --format csv but this is a folder: expected a file"):
        detect_format(str(tmp_path / "f"), "csv")
    with pytest.raises(DataError, match=r"d\.npz: --format folder but this is a file: expected a folder"):
        detect_format(str(arrays), "folder")
    assert detect_format(str(arrays), "npz") == "npz" and detect_format(str(tmp_path / "f"), "folder") == "folder"


def test_test_labels_that_no_training_example_has_are_refused_naming_the_file(tmp_path):
    """An npz whose y_test was y_train + 1 trained, counted the classes over both splits, and scored the model
    against a label it had never seen, without a word."""
    x, y = bar_images(40, side=8)
    np.savez(tmp_path / "shifted.npz", x_train=x[:32], y_train=y[:32], x_test=x[32:], y_test=y[32:] + 1)
    path = tmp_path / "shifted.npz"
    with pytest.raises(DataError) as e:
        load_data(DataConfig(source=str(path)))
    assert str(e.value) == (
        f"{path}: the data's own test split holds 1 label(s) that no training example has (4): expected validation "
        "labels among the training labels"
    )


def test_a_validation_class_folder_whose_training_folder_is_empty_is_refused_as_the_folder_is_scanned(tmp_path):
    from cnnpar.data.folder import scan_splits

    write_image_folder(tmp_path / "d" / "train", per_class=2, classes=3)
    write_image_folder(tmp_path / "d" / "val", per_class=1, classes=3)
    for f in (tmp_path / "d" / "train" / "class2").iterdir():
        f.unlink()
    with pytest.raises(DataError) as e:
        scan_splits(tmp_path / "d")  # what `cnnpar prepare` reads too
    assert str(e.value) == (
        f"{tmp_path / 'd' / 'val'}: class folder(s) 'class2' hold images but the same folders in "
        f"{tmp_path / 'd' / 'train'} hold none: expected training images for every class that val/ holds"
    )


def test_a_hold_out_that_takes_a_whole_class_warns_that_the_model_cannot_learn_it(tmp_path):
    """The hold-out is the seed's doing, not the data's, so it warns where a test split is refused."""
    from cnnpar.data.bundle import holdout

    x, _ = bar_images(6, side=8)
    np.savez(tmp_path / "six.npz", x_train=x, y_train=np.array([0, 0, 0, 1, 1, 2]))
    seed = next(s for s in range(100) if holdout(6, 0.2, s)[1].tolist() == [5])  # holds out the one label 2
    bundle = load_data(DataConfig(source=str(tmp_path / "six.npz"), val_fraction=0.2), seed)
    assert class_lines(bundle) == [
        "classes: 3 (labels' max + 1)",
        "warning: 1 of 3 classes have validation examples but no training example: 2: a seeded 20% hold-out of the "
        "training data (--val-fraction 0.2) took all of theirs, and the model cannot get them right (give those "
        "classes more examples, or lower --val-fraction)",
    ]


def test_an_image_shape_the_data_does_not_have_is_refused_not_recorded(tmp_path):
    """--image-shape shapes CSV rows and synthetic images; an .npz, a folder or the digits keep their own shape,
    so a typed shape that differs was recorded as the run's input while another one trained."""
    npz = write_npz(tmp_path / "bars.npz", n_train=64, n_test=None)
    shape = "x".join(map(str, load_data(DataConfig(source=str(npz)), 0).shape))
    assert load_data(DataConfig(source=str(npz), image_shape=shape), 0).shape[1:] == (16, 16)  # the same: fine
    for source in (str(npz), "digits"):
        with pytest.raises(DataError, match=r"^--image-shape 3x32x32: .* gives 1x\d+x\d+ images; .*--image-size"):
            load_data(DataConfig(source=source, image_shape="3x32x32"), 0)
    assert load_data(DataConfig(source="synthetic", image_shape="3x8x8", synthetic_samples=32), 0).shape == (3, 8, 8)


def test_a_jpeg_whose_frame_header_says_height_0_is_no_size_on_the_image_size_line(tmp_path, capsys):
    """A frame header's height of 0 (the height left to a DNL marker, which no decoder cnnpar uses reads) was taken
    for a size: the run said "the smallest 32x0" on its image-size line before refusing the file by name."""
    from PIL import Image

    from cnnpar.cli import main

    rng = np.random.default_rng(0)
    for i in range(40):
        (tmp_path / "data" / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(
            tmp_path / "data" / f"c{i % 2}" / f"{i}.jpg"
        )
    bad = tmp_path / "data" / "c0" / "0.jpg"
    jpeg = bytearray(bad.read_bytes())
    sof = jpeg.index(b"\xff\xc0")
    jpeg[sof + 5 : sof + 7] = b"\x00\x00"  # FF C0, 2 length bytes, the precision, then the height
    bad.write_bytes(bytes(jpeg))
    bundle = load_data(DataConfig(source=str(tmp_path / "data")))
    assert bundle.shape == (3, 32, 32) and bundle.size_from == "the source size: all 39 images are 32x32"
    args = ["train", "--data", str(tmp_path / "data"), "--epochs", "1", "--device", "cpu", "--workers", "0"]
    assert main([*args, "--no-progress", "--no-tensorboard", "--out-dir", str(tmp_path / "runs")]) == 2
    said = capsys.readouterr()
    assert "image size: 32 (the source size: all 39 images are 32x32)" in said.out, said.out
    assert "x0 " not in said.out
    lines = said.err.strip().splitlines()  # the file refused by name, as before (libjpeg's words in brackets)
    assert len(lines) == 1 and lines[0].startswith(f"cnnpar: error: {bad}: cannot decode as an image ("), said.err
