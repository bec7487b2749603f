"""Spawned and forkserver DataLoader workers ignore the stop signals from their start (worker_start.py)."""

from __future__ import annotations

import multiprocessing
import signal
import sys
import threading
import warnings

import pytest
import torch

from cnnpar.config import Config, DataConfig, RunConfig, resolve_for_device
from cnnpar.data import load_data
from cnnpar.data.loader import build_loader
from cnnpar.dist import DistInfo
from cnnpar.worker_start import QuietSpawnContext, worker_context
from tests.datafiles import write_noise_jpegs

CPU = DistInfo(0, 0, 1, torch.device("cpu"))


# a Ctrl-C, `timeout` or a scheduler, a closing terminal: each reaches the whole process group
STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def stops_now() -> list[str]:
    return [repr(signal.getsignal(s)) for s in STOPS]


class SeesSigint:
    """Records, as it is unpickled in the child, how the stop signals are handled there: a DataLoader worker's data
    set is unpickled as this is, after its target (torch's worker loop, whose import takes seconds)."""

    def __init__(self, seen: list[str] | None = None) -> None:
        self.seen = seen

    def __reduce__(self):
        return SeesSigint.unpickled, ()

    @staticmethod
    def unpickled() -> SeesSigint:
        return SeesSigint(stops_now())


def report(probe: SeesSigint, results) -> None:
    results.put((probe.seen, stops_now()))


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_worker_ignores_the_stop_signals_before_its_state_is_read(method):
    context = worker_context(method)
    results = context.SimpleQueue()
    child = context.Process(target=report, args=(SeesSigint(), results))
    child.start()
    seen, later = results.get()
    child.join(30)
    # the plain context's child had Python's KeyboardInterrupt handler there: a Ctrl-C while it imported torch
    # printed a traceback from every worker, and a closing terminal's SIGHUP killed each
    assert seen == later == [repr(signal.SIG_IGN)] * len(STOPS)
    assert child.exitcode == 0


def test_fork_keeps_the_default_context():
    assert worker_context("fork") is None


def one_epoch(feeder) -> list[torch.Tensor]:
    feeder.set_epoch(1, 1001)
    try:
        return [x.clone() for x, _ in feeder]
    finally:
        feeder.close()


def test_where_spawn_is_the_default_a_photo_run_gets_quiet_workers_and_the_same_crops(tmp_path, monkeypatch):
    root = write_noise_jpegs(tmp_path / "photos", 12, first_height=40, width=56)
    data = DataConfig(source=str(root), image_size=24, workers=2, val_fraction=0.25)
    cfg = resolve_for_device(Config(data=data, run=RunConfig(batch_size=4, seed=3)), "cpu", False)
    bundle = load_data(cfg.data)
    forked = one_epoch(build_loader(bundle, cfg, CPU, train=True))

    # macOS's default (and Python 3.14's forkserver on Linux): the workers start a new interpreter
    monkeypatch.setattr(multiprocessing, "get_start_method", lambda allow_none=False: "spawn")
    feeder = build_loader(bundle, cfg, CPU, train=True)
    assert isinstance(feeder.loader.multiprocessing_context, QuietSpawnContext)
    spawned = one_epoch(feeder)
    # the epoch's seed reaches spawned workers as it does forked ones (loader.ReseedingWorkers)
    assert len(spawned) == len(forked) and all(torch.equal(a, b) for a, b in zip(spawned, forked))


@pytest.mark.skipif(sys.version_info < (3, 12), reason="the fork warning is Python 3.12's")
def test_forked_workers_started_beside_a_thread_say_no_fork_deprecation(tmp_path):
    """Python 3.12's DeprecationWarning about fork() in a multi-threaded process came at every photo run's first
    DataLoader start (torch's intra-op pool is a thread by then), shown with -W default and in pytest's summary."""
    root = write_noise_jpegs(tmp_path / "photos", 8, first_height=40, width=56)
    data = DataConfig(source=str(root), image_size=24, workers=2, val_fraction=0)
    cfg = resolve_for_device(Config(data=data, run=RunConfig(batch_size=4, seed=3)), "cpu", False)
    feeder = build_loader(load_data(cfg.data), cfg, CPU, train=True)
    done = threading.Event()
    beside = threading.Thread(target=done.wait)  # as tqdm's monitor, or torch's pool: a second thread at the fork
    beside.start()
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            batches = one_epoch(feeder)
    finally:
        done.set()
        beside.join()
    assert len(batches) == 2
    assert [str(w.message) for w in seen if "fork()" in str(w.message)] == []


def test_a_loader_start_that_forks_nothing_leaves_the_warnings_already_shown_alone():
    # catch_warnings moves the filters' version, so that a warning shown once at its place (the default action)
    # shows again: around every epoch's loader start, a warning the step gives came back each epoch
    from torch.utils.data import TensorDataset

    from cnnpar.data.loader import _WholeIterators

    loader = _WholeIterators(TensorDataset(torch.arange(4.0)), batch_size=2, num_workers=0)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        for _ in range(3):
            assert len(list(loader)) == 2
            warnings.warn("a notice the step gives", UserWarning, stacklevel=1)  # one place, three epochs
    assert [str(w.message) for w in seen] == ["a notice the step gives"]
