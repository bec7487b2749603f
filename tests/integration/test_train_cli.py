"""`cnnpar train` end to end in a subprocess: accuracy on the built-in digits, the run folder, and
re-running the stored config.toml."""

from __future__ import annotations

import json
import math

from cnnpar.config import load_toml
from cnnpar.presets import with_overrides
from cnnpar.report.files import read_csv


def test_train_on_builtin_digits_reaches_90_percent_and_keeps_its_results(cli):
    p = cli("train", "--epochs", "3", "--name", "digits")
    assert p.returncode == 0, p.stderr
    run = cli.cwd / "runs" / "digits"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["best_val_acc"] >= 0.90, summary
    for key in ("images_per_s", "train_s", "peak_mem_mb", "device", "torch", "git_rev"):
        assert summary[key] not in (None, ""), key
    rows = read_csv(run / "metrics.csv")
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3]
    assert max(float(r["val_acc"]) for r in rows) == summary["best_val_acc"]
    assert all(math.isfinite(float(r["train_loss"])) and float(r["images_per_s"]) > 0 for r in rows)
    assert (run / "ckpt" / "last.pt").is_file() and (run / "config.toml").is_file()
    # per-epoch console lines: loss, accuracy, images/s and the data-wait share
    epoch_lines = [ln for ln in p.stdout.splitlines() if ln.startswith("epoch ")]
    assert len(epoch_lines) == 3 and all("img/s" in ln and "data wait" in ln for ln in epoch_lines)
    assert "epoch 1/3" in p.stderr  # the progress bar (tqdm writes to stderr)

    # The stored config re-runs: same settings, only what the command line overrides differs.
    again = cli("train", "--config", "runs/digits/config.toml", "--name", "again", "--epochs", "1", "--no-progress")
    assert again.returncode == 0, again.stderr
    first = load_toml(run / "config.toml")
    second = load_toml(cli.cwd / "runs" / "again" / "config.toml")
    assert second == with_overrides(first, run={"name": "again", "epochs": 1, "progress": False})
    assert first.speed.device == "cpu"  # resolved, not "auto"
    assert first.speed.precision in ("fp32", "bf16") and first.speed.channels_last == "on"
