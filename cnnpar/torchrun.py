"""`python -m cnnpar.torchrun ARGS`: torchrun (torch.distributed.run) for `cnnpar train --nproc N` (and for
compare's torch runner and the bench's DDP rows), stopped with the process that started it, its end in one line.

torchrun ends a stopped job (SIGTERM, Ctrl-C) with its SignalException's traceback, and a failed one with a
ChildFailedError traceback and a block per rank, which bury what the user needs: the failing rank's own error,
printed by that rank above, and the launcher's line after it on what the checkpoint keeps. Here a stop ends
quietly with 128 + the signal, and a failure in one line naming the rank that failed first (exit status 1): a rank
that stopped because of another (errors.EXIT_ANOTHER_RANK_ENDED, EXIT_COLLECTIVE_TIMED_OUT), or that torchrun ended
itself, is not named as the first failure; a rank that stopped answering fails nothing itself, and is named where
torchrun had to kill it (it did not answer the SIGTERM). Where every rank refused alike at start-up (the model too
small for the images, say), the launcher prints that refusal once and the job ends 2, as one process does: here
neither torchrun's lines on the workers' exits nor an end line; so too for a rank's own error as training runs
(failure_note: a photo damaged after the first epoch, a divergence), which the launcher says with what is kept.
torch elastic's own files (each worker's error file) go in a folder of this process's own, removed as it ends: left to
itself torchrun made a /tmp/torchelastic_* folder for each job and never removed it.
"""

from __future__ import annotations

import logging
import signal
import sys
import traceback
from pathlib import Path

from cnnpar.errors import EXIT_ANOTHER_RANK_ENDED, EXIT_COLLECTIVE_TIMED_OUT  # imports no torch

# torchrun's logger for its workers' processes, and its words as it ends those still running once one failed: a
# SIGTERM to each, then a SIGKILL to each that outlived it
TORCHRUN_PROCESS_LOGGER = "torch.distributed.elastic.multiprocessing.api"
SENT_SIGTERM = "Sending process"
UNANSWERED_SIGTERM = "Unable to shutdown process"

# The folder of torch elastic's per-worker log folders (error files), one per launch, named after this process: left
# to itself torch elastic makes a /tmp/torchelastic_* folder for each job and never removes it
LOG_DIR_PREFIX = "cnnpar-torchrun-"

# Where rank 0 of a `--nproc` launch writes its run folder once it holds it: the launcher, which cannot know a
# default name (torchrun's job id) or whether rank 0 was refused, reads it for its last line
RUN_DIR_NOTE_ENV = "CNNPAR_RUN_DIR_NOTE"


def refusal_note(run_dir_note: str | Path) -> Path:
    """Beside the launcher's run-folder note: the refusal every rank raised alike at start-up
    (errors.EveryRankRefused), written by each rank in place of its own line. The launcher says it once and exits 2,
    as one process does; torchrun's lines on the workers' ends and this module's end line, which would blame rank 0
    for it, are left out."""
    return Path(str(run_dir_note) + ".refused")


def memory_full_note(run_dir_note: str | Path) -> Path:
    """Beside the launcher's run-folder note: a rank ran out of device memory (errors.DeviceMemoryFull) and wrote
    the flags its resume adds to fit (" --batch-size 16 --grad-accum 2"). The launcher's last line continues with
    them, as one process's line does: a plain `--resume` runs out of memory again."""
    return Path(str(run_dir_note) + ".memory-full")


def failure_note(run_dir_note: str | Path) -> Path:
    """Beside the launcher's run-folder note: a rank's own error as it ended training (a UserError: a photo damaged
    after the first epoch, a divergence), as JSON {"line": its line with its rank, "add_kept": whether the launcher
    adds what the checkpoint keeps and the command that continues, which rank 0 alone can say itself}. Written before
    the rank leaves the process group, so the other ranks, whose collectives then find it gone, end quietly (cli);
    the launcher says it once, exit 2, as one process does: it ended 1 after the other rank's line, torchrun's lines
    on the workers' exits and the launcher's "rank 1 failed first", its kept epochs on another line."""
    return Path(str(run_dir_note) + ".failed")


def reader_gone_note(run_dir_note: str | Path) -> Path:
    """Beside the launcher's run-folder note: a rank found the reader of the job's output gone (`cnnpar train --nproc
    2 | head -2`; console.StopWhenGone) and stops as by SIGPIPE. The job's stop, as a Ctrl-C is: the other ranks,
    whose collectives then meet that rank gone, end as that stop, quietly (cli.main), and torchrun's lines on the
    workers' exits are left out (QuietAfterANote), where they printed a failure after the stop."""
    return Path(str(run_dir_note) + ".reader-gone")


