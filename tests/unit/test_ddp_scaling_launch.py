"""ddp_scaling's torchrun launch past --launch-timeout: one line, and no worker left running."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cnnpar.bench import ddp_scaling
from tests.unit.test_process_tree import gone_soon, launcher_of_a_new_session_child, running_with


def test_a_launch_past_its_timeout_ends_in_one_line_with_its_workers_stopped(tmp_path, monkeypatch):
    """It ended in a raw TimeoutExpired traceback, and a `killpg` of torchrun's group left its workers (each in a
    session of its own) measuring on. The fake torchrun's child stands for such a worker."""
    marker = f"ddp-scaling-worker-{tmp_path.name}"
    script = launcher_of_a_new_session_child(marker)
    args = ddp_scaling.parse_args(["--device", "cpu", "--launch-timeout", "2"])
    real = subprocess.Popen
    monkeypatch.setattr(ddp_scaling.subprocess, "Popen", lambda cmd, **kw: real([sys.executable, "-c", script], **kw))
    try:
        with pytest.raises(SystemExit) as stopped:
            ddp_scaling.launch(args, 2, 1, tmp_path / "world2.json")
        assert stopped.value.code == "ddp_scaling: world size 2 timed out after 2 s: stopped with its processes"
        assert gone_soon(marker), "torchrun's worker in a session of its own outlived the timeout"
    finally:
        for p in running_with(marker):
            p.kill()


def test_the_two_process_target_is_judged_on_gpus_only():
    """On 2 shared CPU cores the benchmark printed "1.236x of 1, misses the 1.97x target": a target for two GPUs
    over NCCL, which gloo processes sharing a CPU cannot reach."""
    cpu = ddp_scaling.two_process_line(1.236, "cpu", "Intel(R) Xeon(R) Processor")
    assert cpu == "2 processes: 1.236x of 1 (Intel(R) Xeon(R) Processor; the 1.97x target is for 2 GPUs)"
    assert "misses" not in cpu and "meets" not in cpu
    assert ddp_scaling.two_process_line(1.90, "cuda", "NVIDIA H200") == (
        "2 processes: 1.900x of 1, misses the 1.97x target (NVIDIA H200)"
    )
    assert "meets the 1.97x target" in ddp_scaling.two_process_line(1.98, "cuda", "NVIDIA H200")
