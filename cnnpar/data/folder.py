"""Image folders (`root/<class>/*.jpg|png`): scanning, reading, decoding one file, and the errors.

Training and evaluation decode on the CPU a batch at a time (`cpu_decode`) or on the GPU
(`gpu_decode`); `ImageFolderDataset` (one file per item: shorter side resized, centre crop) is what
`cnnpar predict` reads and what sources hand to the loader. `decode_rgb` is the one decode that
every CPU decode of a whole file goes through (torchvision for JPEGs, Pillow for PNGs: `decode_png`),
so odd files (grey, CMYK, palette, 16-bit) and damaged ones behave alike on all paths.
"""

from __future__ import annotations

import hashlib
import io
import multiprocessing
import operator
import os
import re
import unicodedata
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from cnnpar.data.bundle import first_five
from cnnpar.data.jpeg_header import read_jpeg_header
from cnnpar.data.png_header import PNG_SIGNATURE, PngHeader, data_shortfall, read_png_header
from cnnpar.data.tv_codecs import tv_codecs
from cnnpar.errors import DataError, TooManyOpenFiles, UserError, first_line
from cnnpar.host_facts import higher_limit, too_many_open_files

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png"}
# the most pixels an image may have, from its header, before it is decoded: Pillow's decompression-bomb error
# (twice its warning's 89,478,485). An 875 KB PNG of 30000x30000 took 4.5 GB at each decode, every epoch; 3x this
# limit in RGB is 537 MB per image a worker holds
MAX_PIXELS = 2 * 89_478_485


# images in formats cnnpar does not read: skipped, but counted and named (a WebP among JPEGs was dropped unsaid)
OTHER_IMAGE_SUFFIXES = {".webp", ".bmp", ".gif", ".tif", ".tiff", ".jfif", ".jpe", ".heic", ".heif", ".avif", ".jp2"}


def image_files(folder: Path, skipped: list[Path] | None = None, links: list | None = None) -> list[Path]:
    """The images under `folder`, in order, without hidden files or folders: `.thumbs/`, and the `._x.jpg`
    resource forks macOS leaves on other file systems, which hold no image and stopped a whole run. Images in
    other formats go to `skipped` where it is given.

    os.scandir, not Path.rglob: rglob, a Path made, compared and stat'ed per file, listed 100,000 empty files in
    5.1 s on a 2-core host, and a store's start lists its source folder to see whether it changed. The same files
    in the same order as `sorted(folder.rglob("*"))` (by their relative parts), links to files kept, with one
    difference: symbolic links to folders are followed (rglob's were not, so `class/sub -> elsewhere/` dropped its
    images unsaid while a linked class folder was read), except one to a folder the walk is already inside or to
    one of `folder`'s parents (a loop; `class/up -> ..` would read the other classes as this one). A folder
    without such links lists as before, so its checksums hold. Where `links` is given, each link to a folder that
    the walk follows goes to it as (its path, its real path), for scan_folder to judge."""
    found: list[tuple[tuple[str, ...], bool]] = []
    if not os.path.isdir(folder):  # as rglob: a folder that is not there yields nothing
        return []
    _walk(str(folder), (), found, skipped is not None, _folder_and_parents(folder), links)
    found.sort()
    files = []
    for parts, readable in found:
        path = folder.joinpath(*parts)
        (files if readable else skipped).append(path)
    return files


def _folder_and_parents(folder: Path) -> frozenset:
    """The (device, inode) of `folder` and of each folder above it: a link to one of them is not followed."""
    inside = set()
    for each in (Path(os.path.abspath(folder)), *Path(os.path.abspath(folder)).parents):
        try:
            st = os.stat(each)
        except OSError:
            continue
        inside.add((st.st_dev, st.st_ino))
    return frozenset(inside)


def _walk(
    path: str, parts: tuple[str, ...], found: list, keep_skipped: bool, inside: frozenset, links: list | None = None
) -> None:
    """Add (relative parts, read by cnnpar) for each image file under `path`, skipping hidden names. `inside`:
    the (device, inode) of the folders the walk is in, so that a link back to one of them is not followed."""
    try:
        with os.scandir(path) as entries:
            listed = list(entries)
    except (PermissionError, NotADirectoryError, FileNotFoundError):  # as rglob: an unreadable folder yields nothing
        return
    for entry in listed:
        if entry.name.startswith("."):
            continue
        try:
            is_dir = entry.is_dir()  # follows a link: a linked folder is walked, a dangling link is no folder
        except OSError:
            continue
        if is_dir:
            _walk_folder(entry, (*parts, entry.name), found, keep_skipped, inside, links)
            continue
        suffix = os.path.splitext(entry.name)[1].lower()
        readable = suffix in IMAGE_SUFFIXES
        if not readable and not (keep_skipped and suffix in OTHER_IMAGE_SUFFIXES):
            continue
        try:
            if entry.is_file():  # follows a link: one to a file counts, a dangling one not
                found.append(((*parts, entry.name), readable))
        except OSError:
            continue


def _walk_folder(
    entry: os.DirEntry, parts: tuple[str, ...], found: list, keep_skipped: bool, inside: frozenset, links: list | None
):
    # one stat a folder (not a file): its identity, to tell a link that loops back
    try:
        st = entry.stat()
    except OSError:
        return
    key = (st.st_dev, st.st_ino)
    if key in inside:
        return
    if links is not None and entry.is_symlink():  # one realpath a followed link to a folder, none a file
        links.append((Path(entry.path), os.path.realpath(entry.path)))
    _walk(entry.path, parts, found, keep_skipped, inside | {key}, links)


