"""A folder of grey image files (digit PNGs) decodes to RGB, 3 equal channels: --augment auto mirrored it as it
mirrors colour photos (the same digits as a CSV were not mirrored), and an explicit flip went unwarned. Its headers
say it is grey; a store prepared from it keeps that; a folder with one colour file among grey ones is colour."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from cnnpar.cli import main
from cnnpar.config import DataConfig
from cnnpar.data import load_data
from cnnpar.data.bundle import split_line
from cnnpar.data.source_size import folder_sample
from cnnpar.data.store import StoreFile
from cnnpar.data.store_write import prepare_store
from cnnpar.data.transforms import mirror_warning, resolve_augment, tta_mirror_warning
from tests.datafiles import bar_images

pytestmark = pytest.mark.usefixtures("one_thread")
TINY = ["--device", "cpu", "--max-steps", "1", "--epochs", "1", "--no-progress", "--no-tensorboard"]


def grey_folder(root: Path, per_class: int = 4, classes: int = 2, colour: int = 0) -> Path:
    """root/class<k>/<i>.png|jpg of grey bar images: grey PNGs (colour type 0) and one-component JPEGs; the first
    `colour` files are written as RGB instead (3 equal channels, colour type 2)."""
    x, y = bar_images(per_class * classes, classes=classes, side=16)
    for i, (img, label) in enumerate(zip(x, y)):
        folder = root / f"class{label}"
        folder.mkdir(parents=True, exist_ok=True)
        image = Image.fromarray(img).convert("RGB" if i < colour else "L")
        image.save(folder / f"{i}.{'jpg' if i % 3 == 2 else 'png'}")
    return root


def _augment(bundle, augment: str = "auto") -> str:
    return resolve_augment(augment, bundle.shape, bundle.loader_crops, bundle.grey)


def test_a_folder_of_grey_files_is_grey_and_auto_does_not_mirror_it(tmp_path):
    root = grey_folder(tmp_path / "digits")
    files = sorted(root.rglob("*.*"))
    assert {f.suffix for f in files} == {".png", ".jpg"} and folder_sample(files).grey
    bundle = load_data(DataConfig(source=str(root)))
    assert bundle.shape == (3, 16, 16) and bundle.grey  # decoded to RGB, known to be grey
    assert _augment(bundle) == "none"  # the loader's random-resized crop stays: it is the folder's reading
    line = split_line(bundle)
    assert line.startswith("data: input 3x16x16 (grey files, decoded to RGB: 3 equal channels), train ")
    warning = mirror_warning("flip", bundle.shape, bundle.loader_crops, bundle.origin, bundle.grey)
    assert warning.startswith(f"warning: augment flip mirrors the grey (3-channel) images of {root}, which")
    assert tta_mirror_warning("flip", bundle.shape, bundle.loader_crops, bundle.origin, bundle.grey)


def test_one_colour_file_among_grey_ones_makes_the_folder_colour(tmp_path):
    root = grey_folder(tmp_path / "mixed", colour=1)
    bundle = load_data(DataConfig(source=str(root)))
    assert not bundle.grey and _augment(bundle) == "flip"
    assert not mirror_warning("flip", bundle.shape, bundle.loader_crops, bundle.origin, bundle.grey)
    assert "grey files" not in split_line(bundle)


def test_a_store_prepared_from_a_grey_folder_is_grey_and_one_from_colour_files_is_not(tmp_path):
    for name, colour in (("grey", 0), ("colour", 8)):
        root = grey_folder(tmp_path / name, colour=colour)
        store = tmp_path / f"{name}.cnnpar"
        prepare_store(root, store, 0, workers=1, progress=False)
        assert StoreFile(store).header["grey"] is (colour == 0)
        bundle = load_data(DataConfig(source=str(store)))
        assert bundle.grey is (colour == 0) and _augment(bundle) == ("none" if colour == 0 else "flip")


def test_the_start_of_a_run_on_grey_files_says_no_flip_and_warns_for_an_asked_one(tmp_path, capsys):
    """The data line said `random-resized crop (...) + flip` under auto, and an explicit flip was not warned about:
    the warning read that line, whose ` flip` after the crop's words is no flip token."""
    root = grey_folder(tmp_path / "digits")
    common = [*TINY, "--out-dir", str(tmp_path), "--data", str(root), "--model", "cnn3"]
    assert main(["train", *common, "--name", "auto"]) == 0
    out = capsys.readouterr().out
    data = next(ln for ln in out.splitlines() if ln.startswith("data: "))
    assert data.endswith("; augment random-resized crop (25-100 % of the area, --crop-min-scale)"), data
    assert "warning: augment" not in out
    assert main(["train", *common, "--augment", "flip", "--name", "flip"]) == 0
    out = capsys.readouterr().out
    assert f"warning: augment flip mirrors the grey (3-channel) images of {root}" in out
    colour = tmp_path / "colour"
    grey_folder(colour, colour=8)
    assert main(["train", *TINY, "--out-dir", str(tmp_path), "--data", str(colour), "--augment", "flip"]) == 0
    assert "warning: augment" not in capsys.readouterr().out  # colour photos: auto flips them too


def test_grey_arrays_stay_as_they_were():
    assert resolve_augment("auto", (1, 28, 28)) == "none" and resolve_augment("auto", (3, 32, 32)) == "crop+flip"
    assert resolve_augment("auto", (3, 64, 64), loader_crops=True) == "flip"
    assert mirror_warning("flip", (1, 28, 28), False, "mnist.npz").startswith(
        "warning: augment flip mirrors the 1-channel images of mnist.npz"
    )


def test_a_resume_compares_augment_by_what_auto_resolves_to_on_grey_data():
    """A resumed grey-folder run's auto trained with no flip: `--augment none` changes nothing and `--augment flip`
    does (the resume line compared them as a colour folder's auto, flip, and said the opposite)."""
    from types import SimpleNamespace

    from cnnpar.engine.resume_checks import resolved_augment

    bundle = SimpleNamespace(shape=(3, 28, 28), loader_crops=True, grey=True)
    assert resolved_augment("auto", bundle) == "none" == resolved_augment("none", bundle)
    assert resolved_augment("flip", bundle) == "flip"
