"""Run folders: unique default names, what a mid-run input error leaves behind, and one run at a time in each."""

from __future__ import annotations

import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch.utils.data import Dataset

from cnnpar.config import Config, DataConfig, ModelConfig, RunConfig, SpeedConfig
from cnnpar.data.bundle import DataBundle
from cnnpar.dist import DistInfo
from cnnpar.engine.checkpoint import checkpoint_epoch
from cnnpar.engine.rundir import (
    RunFolderInUse,
    default_name,
    refuse_a_live_run,
    resolve_run,
    run_folder_held,
)
from cnnpar.engine.trainer import Trainer
from cnnpar.errors import DataError, UserError
from tests.conftest import cli_env

pytestmark = pytest.mark.usefixtures("one_thread")  # the runs below train in this process (one beside a subprocess)

CPU_INFO = DistInfo(0, 0, 1, torch.device("cpu"))


def test_default_names_never_collide_with_an_existing_folder(tmp_path):
    cfg = Config(run=RunConfig(out_dir=str(tmp_path)))
    first = default_name(cfg)
    (tmp_path / first).mkdir()
    second = default_name(cfg)  # same second: gets a suffix; next second: a new stamp
    assert second != first and second.startswith("cnn3-")


def test_a_named_run_with_a_checkpoint_is_not_overwritten(tmp_path):
    (tmp_path / "r" / "ckpt").mkdir(parents=True)
    (tmp_path / "r" / "ckpt" / "last.pt").write_bytes(b"x")
    cfg = Config(run=RunConfig(out_dir=str(tmp_path), name="r"))
    with pytest.raises(UserError, match="already holds a run with a checkpoint: pass --resume auto"):
        resolve_run(cfg, CPU_INFO)
    with pytest.raises(UserError, match="--resume .*nothing: no checkpoint there"):
        resolve_run(Config(run=RunConfig(resume=str(tmp_path / "nothing"))), CPU_INFO)


def test_resume_names_the_run_folder_whichever_path_is_given(tmp_path):
    (tmp_path / "r" / "ckpt").mkdir(parents=True)
    (tmp_path / "r" / "config.toml").write_text("[run]\n")
    ckpt = tmp_path / "r" / "ckpt" / "last.pt"
    ckpt.write_bytes(b"x")
    (tmp_path / "link.pt").symlink_to(ckpt)  # a link to a run's checkpoint continues that run, in its folder
    for given in (tmp_path / "r", tmp_path / "r" / "ckpt", ckpt, tmp_path / "link.pt"):
        run_dir, found = resolve_run(Config(run=RunConfig(resume=str(given))), CPU_INFO)
        assert (run_dir, found) == (tmp_path / "r", ckpt), given


def test_a_loose_checkpoint_is_refused_its_folder_never_becomes_a_run_folder(tmp_path):
    """`--resume model.pt` made model.pt's folder the run folder: the user's own metrics.csv there was written
    over, and with no config.toml to say otherwise the run went on with the default data."""
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "model.pt").write_bytes(b"x")
    (tmp_path / "proj" / "metrics.csv").write_text("mine\n")
    (tmp_path / "r" / "ckpt").mkdir(parents=True)  # a ckpt/ folder without the run's config.toml beside it
    (tmp_path / "r" / "ckpt" / "last.pt").write_bytes(b"x")
    for given in (tmp_path / "proj" / "model.pt", tmp_path / "r"):
        with pytest.raises(UserError, match=r"is not in a run folder \(RUN/ckpt/.* beside RUN/config\.toml\)"):
            resolve_run(Config(run=RunConfig(resume=str(given))), CPU_INFO)
    assert sorted(p.name for p in (tmp_path / "proj").iterdir()) == ["metrics.csv", "model.pt"]


