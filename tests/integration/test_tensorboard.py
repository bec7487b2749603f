"""`cnnpar train` writes TensorBoard scalars into its run folder: read back with TensorBoard's own
reader, every curve equals metrics.csv (to float32, TensorBoard's scalar type), a run that failed in
epoch 2 and was resumed has one value per step per tag, and without tensorboard training goes on.
(Two gloo ranks: tests/dist/test_tensorboard_ddp.py.)"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest

from cnnpar.cli import main
from cnnpar.engine import fault
from cnnpar.engine.trainer import METRIC_COLUMNS
from cnnpar.report.files import read_csv

pytestmark = pytest.mark.usefixtures("one_thread")

# metrics.csv column -> the tag its curve has (written out here, not taken from the module under test)
COLUMN_TAG = {
    "epoch": "train/epoch",
    "train_loss": "train/loss",
    "train_acc": "train/accuracy",
    "val_loss": "val/loss",
    "val_acc": "val/accuracy",
    "lr": "train/lr",
    "epoch_s": "speed/epoch_s",
    "eval_s": "speed/eval_s",
    "eval_wait_s": "speed/eval_wait_s",
    "images_per_s": "speed/images_per_s",
    "data_wait_share": "speed/data_wait_share",
    "peak_mem_mb": "memory/process_peak_rss_mb",  # on the CPU the figure is the process's peak RSS
    "skipped_steps": "train/skipped_steps",
}
TELEMETRY_TAGS = {"host/cpu_pct", "host/mem_used_mb"}  # no GPU here: NVML's tags are absent
DIGITS = ["train", "--device", "cpu", "--no-progress", "--batch-size", "32"]


def read_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in a run folder as TensorBoard's own reader loads it: tag -> [(step, value)].

    The reader loads TensorFlow when it is installed (the test extras install it), and TensorFlow
    loaded before triton crashes this process as soon as a later test builds an optimizer
    (tensorflow-cpu 2.21, triton 3.8). TensorBoard's own switch, a `tensorboard.compat.notf`
    module, makes it read with its TensorFlow-free stub instead.
    """
    sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})  # 0: every point, no sampling
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def f32(text: str) -> float:
    return float(np.float32(float(text)))


def assert_curves_match_metrics(run: Path, steps_per_epoch: int) -> dict[str, list[tuple[int, float]]]:
    """One value per step in every tag, and each metrics.csv column's curve equal to the column."""
    assert set(COLUMN_TAG) == set(METRIC_COLUMNS) - {"peak_mem_kind"}, "a metrics.csv column without a curve"
    scalars = read_scalars(run)
    for tag, points in scalars.items():
        steps = [s for s, _ in points]
        assert len(steps) == len(set(steps)), f"{tag}: a step written twice: {steps}"
    rows = read_csv(run / "metrics.csv")
    for col, tag in COLUMN_TAG.items():
        want = [(int(r["epoch"]) * steps_per_epoch, f32(r[col])) for r in rows if r[col] != ""]
        assert sorted(scalars.get(tag, [])) == want, tag
    extra = set(scalars) - set(COLUMN_TAG.values()) - TELEMETRY_TAGS - {"train/loss_recent"}
    assert not extra, f"tags nobody asked for: {extra}"
    return scalars


def test_every_curve_equals_metrics_csv_and_telemetry_has_one_point_per_step(tmp_path, capsys):
    # one optimizer step per epoch: the readout after it covers the whole epoch, so it equals train_loss
    rc = main([*DIGITS, "--epochs", "2", "--max-steps", "1", "--monitor", "--out-dir", str(tmp_path), "--name", "tb"])
    assert rc == 0
    run = tmp_path / "tb"
    assert f"tensorboard: event files in {run} (tensorboard --logdir {tmp_path})" in capsys.readouterr().out
    assert len(list(run.glob("events.out.tfevents.*"))) == 1
    scalars = assert_curves_match_metrics(run, steps_per_epoch=1)
    rows = read_csv(run / "metrics.csv")
    assert sorted(scalars["train/loss_recent"]) == [(int(r["epoch"]), f32(r["train_loss"])) for r in rows]

    # (a sample taken too soon after the one before has no CPU figure: the first, at least; telemetry.py)
    samples = [float(r["host_cpu_pct"]) for r in read_csv(run / "telemetry.csv") if r["host_cpu_pct"] != ""]
    assert set(scalars) >= TELEMETRY_TAGS
    points = scalars["host/cpu_pct"]
    assert 1 <= len(points) <= len(samples)  # each point the mean of the samples taken during its step
    assert all(0 <= s <= 2 and min(samples) - 1e-3 <= v <= max(samples) + 1e-3 for s, v in points)


