"""Pick a reader for `--data` and return a DataBundle: train/val splits plus shape and statistics."""

from __future__ import annotations

import hashlib
import importlib.util
import shlex
import time
import tokenize
import unicodedata
import zipfile
import zlib
from pathlib import Path

import numpy as np
import torch

from cnnpar.config import DIGITS_SIZE, SYNTHETIC_CLASSES, SYNTHETIC_SHAPE, DataConfig, parse_shape
from cnnpar.data.arrays import check_fits, check_label_range, check_npz_members, resize_square, to_labels, to_nchw_uint8
from cnnpar.data.bundle import (
    CLASS_NAMES_COUNT,
    NO_HOLDOUT,
    ArrayDataset,
    DataBundle,
    channel_stats,
    empty_classes,
    first_five,
    holdout,
    holdout_label,
    require_two_classes,
    untrained_labels,
)
from cnnpar.data.cpu_decode import CpuDecodedFolder, simplejpeg_module
from cnnpar.data.csv_source import read_pixel_csv
from cnnpar.data.encoded_arrays import DecodeTally, decode_encoded, encoded_keys
from cnnpar.data.folder import (
    VAL_NAMES,
    ImageFolderDataset,
    content_sample_checksum,
    dunder_folders_shown,
    dunder_only_error,
    image_files,
    listing_checksum,
    loose_images_note,
    skipped_class_folders_note,
    skipped_note,
    split_dirs,
    split_like_subfolders_note,
    train_class_note,
    unread_splits_note,
)
from cnnpar.data.labels_csv import is_whole_number, scan_for_classes, scan_images
from cnnpar.data.overlap import folder_overlap, store_overlap
from cnnpar.data.source_size import SAMPLE, enlarging_note, folder_sample, pick_side, sample_count, store_side
from cnnpar.data.store import StoreFile, prepare_side
from cnnpar.data.store_feed import PreparedFolder, StoreDataset
from cnnpar.errors import DataError, UserError, first_line
from cnnpar.report.heartbeat import Heartbeat

# folders and stores are normalised with ImageNet's statistics whatever they hold (arrays with their own, computed
# from their training images): the data line says which (README's "Training on your data")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGENET_STATS = "ImageNet's"
ARRAYS_STATS = "the training images'"
FOLDER_SIZE = 224
ARRAYS_OWN_VAL = "the data's own test split"
FOLDER_OWN_VAL = "the folder's own validation split (its val/, valid/, validation/ or test/)"


BUILT_IN = ("digits", "synthetic")  # made in memory: they read no file
TRAIN_READS = (
    "a .csv (or .csv.gz), an .npz, a .npy (with --labels LABELS.npy), a .cnnpar store or a folder (or give --format)"
)
# predict refuses a store (its images are the training ones) and has no synthetic data to predict
PREDICT_READS = (
    "a .csv (or .csv.gz), an .npz, a .npy, an image folder or 'digits' (or give --format csv, npz, npy or folder)"
)


def detect_format(source: str, fmt: str, reads: str = TRAIN_READS) -> str:
    """--data's format: `fmt` where given (checked against the file), else told from the name; `reads` is what the
    command reads, for the message where the name does not say."""
    if fmt in BUILT_IN and source not in BUILT_IN:  # ("digits" is --data's default: --format synthetic alone)
        # these formats ignore --data: training them on a named file would silently train on something else
        raise DataError(
            f"{source}: --format {fmt} reads no file (it is the built-in {fmt} data): expected --data {fmt}, "
            f"or --format auto to read {source}"
        )
    if fmt != "auto":
        _check_given_format(source, fmt)
        return fmt
    if source in BUILT_IN:
        return source
    p = Path(source)
    if p.is_dir():
        return "folder"
    if p.suffix.lower() == ".csv" or p.name.lower().endswith(".csv.gz"):  # read through gzip, as pyarrow reads it
        return "csv"
    if p.suffix.lower() in (".npz", ".npy"):
        return p.suffix.lower()[1:]
    name = p.name.lower()
    if name.endswith(".cnnpar") or (name.endswith(".partial") and ".cnnpar." in name):
        return "store"  # a .partial (OUT.<random>.partial, OUT.partial) is refused by the store reader, saying why
    if not p.exists():
        raise DataError(f"{source}: no such file or folder (or use 'digits' or 'synthetic')")
    raise DataError(f"{source}: cannot tell its format from the name: expected {reads}")


def _check_given_format(source: str, fmt: str) -> None:
    """A --format that cannot be what --data is, refused in its terms rather than the reader's (a folder read as
    a CSV said "file not found"; an npz read as a CSV printed its zip bytes)."""
    p = Path(source)
    if fmt == "folder" and p.exists() and not p.is_dir():
        raise DataError(f"{source}: --format folder but this is a file: expected a folder of class folders")
    if fmt in ("csv", "npz", "npy", "store") and p.is_dir():
        raise DataError(f"{source}: --format {fmt} but this is a folder: expected a file (or --format folder)")
    if fmt in ("csv", "npy", "store") and p.is_file():
        with p.open("rb") as f:
            if f.read(4) == b"PK\x03\x04":  # a zip archive: what numpy writes for .npz
                raise DataError(f"{source}: --format {fmt} but this is a zip archive (an .npz?): expected --format npz")


STORE_CHECKSUM = "pixel checksum"
ARRAYS_CHECKSUM = "checksum of its images and labels"
FOLDER_CHECKSUM = "checksum of its image files' names and classes"


def folder_content_sample(bundle: DataBundle) -> str:
    """For an image folder, whose `fingerprint` covers its files' names and classes only, a checksum of their sizes
    and of a sample of their bytes (folder.content_sample_checksum), training files then validation files; "" for
    any other data, whose fingerprint covers its content. For the ranks of a job to compare (Trainer): read at
    each start, not stored in checkpoints, whose data checksum stays as it was."""
    if bundle.fingerprint_of != FOLDER_CHECKSUM:
        return ""
    files = [*getattr(bundle.train, "files", ()), *getattr(bundle.val, "files", ())]
    try:
        return content_sample_checksum(files)
    except OSError as e:  # gone since the listing: said as this rank's difference, not as a traceback on it alone
        return f"unreadable: {e.filename}"


