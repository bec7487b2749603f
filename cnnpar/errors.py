"""User-facing errors.

A `UserError` is bad input the user can fix (a malformed CSV row, an unknown model name, a
missing file). The CLI prints its message and exits non-zero without a Python traceback; every
other exception is a bug in cnnpar and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input: the message names the file, row or field and what was expected."""


class ConfigError(UserError):
    """A config field holds a value outside what it allows."""


class DataError(UserError):
    """A data file cannot be read as the format it claims to be."""


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
    """SIGTERM, raised where the process is: the clean-up a Ctrl-C runs then runs for it too."""


def stop_on_sigterm() -> None:
    """`timeout`, `kill` and job schedulers send SIGTERM, which ends Python without running `finally` or
    `except` blocks: raise `Terminated` instead, so a command's clean-up runs as for Ctrl-C (train keeps its
    finished epochs and removes a half-written checkpoint; tune kills its running child, which lives in its own
    session and would outlive the parent; prepare removes its half-written store). The CLI exits 143 for it."""
    import signal

    def handler(signum, frame):
        raise Terminated

    if hasattr(signal, "SIGTERM"):
        signal.signal(signal.SIGTERM, handler)
