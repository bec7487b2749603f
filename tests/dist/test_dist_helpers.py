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


@pytest.fixture
def agent_store(torchrun_env):
    """A store where torchrun's agent serves it, with this process as a worker of a 2-process job that has not
    written its start yet: rank 1 by the variables (torchrun_env); set RANK for another."""
    from datetime import timedelta

    import torch.distributed as tdist

    from cnnpar import dist

    store = tdist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    torchrun_env.setenv("MASTER_ADDR", "127.0.0.1")
    torchrun_env.setenv("MASTER_PORT", str(store.port))
    torchrun_env.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    torchrun_env.setattr(dist, "_start_said", False)
    torchrun_env.setattr(dist, "_joined_attempt", None)
    yield store


def as_rank(monkeypatch, rank: int) -> None:
    """This process as another worker of the job, which has not joined yet."""
    from cnnpar import dist

    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("LOCAL_RANK", str(rank))
    monkeypatch.setattr(dist, "_start_said", False)
    monkeypatch.setattr(dist, "_joined_attempt", None)


def test_a_rank_whose_command_line_is_refused_stops_the_others_at_once(agent_store, torchrun_env):
    """Node 1's `--epochs abc`: argparse said so there, and node 0 waited silently for --timeout-s (600 s), then
    failed with a traceback about a "debug_single" store key (or ignored torchrun's SIGTERM in that wait)."""
    import time

    from cnnpar import cli, dist
    from cnnpar.errors import EXIT_ANOTHER_RANK_ENDED

    with pytest.raises(SystemExit) as ended:
        cli.main(["train", "--epochs", "abc"])
    assert ended.value.code == 2
    as_rank(torchrun_env, 0)
    start = time.monotonic()
    with pytest.raises(dist.JoinFailed) as stopped:
        dist.exchange_starts(False, 60)
    assert time.monotonic() - start < 5
    assert cli.another_rank_line(stopped.value, 0) == (
        "cnnpar: rank 0 stopped: rank(s) 1 of 2 ended before joining the job; the error is in that node's log",
        EXIT_ANOTHER_RANK_ENDED,
    )


def test_a_rank_failing_after_its_start_before_the_group_writes_its_error_but_not_one_caused_by_another(
    agent_store, torchrun_env
):
    """After the start exchange the others wait in init_process_group: the failing rank's own error is written where
    they look (dist.failed_before_the_group_key); a JoinFailed, which another rank caused, names nobody."""
    from cnnpar import dist
    from cnnpar.errors import EXIT_ANOTHER_RANK_ENDED, ConfigError

    torchrun_env.setattr(dist, "_start_said", True)
    torchrun_env.setattr(dist, "_group_formed", False)
    key = dist.failed_before_the_group_key(agent_store, 2, 1)
    dist.say_this_rank_ended_before_joining(dist.JoinFailed("rank(s) 0 of 2 did not join", EXIT_ANOTHER_RANK_ENDED))
    assert not agent_store.check([key])
    dist.say_this_rank_ended_before_joining(ConfigError("2 processes on this node but 1 CUDA device(s) visible"))
    assert agent_store.get(key).decode() == "1\n2 processes on this node but 1 CUDA device(s) visible"
    dist.say_this_rank_ended_before_joining(RuntimeError("CUDA error: busy\nmore"))
    assert agent_store.get(key).decode() == "1\nRuntimeError: CUDA error: busy"


def test_a_rank_that_never_joins_is_waited_for_aloud_then_named_with_the_timeout(agent_store, torchrun_env, capsys):
    from cnnpar import cli, dist
    from cnnpar.errors import EXIT_COLLECTIVE_TIMED_OUT

    as_rank(torchrun_env, 0)
    torchrun_env.setattr(dist, "JOIN_NOTE_AFTER_S", 0.3)
    with pytest.raises(dist.JoinFailed) as stopped:
        dist.exchange_starts(False, 2)
    assert capsys.readouterr().err == (
        "cnnpar: rank 0 waiting for rank(s) 1 of 2 to join the job (started by each node's torchrun); giving up "
        "after --timeout-s 2\n"
    )
    assert cli.another_rank_line(stopped.value, 0) == (
        "cnnpar: rank 0 stopped: rank(s) 1 of 2 did not join the job within --timeout-s 2: another node's launch did "
        "not start its worker, or it failed before joining (its error is in its node's log)",
        EXIT_COLLECTIVE_TIMED_OUT,
    )


