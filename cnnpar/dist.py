"""Distributed state: the one module that knows rank, world size and device.

A single process goes through the same code path with world_size 1, so nothing downstream
branches on "am I distributed" except through `DistInfo`. Launch is torchrun's job (it sets
RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT); cnnpar never starts its own transport.
"""

from __future__ import annotations

import atexit
import itertools
import os
import re
import shlex
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from cnnpar.checkout import is_checkout
from cnnpar.host_facts import cpu_quota, quota_note, usable_cores

DEBUG_ENV = "CNNPAR_DEBUG_SINGLE"
# set by `cnnpar train --nproc N`'s launcher for torchrun's workers: what a run's record stores as its nproc
LAUNCHED_NPROC_ENV = "CNNPAR_LAUNCHED_NPROC"
# Counts process-group set-ups in this process (see attempt_store): a second init after a
# destroy, which every rank does in step, gets fresh keys too.
_INIT_COUNT = itertools.count()


@dataclass(frozen=True)
class DistInfo:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    # Another transport's collectives (cnnpar.parallel.horovod.HorovodCollectives); None: torch.distributed.
    collectives: Any = None
    # torchrun's attempt at this job, 0 for the first (or no torchrun); every rank holds the same number
    # (`job_attempt`): a restart after a failure elsewhere resumes on every node, not only the failed one's
    attempt: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


# What `cnnpar train --nproc N` sets for its torchrun workers unless the user's environment
# already holds the variable (under any spelling torch reads). Names, values and spellings
# checked against the installed torch 2.14.1's ProcessGroupNCCL.hpp and FlightRecorder.hpp. 2.14
# still reads NCCL_ASYNC_ERROR_HANDLING (the pre-TORCH_ spelling) as a fallback. Only the NCCL
# backend acts on them; gloo (the CPU) ignores them, but 2.14 builds its flight recorder for gloo
# too, so a deprecated name warns on the CPU as well. The timeout itself is `dist.timeout_s`,
# passed to init_process_group; these make its expiry say which collective stuck and end the job.
NCCL_LAUNCH_DEFAULTS = {
    # A failed or timed-out collective ends the process instead of hanging. 3 (SkipCleanUp) ends
    # it without ncclCommAbort, which the header says can itself hang; the header names 3 the
    # default torch means to keep, but torchrun sets 1 (TearDown: abort, then end) when unset.
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
    # On a watchdog timeout, write the flight recorder (below) to its dump file prefix + rank:
    # which collective each rank was in, so the stuck one (and the rank that never joined) is named.
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
}
# The flight recorder: the last N collectives of each rank (op, sequence number, sizes, state).
# 2.14 defaults to 2000 entries already; set for torches whose default is 0 (2.8 among them).
FLIGHT_RECORDER_ENTRIES = "2000"
# Torch 2.8 renamed the flight recorder's variables (checked in the 2.7 and 2.8 wheels). 2.8 and later
# read both names, the new first, and warn once per process about an old one ("... is deprecated; use
# TORCH_FR_BUFFER_SIZE instead"); 2.5-2.7 read only the old ones. Each tuple: (name since 2.8, before).
FR_BUFFER_SIZE_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
FR_DUMP_FILE_ENV = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")  # a path prefix; torch adds the rank
FR_NEW_NAMES_SINCE = "2.8"
# each name cnnpar may set -> every name torch reads for that setting
_SPELLINGS = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"),
    **{names[0]: names for names in (FR_BUFFER_SIZE_ENV, FR_DUMP_FILE_ENV)},
    **{names[1]: names for names in (FR_BUFFER_SIZE_ENV, FR_DUMP_FILE_ENV)},
}


def flight_recorder_env(version: str | None = None) -> tuple[str, str]:
    """(buffer size, dump file prefix): the names of the flight recorder's variables that torch
    `version` (this one's by default) reads without a deprecation warning."""
    from torch.torch_version import TorchVersion

    new = TorchVersion(version or torch.__version__) >= FR_NEW_NAMES_SINCE
    return (FR_BUFFER_SIZE_ENV[0], FR_DUMP_FILE_ENV[0]) if new else (FR_BUFFER_SIZE_ENV[1], FR_DUMP_FILE_ENV[1])


# CUDA's hardware work queues per context. Streams beyond that many share a queue, and a kernel
# waits behind all work queued before it on its queue, whatever stream that work came from. A run
# decoding photos on the GPU has a dozen streams (nvJPEG's own, the feeder's, the step's); with CUDA's
# default 8 queues the decoder's work queued behind the step's (a whole graph replay, enqueued at
# once). Measured, ResNet-50 from 24,000 photos on an H200, in separate calls (ZX with 8, ZY with 32):
# 6,063 -> 6,524 img/s with graphs off (data wait 31 -> 3 %), 4,932 -> 6,733 with graphs on.
# CUDA reads the variable when it starts, so it is set before any CUDA call, and a value the user
# set is kept. 32 is the most CUDA accepts.
DEVICE_QUEUES_ENV = "CUDA_DEVICE_MAX_CONNECTIONS"
DEVICE_QUEUES = "32"
CUDA_DEFAULT_QUEUES = "8"
# set beside it, so that the line can say who chose the number in torchrun's workers too (they inherit both)
QUEUES_SET_BY_CNNPAR_ENV = "CNNPAR_SET_DEVICE_QUEUES"


_UNSEEN = object()
# the variable when torch started CUDA in this process (what its context got); _UNSEEN before that,
# or for good where CUDA had started before this module was imported
_at_cuda_start: object = _UNSEEN


def _record_queues_at_cuda_start() -> None:
    global _at_cuda_start
    _at_cuda_start = os.environ.get(DEVICE_QUEUES_ENV)


