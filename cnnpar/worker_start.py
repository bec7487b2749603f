"""DataLoader workers started by spawn or a forkserver that ignore the stop signals (errors.STOP_SIGNALS: SIGINT,
SIGTERM, SIGHUP) from their first moment.

A forked worker is running cnnpar's code at once, and its `worker_init_fn` (loader.leave_stops_to_the_main_process)
ignores the run's stop signals within milliseconds. A spawned worker (macOS and Windows by default, Python 3.14's
forkserver on Linux, and the workers that decode on the GPU) first starts a new interpreter and imports torch, for
seconds; a Ctrl-C then reached it with SIGINT's default handler: each worker printed a KeyboardInterrupt traceback
over the run's own "stopped" line, and a SIGTERM killed it by signal. Here the worker's process object, as it is
unpickled in the child, ignores them before anything else is read (its state, which imports torch, comes after).

The bottom layer: only the standard library (and cnnpar.errors, which imports no more), so that importing it in the
child imports nothing heavy first.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import signal

from cnnpar.errors import STOP_SIGNALS


def _ignore_stops_then_make(cls: type):
    """Runs first in the child, before the process's state (its target, the data set) is unpickled."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    return cls.__new__(cls)


class _IgnoresStopsFirst:
    def __reduce__(self):
        # pickle calls the constructor before it reads the state: the signals are ignored before torch is imported
        return _ignore_stops_then_make, (type(self),), self.__dict__


class QuietSpawnProcess(_IgnoresStopsFirst, multiprocessing.context.SpawnProcess):
    pass


class QuietForkServerProcess(_IgnoresStopsFirst, multiprocessing.context.ForkServerProcess):
    pass


class QuietSpawnContext(multiprocessing.context.SpawnContext):
    Process = QuietSpawnProcess


class QuietForkServerContext(multiprocessing.context.ForkServerContext):
    Process = QuietForkServerProcess


def worker_context(start_method: str | None = None) -> multiprocessing.context.BaseContext | None:
    """The DataLoader's `multiprocessing_context` for `start_method` (default: this process's default method): one
    whose workers ignore the stop signals from their start where they are spawned or forked by a forkserver; None
    (the default, fork) where the worker runs cnnpar's code at once."""
    method = start_method or multiprocessing.get_start_method()
    if method == "spawn":
        return QuietSpawnContext()
    if method == "forkserver":
        return QuietForkServerContext()
    return None
