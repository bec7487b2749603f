"""Whether a resume reads the data its checkpoint trained on.

A run's record keeps `--data` as typed: `photos` in one folder and `photos` in another are two data sets under
one name, and a resume of the first from the second folder would pass every check that compares the typed path,
the example count and the class names. So the checkpoint also stores where the data was (its absolute path) and a
checksum of its content (a store's pixels, a CSV's or an .npz's arrays, an image folder's file names and classes:
`DataBundle.fingerprint`), which changes when rows are reordered or a store is prepared again, though the count
stays. A resume that reads another path compares the two copies' contents where the old one is still there; where
it is gone (the data moved), the checksum, count and class names are all there is to compare, and the run says so.
"""

from __future__ import annotations

import filecmp
from pathlib import Path

from cnnpar.data.folder import image_files
from cnnpar.data.sources import BUILT_IN


def data_location(source: str) -> str:
    """The absolute path `--data` read, or "" for the built-in sets, which read no file."""
    return "" if source in BUILT_IN else str(Path(source).resolve())


def _listing(root: Path) -> dict[str, int]:
    """The images the folder reader takes under `root` (relative path -> size): a stray README or a hidden file
    in one copy is no other data."""
    return {str(f.relative_to(root)): f.stat().st_size for f in image_files(root)}


def content_difference(was: Path, now: Path) -> str:
    """An empty string where `now` holds what `was` holds (a folder: the same image files at the same sizes; a
    file: the same bytes), else the first difference found, in words."""
    if was.is_dir() != now.is_dir():
        return f"{was} is a {'folder' if was.is_dir() else 'file'}, {now} is not"
    if not was.is_dir():
        return "" if filecmp.cmp(was, now, shallow=False) else "their bytes differ"
    a, b = _listing(was), _listing(now)
    for name in sorted(a.keys() | b.keys()):
        if name not in b:
            return f"{name} is only in {was}"
        if name not in a:
            return f"{name} is only in {now}"
        if a[name] != b[name]:
            return f"{name} has {a[name]} bytes in {was}, {b[name]} in {now}"
    return ""
