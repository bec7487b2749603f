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
