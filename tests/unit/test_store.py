"""The prepared image store (`cnnpar prepare`): what it holds, what it refuses, and training from it
(host path, resident path, the crop on the device, the CLI end to end)."""

from __future__ import annotations

import json
import pickle
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from cnnpar.cli import main as cli_main
from cnnpar.config import Config, DataConfig, RunConfig, resolve_for_device
from cnnpar.data.crop_resize import draw_crop_boxes, resized_crops_loop, tail_room
from cnnpar.data.loader import ResidentLoader, build_loader
from cnnpar.data.sources import detect_format, load_data
from cnnpar.data.store import MAGIC, PREFIX, StoreFile, left_partials, verify_store
from cnnpar.data.store_feed import RawBatch, StoreCropper
from cnnpar.data.store_write import fit_within, prepare_store
from cnnpar.dist import DistInfo
from cnnpar.errors import ConfigError, DataError
from tests.conftest import run_cmd
from tests.datafiles import write_image_folder

pytestmark = pytest.mark.usefixtures("one_thread")  # runs below train and predict in this process

CPU = DistInfo(0, 0, 1, torch.device("cpu"))
MAX_SIDE = 32


def smooth(w: int, h: int, mode: str = "RGB", phase: float = 0.0) -> Image.Image:
    """A smooth picture (JPEG keeps it nearly intact, so decoded-and-resized copies are comparable)."""
    y, x = np.mgrid[0:h, 0:w] / max(w, h)
    rgb = np.stack([127 + 100 * np.sin(6 * x + 3 * y + phase), 127 + 100 * np.cos(5 * x * y), 60 + 150 * x * y], -1)
    return Image.fromarray(rgb.round().astype(np.uint8)).convert(mode)


def photo_folder(root: Path) -> dict[str, tuple[str, Image.Image]]:
    """Two classes of odd files: a big JPEG (decoded at reduced scale), small ones, grey, CMYK,
    palette and RGBA PNGs. Returns {relative path: (how it was saved, the saved image)}."""
    files = {
        "cats/big.jpg": smooth(100, 60),
        "cats/pal.png": smooth(30, 20).convert("P"),
        "cats/small.png": smooth(20, 12, phase=1.0),
        "dogs/cmyk.jpg": smooth(30, 20, "CMYK"),
        "dogs/grey.jpg": smooth(40, 30, "L"),
        "dogs/rgba.png": smooth(24, 40, "RGBA"),
    }
    for rel, img in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        img.save(root / rel, quality=95) if rel.endswith(".jpg") else img.save(root / rel)
    return files


def pillow_reference(path: Path) -> np.ndarray:
    """What the store should hold: Pillow's full decode, RGB, resized so the longer side fits."""
    rgb = Image.open(path).convert("RGB")
    target = fit_within(*rgb.size, MAX_SIDE)
    return np.asarray(rgb if rgb.size == target else rgb.resize(target, Image.Resampling.BILINEAR))


def stored_image(store: StoreFile, k: int) -> np.ndarray:
    h, w = store.hw[k]
    return np.asarray(store.pixels[store.offsets[k] : store.offsets[k] + 3 * h * w]).reshape(h, w, 3)


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("photos")
    photo_folder(root / "photos")
    out = root / "photos.cnnpar"
    prepare_store(root / "photos", out, MAX_SIDE, workers=1, progress=False)
    return root / "photos", out


def data_cfg(source: Path, **kw) -> DataConfig:
    return DataConfig(source=str(source), image_size=16, **kw)


def one_line_error(fn, *names: str) -> str:
    with pytest.raises(DataError) as e:
        fn()
    text = str(e.value)
    assert "\n" not in text and all(n in text for n in names), text
    return text


def test_round_trip_holds_pillows_pixels_labels_and_classes(photos):
    folder, out = photos
    store = StoreFile(out)
    rels = sorted(str(p.relative_to(folder)) for p in folder.rglob("*.*"))
    assert store.class_names == ["cats", "dogs"] and store.header["layout"] == "HWC"
    assert store.labels.tolist() == [0, 0, 0, 1, 1, 1] and store.splits.tolist() == [0] * 6
    assert store.header["data_start"] % 4096 == 0
    for k, rel in enumerate(rels):
        got, want = stored_image(store, k), pillow_reference(folder / rel)
        assert got.shape == want.shape, rel
        assert max(got.shape[:2]) <= MAX_SIDE
        if rel == "cats/big.jpg":  # more than 2x the side: libjpeg decoded it at half scale first
            assert got.shape == (19, 32, 3) and np.abs(got.astype(int) - want).mean() < 2.0
        else:
            assert np.array_equal(got, want), rel
    assert stored_image(store, rels.index("cats/small.png")).shape == (12, 20, 3)  # never enlarged
    assert stored_image(store, rels.index("dogs/rgba.png")).shape == (32, 19, 3)  # aspect kept


def test_train_and_val_folders_become_the_stores_splits(tmp_path):
    write_image_folder(tmp_path / "p" / "train", per_class=3, classes=2)
    write_image_folder(tmp_path / "p" / "val", per_class=2, classes=2)
    header = prepare_store(tmp_path / "p", tmp_path / "p.cnnpar", MAX_SIDE, workers=1, progress=False)
    assert header["splits"] == {"train": 6, "val": 4}
    bundle = load_data(data_cfg(tmp_path / "p.cnnpar"), seed=0)
    folder = load_data(data_cfg(tmp_path / "p"), seed=0)
    assert (len(bundle.train), len(bundle.val)) == (len(folder.train), len(folder.val)) == (6, 4)
    assert bundle.val.labels.tolist() == folder.val.labels.tolist()
    assert bundle.shape == (3, 16, 16) and bundle.num_classes == 2 and bundle.class_names == folder.class_names


