"""User-facing errors.

A `UserError` is bad input the user can fix (a malformed CSV row, an unknown model name, a
missing file). The CLI prints its message and exits non-zero without a Python traceback; every
other exception is a bug in cnnpar and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable, Iterator


class UserError(Exception):
    """Bad input: the message names the file, row or field and what was expected."""


class ConfigError(UserError):
    """A config field holds a value outside what it allows."""


class DataError(UserError):
    """A data file cannot be read as the format it claims to be."""


class SharedMemoryFull(UserError):
    """/dev/shm has no room for the batches DataLoader workers hand over (data/workers.py)."""


class SharedMemoryUnwritable(UserError):
    """/dev/shm cannot be written (a read-only mount): DataLoader workers' queue locks live there (data/workers.py)."""


class TooManyOpenFiles(UserError):
    """The open-files limit (ulimit -n) ran out where DataLoader workers hand batches over (host_facts)."""


class OutputNotWritable(UserError):
    """stdout or stderr cannot be written (stdout on /dev/full: ENOSPC; console.StopWhenGone)."""


class DeviceMemoryFull(UserError):
    """The device ran out of memory for the settings the user chose (a batch, an image size, a model): the phase,
    the batch and the ways out in one line (engine/memory_full), where torch's error came in a traceback."""

    # in a run: what its resume adds to fit, half the batch and twice the accumulation (the same batch per step):
    # " --batch-size 16 --grad-accum 2"; "" for a batch of 1, or outside a run (Trainer._raise_kept sets it)
    resume_flags: str = ""


class Diverged(UserError):
    """Training that stopped being finite. `epoch`, `what` ("train loss", "val loss", "weights": the weights or
    buffers, "outputs": the loss on the epoch's last batch after its last update) and `loss` (that value; for
    "weights" inf or nan) let a caller that runs the engine under other flags (`cnnpar compare`'s torch runner) say
    it in its own terms."""

    def __init__(self, message: str, epoch: int, what: str, loss: float) -> None:
        super().__init__(message)
        self.epoch, self.what, self.loss = epoch, what, loss

    def __reduce__(self):  # a pickled copy (a worker's error sent to its parent) keeps the fields
        return type(self), (str(self), self.epoch, self.what, self.loss)


class EveryRankRefused(UserError):
    """A refusal that every rank of a job raised alike (engine/agreement.refuse_disagreeing_ranks): one command
    line on one node, a model too small for its images, say. Under `--nproc` the launcher says it once, as one
    process would (cli), where each rank printed its own copy and the launcher ended 1, not 2."""


def user_error_text(e: UserError) -> str:
    """A UserError's message for the one line the user sees. A DataLoader worker re-raises our error with its
    own traceback folded into the message ("Caught DataError in DataLoader worker process 0. Original
    Traceback ..."); the user needs only our last line, which names the file."""
    text = str(e)
    if "Original Traceback" in text:
        text = [ln for ln in text.splitlines() if ln.strip()][-1].split(": ", 1)[-1]
    return text


def say_user_error(text: str, prog: str = "cnnpar") -> int:
    """Write a UserError's line, `<prog>: error: <text>`, to stderr and return a user error's exit status, 2 (as
    argparse's refusals): every entry point ends on bad input so, with no traceback."""
    # one write: two ranks' lines written in two parts each ran together on one line
    try:
        sys.stderr.write(f"{prog}: error: {text}\n")
        sys.stderr.flush()
    except OutputNotWritable:  # stderr gone too (the terminal of both went away: EIO): nowhere to say it, still 2
        pass
    return 2


def main_saying_user_errors(main: Callable[[], int], prog: str) -> int:
    """`main()` for a module's own `__main__` (`python -m cnnpar.bench.ddp_scaling`): a UserError ends as it does
    under the `cnnpar` command, in one line and exit 2; it ended in a traceback (a full disk at the results). It
    prints as the CLI does (console.printable_stdio): its `wrote runs/café/ddp.csv` on an ASCII console was a
    UnicodeEncodeError traceback after the whole measurement."""
    from cnnpar.console import printable_stdio

    with printable_stdio():
        try:
            return main()
        except UserError as e:
            return say_user_error(user_error_text(e), prog)


