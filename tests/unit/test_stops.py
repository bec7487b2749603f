"""A stop (SIGTERM from `timeout` or a scheduler, a Ctrl-C) is a stop wherever it lands: remembered where Python
drops its raise, read through the errors torch raises over it, never the death of a DataLoader worker, and said once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from cnnpar import errors
from cnnpar.config import Config, DataConfig, RunConfig, resolve_for_device
from cnnpar.data import load_data
from cnnpar.data.loader import build_loader, shutdown_workers
from cnnpar.dist import DistInfo
from cnnpar.engine.stops import the_stop
from cnnpar.errors import Terminated


@pytest.fixture
def stop_handlers():
    """cnnpar's handlers for the test, then the process's own again, and no stop left pending."""
    handlers, hook = {s: signal.getsignal(s) for s in errors.STOP_SIGNALS}, sys.unraisablehook
    try:
        yield
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
        sys.unraisablehook = hook
        errors.forget_stop()


class _Finaliser:
    """A SIGTERM that comes while a finaliser runs, as it came in torch's DataLoader iterator's __del__."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler runs here; its raise goes nowhere


def test_a_stop_whose_raise_a_finaliser_dropped_is_raised_at_the_next_safe_point(stop_handlers):
    dropped = []
    sys.unraisablehook = dropped.append  # what prints "Exception ignored in ..."
    errors.stop_on_signals()
    _Finaliser()
    assert isinstance(errors.pending_stop(), Terminated)  # remembered, though its raise was dropped
    with pytest.raises(Terminated):
        errors.raise_pending_stop()
    assert dropped == []  # nothing printed above the stop line
    errors.stop_on_signals()  # a new command in the same process starts with no stop
    errors.raise_pending_stop()


def _raised(error: BaseException, over: BaseException | None = None, cause: BaseException | None = None):
    """`error` as raised: over `over` (its __context__) or from `cause`."""
    try:
        try:
            if over is not None:
                raise over
        finally:
            if cause is not None:
                raise error from cause
            raise error
    except BaseException as e:  # noqa: BLE001 - handed back to the test
        return e


def test_the_stop_follows_what_torch_raised_from_a_workers_death_by_it():
    killed = "DataLoader worker (pid 7) is killed by signal: {}. "
    gone = RuntimeError("DataLoader worker (pid(s) 7) exited unexpectedly")
    stop = Terminated()
    # "exited unexpectedly" from the worker's death by the group's SIGTERM, itself raised over the run's stop
    e = _raised(gone, cause=_raised(RuntimeError(killed.format("Terminated")), over=stop))
    assert the_stop(e) is stop
    # the run's own raise dropped: the stop the signal means, SIGTERM's or Ctrl-C's
    e = _raised(
        RuntimeError("DataLoader worker (pid(s) 7) exited unexpectedly"),
        cause=RuntimeError(killed.format("Terminated")),
    )
    assert type(the_stop(e)) is Terminated
    e = _raised(
        RuntimeError("DataLoader worker (pid(s) 7) exited unexpectedly"), cause=RuntimeError(killed.format("Interrupt"))
    )
    assert type(the_stop(e)) is KeyboardInterrupt
    # a worker the kernel's out-of-memory killer ended is no stop; nor is another error
    e = _raised(
        RuntimeError("DataLoader worker (pid(s) 7) exited unexpectedly"), cause=RuntimeError(killed.format("Killed"))
    )
    assert the_stop(e) is None
    assert the_stop(ValueError("x")) is None and the_stop(None) is None


def test_any_error_while_a_stop_is_pending_is_that_stop(stop_handlers, monkeypatch):
    """torch broken under a stop whose raise was dropped: "'_MultiProcessingDataLoaderIter' object has no attribute
    '_workers_status'" (its iterator half made) ended the run's log instead of the stop line."""
    error = AttributeError("'_MultiProcessingDataLoaderIter' object has no attribute '_workers_status'")
    assert the_stop(error) is None
    monkeypatch.setattr(errors, "_stop_seen", signal.SIGINT)
    assert type(the_stop(error)) is KeyboardInterrupt


