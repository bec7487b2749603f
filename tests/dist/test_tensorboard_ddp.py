"""Two gloo ranks under torchrun: rank 0 alone writes TensorBoard scalars, and after rank 1 is
killed in epoch 2 and torchrun restarts the group, every curve has one value per step, equal to
metrics.csv (the one-process checks: tests/integration/test_tensorboard.py)."""

from __future__ import annotations

from tests.conftest import run_cmd, torchrun_cmd
from tests.dist.test_torchrun_cli import TRAIN, explain, only_run_folder
from tests.integration.test_tensorboard import assert_curves_match_metrics


def test_rank_0_alone_writes_and_a_restarted_group_continues_the_curves(tmp_path):
    proc = run_cmd(
        [*torchrun_cmd(2, "--standalone", "--max-restarts=1"), *TRAIN, "--epochs", "2", "--max-steps", "3"],
        tmp_path,
        CNNPAR_FAULT_KILL_AT_EPOCH="2",  # rank 1 SIGKILLs itself half-way through epoch 2 (engine/fault.py)
    )
    assert proc.returncode == 0, explain(proc)
    assert "after epoch 1" in proc.stdout, explain(proc)
    run = only_run_folder(tmp_path)
    # one file per attempt, both rank 0's: a rank 1 writing would add files and a second value per step
    assert len(list(run.glob("events.out.tfevents.*"))) == 2
    scalars = assert_curves_match_metrics(run, steps_per_epoch=3)
    assert [s for s, _ in scalars["train/loss_recent"]] == [1, 4]