def test_prepare_reads_split_folders_by_their_common_names_and_refuses_one_class(tmp_path, monkeypatch):
    write_image_folder(tmp_path / "p" / "train", per_class=3, classes=2)
    write_image_folder(tmp_path / "p" / "valid", per_class=2, classes=2)
    header = prepare_store(tmp_path / "p", tmp_path / "p.cnnpar", MAX_SIDE, workers=1, progress=False)
    assert header["splits"] == {"train": 6, "val": 4} and header["class_names"] == ["class0", "class1"]
    write_image_folder(tmp_path / "one" / "train", per_class=3, classes=1)
    out = tmp_path / "one.cnnpar"
    one_line_error(
        lambda: prepare_store(tmp_path / "one", out, MAX_SIDE, workers=1, progress=False),
        f"{tmp_path / 'one' / 'train'}: images in one class folder ('class0'): expected at least 2 class folders",
    )
    assert not out.exists() and not left_partials(out)
    monkeypatch.setattr("cnnpar.data.folder._check_classes", lambda *a: None)  # a store from before the check
    prepare_store(tmp_path / "one", out, MAX_SIDE, workers=1, progress=False)
    one_line_error(
        lambda: load_data(data_cfg(out), 0),
        f"{out}: every training label is 0 ('class0'): expected at least 2 classes to tell apart",
        "; re-run cnnpar prepare on a folder of 2 or more class folders",
    )


def test_a_store_whose_header_names_two_classes_but_whose_training_images_are_one_class_is_refused(
    tmp_path, monkeypatch
):
    """An empty class folder names a class that holds nothing to tell apart: the rule reads the labels."""
    write_image_folder(tmp_path / "one", per_class=3, classes=1)
    (tmp_path / "one" / "class1").mkdir()
    out = tmp_path / "one.cnnpar"
    monkeypatch.setattr("cnnpar.data.folder._check_classes", lambda *a: None)  # a store from before the check
    prepare_store(tmp_path / "one", out, MAX_SIDE, workers=1, progress=False)
    assert StoreFile(out).class_names == ["class0", "class1"]
    one_line_error(
        lambda: load_data(data_cfg(out), 0),
        f"{out}: every training label is 0 ('class0'): expected at least 2 classes to tell apart",
    )


def test_seeded_hold_out_is_the_folders(photos):
    folder, out = photos
    for seed in (0, 3):
        cfg = dict(val_fraction=0.34)
        store, plain = load_data(data_cfg(out, **cfg), seed), load_data(data_cfg(folder, **cfg), seed)
        scanned = sorted(plain.train.files + plain.val.files)  # scan order: class folders, then names
        held_out = [scanned.index(f) for f in plain.val.files]
        assert store.val.ids.tolist() == held_out and len(held_out) == 2


def test_damaged_stores_are_refused_in_one_line(photos, tmp_path):
    _, out = photos
    data = out.read_bytes()
    cases = {
        "cut.cnnpar": (data[:-100], "truncated"),
        "magic.cnnpar": (b"NOTSTORE" + data[8:], "not a cnnpar store"),
        "version.cnnpar": (PREFIX.pack(MAGIC, 99, struct.unpack_from("<I", data, 12)[0]) + data[16:], "version 99"),
        "pixel.cnnpar": (data[:-1000] + bytes([data[-1000] ^ 1]) + data[-999:], None),  # not checked on open
        "empty.cnnpar": (b"", "too short"),
    }
    header_len = struct.unpack_from("<I", data, 12)[0]
    at = PREFIX.size + header_len + 3  # a byte of the index (offsets of image 0)
    cases["label.cnnpar"] = (data[:at] + bytes([data[at] ^ 1]) + data[at + 1 :], "checksum mismatch")
    for name, (content, reason) in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        if reason is None:
            StoreFile(path)  # opens: the pixels' checksum is --verify's job
            continue
        text = one_line_error(lambda p=path: load_data(data_cfg(p), 0), str(path), reason)
        assert "re-run cnnpar prepare" in text or "make one with cnnpar prepare" in text


def rewritten(
    store: Path, out: Path, header_len: int | None = None, index=None, drop=(), images: int | None = None, **fields
) -> Path:
    """`store` copied to `out` with header `fields` and index arrays `index` ({name: {image: value}}) changed, the
    header fields `drop` left out (a store of an older cnnpar), the index cut to its first `images` rows where given
    (with the count and index size to match), and the checksum taken again: a file that lies about itself
    consistently, as one crafted by hand would."""
    from cnnpar.data.store import encode_header, index_checksum, pack_index, unpack_index

    data = store.read_bytes()
    length = struct.unpack_from("<I", data, 12)[0]
    header = json.loads(data[PREFIX.size : PREFIX.size + length])
    n, start = header["count"], PREFIX.size + length
    arrays = unpack_index(data[start : start + header["index_bytes"]], n)
    for name, values in (index or {}).items():
        for k, v in values.items():
            arrays[name][k] = v
    raw = pack_index(*(arrays[k][:images] for k in ("offsets", "heights", "widths", "labels", "splits")))
    if images is not None:
        header.update(count=images, index_bytes=len(raw))
    header.update(fields)
    for name in drop:
        del header[name]
    header["index_checksum"] = index_checksum(header, raw)
    text = encode_header(header, length)
    assert len(text) == length, "the changed header must fit the old one's length"
    head = PREFIX.pack(MAGIC, 1, length if header_len is None else header_len) + text + raw
    out.write_bytes(head + data[len(head) :])
    return out


def test_a_store_whose_checksummed_header_and_index_lie_is_refused_naming_the_field(photos, tmp_path):
    """A store handed on by someone else: its checksum proves only that header and index were written together.
    Counts, offsets and sizes that do not fit the file read it all into memory (a negative index length),
    allocated terabytes (an image of 2**31 rows), read past the pixel area or trained on labels past the classes."""
    _, out = photos
    big = 2**31 - 1
    cases = [
        ({"index_bytes": -1}, "header field index_bytes is -1: expected a whole number >= 0"),
        ({"count": "6"}, "header field count is '6'"),
        ({"count": 7}, "header field index_bytes is 150: expected 175 for count 7"),
        ({"data_start": 0}, "header field data_start is 0"),
        ({"class_names": 5}, "header field class_names is 5"),
        ({"class_names": ["cats", "do/gs"]}, "header field class_names[1] is 'do/gs': expected a class folder's"),
        ({"class_names": ["cl\0ss0", "class1"]}, "header field class_names[0] is 'cl\\x00ss0'"),
        ({"class_names": ["", "dogs"]}, "header field class_names[0] is '': expected a class folder's name"),
        ({"index": {"heights": {0: big, 1: big}, "widths": {0: big, 1: big}}}, f"image 0 has {big}x{big} pixels"),
        ({"index": {"offsets": {2: -3}}}, "image 2 has"),
        ({"index": {"offsets": {1: 10**12}}}, "at offset 1,000,000,000,000: expected within pixel_bytes"),
        ({"index": {"labels": {3: 2}}}, "image 3 has label 2: expected 0 to 1 (its classes)"),
        ({"index": {"splits": {0: 7}}}, "image 0 has split 7: expected 0 (train) or 1 (val)"),
        ({"header_len": 2**32 - 1}, "header length 4,294,967,295 bytes, past the end"),
    ]
    for k, (change, reason) in enumerate(cases):
        path = rewritten(out, tmp_path / f"lie{k}.cnnpar", **change)
        text = one_line_error(lambda p=path: load_data(data_cfg(p), 0), str(path), reason)
        assert text.endswith("re-run cnnpar prepare"), text


