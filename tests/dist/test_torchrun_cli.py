"""`cnnpar train` under real torchrun launches (CPU, gloo): restarts, two "nodes", the debug
switch and who prints. (A failing rank being named is checked inside tests/dist/checks.py; a killed worker's
one-node restart, and who prints in it, in tests/dist/test_tensorboard_ddp.py, whose launch checks its curves too.)

torchrun and its ranks are processes of their own; where a test runs `cnnpar train --nproc N`, the launcher runs in
this process (cli_here) unless the test signals it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cnnpar.engine.checkpoint import checkpoint_epoch, epochs_held, load_checkpoint
from cnnpar.report.files import read_csv
from tests.conftest import cli_env, main_in, run_cmd, torchrun_cmd

TRAIN = [
    "-m",
    "cnnpar",
    "train",
    "--device",
    "cpu",
    "--data",
    "synthetic",
    "--image-shape",
    "1x16x16",
    "--synthetic-samples",
    "256",
    "--batch-size",
    "16",
    "--no-progress",
]


def run_two_nodes(cmd: list[str], cwd, env: dict, timeout: float, cmds=None) -> list[tuple[int, str, str]]:
    """Two launches of the same torchrun command (or of each of `cmds`), as two nodes would start it: (exit code,
    stdout, stderr) each; any still running at the end is killed."""
    nodes = [
        subprocess.Popen(each, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for each in cmds or (cmd, cmd)
    ]
    outs = []
    try:
        for node in nodes:
            out, err = node.communicate(timeout=timeout)
            outs.append((node.returncode, out, err))
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
    return outs


def explain(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"


def only_run_folder(cwd: Path) -> Path:
    runs = sorted((cwd / "runs").iterdir())
    assert len(runs) == 1, runs
    return runs[0]


def worker_log(logs: Path, attempt: int, local_rank: int, stream: str) -> str:
    """torchrun --redirects 3 --log-dir LOGS keeps LOGS/<job>/attempt_<n>/<local rank>/std{out,err}.log."""
    (path,) = logs.glob(f"*/attempt_{attempt}/{local_rank}/{stream}.log")
    return path.read_text()


def environment_of_a_subprocess(monkeypatch, **extra: str) -> None:
    """This process's environment made the one `cli_env` gives a subprocess: this checkout on PYTHONPATH (for
    torchrun's workers: cnnpar is installed from another checkout), one OpenMP thread, no CNNPAR_ or rank variables."""
    wanted = cli_env(**extra)
    for name in [k for k in os.environ if k not in wanted]:
        monkeypatch.delenv(name)
    for name, value in wanted.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def cli_here(tmp_path, monkeypatch, capfd):
    """As conftest's `cli`, with `cnnpar` itself run in this process (cli.main): its launcher starts torchrun's
    workers as the command does, in `tmp_path` with a subprocess's environment; what it and its workers wrote to
    stdout and stderr (fds 1 and 2) comes back in a CompletedProcess with main's exit status. Saves the launcher's
    own interpreter and imports (3-4 s of CPU a test); a test whose launcher takes a signal keeps a process."""

    def _run(*args: str, **env: str) -> subprocess.CompletedProcess:
        environment_of_a_subprocess(monkeypatch, **env)
        return main_in(tmp_path, monkeypatch, capfd, args)

    _run.cwd = tmp_path
    return _run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_node_rendezvous_on_localhost_trains(tmp_path):
    """Two torchrun invocations, one process each, meeting through the c10d rendezvous."""
    port = free_port()
    launch = torchrun_cmd(
        1, "--nnodes=2", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=cnnpar-2node"
    )
    # `-m --`: torchrun would read --nproc as its own --nproc-per-node
    cmd = [*launch, "-m", "--", *TRAIN[1:], "--epochs", "2", "--nproc", "3"]
    outs = run_two_nodes(cmd, tmp_path, cli_env(), timeout=180)
    for rc, out, err in outs:
        assert rc == 0, f"exit {rc}\n{out[-2000:]}\n{err[-2000:]}"
    run_dir = only_run_folder(tmp_path)
    assert run_dir.name == "cnn3-cnnpar-2node"  # named from the rendezvous id, the same on both nodes
    assert [row["epoch"] for row in read_csv(run_dir / "metrics.csv")] == ["1", "2"]
    assert json.loads((run_dir / "summary.json").read_text())["world_size"] == 2
    assert sum("2 process(es)" in out for _, out, _ in outs) == 1  # one node holds rank 0 and speaks
    # --nproc asked for 3 processes and torchrun started 1 a node: dropped without a word
    note = "cnnpar: note: --nproc 3 not launched: torchrun started the processes (1 on this node, 2 in the job)"
    assert sorted(note in err for _, _, err in outs) == [False, True], outs


