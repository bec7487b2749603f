"""TensorBoard scalars in the run folder, so `tensorboard --logdir runs` shows every run.

What is written (rank 0 only; `tensorboard --logdir runs` names each run after its folder):
  per epoch    the row that goes into metrics.csv: train/loss, train/accuracy, val/loss,
               val/accuracy, train/lr, speed/images_per_s, speed/data_wait_share, speed/epoch_s,
               memory/<peak_mem_kind>_mb, train/skipped_steps and train/epoch
  per readout  train/loss_recent: the mean loss of rank 0's micro-batches since the previous
               readout, every PROGRESS_EVERY micro-steps (engine/trainer.py)
  --monitor    gpu/<index>/util_pct, gpu/<index>/mem_used_mb, gpu/<index>/power_w, host/cpu_pct,
               host/mem_used_mb: the mean of the telemetry samples taken while a step was current

The x axis is the global optimizer step (the schedule's step count), the TensorBoard convention,
so per-epoch points, the loss readouts and telemetry share one axis; train/epoch maps it back to
epochs. Values are float32 (TensorBoard's scalar format), so they equal metrics.csv's to float32.

The files are written with TensorBoard's own record writer and protos, not with
torch.utils.tensorboard: its import loads TensorFlow whenever TensorFlow is installed (the test
extras install it for the framework comparison), and TensorFlow loaded before triton crashes the
process (tensorflow-cpu 2.21 and triton 3.8: a segmentation fault as soon as AdamW is built, which
imports torch._dynamo); it also costs 4.5 s per run start on a 2-core machine. None of the imports
here loads TensorFlow. The records go straight to the file, flushed at every epoch's end (before
the checkpoint) and at most FLUSH_S seconds apart.

Resuming after epoch k keeps one value per step per tag in any reader: before writing, every
event file already in the folder is cut at its first record past step S_k (the steps the
checkpoint holds), so values a killed attempt wrote after its last checkpoint are gone from the
disk, not merely hidden (a file that cannot be cut, read-only, is said in the board's line and
kept as it is: the resume goes on). (A SessionLog START, SummaryWriter's purge_step, is honoured by the
Python EventAccumulator but ignored by TensorBoard's own data server.) Telemetry of a continued
folder starts after S_k, since the attempt that wrote S_k's point already averaged it.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import os
import shlex
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from cnnpar.dist import DistInfo
from cnnpar.report.files import write_failure

INSTALL = 'pip install "cnnpar[tensorboard]"'
FLUSH_S = 10.0  # TensorBoard re-reads a log folder every 5 s; flushing more often shows nothing sooner
_FILE_SEQ = itertools.count()  # event-file names made in this process

# metrics.csv column -> tag (peak_mem_mb goes under its kind: CUDA allocations and process RSS differ)
EPOCH_TAGS = {
    "epoch": "train/epoch",
    "train_loss": "train/loss",
    "train_acc": "train/accuracy",
    "val_loss": "val/loss",
    "val_acc": "val/accuracy",
    "lr": "train/lr",
    "images_per_s": "speed/images_per_s",
    "data_wait_share": "speed/data_wait_share",
    "epoch_s": "speed/epoch_s",
    "eval_s": "speed/eval_s",
    "eval_wait_s": "speed/eval_wait_s",
    "skipped_steps": "train/skipped_steps",
}
LOSS_RECENT = "train/loss_recent"
GPU_COLUMNS = {"gpu_util_pct": "util_pct", "gpu_mem_used_mb": "mem_used_mb", "gpu_power_w": "power_w"}
HOST_COLUMNS = {"host_cpu_pct": "host/cpu_pct", "host_mem_used_mb": "host/mem_used_mb"}


def epoch_scalars(row: dict) -> dict[str, float]:
    """The tags and values of one metrics.csv row (columns it lacks, such as val_* between evaluations, left out)."""
    out = {tag: float(row[col]) for col, tag in EPOCH_TAGS.items() if row.get(col) not in (None, "")}
    if row.get("peak_mem_mb") not in (None, ""):
        out[f"memory/{row.get('peak_mem_kind') or 'peak'}_mb"] = float(row["peak_mem_mb"])
    return out


def telemetry_scalars(rows: list[dict]) -> dict[str, float]:
    """Tags and values of one telemetry sample (one row per GPU, host columns repeated on each)."""
    out: dict[str, float] = {}
    for r in rows:
        if r.get("gpu") not in (None, ""):
            for col, name in GPU_COLUMNS.items():
                if r.get(col) not in (None, ""):
                    out[f"gpu/{r['gpu']}/{name}"] = float(r[col])
    for col, tag in HOST_COLUMNS.items():
        if rows and rows[0].get(col) not in (None, ""):
            out[tag] = float(rows[0][col])
    return out


@functools.lru_cache(maxsize=1)
def _protos():
    """TensorBoard's record writer and protos, or None when tensorboard is not installed.
    None of these imports TensorFlow (tensorboard.compat.tf would)."""
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
        from tensorboard.summary.writer.record_writer import RecordWriter
    except ImportError:
        return None
    return event_pb2, summary_pb2, RecordWriter, masked_crc32c


def event_files(folder: Path) -> list[Path]:
    """The folder's event files in the order TensorBoard reads them (by name: start time first)."""
    return sorted(p for p in Path(folder).iterdir() if "tfevents" in p.name and p.is_file())


