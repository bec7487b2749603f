"""Image folders as users export them: a class named `train` among the classes, an image too large to decode, a
damaged JPEG that decodes anyway. Each is read and said, or refused in one line naming the file or folder."""

from __future__ import annotations

import struct
import zlib

import pytest
import torch

from cnnpar.config import DataConfig
from cnnpar.data import load_data
from cnnpar.data.cpu_decode import CpuDecodedFolder, simplejpeg_module
from cnnpar.data.folder import MAX_PIXELS, check_pixel_count, decode_rgb, read_encoded, scan_splits
from cnnpar.data.store_write import Sides, decode_for_store
from cnnpar.errors import DataError
from tests.datafiles import damaged_jpeg, write_image_folder

pytestmark = pytest.mark.usefixtures("one_thread")  # one intra-op thread for the in-process runs (conftest)


def test_a_class_folder_named_train_among_classes_is_a_class_and_said_so(tmp_path):
    """CIFAR-100 exported as <class>/*.png has a class `train`: the whole folder was refused, in a line that
    listed the 99 other classes."""
    root = write_image_folder(tmp_path / "c100", per_class=3, classes=3, side=16)
    (root / "class2").rename(root / "train")
    files, labels, splits, classes = scan_splits(root)
    assert classes == ["class0", "class1", "train"] and set(splits) == {0} and len(files) == 9
    bundle = load_data(DataConfig(source=str(root), val_fraction=0), 0)
    assert bundle.num_classes == 3 and bundle.load_note == (
        f"note: {root}: train/ holds images itself, beside other class folders: read as the class 'train', not as a "
        "training split (a split's train/ holds class folders)"
    )


def test_a_train_split_beside_many_other_folders_is_refused_in_a_short_line(tmp_path):
    root = tmp_path / "mixed"
    write_image_folder(root / "train", per_class=2, classes=2, side=16)  # a split: class folders inside
    for k in range(8):
        write_image_folder(root / f"extra{k}", per_class=1, classes=2, side=16)
    with pytest.raises(DataError) as e:
        scan_splits(root)
    assert str(e.value) == (
        f"{root}: holds train/ beside extra0/, extra1/, extra2/, extra3/, extra4/, ... (8 in all): expected train/ "
        "with at most one of val|valid|validation|test|testing/ (class folders in each), or class folders alone "
        "(a class folder named train/ is read as one where it holds its images itself beside 2 or more other "
        "class folders not named like a split (val, test, ...); else rename it)"
    )


def _png_header(width: int, height: int) -> bytes:
    """A PNG's signature, IHDR chunk (8-bit grey) and an empty IDAT, checksums and all, and no pixels: its size
    is all that is read before the image is refused."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"") + chunk(b"IEND", b"")


def test_an_image_of_too_many_pixels_is_refused_from_its_header_before_it_is_decoded(tmp_path):
    """An 875 KB PNG of 30000x30000 took 4.5 GB at each decode, every epoch, and nothing named it."""
    root = write_image_folder(tmp_path / "bomb", per_class=3, classes=2, side=16)
    bomb = root / "class1" / "bomb.png"
    bomb.write_bytes(_png_header(30_000, 30_000))
    refused = (
        f"{bomb}: 30000x30000 pixels (900 megapixels): expected at most {MAX_PIXELS / 1e6:.0f} megapixels "
        "(Pillow's decompression-bomb limit; decoding it takes gigabytes at every epoch): shrink it or leave it out"
    )
    with pytest.raises(DataError) as e:  # the header sample at load
        load_data(DataConfig(source=str(root)), 0)
    assert str(e.value) == refused
    for decode in (  # and the decoders, for a file the sample left out, prepare's too
        lambda: CpuDecodedFolder([bomb], [0], 16, train=True)[[0]],
        lambda: decode_rgb(read_encoded(bomb), bomb),
        lambda: decode_for_store(bomb, Sides(short=256)),
    ):
        with pytest.raises(DataError) as e:
            decode()
        assert str(e.value) == refused
    check_pixel_count(bomb, 13_000, 13_000)  # 169 megapixels: under the limit


def test_a_damaged_jpeg_that_decodes_is_named_once(tmp_path, capsys):
    """libjpeg's own line ("Corrupt JPEG data: 219 extraneous bytes before marker 0xd9") named none of the files."""
    if simplejpeg_module() is None:
        pytest.skip("simplejpeg is not installed: nothing tells the damage before torchvision decodes")
    path = tmp_path / "c0" / "damaged.jpg"
    path.parent.mkdir()
    path.write_bytes(damaged_jpeg(side=64))
    folder = CpuDecodedFolder([path], [0], 32, train=False)
    for _ in range(3):  # three epochs
        x, _, _ = folder[[0]]
    assert x.shape == (1, 3, 32, 32) and x.float().std() > 10
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(said) == 1 and said[0].startswith(f"warning: {path}: damaged JPEG data (libjpeg: Corrupt JPEG data: "), (
        said
    )
    assert said[0].endswith("), decoded anyway")
    assert torch.equal(x, CpuDecodedFolder([path], [0], 32, train=False, backend="pillow")[[0]][0])


