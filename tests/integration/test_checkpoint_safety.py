"""What a stopped or damaged run leaves, and what a resume makes of it: SIGTERM (as `timeout` and schedulers send
it) keeps the finished epochs and says how to go on; a checkpoint that is not cnnpar's, damaged, or unsafe to
unpickle is refused in one line; what a killed save leaves behind is cleared; records that do not match the
checkpoint are written again from it."""

from __future__ import annotations

import io
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest
import torch

from cnnpar.cli import main
from cnnpar.report.files import read_csv
from tests.conftest import cli_env, run_cmd

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = ["train", "--device", "cpu", "--max-steps", "2", "--no-progress", "--no-tensorboard"]

# stops the run with SIGTERM half-way through epoch 2, as `timeout` would
STOPPED_IN_EPOCH_2 = """
import os, signal, sys
from cnnpar import cli
from cnnpar.engine import trainer
def stop(epoch, step, steps, info):
    if epoch == 2 and step == 1:
        os.kill(os.getpid(), signal.SIGTERM)
trainer.maybe_inject_fault = stop
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_a_stop_keeps_the_finished_epochs_says_how_to_go_on_and_the_resume_finishes(tmp_path, sig, monkeypatch):
    """SIGHUP (an SSH connection dropped, a terminal closed) ended the run at once, as a SIGKILL would: no line said
    what was kept or how to go on, and the exit status was a death by signal."""
    # the stopped run is a process of its own (a real signal and its exit status); the resume runs in this one
    args = [*SMALL, "--epochs", "3", "--name", "t"]
    # as a terminal's own process would, whatever this one's SIGHUP is (a suite run under nohup ignores it)
    script = f"import signal; signal.signal(signal.{sig}, signal.SIG_DFL)\n" + STOPPED_IN_EPOCH_2
    script = script.replace("signal.SIGTERM)", f"signal.{sig})")
    proc = subprocess.run(
        [sys.executable, "-c", script, *args], cwd=tmp_path, env=cli_env(), capture_output=True, text=True
    )
    run = tmp_path / "runs" / "t"
    assert proc.returncode == 128 + getattr(signal, sig), proc.stderr
    assert f"stopped: the checkpoint in {run.relative_to(tmp_path)} holds epoch 1; continue with: cnnpar train " in (
        proc.stdout
    )
    assert f"cnnpar: stopped ({sig})" in proc.stderr
    assert [r["epoch"] for r in read_csv(run / "metrics.csv")] == ["1"]
    assert json.loads((run / "summary.json").read_text())["finished"] is False
    assert not list((run / "ckpt").glob(".*.tmp"))
    monkeypatch.chdir(tmp_path)
    assert main([*SMALL, "--resume", "runs/t"]) == 0
    assert [r["epoch"] for r in read_csv(run / "metrics.csv")] == ["1", "2", "3"]


# SIGTERM delivered while a finaliser runs, as it came while torch's DataLoader iterator's __del__ joined its workers
# (or in logging's at-fork hook as a loader forked them): Python prints "Exception ignored in ..." and drops the raise
SIGTERM_IN_A_FINALISER = """
import os, signal, sys, time
from cnnpar import cli
from cnnpar.engine import trainer
class Finaliser:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler runs here: its Terminated goes nowhere
def stop(epoch, step, steps, info):
    if epoch == 2 and step == 1:
        Finaliser()
trainer.maybe_inject_fault = stop
sys.exit(cli.main(sys.argv[1:]))
"""


def test_a_sigterm_whose_raise_a_finaliser_dropped_still_stops_the_run(tmp_path):
    """`timeout 6.1 cnnpar train --workers 2 --no-persistent-workers --epochs 30`: the SIGTERM's Terminated was
    raised inside torch's finaliser and dropped, and the run trained all 30 epochs and ended `done:`, exit 0."""
    args = [*SMALL, "--epochs", "4", "--name", "f"]
    proc = run_cmd([sys.executable, "-c", SIGTERM_IN_A_FINALISER, *args], tmp_path, timeout=600)
    assert proc.returncode == 143, proc.stdout + proc.stderr
    assert "stopped: the checkpoint in runs/f holds epoch 1; continue with: cnnpar train --resume runs/f" in (
        proc.stdout
    )
    assert proc.stderr.splitlines() == ["cnnpar: stopped (SIGTERM)"]  # no "Exception ignored" traceback above it
    assert [r["epoch"] for r in read_csv(tmp_path / "runs" / "f" / "metrics.csv")] == ["1"]