def _records(f, masked_crc32c) -> Iterator[tuple[int, bytes | None]]:
    """(end offset, payload) of each record; the payload is None for a record cut short or damaged,
    after which nothing can be framed. A record is (uint64 length, uint32 masked CRC of the length,
    payload, uint32 CRC of the payload)."""
    while header := f.read(12):
        whole = len(header) == 12 and struct.unpack("<I", header[8:])[0] == masked_crc32c(header[:8])
        length = struct.unpack("<Q", header[:8])[0] if whole else 0
        data = f.read(length) if whole else b""
        if not whole or len(data) < length or len(f.read(4)) < 4:
            yield f.tell(), None
            return
        yield f.tell(), data


def cut_after_step(path: Path, step: int) -> int:
    """Truncate an event file at its first record past `step` (or at a record cut short or damaged,
    as a killed writer leaves); returns how many records went (a partial one counts).

    Only the length's CRC is checked: TensorBoard's pure-Python CRC over every payload byte would
    take seconds per megabyte, and a damaged payload fails to parse anyway.
    """
    event_pb2, _, _, masked_crc32c = _protos()

    def step_of(data: bytes | None) -> float:
        try:
            return event_pb2.Event.FromString(data).step if data is not None else math.inf
        except Exception:  # protobuf's DecodeError: a damaged payload
            return math.inf

    keep, removed = 0, 0
    with path.open("rb") as f:
        for end, data in _records(f, masked_crc32c):
            if removed or step_of(data) > step:
                removed += 1  # everything after the first record past the step goes with it
            else:
                keep = end
    if removed:
        os.truncate(path, keep)
    return removed


def cut_earlier(paths: list[Path], step: int) -> tuple[int, str]:
    """Cut each earlier attempt's event file back to `step` (cut_after_step): how many events went, and, where a
    file could not be read or cut (read-only, its folder's disk gone read-only), a clause for the board's line naming
    it, why, and what stays ("" where every file was cut). The resume goes on: the file is a view of the run, and
    metrics.csv and the checkpoint, which the resume needs, are whole; its points past `step` stay beside this run's."""
    removed, refused = 0, []
    for path in paths:
        try:
            removed += cut_after_step(path, step)
        except OSError as e:
            refused.append((path, e))
    if not refused:
        return removed, ""
    (path, e), more = refused[0], len(refused) - 1
    others = f" (and {more} other event file(s))" if more else ""
    return removed, (
        f"; {path}{others}: cannot be cut back to step {step} ({write_failure(e, path.parent)}): the points an "
        f"earlier attempt wrote past step {step} stay in it, beside this run's at the same steps"
    )