def test_a_damaged_jpeg_is_named_once_in_a_run_whose_workers_are_new_each_epoch(tmp_path, capfd):
    """Each DataLoader worker kept its own count of the files it named: with --no-persistent-workers each epoch's
    fresh workers named the same damaged photo again, once an epoch (3 of 4 epochs' lines in one run)."""
    from cnnpar.cli import main

    if simplejpeg_module() is None:
        pytest.skip("simplejpeg is not installed: nothing tells the damage before torchvision decodes")
    data = write_image_folder(tmp_path / "photos", per_class=8, side=32)
    damaged = data / "class0" / "damaged.jpg"
    damaged.write_bytes(damaged_jpeg(side=32))
    flags = ["--workers", "2", "--no-persistent-workers", "--epochs", "4", "--batch-size", "4", "--image-size", "32"]
    run = ["train", "--data", str(data), *flags, "--device", "cpu", "--no-progress", "--no-tensorboard"]
    assert main([*run, "--out-dir", str(tmp_path / "runs")]) == 0
    said = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("warning:")]  # the workers' too
    assert len(said) == 1 and said[0].startswith(f"warning: {damaged}: damaged JPEG data (libjpeg: "), said


def test_a_damaged_jpeg_is_named_once_in_a_bench_whose_rungs_each_build_their_loaders(tmp_path, capfd):
    """Each loader made its own damaged-file flags: a bench ladder (a Trainer and loaders a rung), as tune's and
    doctor's trials, named the same photo once a rung, where README says once a command."""
    from cnnpar.cli import main

    if simplejpeg_module() is None:
        pytest.skip("simplejpeg is not installed: nothing tells the damage before torchvision decodes")
    data = write_image_folder(tmp_path / "photos", per_class=8, side=32)
    damaged = data / "class0" / "damaged.jpg"
    damaged.write_bytes(damaged_jpeg(side=32))
    timing = ["--warmup-steps", "1", "--timed-steps", "3", "--repeats", "1"]
    flags = ["--data", str(data), "--device", "cpu", "--image-size", "32", "--batch-size", "4", "--workers", "2"]
    assert main(["bench", *flags, *timing, "--only", "uint8_device,channels_last", "--out", str(tmp_path / "b")]) == 0
    out, err = capfd.readouterr()
    assert "rung 8 channels_last: " in out  # both rungs ran, each on loaders of its own
    said = [ln for ln in err.splitlines() if ln.startswith("warning:")]  # the workers' too
    assert len(said) == 1 and said[0].startswith(f"warning: {damaged}: damaged JPEG data (libjpeg: "), said


def test_a_photo_deleted_under_a_run_is_named_as_gone_since_the_listing_with_the_epochs_kept(
    tmp_path, monkeypatch, capsys
):
    """Photos deleted from the folder in epoch 2 (a sync re-run, a colleague's clean-up): the run ended
    "PHOTO: cannot read (No such file or directory)", which neither said the file was there when the run listed
    the folder nor that epoch 1's checkpoint was kept and how to go on."""
    from cnnpar.cli import main as cli_main
    from cnnpar.engine import trainer

    folder = write_image_folder(tmp_path / "photos", per_class=12, side=16)

    def delete_in_epoch_2(epoch, step, steps, info):
        if epoch == 2 and step == 0:
            for f in folder.rglob("*.*"):
                f.unlink()

    monkeypatch.setattr(trainer, "maybe_inject_fault", delete_in_epoch_2)
    runs = tmp_path / "runs"
    args = ["train", "--data", str(folder), "--model", "cnn3", "--image-size", "16", "--epochs", "3"]
    args += ["--batch-size", "4", "--device", "cpu", "--workers", "0", "--out-dir", str(runs), "--name", "r"]
    assert cli_main([*args, "--no-progress"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"cnnpar: error: {folder}/class"), line
    assert "gone since its folder was listed (deleted or moved while this ran)" in line
    assert line.endswith(
        f"the checkpoint in {runs / 'r'} holds epoch 1; continue with: cnnpar train --resume {runs / 'r'}"
    )


def test_a_system_without_shared_memory_still_trains_photos_with_workers_0(tmp_path, monkeypatch):
    """The damaged-file flags are shared memory (one flag a file for every worker of a run): where /dev/shm is
    read-only (a locked-down container, whose way out README gives as --workers 0), making them raised before any
    worker started, so a run with no workers at all could not load the photos."""
    from cnnpar.cli import main

    def no_shm(self):
        raise RuntimeError("unable to open shared memory object </torch_1_2> in read-write mode: Read-only file system")

    monkeypatch.setattr(torch.Tensor, "share_memory_", no_shm)
    data = write_image_folder(tmp_path / "photos", per_class=8, side=32)
    flags = ["--workers", "0", "--epochs", "1", "--batch-size", "4", "--image-size", "32"]
    run = ["train", "--data", str(data), *flags, "--device", "cpu", "--no-progress", "--no-tensorboard"]
    assert main([*run, "--out-dir", str(tmp_path / "runs")]) == 0
