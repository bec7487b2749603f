"""What every "data wait" figure measures (report/meters.py DataWait): on a GPU the device's wait
between the step before and the batch, not host time in the loader; on the CPU host time."""

from __future__ import annotations

import time

import pytest
import torch

from cnnpar.report import meters
from cnnpar.report.meters import DataWait, EpochClock


class FakeEvent:
    """A CUDA event on a fake device clock: recording reads the next time (ms) from `clock`, and `done`
    says whether the device has reached it."""

    def __init__(self, clock, done=lambda at_ms: True) -> None:
        self.clock, self.is_done, self.at_ms = clock, done, None

    def record(self) -> None:
        self.at_ms = next(self.clock)
        self.done = self.is_done(self.at_ms)

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True

    def elapsed_time(self, later: FakeEvent) -> float:
        return later.at_ms - self.at_ms


def test_on_cuda_the_wait_is_the_device_gap_between_the_events_not_host_time(monkeypatch):
    """A host that runs ahead blocks in the loader while the device is busy: 30 ms of host time here,
    2 ms of device gap; only the gap is the device's wait. Warm-up calls are not counted."""
    clock = iter([0.0, 2.0, 100.0, 103.0, 200.0, 210.0])  # device times of the events, in record order
    monkeypatch.setattr(meters, "_new_event", lambda: FakeEvent(clock))
    wait = DataWait(torch.device("cuda"))
    with wait.waiting(counted=False):  # a warm-up step: no events, no time
        time.sleep(0.01)
    for _ in range(3):
        with wait.waiting():
            time.sleep(0.01)
    assert wait.host_s >= 0.03
    assert wait.seconds() == pytest.approx((2.0 + 3.0 + 10.0) / 1e3)


def test_on_the_cpu_the_wait_is_host_time_in_the_loader():
    wait = DataWait(torch.device("cpu"))
    with wait.waiting():
        time.sleep(0.02)
    with wait.waiting(counted=False):
        time.sleep(0.05)
    assert 0.02 <= wait.seconds() < 0.05