def test_a_node_whose_command_line_is_refused_stops_the_other_node_at_once(tmp_path):
    """Node 1's `--epochs abc`: argparse said so there; node 0 said nothing for --timeout-s (600 s), then failed
    with a traceback about a "debug_single" store key, and did not answer torchrun's SIGTERM meanwhile."""
    port = free_port()
    node = ["--nnodes=2", "--master-addr=127.0.0.1", f"--master-port={port}"]
    cmds = [[*torchrun_cmd(1, *node, f"--node-rank={k}"), *TRAIN, "--epochs", e] for k, e in ((0, "1"), (1, "abc"))]
    start = time.monotonic()
    (rc0, _, err0), (rc1, _, err1) = run_two_nodes([], tmp_path, cli_env(), timeout=120, cmds=cmds)
    assert rc0 != 0 and rc1 != 0 and time.monotonic() - start < 90, err0[-2000:]
    assert "cnnpar train: error: argument --epochs: invalid int value: 'abc'" in err1
    said = [line for line in err0.splitlines() if line.startswith("cnnpar:")]
    assert said == [
        "cnnpar: rank 0 stopped: rank(s) 1 of 2 ended before joining the job; the error is in that node's log"
    ], err0[-3000:]
    assert "DistStoreError" not in err0 and not (tmp_path / "runs").exists()


# Rank 1 fails after the start exchange, in init_process_group (gloo refusing its network interface, say)
FAILS_AS_THE_GROUP_FORMS = """
import os, sys
import torch.distributed as dist
if os.environ["RANK"] == "1":
    def refused(*args, **kwargs):
        raise RuntimeError("[enforce fail at gloo] no device for interface eth9")
    dist.init_process_group = refused
from cnnpar.cli import main
sys.exit(main())
"""


def test_a_node_failing_before_the_process_group_forms_stops_the_other_node_with_its_error(tmp_path):
    """Node 1 failed after the start exchange, before the process group formed: node 0 waited in
    init_process_group for --timeout-s (300 s here), then said only that the other ranks "did not join"."""
    script = tmp_path / "fails_as_the_group_forms.py"
    script.write_text(FAILS_AS_THE_GROUP_FORMS)
    port = free_port()
    node = ["--nnodes=2", "--master-addr=127.0.0.1", f"--master-port={port}"]
    cmds = [
        [*torchrun_cmd(1, *node, f"--node-rank={k}"), str(script), *TRAIN[2:], "--epochs", "1", "--timeout-s", "300"]
        for k in (0, 1)
    ]
    # well under --timeout-s: run_two_nodes raises TimeoutExpired where node 0 waits it out
    (rc0, _, err0), (rc1, _, err1) = run_two_nodes([], tmp_path, cli_env(), timeout=150, cmds=cmds)
    assert rc0 != 0 and rc1 != 0, err0[-2000:]
    assert "RuntimeError: [enforce fail at gloo] no device for interface eth9" in err1
    said = [line for line in err0.splitlines() if line.startswith("cnnpar:")]
    assert said == [
        "cnnpar: rank 0 stopped: rank 1 of 2 failed before the job's process group formed: RuntimeError: "
        "[enforce fail at gloo] no device for interface eth9"
    ], err0[-3000:]
    assert "exitcode: 3" in err0  # errors.EXIT_ANOTHER_RANK_ENDED: node 0 did not fail by itself
    assert not (tmp_path / "runs").exists()


