"""A run killed with SIGKILL after its first checkpoint continues with --resume and loses no epoch."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from cnnpar.engine.checkpoint import checkpoint_epoch
from cnnpar.report.files import read_csv
from tests.conftest import cli_env, main_in

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    """`cnnpar ARGS` called in-process (cli.main, as a notebook calls it) in a fresh working folder: its exit code
    and what it printed, as a completed subprocess gives them. (Named as conftest's subprocess `cli`, which it
    replaces in this module: none of these runs needs a process of its own.)"""

    def _run(*args: str) -> subprocess.CompletedProcess:
        return main_in(tmp_path, monkeypatch, capsys, args)

    _run.cwd = tmp_path
    return _run


EPOCHS = 4
# Short epochs of 32 px digits still take far longer than the 10 ms polling below, so the kill
# lands while later epochs are still to come.
ARGS = ["train", "--epochs", str(EPOCHS), "--max-steps", "6", "--image-size", "32", "--no-progress", "--name", "killed"]


def test_sigkill_after_first_checkpoint_then_resume_finishes_every_epoch_once(cli):
    # the killed run is a process of its own (SIGKILL); the resume runs in this one
    run = cli.cwd / "runs" / "killed"
    ckpt = run / "ckpt" / "last.pt"
    proc = subprocess.Popen(
        [sys.executable, "-m", "cnnpar", *ARGS],
        cwd=cli.cwd,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not ckpt.exists():
            assert proc.poll() is None, f"the run ended before its first checkpoint:\n{proc.stdout.read()}"
            assert time.monotonic() < deadline, "no checkpoint within 240 s"
            time.sleep(0.01)
        proc.kill()  # SIGKILL: no handler, no clean-up, as when a machine dies
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -9
    summary = run / "summary.json"  # written at each epoch's end, unfinished until the last
    assert not summary.exists() or not json.loads(summary.read_text())["finished"], "the kill proved nothing"
    # the checkpoint's epochs: metrics.csv is written after it, so a kill just after the checkpoint leaves it behind
    done_before = checkpoint_epoch(run)
    assert 1 <= done_before < EPOCHS

    p = cli(*ARGS, "--resume", "runs/killed")
    assert p.returncode == 0, p.stderr
    assert f"resumed from runs/killed/ckpt/last.pt after epoch {done_before}" in p.stdout
    epochs = [int(r["epoch"]) for r in read_csv(run / "metrics.csv")]
    assert epochs == list(range(1, EPOCHS + 1))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["epochs"] == EPOCHS and summary["best_val_acc"] > 0.5  # it kept learning, not restarted


def test_resume_alone_continues_the_runs_own_model_and_data(cli):
    """`--resume RUN` with no other flags trains what the run trained (its stored config.toml),
    not the defaults: here synthetic data, not the built-in digits of the same shape."""
    first = cli(
        "train",
        "--data",
        "synthetic",
        "--synthetic-samples",
        "256",
        "--image-shape",
        "1x16x16",
        "--epochs",
        "1",
        "--name",
        "r1",
        "--no-progress",
    )
    assert first.returncode == 0, first.stderr
    again = cli("train", "--resume", "runs/r1", "--epochs", "2", "--no-progress")
    assert again.returncode == 0, again.stderr
    assert "resumed from" in again.stdout
    summary = json.loads((cli.cwd / "runs" / "r1" / "summary.json").read_text())
    assert summary["data"] == "synthetic 1x16x16" and summary["epochs"] == 2
    # the time, image counts and images/s are the resumed attempt's, and say so
    assert summary["attempt_epochs"] == [2, 2] and "images trained (epoch 2, resumed) in" in again.stdout
    epoch_2 = read_csv(cli.cwd / "runs" / "r1" / "metrics.csv")[1]
    assert summary["images_per_s_epochs"] == [2, 2]
    assert summary["images_per_s"] == pytest.approx(float(epoch_2["images_per_s"]), rel=1e-4)


SYNTH = ["--data", "synthetic", "--synthetic-samples", "256", "--image-shape", "1x16x16", "--no-progress"]


def test_resume_auto_uses_the_runs_stored_config_and_never_mixes_data_sets(cli):
    """`--resume auto --name X` continues X's own data like `--resume runs/X`, also when X was
    killed before its first checkpoint; another data set is refused in X's folder."""
    run = cli.cwd / "runs" / "x"
    first = cli("train", *SYNTH, "--epochs", "1", "--name", "x")
    assert first.returncode == 0, first.stderr
    again = cli("train", "--resume", "auto", "--name", "x", "--epochs", "2", "--no-progress")
    assert again.returncode == 0, again.stderr
    assert "resumed from" in again.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["data"] == "synthetic 1x16x16" and summary["epochs"] == 2

    # killed during epoch 1: a config.toml but no checkpoint yet
    for f in (run / "ckpt").iterdir():
        f.unlink()
    (run / "summary.json").unlink()
    restart = cli("train", "--resume", "auto", "--name", "x", "--epochs", "1", "--no-progress")
    assert restart.returncode == 0, restart.stderr
    assert json.loads((run / "summary.json").read_text())["data"] == "synthetic 1x16x16"

    stored = (run / "config.toml").read_text()
    other = cli("train", "--data", "digits", "--resume", "auto", "--name", "x", "--epochs", "1", "--no-progress")
    assert other.returncode == 2
    assert "holds a run on --data synthetic" in other.stderr and "Traceback" not in other.stderr
    assert (run / "config.toml").read_text() == stored


def test_a_resumed_runs_config_toml_re_runs_as_a_new_run_and_leaves_that_run_alone(cli):
    """A resumed run's config.toml holds `resume = "runs/r4"`: `--config` of it re-runs its settings as a new
    run (r5, or a new default name), not "resumed from runs/r4 ... nothing to do" with r5 written into r4."""
    runs = cli.cwd / "runs"
    assert cli("train", *SYNTH, "--epochs", "1", "--name", "r4").returncode == 0
    again = cli("train", "--resume", "runs/r4", "--epochs", "2", "--no-progress")
    assert again.returncode == 0, again.stderr
    record = runs / "r4" / "config.toml"
    assert 'resume = "runs/r4"' in record.read_text()  # what makes the re-run below a test
    before = record.read_bytes()

    p = cli("train", "--config", "runs/r4/config.toml", "--name", "r5", "--no-progress")
    assert p.returncode == 0, p.stderr
    assert "resumed from" not in p.stdout and "nothing to do" not in p.stdout, p.stdout
    assert json.loads((runs / "r5" / "summary.json").read_text())["epochs"] == 2  # r4's settings, trained anew
    assert record.read_bytes() == before

    p = cli("train", "--config", "runs/r4/config.toml", "--no-progress")
    assert p.returncode == 0, p.stderr
    assert "resumed from" not in p.stdout and "runs/r4" not in p.stdout, p.stdout
    assert len([d for d in runs.iterdir() if d.is_dir()]) == 3  # r4, r5 and one of a new default name
    assert record.read_bytes() == before