def test_the_epoch_share_is_the_wait_over_the_wall_time(monkeypatch):
    clock = iter([0.0, 40.0])
    monkeypatch.setattr(meters, "_new_event", lambda: FakeEvent(clock))
    epoch = EpochClock(torch.device("cuda"))
    with epoch.data_wait.waiting():
        pass
    epoch.count(8)
    epoch.start = time.perf_counter() - 0.2  # a 0.2 s epoch
    row = epoch.summary()
    assert row["data_wait_share"] == pytest.approx(0.04 / row["epoch_s"], rel=0.05)
    assert row["images_per_s"] == pytest.approx(8 / row["epoch_s"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_a_host_ahead_of_the_device_is_no_data_wait_and_an_idle_device_is():
    """Host 50 ms in the loader while 200 ms of work is still queued: the device did not wait. Host 50 ms
    in the loader with nothing queued: the device waited about 50 ms."""
    dev = torch.device("cuda")
    torch.cuda.synchronize(dev)
    ahead = DataWait(dev)
    torch.cuda._sleep(int(0.2 * 1.4e9))  # ~200 ms of queued work (cycles at ~1.4 GHz; a rough clock)
    with ahead.waiting():
        time.sleep(0.05)
    torch.cuda.synchronize(dev)
    idle = DataWait(dev)
    with idle.waiting():
        time.sleep(0.05)
    torch.cuda.synchronize(dev)
    assert ahead.host_s >= 0.05 and ahead.seconds() < 0.005
    assert 0.04 <= idle.seconds() <= 0.2


def test_a_long_epoch_holds_a_bounded_number_of_events_reading_the_finished_ones_as_it_goes(monkeypatch):
    """An epoch of 10^5 steps must not hold 2 x 10^5 CUDA events until its end: finished pairs are read
    (without waiting) once more than PENDING are held, and recorded again only after they were read;
    unfinished ones wait for `seconds` after the sync."""
    clock = iter(float(t) for t in range(10**6))  # each event 1 ms after the one before
    made = []

    def event():
        made.append(FakeEvent(clock, done=lambda at_ms: at_ms < 300))  # the last pairs not finished yet
        return made[-1]

    monkeypatch.setattr(meters, "_new_event", event)
    wait = DataWait(torch.device("cuda"))
    for _ in range(200):
        with wait.waiting():
            pass
        assert len(wait._events) <= DataWait.PENDING + 1
    assert len(made) <= 2 * (DataWait.PENDING + 1)  # pairs read were recorded again, not made anew
    assert wait.seconds() == pytest.approx(200 * 1.0 / 1e3)  # each pair 1 ms apart; seconds() waits for the last
    assert len(wait._events) == 0


class Batches:
    """A loader whose batches take `slow_s` to arrive for the first `slow_first` calls (all when None)."""

    def __init__(self, slow_s: float, slow_first: int | None = None) -> None:
        self.slow_s, self.slow_first, self.calls = slow_s, slow_first, 0

    def next_group(self, trainer, batches):
        self.calls += 1
        if self.slow_first is None or self.calls <= self.slow_first:
            time.sleep(self.slow_s)
        return [(None, torch.zeros(4))]

    def close(self) -> None:
        pass


def fake_trainer():
    from types import SimpleNamespace

    from cnnpar.dist import DistInfo

    return SimpleNamespace(info=DistInfo(0, 0, 1, torch.device("cpu")), model=torch.nn.Linear(1, 1))


def step_taking(seconds: float):
    def run_step(trainer, group):
        time.sleep(seconds)
        return 4

    return run_step


def test_the_doctors_end_to_end_counts_no_wait_of_its_warm_up_steps(monkeypatch):
    from cnnpar.doctor import measure

    loader = Batches(0.05, slow_first=3)  # the warm-up's batches are slow, the timed ones are not
    monkeypatch.setattr(measure, "training_batches", lambda trainer: loader)
    monkeypatch.setattr(measure, "next_group", loader.next_group)
    monkeypatch.setattr(measure, "run_step", step_taking(0.005))
    phase = measure.measure_end_to_end(fake_trainer(), warmup=3, steps=6, max_s=10)
    assert phase.batches == 6 and phase.data_wait_s < 0.02, phase


def test_the_bench_measures_each_repeats_wait_alone(monkeypatch):
    """Each repeat's share is its own wait over its own wall time: a loader as slow as the step gives about
    half in every repeat, not a share that grows with the warm-up and the repeats before it."""
    from cnnpar.bench import measure
    from cnnpar.bench.timing import Timing

    loader = Batches(0.01)
    monkeypatch.setattr(measure, "training_batches", lambda trainer, first_epoch=0: loader)
    monkeypatch.setattr(measure, "next_group", loader.next_group)
    monkeypatch.setattr(measure, "run_step", step_taking(0.01))
    row = measure.measure_steps(fake_trainer(), Timing(warmup=2, steps=5, repeats=3, seconds=0))
    assert 0.3 < row["data_wait_share"] < 0.7, row["data_wait_share"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_reading_as_it_goes_gives_the_sum_of_every_pair(monkeypatch):
    """More pairs than DataWait.PENDING, with work queued between them: the pairs read on the way (finished ones
    only, without waiting, then recorded again) and the rest read after the sync add up to every recording's gap.
    Each recording of the meter's events is shadowed by a new event recorded right after it and kept: the kept
    ones, read at the end, give every gap (each shifted by one record's cost at both ends, which cancels).
    (A second meter nested around the first differs by two records' host time a call on an idle device:
    ~26 us, call ZZZG. The shadows too: a shadow is recorded on the host after its event, so where the device is
    idle at a pair's end its gap grows by that host time, and a host busy with other work made it 1.8 ms over 28
    such ends in call ZZZW, past a 1.5 ms bound. The host is away 10 ms a time, so that one pair lost or read
    twice is 10 ms off, well outside the 5 ms the records' host time may add.)"""
    shadows = []

    class Shadowed(torch.cuda.Event):
        def record(self, stream=None):
            super().record(stream)
            shadows.append(torch.cuda.Event(enable_timing=True))
            shadows[-1].record(stream)

    monkeypatch.setattr(meters, "_new_event", lambda: Shadowed(enable_timing=True))
    dev = torch.device("cuda")
    torch.cuda.synchronize(dev)
    wait = DataWait(dev)
    for i in range(3 * DataWait.PENDING):
        with wait.waiting():
            if i % 7 == 0:
                time.sleep(0.01)  # the device idles while the host is away
        torch.cuda._sleep(200_000)  # a step's worth of queued work
    torch.cuda.synchronize(dev)
    every = sum(a.elapsed_time(b) for a, b in zip(shadows[::2], shadows[1::2])) / 1e3
    assert len(shadows) == 2 * 3 * DataWait.PENDING and every >= 27 * 0.01 * 0.8  # away 28 times for 10 ms
    assert wait.seconds() == pytest.approx(every, abs=5e-3)
    assert len(wait._spare) <= DataWait.PENDING + 1  # 3 x PENDING calls, at most PENDING + 1 pairs ever made
