"""--name is one folder inside --out-dir; a run folder is a run's, never the data's nor a stranger's; and a path
the run's config.toml cannot hold is refused before anything is made."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from cnnpar.config import Config, DataConfig, RunConfig
from cnnpar.dist import DistInfo
from cnnpar.engine.rundir import resolve_run
from cnnpar.errors import ConfigError, UserError
from tests.conftest import main_in

pytestmark = pytest.mark.usefixtures("one_thread")

CPU_INFO = DistInfo(0, 0, 1, torch.device("cpu"))
TINY = (
    "--data synthetic --image-shape 1x8x8 --synthetic-samples 64 --epochs 1 --max-steps 1 --workers 0 --no-progress"
).split()


@pytest.fixture
def in_process(monkeypatch, capsys):
    """`cnnpar ARGS` run in this process in folder `cwd` (each test's work is a refusal or a one-step train: none
    needs a process of its own): the exit code and what it printed, as a finished subprocess gives them."""

    def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
        return main_in(cwd, monkeypatch, capsys, args)

    return _run


@pytest.mark.parametrize("name", ["..", ".", "../escape", "x/../../y", "a/b", "/abs", "nul\0byte", "a" * 256])
def test_a_name_that_is_not_one_folder_name_is_refused(name):
    with pytest.raises(ConfigError, match=r"run\.name \(--name\) = .*: .*expected .*folder name"):
        RunConfig(name=name)


@pytest.mark.parametrize("name", ['my run, "x"', "é" * 127, " lead", "-dash", "a" * 255])
def test_odd_but_single_folder_names_stand(name):
    assert RunConfig(name=name).name == name


def test_train_with_name_dotdot_writes_nothing_outside_out_dir(tmp_path, in_process):
    (tmp_path / "work").mkdir()
    before = sorted(p.name for p in (tmp_path / "work").iterdir())
    for name in ("..", "../escape", "x/../../y", "é" * 130):
        r = in_process(["train", *TINY, "--out-dir", "runs", "--name", name], tmp_path / "work")
        assert r.returncode == 2, r.stderr
        assert r.stderr.strip().count("\n") == 0 and "--name" in r.stderr and "Traceback" not in r.stderr
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]


def test_a_folder_that_holds_files_but_no_run_is_refused_and_an_empty_one_is_used(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("mine\n")
    (tmp_path / "empty").mkdir()
    for resume in ("", "auto"):
        cfg = Config(run=RunConfig(out_dir=str(tmp_path), name="notes", resume=resume))
        with pytest.raises(UserError, match=r"notes: a folder that holds files but no run .*expected a new --name"):
            resolve_run(cfg, CPU_INFO)
    assert resolve_run(Config(run=RunConfig(out_dir=str(tmp_path), name="empty")), CPU_INFO) == (
        tmp_path / "empty",
        None,
    )


def test_a_run_folder_that_is_inside_or_holds_the_data_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "imgs" / "a").mkdir(parents=True)
    (tmp_path / "runs" / "r").mkdir(parents=True)
    (tmp_path / "runs" / "r" / "d.csv").write_text("label,pixel0\n0,1\n")
    cases = (
        ("imgs", ".", "imgs", "is the --data imgs"),
        ("imgs", "imgs", "r", "is inside the --data imgs"),
        ("runs/r/d.csv", "runs", "r", "holds the --data runs/r/d.csv"),
    )
    for source, out_dir, name, said in cases:
        cfg = Config(data=DataConfig(source=source), run=RunConfig(out_dir=out_dir, name=name))
        with pytest.raises(UserError, match=f"the run folder {said}: a run's files would be read as data"):
            resolve_run(cfg, CPU_INFO)


def test_the_data_folder_is_never_written_into_by_train(tmp_path, in_process):
    from PIL import Image

    for c in "ab":
        (tmp_path / "imgs" / c).mkdir(parents=True)
        for i in range(4):
            Image.new("L", (8, 8), 40 * i).save(tmp_path / "imgs" / c / f"{i}.png")
    r = in_process(["train", "--data", "imgs", "--epochs", "1", "--workers", "0", "--no-progress", "--out-dir", ".",
                 "--name", "imgs"], tmp_path)  # fmt: skip
    assert r.returncode == 2 and "the run folder is the --data imgs" in r.stderr, r.stderr
    assert sorted(p.name for p in (tmp_path / "imgs").iterdir()) == ["a", "b"]


@pytest.mark.skipif(sys.platform != "linux", reason="a file name that is not UTF-8: Linux takes any bytes")
def test_a_path_that_is_not_utf8_is_refused_before_the_run_folder_is_made(tmp_path, in_process):
    latin = "caf\udce9"  # b"caf\xe9" as the OS hands it over
    for flag, value, field in (("--name", latin, "run.name"), ("--out-dir", latin, "run.out_dir")):
        args = ["train", *TINY, "--out-dir", "runs", "--name", "r"]
        args[args.index(flag) + 1] = value
        r = in_process(args, tmp_path)
        assert r.returncode == 2, r.stderr
        assert f"{field} ({flag}) = 'caf\\xe9': not UTF-8" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / latin).mkdir()
    with pytest.raises(UserError, match=r"data\.source \(--data\) = '.*caf\\xe9': not UTF-8"):
        resolve_run(
            Config(data=DataConfig(source=str(tmp_path / latin)), run=RunConfig(out_dir=str(tmp_path))), CPU_INFO
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == [latin]  # no runs/ made


def test_a_run_named_a_slash_b_before_names_were_checked_still_resumes(tmp_path, in_process):
    r = in_process(["train", *TINY, "--out-dir", "runs/a", "--name", "b"], tmp_path)
    assert r.returncode == 0, r.stderr
    record = tmp_path / "runs" / "a" / "b" / "config.toml"
    text = record.read_text()
    assert 'out_dir = "runs/a"\nname = "b"' in text
    record.write_text(text.replace('out_dir = "runs/a"\nname = "b"', 'out_dir = "runs"\nname = "a/b"'))
    r = in_process(["train", "--resume", "runs/a/b", "--epochs", "2", "--workers", "0", "--no-progress"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "(epoch 2, resumed)" in r.stdout + r.stderr
    assert Path(tmp_path / "runs" / "a" / "b" / "ckpt" / "last.pt").is_file()


def test_commands_printed_for_pasting_quote_a_path_with_spaces_and_quotes(tmp_path, in_process):
    """`cnnpar train --resume runs sp/my run` pasted resumed `runs` with `sp/my` and `run` left over."""
    import shlex

    from PIL import Image

    from cnnpar.cli import launch_end_line
    from cnnpar.engine.checkpoint import kept_after_failed_write, require_checkpoint
    from cnnpar.engine.rundir import no_checkpoint_there
    from cnnpar.engine.trainer import Trainer

    r = in_process(["train", *TINY, "--out-dir", "runs dir", "--name", "my 'run'"], tmp_path)
    assert r.returncode == 0, r.stderr
    run_dir = tmp_path / "runs dir" / "my 'run'"
    assert "--logdir 'runs dir')" in r.stdout + r.stderr  # installed or not, the line names the command
    quoted = shlex.quote(str(run_dir))
    note = tmp_path / "note"
    note.write_text(str(run_dir))
    assert launch_end_line(note, 2).endswith(f"continue with: cnnpar train --resume {quoted} --nproc 2")
    assert kept_after_failed_write(run_dir / "ckpt" / "last.pt").endswith(f"which --resume {quoted} continues")
    stopping = SimpleNamespace(run_dir=run_dir, cfg=Config(), info=CPU_INFO)
    assert Trainer._continue_command(stopping) == f"cnnpar train --resume {quoted}"

    (run_dir / "ckpt" / "last.pt").unlink()  # only best.pt left: predict names the file to read instead
    with pytest.raises(
        UserError, match=f"expected --checkpoint {re.escape(shlex.quote(str(run_dir / 'ckpt' / 'best.pt')))} to"
    ):
        require_checkpoint(run_dir)
    (run_dir / "ckpt" / "best.pt").unlink()  # a run stopped before its first checkpoint: its config.toml stays
    again = f"--resume auto --name {shlex.quote(run_dir.name)} --out-dir {shlex.quote(str(run_dir.parent))}, which"
    assert again in str(no_checkpoint_there(str(run_dir)))

    for c in "ab":
        (tmp_path / "im" / c).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (8, 8), (40 * i, 0, 0)).save(tmp_path / "im" / c / f"{i}.png")
    r = in_process(["prepare", "im", "--out", 'st ore, "q".cnnpar', "--no-progress"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "train with: cnnpar train --data 'st ore, \"q\".cnnpar'" in r.stdout


@pytest.mark.skipif(sys.platform != "linux", reason="a file name that is not UTF-8: Linux takes any bytes")
def test_a_resume_of_a_run_moved_to_a_folder_that_is_not_utf8_is_refused_and_leaves_its_record(tmp_path, in_process):
    r = in_process(["train", *TINY, "--out-dir", "runs", "--name", "r"], tmp_path)
    assert r.returncode == 0, r.stderr
    moved = tmp_path / "runs" / "caf\udce9"
    (tmp_path / "runs" / "r").rename(moved)
    record = (moved / "config.toml").read_bytes()
    r = in_process(["train", "--resume", str(moved), "--epochs", "2", "--workers", "0", "--no-progress"], tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "run.out_dir (--out-dir) = '" not in r.stderr and "(--name)" not in r.stderr  # neither was typed
    assert f"--resume {tmp_path}/runs/caf\\xe9: its run folder" in r.stderr and "caf\\xe9 is not UTF-8" in r.stderr
    assert (moved / "config.toml").read_bytes() == record


def test_an_empty_name_typed_is_refused_in_one_line(tmp_path, in_process):
    """`--name ""` trained under a new default name without a word ('' is the default name only in a file)."""
    r = in_process(["train", *TINY, "--out-dir", "runs", "--name", ""], tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (
        "cnnpar: error: run.name (--name) = '': expected one folder name inside --out-dir (leave --name out for a "
        "new default name)"
    )
    assert list(tmp_path.iterdir()) == []


def test_an_empty_resume_typed_is_refused_in_one_line(tmp_path, in_process):
    """`--resume ""` (an unset shell variable) trained a new run under a new default name without a word."""
    r = in_process(["train", *TINY, "--out-dir", "runs", "--resume", ""], tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (
        "cnnpar: error: run.resume (--resume) = '': expected a run folder, a checkpoint file or 'auto' (leave "
        "--resume out for a new run)"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_resumed_run_folder_moved_into_its_data_folder_is_refused(tmp_path, monkeypatch):
    """--resume RUN wrote its checkpoint, config.toml and metrics into the image folder it had been moved into."""
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "imgs" / "r"
    (run_dir / "ckpt").mkdir(parents=True)
    (run_dir / "config.toml").write_text('[data]\nsource = "imgs"\n')
    torch.save({"epoch": 1}, run_dir / "ckpt" / "last.pt")
    cfg = Config(data=DataConfig(source="imgs"), run=RunConfig(resume="imgs/r"))
    with pytest.raises(UserError, match=r"imgs/r: the run folder is inside the --data imgs: .* moved out of the data"):
        resolve_run(cfg, CPU_INFO)


def test_a_run_stopped_before_its_first_checkpoint_says_how_it_starts_again(tmp_path):
    from cnnpar.engine.rundir import no_checkpoint_there, stopped_line

    run_dir = tmp_path / "runs" / "x"
    (run_dir / "ckpt").mkdir(parents=True)
    (run_dir / "config.toml").write_text("")
    again = f"--resume auto --name x --out-dir {tmp_path / 'runs'}"
    assert stopped_line(run_dir, 0, f"cnnpar train --resume {run_dir} --nproc 2") == (
        f"stopped: {run_dir} has no finished epoch; start it again from epoch 1 with: cnnpar train {again} --nproc 2"
    )
    assert str(no_checkpoint_there(str(run_dir))) == (
        f"--resume {run_dir}: {run_dir} has no finished epoch (stopped before its first checkpoint), so nothing to "
        f"continue: expected {again}, which starts it again from epoch 1 with its config.toml"
    )


def test_resume_auto_of_a_run_stopped_before_its_first_checkpoint_says_it_starts_from_epoch_1(tmp_path, in_process):
    r = in_process(["train", *TINY, "--out-dir", "runs", "--name", "x"], tmp_path)
    assert r.returncode == 0, r.stderr
    for kept in ("last.pt", "best.pt"):  # as a run stopped in its first epoch leaves it: config.toml, no checkpoint
        (tmp_path / "runs" / "x" / "ckpt" / kept).unlink()
    r = in_process(["train", "--resume", "auto", "--name", "x", "--out-dir", "runs", "--workers", "0"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "resume auto: runs/x has no finished epoch: starting it from epoch 1" in r.stdout + r.stderr
    assert "epoch 1/1" in r.stdout + r.stderr


@pytest.mark.parametrize("out_dir", ["x" * 300, "/".join(["y" * 200] * 20)])
def test_an_out_dir_longer_than_the_system_takes_is_refused_before_anything_is_made(tmp_path, out_dir, in_process):
    for resume in ("", "auto"):
        args = ["train", *TINY, "--out-dir", out_dir, "--name", "r"] + (["--resume", resume] if resume else [])
        r = in_process(args, tmp_path)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("cnnpar: error: run.out_dir (--out-dir) = '")
        assert ("255 bytes" if len(out_dir) == 300 else "path limit is 4096") in r.stderr
    assert list(tmp_path.iterdir()) == []
