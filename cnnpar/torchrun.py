"""`python -m cnnpar.torchrun ARGS`: torchrun (torch.distributed.run) for `cnnpar train --nproc N`, its end in
one line.

torchrun ends a stopped job (SIGTERM, Ctrl-C) with its SignalException's traceback, and a failed one with a
ChildFailedError traceback and a block per rank, which bury what the user needs: the failing rank's own error,
printed by that rank above, and the launcher's line after it on what the checkpoint keeps. Here a stop ends
quietly with 128 + the signal, and a failure in one line naming the rank that failed first (exit status 1).
"""

from __future__ import annotations

import signal
import sys


def stop_with_parent() -> None:
    """SIGTERM for this process when the `cnnpar train` that started it dies (Linux's PR_SET_PDEATHSIG), which
    torchrun takes as any stop: its workers stop and keep their finished epochs. A SIGKILL of `cnnpar train
    --nproc N` (or the OOM killer) left torchrun, in a session of its own, training to the end and holding the
    run folder. Nothing where the parent's id was not passed, or off Linux."""
    import os

    from cnnpar.process_tree import end_with_parent  # imports no torch

    # dist.PARENT_ENV, spelled out: importing cnnpar.dist would import torch before the signal is asked for,
    # seconds in which the parent's death goes unnoticed (tests/unit/test_dist_launch.py holds the two equal).
    # Popped: the workers have no use for it.
    parent = os.environ.pop("CNNPAR_LAUNCHER_PARENT", "")
    if parent.isdigit():
        end_with_parent(int(parent), signal.SIGTERM)


def main() -> int:
    """torchrun on this process's arguments."""
    import runpy

    stop_with_parent()

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    try:
        # as `python -m torch.distributed.run` runs it: its log lines then look as they always did
        runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
    except SignalException as e:  # torchrun has stopped its workers by now (the agent's shutdown comes first)
        return 128 + int(e.sigval)
    except ChildFailedError as e:
        # the first to fail; of those in the same second, not one that torchrun itself stopped with SIGTERM
        rank, failure = min(e.failures.items(), key=lambda f: (f[1].timestamp, f[1].exitcode == -signal.SIGTERM))
        how = f"killed by {failure.signal_name()}" if failure.exitcode < 0 else f"exit code {failure.exitcode}"
        print(f"cnnpar: rank {rank} failed first ({how}); torchrun ended the job", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