def skipped_note(skipped: list[Path]) -> str:
    """A warning naming the images a folder held in formats cnnpar does not read, or ""."""
    if not skipped:
        return ""
    return (
        f"warning: {len(skipped):,} image file(s) skipped, {skipped_kinds(skipped)} (first: {skipped[0]}): cnnpar "
        "reads .jpg, .jpeg and .png; convert them (e.g. Pillow's Image.open(f).save(f.with_suffix('.png'))) to use "
        "them"
    )


def skipped_kinds(skipped: list[Path]) -> str:
    return ", ".join(sorted({f.suffix.lower() for f in skipped}))


def scan_folder(
    root: str | Path, skipped: list[Path] | None = None, other: Path | None = None, found=None, split: bool = False
) -> tuple[list[Path], list[int], list[str]]:
    """`other`: the split beside `root` (val/ for train/, train/ for val/), whose images a link must not read here.
    `found(n)`, where given, is told the images listed so far after each class folder (a Heartbeat's update).
    `split`: `root` is a split folder of the data set (train/, val/), not the folder --data names."""
    root = Path(root)
    if not root.is_dir():
        # a mistyped path (cnnpar prepare photoz) was called "not a folder", which reads as a file being in the way
        what = "not a folder" if root.exists() else "no such folder"
        raise DataError(f"{root}: {what}: expected root/<class>/<image>.jpg|png")
    # `__MACOSX/` (what macOS's zip leaves) holds no class: skipped as hidden folders are, here as in scan_splits
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "__")))
    if not classes:
        _refuse_dunder_only(root, split)
        raise DataError(f"{root}: no class folders: expected root/<class>/<image>.jpg|png{_flat_hint(root)}")
    blocked = _real_chain(root)
    by_real = _refuse_one_folder_under_two_classes(root, classes, blocked)
    real_of = {name: real for real, name in by_real.items()}
    if other is not None:
        _refuse_classes_linked_into_split(root, by_real, other, blocked)
    files, labels = [], []
    for label, name in enumerate(classes):
        links: list = []
        for f in image_files(root / name, skipped, links):
            files.append(f)
            labels.append(label)
        _refuse_links_out_of_class(root, name, links, by_real, real_of[name], other, blocked)
        if found is not None:
            found(len(files))
    if not files:
        others = f" (only {skipped_kinds(skipped)} files, which cnnpar does not read)" if skipped else ""
        raise DataError(f"{root}: no .jpg, .jpeg or .png files under its class folders{others}")
    return files, labels, classes


def _refuse_one_folder_under_two_classes(root: Path, classes: list[str], blocked: frozenset[str]) -> dict[str, str]:
    """Two class folders that are one folder (`dog -> cat`, a link to a sibling class), or one inside the other
    (`dog -> .`, `dog -> cat/siamese`): each image under both would be read twice with two labels, a contradiction
    training learns silently. A link to a folder outside the data set is a way to assemble one: it is read as
    given. Single files linked into two classes are not looked for here. Returns each class's real path, to its
    name."""
    seen: dict[str, str] = {}
    for name in classes:
        real = os.path.realpath(root / name)
        if real in seen:
            # name the link, not the folder it leads to (both may be links, to a folder outside)
            linked, other = (seen[real], name) if (root / seen[real]).is_symlink() else (name, seen[real])
            raise DataError(
                f"{root / linked}: the same folder as {root / other} (a link): its images would carry two labels "
                f"({other} and {linked}); expected each class in a folder of its own"
            )
        seen[real] = name
    _refuse_nested_class_folders(root, seen, blocked)
    return seen


def _refuse_nested_class_folders(root: Path, by_real: dict[str, str], blocked: frozenset[str]) -> None:
    """A class folder whose real path holds another's: image_files reads the inner class's images under the
    outer class too, unless its walk does not get there (`_reaches`: a hidden folder on the way, or `root` or a
    folder above it, which the walk does not go back down into). Sorted as "path/" strings, the folders holding
    one are those still open on a stack when it comes. `blocked`: `_real_chain(root)`."""
    ordered = sorted((real.rstrip(os.sep) + os.sep, name) for real, name in by_real.items())
    holding: list[tuple[str, str]] = []
    for inner_real, inner in ordered:
        while holding and not inner_real.startswith(holding[-1][0]):
            holding.pop()
        for outer_real, outer in holding:
            if _reaches(outer_real, inner_real, blocked):
                _raise_nested(root, outer_real, outer, inner_real, inner)
        holding.append((inner_real, inner))


def _raise_nested(root: Path, outer_real: str, outer: str, inner_real: str, inner: str) -> None:
    link = outer if (root / outer).is_symlink() else inner
    where = "holds" if link == outer else "is inside"
    raise DataError(
        f"{root / link}: a link to {(outer_real if link == outer else inner_real).rstrip(os.sep)}, which {where} "
        f"{root / (inner if link == outer else outer)}: its images would carry two labels ({outer} and {inner}); "
        "expected each class in a folder of its own"
    )


def _real_chain(folder: Path) -> frozenset[str]:
    """The real paths of `folder` and of each folder above it as given: image_files' walk from a class folder in
    it does not go back down into them (`_folder_and_parents`)."""
    start = Path(os.path.abspath(folder))
    return frozenset(os.path.realpath(p) for p in (start, *start.parents))


def _within(path: str, folder: str) -> bool:
    """Whether the real path `path` is `folder` or inside it."""
    folder = folder.rstrip(os.sep)
    return path.rstrip(os.sep) == folder or path.startswith(folder + os.sep)


def _reaches(outer: str, inner: str, blocked: frozenset[str]) -> bool:
    """Whether image_files' walk from the real folder `outer` goes down to the real folder `inner` inside it: not
    where a folder on the way is hidden (skipped) or in `blocked` (not followed back into)."""
    here = outer.rstrip(os.sep) or os.sep
    for part in os.path.relpath(inner, here).split(os.sep):
        here = os.path.join(here, part)
        if part.startswith(".") or here in blocked:
            return False
    return True


