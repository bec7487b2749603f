"""A low open-files limit (ulimit -n): DataLoader workers hand each batch over as file descriptors."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.datafiles import write_image_folder

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    for c in range(4):
        (root / f"c{c}").mkdir()
        for i in range(60):
            pixels = rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / f"c{c}" / f"{i}.jpg", quality=85)
    return root


def cnnpar_under(args: list[str], soft: int, hard: int, timeout: int = 120) -> subprocess.CompletedProcess:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "cnnpar", *args]
    return subprocess.run(command, env=env, preexec_fn=limit, capture_output=True, text=True, timeout=timeout)


def train_under(photos: Path, out: Path, soft: int, hard: int) -> subprocess.CompletedProcess:
    args = ["train", "--data", str(photos), "--workers", "2", "--epochs", "1", "--batch-size", "8"]
    args += ["--image-size", "32", "--device", "cpu", "--out-dir", str(out), "--no-tensorboard"]
    return cnnpar_under(args, soft, hard)


def test_a_low_soft_limit_is_raised_to_the_hard_one(photos, tmp_path):
    # 32 open files stopped two workers' batches ("Too many open files") where the hard limit allowed thousands
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 256:
        pytest.skip(f"this host's hard open-files limit is {hard}")
    done = train_under(photos, tmp_path, 32, hard)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Too many open files" not in done.stderr


def test_a_low_hard_limit_ends_in_one_line(photos, tmp_path):
    done = train_under(photos, tmp_path, 32, 32)
    assert done.returncode == 2, done.stderr[-2000:]
    # Not checked: a DataLoader worker's exit may print multiprocessing's own traceback for its temporary folder
    # (util._remove_temp_dir: "Too many open files" in its rmtree), 1 run in 4 at 4f5a316 and in CI at a7460a5; the
    # limit is still out as the worker leaves. Every traceback but that one is cnnpar's to keep off the output.
    tracebacks = done.stderr.count("Traceback (most recent call last)")
    assert tracebacks == done.stderr.count("in _remove_temp_dir"), done.stderr[-2000:]
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("cnnpar: error: too many open files: this process may have 32 files open at once")
    assert "ulimit -n" in line and "--workers" in line


@pytest.mark.parametrize("limit", [14, 15])
def test_prepare_that_cannot_start_its_workers_ends_in_one_line(tmp_path, limit):
    # here the second worker's fork found no file left at these limits (at 16, ulimit -n 16 in a shell): prepare
    # printed its line, then waited for ever at exit on the first worker, which the failed start never stopped
    images = write_image_folder(tmp_path / "images", per_class=10)
    out = tmp_path / "out"
    out.mkdir()
    args = ["prepare", str(images), "--out", str(out / "x.cnnpar"), "--workers", "2"]
    done = cnnpar_under(args, limit, limit, timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        f"cnnpar: error: {images}: could not start 2 decoding processes (Too many open files): expected the system "
        "to allow them, or fewer --workers (--workers 1 decodes in this process)"
    ]
    assert not list(out.iterdir())  # no store, no partial file, no chunk file


def test_prepare_whose_worker_runs_out_of_open_files_says_so(tmp_path):
    # at 16 here the workers started and one ran out importing its decoder: prepare said "cannot write the store (Too
    # many open files at .../PIL/__init__.py): expected room for it and permission to write", a disk's reason
    images = write_image_folder(tmp_path / "images", per_class=10)
    out = tmp_path / "out"
    out.mkdir()
    done = cnnpar_under(["prepare", str(images), "--out", str(out / "x.cnnpar"), "--workers", "2"], 16, 16, timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert lines[0].startswith(f"cnnpar: error: {out / 'x.cnnpar'}: not written: the open-files limit ran out")
    assert "ulimit -n 65536" in lines[0] and "--workers 1" in lines[0]
    assert not list(out.iterdir())