def test_a_store_of_no_images_is_refused_in_one_line(photos, tmp_path):
    """prepare writes no store of a folder without images, but a store handed on can say count 0 consistently: with
    --image-size auto the run took the median side of no images, a NaN traceback (and its grey test sampled none)."""
    _, out = photos
    path = rewritten(out, tmp_path / "none.cnnpar", images=0)
    for cfg in (DataConfig(source=str(path)), data_cfg(path)):  # --image-size auto, and a size given
        text = one_line_error(lambda c=cfg: load_data(c, 0), str(path), "header field count is 0: expected 1 or more")
        assert text.endswith("re-run cnnpar prepare"), text


def test_a_store_class_name_no_folder_can_have_is_refused_naming_its_index(photos):
    """A store's class names are its folder's class folders' names (at most 255 bytes): a 10 MB name, in a store
    crafted by hand, went whole into every line naming classes. Checked as the header is (no room to rewrite it)."""
    from cnnpar.data.store import check_sizes

    _, out = photos
    header, header_len = dict(StoreFile(out).header), struct.unpack_from("<I", out.read_bytes(), 12)[0]
    header["class_names"] = ["class0", "x" * 10_000_000]
    text = one_line_error(lambda: check_sizes(out, header, header_len), str(out), "class_names[1] is 'xxx")
    assert "(10,000,000 characters): expected a class folder's name" in text and len(text) < 300, text
    header["class_names"] = ["class0", "line\nbreak"]  # a folder's name can hold a newline: kept
    check_sizes(out, header, header_len)


def test_a_lying_store_is_refused_by_the_cli_with_exit_2(photos, tmp_path, capsys):
    _, out = photos
    path = rewritten(out, tmp_path / "lie.cnnpar", index={"labels": {0: -1}})
    assert cli_main(["prepare", str(path), "--verify"]) == 2
    assert "image 0 has label -1" in capsys.readouterr().err


def test_verify_finds_a_flipped_pixel(photos, tmp_path, capsys):
    _, out = photos
    assert verify_store(out, progress=False)["count"] == 6
    data = bytearray(out.read_bytes())
    data[-50] ^= 0x10
    bad = tmp_path / "bad.cnnpar"
    bad.write_bytes(bytes(data))
    one_line_error(lambda: verify_store(bad, progress=False), str(bad), "pixel data checksum mismatch")
    assert cli_main(["prepare", "--verify", str(bad), "--no-progress"]) == 2
    assert "pixel data checksum mismatch" in capsys.readouterr().err
    assert cli_main(["prepare", "--verify", str(out), "--no-progress"]) == 0


def test_verify_given_the_folder_or_an_out_says_what_it_checks(photos, tmp_path, capsys):
    """`prepare FOLDER --verify` said "FOLDER: no such file: make it with cnnpar prepare FOLDER --out FOLDER", a
    command prepare refuses; an --out beside --verify was dropped without a word."""
    folder, out = photos
    assert cli_main(["prepare", str(folder), "--verify"]) == 2
    err = capsys.readouterr().err
    assert f"--verify {folder}: a folder" in err and f"{folder}.cnnpar" in err and "no such file" not in err
    assert cli_main(["prepare", str(out), "--verify", "--out", str(tmp_path / "x.cnnpar")]) == 2
    assert "--verify writes nothing" in capsys.readouterr().err


@pytest.mark.parametrize("workers", [1, 2])
def test_a_file_that_does_not_decode_leaves_nothing(tmp_path, workers):
    write_image_folder(tmp_path / "p", per_class=20, classes=2)
    bad = tmp_path / "p" / "class1" / "zz.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    out = tmp_path / "p.cnnpar"
    one_line_error(lambda: prepare_store(tmp_path / "p", out, MAX_SIDE, workers, progress=False), str(bad), "decode")
    assert not out.exists() and not left_partials(out)


def test_a_mistyped_folder_is_called_no_such_folder_and_a_file_not_a_folder(tmp_path, capsys):
    """A path that does not exist was called "not a folder", as if a file stood there."""
    (tmp_path / "afile").write_text("x")
    for name, what in (("photoz", "no such folder"), ("afile", "not a folder")):
        out = tmp_path / f"{name}.cnnpar"
        assert cli_main(["prepare", str(tmp_path / name), "--out", str(out), "--no-progress"]) == 2
        assert capsys.readouterr().err == (
            f"cnnpar: error: {tmp_path / name}: {what}: expected root/<class>/<image>.jpg|png\n"
        )
        assert not out.exists()