def content_checksum(arrays: dict[str, np.ndarray]) -> str:
    """sha256 of named arrays (names, shapes and types included): a CSV's or an .npz's rows reordered, edited or
    replaced under the same count change it (a resume would draw its seeded hold-out over other rows). An .npz's
    are its arrays as stored, so encoded images are checked as bytes, whichever decoder reads them. 0.1 s for
    150 MB."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        digest.update(repr((name, a.shape, a.dtype.str)).encode())
        digest.update(a)  # the buffer itself, no copy
    return digest.hexdigest()


def _num_classes(y: torch.Tensor, given: int) -> int:
    return given if given > 0 else int(y.max()) + 1


def _bundle_from_arrays(
    x,
    y,
    x_val,
    y_val,
    cfg: DataConfig,
    seed: int,
    origin: str,
    classes_from: str = "",
    names: list[str] | None = None,
    own_val: str = ARRAYS_OWN_VAL,
) -> DataBundle:
    if cfg.image_size:
        x = resize_square(x, cfg.image_size)
        x_val = resize_square(x_val, cfg.image_size) if x_val is not None else None
    own = ArrayDataset(x_val, y_val) if x_val is not None else None
    train, val, val_from = _split(ArrayDataset(x, y), own, cfg.val_fraction, seed, origin, own_val)
    y_all = torch.cat([y, y_val]) if y_val is not None else y
    n_classes = _num_classes(y_all, cfg.num_classes)
    classes_from = classes_from or ("--num-classes" if cfg.num_classes > 0 else "labels' max + 1")
    if names is not None and not cfg.num_classes and len(names) > n_classes:
        # the archive lists its classes: labels that use only the first 5 of CIFAR-10's 10 names were refused
        n_classes, classes_from = len(names), CLASS_NAMES_COUNT
    if names is not None and len(names) != n_classes:
        raise DataError(
            f"{origin}[class_names]: {len(names)} names for {n_classes} classes ({classes_from}): expected one "
            "name a class"
        )
    if names is not None and classes_from != CLASS_NAMES_COUNT:
        # the count still came from the labels (or --num-classes); the line says where the names came from too
        classes_from += "; names from the archive's class_names"
    mean, std = channel_stats(train.x)
    return DataBundle(
        train,
        val,
        tuple(x.shape[1:]),
        n_classes,
        mean,
        std,
        origin,
        names if names is not None else [str(i) for i in range(n_classes)],
        classes_from=classes_from,
        empty_classes=empty_classes(y_all, n_classes),
        val_from=val_from,
        stats_from=ARRAYS_STATS,
    )


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits as (images 1797x8x8 of 0..16, labels 0..9), read from the CSV that
    `sklearn.datasets.load_digits` reads, without importing scikit-learn: that import (scipy among it) took ~1.3 s
    of a 6 s one-epoch `cnnpar train` on the digits, every run and every subprocess test. Where the file is not at
    its place in the installed package, scikit-learn's own loader reads it."""
    spec = importlib.util.find_spec("sklearn")  # finds the package without running its __init__
    folders = spec.submodule_search_locations if spec is not None else None
    csv = Path(next(iter(folders)), "datasets", "data", "digits.csv.gz") if folders else None
    if csv is None or not csv.is_file():
        from sklearn.datasets import load_digits as sk_digits

        d = sk_digits()
        return d.images, d.target
    data = np.loadtxt(csv, delimiter=",")  # as sklearn's loader: 64 pixel columns, then the label
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)


def load_digits(cfg: DataConfig, seed: int) -> DataBundle:
    """scikit-learn's bundled 8x8 digits (1,797 images), scaled to 0..255 and upscaled."""
    images, labels = digits_arrays()
    x = torch.from_numpy(np.rint(images * (255.0 / 16.0)).astype(np.uint8))[:, None]
    # labels 0..9: a smaller --num-classes would fail mid-epoch in the loss (and leave a run folder)
    check_label_range(labels, "scikit-learn digits (labels 0..9)", cfg.num_classes)
    y = torch.from_numpy(labels.astype(np.int64))
    size = cfg.image_size or DIGITS_SIZE
    x = resize_square(x, size)
    return _bundle_from_arrays(x, y, None, None, cfg, seed, "scikit-learn digits (built in)")


SYNTHETIC_LEVELS = 96  # what a class adds to synthetic noise of 0..159: at most 95, so a pixel stays under 256
SYNTHETIC_GRID = 4  # side of the coarse per-class pattern that tells classes apart past SYNTHETIC_LEVELS of them


