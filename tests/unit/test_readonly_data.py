"""Data in a folder that cannot be written (Kaggle's read-only /kaggle/input, only the working folder writable):
the store cnnpar prepare writes by default, and the advice naming it, go to the current folder, not beside the data."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cnnpar.cli import main as cli_main
from cnnpar.data.store import default_store_path, prepare_command


def read_only_photos(tmp_path: Path) -> Path:
    """input/photos/<a|b>/*.png under a read-only input/ (the photos' own folders stay readable)."""
    photos = tmp_path / "input" / "photos"
    rng = np.random.default_rng(0)
    for i in range(8):
        (photos / "ab"[i % 2]).mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(photos / "ab"[i % 2] / f"{i}.png")
    for p in [*photos.rglob("*"), photos, photos.parent]:
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    if os.access(photos.parent, os.W_OK):  # root with CAP_DAC_OVERRIDE writes whatever the mode
        pytest.skip("this user writes into a folder without write permission (root): chmod cannot make one read-only")
    return photos


@pytest.fixture
def work(tmp_path, monkeypatch):
    folder = tmp_path / "work"
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


def test_default_store_goes_to_the_current_folder_where_the_datas_cannot_be_written(tmp_path, work):
    photos = read_only_photos(tmp_path)
    assert default_store_path(photos) == Path("photos.cnnpar")
    assert "--out photos.cnnpar " in prepare_command(str(photos), 32)
    writable = tmp_path / "mine" / "photos"
    writable.mkdir(parents=True)
    assert default_store_path(writable) == tmp_path / "mine" / "photos.cnnpar"  # beside it, as before


def test_prepare_without_out_writes_into_the_current_folder_and_nothing_beside_the_data(tmp_path, work, capsys):
    photos = read_only_photos(tmp_path)
    before = sorted(p.name for p in tmp_path.joinpath("input").rglob("*"))
    assert cli_main(["prepare", str(photos)]) == 0, capsys.readouterr().err
    assert (work / "photos.cnnpar").stat().st_size > 0
    assert "train with: cnnpar train --data photos.cnnpar" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.joinpath("input").rglob("*")) == before


def test_a_picture_under_a_read_only_home_draws_without_matplotlibs_folder_warnings(tmp_path, work):
    """A container's read-only HOME: matplotlib's own temporary folder serves, without its two WARNING lines in the
    middle of the command's output (doctor's picture here; bench's and --monitor's import it alike)."""
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o555)
    if os.access(home, os.W_OK):
        pytest.skip("this user writes into a folder without write permission (root): chmod cannot make one read-only")
    (work / "phases.csv").write_text("name,images_per_s\nend to end,100\ndata alone,300\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MPL", "XDG_"))} | {"HOME": str(home)}
    code = "from pathlib import Path; from cnnpar.doctor.render import plot_phases; "
    code += "plot_phases(Path('phases.csv'), Path('phases.png'), 'data-bound')"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (work / "phases.png").stat().st_size > 0
    assert "matplotlib" not in done.stderr.lower(), done.stderr


def test_workers_under_a_read_only_dev_shm_stop_in_one_line_naming_it(monkeypatch):
    """A container's read-only /dev/shm: the workers' queue locks (POSIX semaphores, files there) are refused, and the
    run ended in a traceback, then torch's "Exception ignored" one for its half-made iterator. The kernel's refusal
    is given here as sem_open gives it: /dev/shm itself cannot be made read-only for a test."""
    import _multiprocessing
    import gc
    import multiprocessing.synchronize  # noqa: F401 - imported whole before its SemLock is refused

    import torch

    from cnnpar.data.loader import _WholeIterators
    from cnnpar.errors import SharedMemoryUnwritable

    def refused(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    monkeypatch.setattr(_multiprocessing, "SemLock", refused)
    loader = _WholeIterators(torch.utils.data.TensorDataset(torch.zeros(4, 1)), batch_size=2, num_workers=1)
    with pytest.raises(SharedMemoryUnwritable) as refusal:
        iter(loader)
    assert str(refusal.value).startswith("/dev/shm: cannot be written (Read-only file system): ")
    assert "--workers 0" in str(refusal.value) and "\n" not in str(refusal.value)
    gc.collect()
    assert unraisable == []
