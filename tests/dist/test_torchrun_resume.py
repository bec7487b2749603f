"""Resuming under torchrun on 2 gloo ranks is bit-identical to an uninterrupted run (the one-process
case and its helpers: tests/integration/test_resume_rng.py)."""

from __future__ import annotations

import pytest

from tests.conftest import run_cmd, torchrun_cmd
from tests.integration.test_resume_rng import TRAIN, assert_identical, explain


@pytest.mark.slow  # over 20 s on 2 CPU cores (CI durations): `-m 'not slow'` leaves it out
def test_two_gloo_ranks_restarted_after_a_kill_are_bit_identical(tmp_path):
    """torchrun restarts the group after rank 1 SIGKILLs itself in epoch 3 (engine/fault.py)."""
    launch = [*torchrun_cmd(2, "--standalone", "--max-restarts=1"), "-m", "cnnpar"]
    straight = run_cmd([*launch, *TRAIN, "--name", "straight"], tmp_path)
    assert straight.returncode == 0, explain(straight)
    restarted = run_cmd([*launch, *TRAIN, "--name", "k"], tmp_path, CNNPAR_FAULT_KILL_AT_EPOCH="3")
    assert restarted.returncode == 0, explain(restarted)
    assert "after epoch 2" in restarted.stdout, explain(restarted)
    assert_identical(tmp_path / "runs" / "straight", tmp_path / "runs" / "k")
