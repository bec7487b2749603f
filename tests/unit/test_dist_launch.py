"""Item 12.7: one GPU per process, the NCCL defaults `cnnpar train --nproc N` passes on, DDP's switches and
the horovodrun command, each in the spelling that the torch (or the checkout) in use takes."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest
import torch

from cnnpar import dist
from cnnpar.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")  # one intra-op thread for the in-process runs (conftest)


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def test_more_processes_than_gpus_is_refused(two_gpus):
    with pytest.raises(ConfigError, match=r"3 processes on this node but 2 CUDA device.*<= 2"):
        dist.pick_device("auto", 0, local_world_size=3)  # rank 0 refuses too, not only the surplus
    with pytest.raises(ConfigError, match="<= 2"):
        dist.pick_device("cuda", 2, local_world_size=3)


def test_one_gpu_per_process(two_gpus, monkeypatch):
    monkeypatch.setattr(dist, "usable_cores", lambda: 2)  # 4 CPU processes a core (dist.CPU_PROCS_PER_CORE)
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
    env = dist.launcher_env({"PATH": "/bin"}, "runs/nccl_trace_rank_", torch_version="2.14.1+cu130")
    assert env == {
        "PATH": "/bin",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        # the names 2.14 reads without "TORCH_NCCL_TRACE_BUFFER_SIZE is deprecated; use TORCH_FR_BUFFER_SIZE"
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_FR_DUMP_TEMP_FILE": "runs/nccl_trace_rank_",
    }


@pytest.mark.parametrize(
    "version, names",
    [
        ("2.5.1+cu124", ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")),
        ("2.7.1", ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")),  # reads only these
        ("2.8.0", ("TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE")),  # the first to read the new names
        ("2.11.0+cu130", ("TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE")),
        ("2.14.1+cu130", ("TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE")),  # warns about the old ones
    ],
)
def test_the_flight_recorder_names_are_those_each_torch_reads_without_a_warning(version, names):
    assert dist.flight_recorder_env(version) == names
    env = dist.launcher_env({}, "runs/nccl_trace_rank_", torch_version=version)
    assert env[names[0]] == "2000" and env[names[1]] == "runs/nccl_trace_rank_"
    assert set(env) == {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_DUMP_ON_TIMEOUT", *names}  # not both names


@pytest.mark.parametrize("version", ["2.7.1", "2.14.1"])
def test_launcher_env_keeps_what_the_user_set(version):
    user = {
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
        "NCCL_ASYNC_ERROR_HANDLING": "1",  # the old spelling torch still reads
        "TORCH_FR_BUFFER_SIZE": "50",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/scratch/fr_",  # under either name: nothing added beside it
    }
    env = dist.launcher_env(user, "runs/nccl_trace_rank_", torch_version=version)
    assert env == user


def test_train_nproc_hands_torchrun_the_env(monkeypatch, tmp_path):
    from cnnpar import cli

    seen = {}

    def fake_launch(cmd, env):
        seen.update(cmd=cmd, env=env)
        return 0

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("TORCH_NCCL_DUMP_ON_TIMEOUT", raising=False)
    monkeypatch.setattr(dist, "run_launcher", fake_launch)
    assert cli.main(["train", "--nproc", "2", "--out-dir", str(tmp_path)]) == 0
    assert "--nproc_per_node=2" in seen["cmd"]
    assert seen["env"]["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert seen["env"][dist.flight_recorder_env()[1]] == str(tmp_path / "nccl_trace_rank_")
    assert list(tmp_path.iterdir()) == []  # nothing made beside the run folders until a timeout


def test_the_launcher_says_what_the_checkpoint_keeps_when_its_workers_fail_or_are_stopped(
    monkeypatch, tmp_path, capsys
):
    """Under --nproc a killed worker ended with torchrun's traceback and no word on what was kept, a SIGTERM with
    a line naming no epochs; rank 0's own line never came (torchrun stops it at once)."""
    from cnnpar import cli
    from cnnpar.errors import Terminated

    def workers_that(end):
        def launch(cmd, env):
            Path(env[cli.RUN_DIR_NOTE_ENV]).write_text("runs/r")  # as rank 0 does once it holds its run folder
            return end()

        return launch

    def stopped():
        raise Terminated

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.chdir(tmp_path)
    ckpt = tmp_path / "runs" / "r" / "ckpt" / "last.pt"
    ckpt.parent.mkdir(parents=True)
    torch.save({"epoch": 2, "model": {"w": torch.zeros(3)}}, ckpt)
    launch = ["train", "--nproc", "2", "--name", "r", "--device", "cpu"]
    kept = "stopped: the checkpoint in runs/r holds epochs 1-2; continue with: cnnpar train --resume runs/r --nproc 2"
    for end, rc in ((lambda: 1, 1), (stopped, 143)):  # a worker failed; a stop handed on to torchrun
        monkeypatch.setattr(dist, "run_launcher", workers_that(end))
        assert cli.main(launch) == rc
        assert capsys.readouterr().out.splitlines()[-1] == kept
    ckpt.unlink()
    assert cli.main(launch) == 143
    assert capsys.readouterr().out.splitlines()[-1] == (
        "stopped before an epoch was saved: nothing to resume in runs/r; start it again with the command that "
        "started it, without --resume (no config.toml there)"
    )
    monkeypatch.setattr(dist, "run_launcher", lambda cmd, env: 1)  # rank 0 refused before it held a folder
    assert cli.main(launch) == 1
    assert capsys.readouterr().out.splitlines()[-1].startswith("cnnpar: launching")  # its own error said why