@pytest.mark.skipif(shutil.which("timeout") is None, reason="needs coreutils' timeout")
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_a_stop_to_the_group_stops_the_run_and_its_loader_workers_leave_nothing(tmp_path, sig, stops_reach_children):
    """`timeout -s TERM` signals the whole process group: the DataLoader workers died of it (torch's handler), each
    left its pymp-* folder in /tmp, and their death could come up in place of the stop or over it. Signalled here once
    epoch 1's line is out (timeout hands a signal it gets on to the group, as at its limit), so the stop lands in epoch
    2 every time. A closing terminal sends its foreground group SIGHUP: it killed the run and its workers at once,
    with no line said."""
    # a TMPDIR of its own, short: the workers' sockets go in it, and a path past 107 bytes (tmp_path under xdist)
    # cannot be bound, which stalled the workers' first batch
    tmp = Path(tempfile.mkdtemp(prefix="cnnpar-"))
    train = ["train", "--device", "cpu", "--no-progress", "--no-tensorboard", "--data", "digits", "--resident", "off"]
    train += ["--workers", "2", "--batch-size", "64", "--epochs", "50", "--name", "g"]
    timeout = ["timeout", "-s", "TERM", "--preserve-status", "120", sys.executable, "-m", "cnnpar", *train]
    # each line as it is printed (torch's advice on a host with fewer cores than the 2 workers, 1 core, is silenced by
    # cnnpar's loader itself: none comes up in the stderr compared below)
    env = cli_env(TMPDIR=str(tmp), PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.Popen(
            timeout, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        out = ""
        for line in proc.stdout:
            out += line
            if line.startswith("epoch 1/"):
                proc.send_signal(getattr(signal, sig))
                break
        out += proc.stdout.read()  # (communicate() would miss what this file object has read ahead)
        err = proc.stderr.read()
        assert proc.wait(timeout=120) == 128 + getattr(signal, sig), out + err
        assert "stopped: the checkpoint in runs/g holds epoch" in out.splitlines()[-1], out
        assert err.splitlines() == [f"cnnpar: stopped ({sig})"]  # no worker's death, no "Exception ignored"
        assert not list(tmp.glob("pymp-*"))  # the workers left by themselves, their clean-up run
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _a_fault_in_epoch_2(monkeypatch, fault) -> None:
    from cnnpar.engine import trainer

    def inject(epoch, step, steps, info):
        if epoch == 2 and step == 1:
            fault()

    monkeypatch.setattr(trainer, "maybe_inject_fault", inject)


def test_a_worker_death_by_the_stop_under_exited_unexpectedly_ends_as_the_stop(tmp_path, monkeypatch, capsys):
    """`timeout 9.5 cnnpar train --workers 2`: torch raised "exited unexpectedly" from the workers' "is killed by
    signal: Terminated" (its __cause__), and the run ended in that traceback, with no stop line."""

    def workers_gone():
        try:
            raise RuntimeError("DataLoader worker (pid 25610) is killed by signal: Terminated. ")
        except RuntimeError as e:
            raise RuntimeError("DataLoader worker (pid(s) 25659) exited unexpectedly") from e

    _a_fault_in_epoch_2(monkeypatch, workers_gone)
    monkeypatch.chdir(tmp_path)
    assert main([*SMALL, "--epochs", "3", "--name", "u"]) == 128 + 15
    out, err = capsys.readouterr()
    assert "stopped: the checkpoint in runs/u holds epoch 1; continue with: cnnpar train --resume runs/u" in out
    assert err.splitlines() == ["cnnpar: stopped (SIGTERM)"]


def test_a_worker_crash_after_a_saved_epoch_says_the_epoch_is_kept_and_how_to_continue(tmp_path, monkeypatch, capsys):
    """A worker killed by the out-of-memory killer in epoch 2: the one line said what killed it, not that epoch 1 was
    kept, nor the command that continues (a stop's line says both)."""

    def killed():
        raise RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed. ")

    _a_fault_in_epoch_2(monkeypatch, killed)
    monkeypatch.chdir(tmp_path)
    assert main([*SMALL, "--epochs", "3", "--name", "k"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cnnpar: error: a data loader worker crashed (SIGKILL: Killed) while reading ")
    assert err.endswith("; the checkpoint in runs/k holds epoch 1; continue with: cnnpar train --resume runs/k\n")
    assert [r["epoch"] for r in read_csv(tmp_path / "runs" / "k" / "metrics.csv")] == ["1"]


@pytest.fixture
def trained(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([*SMALL, "--epochs", "2", "--name", "r"]) == 0
    return tmp_path / "runs" / "r"


def test_a_checkpoint_that_is_not_cnnpars_damaged_or_unsafe_is_refused_in_one_line(trained, capsys):
    ckpt = trained / "ckpt" / "last.pt"
    good = ckpt.read_bytes()
    before = {p.name: p.read_bytes() for p in trained.iterdir() if p.is_file()}
    resume = [*SMALL, "--epochs", "3", "--resume", str(trained)]

    torch.save(torch.nn.Linear(2, 2).state_dict(), ckpt)  # a plain state_dict: KeyError 'model' before
    assert main(resume) == 2
    assert "last.pt: not a cnnpar training checkpoint (no 'model', 'optimizer'" in capsys.readouterr().err

    import argparse

    torch.save({"model": argparse.Namespace()}, ckpt)  # an object weights_only refuses to unpickle
    assert main(resume) == 2
    err = capsys.readouterr().err
    assert "holds objects other than tensors" in err and "weights_only=False" not in err and "False" not in err

    damaged = bytearray(good)
    record = next(i for i in zipfile.ZipFile(io.BytesIO(good)).infolist() if i.file_size > 1000)
    damaged[record.header_offset + 200] ^= 1  # one flipped bit inside a tensor's bytes: loaded silently before
    ckpt.write_bytes(bytes(damaged))
    assert main(resume) == 2
    assert f"last.pt: damaged: its record {record.filename} fails its checksum" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in trained.iterdir() if p.is_file()} == before  # the folder as it was


def test_a_killed_saves_leftover_goes_and_records_that_miss_the_checkpoints_epochs_are_written_again(trained, capsys):
    leftover = trained / "ckpt" / ".last.pt.0badc0de.tmp"
    leftover.write_bytes(b"half a checkpoint")
    # the records' temps too (only the checkpoint's were removed), and nothing else of that shape
    records = [trained / f".{name}.0badc0de.tmp" for name in ("metrics.csv", "summary.json", "config.toml")]
    for half in records:
        half.write_text("half a record")
    mine = trained / ".notes.txt.0badc0de.tmp"
    mine.write_text("the user's")
    summary = json.loads((trained / "summary.json").read_text())
    # an attempt stopped after its checkpoint, before its records: a summary of 1 epoch, a third metrics row
    (trained / "summary.json").write_text(json.dumps({**summary, "epochs": 1}))
    with (trained / "metrics.csv").open("a") as f:
        f.write("3" + ",0" * 12 + "\n")
    assert main([*SMALL, "--epochs", "2", "--resume", str(trained)]) == 0  # nothing to do
    out = capsys.readouterr().out
    assert "summary.json and metrics.csv written again from the checkpoint's 2 epochs" in out
    assert json.loads((trained / "summary.json").read_text())["epochs"] == 2
    assert [r["epoch"] for r in read_csv(trained / "metrics.csv")] == ["1", "2"]
    assert main([*SMALL, "--epochs", "3", "--resume", str(trained)]) == 0
    assert not leftover.exists() and not any(half.exists() for half in records) and mine.exists()


def test_a_damaged_metrics_csv_is_written_again_from_the_checkpoint(trained, capsys):
    """A metrics.csv edited by hand (no epoch column) or damaged (not UTF-8) ended the resume in a KeyError or
    UnicodeDecodeError traceback; the checkpoint holds its rows, so it is written again, as a stale one is."""
    metrics = trained / "metrics.csv"
    for damaged, epochs in ((b"my notes\n1,2,3\n", "2"), (b"\xff\xfe\x00garbage", "3")):
        metrics.write_bytes(damaged)
        code = main([*SMALL, "--epochs", epochs, "--resume", str(trained)])  # 2: nothing to do; 3: trains on
        captured = capsys.readouterr()
        assert code == 0 and "Traceback" not in captured.err, captured.err
        assert [r["epoch"] for r in read_csv(metrics)] == [str(e) for e in range(1, int(epochs) + 1)]


def test_a_summary_json_that_is_not_an_object_is_written_again_from_the_checkpoint(trained, capsys):
    """A summary.json holding a JSON list ended a resume with nothing to do in an AttributeError traceback."""
    (trained / "summary.json").write_text("[1, 2]")
    code = main([*SMALL, "--epochs", "2", "--resume", str(trained)])
    assert code == 0 and "Traceback" not in capsys.readouterr().err
    assert json.loads((trained / "summary.json").read_text())["epochs"] == 2


def test_a_checkpoint_of_another_data_set_is_refused_naming_both(trained, capsys):
    """The record says digits; a checkpoint trained on synthetic data of the same shape and class count, put in its
    place, is not continued on digits (the weights fit, so nothing else refused it)."""
    other = trained.parent.parent / "o"
    args = ["--data", "synthetic", "--image-shape", "1x16x16", "--synthetic-samples", "256", "--out-dir", str(other)]
    assert main([*SMALL, "--epochs", "1", "--name", "s", *args]) == 0
    (trained / "ckpt" / "last.pt").write_bytes((other / "s" / "ckpt" / "last.pt").read_bytes())
    capsys.readouterr()
    assert main([*SMALL, "--epochs", "3", "--resume", str(trained)]) == 2
    assert "the run trained on --data synthetic, this resume asks for digits" in capsys.readouterr().err


def test_a_stopped_resume_leaves_a_summary_of_the_epochs_it_kept_marked_unfinished(tmp_path, monkeypatch):
    """A resume stopped in its second epoch left the first attempt's summary.json (2 epochs, its best) beside a
    metrics.csv and checkpoint of 3, and nothing in the folder said the run had stopped."""
    # the first run and the last resume run in this process; the stopped resume in its own (a real SIGTERM)
    run = tmp_path / "runs" / "s"
    monkeypatch.chdir(tmp_path)
    assert main([*SMALL, "--epochs", "1", "--name", "s"]) == 0
    assert json.loads((run / "summary.json").read_text())["finished"] is True
    stop_in_epoch_3 = STOPPED_IN_EPOCH_2.replace("epoch == 2", "epoch == 3")
    resumed = [*SMALL, "--resume", "runs/s", "--epochs", "4"]
    proc = subprocess.run(
        [sys.executable, "-c", stop_in_epoch_3, *resumed], cwd=tmp_path, env=cli_env(), capture_output=True, text=True
    )
    assert proc.returncode == 143, proc.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["epochs"], summary["finished"]) == (2, False)
    assert [r["epoch"] for r in read_csv(run / "metrics.csv")] == ["1", "2"]
    assert summary["final_val_acc"] == pytest.approx(float(read_csv(run / "metrics.csv")[-1]["val_acc"]))
    assert main([*SMALL, "--resume", "runs/s"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["epochs"], summary["finished"]) == (4, True)


def test_a_killed_resume_leaves_the_summary_of_its_checkpoint_not_the_earlier_attempts(tmp_path, monkeypatch):
    """SIGKILL runs no handler: the first attempt's summary.json (1 epoch) stayed beside a checkpoint of 2."""
    # the first run in this process; the killed resume in its own (SIGKILL)
    run = tmp_path / "runs" / "k"
    monkeypatch.chdir(tmp_path)
    assert main([*SMALL, "--epochs", "1", "--name", "k"]) == 0 and (run / "summary.json").is_file()
    killed_in_epoch_3 = STOPPED_IN_EPOCH_2.replace("epoch == 2", "epoch == 3").replace("SIGTERM", "SIGKILL")
    resumed = [*SMALL, "--resume", "runs/k", "--epochs", "4"]
    proc = subprocess.run([sys.executable, "-c", killed_in_epoch_3, *resumed], cwd=tmp_path, env=cli_env())
    assert proc.returncode == -9
    assert [r["epoch"] for r in read_csv(run / "metrics.csv")] == ["1", "2"]
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["epochs"], summary["finished"]) == (2, False)


# the CLI under a file size limit (as `ulimit -f` sets it; Python ignores SIGXFSZ, so the write fails with EFBIG)
UNDER_A_FILE_SIZE_LIMIT = """
import resource, sys
from cnnpar import cli
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
sys.exit(cli.main(sys.argv[2:]))
"""


def test_a_checkpoint_that_cannot_be_written_stops_in_one_line_naming_the_file_the_cause_and_what_is_kept(
    tmp_path, monkeypatch
):
    """A full disk or a file size limit ended the run in torch's two chained C++ stream errors, naming no file."""
    # the first run in this process; the resume under the limit in its own: a file size limit holds for every file
    # its process writes (pytest's among them), and is one a process cannot raise again past its hard limit
    run = tmp_path / "runs" / "f"
    monkeypatch.chdir(tmp_path)
    assert main([*SMALL, "--epochs", "1", "--name", "f"]) == 0
    size = (run / "ckpt" / "last.pt").stat().st_size
    resumed = [*SMALL, "--epochs", "2", "--resume", "runs/f"]
    proc = subprocess.run(
        [sys.executable, "-c", UNDER_A_FILE_SIZE_LIMIT, str(size // 2), *resumed],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "unexpected pos" not in proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if "error" in ln]
    assert line.startswith("cnnpar: error: runs/f/ckpt/last.pt: cannot be written (")
    assert f"a file size limit (ulimit -f) of {size // 2 / 2**20:,.1f} MB" in line
    assert "the checkpoint in runs/f holds epoch 1, which --resume runs/f continues" in line
    assert not list((run / "ckpt").glob(".*.tmp"))


# signals itself inside the trainer's save of ckpt/last.pt for epoch 2: SIG, and WHEN "before" the file is renamed
# into place (killed mid-write) or "after" it (a stop in atomic_write's folder fsync, after the rename)
SIGNALLED_IN_SAVE = """
import os, signal, sys
from cnnpar import cli
from cnnpar.engine import trainer
sig, when = getattr(signal, sys.argv[1]), sys.argv[2]
real = trainer.save_checkpoint
def save(path, state):
    if path.name == "last.pt" and state["epoch"] == 2 and when == "before":
        os.kill(os.getpid(), sig)
    real(path, state)
    if path.name == "last.pt" and state["epoch"] == 2 and when == "after":
        os.kill(os.getpid(), sig)
trainer.save_checkpoint = save
sys.exit(cli.main(sys.argv[3:]))
"""


def test_metrics_csv_never_holds_an_epoch_the_checkpoint_does_not_and_a_resume_cleans_a_killed_best_write(tmp_path):
    """A kill during epoch 2's save of last.pt left metrics.csv with rows 1-2 beside a checkpoint of epoch 1, and a
    resume stopped before finishing an epoch left them so; a killed best.pt write's temp (a whole checkpoint in
    size) stayed for good."""
    run = tmp_path / "runs" / "m"
    args = [*SMALL, "--epochs", "3", "--name", "m"]
    proc = subprocess.run(
        [sys.executable, "-c", SIGNALLED_IN_SAVE, "SIGKILL", "before", *args], cwd=tmp_path, env=cli_env()
    )
    assert proc.returncode == -9
    assert [r["epoch"] for r in read_csv(run / "metrics.csv")] == ["1"]
    # as an attempt of a cnnpar that wrote metrics.csv before the checkpoint left it, and a killed best.pt write
    with (run / "metrics.csv").open("a") as f:
        f.write("2" + ",0" * 12 + "\n")
    best_temp = run / "ckpt" / ".best.pt.0badc0de.tmp"
    best_temp.write_bytes(b"half a checkpoint")
    resumed = [*SMALL, "--resume", "runs/m"]
    proc = subprocess.run(
        [sys.executable, "-c", STOPPED_IN_EPOCH_2, *resumed],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 143, proc.stderr
    assert [r["epoch"] for r in read_csv(run / "metrics.csv")] == ["1"]
    assert not best_temp.exists()


def test_a_stop_just_after_the_checkpoints_rename_names_the_epochs_it_holds(tmp_path):
    """A SIGTERM in atomic_write's fsync of the folder, after last.pt of epoch 2 was renamed into place, printed
    "holds epoch 1": saved_epoch was set only once save_checkpoint returned."""
    args = [*SMALL, "--epochs", "3", "--name", "s"]
    proc = subprocess.run(
        [sys.executable, "-c", SIGNALLED_IN_SAVE, "SIGTERM", "after", *args],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 143, proc.stderr
    assert "stopped: the checkpoint in runs/s holds epochs 1-2; continue with: cnnpar train --resume runs/s" in (
        proc.stdout
    )


# SIGKILL just after the trainer's last.pt of the first epoch past the first that beats every earlier one is renamed
# into place, before its best.pt is written
KILLED_BEFORE_BEST = """
import os, signal, sys
from cnnpar import cli
from cnnpar.engine import trainer
real = trainer.save_checkpoint
def save(path, state):
    real(path, state)
    accs = [r["val_acc"] for r in state["history"]]
    if path.name == "last.pt" and len(accs) > 1 and accs[-1] > max(accs[:-1]):
        os.kill(os.getpid(), signal.SIGKILL)
trainer.save_checkpoint = save
sys.exit(cli.main(sys.argv[1:]))
"""


def test_a_kill_between_last_and_best_of_the_best_epoch_leaves_best_pt_holding_it_after_the_resume(
    tmp_path, monkeypatch
):
    """A SIGKILL after the best epoch's last.pt was renamed into place, before its best.pt was written: the resume
    kept best.pt of an earlier epoch for good (where no later epoch beat the best), while summary.json gave the best
    epoch's accuracy, and predict --checkpoint runs/b/ckpt/best.pt predicted with the earlier epoch's weights."""
    run = tmp_path / "runs" / "b"
    args = [*SMALL, "--epochs", "6", "--name", "b"]
    proc = subprocess.run([sys.executable, "-c", KILLED_BEFORE_BEST, *args], cwd=tmp_path, env=cli_env())
    assert proc.returncode == -9, "no epoch after the first beat the earlier ones: the kill proved nothing"
    last = torch.load(run / "ckpt" / "last.pt", weights_only=True)
    killed = last["epoch"]
    assert torch.load(run / "ckpt" / "best.pt", weights_only=True)["epoch"] < killed
    # the resume trains nothing more (--epochs at the checkpoint's): best.pt is what the resume itself leaves (in
    # this process: only the killed run needs one of its own)
    monkeypatch.chdir(tmp_path)
    assert main([*args, "--epochs", str(killed), "--resume", "runs/b"]) == 0
    best = torch.load(run / "ckpt" / "best.pt", weights_only=True)
    assert best["epoch"] == killed and "optimizer" not in best  # as that epoch's own write of it
    assert all(torch.equal(best["model"][k], t) for k, t in last["model"].items())
    summary = json.loads((run / "summary.json").read_text())
    assert summary["best_ckpt_epoch"] == killed and summary["best_val_acc"] == last["history"][-1]["val_acc"]


def test_a_loader_workers_death_by_the_stop_raised_over_it_still_ends_as_a_stop(tmp_path, monkeypatch, capsys):
    """`timeout` with loader workers: the run ended in a "RuntimeError: DataLoader worker ... is killed by signal:
    Terminated" traceback, without its stop line."""
    from cnnpar.errors import Terminated

    # SIGTERM's Terminated half-way through epoch 2 (raised as its handler raises it: no signal is sent), and a loader
    # worker's death by it raised over it while it unwinds, as torch's SIGCHLD handler raises it wherever the main
    # thread is
    def stop_then_a_workers_death():
        try:
            raise Terminated
        finally:
            raise RuntimeError("DataLoader worker (pid 4242) is killed by signal: Terminated. ")

    _a_fault_in_epoch_2(monkeypatch, stop_then_a_workers_death)
    monkeypatch.chdir(tmp_path)
    assert main([*SMALL, "--epochs", "3", "--name", "w"]) == 143
    out, err = capsys.readouterr()
    assert "stopped: the checkpoint in runs/w holds epoch 1" in out
    assert "Traceback" not in err and "killed by signal" not in err


def test_a_checkpoint_whose_weights_are_not_finite_is_refused_before_an_epoch_trains(trained, capsys):
    """A last.pt changed under valid checksums (edited, another tool's) to hold a NaN weight: the resume trained a
    whole epoch on it, then blamed the learning rate; cnnpar never saves such weights (a diverged epoch stops first)."""
    ckpt = trained / "ckpt" / "last.pt"
    state = torch.load(ckpt, weights_only=True)
    name = next(k for k, t in state["model"].items() if t.is_floating_point())
    state["model"][name].view(-1)[0] = float("nan")
    torch.save(state, ckpt)
    before = {p.name: p.read_bytes() for p in trained.iterdir() if p.is_file()}
    assert main([*SMALL, "--epochs", "3", "--resume", str(trained)]) == 2
    err = capsys.readouterr().err
    assert f"last.pt: its model's {name} holds values that are not finite" in err and "lr" not in err
    assert {p.name: p.read_bytes() for p in trained.iterdir() if p.is_file()} == before  # no epoch 3 recorded


def _poison(ckpt: Path, key: str, name: str, value: float) -> None:
    """`ckpt`'s `key` ('model' or 'average') tensor `name` with `value` at its first place, saved under valid
    checksums, as an edit or another tool's rewrite leaves it."""
    state = torch.load(ckpt, weights_only=True)
    state[key][name].view(-1)[0] = value
    torch.save(state, ckpt)


@pytest.fixture
def averaged(tmp_path, monkeypatch):
    """A one-epoch run with a weight average (--ema) that has started: what predict and a resume read from it."""
    monkeypatch.chdir(tmp_path)
    assert main([*SMALL, "--epochs", "1", "--ema", "0.9", "--name", "a"]) == 0
    return tmp_path / "runs" / "a"


def test_a_weight_average_that_is_not_finite_is_refused_by_predict_and_resume(averaged, tmp_path, capsys):
    """Only the model's weights were checked: predict reads the average, and a -inf bias of it before a ReLU
    predicted every image (exit 0) from broken weights, a NaN was blamed on a diverged run; a resume trained an epoch
    on a NaN average, then blamed the learning rate."""
    ckpt = averaged / "ckpt" / "last.pt"
    state = torch.load(ckpt, weights_only=True)
    assert int(state["average"]["n_averaged"]) > 0
    bias = next(k for k in state["average"] if k.endswith(".bias"))
    weight = next(k for k in state["average"] if k.endswith(".weight"))
    name = bias.removeprefix("module.")
    _poison(ckpt, "average", bias, float("-inf"))
    out = tmp_path / "p.csv"
    assert (
        main(["predict", "--checkpoint", str(averaged), "--data", "digits", "--device", "cpu", "--out", str(out)]) == 2
    )
    err = capsys.readouterr().err
    assert f"last.pt: its weight average's {name} holds values that are not finite" in err, err
    assert not out.exists()

    _poison(ckpt, "average", weight, float("nan"))
    before = {p.name: p.read_bytes() for p in averaged.iterdir() if p.is_file()}
    assert main([*SMALL, "--epochs", "2", "--resume", str(averaged)]) == 2
    err = capsys.readouterr().err
    assert f"last.pt: its weight average's {weight.removeprefix('module.')} holds values that are not finite" in err
    assert "lr" not in err
    assert {p.name: p.read_bytes() for p in averaged.iterdir() if p.is_file()} == before  # no epoch 2 recorded


def test_predict_refuses_model_weights_that_are_not_finite(trained, tmp_path, capsys):
    """A run without an average: predict read a -inf bias as it read any weight, and its predictions came out of it."""
    ckpt = trained / "ckpt" / "best.pt"
    name = next(k for k in torch.load(ckpt, weights_only=True)["model"] if k.endswith(".bias"))
    _poison(ckpt, "model", name, float("-inf"))
    out = tmp_path / "p.csv"
    assert main(["predict", "--checkpoint", str(ckpt), "--data", "digits", "--device", "cpu", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"best.pt: its model's {name} holds values that are not finite" in err, err
    assert not out.exists()


def test_a_weight_average_that_is_not_a_state_dict_is_refused_in_one_line(averaged, tmp_path, capsys):
    """An edited file whose 'average' is a list, or whose count is text: an AttributeError traceback from predict and
    from a resume that reads the average."""
    ckpt = averaged / "ckpt" / "last.pt"
    state = torch.load(ckpt, weights_only=True)
    out = tmp_path / "p.csv"
    for average, said in (
        ([1, 2], "its 'average' is [1, 2]"),
        ({"n_averaged": "x"}, "its average's n_averaged is 'x'"),
    ):
        torch.save({**state, "average": average}, ckpt)
        assert (
            main(["predict", "--checkpoint", str(ckpt), "--data", "digits", "--device", "cpu", "--out", str(out)]) == 2
        )
        err = capsys.readouterr().err
        assert err.startswith(f"cnnpar: error: {ckpt}: not a checkpoint predict can read ({said}") and "\n" == err[-1:]
        assert not out.exists()
        assert main([*SMALL, "--epochs", "2", "--resume", str(averaged)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"cnnpar: error: {ckpt}: not a checkpoint a resume can read ({said}"), err
        assert err.count("\n") == 1


def _resized(ckpt: Path, key: str, pick) -> str:
    """`ckpt` with one tensor of its `key` part ('model', 'average', 'optimizer') one row longer, saved under valid
    checksums as an edit leaves it; the tensor is the first that `pick(name, tensor)` accepts. Returns its name."""
    state = torch.load(ckpt, weights_only=True)
    part = next(iter(state["optimizer"]["state"].values())) if key == "optimizer" else state[key]
    name = next(k for k, t in part.items() if isinstance(t, torch.Tensor) and pick(k, t))
    part[name] = torch.zeros(part[name].shape[0] + 1, *part[name].shape[1:])
    torch.save(state, ckpt)
    return name


def test_tensors_that_do_not_fit_the_model_are_refused_in_one_line_naming_the_tensor_and_shapes(
    averaged, tmp_path, capsys
):
    """An edited checkpoint whose weight average or optimizer state holds a tensor of another shape than the model's
    ended a resume in torch's size-mismatch traceback (the optimizer's only at the first step, after config.toml and
    resumes.csv were rewritten); one in the model's weights, the run's own model and classes, was refused by a line
    that named the same model on both sides and no tensor."""
    ckpt = averaged / "ckpt" / "last.pt"
    good = ckpt.read_bytes()
    resume = [*SMALL, "--epochs", "2", "--resume", str(averaged)]
    for key, pick, said in (
        ("average", lambda k, t: k.startswith("module.") and t.dim() == 2, "its weight average's weights do not fit"),
        ("model", lambda k, t: t.dim() == 2, "its weights do not fit"),
        ("optimizer", lambda k, t: t.dim() > 0, "its optimizer state does not fit"),
    ):
        ckpt.write_bytes(good)
        name = _resized(ckpt, key, pick)
        before = {p.name: p.read_bytes() for p in averaged.iterdir() if p.is_file()}
        assert main(resume) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"cnnpar: error: {ckpt}: {said} this run's cnn3") and err.count("\n") == 1, err
        assert (f"{name} is [" if key != "optimizer" else f"'s {name} is [") in err, err
        assert {p.name: p.read_bytes() for p in averaged.iterdir() if p.is_file()} == before  # nothing rewritten

    ckpt.write_bytes(good)  # predict reads the average: it names the average, not the model's weights
    name = _resized(ckpt, "average", lambda k, t: k.startswith("module.") and t.dim() == 2)
    out = tmp_path / "p.csv"
    assert main(["predict", "--checkpoint", str(ckpt), "--data", "digits", "--device", "cpu", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "last.pt: its weight average's weights do not fit" in err and name.removeprefix("module.") in err, err
    assert not out.exists()


def test_a_resume_that_regroups_the_optimizer_names_the_flag_that_did(tmp_path, monkeypatch, capsys):
    """--whiten-bias-epochs on resuming a run started without it gives the whitened stem's bias a parameter group of
    its own: the checkpoint's optimizer state no longer loads, and the refusal quoted torch's "different number of
    parameter groups" without naming the flag that made them."""
    monkeypatch.chdir(tmp_path)
    small = [*SMALL, "--model", "fastnet", "--image-size", "16", "--max-steps", "1"]
    assert main([*small, "--epochs", "1", "--name", "w"]) == 0
    run = tmp_path / "runs" / "w"
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert main([*small, "--epochs", "2", "--resume", str(run), "--whiten-bias-epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "its optimizer state does not fit this run's parameter groups" in err, err
    assert "started with --whiten-bias-epochs 0, this resume asks for --whiten-bias-epochs 1" in err, err
    assert "expected --whiten-bias-epochs 0 (or none), or a new run" in err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