def test_debug_switch_under_torchrun_runs_one_process(tmp_path):
    logs = tmp_path / "logs"
    proc = run_cmd(
        [*torchrun_cmd(2, "--standalone", "--redirects=3", f"--log-dir={logs}"), *TRAIN, "--epochs", "1"],
        tmp_path,
        CNNPAR_DEBUG_SINGLE="1",
    )
    assert proc.returncode == 0, explain(proc)
    run_dir = only_run_folder(tmp_path)
    assert json.loads((run_dir / "summary.json").read_text())["world_size"] == 1
    said = worker_log(logs, 0, 0, "stdout")
    assert "| 1 process(es) on cpu" in said
    # the launch asked for 2 processes: said, with the global batch that trains (a variable left in a job script)
    cut = "debug switch (CNNPAR_DEBUG_SINGLE=1): torchrun started 2 processes; rank 0 trains alone, the others exited"
    assert f"{cut}: global batch 16 per step instead of 32\n" in said, said
    assert worker_log(logs, 0, 1, "stdout") == ""  # the surplus worker left at once


def test_nproc_starts_torchrun_for_this_machine(cli_here):
    import warnings

    with warnings.catch_warnings(record=True) as warned:  # the launcher's own: a subprocess printed them on stderr
        warnings.simplefilter("always")
        proc = cli_here("train", "--nproc", "2", "--epochs", "1", "--max-steps", "2", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert not [w for w in warned if issubclass(w.category, FutureWarning) or "is deprecated" in str(w.message)]
    assert "-m cnnpar.torchrun --standalone --nproc_per_node=2 -m -- cnnpar train" in proc.stdout
    # torch 2.14 warns, once per rank, about TORCH_NCCL_TRACE_BUFFER_SIZE (cnnpar's launcher sets the flight
    # recorder's names by the torch in use) and about DDP's `broadcast_buffers` (apply_ddp spells it likewise)
    assert "is deprecated" not in proc.stderr and "FutureWarning" not in proc.stderr, proc.stderr
    # what DDP runs with, read off the module: torch's own bucket size and switches by default
    assert "ddp: gradient buckets 25 MiB, static graph off, buffers sent from rank 0 every forward" in proc.stdout
    run_dir = only_run_folder(cli_here.cwd)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2
    # the images both ranks trained, each counted once: 2 processes x 2 steps x the CPU's batch of 64
    assert summary["images_trained"] == 2 * 2 * 64 and summary["global_batch"] == 2 * 64
    # the record holds the launch, so that `--config` of it starts two processes again
    assert "\nnproc = 2\n" in (run_dir / "config.toml").read_text()


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (
            ["--image-size", "4"],
            "model cnn3: input images 4x4: expected at least 8x8 (its three 2x2 max-pools); give --image-size 8 or "
            "more",
        ),
        (
            ["--model", "resnet18", "--image-shape", "3x8x8", "--batch-size", "1"],
            "model resnet18 at 8x8 px reduces to 1x1 maps before a BatchNorm layer (layer4.0.bn1), which cannot train "
            "on a batch of 1 per process (one value per channel): give --batch-size 2 or more, or a larger "
            "--image-size",
        ),
    ],
    ids=["model too small", "batchnorm of one"],
)
def test_a_refusal_every_rank_raises_at_start_up_is_said_once_with_one_process_exit_status(cli_here, flags, line):
    """Each rank printed `cnnpar: error: [rank R] ...` (two ranks' lines at times run together on one line),
    torchrun added its own failure lines, and the launcher ended 1 where one process ends 2."""
    args = ["--data", "synthetic", "--image-shape", "1x16x16", "--synthetic-samples", "64", "--batch-size", "16"]
    proc = cli_here("train", "--nproc", "2", *args, *flags, "--epochs", "1", "--no-progress", "--no-tensorboard")
    assert proc.returncode == 2, explain(proc)
    assert proc.stderr == f"cnnpar: error: {line}\n", explain(proc)
    assert not (cli_here.cwd / "runs").exists() or not any((cli_here.cwd / "runs").iterdir())


