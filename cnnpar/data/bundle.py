"""What every source produces: uint8 images, int64 labels, and what the model needs to know."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.utils.data import Dataset

from cnnpar.errors import DataError, UserError


class ArrayDataset(Dataset):
    """An in-memory data set of uint8 images (N, C, H, W) and int64 labels.

    `__getitems__` lets the DataLoader fetch a whole batch with one vectorised index instead of
    N Python calls and a collate, which is most of what a per-sample loader costs.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor | None) -> None:
        assert x.dtype == torch.uint8 and x.ndim == 4, (x.dtype, x.shape)
        self.x = x
        self.y = y if y is not None else torch.full((len(x),), -1, dtype=torch.int64)

    @property
    def labels(self) -> torch.Tensor:  # the name the folder and store data sets give theirs
        return self.y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]

    def __getitems__(self, indices: list[int]):
        idx = torch.as_tensor(indices, dtype=torch.int64)
        return self.x.index_select(0, idx), self.y.index_select(0, idx)

    def subset(self, idx: torch.Tensor) -> ArrayDataset:
        return ArrayDataset(self.x.index_select(0, idx), self.y.index_select(0, idx))


@dataclass
class DataBundle:
    """A train split, an optional validation split, and the facts the model and transforms need."""

    train: Dataset
    val: Dataset | None
    shape: tuple[int, int, int]  # C, H, W as the model sees it
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    origin: str
    class_names: list[str] = field(default_factory=list)
    # the loader itself draws random-resized crops (photo folders, prepared stores): the device
    # transform then only flips, rather than pad-and-crop a second time
    loader_crops: bool = False
    # every image is grey though it has 3 channels: a folder (or a store prepared from one) of grey files, which
    # decode to RGB; --augment auto does not mirror them, as it does not mirror 1-channel arrays
    grey: bool = False
    # grey read from the pixels of a store prepared before its header recorded it (session 34): a checkpoint of a
    # run on it by a cnnpar that read it as colour (meta without grey_from_pixels) resolved --augment auto so
    grey_from_pixels: bool = False
    # whose mean and std normalise the images, in words ("ImageNet's", "the training images'"), for the data line
    stats_from: str = ""
    # where num_classes came from ("labels' max + 1", "--num-classes", "the class folders", ...)
    classes_from: str = ""
    empty_classes: list[int] = field(default_factory=list)  # classes with no example in train or val
    size_from: str = ""  # how a folder's or store's side was chosen (--image-size, or the rule of source_size)
    size_note: str = ""  # a warning when that side enlarges most of the images (source_size.enlarging_note)
    val_from: str = ""  # which split validates: the data's own test/val split, a seeded hold-out, or none
    val_overlap: str = ""  # a warning when validation files are training files (data/overlap.py), else ""
    # what identifies the data's content (a store's pixel checksum, a checksum of a CSV's or an .npz's arrays, of an
    # image folder's listing), "" for the built-in sets: a resume compares it with its checkpoint's
    # (engine/data_identity.py); fingerprint_of says what it covers, in words
    fingerprint: str = ""
    fingerprint_of: str = ""
    skipped_note: str = ""  # a warning naming image files in formats not read (folder.skipped_note), else ""
    load_note: str = ""  # what loading took that a user would wonder about (encoded arrays decoded at load), else ""

    @property
    def in_memory(self) -> bool:
        return isinstance(self.train, ArrayDataset)


def class_lines(bundle: DataBundle) -> list[str]:
    """What to tell the user about the class count: its value and origin, and a warning when some
    classes have no example (labels 0..9 plus one stray 12 make 13 classes, 10 and 11 empty)."""
    origin = f" ({bundle.classes_from})" if bundle.classes_from else ""
    lines = [f"classes: {bundle.num_classes}{origin}"]
    empty = bundle.empty_classes
    if empty:
        shown = first_five(map(str, empty))
        if bundle.loader_crops:  # a folder or a store: its classes are its class folders
            names = first_five(listed_name(bundle.class_names[k]) for k in empty)
            remedy = f"empty class folders: {names}; expected images in each class folder: add some or remove it"
        else:
            shown = first_five(_index_and_name(k, bundle.class_names) for k in empty)
            remedy = "expected labels 0..K-1 with every class present; pass --num-classes K or relabel"
            if bundle.classes_from == CLASS_NAMES_COUNT:
                remedy = (
                    "the archive's class_names name them, and no label is theirs: give them examples or drop their "
                    "names"
                )
        lines.append(f"warning: {len(empty)} of {bundle.num_classes} classes have no examples: {shown} ({remedy})")
    # a data set's own validation split is refused for this (sources._split); a seeded hold-out can still do it
    untrained = untrained_labels(bundle.train.labels, bundle.val.labels) if bundle.val is not None else []
    if untrained:
        lines.append(
            f"warning: {len(untrained)} of {bundle.num_classes} classes have validation examples but no training "
            f"example: {first_five(_class_label(bundle, k) for k in untrained)}: "
            f"{bundle.val_from} took all of theirs, and the model cannot get "
            "them right (give those classes more examples, or lower --val-fraction)"
        )
    return lines


CLASS_NAMES_COUNT = "the archive's class_names"  # classes_from where an .npz's class_names set the count


