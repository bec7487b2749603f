"""The TensorBoard board alone: event files cut back to a step (a killed writer's half record
included), the loss readouts' windows, telemetry averaged per step, and rank 0 alone writing."""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest
import torch
from tensorboard.compat.proto import event_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

from cnnpar.dist import DistInfo
from cnnpar.report.tensorboard import Board, cut_after_step, event_files, open_board
from tests.conftest import run_cmd
from tests.integration.test_tensorboard import read_scalars

CPU = torch.device("cpu")
MAIN = DistInfo(rank=0, local_rank=0, world_size=2, device=CPU)


def _row(epoch: int, loss: float) -> dict:
    return {"epoch": epoch, "train_loss": loss, "peak_mem_mb": 100.0 + epoch, "peak_mem_kind": "process_peak_rss"}


def test_cut_after_step_keeps_what_a_checkpoint_covers_and_drops_a_half_written_record(tmp_path):
    with open_board(True, MAIN, tmp_path, lambda: 0) as board:
        for epoch in (1, 2, 3):
            board.end_epoch(_row(epoch, 1.0 / epoch), step=2 * epoch)
    (path,) = event_files(tmp_path)
    whole = path.read_bytes()
    record = io.BytesIO()
    RecordWriter(record).write(event_pb2.Event(step=7, file_version="x" * 40).SerializeToString())
    path.write_bytes(whole + record.getvalue()[:30])  # a record a SIGKILL cut short: its header whole, data not
    assert cut_after_step(path, 100) == 1  # only the half record goes
    assert path.read_bytes() == whole
    assert cut_after_step(path, 4) == 1  # epoch 3's event
    scalars = read_scalars(tmp_path)
    assert scalars["train/loss"] == [(2, 1.0), (4, 0.5)]
    assert scalars["memory/process_peak_rss_mb"] == [(2, 101.0), (4, 102.0)]
    assert cut_after_step(path, 4) == 0  # cutting again changes nothing


def test_loss_readouts_are_window_means_and_restart_every_epoch(tmp_path):
    with open_board(True, MAIN, tmp_path, lambda: 0) as board:
        loss_sum = torch.tensor(10.0, dtype=torch.float64)
        board.note_loss(loss_sum, 5, step=1)  # 10 over 5 images
        loss_sum += 15.0  # the trainer adds in place: the readout above must have kept its own copy
        board.note_loss(loss_sum, 10, step=2)  # 15 over the next 5
        board.note_loss(loss_sum, 10, step=2)  # the same step again (accumulation): ignored
        board.end_epoch(_row(1, 2.5), step=3)
        board.note_loss(torch.tensor(4.0, dtype=torch.float64), 2, step=4)  # a new epoch's sums start at 0
    assert read_scalars(tmp_path)["train/loss_recent"] == [(1, 2.0), (2, 3.0), (4, 2.0)]


def test_telemetry_is_averaged_per_step_and_a_continued_folder_starts_after_its_step(tmp_path, monkeypatch):
    import itertools

    from cnnpar.report import tensorboard

    # the two attempts' files numbered 9 and 10 in one second: unpadded, TensorBoard read "...10" first (a CI run)
    monkeypatch.setattr(tensorboard, "_FILE_SEQ", itertools.count(9))
    step = [0]
    rows = lambda cpu: [{"gpu": "", "host_cpu_pct": cpu, "host_mem_used_mb": ""}]  # noqa: E731
    with open_board(True, MAIN, tmp_path, lambda: step[0]) as board:
        board.telemetry(rows(10.0))
        board.telemetry(rows(30.0))
        step[0] = 5
        board.telemetry(rows(50.0))
    assert read_scalars(tmp_path)["host/cpu_pct"] == [(0, 20.0), (5, 50.0)]
    assert "host/mem_used_mb" not in read_scalars(tmp_path)  # an empty cell is no point

    gpu_rows = [
        {"gpu": "0", "gpu_util_pct": 90.0, "gpu_mem_used_mb": 1000.0, "gpu_power_w": "", "host_cpu_pct": 12.0},
        {"gpu": "1", "gpu_util_pct": 80.0, "gpu_mem_used_mb": 2000.0, "gpu_power_w": "", "host_cpu_pct": 12.0},
    ]
    with open_board(True, MAIN, tmp_path, lambda: step[0]) as board:  # resumed at step 5
        board.telemetry(rows(70.0))  # step 5 already has its point from the earlier attempt
        step[0] = 6
        board.telemetry(gpu_rows)
    scalars = read_scalars(tmp_path)
    assert scalars["host/cpu_pct"] == [(0, 20.0), (5, 50.0), (6, 12.0)]
    assert scalars["gpu/0/util_pct"] == [(6, 90.0)] and scalars["gpu/1/mem_used_mb"] == [(6, 2000.0)]
    assert "gpu/0/power_w" not in scalars


