"""The small pieces of distributed state, without launching anything."""

from __future__ import annotations

import signal

import pytest
import torch

from cnnpar.config import Config, RunConfig
from cnnpar.dist import DistInfo, attempt_store, init_distributed, surplus_debug_worker
from cnnpar.engine import fault
from cnnpar.engine.rundir import default_name, restarts_cannot_find_run

CPU = torch.device("cpu")


@pytest.fixture
def torchrun_env(monkeypatch):
    """The variables torchrun gives a worker of a 2-process job, as rank 1."""
    for key in ("CNNPAR_DEBUG_SINGLE", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_MAX_RESTARTS", fault.KILL_ENV):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    fault._plan.cache_clear()
    yield monkeypatch
    fault._plan.cache_clear()


def test_debug_switch_retires_every_worker_but_rank_0(torchrun_env):
    assert not surplus_debug_worker()
    torchrun_env.setenv("CNNPAR_DEBUG_SINGLE", "1")
    assert surplus_debug_worker()
    torchrun_env.setenv("RANK", "0")
    assert not surplus_debug_worker()
    info = init_distributed("cpu")  # rank 0 under the switch: one process, no process group
    assert (info.rank, info.world_size, info.distributed) == (0, 1, False)


def test_a_restartable_job_without_a_stable_name_is_flagged(torchrun_env):
    cfg = Config()
    assert not restarts_cannot_find_run(cfg)  # no restarts allowed: nothing to find again
    torchrun_env.setenv("TORCHELASTIC_MAX_RESTARTS", "2")
    torchrun_env.setenv("TORCHELASTIC_RUN_ID", "none")  # multi-node launch without --rdzv-id
    assert restarts_cannot_find_run(cfg)
    assert not restarts_cannot_find_run(Config(run=RunConfig(name="mine")))
    torchrun_env.setenv("TORCHELASTIC_RUN_ID", "job42")
    assert not restarts_cannot_find_run(cfg)
    assert default_name(cfg) == "cnn3-job42"


def test_only_torchruns_shared_store_gets_per_attempt_keys(torchrun_env):
    torchrun_env.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    assert attempt_store(2, timeout=None) is None


def test_fault_hook_acts_only_on_the_last_rank_mid_epoch_of_the_first_attempt(torchrun_env):
    killed = []
    torchrun_env.setattr(fault.os, "kill", lambda pid, sig: killed.append(sig))
    torchrun_env.setenv(fault.KILL_ENV, "2")
    last, first = DistInfo(1, 1, 2, CPU), DistInfo(0, 0, 2, CPU)
    fault.maybe_inject_fault(1, 5, 10, last)  # another epoch
    fault.maybe_inject_fault(2, 4, 10, last)  # not half-way
    fault.maybe_inject_fault(2, 5, 10, first)  # not the last rank
    assert killed == []
    with pytest.raises(RuntimeError):  # the real SIGKILL would end the process here
        fault.maybe_inject_fault(2, 5, 10, last)
    assert killed == [signal.SIGKILL]
    fault.maybe_inject_fault(2, 5, 10, DistInfo(1, 1, 2, CPU, attempt=1))  # the restarted job runs clean
    assert killed == [signal.SIGKILL]
