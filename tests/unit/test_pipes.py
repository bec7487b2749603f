"""Where a command's output goes: a reader that went away (`cnnpar train | head -2`) stops the command as SIGPIPE stops
other Unix tools (exit 141, no traceback, train's finished epochs kept), and a stdout that cannot be written
(/dev/full) ends in one line naming it (console.StopWhenGone)."""

from __future__ import annotations

import errno
import io
import os
import signal
import subprocess
import sys
import threading

import pytest
import torch

from cnnpar import errors
from cnnpar.cli import main
from cnnpar.console import StopWhenGone

pytestmark = pytest.mark.usefixtures("one_thread")

TRAIN = ["train", "--epochs", "2", "--max-steps", "4", "--no-progress", "--no-tensorboard", "--device", "cpu"]


def _reader_gone() -> io.TextIOWrapper:
    """A line-buffered text stream (as on a terminal: each line written at once) into a pipe whose reader closed."""
    r, w = os.pipe()
    os.close(r)
    return io.TextIOWrapper(os.fdopen(w, "wb"), line_buffering=True)


def _on_devnull(fd: int) -> bool:
    st, null = os.fstat(fd), os.stat(os.devnull)
    return (st.st_dev, st.st_ino) == (null.st_dev, null.st_ino)


def test_a_train_whose_stdout_reader_went_away_stops_with_141_and_says_what_is_kept_on_stderr(
    tmp_path, monkeypatch, capsys
):
    gone = _reader_gone()
    monkeypatch.setattr(sys, "stdout", gone)
    assert main([*TRAIN, "--out-dir", str(tmp_path), "--name", "a"]) == 128 + signal.SIGPIPE
    err = capsys.readouterr().err
    # its stop line (the folder, and how to go on) on stderr, the one stream left; no second generic line
    assert "stopped: " in err and "cnnpar train --resume" in err and "cnnpar: stopped" not in err
    assert _on_devnull(gone.fileno())  # later writes and the exit flush go nowhere, raising nothing
    gone.write("more\n")
    gone.flush()
    monkeypatch.setattr(sys, "stdout", sys.__stdout__)
    assert errors.pending_stop() is None  # the next command in this process is not stopped by it
    assert main([*TRAIN, "--out-dir", str(tmp_path), "--resume", "auto", "--name", "a"]) == 0
    assert (tmp_path / "a" / "summary.json").is_file()