class BreaksAfter(Dataset):
    """Good samples until `limit` reads, then the kind of error a corrupt file raises in a worker."""

    def __init__(self, n: int, limit: int) -> None:
        self.n, self.limit, self.reads = n, limit, 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        self.reads += 1
        if self.reads > self.limit:
            raise DataError(f"photos/bad{i}.jpg: cannot decode as an image")
        return torch.full((1, 8, 8), i % 2 * 200, dtype=torch.uint8), torch.tensor(i % 2)


class AnotherRunStartsThenBreaks(BreaksAfter):
    """As BreaksAfter, but a second run's folder appears beside this one before the error: two runs
    started at once under a new runs/, or one started while this one was loading."""

    def __init__(self, n: int, limit: int, other: Path) -> None:
        super().__init__(n, limit)
        self.other = other

    def __getitem__(self, i: int):
        if self.reads == self.limit:
            (self.other / "ckpt").mkdir(parents=True)
        return super().__getitem__(i)


def _trainer(tmp_path, limit: int, epochs: int, data: Dataset | None = None) -> Trainer:
    bundle = DataBundle(data or BreaksAfter(32, limit), None, (1, 8, 8), 2, (0.5,), (0.5,), "test")
    cfg = Config(
        data=DataConfig(workers=0),
        model=ModelConfig(name="cnn3"),
        speed=SpeedConfig(device="cpu", precision="fp32"),
        run=RunConfig(epochs=epochs, batch_size=8, out_dir=str(tmp_path / "runs"), name="r", progress=False),
    )
    return Trainer(cfg, CPU_INFO, bundle=bundle, log=lambda *a, **k: None)


def test_input_error_in_the_first_epoch_removes_the_new_run_folder(tmp_path):
    with pytest.raises(DataError, match="bad"):
        _trainer(tmp_path, limit=10, epochs=2).fit()
    assert not (tmp_path / "runs").exists()


def test_input_error_in_the_first_epoch_keeps_a_parent_that_another_run_made_its_folder_in(tmp_path):
    other = tmp_path / "runs" / "other"
    with pytest.raises(DataError, match="bad"):
        _trainer(tmp_path, limit=10, epochs=2, data=AnotherRunStartsThenBreaks(32, 10, other)).fit()
    assert not (tmp_path / "runs" / "r").exists()  # this run's own folder: removed
    assert (other / "ckpt").is_dir()  # the other run's: kept, and so runs/, though this run made it


def test_input_error_after_a_finished_epoch_keeps_the_run_and_its_checkpoint(tmp_path):
    with pytest.raises(DataError):
        _trainer(tmp_path, limit=40, epochs=3).fit()  # epoch 1 reads 32 samples, epoch 2 fails
    run = tmp_path / "runs" / "r"
    assert (run / "ckpt" / "last.pt").is_file() and (run / "metrics.csv").is_file()