def _reads_into(real: str, zone: str, blocked: frozenset[str]) -> bool:
    """Whether a walk from the real folder `real` reads images of the real folder `zone`: inside it, or holding it
    on a way the walk takes."""
    return _within(real, zone) or (_within(zone, real) and _reaches(real, zone, blocked))


def _refuse_classes_linked_into_split(root: Path, by_real: dict[str, str], other: Path, blocked: frozenset) -> None:
    """A class folder that is a link into the other split (`train/dog -> ../val/dog`), or to a folder holding it
    (`train/dog -> ..`): that split's images would be read in this one too, which the overlap check then only
    reported as validation files that are training files."""
    other_real = os.path.realpath(other)
    for real, name in by_real.items():
        if (root / name).is_symlink() and _reads_into(real, other_real, blocked):
            where = ("is" if real == other_real else "is inside") if _within(real, other_real) else "holds"
            raise DataError(
                f"{root / name}: a link to {real}, which {where} {other}: the {other.name}/ split's images would be "
                f"read as {root.name}/ ones too; expected each split's class folders inside it, or a link to a "
                "folder outside the data set"
            )


def _refuse_links_out_of_class(
    root: Path,
    name: str,
    links: list[tuple[Path, str]],
    by_real: dict[str, str],
    own: str,
    other: Path | None,
    blocked: frozenset,
) -> None:
    """A link to a folder inside the class folder `name` (image_files follows it) that leads into another class
    folder of this split, the split folder itself or the other split: those images would be read as class `name`
    too, without a word. Links within the class, or to a folder outside the data set, are read as given."""
    if not links:  # most classes: no realpath of the split folder for them
        return
    root_real = os.path.realpath(root)
    for link, real in links:
        if _within(real, own):
            continue
        if _within(real, root_real):
            cls = next((n for r, n in by_real.items() if _within(real, r)), None)
            where, which = (root / cls if cls else root), "inside"
        elif other is not None and _reads_into(real, os.path.realpath(other), blocked | {own}):
            where, which = other, ("inside" if _within(real, os.path.realpath(other)) else "which holds")
        else:
            continue
        raise DataError(
            f"{link}: a link to {real}, {which} {where}: its images would be read as class {name} too; expected a "
            "link in a class folder to lead only to a folder outside the data set"
        )


def dunder_folders_shown(root: Path, held: dict[str, int]) -> str:
    """Up to 5 of `root`'s `__*` folders in `held` (name: image count), each with its count."""
    return first_five(f"{root / name}/ ({n:,} image(s))" for name, n in sorted(held.items()))


def dunder_only_error(root: Path, held: dict[str, int], what: str, expected: str) -> DataError:
    """The one line, for train and predict alike, where every image of `root` lies under its top folders named
    `__*` (`held`: each one's name and image count), which both skip as `__MACOSX/`: "no class folders" (or
    "no .jpg ... files") alone was false of such a folder and did not say where its images were."""
    return DataError(
        f"{root}: {what} outside its folder(s) named __* ({dunder_folders_shown(root, held)}), which are skipped "
        f"as cnnpar train skips __MACOSX/: expected {expected}"
    )


def _refuse_dunder_only(root: Path, split: bool = False) -> None:
    """Where `root` has no class folder but some `__*` folder of it holds images, the refusal naming them: the
    folder to pass where one holds class folders of images (`only/__x/{cat,dog}`) or splits (`only/__x/{train,val}`),
    its class folders to move up where `root` is a split (`split`), else their renaming."""
    held = {p.name: n for p in root.iterdir() if p.name.startswith("__") and p.is_dir() and (n := len(image_files(p)))}
    if not held:
        return
    # the first that holds class folders, not the first by name: `__a/` of loose images beside `__b/{cat,dog}` was
    # told renamed as a class where `__b` was the folder to pass
    first = next((root / n for n in sorted(held) if _holds_class_folders(root / n)), None)
    if first is not None and split:
        # photos/train/__x/{cat,dog}: passing photos/train/__x in photos' place would leave photos/val/ unread
        expected = f"the class folders of {first} moved up into {root}"
    elif first is not None:
        # no flag named: cnnpar prepare takes the folder as its argument, train and eval as --data
        train, tests = split_dirs(first)
        holds = f"the splits {', '.join(f'{p.name}/' for p in [train, *tests])}" if train else "the class folders"
        expected = f"{first} (which holds {holds}) in its place"
    else:
        expected = "them renamed without the leading __ to read them as classes"
    # images beside them, a flat folder's (Kaggle's train/<id>.jpg), keep the plain refusal's --labels CSV hint
    raise dunder_only_error(root, held, "no class folders", expected + _flat_hint(root))


def _holds_class_folders(folder: Path) -> bool:
    return any(p.is_dir() and not p.name.startswith(".") and image_files(p) for p in folder.iterdir())


def _flat_hint(root: Path) -> str:
    """Where `root` holds images itself (Kaggle's flat train/<id>.jpg), how such a folder is labelled: by a CSV
    through --labels, which "no class folders" alone did not say; "" otherwise."""
    held = sum(1 for p in root.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith("."))
    if not held:
        return ""
    return (
        f", or, as {root} holds {held:,} image(s) itself, --labels CSV: a CSV naming each image and its label "
        "(a header; the image's name first, the label in a column named 'label' or the second of two)"
    )