def widen_device_queues(environ=None) -> None:
    """Give CUDA contexts made after this call DEVICE_QUEUES hardware queues, unless the user chose a
    number already or this process has started CUDA (too late then: see `device_queues_line`)."""
    environ = os.environ if environ is None else environ
    if DEVICE_QUEUES_ENV not in environ and not torch.cuda.is_initialized():
        environ[DEVICE_QUEUES_ENV] = DEVICE_QUEUES
        environ[QUEUES_SET_BY_CNNPAR_ENV] = DEVICE_QUEUES


def queues_setting(environ=None) -> tuple[str | None, str]:
    """(the variable's value this process's CUDA context has, or will get, None for CUDA's default; a
    caveat where the variable now says otherwise or cnnpar cannot tell)."""
    environ = os.environ if environ is None else environ
    now = environ.get(DEVICE_QUEUES_ENV)
    if environ is not os.environ or not torch.cuda.is_initialized():
        return now, ""
    if _at_cuda_start is _UNSEEN:  # CUDA started before cnnpar was imported: counted as the default
        if now is None:
            return None, ""
        return None, f"{DEVICE_QUEUES_ENV}={now} is set, but CUDA started before cnnpar could see whether in time"
    if now != _at_cuda_start:
        return _at_cuda_start, f"{DEVICE_QUEUES_ENV}={now} was set after CUDA started here: the context lacks it"
    return now, ""


def device_queues(environ=None) -> int:
    """The hardware queues this process's CUDA context has or will get (CUDA's default where unset,
    unreadable, or set too late)."""
    value = queues_setting(environ)[0] or CUDA_DEFAULT_QUEUES
    return int(value) if value.strip().isdigit() else int(CUDA_DEFAULT_QUEUES)


def device_queues_line(environ=None) -> str:
    """The run's line on CUDA's hardware queues (for a CUDA run; the CPU has none)."""
    environ = os.environ if environ is None else environ
    value, caveat = queues_setting(environ)
    if value is None:
        line = (
            f"device queues: CUDA's default {CUDA_DEFAULT_QUEUES} (streams share them and wait on each other; "
            f"the cnnpar command sets {DEVICE_QUEUES_ENV}={DEVICE_QUEUES} before CUDA starts: set it so yourself "
            "before CUDA starts when you build a Trainer in your own program)"
        )
    else:
        who = "set by cnnpar" if environ.get(QUEUES_SET_BY_CNNPAR_ENV) == value else "yours"
        line = f"device queues: {value} ({DEVICE_QUEUES_ENV}, {who})"
    return f"{line}; {caveat}" if caveat else line


def launcher_env(environ: dict[str, str], trace_prefix: str, torch_version: str | None = None) -> dict[str, str]:
    """The environment `cnnpar train --nproc N` hands torchrun: `environ` plus the NCCL defaults
    above (and the flight-recorder dumps under `trace_prefix`) wherever the user set none, under
    the names `torch_version` (the torch that runs the workers: this one) reads without a warning."""
    buffer_size, dump_file = flight_recorder_env(torch_version)
    wanted = {**NCCL_LAUNCH_DEFAULTS, buffer_size: FLIGHT_RECORDER_ENTRIES, dump_file: trace_prefix}
    env = dict(environ)
    for key, value in wanted.items():
        if not any(name in env for name in _SPELLINGS.get(key, (key,))):
            env[key] = value
    return env


def launched_nproc() -> int:
    """The N of the `cnnpar train --nproc N` that launched this process; 0 for any other start (one process, the
    debug switch, torchrun or horovodrun started by hand). A run's record stores this, not the --nproc asked for,
    so that `--config` or `--resume` of it starts the processes that ran: a record of a debug-switch run had said
    nproc = 2 and its re-run started two."""
    if "RANK" not in os.environ:
        return 0
    try:
        return int(os.environ.get(LAUNCHED_NPROC_ENV, "0"))
    except ValueError:
        return 0


def debug_single_requested(flag: bool = False) -> bool:
    return flag or os.environ.get(DEBUG_ENV, "").strip() not in ("", "0", "false", "False")


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def local_rank_of_launch() -> int:
    """This process's index on its node as its launcher set it (LOCAL_RANK), 0 where none did."""
    value = os.environ.get("LOCAL_RANK", "")
    return int(value) if value.strip().isdigit() else 0


