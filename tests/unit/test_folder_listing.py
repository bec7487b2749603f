"""An image folder's listing (`image_files`), which decides the files' order, labels and the checksums a resume and a
store compare: os.scandir now, for speed, and the same files in the same order as the `sorted(rglob("*"))` it
replaced, with its filters (hidden names, formats, links to files), except that links to folders are followed
(once: a link back into a folder the walk is in is not)."""

from __future__ import annotations

import os
from pathlib import Path

from cnnpar.data.folder import IMAGE_SUFFIXES, OTHER_IMAGE_SUFFIXES, image_files, listing_checksum, scan_splits


def walked(folder: Path) -> list[Path]:
    """Every path under `folder`, as rglob gave them, but with links to folders followed unless they lead back to
    a folder the walk is in or above it."""
    out = []

    def walk(here: Path, inside: set[str]) -> None:
        for p in here.iterdir():
            out.append(p)
            if p.is_dir() and os.path.realpath(p) not in inside:
                walk(p, inside | {os.path.realpath(p)})

    start = Path(os.path.abspath(folder))
    walk(folder, {os.path.realpath(p) for p in (start, *start.parents)})
    return out


def reference(folder: Path, skipped: list[Path] | None) -> list[Path]:
    """The listing as cnnpar made it before (Path.rglob, sorted, filtered), with links to folders followed."""
    found = []
    for f in sorted(walked(folder)):
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
    os.symlink("b", root / "b_link")  # a link to a folder: followed
    os.symlink("../b", root / "gone")  # dangling (photos/../b): nothing
    os.symlink("../a/1.jpg", root / "Z" / "link.jpg")  # a link to a file: listed
    os.symlink("../nowhere.jpg", root / "Z" / "dangling.jpg")  # dangling: not listed
    os.symlink("../b", root / "Z" / "dirlink.jpg")  # a folder behind an image name: followed, as a folder
    os.symlink("..", root / "a" / "sub" / "up")  # a loop back to a/, which the walk is in: not followed
    os.symlink("../..", root / "a" / "sub" / "root")  # the root from a/sub: above a/, so not followed from there
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
    assert not any(".hid" in f.parts or ".thumbs" in f.parts or "up" in f.parts for f in listed)
    assert root / "b_link" / "B.jpg" in listed and root / "Z" / "dirlink.jpg" / "B.jpg" in listed
    monkeypatch.chdir(tmp_path)  # a relative root lists relative paths, as before
    assert image_files(Path("photos")) == reference(Path("photos"), None)


def test_the_listing_checksum_is_unchanged_for_relative_and_absolute_roots(tmp_path, monkeypatch):
    import hashlib

    root = tricky_tree(tmp_path / "photos")
    # a class linked to a sibling class is refused (test_linked_class_folders.py), and so is a link inside a class
    # to a sibling class (test_split_links.py); a class linked to a folder outside the data set is one of its own
    (root / "b_link").unlink()
    (root / "Z" / "dirlink.jpg").unlink()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "o.jpg").write_bytes(b"x")
    os.symlink("../outside", root / "o_link")
    monkeypatch.chdir(tmp_path)
    for given in (root, Path("photos"), Path("./photos/")):
        files, labels, splits, _ = scan_splits(given)
        assert tmp_path / "photos" / "o_link" / "o.jpg" in [Path(os.path.abspath(f)) for f in files]
        digest = hashlib.sha256()  # the checksum as written before: Path.relative_to for every file
        for f, label, split in zip(files, labels, splits):
            digest.update(f"{f.relative_to(given)}\0{label}\0{split}\n".encode())
        assert listing_checksum(given, files, labels, splits) == digest.hexdigest()