def test_a_resume_with_the_board_off_still_cuts_an_earlier_attempts_curve_past_its_step(tmp_path):
    with open_board(True, MAIN, tmp_path, lambda: 0) as board:  # the first attempt, killed after step 6
        for epoch in (1, 2, 3):
            board.end_epoch(_row(epoch, 1.0 / epoch), step=2 * epoch)
    with open_board(False, MAIN, tmp_path, lambda: 4) as board:  # resumed at step 4 with --no-tensorboard
        assert not board.on
        assert board.line == "tensorboard: off; 1 event(s) an earlier attempt wrote past step 4 removed"
    assert read_scalars(tmp_path)["train/loss"] == [(2, 1.0), (4, 0.5)]
    with open_board(False, MAIN, tmp_path, lambda: 4) as board:  # nothing more to cut: nothing to say
        assert board.line == ""
    other = DistInfo(rank=1, local_rank=1, world_size=2, device=CPU)
    with open_board(False, other, tmp_path, lambda: 0):  # only rank 0 touches the files
        pass
    assert read_scalars(tmp_path)["train/loss"] == [(2, 1.0), (4, 0.5)]


def test_only_rank_0_writes_and_a_board_writes_nothing_until_asked(tmp_path):
    other = DistInfo(rank=1, local_rank=1, world_size=2, device=CPU)
    with open_board(True, other, tmp_path, lambda: 0) as board:
        assert board.line == ""
        board.end_epoch(_row(1, 1.0), step=1)
        board.note_loss(torch.tensor(1.0), 1, step=1)
        board.telemetry([{"gpu": "", "host_cpu_pct": 5.0}])
    with open_board(True, MAIN, tmp_path, lambda: 0):
        pass  # nothing to say: no file
    assert event_files(tmp_path) == []
    Board().end_epoch(_row(1, 1.0), step=1)  # the trainer's board before fit opens the run's


def test_writing_event_files_never_loads_tensorflow(tmp_path):
    """TensorFlow loaded before triton crashes the process (report/tensorboard.py says why); the
    test extras install TensorFlow, so this is checked in a fresh interpreter."""
    code = (
        "import sys, torch\n"
        "from cnnpar.dist import DistInfo\n"
        "from cnnpar.report.tensorboard import open_board\n"
        "info = DistInfo(0, 0, 1, torch.device('cpu'))\n"
        f"with open_board(True, info, {str(tmp_path)!r}, lambda: 0) as b:\n"
        "    b.end_epoch({'epoch': 1, 'train_loss': 1.0}, 1)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'tensorflow'))\n"
    )
    p = run_cmd([sys.executable, "-c", code], tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"
    assert len(event_files(tmp_path)) == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_readouts_wait_for_nothing_and_land_in_order(tmp_path):
    """The loss readouts behind queued GPU work: no host sync (sync debug mode would raise), some
    still in flight when the loop ends, and every one written, right, once the epoch syncs."""
    dev = torch.device("cuda")
    x = torch.randn(4096, 4096, device=dev)
    loss_sum = torch.zeros((), dtype=torch.float64, device=dev)
    sums = []
    with open_board(True, DistInfo(0, 0, 1, dev), tmp_path, lambda: 0) as board:
        torch.cuda.set_sync_debug_mode("error")
        try:
            for step in range(1, 41):
                loss_sum += (x @ x).abs().mean()  # a few ms of work per step, queued far ahead of the device
                board.note_loss(loss_sum, 32 * step, step)
                sums.append(loss_sum.clone())
        finally:
            torch.cuda.set_sync_debug_mode("default")
        in_flight = len(board._pending)
        torch.cuda.synchronize()
        board.end_epoch({"epoch": 1}, step=40)
    assert in_flight > 0  # the host ran ahead: readouts waited for nothing
    totals = [0.0] + [float(s) for s in sums]
    got = read_scalars(tmp_path)["train/loss_recent"]
    assert [s for s, _ in got] == list(range(1, 41))
    want = [float(np.float32((totals[i] - totals[i - 1]) / 32)) for i in range(1, 41)]
    assert [v for _, v in got] == pytest.approx(want, rel=1e-6)


def test_a_last_flush_refused_at_close_is_said_once_naming_the_file_and_what_it_keeps(tmp_path, monkeypatch):
    """The points written since the last flush reach the disk only at close: a full disk there is said in the
    board's one line, not raised out of the run's end (it had been a traceback after the last epoch)."""
    from tests.integration.test_run_view_writes import disk_full_for

    disk_full_for(monkeypatch, "tfevents", 1)  # epoch 1's flush fits; the close's does not
    said: list[str] = []
    board = open_board(True, MAIN, tmp_path, lambda: 0, said.append)
    board.end_epoch(_row(1, 2.5), step=3)
    board.note_loss(torch.tensor(4.0, dtype=torch.float64), 2, step=4)  # buffered, not flushed
    board.close()
    board.close()  # closed: nothing more to say
    (events,) = event_files(tmp_path)
    (line,) = [line for line in said if "cannot be written" in line]
    assert line.startswith(f"tensorboard: {events}: cannot be written (No space left on device; ")
    assert line.endswith("(the points up to step 3 stay in it); metrics.csv keeps every epoch, and training goes on")
    assert read_scalars(tmp_path)["train/epoch"] == [(3, 1.0)] and "train/loss_recent" not in read_scalars(tmp_path)