def refuse_counts_under_one(*counts: tuple[str, int]) -> None:
    """(flag, value) pairs of counts a command line asks for (rounds, repeats, samples): a UserError naming the first
    under 1, which timed nothing (a median of no rounds) or ended in a traceback after work had started."""
    for flag, n in counts:
        if n < 1:
            raise UserError(f"{flag} {n}: expected a whole number of 1 or more")


def brief_repr(value) -> str:
    """A value as an error line names it, its repr cut to 40 characters: a field of a file handed on by someone else
    (a store's header, a checkpoint's meta) can hold a list of a million items."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def chain(e: BaseException | None) -> Iterator[BaseException]:
    """`e`, then each error it was raised from or over (`__cause__`, else `__context__`), each once: where a
    stop, a worker's death or a host limit lies behind the error a library raised last."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def first_line(e: BaseException) -> str:
    """The first line of an exception's message, for a one-line report; its type when it has none."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


# The exit statuses of a rank of a job that stopped because of another rank, not by an error of its own (cli.main):
# a collective of its found the other's process gone, or timed out waiting for it (--timeout-s). The launcher
# (cnnpar.torchrun) then names a rank that failed by itself, where one did, not one of these.
EXIT_ANOTHER_RANK_ENDED = 3
EXIT_COLLECTIVE_TIMED_OUT = 4


class Terminated(KeyboardInterrupt):
    """SIGTERM, or SIGHUP (the terminal closed), raised where the process is: the clean-up a Ctrl-C runs then runs
    for it too. `signum` is the signal: the stop line names it, and the exit status is 128 + it (143, 129)."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__()
        self.signum = signum

    @property
    def signal_name(self) -> str:
        if self.signum not in signal.valid_signals():
            return "SIGPIPE"  # the one stop (a reader gone) whose signal Windows lacks: errors.SIGPIPE
        return signal.Signals(self.signum).name


# The signals that stop a command as a Ctrl-C does, with its clean-up run: SIGINT (a Ctrl-C), SIGTERM (`timeout`,
# `kill`, a scheduler) and SIGHUP (its terminal went away: an SSH connection dropped, a terminal window closed; the
# kernel sends it to the terminal's foreground group). Python's default for SIGHUP ended the run at once, as a
# SIGKILL would: no stop line, its DataLoader workers left to torch's watchdog. `nohup` leaves it ignored.
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))

# Windows has neither SIGPIPE nor SIGKILL, and `signal.SIGPIPE` there stopped a command with an AttributeError:
# Linux's numbers stand in, so a reader gone still stops as by SIGPIPE (exit 141), and a comparison with SIGKILL
# is simply never true (nothing is killed by it there)
SIGPIPE = getattr(signal, "SIGPIPE", 13)
SIGKILL = getattr(signal, "SIGKILL", 9)


# The stop the handlers of `stop_on_signals` saw (SIGTERM, SIGHUP or SIGINT), kept beside the exception they raise:
# raised while torch runs a finaliser (a DataLoader iterator's __del__ joining its workers) or a fork hook (logging's
# _releaseLock, as a loader forks its workers), that exception is printed as "Exception ignored in ..." and dropped,
# and a run stopped by `timeout` trained on to its last epoch and ended `done:`. The loops ask at their safe points
# (`raise_pending_stop`: each step, each batch, an epoch's end), and `engine/stops.the_stop` reads any error raised
# after it as its consequence.
_stop_seen: int | None = None


def stop_for(signum: int) -> KeyboardInterrupt:
    """The exception a stop by `signum` raises: KeyboardInterrupt for SIGINT (exit 130), else Terminated (143 for
    SIGTERM, 129 for SIGHUP)."""
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def pending_stop() -> KeyboardInterrupt | None:
    """The stop a handler saw in this process, as a new exception to raise; None where none came."""
    return None if _stop_seen is None else stop_for(_stop_seen)


def raise_pending_stop() -> None:
    """At a safe point of a loop: raise the stop a handler saw, whose own raise Python may have dropped."""
    if _stop_seen is not None:
        raise stop_for(_stop_seen)


