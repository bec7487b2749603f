"""An image folder's listing (`image_files`), which decides the files' order, labels and the checksums a resume and a
store compare: os.scandir now, for speed, and the same files in the same order as the `sorted(rglob("*"))` it
replaced, with its filters (hidden names, formats, links)."""

from __future__ import annotations

import os
from pathlib import Path

from cnnpar.data.folder import IMAGE_SUFFIXES, OTHER_IMAGE_SUFFIXES, image_files, listing_checksum, scan_splits


def reference(folder: Path, skipped: list[Path] | None) -> list[Path]:
    """The listing as cnnpar made it before: Path.rglob, sorted, filtered."""
    found = []
    for f in sorted(folder.rglob("*")):
        suffix = f.suffix.lower()
        if suffix not in IMAGE_SUFFIXES and (skipped is None or suffix not in OTHER_IMAGE_SUFFIXES):
            continue
        if any(part.startswith(".") for part in f.relative_to(folder).parts) or not f.is_file():
            continue
        (found if suffix in IMAGE_SUFFIXES else skipped).append(f)
    return found


def tricky_tree(root: Path) -> Path:
    names = [
        "a/1.jpg", "a/2.JPG", "a/10.png", "a/sub/3.jpeg", "a/sub/deeper/4.jpg", "a/x.webp", "a/y.txt", "a/._5.jpg",
        ".hid/6.jpg", "a/.thumbs/7.jpg", "dir.jpg/8.jpg", "Z/9.jpg", "b/B.jpg", "b/a.jpg", "b/ü.jpg", "b/sp ace.png",
        "b/a-b.jpg", "b/a_b.jpg", "a/foo.", "a/noext",
    ]  # fmt: skip
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"x")
    os.symlink("../b", root / "b_link")  # a link to a folder: not followed
    os.symlink("../a/1.jpg", root / "Z" / "link.jpg")  # a link to a file: listed
    os.symlink("../nowhere.jpg", root / "Z" / "dangling.jpg")  # dangling: not listed
    os.symlink("../b", root / "Z" / "dirlink.jpg")  # a folder behind an image name: not listed
    return root


def test_the_listing_is_the_sorted_rglob_listing_it_replaced(tmp_path, monkeypatch):
    root = tricky_tree(tmp_path / "photos")
    for folder in (root, root / "a", root / "b"):
        for keep in (False, True):
            ours, theirs = ([], []) if keep else (None, None)
            assert image_files(folder, ours) == reference(folder, theirs)
            assert ours == theirs
    listed = image_files(root, [])
    assert root / "Z" / "link.jpg" in listed and root / "a" / "._5.jpg" not in listed
    assert not any(".hid" in f.parts or ".thumbs" in f.parts or "b_link" in f.parts for f in listed)
    monkeypatch.chdir(tmp_path)  # a relative root lists relative paths, as before
    assert image_files(Path("photos")) == reference(Path("photos"), None)


def test_the_listing_checksum_is_unchanged_for_relative_and_absolute_roots(tmp_path, monkeypatch):
    import hashlib

    root = tricky_tree(tmp_path / "photos")
    monkeypatch.chdir(tmp_path)
    for given in (root, Path("photos"), Path("./photos/")):
        files, labels, splits, _ = scan_splits(given)
        digest = hashlib.sha256()  # the checksum as written before: Path.relative_to for every file
        for f, label, split in zip(files, labels, splits):
            digest.update(f"{f.relative_to(given)}\0{label}\0{split}\n".encode())
        assert listing_checksum(given, files, labels, splits) == digest.hexdigest()
