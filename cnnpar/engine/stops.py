"""How a run's stop is told from a failure, and what must close however a run ends.

A Ctrl-C, SIGTERM or SIGHUP (errors.Terminated) can surface as another error: one raised while the stop was pending,
or a DataLoader worker the stop's signal killed. `the_stop` names the stop behind any of them, for the trainer's
`fit`, the CLI, the doctor and the bench, which end on the stop and not on a failure it caused.
"""

from __future__ import annotations

import contextlib
import sys
import warnings

from cnnpar.data.worker_crash import worker_signal
from cnnpar.errors import STOP_SIGNALS, chain, pending_stop, stop_for


@contextlib.contextmanager
def closing_feeders(*feeders):
    """Close the feeders (their decoders' outside resources) when the run ends, however it ends;
    one that fails to close is reported without hiding the run's own error or the other feeder. Entered from the
    clean-up of a stop (`Trainer.close` in a `finally` that a Ctrl-C or SIGTERM unwinds: the doctor's tries, the
    bench), the stop in flight counts as the block's own."""
    stopping = the_stop(sys.exc_info()[1]) is not None or pending_stop() is not None
    try:
        yield
    except BaseException as e:
        stopping = stopping or the_stop(e) is not None
        raise
    finally:
        for feeder in feeders:
            if feeder is None:
                continue
            try:
                feeder.close()
            except Exception as e:  # noqa: BLE001 - a warning, then the next feeder
                if not (stopping and _worker_stopped_with_the_run(e)):
                    warnings.warn(f"closing a data feeder failed: {e!r}", stacklevel=2)


def the_stop(e: BaseException | None) -> KeyboardInterrupt | None:
    """The Ctrl-C, SIGTERM or SIGHUP (errors.Terminated) that ended the way `e` took, or None where `e` is no stop's:
    - `e` itself;
    - any error raised while a stop a handler saw is pending (errors.pending_stop): its own raise was dropped in a
      finaliser, or torch's internals broke under it ("exited unexpectedly", an iterator half made), and the run
      ended in that traceback, with no stop line;
    - a DataLoader worker killed by a stop signal (errors.STOP_SIGNALS; worker_signal, through the errors it was
      raised from or over: "exited unexpectedly" from "is killed by signal: Terminated"): `timeout`, a Ctrl-C and a
      closing terminal signal the whole process group, and torch's SIGCHLD handler raises the worker's death
      wherever the main thread is, in place of the stop or over it; the stop it replaced where the chain holds one,
      else the one its signal means."""
    if isinstance(e, KeyboardInterrupt):
        return e
    if not isinstance(e, Exception):
        return None
    pending = pending_stop()
    if pending is not None:
        return pending
    sig = worker_signal(e)
    if sig not in STOP_SIGNALS:
        return None
    return _stop_in_chain(e) or stop_for(sig)


def raise_if_the_stop(e: BaseException) -> None:
    """Raise the stop that `e` is the doing of (`the_stop`), for a caller that turns every other error into a
    result (a bench rung or seed "failed", a doctor's try): `timeout` then went on as if a rung had failed."""
    stop = the_stop(e)
    if stop is not None:
        raise stop from None


def _stop_in_chain(e: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt that `e` was raised from or over, if any."""
    return next((x for x in chain(e) if isinstance(x, KeyboardInterrupt)), None)


def close_batches(batches) -> None:
    """Close an epoch's or an evaluation's batch iterator, also when it ends in an error (out of memory, Ctrl-C): a
    DeviceFeeder's threads must not go on decoding ahead while the run's end closes the decoders under them, or wait
    in a loader's `next()` while its workers shut down. A DataLoader's own iterator has nothing to close."""
    close = getattr(batches, "close", None)
    if close is not None:
        close()


def _worker_stopped_with_the_run(e: Exception) -> bool:
    """A DataLoader worker that died of the SIGTERM or SIGINT that stopped the run: `timeout` and a Ctrl-C signal
    the whole process group, workers included, and closing the loader then raised torch's "is killed by signal:
    Terminated" above the stop line, as if something had failed. A worker killed otherwise is still said."""
    return worker_signal(e) in STOP_SIGNALS