def test_a_run_folder_refuses_another_data_set_but_not_the_same_file_spelt_differently(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.csv").write_text("label,pixel0\n0,1\n")
    (tmp_path / "runs" / "r").mkdir(parents=True)
    (tmp_path / "runs" / "r" / "config.toml").write_text('[data]\nsource = "./d.csv"\n')
    run = RunConfig(out_dir="runs", name="r", resume="auto")
    assert resolve_run(Config(data=DataConfig(source="d.csv"), run=run), CPU_INFO) == (Path("runs/r"), None)
    with pytest.raises(UserError, match=r"runs/r: holds a run on --data ./d.csv .*not digits: expected --data ./d.csv"):
        resolve_run(Config(run=run), CPU_INFO)


def test_resume_auto_without_a_name_is_refused_outside_torchrun_and_follows_torchruns_job_id(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    cfg = Config(run=RunConfig(out_dir=str(tmp_path), resume="auto"))
    with pytest.raises(UserError, match="--resume auto: no --name to find the run by"):
        resolve_run(cfg, CPU_INFO)
    assert not list(tmp_path.iterdir())
    # torchrun --standalone: a new random id for each launch, so no earlier launch's folder to find
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "3f1c2b9e-8d7a-4c6b-9e5f-0a1b2c3d4e5f")
    with pytest.raises(UserError, match="--resume auto: no --name to find the run by"):
        resolve_run(cfg, CPU_INFO)
    restarted = replace(CPU_INFO, attempt=1)  # its own restart finds the attempt before it
    assert resolve_run(cfg, restarted)[0] == tmp_path / "cnn3-3f1c2b9e-8d7"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job7")  # --rdzv-id=job7: the same id at every launch
    assert resolve_run(cfg, CPU_INFO) == (tmp_path / "cnn3-job7", None)


def test_the_nproc_launcher_refuses_resume_auto_without_a_name_before_starting_torchrun(tmp_path, capsys):
    from cnnpar.cli import main

    args = ["train", "--nproc", "2", "--resume", "auto", "--out-dir", str(tmp_path), "--device", "cpu"]
    assert main(args) == 2  # torchrun --standalone would give each launch a new job id, so a new folder
    err = capsys.readouterr().err.strip()
    assert (
        err == "cnnpar: error: --resume auto: no --name to find the run by (a run without one gets a new "
        "folder each time): expected --name NAME or --resume runs/NAME"
    )
    assert not list(tmp_path.iterdir())


def test_a_run_stopped_before_its_first_checkpoint_is_named_with_the_command_that_starts_it_again(tmp_path):
    (tmp_path / "runs" / "t1").mkdir(parents=True)
    (tmp_path / "runs" / "t1" / "config.toml").write_text("[run]\n")
    with pytest.raises(
        UserError, match=r"has no finished epoch .*: expected --resume auto --name t1 --out-dir .*runs, which"
    ):
        resolve_run(Config(run=RunConfig(resume=str(tmp_path / "runs" / "t1"))), CPU_INFO)


IN_USE = "a run is using this folder (a cnnpar train still running holds it"  # then ": pid N)"


def test_a_second_train_or_a_resume_is_refused_while_the_run_lives_and_a_killed_run_leaves_no_claim(
    tmp_path, monkeypatch, capsys
):
    """Two runs under one name both "succeeded": config.toml the second's, the checkpoint and metrics the first's,
    and a later --resume failed. A folder was taken as free until its first checkpoint existed. The refusal names
    the live run's pid: among runs a loop or a scheduler started, the one to wait for or stop."""
    from cnnpar.cli import main

    monkeypatch.chdir(tmp_path)
    small = ["train", "--device", "cpu", "--max-steps", "2", "--no-progress", "--no-tensorboard", "--workers", "0"]
    first = subprocess.Popen(
        [sys.executable, "-m", "cnnpar", *small, "--epochs", "500", "--name", "r"], cwd=tmp_path, env=cli_env(),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    run = tmp_path / "runs" / "r"
    try:
        deadline = time.monotonic() + 120
        while not (run / "ckpt" / "last.pt").exists():
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()
            time.sleep(0.05)
        record = (run / "config.toml").read_text()
        assert main([*small, "--epochs", "1", "--name", "r", "--seed", "2"]) == 2
        assert capsys.readouterr().err.strip() == f"cnnpar: error: runs/r: {IN_USE}: pid {first.pid}): expected " + (
            "that run to end or be stopped first, or another --name"
        )
        assert main([*small, "--epochs", "1", "--resume", "runs/r"]) == 2
        assert f"{IN_USE}: pid {first.pid})" in capsys.readouterr().err
        assert (run / "config.toml").read_text() == record  # the first run's, as it wrote it
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    more = str(checkpoint_epoch(run) + 1)
    assert main([*small, "--epochs", more, "--resume", "runs/r"]) == 0  # the killed run left no claim behind
    assert "resumed from" in capsys.readouterr().out


def idle_worker(started) -> None:
    started.set()
    time.sleep(60)


def test_a_run_folder_is_held_by_its_run_alone_not_by_the_processes_it_forks(tmp_path):
    """A forked DataLoader worker shares its parent's open files: had it kept the claim, a run killed with SIGKILL
    would stay claimed until its workers noticed and exited."""
    run = tmp_path / "r"
    named = Config(run=RunConfig(out_dir=str(tmp_path), name="r"))
    with run_folder_held(run, None, 0, CPU_INFO, lambda e: False):
        with pytest.raises(UserError, match=re.escape(f"{run}: {IN_USE}: pid {os.getpid()})")):
            resolve_run(named, CPU_INFO)
        started = multiprocessing.get_context("fork").Event()
        worker = multiprocessing.get_context("fork").Process(target=idle_worker, args=(started,), daemon=True)
        worker.start()
        assert started.wait(30)
    try:
        refuse_a_live_run(run)  # free once its run ends, while the worker it forked lives on
        assert resolve_run(named, CPU_INFO) == (run, None)
    finally:
        worker.kill()
        worker.join()


def test_a_claim_refuses_a_checkpoint_changed_since_it_was_read_and_removes_only_a_folder_it_made(tmp_path):
    run = tmp_path / "runs" / "r"
    with run_folder_held(run, None, 0, CPU_INFO, lambda e: True):
        with pytest.raises(RunFolderInUse), run_folder_held(run, None, 0, CPU_INFO, lambda e: True):
            pass
        assert run.is_dir()  # the refusal removes nothing: the folder is the other run's
    with pytest.raises(DataError), run_folder_held(run.parent / "new", None, 0, CPU_INFO, lambda e: True):
        raise DataError("photos/bad.jpg: cannot decode as an image")
    assert [p.name for p in run.parent.iterdir()] == ["r"]
    # a run that chose the folder as new, or read epoch 1, while another run held it and saved epoch 2
    (run / "ckpt").mkdir()
    torch.save({"epoch": 2}, run / "ckpt" / "last.pt")
    last = run / "ckpt" / "last.pt"
    for resumed, read in ((None, 0), (last, 1)):
        with pytest.raises(RunFolderInUse, match="another run changed its checkpoint while this one was starting"):
            with run_folder_held(run, resumed, read, CPU_INFO, lambda e: True):
                pass
    assert last.is_file()
    with run_folder_held(run, last, 2, CPU_INFO, lambda e: True):
        pass
    # a resume of another checkpoint file of the folder is checked against that file, not last.pt
    torch.save({"epoch": 1}, run / "ckpt" / "epoch1.pt")
    with run_folder_held(run, run / "ckpt" / "epoch1.pt", 1, CPU_INFO, lambda e: True):
        pass


def test_a_failed_first_epoch_removes_its_folder_before_it_lets_go_of_the_claim(tmp_path, monkeypatch):
    """The claim closed first, then the folder went: a run under the same name claiming it in between would have
    its folder removed under it."""
    from cnnpar.engine import rundir

    run, order = tmp_path / "r", []
    real_close, real_rmtree = os.close, shutil.rmtree
    monkeypatch.setattr(rundir.os, "close", lambda fd: (order.append("close"), real_close(fd))[1])
    monkeypatch.setattr(shutil, "rmtree", lambda p, **kw: (order.append("rmtree"), real_rmtree(p, **kw))[1])
    with pytest.raises(DataError), run_folder_held(run, None, 0, CPU_INFO, lambda e: True):
        raise DataError("photos/bad.jpg: cannot decode as an image")
    assert not run.exists() and order[0] == "rmtree" and "close" in order  # (rmtree closes descriptors of its own)


def test_a_resume_of_another_checkpoint_file_in_the_run_folder_is_not_taken_for_another_run(tmp_path):
    """`--resume runs/b/ckpt/epoch1.pt` was refused as "another run changed its checkpoint" once last.pt had moved
    on: the claim compared last.pt's epoch with the resumed file's."""
    from cnnpar.presets import with_overrides

    def fit(epochs: int, resume: str = "") -> None:
        cfg = with_overrides(
            Config(),
            data={"source": "digits", "workers": 0},
            speed={"device": "cpu", "precision": "fp32"},
            run={"epochs": epochs, "batch_size": 64, "max_steps": 1, "out_dir": str(tmp_path), "progress": False,
                 "tensorboard": False, **({"resume": resume} if resume else {"name": "b"})},
        )  # fmt: skip
        Trainer(cfg, CPU_INFO, log=lambda *a, **k: None).fit()

    fit(1)
    shutil.copy(tmp_path / "b" / "ckpt" / "last.pt", tmp_path / "b" / "ckpt" / "epoch1.pt")
    fit(2, str(tmp_path / "b"))
    fit(3, str(tmp_path / "b" / "ckpt" / "epoch1.pt"))
    assert checkpoint_epoch(tmp_path / "b") == 3


def test_a_rank_of_a_job_refuses_a_resume_its_disk_cannot_see_and_keeps_the_hint_of_a_run_not_yet_saved(tmp_path):
    """What each rank carries into the ranks' agreement before their settings (Trainer): no folder there says
    that every node must see it; a folder holding a config.toml and no checkpoint says how to start it again."""
    from cnnpar.engine.rundir import resume_unseen_here

    run = tmp_path / "r"
    assert resume_unseen_here(Config(run=RunConfig(resume=str(run)))).args == (
        f"--resume {run}: no checkpoint there; every node must see the run folder (--out-dir on a shared file system)",
    )
    run.mkdir()
    (run / "config.toml").write_text("")
    said = str(resume_unseen_here(Config(run=RunConfig(resume=str(run)))))
    assert said.startswith(f"--resume {run}: {run} has no finished epoch (stopped before its first checkpoint)"), said
    assert said.endswith(f"--resume auto --name r --out-dir {tmp_path}, which starts it again from epoch 1 with its "
                         "config.toml"), said  # fmt: skip
    assert resume_unseen_here(Config(run=RunConfig(resume="auto", name="r", out_dir=str(tmp_path)))) is None
    assert resume_unseen_here(Config()) is None


class _OneSecond:
    """The clock of two runs started within the same second."""

    @staticmethod
    def now():
        import datetime

        return datetime.datetime(2026, 1, 2, 3, 4, 5)


def _default_named_trainer(tmp_path, data: Dataset) -> Trainer:
    bundle = DataBundle(data, None, (1, 8, 8), 2, (0.5,), (0.5,), "test")
    cfg = Config(
        data=DataConfig(workers=0),
        model=ModelConfig(name="cnn3"),
        speed=SpeedConfig(device="cpu", precision="fp32"),
        run=RunConfig(epochs=1, batch_size=8, out_dir=str(tmp_path / "runs"), progress=False),
    )
    return Trainer(cfg, CPU_INFO, bundle=bundle, log=lambda *a, **k: None)


def test_two_runs_started_within_one_second_each_get_a_default_folder_of_their_own(tmp_path, monkeypatch):
    """Both name runs/cnn3-<time> when built; the first makes it at its claim. The second took the first's folder at
    its own claim, refused ("another run changed its checkpoint" or "a run is using this folder"); it makes -2."""
    import types

    from cnnpar.report import files

    monkeypatch.setattr(files, "_dt", types.SimpleNamespace(datetime=_OneSecond))
    first = _default_named_trainer(tmp_path, BreaksAfter(32, 10**9))
    second = _default_named_trainer(tmp_path, BreaksAfter(32, 10**9))
    assert first.run_dir == second.run_dir == tmp_path / "runs" / "cnn3-20260102-030405"  # named, not made
    assert not first.run_dir.exists()
    first.fit()
    assert second.fit().run_dir == tmp_path / "runs" / "cnn3-20260102-030405-2"
    assert checkpoint_epoch(first.run_dir) == checkpoint_epoch(second.run_dir) == 1
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["cnn3-20260102-030405", "cnn3-20260102-030405-2"]


def test_input_error_in_the_first_epoch_removes_the_new_default_folder(tmp_path):
    with pytest.raises(DataError, match="bad"):
        _default_named_trainer(tmp_path, BreaksAfter(32, 10)).fit()
    assert not (tmp_path / "runs").exists()
