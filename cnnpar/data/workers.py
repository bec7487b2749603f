"""DataLoader worker processes: a batch they cannot hand over, and their end with the main process.

A worker hands a batch over by pickling it into its data queue; torch's file_descriptor sharing strategy puts each
tensor's storage in a segment of its own made with shm_open, that is a file in /dev/shm (64 MB in a Docker
container by default). Where /dev/shm has no room, the pickling fails in the queue's feeder thread, which prints
the traceback and drops the batch: the main process waited for it for ever, with no line of its own. Here a worker
sends the failure in the batch's place, and the main process raises it (`report_unsent_batches`).

Workers ignore SIGTERM and SIGINT (loader.leave_stops_to_the_main_process), so the main process must end them
itself: torch's own clean-up and multiprocessing's exit hook end a worker by SIGTERM and then join it, which waited
for ever on a worker whose loader was never shut down (`end_leftover_workers`).
"""

from __future__ import annotations

import atexit
import errno
import multiprocessing
import multiprocessing.queues
import os
import signal
import sys
import threading

import torch

from cnnpar.errors import SharedMemoryFull, SharedMemoryUnwritable, TooManyOpenFiles
from cnnpar.host_facts import open_files_line, too_many_open_files

SHM_FOLDER = "/dev/shm"  # where shm_open makes its files on Linux
EXIT_GRACE_S = 2.0  # at the exit, a worker told to stop leaves within this; one still there is killed


def shm_space(folder: str = SHM_FOLDER) -> tuple[int, int]:
    """(size, free bytes) of the file system that holds `folder`."""
    st = os.statvfs(folder)
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def _size(n: float) -> str:
    if n < 2**20:
        return f"{n / 2**10:.0f} KB"
    return f"{n / 2**20:.1f} MB" if n < 2**30 else f"{n / 2**30:.1f} GB"


def _shm_size_flag(need: int) -> str:
    """A --shm-size with room for twice `need` (the main process holds batches too), in whole GB, at least 1g."""
    return f"--shm-size={max(1, -(-2 * need // 2**30))}g"


def _tensor_bytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.untyped_storage().nbytes()
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(o) for o in obj)
    if isinstance(obj, dict):
        return sum(_tensor_bytes(o) for o in obj.values())
    return 0


def _shm_full(e: BaseException) -> bool:
    text = str(e)
    return "shared memory" in text and ("No space left" in text or "(28)" in text)


def shm_unwritable_line(e: OSError, folder: str = SHM_FOLDER) -> str:
    """The one line for DataLoader workers whose locks could not be made: multiprocessing's queues hold POSIX
    semaphores, files in /dev/shm, and a container's read-only /dev/shm refused them with a traceback."""
    return (
        f"{folder}: cannot be written ({e.strerror or e}): DataLoader workers make their queues' locks there "
        f"(POSIX semaphores): expected a writable {folder}, or --workers 0 (batches made in the main process)"
    )


def refuse_unwritable_shm(context=None) -> None:
    """Raise SharedMemoryUnwritable where the workers' queues cannot make their locks (`context`: the loader's
    multiprocessing context, None for the default): found before the workers start, in one line."""
    try:
        (context or multiprocessing).Lock()
    except OSError as e:
        if e.errno not in (errno.EROFS, errno.EACCES):
            raise
        raise SharedMemoryUnwritable(shm_unwritable_line(e)) from e


def shm_full_line(batch_bytes: int, workers: int, prefetch: int, folder: str = SHM_FOLDER) -> str:
    """The one line for a batch that found no room in /dev/shm."""
    try:
        size, free = shm_space(folder)
        has = f"{_size(size)} in all, {_size(free)} free"
    except OSError:
        has = "its size unknown"
    held = workers * prefetch
    need = batch_bytes * held
    return (
        f"{folder}: no room for a DataLoader worker's batch ({has}; a batch takes {_size(batch_bytes)}, and "
        f"{workers} worker(s) x {prefetch} prefetched batches hold about {_size(need)} there at once): expected a "
        f"bigger {folder} (e.g. docker run {_shm_size_flag(need)}), or --workers 0 (batches made in the main process, "
        "no shared memory), or a smaller --batch-size or --prefetch-factor"
    )