class QuietAfterANote(logging.Filter):
    """Drops torchrun's records once one of `notes` exists: the workers refused alike (`refusal_note`), a rank
    ended on an error of its own that the launcher says (`failure_note`), or the job stopped as its output's reader
    went away (`reader_gone_note`); their exit codes and the SIGTERMs sent to the others would read as a failure
    beside the one line the launcher prints, or after the stop."""

    def __init__(self, *notes: Path | None) -> None:
        super().__init__()
        self.notes = [note for note in notes if note is not None]

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(note.is_file() for note in self.notes)


def stop_with_parent() -> None:
    """SIGTERM for this process when the `cnnpar train` that started it dies (Linux's PR_SET_PDEATHSIG), which
    torchrun takes as any stop: its workers stop and keep their finished epochs. A SIGKILL of `cnnpar train
    --nproc N` (or the OOM killer) left torchrun, in a session of its own, training to the end and holding the
    run folder. Nothing where the parent's id was not passed, or off Linux."""
    from cnnpar.process_tree import end_with_parent_named_in  # imports no torch

    # dist.PARENT_ENV, spelled out: importing cnnpar.dist would import torch before the signal is asked for,
    # seconds in which the parent's death goes unnoticed (tests/unit/test_dist_launch.py holds the two equal)
    end_with_parent_named_in("CNNPAR_LAUNCHER_PARENT", signal.SIGTERM)


def worker_rank(pid: int) -> int | None:
    """The global rank torchrun gave the worker process `pid` (RANK in the environment it started it with), read
    from Linux's /proc while the process lives; None where it cannot be read."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    rank = next((entry[5:] for entry in environ if entry.startswith(b"RANK=")), b"")
    return int(rank) if rank.isdigit() else None


class EndedByTorchrun(logging.Filter):
    """The process ids of the workers torchrun ended itself (`signalled`) and of those among them that did not
    answer its SIGTERM and had to be killed (`killed`: stuck or stopped; a rank that answers dies of the SIGTERM,
    or stops on it), and each one's rank (`ranks`, pid: rank), read as torchrun names it: a recent torch lists these
    workers among the failures, killed by SIGTERM or SIGKILL, beside the rank that failed, but torch 2.5 lists only
    the workers that had failed before it ended the others, so their pids are all it tells of them. Keeps every
    record."""

    def __init__(self) -> None:
        super().__init__()
        self.signalled: set[int] = set()
        self.killed: set[int] = set()
        self.ranks: dict[int, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        said = str(record.msg)
        pid = record.args[0] if isinstance(record.args, tuple) and record.args else None
        if isinstance(pid, int) and said.startswith((SENT_SIGTERM, UNANSWERED_SIGTERM)):
            # torchrun logs before it signals: the worker still lives, and its environment says its rank
            (self.signalled if said.startswith(SENT_SIGTERM) else self.killed).add(pid)
            if pid not in self.ranks and (rank := worker_rank(pid)) is not None:
                self.ranks[pid] = rank
        return True


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, sorted(ranks)))}"


def _first_own_failure(failures: dict, ended: EndedByTorchrun) -> tuple | None:
    """(rank, its ProcessFailure) of the rank that failed by itself first, not because of another rank or by
    torchrun's own SIGTERM; None where none did."""
    by_another = (EXIT_ANOTHER_RANK_ENDED, EXIT_COLLECTIVE_TIMED_OUT)
    own = {
        rank: failure
        for rank, failure in failures.items()
        if failure.exitcode not in by_another and failure.pid not in ended.signalled
    }
    if not own:
        return None
    # the first to fail; of those in the same second, not one killed by a SIGTERM (torchrun's, where it went
    # unrecorded)
    return min(own.items(), key=lambda f: (f[1].timestamp, f[1].exitcode == -signal.SIGTERM))


def stopped_by_its_reader(failures: dict, ended: EndedByTorchrun) -> bool:
    """The job ended because the first rank to end found the reader of its output gone (`cnnpar train --nproc 2 |
    head`: it stops as by SIGPIPE, exit 141, console.StopWhenGone): a stop, not a rank that failed."""
    first = _first_own_failure(failures, ended)
    return first is not None and first[1].exitcode == 128 + signal.SIGPIPE


