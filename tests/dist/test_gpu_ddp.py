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