# The variables torchrun sets in each worker: each a whole number at least this
_LAUNCH_NUMBERS = {"WORLD_SIZE": 1, "RANK": 0, "LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 1}
_BY_HAND = "torchrun sets them; by hand, set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in each process"


def launch_env_problem(debug_single: bool = False, rendezvous: bool = True) -> str:
    """What is wrong with the variables a launcher sets (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, and for a
    process group of several MASTER_ADDR and MASTER_PORT), in one line naming the variable; "" where nothing is.
    Set by hand, one missing or out of range ended in torch's traceback, at times only after --timeout-s (rank 0
    waited for a rank that torch had refused), and a stale RANK without WORLD_SIZE trained one process, at half the
    batch `--nproc 2` asked for, without a word. The debug switch ignores the launch, so only the numbers count;
    `rendezvous` False leaves out MASTER_ADDR and MASTER_PORT (checked where the process group forms)."""
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None and world is None:
        return ""
    switched = debug_single_requested(debug_single)
    if world is None and not switched:
        return f"RANK={rank} is set but WORLD_SIZE is not: {_BY_HAND}; for one process, unset RANK"
    if rank is None and world.strip() != "1" and not switched:
        return f"WORLD_SIZE={world} is set but RANK is not: {_BY_HAND}; for one process, unset WORLD_SIZE"
    for name, low in _LAUNCH_NUMBERS.items():
        value = os.environ.get(name)
        if value is not None and not (value.strip().isdigit() and int(value) >= low):
            return f"{name}={value!r}: expected a whole number >= {low} ({_BY_HAND})"
    if rank is None or world is None:
        return ""
    if int(rank) >= int(world):
        return f"RANK={rank.strip()} but WORLD_SIZE={world.strip()}: expected 0 <= RANK < WORLD_SIZE"
    if int(world) == 1 or switched or not rendezvous:
        return ""
    if not os.environ.get("MASTER_ADDR", "").strip():
        return (
            "RANK and WORLD_SIZE are set but MASTER_ADDR is not: torchrun sets it; by hand, set MASTER_ADDR (rank 0's "
            "host) and MASTER_PORT (a free port there) in each process"
        )
    port = os.environ.get("MASTER_PORT", "")
    if not (port.strip().isdigit() and 0 < int(port) < 65536):
        said = f"MASTER_PORT={port!r}" if "MASTER_PORT" in os.environ else "MASTER_PORT is not set"
        return f"{said}: expected a port 1..65535 free on rank 0's host (MASTER_ADDR), the same in each process"
    return ""


def check_launch_env(debug_single: bool = False, rendezvous: bool = True) -> None:
    """ConfigError with `launch_env_problem`'s line, before anything waits for another rank."""
    from cnnpar.errors import ConfigError

    problem = launch_env_problem(debug_single, rendezvous)
    if problem:
        raise ConfigError(problem)


def launched_as_worker() -> bool:
    """A process a launcher started as one rank (torchrun, horovodrun, mpirun): its launcher owns its stop."""
    return "RANK" in os.environ or any(k in os.environ for k in HOROVOD_LAUNCH_ENV)


def stops_for_a_plain_torchrun() -> bool:
    """Rank 0 of a torchrun started by hand (not by `--nproc`, whose launcher says what was kept itself): it alone
    turns torchrun's SIGTERM into a stop that says what was kept and how to continue (errors.stop_on_signals).
    torchrun hands a SIGTERM on to every worker and kills them 30 s later; the other ranks end at once, unheard,
    and rank 0, in a collective with them, sees them gone at once too."""
    return launched_by_torchrun() and LAUNCHED_NPROC_ENV not in os.environ and launcher_rank() == 0


def run_launcher(cmd: Sequence[str], env: dict[str, str]) -> int:
    """Run a launcher (torchrun) and return its exit code, handing a stop on to it once.

    It runs in a session of its own, so a signal for this process's group (`timeout` signals the process it
    started and then that process's group; a Ctrl-C reaches the terminal's group) reaches it once, from here:
    SIGINT for a Ctrl-C, SIGTERM for a SIGTERM (errors.Terminated). It stops its workers with it, and each keeps
    its finished epochs. A second stop more than 2 s later, or a launcher still running 60 s on, ends it and every
    process it started at once (`kill_process_tree`: torchrun's workers run in sessions of their own, which a
    `killpg` of its session misses); killing the launcher alone, as subprocess.call does on an exception, left its
    workers training without it. The launcher learns this process's id (PARENT_ENV) to stop when it dies without a word
    (SIGKILL, the OOM killer: `cnnpar.torchrun.stop_with_parent`): its own session kept it and its workers training,
    holding the run folder."""
    import signal
    import subprocess

    from cnnpar.errors import Terminated, raise_pending_stop
    from cnnpar.process_tree import kill_process_tree

    # a stop that came while the command imported its modules was only noted (errors.stop_on_signals): raised once
    # the launcher had started, it came after the whole run, which this process's wait below let train to its end
    raise_pending_stop()
    proc = subprocess.Popen(list(cmd), env={**env, PARENT_ENV: str(os.getpid())}, start_new_session=True)
    try:
        return proc.wait()
    except KeyboardInterrupt as e:
        proc.send_signal(signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT)
        first = time.monotonic()
        while True:
            try:
                proc.wait(timeout=max(0.0, first + 60 - time.monotonic()))
                break
            except KeyboardInterrupt:
                if time.monotonic() - first < 2:
                    continue  # the same stop delivered twice (to the process, then to its group)
                kill_process_tree(proc)  # its workers too: each runs in a session of its own
                break
            except subprocess.TimeoutExpired:
                kill_process_tree(proc)
                break
        raise


# the launcher's parent (this process) by id: the launcher stops when it dies (cnnpar.torchrun.stop_with_parent)
PARENT_ENV = "CNNPAR_LAUNCHER_PARENT"


# What a Horovod launcher sets in each rank: horovodrun's Gloo launcher HOROVOD_RANK, mpirun (for a
# Horovod built with MPI) Open MPI's or MPICH's rank. Without any of them hvd.init() quietly makes
# a world of one.
HOROVOD_LAUNCH_ENV = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


# scripts/install_horovod.sh builds Horovod, horovodrun and a python that imports both into .venv-horovod
# in this checkout's root; bare `python` and `horovodrun` have no Horovod.
CHECKOUT = Path(__file__).resolve().parents[1]
HOROVOD_VENV = CHECKOUT / ".venv-horovod"


def horovod_command(train_args: Sequence[str] = (), n: int = 2, venv: Path | None = None) -> str:
    """The horovodrun line of README.md and docs/frameworks.md running `cnnpar train TRAIN_ARGS --strategy
    horovod` in n processes on this machine, to paste where it is printed: paths relative to the working
    folder where it holds them (from the checkout's root, as the docs write them), else absolute; led by
    the install script while `venv` (the checkout's .venv-horovod) has no horovodrun. An installed cnnpar has
    neither the script nor a checkout's root: its line is the one to run from the root of a source checkout
    (`horovod_install_note` says so), not paths into site-packages that do not exist."""
    venv = venv or HOROVOD_VENV
    here = Path.cwd() if is_checkout(CHECKOUT) else CHECKOUT

    def shown(path: Path) -> str:
        return str(path.relative_to(here)) if path.is_relative_to(here) else str(path)

    horovodrun, python = venv / "bin" / "horovodrun", venv / "bin" / "python"
    line = shlex.join(
        [shown(horovodrun), "-np", str(n), "-H", f"localhost:{n}", shown(python), "-m", "cnnpar", "train"]
        + [*train_args, "--strategy", "horovod"]
    )
    if horovodrun.is_file():
        return line
    install = [shown(CHECKOUT / "scripts" / "install_horovod.sh")] + ([] if venv == HOROVOD_VENV else [shown(venv)])
    return f"{shlex.join(install)} && {line}"


def horovod_install_note() -> str:
    """What follows `horovod_command`'s line in a refusal: how long the build takes where Horovod is not built
    yet, and for an installed cnnpar (no scripts/) where the line runs."""
    if (HOROVOD_VENV / "bin" / "horovodrun").is_file():
        return ""
    if not is_checkout(CHECKOUT):
        return (
            " from the root of a cnnpar source checkout (install_horovod.sh is in its scripts/, not in an installed "
            "cnnpar; it builds Horovod into .venv-horovod there: 3-6 minutes the first time)"
        )
    return " (install_horovod.sh builds Horovod into .venv-horovod: 3-6 minutes the first time)"


def launched_by_horovodrun() -> bool:
    return any(k in os.environ for k in HOROVOD_LAUNCH_ENV)


def launcher_rank() -> int:
    """This process's rank as its launcher set it, before any process group exists: torchrun's RANK, else a
    Horovod launcher's; 0 for a process started alone."""
    return _launcher_value(("RANK", *HOROVOD_LAUNCH_ENV), 0)


def launcher_world_size() -> int:
    """The processes the launcher started, read as `launcher_rank` reads the rank; 1 for a process started alone."""
    return _launcher_value(("WORLD_SIZE", "HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"), 1)


def _launcher_value(keys: tuple[str, ...], alone: int) -> int:
    for key in keys:
        value = os.environ.get(key, "")
        if value.strip().isdigit():
            return int(value)
    return alone


def check_horovod_launch(nproc: int, train_args: Sequence[str] = ()) -> None:
    """Refuse `--strategy horovod` where it would not run as a Horovod job: under cnnpar's own
    launcher (--nproc starts torchrun, whose workers Horovod cannot join) or outside horovodrun
    (each process would train alone, and several would race for one run folder). The refusal gives
    the horovodrun command, the user's other `cnnpar train` arguments (`train_args`) carried over."""
    from cnnpar.config import setting_name
    from cnnpar.errors import ConfigError

    venv = horovod_install_note()
    if nproc > 0:
        raise ConfigError(
            f"{setting_name('dist', 'nproc')} = {nproc} launches torchrun, but {setting_name('dist', 'strategy')} = "
            "'horovod' needs horovodrun: run "
            f"`{horovod_command(train_args, nproc)}` instead{venv}"
        )
    if not launched_by_horovodrun():
        raise ConfigError(
            f"{setting_name('dist', 'strategy')} = 'horovod' but this process was not started by horovodrun (none of "
            f"{', '.join(HOROVOD_LAUNCH_ENV)} is set), so it would train alone: run `{horovod_command(train_args)}`"
            f"{venv}, or leave out --strategy horovod"
        )


class JoinFailed(RuntimeError):
    """This rank stopped at the job's start because of another rank: that rank ended before it joined (its own
    error is in its node's log) or did not join within --timeout-s. `exit_status`: errors.EXIT_ANOTHER_RANK_ENDED
    or EXIT_COLLECTIVE_TIMED_OUT, so that a launcher names the rank that failed by itself, not this one."""

    def __init__(self, message: str, exit_status: int) -> None:
        super().__init__(message)
        self.exit_status = exit_status


# What a rank writes as its start in torchrun's store when it ended before it got there (a mistyped flag, a bad
# config): the ranks waiting for it stop at once instead of after --timeout-s
ENDED_BEFORE_JOINING = "ended"
# How long a rank waits for the others' start before it says, once, what it waits for
JOIN_NOTE_AFTER_S = 10.0
_start_said = False  # this process wrote its start (or its end) to torchrun's store


def _in_a_torchrun_job() -> bool:
    """A worker of a torchrun job of several processes, with torchrun's shared store to meet in."""
    return (
        launched_by_torchrun()
        and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        and launcher_world_size() > 1
        and not launch_env_problem()
    )


def _start_keys(world_size: int, rank: int, timeout_s: float) -> tuple[dist.Store, str]:
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=False,
        timeout=timedelta(seconds=timeout_s),
    )
    return store, f"cnnpar/ws{world_size}/attempt_{_join(store, world_size, rank)}/start/rank"