def split_like_subfolders_note(root: str | Path) -> str:
    """A warning where the class folders hold no image themselves, only the same two or more subfolders each
    (`photos/fold1/{A,B}`: splits under names not known, whose splits would train as the classes and the real
    classes be merged); "" otherwise. A warning, not a refusal: `cat/2019/`, `cat/2020/`, `dog/2019/`, ... is a
    layout of classes too."""
    root = Path(root)
    train_dir, _ = split_dirs(root)
    folder = train_dir or root
    try:
        classes = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith((".", "__")))
    except OSError:
        return ""
    if len(classes) < 2:
        return ""
    shared = None
    for name in classes:
        direct, subfolders = _direct_contents(folder / name)
        if direct or not subfolders or (shared is not None and subfolders != shared):
            return ""
        shared = subfolders
    if len(shared) < 2:  # cat/images/, dog/images/: one folder each is a layout, not splits
        return ""
    shown = ", ".join(f"{n}/" for n in classes[:3]) + (", ..." if len(classes) > 3 else "")
    subs = ", ".join(f"{n}/" for n in sorted(shared)[:3]) + (", ..." if len(shared) > 3 else "")
    return (
        f"warning: {folder}: its class folders {shown} each hold the same subfolders {subs} and no image: if those "
        "are splits, the classes are merged; expected root/<class>/<image>.jpg|png or "
        "root/train|val/<class>/<image>.jpg|png"
    )


def _direct_contents(folder: Path) -> tuple[bool, frozenset[str]]:
    """Whether `folder` holds an image itself, and the names of its subfolders (hidden and `__` ones aside)."""
    has_image, subfolders = False, set()
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.name.startswith((".", "__")):
                    continue
                if entry.is_dir():
                    subfolders.add(entry.name)
                elif os.path.splitext(entry.name)[1].lower() in IMAGE_SUFFIXES:
                    has_image = True
    except OSError:
        pass
    return has_image, frozenset(subfolders)


TRAIN_NAMES = ("train", "training")  # Kaggle's brain-tumour MRI set has Training/ + Testing/
# the common names of a held-out split, in preference order; both lists match in any case (Train/, Test/)
VAL_NAMES = ("val", "valid", "validation", "test", "testing")


def split_dirs(root: Path) -> tuple[Path | None, list[Path]]:
    """`root`'s train folder (None where it has none) and its held-out folders, in `VAL_NAMES` order: the first
    validates. Names match in any case; folders are looked for only where a train folder is there, so a class
    folder named `test` among classes stays a class, and so does one named `train` (`_train_is_a_class`)."""
    folders, train, is_class = _train_folder(root)
    if train is None or is_class:
        return None, []
    held = sorted((n for n in folders if n.lower() in VAL_NAMES), key=lambda n: (VAL_NAMES.index(n.lower()), n))
    return root / train, [root / n for n in held]


def _train_folder(root: Path) -> tuple[list[str], str | None, bool]:
    """`root`'s folder names, its train folder's name (None where it has none) and whether that folder is a class
    (`_train_is_a_class`): what split_dirs and train_class_note both decide from."""
    try:
        folders = sorted(p.name for p in root.iterdir() if p.is_dir())
    except OSError:
        return [], None, False
    train = next((n for n in folders if n.lower() in TRAIN_NAMES), None)
    return folders, train, train is not None and _train_is_a_class(root, train, folders)


def _train_is_a_class(root: Path, train: str, folders: list[str]) -> bool:
    """Whether `train/` is a class folder among others rather than a split: it holds images itself and no
    subfolder, beside 2 or more folders that are not split names (CIFAR-100 exported as <class>/*.png has a class
    `train`, and the whole folder was refused). A split's train/ holds class folders."""
    others = [n for n in folders if n.lower() not in (*TRAIN_NAMES, *VAL_NAMES) and not n.startswith((".", "__"))]
    if len(others) < 2:
        return False
    has_image, subfolders = _direct_contents(root / train)
    return has_image and not subfolders


def train_class_note(root: str | Path) -> str:
    """A note where a folder named train/ is read as a class (`_train_is_a_class`), or ""."""
    root = Path(root)
    _, train, is_class = _train_folder(root)
    if not is_class:
        return ""
    return (
        f"note: {root}: {train}/ holds images itself, beside other class folders: read as the class {train!r}, not "
        "as a training split (a split's train/ holds class folders)"
    )


def _split_names() -> str:
    return "|".join(VAL_NAMES)


def scan_splits(
    root: str | Path, skipped: list[Path] | None = None, found=None
) -> tuple[list[Path], list[int], list[int], list[str]]:
    """Files, labels, split ids (0 train, 1 val) and class names of an image folder.

    `root/train` (or `training`, in any case) beside `root/val` (or `valid`, `validation`, `test`, `testing`, the
    first found) are the two splits, with the same class folders; `root/train` alone is all train (a seeded
    hold-out comes later); a root without a train folder is one folder of class folders, all train. Split names
    never become classes: a train folder beside any other folder is refused (hidden ones and `__MACOSX`-like
    `__` ones aside). Images in formats not read go to `skipped` where it is given (`skipped_note`). `found`: as
    scan_folder's, counting both splits' images.
    """
    root = Path(root)
    train_dir, held = split_dirs(root)
    if train_dir is None:
        files, labels, classes = scan_folder(root, skipped, found=found)
        _check_classes(root, classes, labels)
        return files, labels, [0] * len(files), classes
    known = {train_dir.name, *(p.name for p in held)}
    others = sorted(
        p.name for p in root.iterdir() if p.is_dir() and p.name not in known and not p.name.startswith((".", "__"))
    )
    if others:
        shown = ", ".join(f"{n}/" for n in others[:5]) + (f", ... ({len(others):,} in all)" if len(others) > 5 else "")
        raise DataError(
            f"{root}: holds {train_dir.name}/ beside {shown}: expected train/ with at most one of "
            f"{_split_names()}/ (class folders in each), or class folders alone (a class folder named "
            f"{train_dir.name}/ is read as one where it holds its images itself beside 2 or more other class "
            "folders not named like a split (val, test, ...); "
            "else rename it)"
        )
    val_dir = held[0] if held else None
    files, labels, classes = scan_folder(train_dir, skipped, val_dir, found, split=True)
    _check_classes(train_dir, classes, labels)
    if val_dir is None:
        return files, labels, [0] * len(files), classes
    after_train = None if found is None else (lambda n: found(len(files) + n))
    vfiles, vlabels, vclasses = scan_folder(val_dir, skipped, train_dir, after_train, split=True)
    if vclasses != classes:
        vlabels = _val_labels_by_normal_form(train_dir, val_dir, classes, vclasses, vlabels)
    _check_val_classes_train(train_dir, val_dir, classes, labels, vlabels)
    return files + vfiles, labels + vlabels, [0] * len(files) + [1] * len(vfiles), classes