def test_a_refusal_under_nproc_1_is_said_once_with_one_process_exit_status(cli_here):
    """`--nproc 1` (a 2-process run resumed on one, say) refused as --nproc 2 does: its one rank's refusal was
    followed by torchrun's line on that rank's exit and `cnnpar: rank 0 failed first (exit code 2)`, exit status 1."""
    args = ["--data", "synthetic", "--image-shape", "1x16x16", "--synthetic-samples", "64", "--batch-size", "16"]
    proc = cli_here("train", "--nproc", "1", *args, "--image-size", "4", "--epochs", "1", "--no-progress")
    assert proc.returncode == 2, explain(proc)
    line = "model cnn3: input images 4x4: expected at least 8x8 (its three 2x2 max-pools); give --image-size 8 or more"
    assert proc.stderr == f"cnnpar: error: {line}\n", explain(proc)


def test_a_divergence_in_the_first_epoch_under_nproc_1_is_said_once_with_one_process_exit_status(cli_here):
    """After the run folder's note, a refusal whose run folder went with it (training diverged in epoch 1) was
    followed by torchrun's line, `rank 0 failed first (exit code 2)` and "nothing to resume ...; start it again with
    the command that started it", exit status 1: one process says the error alone, exit 2."""
    args = ["--data", "synthetic", "--image-shape", "1x16x16", "--synthetic-samples", "64", "--batch-size", "16"]
    proc = cli_here("train", "--nproc", "1", *args, "--lr", "1e12", "--epochs", "2", "--no-progress")
    assert proc.returncode == 2, explain(proc)
    assert proc.stderr.startswith("cnnpar: error: epoch 1: train loss nan is not finite, training diverged: ")
    assert proc.stderr.count("\n") == 1 and "nothing to resume" not in proc.stdout, explain(proc)
    assert not any((cli_here.cwd / "runs").iterdir())


def test_the_launcher_hands_every_train_flag_to_cnnpar_not_to_torchrun():
    """torchrun's parser reads each argument as a possible abbreviation of its own options (`--monitor` of
    `--monitor-interval`); after the launcher's `--` all of them reach `cnnpar train`."""
    from torch.distributed.run import get_args_parser

    from cnnpar.cli import torchrun_command

    flags = ["--monitor", "--max-steps", "2", "--epochs", "1"]
    parsed = get_args_parser().parse_args(torchrun_command(2, flags)[3:])
    assert parsed.module and parsed.training_script == "cnnpar"
    assert parsed.training_script_args == ["train", *flags]
    assert parsed.monitor_interval == get_args_parser().parse_args(["x"]).monitor_interval  # torchrun's own default