def say_this_rank_ended_before_joining(error: BaseException | None = None) -> None:
    """Under torchrun, before this rank wrote its start (`exchange_starts`): write that it ended,
    so the other ranks stop at once, naming it, where they waited --timeout-s (600 s by default) and then failed
    with a traceback about a store key. After its start, until the process group forms, write `error` where the
    others watch for it as they wait in init_process_group (`_stop_if_a_rank_fails_before_the_group`). Never raises:
    the error that ended this rank is the one to say."""
    global _start_said
    if not _in_a_torchrun_job():
        return
    if _start_said:
        # JoinFailed: stopped because of another rank, which is the one to name
        if error is not None and not _group_formed and not isinstance(error, JoinFailed):
            _say_this_rank_failed_before_the_group(error)
        return
    _start_said = True
    try:
        store, keys = _start_keys(launcher_world_size(), launcher_rank(), 10)
        store.set(f"{keys}{launcher_rank()}", ENDED_BEFORE_JOINING)
    except Exception:  # see the docstring
        pass


# Set once this process's group formed: a rank failing after it is seen by the others' collectives
_group_formed = False
# How often a rank waiting in init_process_group looks for another rank's failure (`failed_before_the_group_key`)
FAILED_POLL_S = 1.0


def failed_before_the_group_key(store: dist.Store, world_size: int, rank: int) -> str:
    """The key in torchrun's store where a rank that failed after its start, before the process group formed, writes
    "<its rank>\n<its error>" (the last such rank's). One key, however many ranks: each waiting rank reads just it."""
    return f"cnnpar/ws{world_size}/attempt_{_join(store, world_size, rank)}/failed_before_the_group"