def test_an_out_that_is_a_folder_is_refused_before_decoding(tmp_path, capsys, monkeypatch):
    """It decoded every image, then failed on the rename with IsADirectoryError."""
    write_image_folder(tmp_path / "p", per_class=2, classes=2)
    (tmp_path / "X").mkdir()

    def no_decoding(*a):
        raise AssertionError("decoded before refusing --out")

    monkeypatch.setattr("cnnpar.data.store_write.decode_for_store", no_decoding)
    assert cli_main(["prepare", str(tmp_path / "p"), "--out", str(tmp_path / "X"), "--workers", "1"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"cnnpar: error: --out {tmp_path / 'X'}: is a folder: expected the store file to write, "
        f"such as {tmp_path / 'X' / 'p'}.cnnpar"
    )
    assert list((tmp_path / "X").iterdir()) == [] and not left_partials(tmp_path / "X")


def test_an_out_that_is_not_a_store_path_is_refused_and_left_as_it_was(tmp_path, capsys, monkeypatch):
    """An --out of another name (a CSV beside the photos, one of the photos) was replaced by the store, and the
    printed `--data` of a name without .cnnpar then failed; a store is still replaced."""
    write_image_folder(tmp_path / "p", per_class=2, classes=2)
    csv = tmp_path / "train.csv"
    csv.write_text("label,pixel0\n1,0\n")
    photo = next((tmp_path / "p").rglob("*.*"))
    kept = photo.read_bytes()
    lookalike = tmp_path / "other.cnnpar"
    lookalike.write_bytes(b"not a store")

    def no_decoding(*a):
        raise AssertionError("decoded before refusing --out")

    monkeypatch.setattr("cnnpar.data.store_write.decode_for_store", no_decoding)
    for out, why in ((csv, "expected a name ending in .cnnpar"), (photo, "expected a name ending in .cnnpar"),
                     (tmp_path / "p.store", "expected a name ending in .cnnpar"),
                     (lookalike, "exists and is not a cnnpar store")):  # fmt: skip
        assert cli_main(["prepare", str(tmp_path / "p"), "--out", str(out), "--workers", "1"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"cnnpar: error: --out {out}: ") and why in err and "\n" not in err, err
    assert csv.read_text() == "label,pixel0\n1,0\n" and photo.read_bytes() == kept
    assert lookalike.read_bytes() == b"not a store" and not (tmp_path / "p.store").exists()
    monkeypatch.undo()
    store = tmp_path / "s.cnnpar"
    for _ in range(2):  # a store in the way is replaced
        assert cli_main(["prepare", str(tmp_path / "p"), "--out", str(store), "--workers", "1", "--no-progress"]) == 0
    assert StoreFile(store).count == 4


def test_a_killed_prepare_leaves_a_partial_that_is_refused(tmp_path):
    """The writer is SIGKILLed mid-way (no clean-up can run): what it leaves is never read as data."""
    write_image_folder(tmp_path / "p", per_class=4, classes=2, side=64)  # 12 KB each: past Python's write buffer
    out = tmp_path / "p.cnnpar"
    script = (
        "import os, signal, sys\n"
        "from cnnpar.data import store_write as w\n"
        "real, seen = w.decode_for_store, []\n"
        "def dying(path, side):\n"
        "    seen.append(path)\n"
        "    if len(seen) == 5: os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return real(path, side)\n"
        "w.decode_for_store = dying\n"
        "w.prepare_store(sys.argv[1], sys.argv[2], 64, workers=1, progress=False)\n"
    )
    proc = run_cmd([sys.executable, "-c", script, str(tmp_path / "p"), str(out)], tmp_path, timeout=60)
    assert proc.returncode == -9, proc.stderr
    [partial] = left_partials(out)
    assert not out.exists() and partial.stat().st_size > 0
    one_line_error(lambda: load_data(data_cfg(out), 0), str(out), partial.name, "re-run cnnpar prepare")
    assert detect_format(str(partial), "auto") == "store"
    one_line_error(lambda: load_data(data_cfg(partial), 0), str(partial), "half-written", "re-run cnnpar prepare")
    renamed = tmp_path / "renamed.cnnpar"
    partial.rename(renamed)
    one_line_error(lambda: StoreFile(renamed), str(renamed), "header was never written", "re-run cnnpar prepare")
    # and re-running prepare to it does replace it (it said "move the file away first")
    assert cli_main(["prepare", str(tmp_path / "p"), "--out", str(renamed), "--workers", "1", "--no-progress"]) == 0
    assert StoreFile(renamed).count == 8


def test_a_batch_is_one_flat_tensor_and_pickles_without_the_mapping(photos):
    _, out = photos
    bundle = load_data(data_cfg(out, val_fraction=0.0), 0)
    ds = bundle.train
    batch, labels = ds[[4, 0, 2]]  # what the DataLoader asks with batch_size=None and a BatchSampler
    assert isinstance(batch, RawBatch) and batch.flat.dim() == 1 and batch.flat.dtype == torch.uint8
    assert batch.index.tolist() == [4, 0, 2] and labels.tolist() == batch.labels.tolist() == [1, 0, 0]
    for k, i in enumerate([4, 0, 2]):
        h, w = batch.hw[k].tolist()
        start = int(batch.starts[k])
        got = batch.flat[start : start + 3 * h * w].numpy().reshape(h, w, 3)
        assert np.array_equal(got, stored_image(ds.store, i))
    again = pickle.loads(pickle.dumps(ds))
    assert again.store._pixels is None and ds.store._pixels is not None
    assert torch.equal(again[[1]][0].flat, ds[[1]][0].flat)
    image, label = ds[3]  # one image, the centre square at the bundle's size (the textbook loader)
    assert image.shape == (3, 16, 16) and image.dtype == torch.uint8 and int(label) == 1


def test_cropper_matches_the_per_image_reference(photos):
    _, out = photos
    ds = load_data(data_cfg(out, val_fraction=0.0), 0).train
    ids = list(range(len(ds)))
    batch, _ = ds[ids]
    for train in (True, False):
        got = StoreCropper(ds, torch.device("cpu"), train, seed=7)(batch)
        boxes = draw_crop_boxes(batch.hw, train, torch.Generator().manual_seed(7))
        images = [torch.from_numpy(stored_image(ds.store, i).copy()).permute(2, 0, 1) for i in ids]
        want = resized_crops_loop(images, boxes, ds.size)
        assert got.shape == want.shape == (len(ids), 3, 16, 16)
        assert (got.int() - want.int()).abs().max() <= 1


def test_resident_on_cpu_gives_the_host_paths_batches(photos):
    _, out = photos
    batches = {}
    for resident in ("off", "on"):
        cfg = Config(data=data_cfg(out, resident=resident, workers=0), run=RunConfig(batch_size=2, seed=5))
        bundle = load_data(cfg.data, cfg.run.seed)
        feeder = build_loader(bundle, resolve_for_device(cfg, "cpu", True), CPU, train=True)
        assert feeder.decoder.resident == (resident == "on") and feeder.transform.flip and not feeder.transform.crop
        feeder.set_epoch(1)
        batches[resident] = list(feeder)
    assert len(batches["on"]) == len(batches["off"]) == 2
    for (xa, ya), (xb, yb) in zip(batches["on"], batches["off"]):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_resident_on_is_refused_where_nothing_can_be_held_whole(photos):
    """--resident on with a photo folder (decoded batch by batch) or the textbook loader was recorded "on" and
    not done; it is refused in one line, and still taken by a store and by in-memory data."""
    folder, _ = photos
    cfg = Config(data=data_cfg(folder, resident="on", workers=0), run=RunConfig(batch_size=2))
    bundle = load_data(cfg.data, cfg.run.seed)
    with pytest.raises(ConfigError, match=r"^--resident on: .*photos is decoded batch by batch") as e:
        build_loader(bundle, resolve_for_device(cfg, "cpu", True), CPU, train=True)
    assert "\n" not in str(e.value)
    digits = Config(data=DataConfig(source="digits", resident="on", workers=0), run=RunConfig(batch_size=2))
    bundle = load_data(digits.data, 0)
    assert isinstance(
        build_loader(bundle, resolve_for_device(digits, "cpu", True), CPU, train=True).loader, ResidentLoader
    )
    textbook = Config(
        data=DataConfig(source="digits", resident="on", workers=0, loader="textbook"), run=RunConfig(batch_size=2)
    )
    with pytest.raises(ConfigError, match="--loader textbook"):
        build_loader(bundle, resolve_for_device(textbook, "cpu", True), CPU, train=True)


def test_prepare_refuses_a_short_side_above_the_max_side_before_writing(photos, tmp_path, capsys):
    """--max-side 8 caps both sides at 8: a --short-side 16 beside it was accepted and never met."""
    folder, _ = photos
    out = tmp_path / "x.cnnpar"
    assert cli_main(["prepare", str(folder), "--out", str(out), "--short-side", "16", "--max-side", "8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--short-side 16 with --max-side 8: " in err
    assert "expected --short-side at most --max-side" in err
    assert not list(tmp_path.iterdir())  # nothing written, not even a partial store
    assert cli_main(["prepare", str(folder), "--out", str(out), "--short-side", "8", "--max-side", "8"]) == 0


def test_prepare_then_train_through_the_cli(photos, tmp_path, monkeypatch, capsys):
    folder, _ = photos
    monkeypatch.chdir(tmp_path)  # --data x.cnnpar relative, runs/ the default --out-dir
    assert cli_main(["prepare", str(folder), "--out", str(tmp_path / "x.cnnpar"), "--max-side", "40"]) == 0
    header = StoreFile(tmp_path / "x.cnnpar").header
    assert header["max_side"] == 40 and header["source"] == str(folder.resolve())
    capsys.readouterr()
    assert cli_main(["train", "--data", "x.cnnpar", "--epochs", "1", "--model", "cnn3", "--image-size", "32",
                     "--batch-size", "2", "--name", "store", "--no-progress"]) == 0  # fmt: skip
    run = tmp_path / "runs" / "store"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["images_per_s"] > 0 and (run / "metrics.csv").is_file() and (run / "ckpt" / "last.pt").is_file()
    assert "x.cnnpar" in capsys.readouterr().out


def test_a_prepare_stopped_with_sigterm_leaves_nothing(tmp_path):
    """`timeout`, `kill` and schedulers send SIGTERM, which skipped the clean-up a Ctrl-C runs: the half-written
    partial file stayed behind. cnnpar prepare turns it into an exit that removes it."""
    write_image_folder(tmp_path / "p", per_class=4, classes=2, side=64)
    out = tmp_path / "p.cnnpar"
    script = (
        "import os, signal, sys\n"
        "from cnnpar.cli import main\n"
        "from cnnpar.data import store_write as w\n"
        "real, seen = w.decode_for_store, []\n"
        "def stopped(path, side):\n"
        "    seen.append(path)\n"
        "    if len(seen) == 5: os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return real(path, side)\n"
        "w.decode_for_store = stopped\n"
        "sys.exit(main(['prepare', sys.argv[1], '--out', sys.argv[2], '--workers', '1', '--no-progress']))\n"
    )
    proc = run_cmd([sys.executable, "-c", script, str(tmp_path / "p"), str(out)], tmp_path, timeout=60)
    assert proc.returncode == 128 + 15, proc.stderr
    assert not out.exists() and not left_partials(out)


def test_the_shorter_side_bounds_the_store_and_a_crop_that_enlarges_most_images_is_said(tmp_path, capsys):
    """`--short-side` (the default, 256) keeps a 4:3 photo's shorter side for crops of 224; `--max-side 256` alone
    stored it at 256x192, which every 224 crop enlarges. A run whose image size enlarges most of its images (a
    store of 16-px images trained at 224) says so, from a store and from a folder, with what keeps them."""
    from cnnpar.data.store_write import Sides

    assert fit_within(320, 240, short_side=120) == (160, 120) and fit_within(320, 240, max_side=256) == (256, 192)
    assert fit_within(320, 240, 256, 120) == (160, 120) and fit_within(100, 80, short_side=256) == (100, 80)
    assert Sides(0, 0).target(4000, 3000) == (4000, 3000)  # --short-side 0 --max-side 0: each photo at its own size
    photos = tmp_path / "photos"
    for k, (w, h) in enumerate([(320, 240), (240, 320), (300, 300), (330, 220)]):
        (photos / f"c{k % 2}").mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (w, h), (40 * k, 90, 200)).save(photos / f"c{k % 2}" / f"{k}.jpg")
    assert cli_main(["prepare", str(photos), "--out", str(tmp_path / "a.cnnpar"), "--short-side", "120"]) == 0
    assert "shorter side <= 120" in capsys.readouterr().out
    assert cli_main(["prepare", str(photos), "--out", str(tmp_path / "full.cnnpar"), "--short-side", "0"]) == 0
    assert "full size (no bound on either side)" in capsys.readouterr().out
    assert sorted(StoreFile(tmp_path / "full.cnnpar").hw.tolist()) == sorted(
        [[240, 320], [320, 240], [300, 300], [220, 330]]
    )
    store = StoreFile(tmp_path / "a.cnnpar")
    assert sorted(map(tuple, store.hw.tolist())) == [(120, 120), (120, 160), (120, 180), (160, 120)]
    # no longer side bound (max_side 0): the tail room for the row windows comes from the widest image
    assert store.header["max_side"] == 0 and store.tail_padding() >= tail_room(int(store.hw[:, 1].max()))
    # --max-side alone bounds the longer side only, as before --short-side existed
    assert cli_main(["prepare", str(photos), "--out", str(tmp_path / "b.cnnpar"), "--max-side", "256"]) == 0
    assert StoreFile(tmp_path / "b.cnnpar").header["short_side"] == 0
    longer_bound = load_data(DataConfig(source=str(tmp_path / "b.cnnpar"), image_size=224), 0)
    note = longer_bound.size_note
    assert "image size 224 enlarges most images" in note and "--short-side 256 and no --max-side" in note, note
    own_bound = load_data(DataConfig(source=str(tmp_path / "a.cnnpar"), image_size=224), 0).size_note
    assert "prepare the store again with --short-side 256" in own_bound and "--max-side" not in own_bound
    whole = load_data(DataConfig(source=str(photos), image_size=224), 0)
    assert whole.size_note == ""  # the photos themselves are large enough
    small = tmp_path / "small"
    for k in range(6):
        (small / f"c{k % 2}").mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (10 + k, 12 + k), (9, 9, 9)).save(small / f"c{k % 2}" / f"{k}.png")
    folder = load_data(DataConfig(source=str(small)), 0)
    assert (
        folder.shape[1] == 224 and "enlarges most images" in folder.size_note and "--image-size 12" in folder.size_note
    )
    assert "--short-side" not in folder.size_note  # a folder is not prepared again
    assert cli_main(["prepare", str(small), "--out", str(tmp_path / "small.cnnpar")]) == 0
    small_photos = load_data(DataConfig(source=str(tmp_path / "small.cnnpar")), 0).size_note
    assert "enlarges most images" in small_photos and "prepare" not in small_photos  # the photos are small


def test_a_store_of_small_photos_is_not_told_to_be_prepared_again(tmp_path):
    """Photos of 100 x 80 stored under --max-side 256 were kept as they were: preparing them again with
    --short-side 256 stores the same pixels, and crops of 224 still enlarge them. The note keeps its
    --image-size advice and drops the prepare one."""
    from PIL import Image

    from cnnpar.config import DataConfig
    from cnnpar.data import load_data
    from cnnpar.data.store_write import prepare_store

    photos = tmp_path / "photos"
    for k in range(4):
        (photos / f"c{k % 2}").mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (100, 80), (40 * k, 90, 200)).save(photos / f"c{k % 2}" / f"{k}.jpg")
    prepare_store(photos, tmp_path / "s.cnnpar", 256, workers=0, progress=False)
    note = load_data(DataConfig(source=str(tmp_path / "s.cnnpar"), image_size=224), 0).size_note
    assert "image size 224 enlarges most images" in note and "--image-size 80 keeps them" in note, note
    assert "prepare the store again" not in note


def test_a_store_replaced_under_a_run_is_refused_not_read_through_the_old_index(photos, tmp_path):
    """A prepare renamed a new store over the one a run trained from: workers that mapped the path afterwards read
    the new pixels through the old index (other sizes, other offsets) and trained on them, exit 0."""
    import shutil

    folder, out = photos
    live = tmp_path / "live.cnnpar"
    shutil.copy(out, live)
    opened = StoreFile(live)
    in_worker = pickle.loads(pickle.dumps(opened))  # as a DataLoader worker receives it: the mapping is its own
    assert stored_image(pickle.loads(pickle.dumps(opened)), 0).shape == tuple(opened.hw[0]) + (3,)  # unchanged: reads
    prepare_store(folder, tmp_path / "other.cnnpar", 32, workers=1, progress=False)
    (tmp_path / "other.cnnpar").replace(live)  # what a second prepare to the same --out does
    for store in (opened, in_worker):
        one_line_error(lambda store=store: store.pixels, str(live), "replaced since this run opened it")
    assert StoreFile(live).pixels.size > 0  # a run started now opens the new store as usual


def test_a_store_replaced_while_a_run_opens_it_is_refused_not_read_through_the_old_index(photos, tmp_path, monkeypatch):
    """A prepare renamed a new store over the path between a run's reading of the header and index and its note of
    which file they came from (a stat by path): the note named the new file, so the check above passed and the run
    read the new pixels through the old index. The race is forced: the rename happens as the header's file closes."""
    import shutil

    import cnnpar.data.store as store_module

    folder, out = photos
    live, other = tmp_path / "live.cnnpar", tmp_path / "other.cnnpar"
    shutil.copy(out, live)
    prepare_store(folder, other, 32, workers=1, progress=False)
    read = store_module.read_checked

    def read_then_replaced(path):
        found = read(path)
        other.replace(live)  # a second prepare to the same --out finishes now
        return found

    monkeypatch.setattr(store_module, "read_checked", read_then_replaced)
    opened = StoreFile(live)
    one_line_error(lambda: opened.pixels, str(live), "replaced since this run opened it")


def test_a_store_written_over_in_place_under_a_run_is_refused_naming_it(photos, tmp_path):
    """Bytes written into the store a run has mapped (a copy over it in place, a sync) were read through the old
    index without a word: a batch read after the change is refused in one line naming the store."""
    import os
    import shutil

    from cnnpar.data.store_feed import StoreDataset

    live = tmp_path / "live.cnnpar"
    shutil.copy(photos[1], live)
    opened = StoreFile(live)
    ds = StoreDataset(opened, torch.arange(opened.count), 16)
    ds[[0, 1]]  # mapped, read: the run's first batch
    with live.open("r+b") as f:
        f.seek(opened.header["data_start"])
        f.write(bytes(64))
    st = live.stat()
    os.utime(live, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a write within the clock's tick keeps the mtime
    one_line_error(lambda: ds[[0, 1]], str(live), "changed while this run read it", "written over in place")


def test_a_store_truncated_under_a_run_is_refused_in_one_line_not_a_silent_bus_error(photos, tmp_path):
    """A store truncated while a run had it mapped: reading a page past the new end raised SIGBUS, which killed the
    run with no message (exit -7). Run apart: without the check it kills the process that reads."""
    import shutil

    live = tmp_path / "live.cnnpar"
    shutil.copy(photos[1], live)
    script = (
        "import os, sys, torch\n"
        "from cnnpar.data.store import StoreFile\n"
        "from cnnpar.data.store_feed import StoreDataset\n"
        "from cnnpar.errors import DataError\n"
        "store = StoreFile(sys.argv[1])\n"
        "ds = StoreDataset(store, torch.arange(store.count), 16)\n"
        "ds[list(range(store.count))]\n"
        "os.truncate(sys.argv[1], store.header['data_start'])\n"
        "for read in (lambda: ds[list(range(store.count))], lambda: store.on_device(torch.device('cpu'))):\n"
        "    try:\n"
        "        read()\n"
        "    except DataError as e:\n"
        "        print(e)\n"
    )
    done = run_cmd([sys.executable, "-c", script, str(live)], tmp_path, timeout=60)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    lines = done.stdout.splitlines()  # a batch read, and the copy of the pixel area to the device (--resident)
    assert len(lines) == 2 and all(f"{live}: changed while this run read it (truncated" in ln for ln in lines), lines


def test_a_store_trains_at_the_size_its_photos_folder_trains_at_where_it_holds_it(tmp_path):
    """Photos of 300x400 and 600x800 train at 224 from their folder (they differ in size); stored at a shorter side
    of 256 they are all 256x341, which read as one source size: the store's run trained at 256."""
    sizes = {"mixed": [(400, 300), (800, 600)] * 3, "same": [(320, 240)] * 6}
    short = {"mixed": 256, "same": 128}  # "same": a store bounded below the folder's own 240
    for name, dims in sizes.items():
        for i, (w, h) in enumerate(dims):
            (tmp_path / name / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
            smooth(w, h).save(tmp_path / name / f"c{i % 2}" / f"{i}.jpg", quality=80)
        prepare_store(
            tmp_path / name, tmp_path / f"{name}.cnnpar", 0, workers=1, progress=False, short_side=short[name]
        )

    def side(source: Path):
        bundle = load_data(DataConfig(source=str(source), val_fraction=0.5), 0)
        return bundle.shape[1], bundle.size_from

    assert side(tmp_path / "mixed")[0] == 224
    size, why = side(tmp_path / "mixed.cnnpar")
    assert size == 224 and why.startswith(f"as --data {(tmp_path / 'mixed').resolve()} trains: the 6 images differ")
    assert side(tmp_path / "same")[0] == 240  # the folder trains at its photos' size, which the store cannot hold
    size, why = side(tmp_path / "same.cnnpar")
    assert size == 128 and why.startswith("the store's size: all 6 images are 171 wide x 128 high")
    assert why.endswith(
        "trains at 240: the source size: all 6 images are 320 wide x 240 high, square crops of the shorter side)"
    )


def test_a_store_whose_folder_changed_since_prepare_says_so(tmp_path):
    """A class added to the folder and photos removed after prepare: the store trained on without a word."""
    folder = tmp_path / "photos"
    photo_folder(folder)
    out = tmp_path / "photos.cnnpar"
    prepare_store(folder, out, MAX_SIDE, workers=1, progress=False)
    assert load_data(data_cfg(out), 0).load_note == ""  # unchanged
    (folder / "dogs" / "grey.jpg").unlink()
    (folder / "birds").mkdir()
    smooth(30, 20).save(folder / "birds" / "a.jpg")
    note = load_data(data_cfg(out), 0).load_note
    assert note.startswith(f"warning: {folder.resolve()} changed since {out} was prepared from it"), note
    assert note.endswith(f"cnnpar prepare {folder.resolve()} --out {out} again trains on the folder as it is")
    bundle = load_data(data_cfg(out), 0)
    assert bundle.class_names == ["cats", "dogs"] and len(bundle.train) + len(bundle.val or []) == 6  # as prepared
    folder.rename(tmp_path / "moved")  # a store travels without its photos: nothing to compare, nothing said
    assert load_data(data_cfg(out), 0).load_note == ""


def test_a_store_prepared_before_grey_was_recorded_is_read_as_grey_from_its_pixels(tmp_path):
    """A store of grey PNGs prepared before session 34 has no header field `grey`: read as colour, a new run's
    --augment auto mirrored the digits that the folder, or a store prepared now, leaves unmirrored, without a word."""
    from cnnpar.data.transforms import resolve_augment

    folder = tmp_path / "grey"
    for k in range(4):
        (folder / f"c{k % 2}").mkdir(parents=True, exist_ok=True)
        smooth(20, 16, "L", phase=k).save(folder / f"c{k % 2}" / f"{k}.png")
    prepare_store(folder, tmp_path / "grey.cnnpar", MAX_SIDE, workers=1, progress=False)
    smooth(20, 16, phase=5).save(folder / "c1" / "colour.png")  # one colour photo makes a folder colour
    prepare_store(folder, tmp_path / "colour.cnnpar", MAX_SIDE, workers=1, progress=False)
    for name, is_grey in (("grey", True), ("colour", False)):
        assert StoreFile(tmp_path / f"{name}.cnnpar").header["grey"] is is_grey
        older = rewritten(tmp_path / f"{name}.cnnpar", tmp_path / f"old-{name}.cnnpar", drop=("grey",))
        bundle = load_data(data_cfg(older), 0)
        assert bundle.grey is is_grey
        assert resolve_augment("auto", bundle.shape, bundle.loader_crops, bundle.grey) == (
            "none" if is_grey else "flip"
        )
        assert ("before 2026-12-04" in bundle.load_note) is is_grey, bundle.load_note


def test_a_second_held_out_folder_beside_train_is_named_not_dropped(tmp_path, capsys):
    """train/ + val/ + test/: val/ validated and test/ was left out without a word, by train and prepare alike."""
    for split in ("train", "val", "test"):
        photo_folder(tmp_path / "p" / split)
    note = load_data(data_cfg(tmp_path / "p"), 0).load_note
    assert note == (
        f"warning: {tmp_path / 'p'}: validates on val/; test/ beside it not read (one held-out split is used, the "
        "first of val|valid|validation|test|testing/): move it out, or predict on it with cnnpar predict"
    )
    assert cli_main(["prepare", str(tmp_path / "p"), "--out", str(tmp_path / "p.cnnpar"), "--no-progress"]) == 0
    assert note in capsys.readouterr().out
    (tmp_path / "p" / "test").rename(tmp_path / "test")
    assert load_data(data_cfg(tmp_path / "p"), 0).load_note == ""


@pytest.mark.parametrize("sides", [{"max_side": 0, "short_side": 24}, {"max_side": 40, "short_side": 0}])
def test_predict_on_the_folder_of_a_store_run_sees_the_store_validations_pixels(tmp_path, sides):
    """A run trained from a store validated on prepare's Pillow-resized pixels; predict on the photos' folder read
    them at full size (2.3 levels mean apart on the audit's photos). With the checkpoint's `prepared_sides` it
    resizes each photo as prepare did and crops it as the store's validation does: the same pixels."""
    from cnnpar.data.folder import scan_splits
    from cnnpar.data.sources import load_predict_data
    from tests.datafiles import write_noise_jpegs

    # 48..92 x 64 noise: 24 is under half of every short side (prepare's DCT-scaled decode), 40 shrinks them all
    root = write_noise_jpegs(tmp_path / "photos", n=12, first_height=48, width=64)
    out = tmp_path / "p.cnnpar"
    prepare_store(root, out, sides["max_side"], workers=1, progress=False, short_side=sides["short_side"])
    bundle = load_data(DataConfig(source=str(out), image_size=16, val_fraction=0.5))
    val = bundle.val
    cfg = resolve_for_device(Config(data=DataConfig(source=str(out), image_size=16, workers=0)), "cpu", False)
    feeder = build_loader(bundle, cfg, CPU, train=False)
    batch, _ = val[list(range(len(val)))]
    validated = feeder.decoder(batch)  # the store's validation pixels (uint8), before normalising
    files, _, _, _ = scan_splits(root)  # the store holds the folder's photos in this order
    ds, ids, _ = load_predict_data(str(root), "folder", image_size=16, prepared=sides)
    by_name = {name: k for k, name in enumerate(ids)}
    order = [by_name[str(files[i].relative_to(root))] for i in val.ids.tolist()]
    predicted = ds[order][0]
    assert torch.equal(predicted, validated)
    # the read without the store's resize differs, so the test tells the two apart
    plain, _, _ = load_predict_data(str(root), "folder", image_size=16)
    assert not torch.equal(plain[order][0], validated)


def test_a_store_whose_header_nests_brackets_past_json_s_depth_is_refused_in_one_line(photos, tmp_path):
    """json.loads of a header of nested brackets raised RecursionError, which the header's check did not take: a
    traceback where a damaged header is refused in one line."""
    _, out = photos
    data = out.read_bytes()
    length = struct.unpack_from("<I", data, 12)[0]
    path = tmp_path / "nested.cnnpar"
    path.write_bytes(PREFIX.pack(MAGIC, 1, 100_000) + b"[" * 100_000 + data[PREFIX.size + length :])
    text = one_line_error(lambda: load_data(data_cfg(path), 0), str(path), "unreadable header (RecursionError")
    assert text.endswith("re-run cnnpar prepare"), text


def test_a_second_prepare_to_the_same_out_says_it_replaces_the_store(tmp_path, capsys):
    """A re-run (new photos, another --max-side) replaced hours of decoding without a word."""
    write_image_folder(tmp_path / "p", per_class=3, classes=2, side=24)
    out = tmp_path / "p.cnnpar"
    args = ["prepare", str(tmp_path / "p"), "--out", str(out), "--workers", "1", "--no-progress"]
    assert cli_main(args) == 0
    first = capsys.readouterr().out
    assert cli_main([*args, "--max-side", "16"]) == 0
    second = capsys.readouterr().out
    assert f"wrote {out}: 6 images" in first and "replaces" not in first
    assert f"wrote {out} (it replaces the store that was there): 6 images" in second
    assert StoreFile(out).header["max_side"] == 16
    # a link to no file: nothing was replaced
    (tmp_path / "link.cnnpar").symlink_to(tmp_path / "gone.cnnpar")
    assert cli_main([*args[:3], str(tmp_path / "link.cnnpar"), *args[4:]]) == 0
    assert f"wrote {tmp_path / 'link.cnnpar'}: 6 images" in capsys.readouterr().out


def test_prepare_labels_a_flat_folder_from_its_csv_and_caps_workers_to_its_images(tmp_path, capsys):
    """--labels: the store holds each image's label from the CSV (its class names sorted), so train reads it without
    --labels; --workers over the images is capped to one per image, said in a line; --short-side bounds the
    shorter side."""
    flat = tmp_path / "flat"
    flat.mkdir()
    rows = ["name,label"]
    for i in range(3):  # fewer than the 4 workers a usable core may have
        Image.new("RGB", (24, 20), (60 * i, 0, 0)).save(flat / f"im{i}.png")
        rows.append(f"im{i},{'cat' if i % 2 else 'dog'}")
    (tmp_path / "labels.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "flat.cnnpar"
    words = ["prepare", str(flat), "--labels", str(tmp_path / "labels.csv"), "--out", str(out)]
    assert cli_main([*words, "--workers", "50", "--short-side", "10", "--no-progress"]) == 0
    assert "--workers 50 capped to 3: one per image (3 images)" in capsys.readouterr().out
    store = StoreFile(out)
    assert store.class_names == ["cat", "dog"] and store.labels.tolist() == [1, 0, 1]  # im0..im2
    assert store.hw.tolist() == [[10, 12]] * 3  # 20 x 24 with its shorter side at 10