def load_synthetic(cfg: DataConfig, seed: int) -> DataBundle:
    """Random uint8 images with a class-dependent brightness offset, so a model can learn it; past
    SYNTHETIC_LEVELS classes (one brightness step each no longer fits), a seeded coarse pattern per class."""
    c, h, w = parse_shape(cfg.image_shape or SYNTHETIC_SHAPE)
    n_classes = cfg.num_classes or SYNTHETIC_CLASSES
    g = torch.Generator().manual_seed(seed)
    n = cfg.synthetic_samples
    # images, labels (int64) and the class offsets: --synthetic-samples 10**12 asked torch for 8 TB, in a traceback
    check_fits(n * (2 * c * h * w + 8), f"--synthetic-samples {n:,} of {c}x{h}x{w}", "expected fewer samples")
    y = torch.randint(0, n_classes, (n,), generator=g)
    x = torch.randint(0, 160, (n, c, h, w), generator=g, dtype=torch.uint8)
    if n_classes <= SYNTHETIC_LEVELS:  # the data every earlier run, test and benchmark trained on
        x += (y * (95 // max(1, n_classes - 1))).to(torch.uint8)[:, None, None, None]
    else:  # 95 // (n - 1) is 0 here: the classes were pure noise, alike
        x += _class_offsets(y, n_classes, c, h, w, seed)
    given = "--num-classes" if cfg.num_classes else "synthetic's default"
    return _bundle_from_arrays(x, y, None, None, cfg, seed, f"synthetic {c}x{h}x{w}", given)


def _class_offsets(y: torch.Tensor, n_classes: int, c: int, h: int, w: int, seed: int) -> torch.Tensor:
    """(n, c, h, w) uint8 offsets in 0..95 for labels `y`: per class, a seeded random grid of at most
    SYNTHETIC_GRID x SYNTHETIC_GRID cells, each spread over its block of pixels (a million classes' full-size
    patterns would take 150 GB at 3x224x224; their grids take 48 MB)."""
    gh, gw = min(h, SYNTHETIC_GRID), min(w, SYNTHETIC_GRID)
    g = torch.Generator().manual_seed(seed + 1)  # draws of its own: the noise and labels are as with fewer classes
    grid = torch.randint(0, SYNTHETIC_LEVELS, (n_classes, c, gh, gw), generator=g, dtype=torch.uint8)
    rows, cols = torch.arange(h) * gh // h, torch.arange(w) * gw // w
    return grid[y][:, :, rows][:, :, :, cols]


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    if not zipfile.is_zipfile(path):
        raise DataError(f"{path}: not an .npz archive (not a zip file): expected numpy.savez output")
    try:
        check_npz_members(path)
        with np.load(path, allow_pickle=False) as z:
            return {k: _npz_array(z, k, path) for k in z.files}
    # zipfile's own: a damaged deflate stream (zlib.error), an encrypted member (RuntimeError), a compression it
    # does not read (NotImplementedError)
    except (zipfile.BadZipFile, OSError, ValueError, zlib.error, RuntimeError, NotImplementedError) as e:
        raise DataError(f"{path}: not a readable .npz archive ({e}): expected numpy.savez output") from None


def _npz_array(z, key: str, path: Path) -> np.ndarray:
    """One array of an open archive; an object array (numpy pickles those, and cnnpar loads no pickle) is named by
    its key: the whole archive was said to be unreadable."""
    try:
        return z[key]
    except ValueError as e:
        if "Object arrays" not in str(e):
            raise
    if key == "class_names":  # df.col.unique() is an object array of str
        raise DataError(f"{path}[class_names]: an object array: save it with np.array(names, dtype=str)")
    raise _object_array_error(f"{path}[{key}]")


def _object_array_error(where: str) -> DataError:
    return DataError(
        f"{where}: an object array (saved pickled, which cnnpar does not load): expected numbers, "
        "np.stack(images) or np.asarray(labels, dtype=np.int64)"
    )


def _read_npy(path: Path, flag: str) -> np.ndarray:
    """One array `np.save` wrote, mapped from the file rather than read: the conversion to (N, C, H, W) uint8
    copies it anyway (to_nchw_uint8), and read first, an N, H, W, C or float array was held twice at the peak.
    `flag` (--data, --labels) names where the path was given."""
    if not path.is_file():
        raise DataError(f"{flag} {path}: file not found")
    try:
        with path.open("rb") as f:
            # np.load's own test (a zip's first record, or an empty zip's end record): it hands back an NpzFile for
            # these, whatever the name says. zipfile.is_zipfile looks for an end record in a file's last 64 KiB,
            # where a .npy's pixels can hold its 4 bytes: a valid x.npy was refused as a zip archive
            if f.read(4) in (b"PK\x03\x04", b"PK\x05\x06"):
                raise DataError(
                    f"{flag} {path}: a zip archive (an .npz?), not a .npy array: expected numpy.save output"
                )
            f.seek(0)
            version = np.lib.format.read_magic(f)
            header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = header(f)
            start = f.tell()
        if dtype.hasobject:
            raise _object_array_error(str(path))
        _check_npy_length(path, shape, dtype, start)
        return np.load(path, mmap_mode="r", allow_pickle=False)
    # a file that is no .npy (its magic or header)
    except (OSError, ValueError, tokenize.TokenError) as e:
        raise DataError(f"{path}: not a readable .npy array ({first_line(e)}): expected numpy.save output") from None


def _check_npy_length(path: Path, shape: tuple, dtype: np.dtype, start: int) -> None:
    """Refuse a .npy whose size is not its header's plus the bytes of the array it declares: numpy reads the count
    the header declares and ignores what follows, so a file cut from a bigger one, or two arrays written into one,
    trained on part of its data without a word; one too short failed in mmap's words, naming no size. The pixels
    follow the header at once in either order (C or Fortran), so the byte count is the same for both."""
    declared = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    held = path.stat().st_size
    if held != start + declared:
        which = "more" if held > start + declared else "fewer"
        raise DataError(
            f"{path}: its header declares shape {tuple(shape)} {dtype}, {declared:,} bytes after its {start:,}-byte "
            f"header ({start + declared:,} in all), and the file holds {held:,} ({which}): expected one array as "
            "numpy.save writes it"
        )


def npz_images(arrays: dict, split: str, path: Path, tally: DecodeTally | None = None) -> tuple[np.ndarray, str] | None:
    """`x_{split}` of an .npz, or its images decoded from `{split}_jpeg`/`_png` + `{split}_offsets`
    (encoded_arrays.py), with the key it came from; None where the archive holds neither. What decoded the
    JPEGs is counted into `tally` where it is given."""
    if f"x_{split}" in arrays:
        return arrays[f"x_{split}"], f"x_{split}"
    keys = encoded_keys(arrays, split)
    if keys is None:
        return None
    images, offsets = keys
    decoded = decode_encoded(arrays[images], arrays[offsets], f"{path}[{images}]", tally)  # N, H, W, C
    # handed on as N, C, H, W (a view): to_nchw_uint8 keeps that layout for C 1 or 3 whatever H and W are, where it
    # guessed N, H, W, C images 3 pixels tall to be N, C, H, W already, and transposed them
    return decoded.transpose(0, 3, 1, 2), images


def npz_held_splits(keys) -> list[str]:
    """The held-out splits an .npz's `keys` hold (images or labels), in the order an image folder's validate
    (`VAL_NAMES`: val, valid, validation, test, testing): the first validates, the others are not read. An x_val
    beside x_train was left unread without a word, and a hold-out of the training images validated instead."""
    return [s for s in VAL_NAMES if f"x_{s}" in keys or encoded_keys(keys, s) is not None or f"y_{s}" in keys]


def _npz_keys_of(arrays: dict, split: str) -> list[str]:
    """The keys that hold `split`'s images and labels, as `npz_images` reads them."""
    found = [f"x_{split}"] if f"x_{split}" in arrays else list(encoded_keys(arrays, split) or ())
    return found + ([f"y_{split}"] if f"y_{split}" in arrays else [])


def _unread_keys_note(path: Path, arrays: dict, held: list[str]) -> str:
    """A warning naming the keys of the archive that are not read, or "": they were dropped without a word."""
    read = {*_npz_keys_of(arrays, "train"), *(_npz_keys_of(arrays, held[0]) if held else ()), "class_names"}
    unread = [k for k in arrays if k not in read]
    if not unread:
        return ""
    why = []
    if "x_train" in arrays and encoded_keys(arrays, "train") is not None:
        why.append(f"x_train is read, not {encoded_keys(arrays, 'train')[0]}")
    if len(held) > 1:
        why.append(f"{held[0]} validates, the first of {'|'.join(VAL_NAMES)}")
    reason = f" ({'; '.join(why)})" if why else ""
    return (
        f"warning: {path}: key(s) {', '.join(unread)} not read{reason}: cnnpar reads x_train, y_train, one held-out "
        "split (x_val, y_val; or valid, validation, test, testing), class_names, and train_jpeg|png + train_offsets "
        "in place of x_train"
    )


def load_npz(cfg: DataConfig, seed: int) -> DataBundle:
    path = Path(cfg.source)
    return _load_arrays(_read_npz(path), path, cfg, seed, lambda key: f"{path}[{key}]")


def load_npy(cfg: DataConfig, seed: int) -> DataBundle:
    """A pair of `np.save` files, --data's images and --labels' labels, read as an .npz's x_train and y_train (so
    with its checks, in its words, naming the file): --val-fraction holds out, as for an .npz without x_val."""
    images, labels = Path(cfg.source), Path(cfg.labels)
    if not cfg.labels:
        raise DataError(
            f"--data {images}: a .npy holds images only: expected --labels LABELS.npy, one class index an image "
            "(or an .npz of x_train, y_train)"
        )
    arrays = {"x_train": _read_npy(images, "--data"), "y_train": _read_npy(labels, "--labels")}
    # the uint8 (N, C, H, W) copy the conversion makes, and the labels as int64: mapped, the files take no memory
    check_fits(arrays["x_train"].size + 8 * arrays["y_train"].size, f"{images} and {labels}: their images and labels")
    files = {"x_train": str(images), "y_train": str(labels)}
    return _load_arrays(arrays, images, cfg, seed, files.__getitem__)


def _load_arrays(arrays: dict, path: Path, cfg: DataConfig, seed: int, where) -> DataBundle:
    """The bundle of an .npz's `arrays` (or a .npy pair's, as x_train and y_train); `where(key)` names an array
    in messages (the archive's key, or the file that holds it)."""
    started = time.perf_counter()
    tally = DecodeTally()
    train = npz_images(arrays, "train", path, tally)
    missing = [k for k, absent in (("x_train", train is None), ("y_train", "y_train" not in arrays)) if absent]
    if missing:
        raise DataError(
            f"{path}: missing key(s) {', '.join(missing)} (found {', '.join(arrays) or 'none'}): "
            f"expected x_train, y_train[, x_val, y_val] (or train_jpeg + train_offsets for x_train, JPEG files' "
            "bytes one after another)"
        )
    held = npz_held_splits(arrays)
    split = held[0] if held else None
    held_images = npz_images(arrays, split, path, tally) if split else None
    if split and (held_images is None) != (f"y_{split}" not in arrays):
        raise DataError(f"{path}: has only one of x_{split} / y_{split}: expected both or neither")
    notes: list[str] = []
    y = _labels_first(arrays, "train", train[0], where, cfg.num_classes)
    x = to_nchw_uint8(train[0], where(train[1]), notes)
    y = y if y is not None else to_labels(arrays["y_train"], len(x), where("y_train"), cfg.num_classes)
    x_val = y_val = None
    if held_images is not None:
        y_val = _labels_first(arrays, split, held_images[0], where, cfg.num_classes)
        x_val = to_nchw_uint8(held_images[0], where(held_images[1]))
        if y_val is None:
            y_val = to_labels(arrays[f"y_{split}"], len(x_val), where(f"y_{split}"), cfg.num_classes)
        if x_val.shape[1:] != x.shape[1:]:
            raise DataError(
                f"{path}[{held_images[1]}]: image shape {tuple(x_val.shape[1:])}: expected "
                f"{tuple(x.shape[1:])}, the shape of {train[1]}"
            )
    names = _npz_class_names(arrays, path)
    own_val = ARRAYS_OWN_VAL if split in (None, "test", "testing") else f"the data's own validation split (x_{split})"
    fingerprint = content_checksum(arrays)
    read = [(train[1], len(x))] + ([(held_images[1], len(x_val))] if held_images is not None else [])
    unread_note = _unread_keys_note(path, arrays, held)
    # the archive's arrays, let go before the hold-out copies the images: where x_train was N, H, W, C (or encoded),
    # x is a copy, and the original kept alive to the end held a third copy at the peak (10 GB for a 3 GB array)
    del arrays, train, held_images
    bundle = _bundle_from_arrays(x, y, x_val, y_val, cfg, seed, str(path), names=names, own_val=own_val)
    bundle.fingerprint, bundle.fingerprint_of = fingerprint, ARRAYS_CHECKSUM
    decoded = [(key, n) for key, n in read if not key.startswith("x_")]  # train_jpeg, not x_train
    if decoded:
        took = time.perf_counter() - started
        keys, count = " and ".join(k for k, _ in decoded), sum(n for _, n in decoded)
        notes.insert(
            0,
            f"data: {count:,} encoded images decoded from {keys} in {took:.1f} s ({_decoded_by(tally)}), at every "
            f"start (np.savez of the decoded arrays as x_train, y_train, x_{split or 'test'}, y_{split or 'test'} "
            "skips it)",
        )
    notes += [n for n in (tally.damaged_note(), unread_note) if n]
    bundle.load_note = "\n".join(notes)
    return bundle


def _labels_first(arrays: dict, split: str, images: np.ndarray, where, num_classes: int) -> torch.Tensor | None:
    """`y_{split}` checked before its images are converted, where their count is plain (3 or 4 dimensions, not
    empty; else None, and the images' own error comes first): a label error came after the conversion, 14.8 s and
    6.5 GB of RSS into a 3 GB N, H, W, C x_train."""
    if images.ndim not in (3, 4) or not len(images):
        return None
    return to_labels(arrays[f"y_{split}"], len(images), where(f"y_{split}"), num_classes)


def _decoded_by(tally: DecodeTally) -> str:
    """What decoded an archive's JPEGs: simplejpeg, save the files it declines (damaged ones, CMYK), which
    torchvision decodes and which the line counts; it credited simplejpeg for all of them."""
    # an H200 host without simplejpeg took 11.4 s for CIFAR-10's 60,000 (call ZZZZF): say which decoder ran
    if not simplejpeg_module():
        return "by torchvision; simplejpeg, a dependency of cnnpar, is faster: pip install simplejpeg"
    if not tally.by_torchvision:
        return "JPEGs by simplejpeg"
    return f"JPEGs by simplejpeg, {tally.by_torchvision:,} of {tally.jpegs:,} by torchvision: files simplejpeg declines"


def npz_class_names(source: str) -> list[str] | None:
    """The `class_names` an .npz holds (label i's name at i), or None: predict scores its labels by these names."""
    with np.load(source, allow_pickle=False) as z:
        if "class_names" not in z.files:
            return None
        return _npz_class_names({"class_names": _npz_array(z, "class_names", Path(source))}, Path(source))


def _npz_class_names(arrays: dict, path: Path) -> list[str] | None:
    """An archive's `class_names` (label i's name at i), checked against the labels once the class count is known."""
    if "class_names" not in arrays:
        return None
    names = arrays["class_names"]
    if names.ndim != 1 or names.dtype.kind not in "US":
        raise DataError(f"{path}[class_names]: shape {names.shape}, dtype {names.dtype}: expected a 1-D array of text")
    if names.dtype.kind == "S":  # bytes (np.array([b"cat", ...]), or a str array from Python 2): str() gave "b'cat'"
        return [n.decode("utf-8", errors="replace") for n in names.tolist()]
    return [str(n) for n in names]


def load_csv(cfg: DataConfig, seed: int) -> DataBundle:
    notes: list[str] = []
    x, y = read_pixel_csv(cfg.source, cfg.image_shape, require_label=True, num_classes=cfg.num_classes, notes=notes)
    bundle = _bundle_from_arrays(x, y, None, None, cfg, seed, cfg.source)
    bundle.load_note = "\n".join(notes)
    bundle.fingerprint, bundle.fingerprint_of = content_checksum({"x": x.numpy(), "y": y.numpy()}), ARRAYS_CHECKSUM
    return bundle


def load_folder(cfg: DataConfig, seed: int, say=None) -> DataBundle:
    """`say`: where the scan says how far it is once it has taken heartbeat.EVERY_S, as the epoch does in a log:
    its time grows with the folder (30,000 cached photos: 0.9 s on a 2-core host) and it said nothing however
    long it took. None: nowhere."""
    root = Path(cfg.source)
    skipped: list[Path] = []
    labelled: list[str] = []  # the CSV's warning on images it does not name
    listing = Heartbeat(f"data: scanning {root}", 0, "images found", say, say is not None)
    files, labels, splits, classes = scan_images(root, cfg.labels, skipped, labelled, listing.update)
    # a typed size needs the sizes only for the enlargement warning: a smaller sample (every rank reads them)
    sample = 200 if cfg.image_size else SAMPLE
    headers = Heartbeat(
        f"data: reading image headers in {root}", sample_count(files, sample), "files", say, say is not None
    )
    photos = folder_sample(files, sample, headers.update)
    size, size_from = (cfg.image_size, "--image-size") if cfg.image_size else pick_side(photos.sizes, photos.sampled)
    size_note = enlarging_note(size, photos.sizes)
    train, val = _own_split(ImageFolderDataset(files, labels, size), torch.as_tensor(splits))
    train, val, val_from = _split(train, val, cfg.val_fraction, seed, str(root), FOLDER_OWN_VAL, classes)
    n_classes = len(classes)  # labels are class-folder (or CSV class) indices, so the folders or CSV decide the count
    held = f"{cfg.labels} holds {n_classes} labels" if cfg.labels else f"{root} has {n_classes} class folders"
    _class_count_given(cfg.num_classes, n_classes, held)
    overlap = folder_overlap(train.files, val.files if val is not None else [])
    return DataBundle(
        train,
        val,
        (3, size, size),
        n_classes,
        IMAGENET_MEAN,
        IMAGENET_STD,
        str(root),
        classes,
        loader_crops=True,
        grey=photos.grey,
        stats_from=IMAGENET_STATS,
        classes_from=f"the labels of {cfg.labels}" if cfg.labels else "the class folders",
        size_from=size_from,
        size_note=size_note,
        empty_classes=empty_classes(torch.as_tensor(labels), n_classes),
        val_from=val_from,
        val_overlap=overlap,
        skipped_note=skipped_note(skipped),
        load_note="\n".join(n for n in (labelled if cfg.labels else _class_folder_notes(root)) if n),
        fingerprint=listing_checksum(root, files, labels, splits),
        fingerprint_of=FOLDER_CHECKSUM,
    )


def _class_folder_notes(root: Path) -> list[str]:
    """What a folder of class folders holds that is read otherwise than its layout suggests, or not at all."""
    return [
        train_class_note(root),
        unread_splits_note(root),
        loose_images_note(root),
        split_like_subfolders_note(root),
        skipped_class_folders_note(root),
    ]


def load_store(cfg: DataConfig, seed: int) -> DataBundle:
    """A store made by `cnnpar prepare`: the same splits, hold-out and classes as its folder."""
    store = StoreFile(cfg.source)
    size, size_from = (cfg.image_size, "--image-size") if cfg.image_size else _store_input_side(store)
    size_note = enlarging_note(size, store.hw, _prepare_again(store.header, size, store.hw))
    train, val = _own_split(StoreDataset(store, torch.arange(store.count), size), torch.from_numpy(store.splits))
    # one class gets past prepare only in a store made before prepare refused it
    remake = "; re-run cnnpar prepare on a folder of 2 or more class folders"
    names = store.class_names
    train, val, val_from = _split(train, val, cfg.val_fraction, seed, str(store.path), FOLDER_OWN_VAL, names, remake)
    _class_count_given(cfg.num_classes, len(names), f"{store.path} holds {len(names)} classes")
    changed = _source_changed_note(store)
    grey, grey_note = _store_grey(store)
    groups = store.header.get("same_file_groups", [])  # stores from before session 13 lack it: nothing known
    overlap = store_overlap(groups, train.ids.tolist(), val.ids.tolist()) if groups and val is not None else ""
    return DataBundle(
        train,
        val,
        (3, size, size),
        len(store.class_names),
        IMAGENET_MEAN,
        IMAGENET_STD,
        str(store.path),
        store.class_names,
        loader_crops=True,
        grey=grey,
        grey_from_pixels=bool(grey_note),
        stats_from=IMAGENET_STATS,
        classes_from="the store's header",
        size_from=size_from,
        size_note=size_note,
        empty_classes=empty_classes(torch.from_numpy(store.labels), len(store.class_names)),
        val_from=val_from,
        val_overlap=overlap,
        fingerprint=store.header["data_checksum"],
        fingerprint_of=STORE_CHECKSUM,
        load_note="\n".join(n for n in (changed, grey_note) if n),
    )


def _store_grey(store: StoreFile, sample: int = 200) -> tuple[bool, str]:
    """Whether the store's photos are grey files (--augment auto leaves them unmirrored), and a note where that was
    read from its pixels. Stores prepared before session 34 lack the header's `grey`: read as colour, a new run
    mirrored the digit PNGs that the same folder, or a store prepared of it now, leaves unmirrored, without a
    word. A grey file is stored as 3 equal channels, so equal channels in every sampled image tell it."""
    if "grey" in store.header:
        return bool(store.header["grey"]), ""
    pixels = store.pixels
    for k in np.linspace(0, store.count - 1, min(store.count, sample)).astype(np.int64):
        (h, w), start = store.hw[k], int(store.offsets[k])
        image = pixels[start : start + 3 * h * w].reshape(h * w, 3)
        if not ((image[:, 0] == image[:, 1]).all() and (image[:, 1] == image[:, 2]).all()):
            return False, ""
    return True, (
        f"note: {store.path} was prepared by a cnnpar before 2026-12-04, which did not record grey photos: its "
        "sampled images all have 3 equal channels, so they are read as grey (--augment auto does not mirror them, "
        "as for a store prepared now; --augment flip mirrors them)"
    )


def _source_changed_note(store: StoreFile) -> str:
    """A warning where the folder the store was prepared from is there and its listing (names, classes, splits)
    changed since: a class added or photos removed trained from the old store without a word. "" where it is
    unchanged, gone (a store travels without its photos), or the store predates the listing (session 30)."""
    listed, source = store.header.get("source_listing"), store.header.get("source", "")
    labelled = store.header.get("source_labels", "")  # stores before the key: class folders
    again = ["--labels", labelled] if labelled else []
    if not listed or not source or not Path(source).is_dir():
        return ""
    try:
        files, labels, splits, _ = scan_images(Path(source), labelled)
    except DataError:
        now = ""
    else:
        now = listing_checksum(Path(source), files, labels, splits)
    if now == listed:
        return ""
    relabelled = f", or its labels in {labelled} changed" if labelled else ""
    return (
        f"warning: {source} changed since {store.path} was prepared from it (image files added, removed or renamed, "
        f"or classes changed{relabelled}): this run trains on the store as prepared; "
        f"{shlex.join(['cnnpar', 'prepare', source, *again, '--out', str(store.path)])} again trains on the folder "
        "as it is"
    )


def _store_input_side(store: StoreFile) -> tuple[int, str]:
    """The input size of a run from `store` with --image-size auto: the one its photos' folder trains at, where the
    store holds it without enlarging most images; else the store's own. Its sizes alone (every photo at 256x341
    after --short-side 256) read as one source size, 256, where the folder's run, its photos differing in size,
    trained at 224: the two runs of the same photos were not comparable."""
    side, why = store_side(store.hw)
    if "source_side" not in store.header:  # stores before session 30: their photos' sizes were not kept
        return side, why
    photos_side, photos_why = store.header["source_side"]
    source = store.header.get("source", "the folder")
    if photos_side <= int(np.median(store.hw.min(axis=1))):
        return photos_side, f"as --data {source} trains: {photos_why}"
    stored = why.removeprefix("the source size: ")
    return side, f"the store's size: {stored} (--data {source} trains at {photos_side}: {photos_why})"


def _prepare_again(header: dict, size: int, hw: np.ndarray) -> str:
    """How to make the store again so that crops of `size` are not enlarged, where its own bounds shrank most of the
    images that crops of `size` enlarge ("" where those were stored as large as the photos were: the photos
    themselves are small, and preparing again would not make them larger). `hw`: the stored (height, width)s."""
    short, longer, again = header.get("short_side", 0), header.get("max_side", 0), prepare_side(size)
    if not longer and not (short and short < again):
        return ""
    hw = np.asarray(hw).reshape(-1, 2)
    enlarged = hw[hw.min(axis=1) < size]
    # an image the bounds shrank has its bounded side exactly at the bound; a smaller photo was kept as it was
    bounded = np.zeros(len(enlarged), dtype=bool)
    if short:
        bounded |= enlarged.min(axis=1) == short
    if longer:
        bounded |= enlarged.max(axis=1) == longer
    if len(enlarged) == 0 or 2 * int(np.count_nonzero(bounded)) < len(enlarged):
        return ""
    return f", or prepare the store again with --short-side {again}" + (" and no --max-side" if longer else "")


def _class_count_given(given: int, found: int, what: str) -> None:
    """A folder's or store's classes are its class folders: another --num-classes cannot apply, and ignoring it
    would train another model than the one asked for without a word."""
    if given and given != found:
        raise DataError(f"--num-classes {given}: {what}, which decide the classes: expected {found} or none")


def _own_split(full, splits: torch.Tensor):
    """A folder's or store's train and val subsets by their split ids (0 train, 1 val); val None where none is val."""
    if bool((splits == 1).any()):
        return full.subset(torch.nonzero(splits == 0).view(-1)), full.subset(torch.nonzero(splits == 1).view(-1))
    return full, None


def _split(train, val, fraction: float, seed: int, origin: str, own_val: str, names=None, remedy: str = ""):
    """Train and val of any source, and which one validates: its own val split (`own_val` says what it is)
    when it has one, else a seeded hold-out of `train`.

    Every source passes here with its training labels before a hold-out takes some away, so the rule of
    2 classes is checked here, once: on the labels the data gives, whatever the --val-fraction."""
    require_two_classes(train.labels, origin, names, remedy)
    if val is not None:
        _require_trained_labels(train, val, origin, own_val, names)
        return train, val, own_val
    if fraction > 0 and len(train) > 1:
        kept, held = holdout(len(train), fraction, seed)
        train, val = train.subset(kept), train.subset(held)
        # a small class can go wholly to validation: one class left would train to a score that means nothing
        after = f" after the seeded hold-out (--val-fraction {fraction:g}, --seed {seed})"
        remedy = ": lower --val-fraction or give each class more images"
        require_two_classes(train.labels, origin + after, names, remedy)
        return train, val, holdout_label(fraction)
    return train, None, NO_HOLDOUT


def _require_trained_labels(train, val, origin: str, own_val: str, names=None) -> None:
    """Refuse a data set's own validation split that holds labels no training example has (an npz whose y_test
    held y_train + 1 trained and scored against labels it could not learn): its accuracy would mean nothing.
    Image folders are refused so earlier, as they are scanned (folder.scan_splits); this catches the rest."""
    untrained = untrained_labels(train.labels, val.labels)
    if untrained:
        shown = first_five(repr(names[k]) if names else str(k) for k in untrained)
        raise DataError(
            f"{origin}: {own_val} holds {len(untrained)} label(s) that no training example has ({shown}): "
            "expected validation labels among the training labels"
        )


READERS = {
    "digits": load_digits,
    "synthetic": load_synthetic,
    "npz": load_npz,
    "npy": load_npy,
    "csv": load_csv,
    "folder": load_folder,
    "store": load_store,
}


READ_LINE_BYTES = 2**30  # an .npz or CSV this large is named before it is read: a 3 GB .npz said nothing for 23 s


def long_read_line(cfg: DataConfig) -> str:
    """The line said before `load_data` reads an .npz or CSV of at least READ_LINE_BYTES whole into memory ("" for
    smaller ones, stores, which are read as training goes, and folders, whose scan says how far it is every
    heartbeat.EVERY_S where load_data is given `say`: its length is not known before it)."""
    try:
        fmt = detect_format(cfg.source, cfg.format)
        size = Path(cfg.source).stat().st_size if fmt in ("npz", "npy", "csv") else 0
    except (UserError, OSError):
        return ""  # load_data says why, in its own words
    if size < READ_LINE_BYTES:
        return ""
    return f"data: reading {cfg.source} ({size / 2**30:.1f} GiB) into memory"


def load_data(cfg: DataConfig, seed: int = 0, say=None) -> DataBundle:
    """`say`: where a folder's scan says how far it is once it takes long (load_folder); other readers say nothing
    while they read (long_read_line names a big one before)."""
    fmt = detect_format(cfg.source, cfg.format)
    check_labels_with(cfg.labels, cfg.source, fmt)
    bundle = load_folder(cfg, seed, say) if fmt == "folder" else READERS[fmt](cfg, seed)
    # --image-shape gives the shape of CSV rows and synthetic images; elsewhere the data's own shape wins, so a
    # typed shape that differs would be recorded as the run's input while another one trained
    if cfg.image_shape and fmt not in ("csv", "synthetic") and parse_shape(cfg.image_shape) != tuple(bundle.shape):
        held = "x".join(map(str, bundle.shape))
        raise DataError(
            f"--image-shape {cfg.image_shape}: {bundle.origin} gives {held} images; the flag shapes CSV rows and "
            "synthetic data only: expected it left out (--image-size N resizes)"
        )
    return bundle


def check_labels_with(labels: str, source: str, fmt: str) -> None:
    """Refuse `--labels` beside data that holds its own labels: it would be ignored without a word; a .npy's
    labels are a .npy too (a CSV of them names images, which a .npy has not)."""
    if not labels or fmt == "folder":
        return
    if fmt == "npy":
        if Path(labels).suffix.lower() != ".npy":
            raise DataError(
                f"--labels {labels}: --data {source} is a .npy of images: expected --labels LABELS.npy, one class "
                "index an image (np.save)"
            )
        return
    own = "a store holds the labels it was prepared with" if fmt == "store" else f"{fmt} data holds its own labels"
    raise DataError(
        f"--labels {labels}: --data {source} is not an image folder ({own}): --labels names the labels of a flat "
        "folder of images: expected --data FOLDER, or no --labels"
    )


def utf8_on_disk(name: str) -> bool:
    """Whether a name's bytes are UTF-8. Not whether Python decoded it cleanly: under a locale that is not UTF-8
    (LC_ALL=C with PYTHONUTF8=0) it reads file names as ASCII, and even café's two UTF-8 bytes as lone surrogates."""
    try:
        name.encode("utf-8", "surrogateescape").decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def readable_name(name: str) -> str:
    """`name` as UTF-8 text, bytes that are not UTF-8 shown as \\xNN: a Latin-1 caf\\xe9.png (read by the OS as a
    lone surrogate) stopped predict as it wrote its CSV. A UTF-8 name comes back unchanged."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def class_folder_labels(
    root: Path, files: list[Path], classes: list[str] | None, unscored: list[str] | None = None
) -> list[int] | None:
    """The labels a hold-out of class folders (`split/val/<class>/*.jpg`, the layout `cnnpar train` reads) carries:
    each image's top folder matched by name to the run's `classes` (in Unicode's NFC form, as val/ is matched to
    train/; a whole-number name by its number, as `--labels` reads one), as indices; a hold-out may lack a class.
    None, with a line to `unscored` saying why, where a folder holding images is not a class of the run (scored
    against the wrong labels otherwise) or an image lies beside the class folders (it has no label). None, unsaid,
    for a flat folder: no image in a subfolder, or loose images beside subfolders of no class name (`thumbs/`)."""
    tops = [f.relative_to(root).parts for f in files]
    folders = sorted({parts[0] for parts in tops if len(parts) > 1})
    if not folders or not classes:
        return None
    index = {unicodedata.normalize("NFC", c): i for i, c in enumerate(classes)}

    def class_of(name: str) -> int | None:
        key = unicodedata.normalize("NFC", name)
        if key not in index and is_whole_number(key):
            key = str(int(key))
        return index.get(key)

    unknown = [n for n in folders if class_of(n) is None]
    loose = [f for f, parts in zip(files, tops) if len(parts) == 1]
    if loose and len(unknown) == len(folders):
        return None
    where = f"{root}: not scored"
    if unknown:
        line = (
            f"{where}: its folder(s) {first_five(repr(readable_name(n)) for n in unknown)} are not among the model's "
            f"classes ({first_five(repr(readable_name(c)) for c in classes)}): expected class folders named as the "
            "run's classes"
        )
        _, held = split_dirs(root)
        if held:  # photos/ itself, whose train/ and val/ are splits: its val/ holds the class folders
            line += f" (--data {held[0]} scores its held-out split)"
    elif loose:
        line = (
            f"{where}: {len(loose):,} image(s) lie beside its class folders, without a label (first: "
            f"{readable_name(loose[0].name)}): expected every image inside a class folder"
        )
    else:
        return [class_of(parts[0]) for parts in tops]
    if unscored is not None:
        unscored.append(line)
    return None


def _without_dunder_folders(root: Path, files: list[Path], notes: list[str] | None) -> list[Path]:
    """`files` less those under a top `__`-named folder (`__MACOSX/`, `__background__/`), which train's scan skips:
    predict read them as a class folder of no class of the run, so the folder the run trained on went unscored."""
    kept, dropped = [], {}
    for f in files:
        parts = f.relative_to(root).parts
        if len(parts) > 1 and parts[0].startswith("__"):
            dropped[parts[0]] = dropped.get(parts[0], 0) + 1
        else:
            kept.append(f)
    if dropped and not kept:
        # the warning goes out with the other notes, after the data is read: "no .jpg, .jpeg or .png files" alone
        # was false of a folder whose images all lie under one such folder (photos/__pending/)
        raise dunder_only_error(
            root,
            dropped,
            "no .jpg, .jpeg or .png files",
            f"--data {root / min(dropped)} to predict that folder's images",
        )
    if dropped and notes is not None:
        notes.append(
            f"warning: {len(dropped):,} folder(s) named __*, skipped as cnnpar train skips __MACOSX/: "
            f"{dunder_folders_shown(root, dropped)}: their "
            "images are not predicted"
        )
    return kept


def load_predict_data(
    source: str,
    fmt: str = "auto",
    image_shape: str = "",
    image_size: int = 0,
    skipped: list[Path] | None = None,
    per_image: bool = False,
    notes: list[str] | None = None,
    prepared: dict | None = None,
    labels_csv: str = "",
    class_names: list[str] | None = None,
    unscored: list[str] | None = None,
):
    """Inputs for `cnnpar predict`: returns (dataset, row ids, where its labels came from or "").

    Arrays keep their own size (predict compares it with the model's); image folders and the
    built-in digits are resized to `image_size`, as training resizes them. A folder's images in formats not
    read go to `skipped` where it is given. A folder is read as validation read it: the centre square resized
    (`CpuDecodedFolder`, whose boxes the GPU decoders share), or with `per_image` (a run of the textbook loader)
    each photo's shorter side resized, then its centre cropped. The two are not interchangeable: the second
    crops and resamples other pixels (on noise photos up to 104 levels apart; on any photo that is not square
    the two filters see other extents). With `prepared` (a run trained from a store: its checkpoint's
    `prepared_sides`, {"max_side", "short_side"}) each photo is first resized as `cnnpar prepare` stored it,
    then cropped as the store's validation crops (`PreparedFolder`), whichever loader the run used.
    Lines on how the data was read (a CSV's columns reordered) go to `notes` where it is given. `labels_csv` (a
    flat folder labelled as `cnnpar train --labels` reads it) gives the images it names, and the dataset's `y` their
    labels as indices of the model's `class_names`. Without it a folder of class folders is labelled by their names
    (`class_folder_labels`); why such a folder is not scored goes to `unscored` where it is given."""
    fmt = detect_format(source, fmt)
    check_labels_with(labels_csv, source, fmt)
    if fmt == "csv":
        x, y = read_pixel_csv(source, image_shape, require_label=False, notes=notes)
        ids = [str(i + 1) for i in range(len(x))]
        return ArrayDataset(x, y), ids, "its 'label' column" if y is not None else ""
    if fmt == "npz":
        path = Path(source)
        arrays = _read_npz(path)
        # the test images where the archive has them (predict's job, labelled or not; an x_val beside them is the
        # split training validated on, not what a submission is for), else the split that validated, else training's
        held = npz_held_splits(arrays)
        order = [s for s in ("test", "testing") if s in held] + [s for s in held if s not in ("test", "testing")]
        tally = DecodeTally()  # its damaged JPEGs named, as training's load line names them
        found = next((f for s in order if (f := npz_images(arrays, s, path, tally)) is not None), None)
        found = found or npz_images(arrays, "train", path, tally)
        if notes is not None and tally.damaged_note():
            notes.append(tally.damaged_note())
        if found is not None and notes is not None and len(held) > 1:
            notes.append(
                f"images: {found[1]} of {source} ({len(found[0]):,}); the archive also holds "
                f"{', '.join('x_' + s for s in held if 'x_' + s != found[1])}, not predicted"
            )
        if found is None:
            raise DataError(
                f"{source}: no x_test (x_val, ...) or x_train key, nor test_jpeg/train_jpeg with offsets (found "
                f"{', '.join(arrays) or 'none'})"
            )
        images, key = found
        x = to_nchw_uint8(images, f"{source}[{key}]")
        y_key = "y_" + key.removeprefix("x_").split("_")[0]
        y = to_labels(arrays[y_key], len(x), f"{source}[{y_key}]", 0) if y_key in arrays else None
        return ArrayDataset(x, y), [str(i) for i in range(len(x))], y_key if y is not None else ""
    if fmt == "npy":
        # its images as an .npz's, ids their row numbers; labels where --labels gives them (a .npy), to score
        x = to_nchw_uint8(_read_npy(Path(source), "--data"), source)
        y = to_labels(_read_npy(Path(labels_csv), "--labels"), len(x), labels_csv, 0) if labels_csv else None
        return ArrayDataset(x, y), [str(i) for i in range(len(x))], f"the labels of {labels_csv}" if labels_csv else ""
    if fmt == "digits":
        bundle = load_digits(DataConfig(image_size=image_size, val_fraction=0), 0)
        return bundle.train, [str(i) for i in range(len(bundle.train))], "scikit-learn's digit labels"
    if fmt == "folder":
        root = Path(source)
        labels = None
        if labels_csv:
            if not class_names:
                raise DataError(
                    f"--labels {labels_csv}: the checkpoint holds no class names to match its labels to: expected a "
                    "checkpoint of a run that trained on named classes, or no --labels"
                )
            files, labels = scan_for_classes(root, labels_csv, class_names, skipped, notes)
        else:
            files = _without_dunder_folders(root, image_files(root, skipped), notes)
        if not files:
            raise DataError(f"{root}: no .jpg, .jpeg or .png files")
        origin = f"the labels of {labels_csv}" if labels is not None else ""
        if labels is None and (labels := class_folder_labels(root, files, class_names, unscored)) is not None:
            origin = "its class folders' names"
        ids = [readable_name(str(f.relative_to(root))) for f in files]
        escaped = [i for i, f in zip(ids, files) if not utf8_on_disk(str(f.relative_to(root)))]
        if escaped and notes is not None:
            notes.append(
                f"note: {len(escaped):,} file name(s) under {root} are not UTF-8 (first: {escaped[0]}): their ids "
                "write those bytes as \\xNN"
            )
        size = image_size or FOLDER_SIZE
        if prepared is not None:
            ds = PreparedFolder(files, size, prepared["max_side"], prepared["short_side"])
        elif per_image:
            ds = ImageFolderDataset(files, [-1] * len(files), size)
        else:
            ds = CpuDecodedFolder(files, [-1] * len(files), size, train=False)
        if labels is None:
            return ds, ids, ""
        ds.y = torch.tensor(labels, dtype=torch.int64)  # what predict scores, as an ArrayDataset's y
        return ds, ids, origin
    why = {
        "store": " (a .cnnpar store is prepare's copy of training images: give predict the image folder itself)",
        "synthetic": " (synthetic data has nothing to predict)",
    }.get(fmt, "")
    raise DataError(f"{source}: predict reads a .csv, an .npz, a .npy, an image folder or 'digits', not {fmt!r}{why}")
