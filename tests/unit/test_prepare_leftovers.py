"""`cnnpar prepare`: what a finished prepare leaves beside its store (nothing a killed one left either)."""

from __future__ import annotations

import fcntl
import os
import sys

import pytest

from cnnpar.data.store import StoreFile, left_partials
from cnnpar.data.store_write import prepare_store
from tests.datafiles import write_image_folder

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="flock and SIGKILL semantics of Linux")


def test_a_prepare_that_finishes_removes_what_a_killed_prepare_to_its_out_left_but_not_a_live_ones(tmp_path):
    """A prepare killed with SIGKILL (the OOM killer, kill -9) leaves OUT.<random>.partial and its chunk files; the
    store's refusal says to re-run prepare, and that re-run left them there, hundreds of MB, without a word. A
    prepare still writing to the same OUT holds its partial (flock) and keeps it."""
    src = write_image_folder(tmp_path / "p", per_class=4, classes=2, side=24)
    out = tmp_path / "p.cnnpar"
    dead = [tmp_path / "p.cnnpar.0badf00d.partial", tmp_path / "p.cnnpar.0badf00d.chunk3.partial"]
    for path in dead:
        path.write_bytes(bytes(4096))
    live = tmp_path / "p.cnnpar.1ee71ee7.partial"
    live.write_bytes(bytes(4096))
    fd = os.open(live, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another prepare, still writing
        prepare_store(src, out, workers=1, progress=False, short_side=16)
        assert left_partials(out) == [live]
    finally:
        os.close(fd)
    assert StoreFile(out).count == 8
    # once that writer is gone (its flock with it), the next prepare to OUT clears its file too
    prepare_store(src, out, workers=2, progress=False, short_side=16)
    assert left_partials(out) == []
    assert StoreFile(out).count == 8


def test_a_prepare_that_finishes_removes_what_a_killed_prepare_to_another_store_of_its_folder_left(tmp_path):
    """A prepare SIGKILLed with no prepare to its own OUT after it left its partial store (246 MB in the audit)
    for good. A partial another prepare still holds, and a file a prepare does not name so, stay."""
    src = write_image_folder(tmp_path / "p", per_class=4, classes=2, side=24)
    dead = [tmp_path / "q.cnnpar.0badf00d.partial", tmp_path / "q.cnnpar.0badf00d.chunk3.partial"]
    upper = tmp_path / "R.CNNPAR.0badf00d.partial"  # --out takes the suffix in any case
    live = tmp_path / "s.cnnpar.1ee71ee7.partial"
    strangers = [tmp_path / "notes.0badf00d.partial", tmp_path / "movie.mkv.0badf00d.partial"]
    for path in [*dead, upper, live, *strangers]:
        path.write_bytes(bytes(4096))
    fd = os.open(live, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another prepare, still writing
        prepare_store(src, tmp_path / "p.cnnpar", workers=1, progress=False, short_side=16)
    finally:
        os.close(fd)
    left = sorted(path.name for path in tmp_path.glob("*.partial"))
    assert left == sorted(path.name for path in [live, *strangers])