def report_unsent_batches(prefetch: int) -> None:
    """In a worker: a batch whose hand-over fails is replaced by its error, which the main process raises for it
    (as it does a data set's error), where it waited for the batch for ever. Torch's worker puts `(index, batch)`;
    anything else keeps the queue's own report."""
    from torch.utils.data import get_worker_info
    from torch.utils.data._utils import ExceptionWrapper

    default = multiprocessing.queues.Queue._on_queue_feeder_error

    def on_feeder_error(queue, e, obj) -> None:
        if not (isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], int)):
            default(e, obj)
            return
        info = get_worker_info()
        workers, worker_id = (info.num_workers, info.id) if info is not None else (1, 0)
        try:
            if _shm_full(e):
                raise SharedMemoryFull(shm_full_line(_tensor_bytes(obj[1]), workers, prefetch)) from e
            if too_many_open_files(e):  # each tensor crosses as a file descriptor the worker holds until it is taken
                raise TooManyOpenFiles(open_files_line()) from e
            raise RuntimeError(f"a DataLoader worker's batch could not be sent to the main process: {e}") from e
        except Exception:  # noqa: BLE001 - wrapped, with its traceback, for the main process to raise
            wrapped = ExceptionWrapper(where=f"in DataLoader worker process {worker_id}")
        try:
            queue.put((obj[0], wrapped))  # small: pickled without shared memory
        except ValueError:  # the queue is closed: the worker is being shut down, no one waits for the batch
            pass  # (its "Queue ... is closed" traceback was printed under the run's one line on the open files)

    multiprocessing.queues.Queue._on_queue_feeder_error = on_feeder_error
    quiet_open_files_tracebacks()


def quiet_open_files_tracebacks() -> None:
    """In a worker: multiprocessing's resource sharer, whose thread hands the batches' file descriptors over, prints
    a traceback through sys.excepthook each time it cannot accept the main process's call for lack of open files,
    and tries again; the main process says the limit in one line (host_facts.open_files_line), under tracebacks."""
    default = sys.excepthook

    def hook(kind, value, tb) -> None:
        if not too_many_open_files(value):
            default(kind, value, tb)

    sys.excepthook = hook


def kill_stuck(workers, grace_s: float, at_exit: bool = False) -> None:
    """End `workers` that are still alive after `grace_s` (together) by SIGKILL: they ignore SIGTERM."""
    import time

    deadline = time.monotonic() + grace_s
    for w in workers:
        w.join(max(0.0, deadline - time.monotonic()))
    stuck = [w for w in workers if w.is_alive()]
    if not stuck:
        return
    # torch's SIGCHLD handler raises "DataLoader worker ... is killed by signal" for the workers of a loader that
    # was never shut down, wherever the main thread is: at the exit, in this clean-up (a shut-down loader's workers
    # are no longer watched, and other loaders' must stay so). Windows has no SIGCHLD, and torch sets none there
    if at_exit and threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGCHLD"):
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for w in stuck:
        w.kill()
    for w in stuck:
        w.join(grace_s)


def end_leftover_workers() -> None:
    """At the interpreter's exit, before multiprocessing's exit hook joins its children: daemonic children still
    alive (DataLoader workers of a loader never shut down, or whose shutdown a stop cut short) are given a short
    grace, then killed. That hook ends daemonic children too, by SIGTERM, then joins them without a limit.
    (A started Process no longer holds its target, so a DataLoader's workers are known only as daemonic.)"""
    kill_stuck([p for p in multiprocessing.active_children() if p.daemon], EXIT_GRACE_S, at_exit=True)


_exit_hook_registered = False


def end_workers_at_exit() -> None:
    """Register `end_leftover_workers`, once; registered after multiprocessing's own hook, it runs before it."""
    global _exit_hook_registered
    if not _exit_hook_registered:
        atexit.register(end_leftover_workers)
        _exit_hook_registered = True
