"""`cnnpar tune` end to end on the CPU: a real child per trial, the budget kept, a tuned.toml that
`cnnpar train` accepts. The search's logic is tested on a fake clock in tests/unit/test_tune.py."""

from __future__ import annotations

import csv
import time
import tomllib

import pytest

from cnnpar.cli import main
from cnnpar.config import from_dict
from tests.datafiles import write_first_batch_failures

pytestmark = pytest.mark.usefixtures("one_thread")


def test_tune_command_ends_within_its_budget_and_writes_a_config_train_accepts(cli, monkeypatch):
    """The tune is a subprocess: a command line's budget counts from its process's start, interpreter and imports
    included (cli.budget_start), which `main` called in this process does not."""
    out = cli.cwd / "tuned.toml"
    start = time.monotonic()
    # the start may take the whole budget (a child imports torch: 5-15 s on a loaded 2-core machine);
    # later trials get 4 s each, so most are cut off: the run still ends on time with the best so far
    res = cli("tune", "--budget-s", "25", "--trial-s", "4", "--steps", "2", "--repeats", "1", "--batch-size", "32",
              "--data", "synthetic", "--image-shape", "1x8x8", "--synthetic-samples", "256", "--device", "cpu",
              "--out", str(out))  # fmt: skip
    wall = time.monotonic() - start
    assert res.returncode == 0, res.stderr
    # said before the config's path: tune measured no accuracy (its header says so too, naming a kept batch)
    assert "tune: speed only: tune measured images/s, not accuracy" in res.stdout
    assert "cnnpar: note: --repeats 1: each trial is one measurement, with no noise measured" in res.stderr
    assert wall <= 25 * 1.1 + 1  # + 1: the test's own clock starts before the interpreter does
    rows = list(csv.DictReader((cli.cwd / "tuned.csv").open()))
    assert rows[0]["status"] == "start" and float(rows[0]["images_per_s"]) > 0
    # --repeats 1 reached the trial: its one timed epoch is its median, slowest and fastest alike
    assert rows[0]["images_per_s"] == rows[0]["images_per_s_min"] == rows[0]["images_per_s_max"]
    # "agrees" / "unsteady": the check, the best config measured again, where time was left for it
    assert {r["status"] for r in rows[1:]} <= {"kept", "ok", "failed", "cut off", "skipped", "agrees", "unsteady"}
    cfg = from_dict(tomllib.loads(out.read_text()))  # a valid config tree, every field checked
    assert cfg.model.name == "cnn3" and cfg.speed.precision != "auto"  # resolved, as the trial ran
    monkeypatch.chdir(cli.cwd)  # the train, by `main` here: whether it accepts the file needs no process of its own
    assert main(["train", "--config", str(out), "--epochs", "1", "--max-steps", "2", "--no-progress"]) == 0


@pytest.mark.parametrize("case", ["one_image", "corrupt_images"])
def test_tune_on_data_that_fails_at_the_first_batch_stops_with_its_error_and_writes_nothing(
    tmp_path, monkeypatch, capsys, case
):
    """It exited 1 with a tuned.csv holding the failed start alone and, for images a DataLoader worker failed to
    decode, "DataError: Caught DataError in DataLoader worker process 0." in place of the file's name. (The tune runs
    by `main` here; its start trial is still a child process of its own.)"""
    data, error = write_first_batch_failures(tmp_path / "in")[case]
    out = tmp_path / "out" / "tuned.toml"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # for its trial's child, as conftest.cli_env gives a CLI subprocess
    capsys.readouterr()
    rc = main(["tune", "--budget-s", "60", "--steps", "2", "--repeats", "2", "--batch-size", "4", "--workers", "1",
               "--data", str(data), "--device", "cpu", "--out", str(out)])  # fmt: skip
    stderr = capsys.readouterr().err
    assert rc == 2, stderr
    err = stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"cnnpar: error: {error}"), err
    assert not (tmp_path / "out").exists()  # no trials file, nor the folder made for it
