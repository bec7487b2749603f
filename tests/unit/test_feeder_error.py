"""A DataLoader worker's batch that cannot be handed over (out of open files, /dev/shm full) is replaced by its error
(workers.report_unsent_batches); where the worker's queue is already closed, because the main process stopped the
workers after an earlier batch's error, there is no one to tell, and nothing more is printed."""

from __future__ import annotations

import errno
import multiprocessing
import multiprocessing.queues
import sys

import torch

from cnnpar.data import workers
from cnnpar.errors import TooManyOpenFiles


def test_a_batch_unsent_after_its_queue_closed_adds_no_traceback(monkeypatch):
    """CI at ed26cdb (test_open_files.py's low hard limit): the feeder thread's hook put the batch's error on a queue
    the shutdown had closed, and its ValueError "Queue ... is closed" printed a traceback under the run's one line."""
    monkeypatch.setattr(
        multiprocessing.queues.Queue, "_on_queue_feeder_error", multiprocessing.queues.Queue._on_queue_feeder_error
    )
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # report_unsent_batches sets both, in a worker
    workers.report_unsent_batches(prefetch=2)
    hook = multiprocessing.queues.Queue._on_queue_feeder_error
    out_of_files = OSError(errno.EMFILE, "Too many open files")
    open_queue = multiprocessing.get_context("fork").Queue()
    hook(open_queue, out_of_files, (3, torch.zeros(2)))
    index, wrapped = open_queue.get(timeout=10)  # an open queue still gets the batch's error, as before
    assert index == 3 and wrapped.exc_type is TooManyOpenFiles
    closed = multiprocessing.get_context("fork").Queue()
    closed.close()
    assert hook(closed, out_of_files, (4, torch.zeros(2))) is None  # it raised ValueError: Queue ... is closed