def _say_this_rank_failed_before_the_group(error: BaseException) -> None:
    from cnnpar.errors import UserError, first_line, user_error_text

    said = user_error_text(error) if isinstance(error, UserError) else f"{type(error).__name__}: {first_line(error)}"
    world_size, rank = launcher_world_size(), launcher_rank()
    try:
        store, _ = _start_keys(world_size, rank, 10)
        store.set(failed_before_the_group_key(store, world_size, rank), f"{rank}\n{said}")
    except Exception:  # see say_this_rank_ended_before_joining
        pass


@contextmanager
def _stop_if_a_rank_fails_before_the_group(world_size: int, rank: int) -> Iterator[None]:
    """Around init_process_group, which waits in torch's store for every rank with nothing to interrupt it: a rank
    that failed after the start exchange and before joining (its device unusable, its network interface refused)
    left the others there for --timeout-s (600 s by default) under a torchrun of several nodes, then a line saying
    only that it "did not join" (one node's torchrun ends its other workers itself). A thread looks for that
    rank's error in torchrun's store (`failed_before_the_group_key`) and ends this process with one line naming it
    (exit status 3, errors.EXIT_ANOTHER_RANK_ENDED): nothing is held yet (no data, no run folder) to clean up, and
    the main thread cannot be interrupted while torch waits."""
    if not _start_said or not _in_a_torchrun_job():  # no start exchanged: no rank writes its failure either
        yield
        return
    from cnnpar.errors import EXIT_ANOTHER_RANK_ENDED

    store, _ = _start_keys(world_size, rank, 10)  # a connection of the thread's own
    key = failed_before_the_group_key(store, world_size, rank)
    formed = threading.Event()

    def watch() -> None:
        while not formed.wait(FAILED_POLL_S):
            try:
                if not store.check([key]):
                    continue
                failed, _, said = store.get(key).decode().partition("\n")
            except Exception:  # torchrun's store gone: its agent ends this process
                return
            if formed.is_set():
                return
            sys.stdout.flush()
            print(
                f"cnnpar: rank {rank} stopped: rank {failed} of {world_size} failed before the job's process group "
                f"formed: {said}",
                file=sys.stderr,
                flush=True,
            )
            os._exit(EXIT_ANOTHER_RANK_ENDED)

    thread = threading.Thread(target=watch, name="cnnpar-watch-start", daemon=True)
    thread.start()
    try:
        yield
    finally:
        formed.set()
        thread.join()


def _ranks(ranks: Sequence[int]) -> str:
    return ", ".join(map(str, ranks[:8])) + (", ..." if len(ranks) > 8 else "")


def _wait_for_every_start(store: dist.Store, keys: str, world_size: int, timeout_s: int) -> dict[int, str]:
    """Every rank's start as it wrote it, once all have. In waits of a second for all of them (a stop signal is
    handled between them, where one blocking wait held it off until torchrun's SIGKILL); after JOIN_NOTE_AFTER_S one
    line says which ranks this one waits for; JoinFailed naming them after --timeout-s."""
    from cnnpar.errors import EXIT_COLLECTIVE_TIMED_OUT, raise_pending_stop

    every = [f"{keys}{r}" for r in range(world_size)]
    began, noted = time.monotonic(), False
    while True:
        # a stop noted, not raised, inside an import as the rank started (errors.stop_on_signals): it waited here for
        # ranks that torchrun's SIGTERM had ended, until torchrun's SIGKILL, saying nothing
        raise_pending_stop()
        waited = time.monotonic() - began
        try:
            store.wait(every, timedelta(seconds=max(0.01, min(1.0, timeout_s - waited))))
            return {r: store.get(key).decode() for r, key in enumerate(every)}
        except dist.DistStoreError:
            pass  # not yet
        waited = time.monotonic() - began
        if waited < timeout_s and (noted or waited < JOIN_NOTE_AFTER_S):
            continue  # which ranks are missing is asked rank by rank: only for the two lines below
        missing = _ranks([r for r, key in enumerate(every) if not store.check([key])])
        if waited >= timeout_s:
            raise JoinFailed(
                f"rank(s) {missing} of {world_size} did not join the job within --timeout-s {timeout_s}: another "
                "node's launch did not start its worker, or it failed before joining (its error is in its node's log)",
                EXIT_COLLECTIVE_TIMED_OUT,
            )
        if not noted and local_rank_of_launch() == 0:  # one line a node
            print(
                f"cnnpar: rank {launcher_rank()} waiting for rank(s) {missing} of {world_size} to join the job "
                f"(started by each node's torchrun); giving up after --timeout-s {timeout_s}",
                file=sys.stderr,
                flush=True,
            )
        noted = True


