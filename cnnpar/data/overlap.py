"""Validation files that are training files: the same file on disk under two names (hard links).

A folder built from hard links (a benchmark's x80 copies of the same photos, a data set "split" with `cp -l`)
puts the same image on both sides of a hold-out: validation accuracy then measures memory, not
generalisation, and nothing in the numbers says so. The check is cheap because it only compares what the
file system already knows: a file whose link count is 1 has no other name, so only validation files with
more than one link lead to a look at the training files' inodes. A store (`cnnpar prepare`) keeps the groups
of its images that were one file (`same_file_groups` in its header), so a hold-out drawn from it is checked
the same way. Byte-identical copies that are separate files are not detected (that would mean reading every
file at start-up).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path


def _identity(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_nlink


def shared_files(train: Sequence[Path], val: Sequence[Path]) -> tuple[int, tuple[Path, Path] | None]:
    """(how many validation files are also training files, one such (validation, training) pair)."""
    linked: dict[tuple[int, int], list[Path]] = {}  # (dev, inode) -> validation paths with other names
    for p in val:
        dev, ino, links = _identity(p)
        if links > 1:
            linked.setdefault((dev, ino), []).append(p)
    if not linked:
        return 0, None
    shared, example = set(), None
    for p in train:
        dev, ino, links = _identity(p)
        hits = linked.get((dev, ino)) if links > 1 else None
        if hits:
            shared.add((dev, ino))
            example = example or (hits[0], p)
    return sum(len(linked[k]) for k in shared), example


def same_file_groups(files: Sequence[Path]) -> list[list[int]]:
    """Indices of `files` that name one file on disk, in groups of two or more (for a store's header)."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, p in enumerate(files):
        dev, ino, links = _identity(p)
        if links > 1:
            groups.setdefault((dev, ino), []).append(i)
    return [g for g in groups.values() if len(g) > 1]


def shared_ids(
    groups: Iterable[Sequence[int]], train: Iterable[int], val: Iterable[int]
) -> tuple[int, tuple[int, int] | None]:
    """`shared_files` for a store: (how many validation ids share a group with a training id, one pair)."""
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
        f"warning: {count:,} of {n_val:,} validation files are the same files as training ones (hard links, "
        f"e.g. {example}): validation accuracy measures memory, not generalisation; expected separate files "
        "on each side (a folder of distinct photos, or its own val/ split)"
    )


def folder_overlap(train: Sequence[Path], val: Sequence[Path]) -> str:
    count, pair = shared_files(train, val) if val else (0, None)
    return overlap_warning(count, len(val), f"{pair[0]} and {pair[1]}" if pair else "")


def store_overlap(groups: Sequence[Sequence[int]], train: Sequence[int], val: Sequence[int]) -> str:
    count, pair = shared_ids(groups, train, val) if groups and len(val) else (0, None)
    return overlap_warning(count, len(val), f"the store's images {pair[0]} and {pair[1]}" if pair else "")