def forget_stop() -> None:
    """No stop seen: for a new command in the same process (cli.main), and for tests."""
    global _stop_seen
    _stop_seen = None


def stop_on_signals() -> None:
    """`timeout`, `kill` and job schedulers send SIGTERM, which ends Python without running `finally` or
    `except` blocks: raise `Terminated` instead, so a command's clean-up runs as for Ctrl-C (train keeps its
    finished epochs and removes a half-written checkpoint; tune kills its running child, which lives in its own
    session and would outlive the parent; prepare removes its half-written store). The CLI exits 143 for it.
    Both that SIGTERM and a Ctrl-C (where Python's own handler has it) are remembered as well as raised
    (`pending_stop`), and while one is pending the errors Python drops in finalisers, the stop's own raise and what
    it broke under torch (its DataLoader iterators half made or half shut), are not printed above the stop line.
    A SIGHUP (the terminal closed) stops it as a SIGTERM does, exit 129, where it would have ended the process."""
    forget_stop()

    def handler(signum, frame):
        global _stop_seen
        _stop_seen = signum
        if _importing(frame):
            # raised inside an import, it left that module half made for the process's life: a notebook kernel's
            # later calls failed on it (sympy's "no attribute 'logic'", under torch) until a restart. The loops'
            # next safe point raises it (raise_pending_stop), the command's end at the latest.
            return
        raise stop_for(signum)

    handler.raises_stop = True  # stops_held knows it by this

    if hasattr(signal, "SIGTERM"):
        signal.signal(signal.SIGTERM, handler)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not one ignored (nohup) or another's own
        signal.signal(signal.SIGINT, handler)
    if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) is signal.SIG_DFL:  # not nohup's SIG_IGN
        signal.signal(signal.SIGHUP, handler)
    if not getattr(sys.unraisablehook, "quiet_while_stopping", False):
        sys.unraisablehook = _quiet_while_stopping(sys.unraisablehook)


def _importing(frame) -> bool:
    """Whether `frame` runs inside an import (a module's body, or the import machinery)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False


def note_stop(signum: int, frame=None) -> None:
    """Remember a stop without raising it: a held handler's (stops_held), or a write to a stream whose reader went
    away (console.StopWhenGone: SIGPIPE, in a thread that is not the main one). The main thread raises it at its
    next safe point (raise_pending_stop)."""
    global _stop_seen
    _stop_seen = signum


@contextlib.contextmanager
def stops_held():
    """A stop that comes in the block is noted, then raised as it ends: for a DataLoader starting its workers. Raised
    between two starts, it left torch's iterator half made (no `_workers_status`), whose clean-up then failed to
    tell the started workers to leave and waited 5 s for each (they ignore SIGTERM): a SIGTERM during the start of 5
    workers took 28 s to end the run. Only `stop_on_signals`'s handlers (SIGINT, SIGTERM, SIGHUP) are held, and
    only in the main thread (the one Python runs handlers in)."""
    import threading

    held = {}
    if threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            if getattr(signal.getsignal(sig), "raises_stop", False):
                held[sig] = signal.signal(sig, note_stop)
    try:
        yield
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)
    raise_pending_stop()


@contextlib.contextmanager
def ctrl_c_noted() -> Iterator[list[int]]:
    """A Ctrl-C that comes in the block, where Python's own handler has it, is noted in the list yielded, not raised:
    for importing torch as a command starts (seconds, in a new process), before `stop_on_signals`. A KeyboardInterrupt
    raised inside that import left torch half imported for the process's life: in a notebook's kernel every later
    call, and `import torch` itself, then failed ("SystemError: ... bad call flags") until the kernel was restarted.
    Only in the main thread, the one Python runs handlers in."""
    import threading

    came: list[int] = []
    held = None
    if (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    ):
        held = signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))
    try:
        yield came
    finally:
        if held is not None:
            signal.signal(signal.SIGINT, held)


def _quiet_while_stopping(hook):
    def unraisable(arg) -> None:
        if _stop_seen is None:
            hook(arg)

    unraisable.quiet_while_stopping = True
    return unraisable
