"""Two gloo ranks under torchrun, rank 1 killed in epoch 2 and the group restarted by torchrun: the restarted group
resumes after epoch 1, rank 0 alone speaks and writes TensorBoard scalars, and every curve has one value per step,
equal to metrics.csv (the one-process checks: tests/integration/test_tensorboard.py).

One launch checks both the restart and the curves: each launch with a restart costs five interpreters' start-up."""

from __future__ import annotations

import json

from cnnpar.report.files import read_csv
from tests.conftest import run_cmd, torchrun_cmd
from tests.dist.test_torchrun_cli import TRAIN, explain, only_run_folder, worker_log
from tests.integration.test_tensorboard import assert_curves_match_metrics


def test_killed_worker_restarts_resumes_and_only_rank0_speaks_and_continues_the_curves(tmp_path):
    """Rank 1 SIGKILLs itself half-way through epoch 2 of the first attempt (engine/fault.py); torchrun restarts
    the group, which finds its run folder by the job id and resumes after epoch 1. Every epoch lands in metrics.csv
    exactly once, and every TensorBoard curve has one value per step."""
    logs = tmp_path / "logs"
    proc = run_cmd(
        [*torchrun_cmd(2, "--standalone", "--max-restarts=1", "--redirects=3", f"--log-dir={logs}"), *TRAIN]
        + ["--epochs", "3", "--max-steps", "3", "--lr-scaling", "linear"],
        tmp_path,
        CNNPAR_FAULT_KILL_AT_EPOCH="2",
    )
    assert proc.returncode == 0, explain(proc)
    run_dir = only_run_folder(tmp_path)
    assert [row["epoch"] for row in read_csv(run_dir / "metrics.csv")] == ["1", "2", "3"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["epochs"] == 3 and summary["world_size"] == 2

    first, second = worker_log(logs, 0, 0, "stdout"), worker_log(logs, 1, 0, "stdout")
    assert "epoch 1/3" in first and "epoch 2/3" not in first  # killed during epoch 2
    assert "resumed from" in second and "after epoch 1" in second
    assert "epoch 2/3" in second and "epoch 3/3" in second and "epoch 1/3 " not in second
    # the start-up banner: global batch and the lr scaling
    assert "batch 16/process x 2 process(es) x 1 accumulation = 32 per step" in first
    assert "lr 0.002 x 2 processes = 0.004 (--lr-scaling linear)" in first
    # rank 1 writes nothing to the terminal, in either attempt, unless it fails
    for attempt in (0, 1):
        assert worker_log(logs, attempt, 1, "stdout") == ""
    assert worker_log(logs, 1, 1, "stderr") == ""

    # one event file per attempt, both rank 0's: a rank 1 writing would add files and a second value per step
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 2
    scalars = assert_curves_match_metrics(run_dir, steps_per_epoch=3)
    # one loss readout per epoch (each epoch's first step): the killed attempt's epoch-2 readout cut, not doubled
    assert [s for s, _ in scalars["train/loss_recent"]] == [1, 4, 7]