def exchange_starts(debug_single: bool, timeout_s: int) -> None:
    """Every rank of a torchrun job writes its start to torchrun's shared store and reads every rank's, before
    anything waits in a collective: a rank that ended before it got here (its command line refused, on its node
    alone) has written that instead (`say_this_rank_ended_before_joining`), and every other rank stops at once with
    JoinFailed naming it. ConfigError on every rank where the debug switch is on for some ranks and off for others
    (one node's command or environment had it): the switched ranks left or trained alone, and the others waited
    for them the whole --timeout-s, then failed with a traceback. Once a process: a second start in it (a test
    calling `cli.main` again) is the same rank of the same job."""
    global _start_said
    if _start_said or not _in_a_torchrun_job():
        return
    from cnnpar.errors import EXIT_ANOTHER_RANK_ENDED, ConfigError

    world_size, rank = launcher_world_size(), launcher_rank()
    store, keys = _start_keys(world_size, rank, timeout_s)
    store.set(f"{keys}{rank}", "1" if debug_single_requested(debug_single) else "0")
    _start_said = True
    started = _wait_for_every_start(store, keys, world_size, timeout_s)
    ended = [r for r, said in started.items() if said == ENDED_BEFORE_JOINING]
    if ended:
        raise JoinFailed(
            f"rank(s) {_ranks(ended)} of {world_size} ended before joining the job; the error is in that node's log",
            EXIT_ANOTHER_RANK_ENDED,
        )
    on = [r for r, said in started.items() if said == "1"]
    if on and len(on) < world_size:
        raise ConfigError(
            f"the debug switch (--debug-single, {DEBUG_ENV}) is on for rank(s) {_ranks(on)} of {world_size} only: "
            "expected it on every node's command (one process trains) or on none"
        )


def surplus_debug_worker(debug_single: bool = False) -> bool:
    """True for every torchrun worker but global rank 0 when the debug switch is on.

    `CNNPAR_DEBUG_SINGLE=1 torchrun --nproc_per_node=N ...` must run one process, not N copies
    of a single-process run racing for the same run folder; the surplus workers exit at once.
    """
    return debug_single_requested(debug_single) and launched_by_torchrun() and int(os.environ["RANK"]) != 0


def debug_switch_cut(debug_single: bool = False, nproc: int = 0) -> tuple[str, int]:
    """What the debug switch cut a launch of several processes to one (for the start-up lines) and how many the
    launch asked for; ("", 1) where it cut nothing. A variable left exported in a job script made an N-process job
    train one process, and only "1 process(es)" said so."""
    if not debug_single_requested(debug_single):
        return "", 1
    how = "--debug-single" if debug_single else f"{DEBUG_ENV}={os.environ[DEBUG_ENV]}"
    the_others = "rank 0 trains alone, the others exited"
    started = launcher_world_size() if launched_by_torchrun() else 1
    if started > 1:
        return f"debug switch ({how}): torchrun started {started} processes; {the_others}", started
    if nproc > 1:
        return f"debug switch ({how}): --nproc {nproc} not launched; this process trains alone", nproc
    return "", 1


