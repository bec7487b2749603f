"""DDP on two GPUs through NCCL (skipped without them): SyncBatchNorm and the debug switch."""

from __future__ import annotations

import json

import pytest
import torch

from cnnpar.report.files import read_csv
from tests.conftest import run_cmd, torchrun_cmd
from tests.dist.test_torchrun_cli import explain, only_run_folder

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices"),
]

GPU_TRAIN = ["-m", "cnnpar", "train", "--device", "cuda", "--data", "synthetic", "--image-shape", "3x32x32"]
GPU_TRAIN += ["--synthetic-samples", "2048", "--model", "resnet18", "--batch-size", "64", "--no-progress"]


def test_sync_batchnorm_trains_under_ddp_on_two_gpus(tmp_path):
    proc = run_cmd(
        [*torchrun_cmd(2, "--standalone"), *GPU_TRAIN, "--epochs", "2", "--sync-bn"], tmp_path, NCCL_NVLS_ENABLE="0"
    )
    assert proc.returncode == 0, explain(proc)
    assert "SyncBatchNorm" in proc.stdout and "2 process(es) on cuda" in proc.stdout
    run_dir = only_run_folder(tmp_path)
    assert [r["epoch"] for r in read_csv(run_dir / "metrics.csv")] == ["1", "2"]
    assert json.loads((run_dir / "summary.json").read_text())["world_size"] == 2


def test_ranks_that_disagree_stop_together_through_nccl(tmp_path):
    """The ranks' agreement check (engine/agreement.py), tested on gloo in test_rank_agreement.py, through NCCL:
    its all-reduce and broadcast run on CUDA tensors there."""
    from tests.dist.test_rank_agreement import CHECKS

    for rank in range(2):
        (tmp_path / f"n{rank}").mkdir()
    cmd = [*torchrun_cmd(2, "--standalone"), str(CHECKS), str(tmp_path)]
    proc = run_cmd(cmd, tmp_path, timeout=300, NCCL_NVLS_ENABLE="0", AGREEMENT_DEVICE="cuda")
    assert proc.returncode == 0, explain(proc)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for result in ranks:
        assert result["lr"]["rc"] == 2 and "rank 1's optim.lr (--lr) is 0.01" in result["lr"]["stderr"], result["lr"]
        assert result["first"]["rc"] == 0, result["first"]
        assert result["checkpoint"]["rc"] == 2 and "weights checksum" in result["checkpoint"]["stderr"]
        assert result["missing"]["rc"] == 2 and "cannot read it" in result["missing"]["stderr"], result["missing"]
        assert "Traceback" not in result["lr"]["stderr"] + result["checkpoint"]["stderr"] + result["missing"]["stderr"]


def test_a_rank_killed_mid_epoch_restarts_and_resumes_through_nccl(tmp_path):
    """torchrun --max-restarts after rank 1 SIGKILLs itself in epoch 2 (engine/fault.py): the restarted attempt
    (counted in torchrun's store) resumes after epoch 1 and trains the rest."""
    launch = [*torchrun_cmd(2, "--standalone", "--max-restarts=1"), *GPU_TRAIN, "--epochs", "3", "--name", "k"]
    proc = run_cmd(launch, tmp_path, timeout=300, NCCL_NVLS_ENABLE="0", CNNPAR_FAULT_KILL_AT_EPOCH="2")
    assert proc.returncode == 0, explain(proc)
    assert "after epoch 1" in proc.stdout, explain(proc)
    assert [r["epoch"] for r in read_csv(tmp_path / "runs" / "k" / "metrics.csv")] == ["1", "2", "3"]