def unread_splits_note(root: str | Path) -> str:
    """A warning naming the held-out folders beside train/ that are not read: of val/ and test/ (say) the first
    validates (`scan_splits`), and test/ was dropped without a word. "" where at most one is there."""
    root = Path(root)
    _, held = split_dirs(root)
    if len(held) < 2:
        return ""
    unread = ", ".join(f"{p.name}/" for p in held[1:])
    return (
        f"warning: {root}: validates on {held[0].name}/; {unread} beside it not read (one held-out split is used, "
        f"the first of {_split_names()}/): move it out, or predict on it with cnnpar predict"
    )


def skipped_class_folders_note(root: str | Path) -> str:
    """A warning naming the `__`-prefixed folders that hold images, which the scan skips as it skips `__MACOSX/`
    (macOS's zip leaves it, with `._x.jpg` forks that are no images): a `__background__/` class was dropped without a
    word. Still skipped, not read, so that a run's classes and their order stay those its checkpoints hold. ""
    where none holds an image (`__MACOSX/` itself, as a rule)."""
    root = Path(root)
    train_dir, held = split_dirs(root)
    folders = [root] + ([train_dir, *held[:1]] if train_dir is not None else [])
    found = []
    for folder in folders:
        try:
            under = sorted(p for p in folder.iterdir() if p.name.startswith("__") and p.is_dir())
        except OSError:
            continue
        found += [(p, n) for p in under if (n := len(image_files(p)))]
    if not found:
        return ""
    shown = first_five(f"{p}/ ({n:,} image(s))" for p, n in found)
    # one that holds class folders (train/__old/{cat,dog}) renamed would train as one class of all their images
    nested = sum(1 for p, _ in found if _holds_class_folders(p))
    rename = "rename them without the leading __ to train on them as classes"
    if nested == len(found):
        rename = "move their class folders' images up into class folders of the same names beside them to train on them"
    elif nested:
        rename = (
            "rename those of loose images without the leading __ to train on them as classes, and move the class "
            "folders' images in the others up into class folders of the same names beside them"
        )
    return (
        f"warning: {len(found):,} folder(s) named __*, skipped as __MACOSX/ is: {shown}: their images are not read; "
        f"{rename}"
    )


def loose_images_note(root: str | Path) -> str:
    """A warning naming the images that lie beside class folders (in the root, or beside train/ and val/, or
    beside the class folders inside them), which are not read; "" where there are none."""
    root = Path(root)
    train_dir, held = split_dirs(root)
    folders = [root] + ([train_dir, *held[:1]] if train_dir is not None else [])
    loose = [f for folder in folders for f in _images_in(folder)]
    if not loose:
        return ""
    return (
        f"warning: {root}: {len(loose):,} image(s) beside the class folders are not read (first: {loose[0]}): "
        "expected them inside a class folder"
    )


def _images_in(folder: Path) -> list[Path]:
    """The image files right in `folder` (not in its subfolders), hidden ones aside, in order."""
    try:
        with os.scandir(folder) as entries:
            names = sorted(
                e.name
                for e in entries
                if not e.name.startswith(".") and os.path.splitext(e.name)[1].lower() in IMAGE_SUFFIXES and e.is_file()
            )
    except OSError:
        return []
    return [folder / n for n in names]


def _check_classes(folder: Path, classes: list[str], labels: list[int]) -> None:
    # one class trains to loss 0 and 100 % accuracy: a result that means nothing (empty class folders
    # do not count: they hold nothing to tell apart)
    holding = sorted({classes[i] for i in labels})
    if len(holding) < 2:
        raise DataError(
            f"{folder}: images in one class folder ({holding[0]!r}): expected at least 2 class folders with "
            f"images, <class>/<image>.jpg|png (or train/<class>/... beside {_split_names()}/<class>/...)"
        )


def _val_labels_by_normal_form(
    train_dir: Path, val_dir: Path, classes: list[str], vclasses: list[str], vlabels: list[int]
) -> list[int]:
    """val/'s labels as indices into train/'s classes where the two sets of names are the same once both are in
    Unicode's NFC form: a val/café copied from macOS (NFD, e + U+0301) beside train/café (NFC, U+00E9) was refused
    with two lists that print the same. The classes keep train/'s names and order (its checkpoints hold them); the
    sort of NFD names can differ, so each val label is mapped by name. Refused as before where the names differ
    otherwise, or where NFC makes two names of one side the same, naming a pair that differs only in form."""
    t_nfc = [unicodedata.normalize("NFC", n) for n in classes]
    v_nfc = [unicodedata.normalize("NFC", n) for n in vclasses]
    if sorted(t_nfc) == sorted(v_nfc) and len(set(t_nfc)) == len(t_nfc):
        to_train = [t_nfc.index(n) for n in v_nfc]
        return [to_train[k] for k in vlabels]
    message = f"{val_dir}: class folders {vclasses} differ from {train_dir}'s {classes}"
    pairs = ((v, t) for v, vn in zip(vclasses, v_nfc) for t, tn in zip(classes, t_nfc) if v != t and vn == tn)
    twin = next(pairs, None)
    if twin is not None:
        message += (
            f" ({val_dir.name}/{ascii(twin[0])}, {_normal_form(twin[0])}, and {train_dir.name}/{ascii(twin[1])}, "
            f"{_normal_form(twin[1])}, differ only in Unicode normalisation: rename one so that both are spelled "
            "alike)"
        )
    raise DataError(message)


