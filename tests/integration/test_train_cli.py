"""`cnnpar train` end to end (in-process through `cli.main`, and through a pipe in a subprocess): accuracy on the
built-in digits, the run folder, and re-running the stored config.toml."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys

import pytest

from cnnpar.cli import main
from cnnpar.config import load_toml
from cnnpar.presets import with_overrides
from cnnpar.report.files import read_csv
from tests.conftest import cli_env

pytestmark = pytest.mark.usefixtures("one_thread")


def test_train_on_builtin_digits_reaches_90_percent_and_keeps_its_results(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the default --out-dir, runs/, and the relative --config below
    assert main(["train", "--epochs", "3", "--name", "digits"]) == 0
    out, err = capsys.readouterr()
    run = tmp_path / "runs" / "digits"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["best_val_acc"] >= 0.90, summary
    for key in ("images_per_s", "train_s", "peak_mem_mb", "device", "torch", "git_rev"):
        assert summary[key] not in (None, ""), key
    rows = read_csv(run / "metrics.csv")
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3]
    # on the CPU the memory figure is the process's resident memory, and the files say so
    assert summary["peak_mem_kind"] == "process_peak_rss"
    assert {r["peak_mem_kind"] for r in rows} == {"process_peak_rss"}
    assert "lr 0.002 (not scaled with the world size: --lr-scaling none)" in out
    assert max(float(r["val_acc"]) for r in rows) == summary["best_val_acc"]
    assert all(math.isfinite(float(r["train_loss"])) and float(r["images_per_s"]) > 0 for r in rows)
    assert (run / "ckpt" / "last.pt").is_file() and (run / "config.toml").is_file()
    # per-epoch console lines: loss, accuracy, images/s and the data-wait share
    epoch_lines = [ln for ln in out.splitlines() if ln.startswith("epoch ")]
    assert len(epoch_lines) == 3 and all("img/s" in ln and "data wait" in ln for ln in epoch_lines)
    assert "it/s]" not in err  # stderr no terminal: no progress bar, only the epoch lines
    # the whole loop's rate, evaluations and checkpoints included: 22 full batches of 64 an epoch (drop_last)
    assert summary["images_trained"] == 3 * 22 * 64
    overall = summary["images_per_s_with_eval"]
    assert overall == summary["images_trained"] / summary["train_s"] and overall < max(
        float(r["images_per_s"]) for r in rows
    )
    done = [ln for ln in out.splitlines() if ln.startswith("done:")]
    assert len(done) == 1 and f"4,224 images trained in {summary['train_s']:.1f} s" in done[0], done
    # where the loop's time beyond the epochs went: each epoch's evaluation and checkpoint, timed and summed
    assert all("(eval " in ln and " data wait, checkpoint " in ln for ln in epoch_lines), epoch_lines
    assert summary["epochs_s"] == sum(float(r["epoch_s"]) for r in rows)
    assert 0 < summary["eval_s"] and 0 < summary["checkpoint_s"]
    assert summary["epochs_s"] + summary["eval_s"] + summary["checkpoint_s"] <= summary["train_s"]
    assert all(float(r["eval_s"]) > 0 for r in rows) and "checkpoint_s" not in rows[0]  # written before it
    # the evaluation's own data wait, a part of its time, on the line and in the files
    assert all(0 <= float(r["eval_wait_s"]) <= float(r["eval_s"]) for r in rows)
    assert math.isclose(summary["eval_wait_s"], sum(float(r["eval_wait_s"]) for r in rows), rel_tol=1e-6)
    for ln, r in zip(epoch_lines, rows):
        assert f"(eval {float(r['eval_s']):.2f} s incl. {float(r['eval_wait_s']):.2f} s data wait, checkpoint" in ln, ln
    assert f"evaluations {summary['eval_s']:.1f} s, checkpoints {summary['checkpoint_s']:.1f} s" in done[0], done

    # The stored config re-runs: same settings, only what the command line overrides differs (--max-steps 2: the
    # config is what is checked, not a second epoch's training).
    again = ["--name", "again", "--epochs", "1", "--max-steps", "2", "--no-progress"]
    assert main(["train", "--config", "runs/digits/config.toml", *again]) == 0
    first = load_toml(run / "config.toml")
    second = load_toml(tmp_path / "runs" / "again" / "config.toml")
    assert second == with_overrides(first, run={"name": "again", "epochs": 1, "max_steps": 2, "progress": False})
    assert first.speed.device == "cpu"  # resolved, not "auto"
    assert first.speed.precision in ("fp32", "bf16") and first.speed.channels_last == "on"
    assert_nothing_left_auto(first)
    text = (run / "config.toml").read_text()
    assert "# requested: run.batch_size = auto" in text and "# requested: data.workers = auto" in text
    assert first.run.batch_size == 64 and first.data.image_size == 16 and first.data.num_classes == 10
    # the start of the run says what it trains on
    assert "data: input 1x16x16, train 1,438, validation 359: a seeded 20% hold-out" in out
    assert "classes: 10 (labels' max + 1)" in out and "batch 64/process" in out


def assert_nothing_left_auto(cfg) -> None:
    """Every field whose default is "auto" (or 0 meaning auto) holds what the run resolved it to."""
    from dataclasses import fields

    from cnnpar.config import SECTIONS, Config

    for sec in SECTIONS:
        for f in fields(getattr(Config(), sec)):
            value = getattr(getattr(cfg, sec), f.name)
            assert value != "auto", f"{sec}.{f.name}"
            if f.metadata.get("auto_zero"):
                assert value != 0, f"{sec}.{f.name}"


def test_a_piped_log_gets_plain_lines_and_a_terminal_gets_the_bar(monkeypatch, tmp_path):
    # a subprocess: what a real pipe on its file descriptors receives. Bytes, not text: text mode would turn tqdm's
    # \r into \n and hide what a log file receives. --max-steps 3: a bar would be drawn from the first step
    cmd = [sys.executable, "-m", "cnnpar", "train", "--epochs", "1", "--max-steps", "3", "--name", "piped"]
    p = subprocess.run(cmd, cwd=tmp_path, env=cli_env(), capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    assert b"\r" not in p.stdout and b"\r" not in p.stderr and b"it/s]" not in p.stderr
    epochs = [ln for ln in p.stdout.decode().splitlines() if ln.startswith("epoch ")]
    assert len(epochs) == 1 and epochs[0].startswith("epoch 1/1  train loss")

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    assert main(["train", "--epochs", "1", "--max-steps", "3", "--out-dir", str(tmp_path / "o"), "--name", "tty"]) == 0
    assert "\repoch 1/1:" in term.getvalue()  # tqdm redraws in place on a terminal


def test_a_run_without_a_validation_set_reports_no_evaluation_time(tmp_path, capsys):
    args = ["train", "--device", "cpu", "--no-progress", "--batch-size", "32", "--epochs", "2", "--max-steps", "2"]
    assert main([*args, "--val-fraction", "0", "--out-dir", str(tmp_path), "--name", "noval"]) == 0
    out = capsys.readouterr().out
    epoch_lines = [ln for ln in out.splitlines() if ln.startswith("epoch ")]
    assert len(epoch_lines) == 2 and all("(checkpoint " in ln and "eval " not in ln for ln in epoch_lines), out
    summary = json.loads((tmp_path / "noval" / "summary.json").read_text())
    assert summary["eval_s"] == 0 and summary["checkpoint_s"] > 0
    assert [r["eval_s"] for r in read_csv(tmp_path / "noval" / "metrics.csv")] == ["", ""]
    assert summary["eval_wait_s"] == 0
    assert "evaluations 0.0 s" in out


def test_a_hold_out_that_leaves_nothing_to_train_is_one_line_and_no_run_folder(tmp_path, capsys):
    args = ["train", "--device", "cpu", "--no-progress", "--val-fraction", "0.9999", "--out-dir", str(tmp_path)]
    assert main([*args, "--name", "empty"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--val-fraction 0.9999 of 1797 labelled image(s) holds out 1797, leaving none to train on" in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "empty").exists()


def test_a_runs_config_given_with_other_data_finds_the_new_datas_format_size_and_classes(tmp_path):
    """The stored config.toml holds what the first run resolved from its digits (format digits, 8 px, 10 classes):
    with another --data those go back to what the user asked for (auto), not imposed on the new data."""
    common = ["--device", "cpu", "--no-progress", "--epochs", "1", "--max-steps", "2", "--out-dir", str(tmp_path)]
    assert main(["train", *common, "--name", "first"]) == 0
    rows = ["label," + ",".join(f"pixel{i}" for i in range(100))]
    rows += [f"{i % 3}," + ",".join(str((i * 7 + j) % 256) for j in range(100)) for i in range(60)]
    (tmp_path / "small.csv").write_text("\n".join(rows) + "\n")
    again = ["train", *common, "--config", str(tmp_path / "first" / "config.toml"), "--name", "second"]
    assert main([*again, "--data", str(tmp_path / "small.csv")]) == 0
    second = load_toml(tmp_path / "second" / "config.toml").data
    assert (second.format, second.image_size, second.num_classes) == ("csv", 10, 3)


def test_the_last_line_says_the_checkpoint_holds_the_last_epoch_when_the_best_came_first(tmp_path, monkeypatch, capsys):
    """ "best val acc 11.14%" headed a run whose only checkpoint (epoch 6) predicted 8.36%, and the line did not say
    so; the best epoch's weights are now in ckpt/best.pt, and the line names the file (or says they were not kept)."""
    from cnnpar.cli import main
    from cnnpar.engine.trainer import Trainer, TrainResult

    def fit(self, kept=4):
        summary = {"best_val_acc": 0.1114, "best_epoch": 4, "epochs": 6, "final_val_acc": 0.0836}
        return TrainResult(tmp_path / "runs" / "b", [], {**summary, "best_ckpt_epoch": kept})

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(Trainer, "fit", fit)
    assert main(["train", "--device", "cpu", "--max-steps", "1", "--name", "b", "--no-progress"]) == 0
    done = capsys.readouterr().out.splitlines()[-1]
    assert done.startswith(
        "done: best val acc 11.14% at epoch 4, its weights in ckpt/best.pt; ckpt/last.pt holds the last epoch's "
        "weights, val acc 8.36% | "
    ), done
    for kept, said in ((3, "ckpt/best.pt holds epoch 3"), (None, "ckpt/best.pt holds none")):
        monkeypatch.setattr(Trainer, "fit", lambda self, k=kept: fit(self, k))
        assert main(["train", "--device", "cpu", "--max-steps", "1", "--name", f"k{kept}", "--no-progress"]) == 0
        done = capsys.readouterr().out.splitlines()[-1]
        assert f"at epoch 4, its weights not kept ({said}); ckpt/last.pt holds" in done, done
    monkeypatch.setattr(Trainer, "fit", lambda self: TrainResult(tmp_path, [], {**fit(self).summary, "best_epoch": 6}))
    assert main(["train", "--device", "cpu", "--max-steps", "1", "--name", "c", "--no-progress"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("done: best val acc 11.14% | run folder")


def test_label_smoothing_says_the_train_loss_is_smoothed_and_the_val_loss_plain(tmp_path, monkeypatch, capsys):
    """Under --label-smoothing 0.1 the train loss cannot go below 0.50 with 10 classes, while the val loss is plain
    cross-entropy: the two columns, both named "loss", read as comparable."""
    from cnnpar.cli import main

    monkeypatch.chdir(tmp_path)
    args = ["train", "--device", "cpu", "--max-steps", "1", "--epochs", "1", "--no-progress", "--no-tensorboard"]
    assert main([*args, "--label-smoothing", "0.1", "--name", "s"]) == 0
    assert (
        "loss: train loss is the label-smoothed cross-entropy (--label-smoothing 0.1; 0.50 at best with 10 classes, "
        "even when every prediction is right), val loss the plain cross-entropy"
    ) in capsys.readouterr().out
    assert main([*args, "--name", "p"]) == 0
    assert "label-smoothed" not in capsys.readouterr().out


def test_fp16_on_the_cpu_warns_that_it_is_slow_and_bf16_or_fp32_do_not(tmp_path, monkeypatch, capsys):
    """fp16 autocast on the CPU has no fast kernels: the digits' cnn3 trained at 30 img/s against 575 in fp32, with no
    word of why."""
    from cnnpar.cli import main

    monkeypatch.chdir(tmp_path)
    args = ["train", "--device", "cpu", "--max-steps", "1", "--epochs", "1", "--no-progress", "--no-tensorboard"]
    for precision, warned in (("fp16", True), ("fp32", False)):
        assert main([*args, "--precision", precision, "--name", precision]) == 0
        out = capsys.readouterr().out
        assert ("warning: --precision fp16 on the CPU runs many times slower than fp32" in out) is warned, out


def test_eval_every_validates_every_nth_epoch_and_the_last(tmp_path):
    """--eval-every 2 over 3 epochs: epoch 1 trains unvalidated (empty val columns in metrics.csv), epochs 2 and 3
    (the last, whatever N says) are validated, and the best checkpoint comes from those."""
    args = ["train", "--data", "synthetic", "--synthetic-samples", "40", "--batch-size", "8", "--epochs", "3"]
    args += ["--max-steps", "1", "--no-progress", "--no-tensorboard", "--out-dir", str(tmp_path), "--name", "e"]
    assert main([*args, "--eval-every", "2"]) == 0
    rows = read_csv(tmp_path / "e" / "metrics.csv")
    assert [r["epoch"] for r in rows] == ["1", "2", "3"]
    assert [r["val_acc"] != "" for r in rows] == [False, True, True]
    assert load_toml(tmp_path / "e" / "config.toml").run.eval_every == 2