def test_a_stop_noted_in_an_import_ends_the_wait_for_the_other_ranks(agent_store, torchrun_env):
    """A plain torchrun's SIGTERM, noted, not raised, by rank 0 inside an import as it started (errors.stop_on_signals):
    it waited here the whole --timeout-s for ranks the same SIGTERM had ended (torchrun's SIGKILL came first)."""
    import time

    from cnnpar import dist, errors

    as_rank(torchrun_env, 0)
    errors.note_stop(signal.SIGTERM)
    began = time.monotonic()
    with pytest.raises(errors.Terminated):
        dist.exchange_starts(False, 30)
    assert time.monotonic() - began < 20


BY_HAND = "torchrun sets them; by hand, set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in each process"


@pytest.mark.parametrize(
    ("env", "line"),
    [
        # a RANK left in the shell: one process trained at half the batch --nproc 2 asked for, without a word
        ({"RANK": "0"}, f"RANK=0 is set but WORLD_SIZE is not: {BY_HAND}; for one process, unset RANK"),
        ({"WORLD_SIZE": "2"}, f"WORLD_SIZE=2 is set but RANK is not: {BY_HAND}; for one process, unset WORLD_SIZE"),
        # torch's ValueError traceback
        ({"RANK": "0", "WORLD_SIZE": "abc"}, f"WORLD_SIZE='abc': expected a whole number >= 1 ({BY_HAND})"),
        (
            {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "x"},
            f"[rank 0] LOCAL_RANK='x': expected a whole number >= 0 ({BY_HAND})",
        ),
        # gloo's "rank < size" traceback, and rank 0 waited --timeout-s for it, then a DistStoreError traceback
        (
            {"RANK": "3", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
            "[rank 3] RANK=3 but WORLD_SIZE=2: expected 0 <= RANK < WORLD_SIZE",
        ),
        # torch's "environment variable MASTER_ADDR expected, but not set" traceback
        (
            {"RANK": "0", "WORLD_SIZE": "2"},
            "[rank 0] RANK and WORLD_SIZE are set but MASTER_ADDR is not: torchrun sets it; by hand, set MASTER_ADDR "
            "(rank 0's host) and MASTER_PORT (a free port there) in each process",
        ),
        (
            {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "x"},
            "[rank 1] MASTER_PORT='x': expected a port 1..65535 free on rank 0's host (MASTER_ADDR), the same in each "
            "process",
        ),
    ],
    ids=["rank alone", "world size alone", "not a number", "local rank", "rank out of range", "no address", "port"],
)
def test_rank_variables_set_by_hand_wrongly_are_refused_in_one_line_before_any_wait(monkeypatch, capsys, env, line):
    from cnnpar import cli

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert cli.main(["train", "--nproc", "2", "--epochs", "1", "--no-progress"]) == 2
    assert capsys.readouterr().err == f"cnnpar: error: {line}\n"


def test_nproc_under_a_torchrun_started_by_hand_is_said_not_to_launch(torchrun_env):
    from cnnpar.cli import nproc_not_launched
    from cnnpar.dist import LAUNCHED_NPROC_ENV

    torchrun_env.setenv("RANK", "0")
    torchrun_env.setenv("LOCAL_WORLD_SIZE", "1")  # two nodes of one process each
    assert nproc_not_launched(4) == (
        "cnnpar: note: --nproc 4 not launched: torchrun started the processes (1 on this node, 2 in the job); "
        "--nproc starts torchrun itself, on one machine"
    )
    assert nproc_not_launched(1) == ""  # what torchrun started on this node
    torchrun_env.setenv(LAUNCHED_NPROC_ENV, "4")
    assert nproc_not_launched(4) == ""  # --nproc's own workers: it launched them
    torchrun_env.delenv(LAUNCHED_NPROC_ENV)
    torchrun_env.setenv("RANK", "1")
    assert nproc_not_launched(4) == ""  # rank 0 speaks for the job


def test_a_rank_started_by_hand_whose_peers_never_come_names_the_likely_cause_after_the_timeout(monkeypatch):
    """torch's DistStoreError traceback ("Timed out after 1 seconds waiting for clients") after --timeout-s."""
    from cnnpar.dist import JoinFailed
    from cnnpar.errors import EXIT_COLLECTIVE_TIMED_OUT
    from tests.dist.test_torchrun_cli import free_port

    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    for key, value in {
        "RANK": "0",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(JoinFailed) as stopped:
        init_distributed("cpu", timeout_s=1)
    assert str(stopped.value).startswith(
        "the other ranks did not join the job within --timeout-s 1: another node's process did not start, or failed "
        "before joining (its error is in its own log); torch: "
    )
    assert stopped.value.exit_status == EXIT_COLLECTIVE_TIMED_OUT