def _normal_form(name: str) -> str:
    """Which Unicode form `name` is spelled in: NFC (as Linux and Windows keep é), NFD (as macOS writes it)."""
    return next((form for form in ("NFC", "NFD") if unicodedata.is_normalized(form, name)), "neither NFC nor NFD")


def _check_val_classes_train(
    train_dir: Path, val_dir: Path, classes: list[str], labels: list[int], vlabels: list[int]
) -> None:
    # images in val/c with train/c empty: the class is one no model can learn, and its images only lower the
    # accuracy (said here, as the folder is scanned, so that `cnnpar prepare` refuses it before decoding)
    untrained = sorted({classes[i] for i in vlabels} - {classes[i] for i in labels})
    if untrained:
        raise DataError(
            f"{val_dir}: class folder(s) {', '.join(map(repr, untrained))} hold images but the same folders in "
            f"{train_dir} hold none: expected training images for every class that {val_dir.name}/ holds"
        )


def decode_error(path: Path | str, e: BaseException) -> UserError:
    """The error for a file that does not decode, on the CPU or on the device."""
    if too_many_open_files(e):  # the decoder could not open its own files (Pillow imports a plugin): not this file's
        # fewer workers only where worker processes ran: with none (train --workers 0, prepare --workers 0 or 1,
        # predict's decoding in its own process) the advice named a flag that had nothing left to give
        fewer = ", or fewer --workers" if worker_processes_run() else ""
        return TooManyOpenFiles(
            f"{path}: not decoded: the open-files limit ran out ({first_line(e)}): expected {higher_limit()}{fewer}"
        )
    # torchvision prefixes its messages with "function, /build/path/file.cpp:LINE, ": drop that.
    reason = re.sub(r"^[^,]*, \S+:\d+, ", "", first_line(e))
    return DataError(f"{path}: cannot decode as an image ({reason}): expected a readable JPEG or PNG file")


def worker_processes_run() -> bool:
    """Whether this process is a worker multiprocessing started (a DataLoader's, prepare's decoding pool's) or has
    live ones beside it, whose pipes and hand-overs take open files too. (torchrun's ranks are plain subprocesses.)"""
    return multiprocessing.parent_process() is not None or bool(multiprocessing.active_children())


def empty_file_error(path: Path | str) -> DataError:
    return DataError(f"{path}: empty file (0 bytes): expected a readable JPEG or PNG file")