@pytest.mark.parametrize("sig", ["TERM", "HUP"])
def test_loader_workers_outlive_the_groups_stop_and_leave_when_the_loader_stops_them(sig):
    """`timeout` signals the whole process group: torch's worker handler killed each worker (SIGTERM's default action
    for any sender but its parent), which left its pymp-* folder in /tmp and raised "DataLoader worker ... is killed
    by signal: Terminated" in the main process, over its stop or in its place. A closing terminal's SIGHUP reaches
    the group too, and killed each worker by its default action."""
    cfg = Config(data=DataConfig(source="digits", resident="off", workers=2), run=RunConfig(batch_size=64))
    bundle = load_data(cfg.data, cfg.run.seed)
    feeder = build_loader(bundle, resolve_for_device(cfg, "cpu", True), DistInfo(0, 0, 1, torch.device("cpu")), True)
    loader = feeder.loader
    it = iter(loader)
    next(it), next(it)  # a batch from each worker: both have started (their worker_init_fn run)
    workers = list(it._workers)
    subprocess.run(["kill", f"-{sig}", *(str(w.pid) for w in workers)], check=True)  # from another process, as timeout
    time.sleep(0.5)
    assert all(w.is_alive() for w in workers)
    next(it)  # still serving batches: the main process ends them, on its stop as on any end
    shutdown_workers(loader)
    assert [w.exitcode for w in workers] == [0, 0]  # left by themselves, their clean-up run


def test_ranks_of_nproc_leave_the_interrupted_line_to_the_launcher(monkeypatch, capsys):
    """Ctrl-C under `cnnpar train --nproc 2` printed "cnnpar: interrupted" three times: the launcher's and each
    rank's, unprefixed."""
    from cnnpar import cli
    from cnnpar.dist import LAUNCHED_NPROC_ENV

    def interrupted(args, argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_models", interrupted)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv(LAUNCHED_NPROC_ENV, "2")
    assert cli.main(["models"]) == 130
    assert capsys.readouterr().err == ""
    monkeypatch.delenv(LAUNCHED_NPROC_ENV)  # a torchrun started by hand has no launcher to say it
    assert cli.main(["models"]) == 130
    assert capsys.readouterr().err == "cnnpar: interrupted\n"


def test_a_stop_while_loader_workers_start_comes_after_the_last_start_and_they_all_leave_at_once(stop_handlers):
    """audit bounds: a SIGTERM between two worker starts left torch's iterator half made (no `_workers_status`): its
    clean-up could not tell the started workers to leave and waited 5 s for each (SIGTERM they ignore), 28 s for a
    run of 8 workers stopped by `timeout`."""
    import gc
    import multiprocessing

    from cnnpar.data.workers import kill_stuck

    errors.stop_on_signals()
    started = []
    fork = multiprocessing.get_context("fork")

    class StopAfterTheFirst(fork.Process):
        def start(self):
            super().start()
            started.append(self)
            if len(started) == 1:
                os.kill(os.getpid(), signal.SIGTERM)  # as `timeout` sends it, while the others are still to start

    class StoppingContext(type(fork)):
        Process = StopAfterTheFirst

    cfg = Config(data=DataConfig(source="digits", resident="off", workers=3), run=RunConfig(batch_size=64))
    bundle = load_data(cfg.data, cfg.run.seed)
    loader = build_loader(bundle, resolve_for_device(cfg, "cpu", True), DistInfo(0, 0, 1, torch.device("cpu")), True)
    loader.loader.multiprocessing_context = StoppingContext()
    try:
        with pytest.raises(Terminated):
            iter(loader.loader)
        assert len(started) == 3  # the stop waited for the iterator to be whole
        gc.collect()  # the iterator's clean-up (its __del__), as when the stop's traceback is dropped
        begin = time.monotonic()
        for w in started:
            w.join(3)
        assert [w.exitcode for w in started] == [0, 0, 0]  # told to leave, they left by themselves
        assert time.monotonic() - begin < 3
    finally:
        kill_stuck(started, grace_s=0.0)


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="no SIGHUP off POSIX")
def test_a_closing_terminals_sighup_stops_as_a_sigterm_does_and_one_nohup_ignores_stays_ignored(stop_handlers):
    """A dropped SSH connection or a closed terminal window sends SIGHUP, whose default action ended the run at
    once, as a SIGKILL would: no stop line, nothing said of what was kept, its DataLoader workers orphaned."""
    from cnnpar.cli import stopped

    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    errors.stop_on_signals()
    with pytest.raises(Terminated) as raised:
        signal.raise_signal(signal.SIGHUP)
    assert raised.value.signum == signal.SIGHUP and type(errors.pending_stop()) is Terminated
    assert stopped(raised.value) == 129
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # `nohup cnnpar train`: the user asked for the run to outlive it
    errors.stop_on_signals()
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