def _index_and_name(k: int, names: list[str]) -> str:
    """Class k as "5 (dog)" where the data names it, "5" where its name is its index (arrays without names)."""
    name = names[k] if k < len(names) else str(k)
    return str(k) if name == str(k) else f"{k} ({name})"


def _class_label(bundle: DataBundle, k: int) -> str:
    """Class k as a line names it: a folder's or store's by its class folder, an array's by its index (and name)."""
    return bundle.class_names[k] if bundle.loader_crops else _index_and_name(k, bundle.class_names)


def listed_name(name: str) -> str:
    """A name for a comma-separated list: quoted (repr) where it holds a comma, a space, a quote or what does not
    print (a Latin-1 byte), so `com,ma, x, y` reads back as the two folders 'com,ma' and 'x, y'."""
    plain = name and name.isprintable() and not any(c in name for c in ", '\"")
    return name if plain else repr(name)


def first_five(items) -> str:
    """Up to 5 of `items` (strings), comma-separated, with ", ..." where there are more (one-line messages)."""
    items = list(items)
    return ", ".join(items[:5]) + (", ..." if len(items) > 5 else "")


def split_line(bundle: DataBundle) -> str:
    """Input shape, train and validation sizes, and which split validates: the start of every run."""
    n_val = len(bundle.val) if bundle.val is not None else 0
    shape = "x".join(map(str, bundle.shape))
    if bundle.grey and bundle.shape[0] == 3:  # 1x28x28 from the same digits as an .npz: the input says why not
        shape += " (grey files, decoded to RGB: 3 equal channels)"
    source = bundle.val_from or ("as given" if n_val else "none")
    stats = f"; normalised with {bundle.stats_from} mean/std" if bundle.stats_from else ""
    return f"data: input {shape}, train {len(bundle.train):,}, validation {n_val:,}: {source}{stats}"


NO_HOLDOUT = "none: --val-fraction 0"  # val_from where nothing validates: no split of its own, nothing held out


def holdout_label(fraction: float) -> str:
    return f"a seeded {100 * fraction:g}% hold-out of the training data (--val-fraction {fraction:g})"


def require_two_classes(labels: torch.Tensor, origin: str, names: list[str] | None = None, remedy: str = "") -> None:
    """Refuse training labels of fewer than 2 classes: one class trains to loss 0 and 100 % accuracy, a
    result that means nothing. Called for every source from sources._split, before a hold-out; an image
    folder is also refused earlier, as it is scanned (folder._check_classes), so that `cnnpar prepare`
    refuses it before decoding anything."""
    present = torch.unique(labels[labels >= 0]).tolist()
    if len(present) >= 2:
        return
    if present:
        named = f" ({names[present[0]]!r})" if names else ""
        found = f"every training label is {present[0]}{named}"
    else:
        found = "no training labels"
    raise DataError(f"{origin}: {found}: expected at least 2 classes to tell apart{remedy}")


def untrained_labels(train_labels: torch.Tensor, val_labels: torch.Tensor) -> list[int]:
    """Labels that validation holds and no training example has: no model can learn them, so they only lower the
    validation accuracy (and, as the largest label, they can set the class count)."""
    seen = torch.unique(train_labels[train_labels >= 0])
    held = torch.unique(val_labels[val_labels >= 0])
    return held[~torch.isin(held, seen)].tolist()


def empty_classes(y: torch.Tensor, num_classes: int) -> list[int]:
    counts = torch.bincount(y[y >= 0], minlength=num_classes)
    return torch.nonzero(counts == 0).view(-1).tolist()


STATS_MAX_VALUES = 1 << 26  # pixel values the statistics read at most (256 MB as float32)


def channel_stats(x: torch.Tensor, max_samples: int = 10000) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std in [0, 1] units, from the first `max_samples` images, or, where those
    would exceed STATS_MAX_VALUES values, from as many images as fit, spread evenly over the set:
    the default 4,096 synthetic 3x224x224 images made a 2.5 GB float copy (6-17 s of start-up, seen
    in session 6's ladder runs). CIFAR- and MNIST-sized sets keep their first 10,000 images."""
    per_image = max(1, x[0].numel()) if len(x) else 1
    fits = max(1, STATS_MAX_VALUES // per_image)
    if fits < min(len(x), max_samples):
        # images spread over the whole set, not the first few hundred (arrays in class order)
        sample = x[torch.linspace(0, len(x) - 1, fits).round().long()]
    else:
        sample = x[:max_samples]
    sample = sample.to(torch.float32).div_(255.0)
    mean = sample.mean(dim=(0, 2, 3))
    std = sample.std(dim=(0, 2, 3)).clamp_min(1e-3)
    return tuple(round(v, 5) for v in mean.tolist()), tuple(round(v, 5) for v in std.tolist())


def holdout(n: int, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted (train, val) indices of a seeded random hold-out of `fraction` (at least one sample).

    Every source without a labelled test split (arrays, folders, prepared stores) calls this, so
    the same seed holds out the same samples of the same files whichever way they are read."""
    n_val = max(1, int(round(n * fraction)))
    if n_val >= n:  # an epoch of no batches: nothing to train, and no rate to divide by
        raise UserError(
            f"--val-fraction {fraction:g} of {n} labelled image(s) holds out {n_val}, leaving none to train on: "
            "expected a smaller --val-fraction, more images, or a labelled test split"
        )
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[n_val:].sort().values, perm[:n_val].sort().values