def _stopped_after_a_checkpoint(cmd: list[str], tmp_path, name: str, stop, wait_s: float = 240):
    """Start `cmd` in a session of its own, call `stop(proc)` once run `name` has its first checkpoint, and return
    (proc, stdout, stderr); whatever is left is killed."""
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    ckpt = tmp_path / "runs" / name / "ckpt" / "last.pt"
    try:
        deadline = time.monotonic() + wait_s
        while not ckpt.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint"
            time.sleep(0.05)
        stop(proc)
        out, err = proc.communicate(timeout=wait_s / 2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc, out, err


# The stop tests below keep `cnnpar` a process of its own (not cli_here): the launcher itself takes the signal, and
# its exit status for it (128 + the signal) is checked.
# the launcher alone, as `timeout` does; the launcher's group (torchrun and its ranks run in sessions of their own),
# as a closing terminal does
STOPS = {"SIGTERM": lambda p: p.send_signal(signal.SIGTERM), "SIGHUP": lambda p: os.killpg(p.pid, signal.SIGHUP)}


@pytest.mark.parametrize("sig", STOPS)
def test_a_stop_to_nproc_stops_torchrun_and_its_workers_with_the_epochs_kept(tmp_path, sig, stops_reach_children):
    """`timeout` or a scheduler signals the process it started: the launcher hands SIGTERM on to torchrun, which
    stops its workers; before, the launcher died alone and torchrun's workers trained on without it. A closing
    terminal's SIGHUP killed the launcher at once (torchrun then stopped by its parent's death), with no line said."""
    import psutil

    name = f"{sig.lower()}-{tmp_path.name}"
    args = ["--nproc", "2", "--epochs", "50", "--max-steps", "2", "--no-progress", "--no-tensorboard", "--name", name]
    cmd = [sys.executable, "-m", "cnnpar", "train", *args]
    proc, out, err = _stopped_after_a_checkpoint(cmd, tmp_path, name, STOPS[sig])
    assert proc.returncode == 128 + getattr(signal, sig), err[-2000:]
    assert err.count(f"cnnpar: stopped ({sig})") == 1  # the launcher's; its ranks are stopped by torchrun
    # torchrun's SignalException traceback gave way to the epochs kept: its ranks die at its SIGTERM, unheard
    epochs = checkpoint_epoch(tmp_path / "runs" / name)
    kept = f"stopped: the checkpoint in runs/{name} holds {epochs_held(epochs)}; continue with: cnnpar train --resume "
    assert out.splitlines()[-1] == f"{kept}runs/{name} --nproc 2" and "Traceback" not in err, err[-2000:]
    # the summary of the epochs kept, unfinished (written at each epoch's end: its ranks had none to write it with);
    # written just after the checkpoint, so a SIGTERM between the two leaves it one epoch behind (seen in CI)
    summary = json.loads((tmp_path / "runs" / name / "summary.json").read_text())
    assert summary["epochs"] in (epochs - 1, epochs) and summary["finished"] is False, (summary["epochs"], epochs)
    time.sleep(1)
    left = [p for p in psutil.process_iter(["cmdline"]) if name in " ".join(p.info["cmdline"] or [])]
    assert not left, [p.info["cmdline"] for p in left]


def test_ctrl_c_under_nproc_prints_the_epochs_kept_once(tmp_path, stops_reach_children):
    """A Ctrl-C: rank 0 printed the stop line, then the launcher printed the same line again."""
    name = f"int-{tmp_path.name}"
    args = ["--nproc", "2", "--epochs", "50", "--max-steps", "2", "--no-progress", "--no-tensorboard", "--name", name]
    cmd = [sys.executable, "-m", "cnnpar", "train", *args]
    # the terminal's Ctrl-C reaches the launcher's group
    _, out, err = _stopped_after_a_checkpoint(cmd, tmp_path, name, lambda p: os.killpg(p.pid, signal.SIGINT))
    said = [line for line in out.splitlines() if line.startswith("stopped: the checkpoint in ")]
    assert len(said) == 1, out[-2000:] + err[-2000:]
    assert said[0].endswith(f"continue with: cnnpar train --resume runs/{name} --nproc 2"), said
    assert err.count("cnnpar: interrupted") == 1, err[-2000:]  # the launcher's; each rank said it too, unprefixed


@pytest.mark.slow  # over 20 s on 2 CPU cores (CI durations): `-m 'not slow'` leaves it out
def test_a_killed_worker_under_nproc_ends_with_the_epochs_kept_and_the_command_that_continues(cli_here):
    """It ended with rank 0's traceback and torchrun's ChildFailedError traceback and FAILED block, and said
    nothing of the checkpoint; the line it now ends with continues the run."""
    args = ["--nproc", "2", "--epochs", "3", "--no-progress", "--no-tensorboard", "--name", "k"]
    proc = cli_here("train", *args, CNNPAR_FAULT_KILL_AT_EPOCH="2")  # rank 1 SIGKILLs itself in epoch 2
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "cnnpar: rank 1 failed first (killed by SIGKILL)" in proc.stderr
    assert "ChildFailedError" not in proc.stderr and "FAILED" not in proc.stderr
    end = "stopped: the checkpoint in runs/k holds epoch 1; continue with: cnnpar train --resume runs/k --nproc 2"
    assert proc.stdout.splitlines()[-1] == end
    again = cli_here(*end.split("continue with: cnnpar ")[1].split(), "--no-progress")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from runs/k/ckpt/last.pt after epoch 1" in again.stdout and "epoch 3/3" in again.stdout


# Rank 0 pauses where rank 1 kills itself (once), so that node 0's agent learns of the failure by the
# rendezvous (node 1 waiting to rejoin) before its own worker finds the dead peer in a collective: on one machine
# the peer's socket is reset at once, and rank 0 failing too gave both agents a restart count of 1, hiding the bug.
SLOW_RANK0 = """
import sys, time
from pathlib import Path
from cnnpar.engine import fault
inject = fault.maybe_inject_fault
def stall_rank0(epoch, step, steps, info):
    if info.rank == 0 and epoch == 2 and step == steps // 2 and not Path("stalled").exists():
        Path("stalled").touch()
        time.sleep(20)
    inject(epoch, step, steps, info)
fault.maybe_inject_fault = stall_rank0
import cnnpar.engine.trainer as trainer
trainer.maybe_inject_fault = stall_rank0
from cnnpar.cli import main
sys.exit(main())
"""


@pytest.mark.slow  # over 20 s on 2 CPU cores (CI durations): `-m 'not slow'` leaves it out
def test_two_nodes_restart_after_one_nodes_worker_dies_and_resume_together(tmp_path):
    """Rank 1 (node 1) SIGKILLs itself in epoch 2; node 1's agent restarts with its restart count 1, node 0's
    because the membership changed, with its count still 0. Each rank took its attempt from its own agent's
    count: the two ranks used two key prefixes and never met (gloo timeouts, both nodes exit 1), and rank 0,
    counting no restart, refused its own run folder. The attempt is now counted in the shared store."""
    script = tmp_path / "slow_rank0.py"
    script.write_text(SLOW_RANK0)
    port = free_port()
    launch = torchrun_cmd(
        1,
        "--nnodes=2",
        "--max-restarts=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id=restart-{port}",
    )
    cmd = [*launch, str(script), *TRAIN[2:], "--epochs", "3", "--timeout-s", "30", "--no-tensorboard"]
    env = cli_env(CNNPAR_FAULT_KILL_AT_EPOCH="2")
    outs = run_two_nodes(cmd, tmp_path, env, timeout=240)
    for rc, out, err in outs:
        assert rc == 0, f"exit {rc}\n{out[-2000:]}\n{err[-3000:]}"
    run_dir = only_run_folder(tmp_path)
    assert [row["epoch"] for row in read_csv(run_dir / "metrics.csv")] == ["1", "2", "3"]
    speaker = [out for _, out, _ in outs if "epoch 1/3" in out]
    assert len(speaker) == 1 and "resumed from" in speaker[0] and "after epoch 1" in speaker[0], speaker


def test_sigterm_to_a_plain_torchrun_says_what_was_kept_and_how_to_continue(tmp_path):
    """`timeout` or a scheduler signals torchrun, which hands SIGTERM on to its workers: every worker died of it
    unheard, and nobody printed the epochs kept and the command that continues (`--nproc`'s launcher does)."""
    name = f"plain-{tmp_path.name}"
    cmd = [*torchrun_cmd(2, "--standalone"), *TRAIN, "--epochs", "50", "--max-steps", "2", "--name", name]
    cmd = [*cmd, "--no-tensorboard", "--timeout-s", "60"]
    # torchrun alone, as `timeout` does
    _, out, err = _stopped_after_a_checkpoint(cmd, tmp_path, name, lambda p: p.send_signal(signal.SIGTERM), 120)
    ckpt = tmp_path / "runs" / name / "ckpt" / "last.pt"
    epochs = load_checkpoint(ckpt, map_location="cpu")["epoch"]  # whole: its records' checksums checked
    assert epochs >= 1
    kept = f"stopped: the checkpoint in runs/{name} holds {epochs_held(epochs)}; continue with: cnnpar train --resume "
    assert f"{kept}runs/{name} --nproc 2" in out.splitlines(), out[-2000:] + err[-2000:]
    assert "cnnpar: stopped (SIGTERM)" in err and "cnnpar: rank 0 failed" not in err, err[-3000:]


def test_the_debug_switch_on_one_node_only_is_refused_on_every_rank_at_once(tmp_path):
    """Rank 1 alone had the switch (one node's environment): it left at once, and rank 0 waited for it the whole
    --timeout-s, then failed with a traceback."""
    script = tmp_path / "switch_on_rank1.py"
    script.write_text(
        "import os, sys\n"
        "if os.environ['RANK'] == '1':\n"
        "    os.environ['CNNPAR_DEBUG_SINGLE'] = '1'\n"
        "from cnnpar.cli import main\n"
        "sys.exit(main())\n"
    )
    start = time.monotonic()
    proc = run_cmd([*torchrun_cmd(2, "--standalone"), str(script), *TRAIN[2:], "--timeout-s", "120"], tmp_path)
    assert proc.returncode != 0 and time.monotonic() - start < 60, explain(proc)
    line = "the debug switch (--debug-single, CNNPAR_DEBUG_SINGLE) is on for rank(s) 1 of 2 only: expected it on"
    for rank in (0, 1):
        assert f"cnnpar: error: [rank {rank}] {line}" in proc.stderr, explain(proc)
    assert "cnnpar: rank 0 failed" not in proc.stderr and not (tmp_path / "runs").exists()


# Rank 1 stops answering in epoch 1 (a stuck rank: it also ignores torchrun's SIGTERM), under cnnpar's launcher
# (cnnpar.torchrun) with torchrun's 30 s wait between its SIGTERM and its SIGKILL cut to 2 s
STUCK_RANK1 = """
import signal, sys, time
from torch.distributed.elastic.multiprocessing import api
close = api.SubprocessContext._close
api.SubprocessContext._close = lambda self, death_sig, timeout=30: close(self, death_sig, timeout=2)
if sys.argv[1] == "launch":
    from cnnpar.torchrun import main
    sys.argv = [sys.argv[0], *sys.argv[2:]]
    sys.exit(main())
import cnnpar.engine.trainer as trainer
def stuck(epoch, step, steps, info):
    if info.rank == 1 and step == 1:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(120)
trainer.maybe_inject_fault = stuck
from cnnpar.cli import main
sys.argv = [sys.argv[0], *sys.argv[2:]]
sys.exit(main())
"""


def test_a_rank_that_stops_responding_is_named_and_the_rank_that_timed_out_is_not_blamed(tmp_path):
    """Rank 1 stuck: rank 0 timed out in gloo after --timeout-s and printed a gloo traceback, and the launcher said
    "rank 0 failed first (exit code 1)", blaming the healthy rank."""
    script = tmp_path / "stuck_rank1.py"
    script.write_text(STUCK_RANK1)
    launch = [sys.executable, str(script), "launch", "--standalone", "--nproc_per_node=2", str(script), "worker"]
    start = time.monotonic()
    proc = run_cmd([*launch, *TRAIN[2:], "--epochs", "1", "--timeout-s", "5", "--no-tensorboard"], tmp_path)
    assert proc.returncode == 1 and time.monotonic() - start < 100, explain(proc)
    said = [line for line in proc.stderr.splitlines() if line.startswith("cnnpar:")]
    assert said == [
        "cnnpar: rank 0 timed out after 5 s (--timeout-s 5) waiting for another rank in a collective: a rank "
        "stopped responding (stuck, stopped or too slow)",
        "cnnpar: rank 0 timed out waiting for another rank (--timeout-s); rank 1 did not answer torchrun's SIGTERM "
        "and had to be killed (SIGKILL): stuck or stopped; torchrun ended the job",
    ], explain(proc)
    assert "Traceback" not in proc.stderr, explain(proc)


@pytest.mark.slow  # over 20 s on 2 CPU cores
def test_a_rank_out_of_memory_under_nproc_says_one_line_and_the_other_rank_ends_quietly(cli_here):
    """The rank that ran out of memory says so in one line with its rank, what is kept and the resume with half the
    batch, exit status 2, as one process does; the other rank, whose collective found its peer gone, ends quietly.
    Each printed torch's traceback; then the other rank's "another rank ended", torchrun's lines on the workers'
    exits and `rank 1 failed first`, exit status 1, with what is kept on a line of its own."""
    args = ["--nproc", "2", "--epochs", "3", "--batch-size", "32", "--no-progress", "--no-tensorboard", "--name", "m"]
    proc = cli_here("train", *args, CNNPAR_FAULT_OOM_AT_EPOCH="2")  # rank 1 runs out of memory in epoch 2
    assert proc.returncode == 2, explain(proc)
    (line,) = proc.stderr.splitlines()
    assert line.startswith("cnnpar: error: [rank 1] the training step ran out of memory: batch 32/process of ")
    assert "torch tried to allocate 2.00 GiB; expected settings that fit: a smaller --batch-size" in line
    # continued as one process's line is: with half the batch and twice the accumulation (a plain --resume ran out
    # of memory again)
    end = "; the checkpoint in runs/m holds epoch 1; continue with: cnnpar train --resume runs/m --nproc 2"
    assert line.endswith(end + " --batch-size 16 --grad-accum 2"), line
    assert proc.stdout.splitlines()[-1].startswith("epoch 1/3 "), explain(proc)


@pytest.mark.slow  # two launches
def test_a_resumed_rank_out_of_memory_under_nproc_names_the_epochs_the_checkpoint_holds_now(cli_here):
    """Rank 1 of a resumed run knows only the epoch it resumed from: its line said "holds epoch 1" after epoch 2 was
    saved, and the launcher, taking that line as saying what is kept, added nothing."""
    args = ["--nproc", "2", "--batch-size", "32", "--no-progress", "--no-tensorboard"]
    first = cli_here("train", *args, "--epochs", "1", "--name", "m")
    assert first.returncode == 0, explain(first)
    proc = cli_here("train", *args, "--resume", "runs/m", "--epochs", "3", CNNPAR_FAULT_OOM_AT_EPOCH="3")
    assert proc.returncode == 2, explain(proc)
    (line,) = proc.stderr.splitlines()
    assert line.startswith("cnnpar: error: [rank 1] the training step ran out of memory: "), line
    end = "; the checkpoint in runs/m holds epochs 1-2; continue with: cnnpar train --resume runs/m --nproc 2"
    assert line.endswith(end + " --batch-size 16 --grad-accum 2"), line
    assert line.count("the checkpoint in") == 1, line


def test_a_divergence_after_a_saved_epoch_under_nproc_is_said_once_with_one_process_exit_status(cli_here):
    """Every rank diverges alike in epoch 2 (a warm-up to too high an lr): each said it, then torchrun's lines on the
    workers' exits, `rank 1 failed first (exit code 2)` and a `--resume` at the same lr that diverges again, exit
    status 1. One process says the divergence's line alone, which names the epochs kept and a lower lr, exit 2."""
    args = ["--data", "synthetic", "--image-shape", "1x16x16", "--synthetic-samples", "256", "--batch-size", "16"]
    # the lr climbs over all 20 epochs: epoch 1 stays finite and epoch 2 diverges from --lr 15 to 45 (on 2 CPU cores)
    lr = ["--optimizer", "sgd", "--lr", "25", "--schedule", "onecycle", "--warmup", "0.99", "--precision", "fp32"]
    proc = cli_here("train", "--nproc", "2", *args, *lr, "--epochs", "20", "--name", "d", "--no-progress")
    assert proc.returncode == 2, explain(proc)
    (line,) = proc.stderr.splitlines()
    assert line.startswith(("cnnpar: error: [rank 0] epoch 2: ", "cnnpar: error: [rank 1] epoch 2: ")), line
    kept = " is not finite, training diverged (epoch 1 is kept in runs/d): try a lower lr (--lr 12.5)"
    assert line.endswith(kept), line
    assert proc.stdout.splitlines()[-1].startswith("epoch 1/20 "), explain(proc)
    assert checkpoint_epoch(cli_here.cwd / "runs" / "d") == 1