def read_encoded(path: Path) -> torch.Tensor:
    """A file's bytes as a 1-D uint8 tensor in ordinary (shareable) memory; DataError if unreadable or empty."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:  # every path read was listed first: only a file deleted or moved since is missing
        raise DataError(f"{path}: gone since its folder was listed (deleted or moved while this ran)") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror})") from None
    if not data:
        raise empty_file_error(path)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def check_pixel_count(path: Path | str, h: int, w: int) -> None:
    """Refuse an image whose header gives more than MAX_PIXELS, before anything decodes it."""
    if h * w > MAX_PIXELS:
        raise DataError(
            f"{path}: {w}x{h} pixels ({h * w / 1e6:,.0f} megapixels): expected at most {MAX_PIXELS / 1e6:.0f} "
            "megapixels (Pillow's decompression-bomb limit; decoding it takes gigabytes at every epoch): shrink it or "
            "leave it out"
        )


def check_png_data(path: Path | str, data, header: PngHeader) -> None:
    """Refuse a PNG whose image data is too short for the pixels its header gives (png_header.data_shortfall),
    from its chunk lengths: before a decoder allocates every pixel its header claims, only to find the data cut."""
    short = data_shortfall(data, header)
    if short is None:
        return
    held, fewest = short
    raise DataError(
        f"{path}: cannot decode as an image (PNG image data of {held:,} bytes, where its {header.width}x"
        f"{header.height} pixels need at least {fewest:,} however compressed: cut short or damaged): expected a "
        "readable JPEG or PNG file"
    )


def _check_header_pixels(data: torch.Tensor, path: Path | str) -> None:
    """check_pixel_count on the size a JPEG's frame header or a PNG's IHDR gives (other formats: none is read), and
    check_png_data on a PNG, before torchvision decodes it."""
    view = memoryview(data.numpy())
    jpeg = read_jpeg_header(view)
    if jpeg is not None:
        check_pixel_count(path, jpeg.height, jpeg.width)
        return
    png = read_png_header(view)
    if png is not None:
        check_pixel_count(path, png.height, png.width)
        check_png_data(path, view, png)
        return
    _check_other_format_pixels(view, path)


def _check_other_format_pixels(view: memoryview, path: Path | str) -> None:
    """check_pixel_count for a file named .jpg or .png that holds a GIF or a WebP (torchvision decodes those too),
    from the size and frame count Pillow's reader of that format gives without decoding: torchvision decodes every
    frame of a GIF, and a 296 KB GIF named .jpg decoded to 20000x20000 (1.2 GB) past the limit."""
    import struct

    from PIL import GifImagePlugin, Image, WebPImagePlugin

    head = bytes(view[:12])
    if head[:4] == b"GIF8":
        reader = GifImagePlugin.GifImageFile
    elif head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        reader = WebPImagePlugin.WebPImageFile
    else:
        return  # anything else torchvision names undecodable
    try:
        # the format's class, not Image.open: its decompression-bomb error names no size
        with reader(io.BytesIO(view)) as im:
            (w, h), frames = im.size, getattr(im, "n_frames", 1)
    except Image.DecompressionBombError as e:
        # the class checks too (a WebP's canvas, a GIF frame reaching past its screen): past the limit all the same
        raise DataError(
            f"{path}: {first_line(e)}: expected at most {MAX_PIXELS / 1e6:.0f} megapixels (Pillow's "
            "decompression-bomb limit): shrink it or leave it out"
        ) from None
    except (OSError, ValueError, SyntaxError, EOFError, IndexError, struct.error):
        return  # damaged (the GIF reader indexes and unpacks a truncated file unchecked): torchvision's error names it
    if frames > 1 and h * w * frames > MAX_PIXELS:
        raise DataError(
            f"{path}: {frames:,} frames of {w}x{h} pixels ({h * w * frames / 1e6:,.0f} megapixels, every frame "
            f"decoded): expected at most {MAX_PIXELS / 1e6:.0f} megapixels: save its first frame as a JPEG or PNG"
        )
    check_pixel_count(path, h, w)


def decode_rgb(data: torch.Tensor, path: Path | str) -> torch.Tensor:
    """Encoded bytes (1-D uint8) to a (3, H, W) uint8 RGB image: JPEGs (and GIFs) with torchvision's
    libjpeg-turbo, PNGs with Pillow (`decode_png`).

    Grey, palette, alpha and CMYK files come out as RGB (alpha dropped). 16-bit PNGs keep their top 8
    bits, as a uint8 cast would instead clip almost every pixel to white. Anything that does not decode
    is a DataError naming `path`.
    """
    from torchvision.io import ImageReadMode, decode_image

    if data.numel() == 0:
        raise empty_file_error(path)
    _check_header_pixels(data, path)
    if bytes(data[:8].numpy()) == PNG_SIGNATURE:
        return decode_png(data, path)
    try:
        with tv_codecs():  # torchvision 0.29's deprecation notice: known, see docs/decoding.md
            img = decode_image(data, mode=ImageReadMode.RGB)
    except (RuntimeError, ValueError) as e:
        raise decode_error(path, e) from None
    if img.ndim == 4:  # an animated GIF (torchvision reads those too): its first frame
        img = img[0]
    if img.dtype != torch.uint8:  # 16 bits a sample (uint16, int32 in older torchvision): the top 8
        img = (img.to(torch.int32) >> 8).to(torch.uint8)
    return img


def decode_png(data: torch.Tensor, path: Path | str) -> torch.Tensor:
    """A PNG's (3, H, W) uint8 RGB pixels decoded by Pillow, laid out as torchvision's (interleaved: a permuted
    view), or a DataError naming `path`.

    Not torchvision: its 0.29 PNG decoder kills the process (SIGSEGV, after libpng's "IDAT: incorrect data check",
    "bad adaptive filter value", "Not enough image data" or "IDAT: CRC error") on any error libpng meets in the image
    data, naming no file; where no DataLoader worker stands between (`--workers 0`, the GPU decoders' CPU fall-back,
    `cnnpar predict`) that ended the whole run. Pillow raises instead, and decodes valid files to the same pixels
    (every colour type, bit depth, interlacing, tRNS: tests/unit/test_png_header.py) in about 1.2x torchvision's
    time (benchmarks/png_decode.py). Unlike libpng, Pillow refuses a file whose ancillary chunk (tEXt, iCCP) fails
    its checksum, or whose compressed text or colour profile inflates past 1 MB (PngImagePlugin.MAX_TEXT_CHUNK), as
    `cnnpar prepare` (Pillow too) always has: refused naming the file, where torchvision ignored them."""
    from PIL import PngImagePlugin

    try:
        # the PNG class itself, not Image.open: a file Image.open cannot identify gets "cannot identify image file
        # <_io.BytesIO object at 0x...>", where the class says why ("bad header checksum in b'IHDR'"). Pillow's
        # decompression-bomb check (Image.open's) is check_pixel_count's, made before this call.
        with PngImagePlugin.PngImageFile(io.BytesIO(memoryview(data.numpy()))) as im:
            im.load()
            rgb = im if im.mode == "RGB" else pillow_rgb(im)
            pixels = torch.frombuffer(bytearray(rgb.tobytes()), dtype=torch.uint8)
    except (OSError, SyntaxError, ValueError, EOFError) as e:  # zlib's and Pillow's own errors
        raise decode_error(path, e) from None
    return pixels.view(rgb.height, rgb.width, 3).permute(2, 0, 1)


def pillow_rgb(im):
    """A Pillow image as a new RGB image with `decode_rgb`'s pixels: grey, CMYK, palette and RGBA as RGB; 16-bit
    grey (Pillow's "I;16" and "I" modes) keeps its top 8 bits, where Pillow's own conversion clips every value
    above 255 (a pure white picture). Pillow reads the other 16-bit PNGs to their top 8 bits itself. A palette
    image's transparency is dropped from `im.info` (alpha is dropped anyway; Pillow warns converting it to RGB)."""
    import numpy as np
    from PIL import Image

    if im.mode == "P":
        im.info.pop("transparency", None)
    if im.mode.startswith("I;16") or im.mode == "I":
        top = (np.asarray(im).astype(np.int64) >> 8).clip(0, 255).astype(np.uint8)
        return Image.fromarray(top, "L").convert("RGB")
    return im.convert("RGB")


def decode_resized(path: Path, size: int) -> torch.Tensor:
    """Decode one file to uint8 (3, size, size): shorter side to `size`, then a centre crop."""
    from torchvision.transforms.v2 import functional as TF

    img = TF.resize(decode_rgb(read_encoded(path), path), size, antialias=True)
    return TF.center_crop(img, [size, size])


_NO_BYTES = np.zeros(0, dtype=np.uint8)


class PathTable(Sequence):
    """Paths packed into one byte array and its offsets, read as a list of Paths (`table[i]` is a new Path each
    time). What the data sets handed to DataLoader workers hold in place of a list: a forked worker that reads
    `files[i]` from a list writes to that Path's memory (its reference count, its cached string), so the page
    holding it is copied into the worker; over an epoch a worker copied almost every page of the list, 148 MB
    each for 400,000 files (ImageNet's 1.28 million: ~0.5 GB a worker, times every worker of every rank). Two
    numpy arrays hold no object per file, so the workers share them with their parent. A table handed to another
    table, or `take`n, shares its bytes."""

    __slots__ = ("_bytes", "_starts", "_ends")

    def __init__(self, paths: Sequence = ()) -> None:
        if isinstance(paths, PathTable):
            self._bytes, self._starts, self._ends = paths._bytes, paths._starts, paths._ends
            return
        # one string, encoded at once and cut at its NULs (no path holds one): a Python call per path took 1.2 s
        # for 400,000. os.fsencode: a name that is not UTF-8 comes back as the same bytes, so as the same Path
        names = [os.fspath(p) for p in paths]
        self._bytes = np.frombuffer(os.fsencode("\0".join(names) + "\0"), dtype=np.uint8) if names else _NO_BYTES
        self._ends = np.flatnonzero(self._bytes == 0)
        self._starts = np.concatenate(([0], self._ends[:-1] + 1)) if names else self._ends

    def __len__(self) -> int:
        return len(self._ends)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        i = operator.index(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"path index {i} out of range for {len(self)} paths")
        return Path(os.fsdecode(self._bytes[self._starts[i] : self._ends[i]].tobytes()))

    def __add__(self, other) -> list[Path]:
        """A list, as the lists these tables replace gave: `bundle.train.files + bundle.val.files` (a script's, the
        tests') raised TypeError once an image folder's data set held a table."""
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return [*self, *other]

    def __radd__(self, other) -> list[Path]:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return [*other, *self]

    def take(self, idx) -> PathTable:
        """The paths at the indices `idx` (a sequence or 1-D array), sharing this table's bytes."""
        table = PathTable.__new__(PathTable)
        idx = np.asarray(idx, dtype=np.int64)
        table._bytes, table._starts, table._ends = self._bytes, self._starts[idx], self._ends[idx]
        return table


class ImageFolderDataset(Dataset):
    def __init__(self, files: Sequence[Path], labels: list[int], size: int) -> None:
        # not a list: the textbook loader hands this data set itself to its workers, which copied a list of Paths
        # page by page as they read it (PathTable); the fast readers made from it share the table's bytes
        self.files = PathTable(files)
        self.labels = torch.as_tensor(labels, dtype=torch.int64)
        self.size = size

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        return decode_resized(self.files[i], self.size), self.labels[i]

    def random_resized_crop(self, i: int, generator: torch.Generator, min_scale: float):
        """Image i as a training sample of the textbook loader: a random-resized crop (`draw_crop_boxes`, the
        distribution every fast path draws from) of the whole decoded photo, resized to size x size."""
        from cnnpar.data.crop_resize import draw_crop_boxes, resized_crops_loop

        img = decode_rgb(read_encoded(self.files[i]), self.files[i])
        box = draw_crop_boxes(torch.tensor([img.shape[1:]]), True, generator, min_scale)
        return resized_crops_loop([img], box, self.size)[0], self.labels[i]

    def subset(self, idx: torch.Tensor) -> ImageFolderDataset:
        return ImageFolderDataset(self.files.take(idx.tolist()), self.labels[idx].tolist(), self.size)


def listing_checksum(root: Path, files: list[Path], labels: list[int], splits: list[int]) -> str:
    """sha256 of a folder's image names (relative), classes and splits in order: a file renamed, added in place of
    another or moved between class folders changes it. Not the bytes: reading every photo at each start would
    cost more than the run's first epoch."""
    digest = hashlib.sha256()
    prefix = os.path.join(str(root), "")
    for f, label, split in zip(files, labels, splits):
        name = str(f)
        # the name under root by slicing where it starts with root, as it does for every file a scan found:
        # Path.relative_to took 1.4 s for 100,000 files
        rel = name[len(prefix) :] if name.startswith(prefix) else str(f.relative_to(root))
        # surrogateescape: a name that is not UTF-8 (Latin-1 caf\xe9.png) hashes as its bytes on disk; a UTF-8 name
        # holds no lone surrogate and encodes to the same bytes as before, so existing checksums hold
        digest.update(f"{rel}\0{label}\0{split}\n".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


# What the ranks of a job compare of an image folder's content beside its listing (`content_sample_checksum`): the
# first CONTENT_SAMPLE_BYTES of CONTENT_SAMPLE_FILES files spread evenly over it
CONTENT_SAMPLE_FILES = 32
CONTENT_SAMPLE_BYTES = 1 << 16


def content_sample_checksum(files: Sequence[Path]) -> str:
    """sha256 of every file's size, in order, and of the first CONTENT_SAMPLE_BYTES of CONTENT_SAMPLE_FILES of them
    spread evenly over the list: what the ranks of a job compare of their copies of an image folder beside its
    listing (engine/agreement.data_identity), which names alone pass. A node whose copy holds other pictures under
    the same names trained on them silently. A re-encoded, replaced or swapped photo almost always changes a size;
    a same-size change in a file outside the sample passes. One stat per file and 32 short reads: 30 ms for 5,000
    files here, warm (docs/distributed.md)."""
    digest = hashlib.sha256()
    for f in files:
        digest.update(os.stat(f).st_size.to_bytes(8, "little"))
    count = len(files)
    step = max(1, count // CONTENT_SAMPLE_FILES)
    for i in range(0, count, step)[:CONTENT_SAMPLE_FILES]:
        with open(files[i], "rb") as fh:
            digest.update(fh.read(CONTENT_SAMPLE_BYTES))
    return digest.hexdigest()