def test_train_nproc_refuses_before_launching(two_gpus, monkeypatch, tmp_path, capsys):
    from cnnpar import cli

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(dist, "run_launcher", lambda *a, **k: pytest.fail("launched torchrun"))
    assert cli.main(["train", "--nproc", "3", "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "3 processes on this node but 2 CUDA device(s) visible" in err and "stored config" not in err
    # a run's record holds --nproc (--config, --resume): the refusal says where the number came from
    record = tmp_path / "rec.toml"
    record.write_text("[dist]\nnproc = 3\n")
    assert cli.main(["train", "--config", str(record), "--out-dir", str(tmp_path)]) == 2
    assert "(--nproc 3 comes from the stored config: pass --nproc to change it)" in capsys.readouterr().err


def test_sync_bn_on_the_cpu_is_refused_by_the_launcher_before_torchrun_starts(monkeypatch, tmp_path, capsys):
    """It was refused only by every rank, after torchrun had started them and they had loaded the data (20 s)."""
    from cnnpar import cli

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(dist, "run_launcher", lambda *a, **k: pytest.fail("launched torchrun"))
    assert cli.main(["train", "--nproc", "2", "--sync-bn", "--device", "cpu", "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == (
        "cnnpar: error: dist.sync_bn (--sync-bn) = true: SyncBatchNorm needs CUDA devices, and this run is on cpu "
        "(gloo); drop --sync-bn or run on GPUs\n"
    )
    launched = []
    monkeypatch.setattr(dist, "run_launcher", lambda cmd, env: launched.append(cmd) or 0)
    assert cli.main(["train", "--nproc", "1", "--sync-bn", "--device", "cpu", "--out-dir", str(tmp_path)]) == 0
    assert launched  # one process: nothing to synchronise, the switch does nothing (as in apply_sync_bn)


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
    monkeypatch.setattr(dist, "run_launcher", lambda cmd, env: seen.update(env=env) or 0)
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


def test_ddp_takes_the_buffer_switch_under_the_name_each_torch_reads():
    from cnnpar.parallel.apply import ddp_buffer_kwargs

    def ddp_2_8(self, module, device_ids=None, broadcast_buffers=True, static_graph=False): ...

    def ddp_2_14(self, module, device_ids=None, broadcast_buffers=None, forward_sync_buffers=None): ...

    for flag in (True, False):
        assert ddp_buffer_kwargs(flag, ddp_2_8) == {"broadcast_buffers": flag}
        assert ddp_buffer_kwargs(flag, ddp_2_14) == {"forward_sync_buffers": flag}


@pytest.mark.parametrize("broadcast", [True, False])
def test_this_torchs_ddp_takes_the_buffer_switch_without_a_warning(broadcast, tmp_path):
    """apply_ddp's DDP on the installed torch, in a gloo group of one: no FutureWarning ("`broadcast_buffers`
    is deprecated", torch 2.14), and the switch read back as DDP keeps it."""
    import warnings

    import torch.distributed as tdist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from cnnpar.parallel.apply import ddp_buffer_kwargs

    tdist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ddp = DDP(torch.nn.BatchNorm1d(3), **ddp_buffer_kwargs(broadcast))
        assert not [str(w.message) for w in caught if "broadcast_buffers" in str(w.message)]
        assert ddp.broadcast_buffers is broadcast
    finally:
        tdist.destroy_process_group()


def docs_horovod_line(path: str) -> str:
    """The horovodrun command README.md and docs/frameworks.md give (.venv-horovod/bin/horovodrun ...)."""
    from tests.conftest import REPO

    (line,) = {
        m.group(0)
        for m in re.finditer(r"\.venv-horovod/bin/horovodrun [^`\n]*", (REPO / path).read_text())
        if "cnnpar train" in m.group(0)
    }
    return line


@pytest.mark.parametrize("doc", ["README.md", "docs/frameworks.md"])
def test_the_horovodrun_command_is_the_docs_with_the_users_arguments(doc, tmp_path, monkeypatch):
    venv = tmp_path / ".venv-horovod"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "horovodrun").touch()
    monkeypatch.chdir(tmp_path)  # where the venv lies, as the checkout's root does for the docs
    assert dist.horovod_command(venv=venv) == docs_horovod_line(doc)
    got = dist.horovod_command(["--epochs", "1", "--name", "my run"], 4, venv=venv)
    assert got == (
        ".venv-horovod/bin/horovodrun -np 4 -H localhost:4 .venv-horovod/bin/python -m cnnpar train "
        "--epochs 1 --name 'my run' --strategy horovod"
    )
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # a folder without the venv: the paths in full
    assert dist.horovod_command(venv=venv).startswith(f"{venv}/bin/horovodrun -np 2 -H localhost:2 {venv}/bin/python")


def test_the_horovodrun_command_builds_horovod_first_where_it_is_missing(tmp_path, monkeypatch):
    monkeypatch.chdir(dist.CHECKOUT)
    monkeypatch.setattr(dist, "HOROVOD_VENV", tmp_path / "none")
    install, run = dist.horovod_command().split(" && ")
    assert install == "scripts/install_horovod.sh"
    assert run.startswith(f"{tmp_path}/none/bin/horovodrun -np 2")


@pytest.mark.parametrize(
    "argv, nproc, expected",
    [
        (["--strategy", "horovod", "--epochs", "1"], 0, ["--epochs", "1"]),
        (["--epochs", "1", "--strategy=horovod", "--nproc", "2"], 2, ["--epochs", "1"]),
        (["--nproc=2", "--strategy", "horovod"], 2, []),
        (["--config", "c.toml", "--strategy", "horovod"], 2, ["--config", "c.toml", "--nproc", "0"]),  # from the file
    ],
)
def test_the_users_train_arguments_reach_the_horovodrun_command(argv, nproc, expected):
    from cnnpar.cli import horovod_train_args

    assert horovod_train_args(argv, nproc) == expected


def test_the_refusal_gives_a_command_that_parses_to_the_same_run_under_horovodrun(capsys, tmp_path, monkeypatch):
    """What `cnnpar train --strategy horovod ... --nproc 2` prints, pasted: the user's flags, Horovod's
    strategy and no torchrun launcher (Horovod is not installed here, so that is as far as it can run)."""
    import shlex

    from cnnpar.cli import build_parser
    from cnnpar.cliargs import config_from_args

    monkeypatch.delenv("RANK", raising=False)
    for name in dist.HOROVOD_LAUNCH_ENV:
        monkeypatch.delenv(name, raising=False)
    from cnnpar import cli

    runs = tmp_path / "runs"
    user = ["--strategy", "horovod", "--epochs", "1", "--max-steps", "2", "--name", "a b", "--out-dir", str(runs)]
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # outside the checkout: the paths in full

    for extra in ([], ["--nproc", "2"]):
        assert cli.main(["train", *user, *extra]) == 2
        err = capsys.readouterr().err
        (pasted,) = re.findall(r"run `([^`]*)`", err)
        words = shlex.split(pasted.split(" && ")[-1])
        assert words[:5] == [str(dist.HOROVOD_VENV / "bin" / "horovodrun"), "-np", "2", "-H", "localhost:2"]
        assert words[5:8] == [str(dist.HOROVOD_VENV / "bin" / "python"), "-m", "cnnpar"]
        cfg = config_from_args(build_parser().parse_args(words[8:]))
        assert (cfg.dist.strategy, cfg.dist.nproc, cfg.run.epochs, cfg.run.max_steps) == ("horovod", 0, 1, 2)
        assert (cfg.run.name, cfg.run.out_dir) == ("a b", str(runs))
    assert not runs.exists()


def test_a_record_holds_the_processes_that_ran_not_the_nproc_asked_for(monkeypatch, tmp_path):
    """The debug switch runs one process whatever --nproc says; its record had stored nproc = 2, and `--config` of
    it started two. The record's nproc is now that of the launch that ran (0: none), the asked value beside it."""
    from cnnpar import cli

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv(dist.DEBUG_ENV, "1")
    monkeypatch.setattr(dist, "run_launcher", lambda *a, **k: pytest.fail("launched torchrun"))
    args = ["train", "--nproc", "2", "--epochs", "1", "--max-steps", "1", "--no-progress", "--no-tensorboard"]
    assert cli.main([*args, "--out-dir", str(tmp_path), "--name", "r"]) == 0
    record = (tmp_path / "r" / "config.toml").read_text()
    assert "\nnproc = 0\n" in record and "# requested: dist.nproc = 2\n" in record
    monkeypatch.setenv("RANK", "0")  # a worker of `cnnpar train --nproc 3`'s launcher
    monkeypatch.setenv(dist.LAUNCHED_NPROC_ENV, "3")
    assert dist.launched_nproc() == 3
    monkeypatch.delenv(dist.LAUNCHED_NPROC_ENV)  # a worker of torchrun started by hand
    assert dist.launched_nproc() == 0


def test_the_debug_switch_says_it_cut_the_launch_to_one_process_and_the_global_batch_it_trains_at(
    monkeypatch, tmp_path, capsys
):
    """`--nproc 2 --debug-single` dropped the --nproc without a word, and a CNNPAR_DEBUG_SINGLE=1 left exported in a
    job script turned torchrun's N processes into one, said only by "1 process(es)": a global batch and a linearly
    scaled lr half those the launch asked for."""
    from cnnpar import cli

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv(dist.DEBUG_ENV, raising=False)
    monkeypatch.setattr(dist, "run_launcher", lambda *a, **k: pytest.fail("launched torchrun"))
    args = ["train", "--nproc", "2", "--debug-single", "--batch-size", "32", "--lr-scaling", "linear", "--epochs", "1"]
    args += ["--max-steps", "1", "--no-progress", "--no-tensorboard", "--out-dir", str(tmp_path)]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert (
        "debug switch (--debug-single): --nproc 2 not launched; this process trains alone: global batch 32 per step "
        "instead of 64 (lr 0.002 instead of 0.004: --lr-scaling linear)\n"
    ) in out, out
    # under torchrun, as each of its workers sees it; rank 0 says it (the others exit before a word)
    monkeypatch.setenv(dist.DEBUG_ENV, "1")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert dist.debug_switch_cut(False, 0) == (
        "debug switch (CNNPAR_DEBUG_SINGLE=1): torchrun started 4 processes; rank 0 trains alone, the others exited",
        4,
    )
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert dist.debug_switch_cut(False, 0) == ("", 1)  # nothing cut: one process was asked for


def test_a_record_of_a_debug_run_resumes_with_the_processes_asked_for_then(monkeypatch, tmp_path):
    """--debug-single was kept in the record: a later `--resume --nproc 2` (or torchrun) of it trained one process,
    halving the global batch, and its only note told the user to drop a switch they had not typed."""
    from cnnpar import cli
    from cnnpar.cliargs import config_from_args

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv(dist.DEBUG_ENV, raising=False)
    monkeypatch.setattr(dist, "run_launcher", lambda *a, **k: pytest.fail("launched torchrun"))
    args = ["train", "--nproc", "2", "--debug-single", "--epochs", "1", "--max-steps", "1", "--no-progress"]
    assert cli.main([*args, "--no-tensorboard", "--out-dir", str(tmp_path), "--name", "d"]) == 0
    record = (tmp_path / "d" / "config.toml").read_text()
    assert "\ndebug_single = false\n" in record and "\nnproc = 0\n" in record
    cfg = config_from_args(cli.build_parser().parse_args(["train", "--resume", str(tmp_path / "d"), "--nproc", "2"]))
    assert (cfg.dist.debug_single, cfg.dist.nproc) == (False, 2)
    assert not dist.debug_single_requested(cfg.dist.debug_single)


def test_profile_with_nproc_and_horovod_with_the_debug_switch_are_refused_not_run_otherwise(monkeypatch, capsys):
    """`profile --nproc 2` profiled one process and said nothing; `--strategy horovod --debug-single` under
    horovodrun trained on every rank (the switch was ignored there)."""
    from cnnpar import cli

    monkeypatch.delenv("RANK", raising=False)
    assert cli.main(["profile", "--nproc", "2"]) == 2
    err = capsys.readouterr().err
    assert "profile runs in this process: --nproc 2 (typed or from the config) is not launched" in err
    monkeypatch.setenv("HOROVOD_RANK", "0")  # as horovodrun starts a rank
    assert cli.main(["train", "--strategy", "horovod", "--debug-single"]) == 2
    err = capsys.readouterr().err
    assert "--debug-single runs one process on DDP's path: expected it without --strategy horovod" in err


def test_the_launcher_says_a_refusal_every_rank_raised_once_and_exits_as_one_process(monkeypatch, tmp_path, capsys):
    """Each rank printed its own `cnnpar: error: [rank R]` copy, and the launcher ended 1; every rank now writes the
    line beside the run-folder note (cli.main) and prints nothing, torchrun's failure lines are left out
    (cnnpar.torchrun.QuietAfterANote), and the launcher prints it once and exits 2."""
    import logging

    from cnnpar import cli
    from cnnpar.torchrun import QuietAfterANote, refusal_note

    line = "model cnn3: input images 4x4: expected at least 8x8 (its three 2x2 max-pools); give --image-size 8 or more"
    quiet = {}

    def refused_everywhere(cmd, env):
        note = refusal_note(env[cli.RUN_DIR_NOTE_ENV])
        quiet["before"] = QuietAfterANote(note).filter(logging.makeLogRecord({}))
        note.write_text(line)  # as each rank does (cli.main's EveryRankRefused)
        quiet["after"] = QuietAfterANote(note).filter(logging.makeLogRecord({}))
        return 2

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(dist, "run_launcher", refused_everywhere)
    assert cli.main(["train", "--nproc", "2", "--device", "cpu", "--image-size", "4"]) == 2
    out, err = capsys.readouterr()
    assert err == f"cnnpar: error: {line}\n" and "stopped" not in out
    assert quiet == {"before": True, "after": False}


def test_a_ranks_noted_failure_that_a_stop_overtook_is_still_said(monkeypatch, tmp_path, capsys):
    """A rank's error is left to the launcher (failure_note): a Ctrl-C that reached the launcher before torchrun
    ended said only what is kept, and the error that ended the training was said by nobody."""
    import json

    from cnnpar import cli
    from cnnpar.torchrun import failure_note

    line = "[rank 1] photos/cat/113.jpg: cannot decode as an image"

    def failed_then_stopped(cmd, env):
        failure_note(env[cli.RUN_DIR_NOTE_ENV]).write_text(json.dumps({"line": line, "add_kept": True}))
        raise KeyboardInterrupt

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(dist, "run_launcher", failed_then_stopped)
    assert cli.main(["train", "--nproc", "2", "--device", "cpu"]) == 130
    out, err = capsys.readouterr()
    assert f"cnnpar: error: {line}\n" in err, err
    assert "stopped before training began" in out


def test_cuda_asked_for_without_cuda_names_the_flag(monkeypatch):
    from cnnpar.errors import ConfigError

    monkeypatch.setattr(dist.torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # named where set (test_device_choice)
    wanted = r"^--device cuda \(speed\.device\) but no CUDA device is visible: expected --device cpu or auto here$"
    with pytest.raises(ConfigError, match=wanted):
        dist.pick_device("cuda", 0, 1)


def test_the_launchers_last_line_does_not_offer_a_folder_another_live_run_holds(tmp_path):
    """Rank 0 names its folder before the claim; refused there (another run holds it), the launcher must not
    offer `--resume` of the other run's folder."""
    import os

    from cnnpar import cli
    from cnnpar.engine import rundir

    folder = tmp_path / "runs" / "r"
    folder.mkdir(parents=True)
    note = tmp_path / "note"
    note.write_text(str(folder))
    held = rundir._lock(folder, create=True)  # the other run's claim
    try:
        assert (
            cli.launch_end_line(note, 2)
            == f"stopped before training began: {folder} belongs to a run still in progress"
        )
    finally:
        os.close(held)
    assert cli.launch_end_line(note, 2) == (
        f"stopped before an epoch was saved: nothing to resume in {folder}; start it again with the command that "
        "started it, without --resume (no config.toml there)"
    )


def test_a_ranks_noted_failure_is_said_with_what_is_kept_where_rank_0_left_its_own_kept_line_to_the_note(
    tmp_path, monkeypatch
):
    """Every rank out of memory at one step: rank 0's line named what is kept (the "said" marker), but rank 1's
    note came first and rank 0 said nothing (run_command); the launcher took the marker as rank 0 having said it,
    and rank 1's line went out without the kept epochs or the resume with half the batch."""
    import json

    from cnnpar import cli
    from cnnpar.engine import checkpoint
    from cnnpar.torchrun import failure_note, memory_full_note

    folder = tmp_path / "runs" / "m"
    folder.mkdir(parents=True)
    note = tmp_path / "run_dir"
    note.write_text(str(folder))
    cli.stop_said_marker(note).touch()
    memory_full_note(note).write_text(" --batch-size 16 --grad-accum 2")
    failure_note(note).write_text(
        json.dumps({"line": "[rank 1] the training step ran out of memory", "add_kept": True})
    )
    monkeypatch.setattr(checkpoint, "checkpoint_epoch", lambda run_dir, ckpt=None: 1)
    assert cli.launch_failure_lines(note, 2) == (
        f"cnnpar: error: [rank 1] the training step ran out of memory; the checkpoint in {folder} holds epoch 1; "
        f"continue with: cnnpar train --resume {folder} --nproc 2 --batch-size 16 --grad-accum 2",
        "",
    )


def _alive(pid: int) -> bool:
    """Running (a zombie left for an init that does not reap counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="Linux: prctl's parent-death signal")
def test_a_launcher_stops_when_cnnpar_is_killed_without_a_word(tmp_path):
    """`cnnpar train --nproc 2` killed with SIGKILL (or by the OOM killer) left torchrun, in its own session, and
    its workers training to the end, holding the run folder against a resume."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pid_file = tmp_path / "launcher.pid"
    launcher = (  # as cnnpar.torchrun starts, then a launcher that would run on
        "import os, pathlib, time; from cnnpar.torchrun import stop_with_parent; stop_with_parent(); "
        f"pathlib.Path({str(pid_file)!r}).write_text(str(os.getpid())); time.sleep(120)"
    )
    cnnpar = (
        "from cnnpar.dist import run_launcher; import os, sys; "
        f"run_launcher([sys.executable, '-c', {launcher!r}], dict(os.environ))"
    )
    proc = subprocess.Popen([sys.executable, "-c", cnnpar])
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and proc.poll() is None, "the launcher never started"
        time.sleep(0.05)
    child = int(pid_file.read_text())
    assert _alive(child)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _alive(child):
        os.kill(child, signal.SIGKILL)
        pytest.fail("the launcher outlived the process that started it")


def test_the_launcher_reads_the_variable_cnnpar_sets(monkeypatch):
    """cnnpar.torchrun spells dist.PARENT_ENV out (importing dist would import torch before the parent-death
    signal is set): a rename of one alone would leave torchrun running on after a killed `cnnpar train`."""
    import os

    from cnnpar.torchrun import stop_with_parent

    monkeypatch.setenv(dist.PARENT_ENV, "not a process id")  # read and dropped; no signal asked for
    stop_with_parent()
    assert dist.PARENT_ENV not in os.environ


def test_a_second_stop_kills_the_launchers_workers_in_sessions_of_their_own(tmp_path, stops_reach_children):
    """A second Ctrl-C 2 s after the first ends the launcher at once: a `killpg` of its session left its workers,
    which torch elastic starts in sessions of their own, training on."""
    import signal
    import subprocess
    import sys
    import time

    from tests.unit.test_process_tree import gone_soon, launcher_of_a_new_session_child, running_with

    marker = f"launcher-worker-{tmp_path.name}"
    deaf = "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)\n"  # a launcher stuck in its shutdown
    cnnpar = (
        "from cnnpar.dist import run_launcher; import os, sys; "
        f"run_launcher([sys.executable, '-c', {deaf + launcher_of_a_new_session_child(marker)!r}], dict(os.environ))"
    )
    proc = subprocess.Popen([sys.executable, "-c", cnnpar], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"started\n"  # the launcher's worker is up
        proc.send_signal(signal.SIGINT)
        time.sleep(2.5)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        assert gone_soon(marker), "the launcher's worker outlived the second stop"
    finally:
        proc.kill()
        for p in running_with(marker):
            p.kill()


@pytest.mark.parametrize(
    "raised, expected",
    [
        (RuntimeError("[gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:27018"), ("ended", None)),
        (
            RuntimeError("[gloo/transport/tcp/pair.cc:589] Read error [10.0.0.2]:3: Connection reset by peer"),
            ("ended", None),
        ),
        (
            RuntimeError("ncclRemoteError: A call failed possibly due to a network error or a remote process exiting"),
            ("ended", None),
        ),
        (
            RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 20000ms for recv operation"),
            ("silent", 20.0),
        ),
        (
            RuntimeError(
                "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, "
                "Timeout(ms)=600000) ran for 600026 milliseconds before timing out."
            ),
            ("silent", 600.0),
        ),
        (RuntimeError("CUDA error: an illegal memory access was encountered"), ("", None)),
        (ValueError("Connection closed by peer"), ("", None)),  # not torch's: a bug of this rank's own
    ],
)
def test_a_collective_failed_by_another_rank_is_told_from_this_ranks_own_failure(raised, expected):
    assert dist.another_ranks_failure(raised) == expected


def test_a_peers_loss_raised_from_is_read_but_not_one_met_while_handling_an_error_of_this_ranks_own():
    lost = RuntimeError("Connection closed by peer [127.0.0.1]:27018")
    try:
        raise OSError("while saving") from lost
    except OSError as e:
        assert dist.another_ranks_failure(e) == ("ended", None)
    try:
        try:
            raise KeyError("this rank's own bug")
        except KeyError:
            raise lost from None
    except RuntimeError as e:
        assert dist.another_ranks_failure(e) == ("", None)  # its own error came first: the traceback shows it
    try:
        try:
            raise lost
        except RuntimeError:
            raise KeyError("a bug in the clean-up") from None
    except KeyError as e:
        assert dist.another_ranks_failure(e) == ("", None)  # its traceback stays


def test_a_rank_stopped_by_another_says_so_in_one_line_with_a_status_of_its_own(monkeypatch, capsys):
    """It printed "cnnpar: rank 1 failed:" and a 50-line gloo traceback ending in "Connection closed by peer",
    burying the other rank's one-line error above it; a timeout read as its own failure."""
    from cnnpar import cli
    from cnnpar.errors import EXIT_ANOTHER_RANK_ENDED, EXIT_COLLECTIVE_TIMED_OUT

    def train_raising(error):
        def cmd(args, argv):
            raise error

        return cmd

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv(dist.LAUNCHED_NPROC_ENV, "2")  # a worker of --nproc's launcher: it installs no handler
    lost = RuntimeError("[gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:27018")
    monkeypatch.setattr(cli, "cmd_train", train_raising(lost))
    assert cli.main(["train"]) == EXIT_ANOTHER_RANK_ENDED
    assert capsys.readouterr().err == (
        "cnnpar: rank 1 stopped: another rank of the job ended; its own error is above, or in its node's log\n"
    )
    waited = RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 20000ms for recv operation")
    monkeypatch.setattr(cli, "cmd_train", train_raising(waited))
    assert cli.main(["train"]) == EXIT_COLLECTIVE_TIMED_OUT
    assert capsys.readouterr().err == (
        "cnnpar: rank 1 timed out after 20 s (--timeout-s 20) waiting for another rank in a collective: a rank "
        "stopped responding (stuck, stopped or too slow)\n"
    )
    monkeypatch.setattr(cli, "cmd_train", train_raising(RuntimeError("its own")))
    with pytest.raises(RuntimeError, match="its own"):  # its own failure keeps its traceback
        cli.main(["train"])
    assert capsys.readouterr().err == "cnnpar: rank 1 failed:\n"


def _failure(exitcode: int, pid: int, timestamp: int = 100):
    from types import SimpleNamespace

    return SimpleNamespace(
        exitcode=exitcode, pid=pid, timestamp=timestamp, signal_name=lambda: signal.Signals(-exitcode).name
    )


def test_the_launcher_names_the_rank_that_failed_by_itself_not_one_stopped_by_it_or_by_torchrun():
    """A timed-out rank was "rank 0 failed first (exit code 1)", blaming the healthy rank that waited for a stuck
    one; a rank that lost its peer, or that torchrun ended itself, could be named first in the same second."""
    from cnnpar.errors import EXIT_ANOTHER_RANK_ENDED, EXIT_COLLECTIVE_TIMED_OUT
    from cnnpar.torchrun import EndedByTorchrun, end_line

    ended = EndedByTorchrun()
    ended.signalled = {12, 13}
    # rank 2 failed (exit 2); rank 0 lost its peer first by the clock; torchrun SIGTERMed rank 1, SIGKILLed rank 3
    failures = {
        0: _failure(EXIT_ANOTHER_RANK_ENDED, 10, timestamp=99),
        1: _failure(-signal.SIGTERM, 12, timestamp=99),
        2: _failure(2, 11),
        3: _failure(-signal.SIGKILL, 13, timestamp=99),
    }
    assert end_line(failures, ended) == "cnnpar: rank 2 failed first (exit code 2); torchrun ended the job"
    # a rank killed from outside (the OOM killer) failed by itself
    failures[3] = _failure(-signal.SIGKILL, 14, timestamp=99)
    assert end_line(failures, ended) == "cnnpar: rank 3 failed first (killed by SIGKILL); torchrun ended the job"

    # rank 0 timed out; rank 1 did not answer torchrun's SIGTERM: the stuck one
    ended.killed = {12}
    failures = {0: _failure(EXIT_COLLECTIVE_TIMED_OUT, 10), 1: _failure(-signal.SIGKILL, 12, timestamp=130)}
    assert end_line(failures, ended) == (
        "cnnpar: rank 0 timed out waiting for another rank (--timeout-s); rank 1 did not answer torchrun's SIGTERM "
        "and had to be killed (SIGKILL): stuck or stopped; torchrun ended the job"
    )
    # rank 1 died of torchrun's SIGTERM: stuck or not, the launcher cannot tell
    ended.killed = set()
    failures[1] = _failure(-signal.SIGTERM, 12)
    assert end_line(failures, ended) == (
        "cnnpar: rank 0 timed out waiting for another rank (--timeout-s); the launcher cannot tell which rank stopped "
        "responding (rank 1, which torchrun's SIGTERM ended, or a rank on another node); torchrun ended the job"
    )
    # this node's ranks only lost their peer: the rank that ended is another node's
    failures = {2: _failure(EXIT_ANOTHER_RANK_ENDED, 20), 3: _failure(EXIT_ANOTHER_RANK_ENDED, 21)}
    assert end_line(failures, EndedByTorchrun()) == (
        "cnnpar: ranks 2, 3 stopped because another rank of the job ended, and no rank of this node failed by "
        "itself: its error is in another node's log; torchrun ended the job"
    )


def test_a_stuck_rank_is_named_whether_torchrun_lists_the_workers_it_ended_or_not():
    """torch 2.5 lists among the failures only the workers that failed before torchrun ended the others, so the
    stuck rank it killed was missing, known by its pid alone, and the launcher said it "cannot tell which rank
    stopped responding"; a recent torch lists it, killed by SIGKILL. Both accounts name rank 1."""
    from cnnpar.errors import EXIT_COLLECTIVE_TIMED_OUT
    from cnnpar.torchrun import EndedByTorchrun, end_line

    named = (
        "cnnpar: rank 0 timed out waiting for another rank (--timeout-s); rank 1 did not answer torchrun's SIGTERM "
        "and had to be killed (SIGKILL): stuck or stopped; torchrun ended the job"
    )
    ended = EndedByTorchrun()
    ended.signalled, ended.killed, ended.ranks = {12}, {12}, {12: 1}  # rank 1 read from its environment
    recent = {0: _failure(EXIT_COLLECTIVE_TIMED_OUT, 10), 1: _failure(-signal.SIGKILL, 12, timestamp=130)}
    torch_2_5 = {0: _failure(EXIT_COLLECTIVE_TIMED_OUT, 10)}
    assert end_line(recent, ended) == named
    assert end_line(torch_2_5, ended) == named
    # rank 1 died of torchrun's SIGTERM: under torch 2.5 too, the launcher says which rank it ended
    ended.killed = set()
    assert end_line(torch_2_5, ended) == (
        "cnnpar: rank 0 timed out waiting for another rank (--timeout-s); the launcher cannot tell which rank stopped "
        "responding (rank 1, which torchrun's SIGTERM ended, or a rank on another node); torchrun ended the job"
    )


@pytest.mark.skipif(not Path("/proc/self/environ").is_file(), reason="reads a worker's rank from Linux's /proc")
def test_the_launcher_reads_the_rank_of_a_worker_torchrun_names_from_that_workers_environment():
    import logging
    import os
    import subprocess
    import sys

    from cnnpar.torchrun import TORCHRUN_PROCESS_LOGGER, EndedByTorchrun

    # the worker says it started: until its exec, /proc/PID/environ is the parent's, without RANK (a CI run read it so)
    worker = subprocess.Popen(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
        env={**os.environ, "RANK": "7", "LOCAL_RANK": "1"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout.readline().strip() == "up"
        ended = EndedByTorchrun()
        msg, args = "Unable to shutdown process %s via %s, forcefully exiting via %s", (worker.pid, 15, 9)
        assert ended.filter(logging.LogRecord(TORCHRUN_PROCESS_LOGGER, logging.WARNING, "api.py", 1, msg, args, None))
        assert (ended.killed, ended.ranks) == ({worker.pid}, {worker.pid: 7})
    finally:
        worker.kill()
        worker.wait()
        worker.stdout.close()


def test_the_launcher_reads_torchruns_own_words_for_the_workers_it_ends():
    """torchrun's log lines are how the launcher learns which workers it signalled and killed: held to this torch's
    words, and read from a record as torchrun makes it."""
    import inspect
    import logging

    from torch.distributed.elastic.multiprocessing import api

    from cnnpar.torchrun import SENT_SIGTERM, TORCHRUN_PROCESS_LOGGER, UNANSWERED_SIGTERM, EndedByTorchrun

    assert api.logger.name == TORCHRUN_PROCESS_LOGGER
    source = inspect.getsource(api.SubprocessContext._close)
    assert f'"{SENT_SIGTERM} %s closing signal %s"' in source
    assert f'"{UNANSWERED_SIGTERM} %s via %s, forcefully exiting via %s"' in source
    ended = EndedByTorchrun()
    for msg, args in (
        ("Sending process %s closing signal %s", (41, "SIGTERM")),
        ("Unable to shutdown process %s via %s, forcefully exiting via %s", (41, signal.SIGTERM, signal.SIGKILL)),
        ("Sending process %s closing signal %s", (42, "SIGTERM")),
    ):
        record = logging.LogRecord(TORCHRUN_PROCESS_LOGGER, logging.WARNING, "api.py", 1, msg, args, None)
        assert ended.filter(record)  # every record kept: torchrun's lines print as they did
    assert (ended.signalled, ended.killed) == ({41, 42}, {41})


def test_torchrun_leaves_no_log_folder_and_its_workers_output_stays_on_the_console(tmp_path):
    """Every `cnnpar train --nproc N` left a torchelastic_* folder in /tmp, its end normal or not (torch elastic's
    default log folder, made per job and never removed: 1,551 of them on the audit's machine). Its --log-dir must
    not take the workers' output off the console, nor change the failure's one line."""
    import sys

    from tests.conftest import run_cmd

    temp = tmp_path / "tmp"
    temp.mkdir()
    worker = tmp_path / "worker.py"
    worker.write_text(
        "import os, sys\n"
        "print('out of the worker', flush=True)\n"
        "print('err of the worker', file=sys.stderr, flush=True)\n"
        "sys.exit(int(os.environ.get('FAIL', '0')))\n"
    )
    torchrun = [sys.executable, "-m", "cnnpar.torchrun", "--standalone", "--nproc_per_node=1", str(worker)]
    ok = run_cmd(torchrun, tmp_path, TMPDIR=str(temp))
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert ok.stdout.splitlines() == ["out of the worker"]
    assert "err of the worker" in ok.stderr.splitlines()
    failed = run_cmd(torchrun, tmp_path, TMPDIR=str(temp), FAIL="5")
    assert failed.returncode == 1
    assert failed.stdout.splitlines() == ["out of the worker"]
    assert failed.stderr.splitlines()[-1] == "cnnpar: rank 0 failed first (exit code 5); torchrun ended the job"
    assert "err of the worker" in failed.stderr.splitlines()
    assert [p.name for p in temp.iterdir() if not p.name.startswith("torchinductor_")] == []


def test_a_launch_removes_the_folder_of_a_launch_killed_outright(tmp_path, monkeypatch):
    """A SIGKILLed `cnnpar train --nproc N` left its cnnpar-launch-* folder (the run-folder note) in /tmp for good:
    its TemporaryDirectory's clean-up never ran."""
    import os

    from cnnpar import cli
    from cnnpar.torchrun import RUN_DIR_NOTE_ENV
    from tests.conftest import dead_process_folder

    dead = dead_process_folder(tmp_path, monkeypatch, "cnnpar-launch-")
    (dead / "run_dir").write_text("runs/killed")
    notes: list[Path] = []
    monkeypatch.setattr(dist, "run_launcher", lambda cmd, env: notes.append(Path(env[RUN_DIR_NOTE_ENV]).parent) or 0)
    assert cli.main(["train", "--nproc", "1", "--device", "cpu", "--out-dir", str(tmp_path / "runs")]) == 0
    assert not dead.exists()
    assert notes[0].name.startswith(f"cnnpar-launch-{os.getpid()}-") and not notes[0].exists()


def test_torchruns_own_timer_join_error_is_quiet_and_every_other_dropped_error_is_not():
    """CI at 7b212ed: a stopped --nproc run printed torch elastic's "Exception ignored ... cannot join current thread"
    traceback (its rendezvous timer's finalizer run on the timer's own thread) above the launcher's stop line."""
    import sys
    from types import SimpleNamespace

    from cnnpar.torchrun import quiet_rendezvous_timer_join

    def dropped(filename: str, message: str):
        code = compile(f"def _stop_thread():\n    raise RuntimeError({message!r})\n", filename, "exec")
        space: dict = {}
        exec(code, space)
        try:
            space["_stop_thread"]()
        except RuntimeError:
            kind, value, tb = sys.exc_info()
        return SimpleNamespace(exc_type=kind, exc_value=value, exc_traceback=tb, err_msg=None, object=None)

    seen = []
    hook = quiet_rendezvous_timer_join(seen.append)
    torch_timer = "/site-packages/torch/distributed/elastic/rendezvous/utils.py"
    hook(dropped(torch_timer, "cannot join current thread"))
    assert seen == []
    other_file, other_error = dropped("/x/mine.py", "cannot join current thread"), dropped(torch_timer, "other")
    hook(other_file)
    hook(other_error)
    assert seen == [other_file, other_error]


@pytest.fixture
def apple_gpu(monkeypatch):
    """A Mac with an Apple GPU: MPS there, no CUDA."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    from cnnpar.bench.trial import PARENT_ENV

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", dist.DEBUG_ENV, PARENT_ENV):
        monkeypatch.delenv(name, raising=False)


def test_auto_on_a_mac_says_once_that_the_apple_gpu_is_not_used(apple_gpu, capsys):
    """--device auto trained on the CPU of a Mac without a word about the Apple GPU beside it."""
    assert dist.init_distributed("auto").device == torch.device("cpu")
    err = capsys.readouterr().err
    assert err.count("Apple GPU (MPS)") == 1 and "--device auto runs on the CPU" in err
    assert dist.init_distributed("cpu").device == torch.device("cpu")  # asked for: nothing to say
    assert capsys.readouterr().err == ""


def test_the_apple_gpu_note_is_left_to_rank_0(apple_gpu, capsys):
    dist._say_apple_gpu_unused("auto", 1)  # what init_distributed does on torchrun's rank 1
    assert capsys.readouterr().err == ""
    dist._say_apple_gpu_unused("auto", 0)
    assert "Apple GPU (MPS)" in capsys.readouterr().err


def test_no_apple_gpu_note_without_one_or_with_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert dist.apple_gpu_note("auto") == ""
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert dist.apple_gpu_note("auto") == ""


def test_of_two_ranks_failing_at_once_the_first_ranks_note_is_said(tmp_path, monkeypatch):
    """Two ranks past the check that no note is there yet, each writing its own: the rename let the last one's
    replace the first's, so the launcher said the second error where its docstring promises the first."""
    import argparse
    import json

    from cnnpar import cli
    from cnnpar.errors import UserError
    from cnnpar.report import files
    from cnnpar.torchrun import failure_note

    note = tmp_path / "run_dir"
    monkeypatch.setenv(cli.RUN_DIR_NOTE_ENV, str(note))
    monkeypatch.setenv("WORLD_SIZE", "2")
    args = argparse.Namespace()
    create_temp = files._create_temp

    def rank_1_writes_first(folder, name):  # rank 0 past its check, as rank 1 writes its whole note
        monkeypatch.setattr(files, "_create_temp", create_temp)
        monkeypatch.setenv("RANK", "1")
        cli.say_the_failure_to_the_launcher(UserError("photos/cat/113.jpg: cannot decode as an image"), args, False)
        monkeypatch.setenv("RANK", "0")
        return create_temp(folder, name)

    monkeypatch.setattr(files, "_create_temp", rank_1_writes_first)
    monkeypatch.setenv("RANK", "0")
    cli.say_the_failure_to_the_launcher(UserError("the loss is nan at epoch 2"), args, False)
    said = json.loads(failure_note(note).read_text())
    assert said["line"] == "[rank 1] photos/cat/113.jpg: cannot decode as an image"
    assert [p.name for p in tmp_path.iterdir()] == [failure_note(note).name]  # no temp left behind


def test_a_ranks_out_of_memory_before_any_epoch_starts_again_with_half_the_batch(tmp_path):
    """Rank 0 out of memory in epoch 1 (`--nproc 1`, or every rank at one step) removes its folder: the launcher's
    line said to start it again with the command that started it, which runs out of memory again, where a resume's
    line adds half the batch and twice the accumulation."""
    import json

    from cnnpar import cli
    from cnnpar.torchrun import failure_note, memory_full_note

    folder = tmp_path / "runs" / "m"  # removed with the run, as one that failed before any epoch is
    note = tmp_path / "run_dir"
    note.write_text(str(folder))
    memory_full_note(note).write_text(" --batch-size 16 --grad-accum 2")
    line = "the training step ran out of memory: batch 32/process"
    failure_note(note).write_text(json.dumps({"line": line, "add_kept": True}))
    assert cli.launch_failure_lines(note, 1) == (
        f"cnnpar: error: {line}",
        f"stopped before an epoch was saved: nothing to resume in {folder}; start it again with the command that "
        "started it and --batch-size 16 --grad-accum 2 in place of its own, without --resume (no config.toml there)",
    )
    folder.mkdir(parents=True)  # kept with its config.toml (another rank's error): --resume auto, as before
    (folder / "config.toml").write_text("")
    assert cli.launch_failure_lines(note, 2)[1] == (
        f"stopped: {folder} has no finished epoch; start it again from epoch 1 with: cnnpar train --resume auto "
        f"--name m --out-dir {tmp_path / 'runs'} --nproc 2 --batch-size 16 --grad-accum 2"
    )