def pick_device(requested: str, local_rank: int, local_world_size: int = 1) -> torch.device:
    """The device of this process: GPU `local_rank` of this node, or the CPU.

    More processes on a node than GPUs is refused rather than wrapped around (`local_rank %
    count`): two ranks sharing a GPU run at half speed or die of memory, and NCCL refuses two
    ranks of one communicator on one device, so the job would fail later and less clearly.
    """
    from cnnpar.errors import ConfigError

    if requested == "cuda" or (requested == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ConfigError(
                f"--device cuda (speed.device) but no CUDA device is visible{visible_devices_set()}: expected "
                "--device cpu or auto here"
            )
        count = torch.cuda.device_count()
        wanted = max(local_world_size, local_rank + 1)
        if wanted > count:
            raise ConfigError(
                f"{wanted} processes on this node but {count} CUDA device(s) visible{visible_devices_set()}: "
                f"expected --nproc (torchrun --nproc_per_node) <= {count}, one GPU per process"
            )
        return torch.device("cuda", local_rank)
    _refuse_cpu_processes_beyond_the_cores(max(local_world_size, local_rank + 1))
    return torch.device("cpu")


def visible_devices_set(environ=None) -> str:
    """The clause for a line counting the visible GPUs where CUDA_VISIBLE_DEVICES is set: the variable, not the
    machine, may be why there are too few (an empty one, or GPU 1 named on a machine with one); "" where unset."""
    environ = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" not in environ:
        return ""
    return f" (CUDA_VISIBLE_DEVICES={environ['CUDA_VISIBLE_DEVICES']!r} chooses which are)"


def apple_gpu_note(requested: str) -> str:
    """The line for `--device auto` on a Mac with an Apple GPU, which it leaves unused ("" elsewhere): the run goes
    to the CPU, and a user who knows PyTorch's MPS backend would expect the GPU. cnnpar has no MPS path (its
    autocast, torch.compile, pinned memory and CUDA graphs are not run on one here)."""
    if requested != "auto" or torch.cuda.is_available():
        return ""
    mps = getattr(torch.backends, "mps", None)
    if mps is None or not mps.is_available():
        return ""
    return (
        "cnnpar: note: this machine has an Apple GPU (MPS), which cnnpar does not use (a CUDA GPU or the CPU "
        "only): --device auto runs on the CPU"
    )


def _say_apple_gpu_unused(requested: str, rank: int) -> None:
    # once per job: rank 0 alone (a tune or claims trial's child says it into its log, which tune's own line stands for)
    if rank == 0 and (note := apple_gpu_note(requested)):
        print(note, file=sys.stderr, flush=True)


# CPU processes per usable core a node may run: --nproc 1000 on the CPU started a thousand ranks, each importing torch
# and joining a gloo group, on 2 cores (a GPU run is held to one process per GPU above)
CPU_PROCS_PER_CORE = 4


def _refuse_cpu_processes_beyond_the_cores(wanted: int) -> None:
    from cnnpar.errors import ConfigError

    cores = usable_cores()
    if wanted > CPU_PROCS_PER_CORE * cores:
        note = f" ({n})" if (n := quota_note(cores)) else ""
        raise ConfigError(
            f"{wanted} processes on this node's CPU but {cores} usable core(s){note}: expected --nproc (torchrun "
            f"--nproc_per_node) <= {CPU_PROCS_PER_CORE * cores}, {CPU_PROCS_PER_CORE} per core"
        )


def init_cpu_threads() -> None:
    """Hold torch's intra-op threads to a container's CPU quota. Its default is one thread per core of the affinity
    mask, which a quota leaves at the host's (64 threads on a node's 64 cores for 2 CPUs' worth of time, each period
    throttled once the 2 are spent). OMP_NUM_THREADS, where set, is the user's or torchrun's (1 per rank): kept."""
    if "OMP_NUM_THREADS" in os.environ or cpu_quota() is None:
        return
    cores = usable_cores()
    if torch.get_num_threads() > cores:
        torch.set_num_threads(cores)


def start_cuda(device: torch.device) -> None:
    """Make `device` the current GPU, which starts this process's CUDA context on it; where that fails, one line
    naming the device and torch's reason instead of torch's traceback from inside the start. Seen on an H100 whose
    memory another process held (session 49): the context's own few hundred MiB did not fit, and `set_device`
    raised "CUDA error: out of memory" before any of cnnpar's phases could say it; a GPU in exclusive-process mode
    that another process holds fails here too ("busy or unavailable")."""
    from cnnpar.errors import UserError, first_line

    index = device.index
    try:
        if index is None:
            # a bare "cuda" (predict's --device cuda) is the current device, as tensors moved to it go there:
            # set_device refuses a device without an index (ValueError), which ended predict in torch's traceback
            index = torch.cuda.current_device()
        torch.cuda.set_device(index)
    except (
        RuntimeError
    ) as e:  # torch.AcceleratorError (a RuntimeError) in recent torch, a plain RuntimeError in older ones
        reason = first_line(e)
        held = (
            "other processes hold its memory (nvidia-smi names them)"
            if "out of memory" in reason
            else "nvidia-smi shows what holds it and its compute mode"
        )
        named = f"cuda:{index}" if index is not None else "cuda (the current device)"
        raise UserError(
            f"{named} could not be started: {reason}; {held}: expected a GPU this process can use, another one "
            "(CUDA_VISIBLE_DEVICES), or --device cpu"
        ) from None


def init_distributed(device_request: str = "auto", debug_single: bool = False, timeout_s: int = 600) -> DistInfo:
    """Join the process group torchrun prepared, or describe a single process.

    The debug switch ignores the torchrun environment entirely: one process, rank 0, on the
    first device. That is the "just run it locally" escape hatch, with no code change.
    """
    check_launch_env(debug_single, rendezvous=False)  # MASTER_ADDR/PORT below, after this node's device count
    if debug_single_requested(debug_single) or not launched_by_torchrun():
        device = pick_device(device_request, 0)
        if device.type == "cuda":
            start_cuda(device)
        _say_apple_gpu_unused(device_request, 0)
        return DistInfo(0, 0, 1, device)

    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    # LOCAL_WORLD_SIZE (set by torchrun): every rank of the node refuses, not only the surplus ones.
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    device = pick_device(device_request, local_rank, local_world_size)
    _say_apple_gpu_unused(device_request, rank)
    if world_size == 1:
        if device.type == "cuda":
            start_cuda(device)
        return DistInfo(0, 0, 1, device, attempt=local_restart_count())  # one process: its agent's count is the job's
    # set_device before init_process_group: NCCL binds its communicator to the current device,
    # and a wrong one makes every rank's first collective land on GPU 0.
    if device.type == "cuda":
        start_cuda(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = timedelta(seconds=timeout_s)
    kwargs: dict = {"device_id": device} if device.type == "cuda" else {}
    check_launch_env(debug_single)
    store = attempt_store(world_size, timeout)
    if store is not None:
        kwargs.update(store=store, rank=rank, world_size=world_size)
    _RETIRED_GLOO.clear()  # groups left before: their threads joined without the GIL (see _RETIRED_GLOO)
    global _group_formed
    try:
        with _stop_if_a_rank_fails_before_the_group(world_size, rank):
            dist.init_process_group(backend=backend, timeout=timeout, **kwargs)
        _group_formed = True
    except dist.DistStoreError as e:  # a store key waited for in vain: a rank that never came
        from cnnpar.errors import EXIT_COLLECTIVE_TIMED_OUT, first_line

        raise JoinFailed(
            f"the other ranks did not join the job within --timeout-s {timeout_s}: another node's process did not "
            f"start, or failed before joining (its error is in its own log); torch: {first_line(e)}",
            EXIT_COLLECTIVE_TIMED_OUT,
        ) from e
    return DistInfo(rank, local_rank, world_size, device, attempt=job_attempt())


def attempt_store(world_size: int, timeout: timedelta) -> dist.Store | None:
    """torchrun's key-value store, with keys kept apart per restart attempt (None: use env://).

    torchrun (its agent) serves one TCP store for the whole job and its workers connect to it
    without a prefix, so after `--max-restarts` restarts the new workers can read the dead
    ones' process-group keys (gloo peer addresses among them) and fail with "connection refused"
    or hang in init (seen here with torch 2.14 and gloo in 4 of 7 restarts); a prefix per attempt
    makes every attempt start from an empty key space. The attempt is counted in the store itself
    (`_join`), not read from TORCHELASTIC_RESTART_COUNT: each node's agent keeps that count for
    itself, and a node restarted because another node's worker failed keeps 0, so two nodes'
    ranks used two prefixes and never met.
    """
    init_no = next(_INIT_COUNT)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None  # not torchrun's shared store: env:// makes rank 0 host a fresh one
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False, timeout=timeout
    )
    attempt = _join(store, world_size, int(os.environ["RANK"]))
    return dist.PrefixStore(f"cnnpar/ws{world_size}/attempt_{attempt}/init_{init_no}/", store)


# This process's attempt, counted once when it first joins torchrun's store (_join): a second process-group
# set-up in the same process (after a destroy) is the same attempt, kept apart by its init number instead.
_joined_attempt: int | None = None


def _join(store: dist.Store, world_size: int, rank: int) -> int:
    """This job's attempt (0 for the first), the same on every rank: each worker of an attempt joins once, so
    rank r's count of joins in the shared store is the attempts so far, on every node alike."""
    global _joined_attempt
    if _joined_attempt is None:
        _joined_attempt = store.add(f"cnnpar/joins/ws{world_size}/rank{rank}", 1) - 1
    return _joined_attempt


def local_restart_count() -> int:
    """The restarts this node's torchrun agent made (0 outside torchrun): the job's only for a job of one node."""
    value = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return int(value) if value.strip().isdigit() else 0


def job_attempt() -> int:
    """This job's attempt as every rank agrees on it where torchrun's store counted it (`attempt_store`), else
    (env://, one node) the agent's own count. A node's own count of restarts says a restart too: under an elastic
    world size that changed, the count of joins in the new size starts again at 0."""
    joined = _joined_attempt if _joined_attempt is not None else 0
    return max(joined, local_restart_count())


# What torch raises in a rank whose collective failed because of another rank, in lower case: that rank's process
# ended (gloo's closed or reset connection, NCCL's remote error), or it did not answer for --timeout-s (gloo's wait,
# NCCL's watchdog, where TORCH_NCCL_ASYNC_ERROR_HANDLING lets the error reach Python rather than end the process)
ANOTHER_RANK_ENDED = ("connection closed by peer", "connection reset by peer", "ncclremoteerror")
ANOTHER_RANK_SILENT = ("timed out waiting", "watchdog caught collective operation timeout")


def another_ranks_failure(e: BaseException) -> tuple[str, float | None]:
    """Why a collective of this rank failed where the cause is another rank: ("ended", None) where that rank's
    process ended, ("silent", seconds waited or None) where it did not answer in time; ("", None) for anything
    else. An exception raised from one (its __cause__) is read too. One raised while this rank handled an error
    of its own (its __context__) is this rank's failure: its clean-up met the other rank gone, and the traceback
    shows the error that came first."""
    seen: set[int] = set()
    while isinstance(e, BaseException) and id(e) not in seen:
        seen.add(id(e))
        said = str(e).lower()
        handling = e.__context__ is not None and e.__context__ is not e.__cause__
        if handling and not another_ranks_failure(e.__context__)[0]:
            return "", None
        if isinstance(e, RuntimeError) and any(words in said for words in ANOTHER_RANK_ENDED):
            return "ended", None
        if isinstance(e, RuntimeError) and any(words in said for words in ANOTHER_RANK_SILENT):
            # gloo: "Timed out waiting 20000ms for recv operation"; NCCL: "... Timeout(ms)=600000) ran for ..."
            waited = re.search(r"timed out waiting (\d+)\s*ms|timeout\(ms\)=(\d+)", said)
            return "silent", int(next(g for g in waited.groups() if g)) / 1000 if waited else None
        e = e.__cause__
    return "", None


def destroy_distributed() -> None:
    """Leave the process group; called from `finally`, so it runs on the error path too.

    Never raises: after a peer died, tearing down can fail, and that second error must not hide
    the first one, which is the one that names the rank and the cause.
    """
    if dist.is_available() and dist.is_initialized():
        try:
            _keep_gloo_threads_past_the_group()
            dist.destroy_process_group()
        except Exception:  # see the docstring
            pass


# The gloo backends of groups this process has left, on a torch whose destroy_process_group does not stop their
# worker threads (torch 2.5; later ones call ProcessGroup.shutdown there). Those threads are joined when the group's
# last reference dies, and where that is DDP's Reducer (the Trainer in a refusal's traceback, freed as `cli.main`
# returns) or the group's Python object, the join runs holding the GIL; a worker that has just finished a
# collective whose tensor Python already let go of needs the GIL to free it, and both wait for ever (a rank that
# refused right after the agreement's collectives, tests/dist/test_rank_agreement.py, hung about 1 run in 2 on 2
# loaded cores). The backend's own Python object releases the GIL while it is destroyed: held here, it is the last
# reference, let go of at the next init_distributed or at exit, and the join runs without the GIL.
_RETIRED_GLOO: list = []
atexit.register(_RETIRED_GLOO.clear)


def _keep_gloo_threads_past_the_group() -> None:
    if hasattr(dist.ProcessGroup, "shutdown") or not dist.is_gloo_available():
        return
    try:
        backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    except RuntimeError:  # no CPU backend (NCCL alone): torch 2.5 shuts NCCL down itself
        return
    if isinstance(backend, dist.ProcessGroupGloo):
        _RETIRED_GLOO.append(backend)


def all_reduce_sum(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Sum a tensor over all ranks in place (a no-op for one process)."""
    if info.distributed and info.collectives is not None:
        return info.collectives.all_reduce_sum(t)
    if info.distributed:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_max(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.distributed and info.collectives is not None:
        return info.collectives.all_reduce_max(t)
    if info.distributed:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t


def broadcast_object(obj, info: DistInfo, src: int = 0):
    if not info.distributed:
        return obj
    if info.collectives is not None:
        return info.collectives.broadcast_object(obj, src)
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def barrier(info: DistInfo) -> None:
    if info.distributed and info.collectives is not None:
        info.collectives.barrier()
    elif info.distributed:
        dist.barrier()


# torch runs queued calls when it starts CUDA: the variable's value then is what the context gets
if not torch.cuda.is_initialized():
    torch.cuda._lazy_call(_record_queues_at_cuda_start)