def test_a_run_failed_in_epoch_2_and_resumed_has_one_value_per_step(tmp_path, monkeypatch, capsys):
    args = [*DIGITS, "--epochs", "3", "--max-steps", "4", "--monitor", "--out-dir", str(tmp_path), "--name", "r"]
    run = tmp_path / "r"
    monkeypatch.setenv(fault.RAISE_ENV, "2")  # raised half-way through epoch 2, after its first readout
    fault._plan.cache_clear()
    with pytest.raises(RuntimeError, match="injected fault"):
        main(args)
    monkeypatch.delenv(fault.RAISE_ENV)
    fault._plan.cache_clear()
    stale = read_scalars(run)
    assert [s for s, _ in stale["train/loss_recent"]] == [1, 5]  # step 5 is past the checkpoint (step 4)

    capsys.readouterr()
    assert main([*DIGITS, "--resume", str(run)]) == 0
    assert "an earlier attempt wrote past step 4 removed" in capsys.readouterr().out
    assert [r["epoch"] for r in read_csv(run / "metrics.csv")] == ["1", "2", "3"]
    scalars = assert_curves_match_metrics(run, steps_per_epoch=4)
    assert [s for s, _ in scalars["train/loss_recent"]] == [1, 5, 9]
    assert len(list(run.glob("events.out.tfevents.*"))) == 2  # one file per attempt
    assert set(scalars) >= TELEMETRY_TAGS


def test_without_tensorboard_training_works_and_says_how_to_get_it(tmp_path, monkeypatch, capsys):
    import cnnpar.report.tensorboard as tb

    monkeypatch.setattr(tb, "_protos", lambda: None)  # as if tensorboard were not installed
    assert main([*DIGITS, "--epochs", "1", "--max-steps", "1", "--out-dir", str(tmp_path), "--name", "no"]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("tensorboard:")]
    assert lines == [f'tensorboard: not installed, so no event files in {tmp_path / "no"} (pip install '
                     f'"cnnpar[tensorboard]", then tensorboard --logdir {tmp_path})']  # fmt: skip
    assert (tmp_path / "no" / "metrics.csv").is_file()
    assert not list((tmp_path / "no").glob("*tfevents*"))

    monkeypatch.undo()
    assert main([*DIGITS, "--epochs", "1", "--max-steps", "1", "--out-dir", str(tmp_path), "--name", "off",
                 "--no-tensorboard"]) == 0  # fmt: skip
    assert "tensorboard:" not in capsys.readouterr().out
    assert not list((tmp_path / "off").glob("*tfevents*"))


def test_a_resume_taking_other_steps_an_epoch_keeps_the_finished_epochs_points_and_goes_on_after_them(
    tmp_path, monkeypatch, capsys
):
    """Resumed with --max-steps 2, the run takes half the optimizer steps an epoch: the schedule's clock moves to
    this run's steps (2 epochs x 2), but the board's axis is the steps taken, so epochs 1-2 stay at steps 4 and 8
    (the cut there removes only what the failed epoch 3 wrote) and epoch 3 lands after them, at 8 + 2."""
    args = [*DIGITS, "--epochs", "3", "--max-steps", "4", "--out-dir", str(tmp_path), "--name", "r"]
    run = tmp_path / "r"
    monkeypatch.setenv(fault.RAISE_ENV, "3")
    fault._plan.cache_clear()
    with pytest.raises(RuntimeError, match="injected fault"):
        main(args)
    monkeypatch.delenv(fault.RAISE_ENV)
    fault._plan.cache_clear()
    assert [s for s, _ in read_scalars(run)["train/epoch"]] == [4, 8]
    capsys.readouterr()
    assert main([*DIGITS, "--resume", str(run), "--max-steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "this one takes 2" in out and "wrote past step 8 removed" in out
    scalars = read_scalars(run)
    assert scalars["train/epoch"] == [(4, 1.0), (8, 2.0), (10, 3.0)]
    assert [s for s, _ in scalars["val/accuracy"]] == [4, 8, 10]
