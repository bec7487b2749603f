"""Item 12.7: one GPU per process, and the NCCL defaults `cnnpar train --nproc N` passes on."""

from __future__ import annotations

import pytest
import torch

from cnnpar import dist
from cnnpar.errors import ConfigError


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def test_more_processes_than_gpus_is_refused(two_gpus):
    with pytest.raises(ConfigError, match=r"3 processes on this node but 2 CUDA device.*<= 2"):
        dist.pick_device("auto", 0, local_world_size=3)  # rank 0 refuses too, not only the surplus
    with pytest.raises(ConfigError, match="<= 2"):
        dist.pick_device("cuda", 2, local_world_size=3)


def test_one_gpu_per_process(two_gpus):
    assert dist.pick_device("auto", 1, local_world_size=2) == torch.device("cuda", 1)
    assert dist.pick_device("cpu", 5, local_world_size=8) == torch.device("cpu")


def test_init_distributed_reads_the_local_world_size(two_gpus, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.delenv(dist.DEBUG_ENV, raising=False)
    with pytest.raises(ConfigError, match="4 processes on this node but 2"):
        dist.init_distributed("auto")


def test_launcher_env_sets_the_nccl_defaults():
    env = dist.launcher_env({"PATH": "/bin"}, "runs/nccl_trace_rank_")
    assert env["PATH"] == "/bin"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert int(env["TORCH_NCCL_TRACE_BUFFER_SIZE"]) > 0
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "runs/nccl_trace_rank_"


def test_launcher_env_keeps_what_the_user_set():
    user = {
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
        "NCCL_ASYNC_ERROR_HANDLING": "1",  # the old spelling torch still reads
        "TORCH_FR_BUFFER_SIZE": "50",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/scratch/fr_",
    }
    env = dist.launcher_env(user, "runs/nccl_trace_rank_")
    assert env == user


def test_train_nproc_hands_torchrun_the_env(monkeypatch, tmp_path):
    from cnnpar import cli

    seen = {}

    def fake_call(cmd, env=None):
        seen.update(cmd=cmd, env=env)
        return 0

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("TORCH_NCCL_DUMP_ON_TIMEOUT", raising=False)
    monkeypatch.setattr(cli.subprocess, "call", fake_call)
    assert cli.main(["train", "--nproc", "2", "--out-dir", str(tmp_path)]) == 0
    assert "--nproc_per_node=2" in seen["cmd"]
    assert seen["env"]["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert seen["env"]["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == str(tmp_path / "nccl_trace_rank_")
    assert list(tmp_path.iterdir()) == []  # nothing made beside the run folders until a timeout


def test_train_nproc_refuses_before_launching(two_gpus, monkeypatch, tmp_path, capsys):
    from cnnpar import cli

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(cli.subprocess, "call", lambda *a, **k: pytest.fail("launched torchrun"))
    assert cli.main(["train", "--nproc", "3", "--out-dir", str(tmp_path)]) == 2
    assert "3 processes on this node but 2 CUDA device(s) visible" in capsys.readouterr().err


def test_the_device_queues_are_widened_before_cuda_starts_and_a_users_number_is_kept(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)  # as in a fresh `cnnpar` process
    env = {"PATH": "/bin"}
    dist.widen_device_queues(env)
    assert env[dist.DEVICE_QUEUES_ENV] == "32"
    assert dist.device_queues_line(env).endswith("set by cnnpar)")
    user = {dist.DEVICE_QUEUES_ENV: "4"}
    dist.widen_device_queues(user)
    assert user == {dist.DEVICE_QUEUES_ENV: "4"}
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # too late: the context has its queues
    late = {}
    dist.widen_device_queues(late)
    assert late == {}
    assert "CUDA's default 8" in dist.device_queues_line(late)
    assert "set it so yourself" in dist.device_queues_line(late)
    assert dist.device_queues_line(user) == "device queues: 4 (CUDA_DEVICE_MAX_CONNECTIONS, yours)"


def test_every_cnnpar_command_widens_the_queues_and_torchruns_workers_inherit_them(monkeypatch, tmp_path):
    from cnnpar import cli

    seen = {}
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)  # as in a fresh `cnnpar` process
    monkeypatch.setattr(cli.subprocess, "call", lambda cmd, env=None: seen.update(env=env) or 0)
    assert cli.main(["train", "--nproc", "2", "--out-dir", str(tmp_path)]) == 0
    assert seen["env"][dist.DEVICE_QUEUES_ENV] == "32"
    assert dist.device_queues_line() == "device queues: 32 (CUDA_DEVICE_MAX_CONNECTIONS, set by cnnpar)"
    # a torchrun worker inherits both variables and says the same
    assert dist.device_queues_line(dict(seen["env"])).endswith("set by cnnpar)")
    monkeypatch.setenv(dist.DEVICE_QUEUES_ENV, "16")
    assert cli.main(["train", "--nproc", "2", "--out-dir", str(tmp_path)]) == 0
    assert seen["env"][dist.DEVICE_QUEUES_ENV] == "16"
    assert dist.device_queues_line() == "device queues: 16 (CUDA_DEVICE_MAX_CONNECTIONS, yours)"


def test_the_queues_are_those_cuda_started_with_not_a_value_set_afterwards(monkeypatch):
    # torch calls the recorder when it starts CUDA (registered at import where CUDA had not started)
    assert not torch.cuda.is_initialized() or dist._at_cuda_start is not dist._UNSEEN
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setenv(dist.DEVICE_QUEUES_ENV, "32")
    monkeypatch.setattr(dist, "_at_cuda_start", "32")  # set in time
    assert dist.device_queues() == 32 and dist.device_queues_line().startswith("device queues: 32 (")
    monkeypatch.setattr(dist, "_at_cuda_start", None)  # set after CUDA started with the default
    assert dist.device_queues() == 8
    assert "was set after CUDA started here" in dist.device_queues_line()
    assert "CUDA's default 8" in dist.device_queues_line()
    monkeypatch.setattr(dist, "_at_cuda_start", dist._UNSEEN)  # CUDA started before cnnpar was imported
    assert dist.device_queues() == 8
    assert "started before cnnpar could see" in dist.device_queues_line()
    dist._record_queues_at_cuda_start()  # what torch's queued call does at the start
    assert dist._at_cuda_start == "32" and dist.device_queues() == 32


def test_help_answers_without_importing_torch(tmp_path):
    """The queue variable is set after the arguments are parsed, so `cnnpar --help` stays quick."""
    import subprocess
    import sys

    from tests.conftest import cli_env

    code = (
        "import sys\nfrom cnnpar.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"