def end_line(failures: dict, ended: EndedByTorchrun) -> str:
    """The launcher's one line on a failed job, from torchrun's failures (rank: its ProcessFailure) and the workers
    it ended itself: the rank that failed by itself first, where one did; else what the launcher can tell of the
    rank that stopped responding (a timeout) or ended on another node."""
    first = _first_own_failure(failures, ended)
    if first:
        rank, failure = first
        how = f"killed by {failure.signal_name()}" if failure.exitcode < 0 else f"exit code {failure.exitcode}"
        return f"cnnpar: rank {rank} failed first ({how}); torchrun ended the job"
    timed_out = [rank for rank, failure in failures.items() if failure.exitcode == EXIT_COLLECTIVE_TIMED_OUT]
    if timed_out:
        waiting = f"cnnpar: {_ranks(timed_out)} timed out waiting for another rank (--timeout-s)"
        rank_of = ended.ranks | {failure.pid: rank for rank, failure in failures.items()}
        killed = sorted({rank_of[pid] for pid in ended.killed if pid in rank_of})
        if killed:
            return (
                f"{waiting}; {_ranks(killed)} did not answer torchrun's SIGTERM and had to be killed (SIGKILL): stuck "
                "or stopped; torchrun ended the job"
            )
        termed = sorted({rank_of[pid] for pid in ended.signalled if pid in rank_of})
        where = f"{_ranks(termed)}, which torchrun's SIGTERM ended, or " if termed else ""
        return (
            f"{waiting}; the launcher cannot tell which rank stopped responding ({where}a rank on another node); "
            "torchrun ended the job"
        )
    stopped = [rank for rank, failure in failures.items() if failure.exitcode == EXIT_ANOTHER_RANK_ENDED]
    return (
        f"cnnpar: {_ranks(stopped)} stopped because another rank of the job ended, and no rank of this node failed "
        "by itself: its error is in another node's log; torchrun ended the job"
    )


def quiet_rendezvous_timer_join(hook):
    """`sys.unraisablehook` without one error of torch elastic's own: its rendezvous keep-alive timer is stopped by a
    weakref finalizer, and where the collector runs that finalizer on the timer's own thread (torchrun shutting down
    after a stop), `thread.join()` raises "cannot join current thread", printed as "Exception ignored" with a
    traceback above the launcher's stop line (seen once in CI at 7b212ed). The timer ends with the process anyway;
    every other dropped error still goes to `hook`."""

    def unraisable(arg) -> None:
        frames = traceback.extract_tb(arg.exc_traceback) if arg.exc_traceback else []
        if (
            isinstance(arg.exc_value, RuntimeError)
            and str(arg.exc_value) == "cannot join current thread"
            and any(Path(f.filename).parts[-4:-1] == ("distributed", "elastic", "rendezvous") for f in frames)
        ):
            return
        hook(arg)

    return unraisable


def main() -> int:
    """torchrun on this process's arguments."""
    import os
    import runpy

    stop_with_parent()
    sys.unraisablehook = quiet_rendezvous_timer_join(sys.unraisablehook)

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from cnnpar.process_tree import owned_temp_folder

    ended = EndedByTorchrun()
    note = os.environ.get(RUN_DIR_NOTE_ENV)
    refused = refusal_note(note) if note else None
    failed = failure_note(note) if note else None
    logging.getLogger(TORCHRUN_PROCESS_LOGGER).addFilter(ended)
    logging.getLogger(TORCHRUN_PROCESS_LOGGER).addFilter(
        QuietAfterANote(refused, failed, reader_gone_note(note) if note else None)
    )
    # removed as this process ends, or by the next launch where it was killed outright; the workers' output still
    # goes to the console alone (--log-dir moves only what torch elastic writes to files: no --redirects or --tee)
    with owned_temp_folder(LOG_DIR_PREFIX) as logs:
        sys.argv[1:1] = [f"--log-dir={logs}"]
        try:
            # as `python -m torch.distributed.run` runs it: its log lines then look as they always did
            runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
        except SignalException as e:  # torchrun has stopped its workers by now (the agent's shutdown comes first)
            return 128 + int(e.sigval)
        except ChildFailedError as e:
            if any(n is not None and n.is_file() for n in (refused, failed)):  # the launcher says it, once
                return 2
            if stopped_by_its_reader(e.failures, ended):  # rank 0 said what is kept where it still could
                return 128 + signal.SIGPIPE
            print(end_line(e.failures, ended), file=sys.stderr, flush=True)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
