"""Validation files that are training files: one file on disk under two names (hard links, symbolic links).

A folder built from links (a benchmark's x80 copies of the same photos, a data set "split" with `cp -l` or
`ln -s`) puts the same image on both sides of a hold-out: validation accuracy then measures memory, not
generalisation, and nothing in the numbers says so. Files are compared by what `os.stat` says once links are
followed, (device, inode): one stat per file, which the folder scan has just brought into the file-system
cache (24,000 files in 0.07 s on the 2-core development machine). A store (`cnnpar prepare`) keeps the groups
of its images that were one file (`same_file_groups` in its header), so a hold-out drawn from it is checked
the same way; a store written before that key existed is not checked. Byte-identical copies that are separate
files are not detected (that would mean reading every file at start-up).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from cnnpar.errors import DataError


def _identity(path: Path) -> tuple[int, int]:
    try:
        st = os.stat(path)  # follows symbolic links: a link and its target are one file
    except OSError as e:
        raise DataError(f"{path}: cannot read its file status ({e.strerror}): expected a readable image file") from None
    return st.st_dev, st.st_ino


def same_file_groups(files: Sequence[Path]) -> list[list[int]]:
    """Indices of `files` that name one file on disk, in groups of two or more."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, p in enumerate(files):
        groups.setdefault(_identity(p), []).append(i)
    return [g for g in groups.values() if len(g) > 1]


def shared_ids(
    groups: Iterable[Sequence[int]], train: Iterable[int], val: Iterable[int]
) -> tuple[int, tuple[int, int] | None]:
    """(how many validation ids share a group with a training id, one (validation, training) pair)."""
    train, val = set(train), set(val)
    count, example = 0, None
    for g in groups:
        in_train, in_val = [i for i in g if i in train], [i for i in g if i in val]
        if in_train and in_val:
            count += len(in_val)
            example = example or (in_val[0], in_train[0])
    return count, example


def overlap_warning(count: int, n_val: int, example: str) -> str:
    """The one-line warning for `count` of `n_val` validation samples that are training files, else ''."""
    if not count:
        return ""
    return (
        f"warning: {count:,} of {n_val:,} validation files are the same files as training ones (links, e.g. "
        f"{example}): validation accuracy measures memory, not generalisation; expected separate files on each "
        "side (a folder of distinct photos, or its own val/, valid/, validation/ or test/ split)"
    )


def folder_overlap(train: Sequence[Path], val: Sequence[Path]) -> str:
    if not val:
        return ""
    files = [*val, *train]  # ids below len(val) are validation files
    count, pair = shared_ids(same_file_groups(files), range(len(val), len(files)), range(len(val)))
    return overlap_warning(count, len(val), f"{files[pair[0]]} and {files[pair[1]]}" if pair else "")


def store_overlap(groups: Sequence[Sequence[int]], train: Sequence[int], val: Sequence[int]) -> str:
    if not groups or not len(val):
        return ""
    count, pair = shared_ids(groups, train, val)
    return overlap_warning(count, len(val), f"the store's images {pair[0]} and {pair[1]}" if pair else "")