def test_a_read_only_command_whose_reader_went_away_ends_quietly_with_141(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdout", _reader_gone())
    assert main(["models"]) == 128 + signal.SIGPIPE
    assert capsys.readouterr().err == ""


def test_a_stdout_that_cannot_be_written_ends_in_one_line_naming_it(monkeypatch, capsys):
    full = io.TextIOWrapper(open("/dev/full", "wb"), line_buffering=True)  # noqa: SIM115 - closed with the test
    monkeypatch.setattr(sys, "stdout", full)
    try:
        assert main(["models"]) == 2
        assert capsys.readouterr().err == "cnnpar: error: stdout: cannot be written (No space left on device)\n"
    finally:
        full.close()


class _TerminalGone(io.StringIO):
    """A terminal that went away under a command that outlived it (`cnnpar train & disown`, the window closed): the
    tty's writes fail with EIO."""

    def write(self, text: str) -> int:
        raise OSError(errno.EIO, os.strerror(errno.EIO))


def test_a_command_whose_stdout_and_stderr_terminal_went_away_ends_2_without_a_traceback(monkeypatch):
    """stdout's EIO ends it as a stream that cannot be written (exit 2, as /dev/full: with stderr elsewhere, its line
    names stdout); its line to the same gone terminal raised again, out of the error's own handler: a traceback, 1."""
    monkeypatch.setattr(sys, "stdout", _TerminalGone())
    monkeypatch.setattr(sys, "stderr", _TerminalGone())
    assert main(["models"]) == 2


class _FullAfterEpoch1(io.StringIO):
    """A stdout whose disk fills once epoch 1's line (written after its checkpoint) is in it."""

    def write(self, text: str) -> int:
        if "epoch 1/" in self.getvalue():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(text)


def test_a_train_whose_stdout_fills_after_a_saved_epoch_says_what_is_kept_and_how_to_continue(
    tmp_path, monkeypatch, capsys
):
    """The one line named stdout and left the user to guess what the run folder keeps: a Ctrl-C's stop line says it,
    but that line went to the stdout that cannot be written."""
    monkeypatch.setattr(sys, "stdout", _FullAfterEpoch1())
    assert main([*TRAIN, "--epochs", "3", "--out-dir", str(tmp_path), "--name", "f"]) == 2
    monkeypatch.setattr(sys, "stdout", sys.__stdout__)
    run = tmp_path / "f"
    kept = f"the checkpoint in {run} holds epoch 1; continue with: cnnpar train --resume {run}"
    assert capsys.readouterr().err == f"cnnpar: error: stdout: cannot be written (No space left on device); {kept}\n"
    assert (run / "ckpt" / "last.pt").is_file()


def test_a_threads_write_to_a_gone_reader_notes_the_stop_and_the_main_thread_raises_it():
    stream = StopWhenGone(_reader_gone(), "stdout")
    raised = []

    def write():
        try:
            print("from a feeder thread", file=stream, flush=True)
        except BaseException as e:  # noqa: BLE001 - what the thread saw is the assertion
            raised.append(e)

    errors.forget_stop()
    try:
        thread = threading.Thread(target=write)
        thread.start()
        thread.join()
        assert raised == []
        with pytest.raises(errors.Terminated) as stop:
            errors.raise_pending_stop()
        assert stop.value.signum == signal.SIGPIPE and stop.value.signal_name == "SIGPIPE"
    finally:
        errors.forget_stop()


def test_cnnpar_train_piped_into_a_reader_that_closes_early_ends_141_without_a_traceback(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    cmd = [sys.executable, "-m", "cnnpar", *TRAIN, "--out-dir", str(tmp_path), "--name", "a"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) as proc:
        proc.stdout.readline()
        proc.stdout.close()  # as `head -1` does
        err = proc.stderr.read().decode()
    assert proc.returncode == 128 + signal.SIGPIPE, err
    assert "Traceback" not in err and "Exception ignored" not in err
    assert "cnnpar train --resume" in err
    assert main([*TRAIN, "--out-dir", str(tmp_path), "--resume", "auto", "--name", "a"]) == 0


def test_a_tune_whose_stdout_reader_went_away_says_where_its_best_config_is_on_stderr(tmp_path, monkeypatch, capsys):
    import cnnpar.bench.tune as tune_mod
    from tests.unit.test_tune import FakeMachine, resnet50

    r, w = os.pipe()
    monkeypatch.setattr(
        sys, "stdout", StopWhenGone(io.TextIOWrapper(os.fdopen(w, "wb"), line_buffering=True), "stdout")
    )
    out = tmp_path / "tuned.toml"
    m = FakeMachine(rate=lambda c: {64: 100.0, 128: 150.0, 256: 151.0}[c.run.batch_size], cost=lambda c: 1.0)
    real = m.run_trial

    def reader_gone_at_the_fourth(cfg, limit):
        if len(m.calls) == 3:
            os.close(r)  # `| head` has read its lines
            print("tune [  40 s] the fourth trial ...")
        return real(cfg, limit)

    errors.forget_stop()
    try:
        with pytest.raises(errors.Terminated):
            tune_mod.tune(resnet50(), 600, out, run_trial=reader_gone_at_the_fourth, clock=m.clock)
    finally:
        errors.forget_stop()
    assert f"tune: stopped; the best config so far (3 trial(s), 3 measured) is in {out}" in capsys.readouterr().err


def test_a_launch_whose_rank_0_found_its_reader_gone_ends_as_a_stop_not_as_a_rank_that_failed():
    """`cnnpar train --nproc 2 | head -2`: rank 0 stopped (141), rank 1 then lost its peer; the launcher said "rank 0
    failed first (exit code 141)" and ended 1."""
    from cnnpar.errors import EXIT_ANOTHER_RANK_ENDED
    from cnnpar.torchrun import EndedByTorchrun, stopped_by_its_reader
    from tests.unit.test_dist_launch import _failure

    ended = EndedByTorchrun()
    reader_gone = {0: _failure(128 + signal.SIGPIPE, 10), 1: _failure(EXIT_ANOTHER_RANK_ENDED, 11, timestamp=99)}
    assert stopped_by_its_reader(reader_gone, ended)
    # a rank that failed by itself first is still that failure, though another then found the reader gone
    failed_first = {0: _failure(128 + signal.SIGPIPE, 10, timestamp=101), 1: _failure(2, 11)}
    assert not stopped_by_its_reader(failed_first, ended)


def test_a_rank_whose_reader_went_away_tells_the_job_and_the_others_end_as_that_stop_quietly(
    tmp_path, monkeypatch, capsys
):
    """`cnnpar train --nproc 2 | head -2` ended 141, but after rank 1's "another rank of the job ended" line and
    torchrun's "failed (exitcode: 141)" and "Sending process ... closing signal SIGTERM" lines, where a Ctrl-C's
    stop is said once: the rank that found the reader gone notes it beside the launcher's run-folder note, before its
    teardown closes the sockets the other ranks wait on."""
    import logging

    from cnnpar import cli, dist
    from cnnpar.torchrun import QuietAfterANote, reader_gone_note

    note = tmp_path / "notes" / "run_dir"
    note.parent.mkdir()
    monkeypatch.setenv(cli.RUN_DIR_NOTE_ENV, str(note))
    quiet = QuietAfterANote(None, reader_gone_note(note))  # torchrun's filter on its workers' logger
    assert quiet.filter(logging.makeLogRecord({}))  # a failure before it is said
    monkeypatch.setattr(sys, "stdout", _reader_gone())  # rank 0's
    assert main([*TRAIN, "--out-dir", str(tmp_path), "--name", "a"]) == 128 + signal.SIGPIPE
    monkeypatch.setattr(sys, "stdout", sys.__stdout__)
    assert reader_gone_note(note).is_file() and not quiet.filter(logging.makeLogRecord({}))
    capsys.readouterr()

    def rank_1_loses_its_peer(args, argv):
        raise RuntimeError("[gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:27018")

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv(dist.LAUNCHED_NPROC_ENV, "2")
    monkeypatch.setattr(cli, "cmd_train", rank_1_loses_its_peer)
    assert main(["train"]) == 128 + signal.SIGPIPE  # the job's stop; torchrun.stopped_by_its_reader reads it so
    assert capsys.readouterr().err == ""
    reader_gone_note(note).unlink()  # another launch: a lost peer is said, as before
    assert main(["train"]) != 128 + signal.SIGPIPE
    assert "another rank of the job ended" in capsys.readouterr().err


def test_a_refusal_whose_stderr_reader_went_away_ends_141_not_in_an_uncaught_stop(monkeypatch):
    """The refusal's line raised the stop inside run_command's own error handling, which let it out of main."""
    monkeypatch.setattr(sys, "stderr", _reader_gone())
    try:
        rc = main(["train", "--model", "nope"])
    except KeyboardInterrupt as e:  # (left to itself it would end pytest's session)
        pytest.fail(f"the stop left main: {e!r}")
    assert rc == 128 + signal.SIGPIPE


def test_a_command_in_a_thread_whose_reader_went_away_leaves_no_stop_for_the_next_one(monkeypatch):
    """A notebook's background run (cli.main in a thread, where no handlers are set) whose stdout reader went away
    ended 141, and left its stop pending: the thread's next command, its output fine, ended 141 too."""
    codes = []

    def command():
        codes.append(main(["models"]))

    errors.forget_stop()
    try:
        for stdout in (_reader_gone(), io.StringIO()):
            monkeypatch.setattr(sys, "stdout", stdout)
            thread = threading.Thread(target=command)
            thread.start()
            thread.join()
        assert codes == [128 + signal.SIGPIPE, 0]
        assert errors.pending_stop() is None
    finally:
        errors.forget_stop()


def test_a_tune_stopped_by_sigterm_whose_reader_went_away_ends_as_that_sigterm(tmp_path, monkeypatch, capsys):
    """`cnnpar tune ... 2>&1 | tee log`, tee killed with the job: tune's stop line found the reader gone and raised a
    second stop (SIGPIPE, 141) in place of the SIGTERM (143) that a scheduler checks."""
    import cnnpar.bench.tune as tune_mod
    from tests.unit.test_tune import FakeMachine, resnet50

    readers = []
    for name in ("stdout", "stderr"):
        r, w = os.pipe()
        readers.append(r)
        monkeypatch.setattr(sys, name, StopWhenGone(io.TextIOWrapper(os.fdopen(w, "wb"), line_buffering=True), name))
    m = FakeMachine(rate=lambda c: {64: 100.0, 128: 150.0, 256: 151.0}[c.run.batch_size], cost=lambda c: 1.0)
    real = m.run_trial

    def sigterm_at_the_fourth(cfg, limit):
        if len(m.calls) == 3:
            for r in readers:  # tee, killed with the job
                os.close(r)
            errors.note_stop(signal.SIGTERM)  # as errors.stop_on_signals' handler does before it raises
            raise errors.Terminated(signal.SIGTERM)
        return real(cfg, limit)

    errors.forget_stop()
    try:
        with pytest.raises(errors.Terminated) as stop:
            tune_mod.tune(resnet50(), 600, tmp_path / "tuned.toml", run_trial=sigterm_at_the_fourth, clock=m.clock)
        assert stop.value.signum == signal.SIGTERM
        assert errors.pending_stop().signum == signal.SIGTERM
    finally:
        errors.forget_stop()
    assert (tmp_path / "tuned.toml").is_file()  # the best config so far, written as the stop's clean-up


class _SaysInItsWorker(torch.utils.data.Dataset):
    """A data set whose worker prints on stderr (a decoder library's message on a damaged file)."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, k: int) -> int:
        print(f"image {k}: corrupt EXIF data", file=sys.stderr, flush=True)
        return k


def test_a_dataloader_workers_write_to_a_gone_reader_goes_nowhere_and_the_main_process_stops_at_its_own():
    """A forked worker inherits the command's stderr (StopWhenGone): its write to a reader gone raised the stop in
    the worker, whose loop took it for a Ctrl-C and left, and the main process failed with "DataLoader worker exited
    unexpectedly" and a traceback (exit 1). The worker's write goes nowhere; the main process stops at its own next
    write, as by SIGPIPE (141)."""
    stderr = sys.stderr
    sys.stderr = StopWhenGone(_reader_gone(), "stderr")
    loader = torch.utils.data.DataLoader(_SaysInItsWorker(), num_workers=1, multiprocessing_context="fork")
    errors.forget_stop()
    try:
        assert [int(x) for x in loader] == [0, 1, 2, 3]
        assert errors.pending_stop() is None  # the worker's note is its own process's
        with pytest.raises(errors.Terminated):
            print("epoch 1/1 ...", file=sys.stderr, flush=True)
    finally:
        sys.stderr = stderr
        errors.forget_stop()


def test_a_full_pipe_on_a_non_blocking_stdout_is_waited_for_and_every_line_arrives():
    """Some CI runners leave O_NONBLOCK set on stdout: a write that found the pipe full (EAGAIN) ended the command
    with "stdout: cannot be written", exit 2, and its descriptor on os.devnull for good."""
    r, w = os.pipe()
    os.set_blocking(w, False)
    stream = io.TextIOWrapper(os.fdopen(w, "wb"), encoding="utf-8")
    out = StopWhenGone(stream, "stdout")
    lines = [f"line {i} {'x' * 200}\n" for i in range(2000)]  # ~420 KB: more than a pipe holds (64 KiB on Linux)
    got = []

    def drain_later():  # nobody reads until the writes have filled the pipe
        import time

        time.sleep(0.3)
        with os.fdopen(r, "rb") as reader:
            got.append(reader.read())

    drainer = threading.Thread(target=drain_later)
    drainer.start()
    for line in lines[:1000]:
        out.write(line)
    out.writelines(lines[1000:])
    out.flush()
    assert not out.gone and not _on_devnull(w)
    stream.close()
    drainer.join(timeout=30)
    assert got == ["".join(lines).encode()]


class _ReaderGoneAt(io.StringIO):
    """A stdout whose reader goes away as the line holding `at` comes."""

    def __init__(self, at: str) -> None:
        super().__init__()
        self.at = at

    def write(self, text: str) -> int:
        if self.at in text:
            raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))
        return super().write(text)


def test_a_doctor_whose_reader_went_away_leaves_no_report_cut_short_as_on_a_ctrl_c(tmp_path, monkeypatch, capsys):
    """`cnnpar doctor | head -1` ends 141 and quietly; its report folder is as a Ctrl-C at the same point leaves it:
    none before the tries (nothing measured to the end), and during them the whole report of the phases before,
    saying which try the stop cut short (doctor.run._examine: the_stop reads the SIGPIPE stop as any stop)."""
    import json

    from cnnpar.doctor import run as doctor_run

    monkeypatch.setattr(doctor_run, "fixed_cost", lambda full, half: 0.9 * full.s_per_batch)  # a batch to try
    small = ["doctor", "--data", "synthetic", "--image-shape", "1x8x8", "--synthetic-samples", "30", "--workers", "0"]
    small += ["--model", "cnn3", "--device", "cpu", "--batch-size", "16", "--warmup-steps", "1", "--measure-steps", "3"]
    before = tmp_path / "before"
    monkeypatch.setattr(sys, "stdout", _ReaderGoneAt("measuring end to end"))
    assert main([*small, "--report-dir", str(before)]) == 128 + signal.SIGPIPE
    assert capsys.readouterr().err == "" and not before.exists()
    during = tmp_path / "during"
    monkeypatch.setattr(sys, "stdout", _ReaderGoneAt("measuring try:"))
    assert main([*small, "--report-dir", str(during), "--try", "1"]) == 128 + signal.SIGPIPE
    assert capsys.readouterr().err == ""
    result = json.loads((during / "doctor.json").read_text())
    assert result["stopped"] == "SIGPIPE during the try of larger batch" and not result["tries"]
    assert "Stopped (SIGPIPE during the try of larger batch)" in (during / "report.md").read_text()
