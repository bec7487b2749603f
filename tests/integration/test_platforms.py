"""macOS and Windows, as far as cnnpar's own code can tell, on this Linux machine: tests/simulated_os/sitecustomize.py
takes away what those systems lack (POSIX-only modules, functions and signals; /proc, /sys and /dev/shm) and makes
multiprocessing spawn. cnnpar is developed and tested on Linux; learners run its CPU commands on their laptops."""

from __future__ import annotations

import csv
import json
import os
import sys

from tests.conftest import REPO, run_cli, run_cmd
from tests.datafiles import write_image_folder

SIMULATED_OS = REPO / "tests" / "simulated_os"


def simulated(which: str) -> dict[str, str]:
    return {"CNNPAR_SIMULATED_OS": which, "PYTHONPATH": f"{SIMULATED_OS}{os.pathsep}{REPO}"}


def _finished_run(tmp_path, done) -> dict:
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    (run,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["finished"] is True
    return summary


def test_a_windows_like_python_trains_the_digits_and_predicts_on_its_run(tmp_path):
    """Windows has no `resource` module, which report/meters.py imported at its top: `cnnpar train` stopped there
    with a ModuleNotFoundError before the first epoch, and `cnnpar predict` never had a run."""
    env = simulated("windows")
    gone = run_cmd([sys.executable, "-c", "import fcntl"], tmp_path, **env)
    assert "ModuleNotFoundError" in gone.stderr  # the simulation is in effect

    summary = _finished_run(tmp_path, run_cli(["train", "--epochs", "1"], tmp_path, timeout=120, **env))
    assert summary["peak_mem_kind"] == "process_peak_rss" and 50 < summary["peak_mem_mb"] < 20_000

    (run,) = (tmp_path / "runs").iterdir()
    done = run_cli(["predict", "--checkpoint", str(run), "--data", "digits"], tmp_path, timeout=120, **env)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(tmp_path / "predictions.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == 1797  # every built-in digit


def test_a_windows_like_python_prepares_a_folder_and_trains_from_it_with_a_worker(tmp_path):
    """prepare's decoding workers began with `signal.SIGKILL`, which Windows lacks: each worker failed in its
    initializer, and prepare blamed the out-of-memory killer."""
    env = simulated("windows")
    photos = write_image_folder(tmp_path / "photos", per_class=8)
    prepare = ["prepare", str(photos), "--out", "photos.cnnpar", "--short-side", "16", "--workers", "1"]
    done = run_cli(prepare, tmp_path, timeout=120, **env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "wrote photos.cnnpar: 16 images" in done.stdout + done.stderr
    train = ["train", "--data", "photos.cnnpar", "--epochs", "1", "--image-size", "16", "--workers", "1"]
    _finished_run(tmp_path, run_cli([*train, "--val-fraction", "0"], tmp_path, timeout=120, **env))


def test_a_macos_like_python_prepares_a_folder_and_trains_from_it_with_spawned_workers(tmp_path):
    """macOS: spawned workers, no os.sched_getaffinity, no /proc, /sys or /dev/shm folders (its memory and core
    counts come from psutil, its DataLoader batches through shm_open without a folder)."""
    env = simulated("macos")
    photos = write_image_folder(tmp_path / "photos", per_class=8)
    prepare = ["prepare", str(photos), "--out", "photos.cnnpar", "--short-side", "16", "--workers", "1"]
    done = run_cli(prepare, tmp_path, timeout=120, **env)
    assert done.returncode == 0, done.stderr[-3000:]
    train = ["train", "--data", "photos.cnnpar", "--epochs", "1", "--image-size", "16", "--workers", "1"]
    summary = _finished_run(tmp_path, run_cli([*train, "--val-fraction", "0"], tmp_path, timeout=120, **env))
    assert 50 < summary["peak_mem_mb"] < 20_000