class Board:
    """The run's TensorBoard writer; every method is a no-op when it is off (other ranks, no
    tensorboard, --no-tensorboard) or closed. Thread-safe: telemetry arrives from the sampler's thread."""

    def __init__(
        self,
        folder: Path | None = None,
        step_now: Callable[[], int] = lambda: 0,
        log: Callable[[str], None] = print,
        line: str = "",
        telemetry_after: int = -1,
    ) -> None:
        self.folder = folder
        self.step_now = step_now
        self.log = log
        self.line = line  # what the run log says about TensorBoard ("" when off on purpose)
        self._lock = threading.Lock()
        self._file = None
        self._writer = None
        self._path: Path | None = None  # the event file, once made
        self._kept_step = -1  # the last step whose points were flushed to the file: what a failed write leaves
        self._flushed = time.monotonic()
        self._pending: list[tuple[torch.Tensor, torch.cuda.Event | None, int, int]] = []
        self._window = (0.0, 0)  # running loss sum and images at the previous readout of this epoch
        self._last_loss_step = -1
        self._tele_step = -1
        self._tele_floor = telemetry_after  # telemetry is written only for steps past this
        self._tele_sums: dict[str, list[float]] = {}

    @property
    def on(self) -> bool:
        return self.folder is not None

    # ---- writing -----------------------------------------------------------------------------
    def _write(self, step: int, scalars: dict[str, float], flush: bool = False) -> None:
        """One event with every scalar of `scalars` at `step`; call with the lock held."""
        if not self.on:
            return
        event_pb2, summary_pb2, RecordWriter, _ = _protos()
        try:
            if self._writer is None:  # made on the first write: a run that writes nothing leaves no file
                # the sequence number keeps two attempts in one process and one second apart (a resume in tests, tune);
                # zero-padded, as TensorBoard reads a folder's files in name order: ".10" came before ".9"
                stamp = f"{int(time.time()):010d}.{socket.gethostname()}.{os.getpid():07d}.{next(_FILE_SEQ):06d}"
                name = f"events.out.tfevents.{stamp}.cnnpar"
                self._path = self.folder / name
                self._file = self._path.open("ab")
                self._writer = RecordWriter(self._file)
                head = event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2")
                self._writer.write(head.SerializeToString())
            values = [summary_pb2.Summary.Value(tag=t, simple_value=v) for t, v in scalars.items() if math.isfinite(v)]
            event = event_pb2.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=values))
            self._writer.write(event.SerializeToString())
            if flush or time.monotonic() - self._flushed > FLUSH_S:
                self._file.flush()
                if flush:  # the epoch's points reach the disk before its checkpoint does
                    os.fsync(self._file.fileno())
                self._flushed = time.monotonic()
                self._kept_step = max(self._kept_step, step)
        except OSError as e:
            self._stop_writing(e)

    def _stop_writing(self, e: OSError) -> None:
        """The event file's write, flush or close failed (a full disk, a file size limit, a folder gone read-only):
        said once, naming the file and what it keeps; no more points this run, and training goes on. Not the stop
        in one line of a run record's failed write (Trainer._record_written): the event file is a view of the run,
        its epoch points are metrics.csv's, which keeps them for --resume, so stopping would throw away training to
        save a copy; on a disk that is full, the epoch's own records (metrics.csv, the checkpoint) stop the run in
        their one line right after this. Call with the lock held."""
        kept = f"the points up to step {self._kept_step} stay in it" if self._kept_step >= 0 else "it keeps no point"
        self.log(
            f"tensorboard: {self._path or self.folder}: cannot be written ({write_failure(e, self.folder)}): no more "
            f"TensorBoard points this run ({kept}); metrics.csv keeps every epoch, and training goes on"
        )
        with contextlib.suppress(OSError):  # close flushes the buffer's rest again: that write failed already
            self._close_file()
        self.folder = None

    def note_loss(self, loss_sum: torch.Tensor, images: int, step: int) -> None:
        """A readout of the epoch's running loss sum after `images` images, for `step`.

        No host sync: on CUDA the sum is copied into pinned memory behind the work already queued
        and read once that copy has landed (a later readout, or the epoch's end, which syncs anyway).
        """
        if not self.on or step <= self._last_loss_step:
            return
        self._last_loss_step = step
        if loss_sum.device.type == "cuda":
            host = torch.empty((), dtype=loss_sum.dtype, pin_memory=True)
            host.copy_(loss_sum, non_blocking=True)
            landed = torch.cuda.Event()
            landed.record()
            self._pending.append((host, landed, images, step))
        else:
            # a copy: the trainer adds into loss_sum in place; on the CPU it holds its value already
            self._pending.append((loss_sum.detach().clone(), None, images, step))
        self._write_losses(wait=False)

    def _write_losses(self, wait: bool) -> None:
        """Write the readouts whose copies have landed (all of them with `wait`), in order."""
        with self._lock:
            while self._pending:
                host, landed, images, step = self._pending[0]
                if landed is not None and not landed.query():
                    if not wait:
                        return
                    landed.synchronize()
                self._pending.pop(0)
                total, seen = float(host), images
                prev_total, prev_seen = self._window
                self._window = (total, seen)
                if seen > prev_seen:
                    self._write(step, {LOSS_RECENT: (total - prev_total) / (seen - prev_seen)})

    def end_epoch(self, row: dict, step: int) -> None:
        """The epoch's metrics.csv row at `step` (call after the epoch's device sync), flushed to disk."""
        if not self.on:
            return
        self._write_losses(wait=True)  # the epoch's end synced the device: every copy has landed
        with self._lock:
            self._window = (0.0, 0)  # the next epoch's running sums start from zero
            self._write(step, epoch_scalars(row), flush=True)

    def telemetry(self, rows: list[dict]) -> None:
        """One telemetry sample (report/telemetry.py's rows): averaged per step, written once the step moves on."""
        if not self.on:
            return
        step = self.step_now()
        with self._lock:
            if step != self._tele_step:
                self._write_telemetry()
                self._tele_step = step
            for tag, value in telemetry_scalars(rows).items():
                self._tele_sums.setdefault(tag, []).append(value)

    def _write_telemetry(self) -> None:
        if self._tele_sums and self._tele_step > self._tele_floor:
            self._write(self._tele_step, {t: sum(v) / len(v) for t, v in self._tele_sums.items()})
        self._tele_sums = {}

    # ---- life cycle --------------------------------------------------------------------------
    def _close_file(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            finally:
                self._file = self._writer = None

    def close(self) -> None:
        if not self.on:
            return
        try:  # readouts still in flight belong to an epoch that did not finish: not waited for
            self._write_losses(wait=False)
        except RuntimeError:  # the device failed (the error on its way up says how); keep what was written
            self._pending.clear()
        with self._lock:
            self._write_telemetry()
            try:
                self._close_file()  # its flush is the last write: the points since the previous flush
            except OSError as e:
                self._stop_writing(e)
            self.folder = None

    def __enter__(self) -> Board:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_board(
    enabled: bool, info: DistInfo, run_dir: Path, step_now: Callable[[], int], log: Callable[[str], None] = print
) -> Board:
    """Rank 0's board for `run_dir`, continuing at step `step_now()` (0, or the resumed checkpoint's);
    a board that writes nothing elsewhere. Cuts the folder's event files back to that step first."""
    if not info.is_main:
        return Board()
    run_dir = Path(run_dir)
    earlier = event_files(run_dir) if run_dir.is_dir() else []
    if not enabled:
        # an earlier attempt's curve past the resumed step is a path this run no longer took: cut it even with
        # the board off, or TensorBoard would show it as this run's
        if earlier and _protos() is not None:
            start = step_now()
            removed, refused = cut_earlier(earlier, start)
            said = f"; {removed} event(s) an earlier attempt wrote past step {start} removed" if removed else ""
            if said or refused:
                return Board(line=f"tensorboard: off{said}{refused}")
        return Board()
    if _protos() is None:
        return Board(
            line=f"tensorboard: not installed, so no event files in {run_dir} ({INSTALL}, then tensorboard "
            f"--logdir {shlex.quote(str(run_dir.parent))})"
        )
    start = step_now()
    removed, refused = cut_earlier(earlier, start)
    line = f"tensorboard: event files in {run_dir} (tensorboard --logdir {shlex.quote(str(run_dir.parent))})"
    if removed:
        line += f"; {removed} event(s) an earlier attempt wrote past step {start} removed"
    line += refused
    # an earlier attempt's telemetry already averaged the samples of the step this one starts at
    return Board(run_dir, step_now, log, line, telemetry_after=start if earlier else -1)
