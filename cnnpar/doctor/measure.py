"""The doctor's measurements: input pipeline alone, train step alone, end to end.

Each is timed like the device is asynchronous: warm-up steps (worker start, cuDNN autotuning,
compilation) run first and are not counted, and `sync()` closes the device's queue before the
clock starts and again before it stops. A phase stops after `steps` batches (optimizer steps where it
trains) or, past two, once `max_s` seconds have gone, so a very slow input still gives an answer in bounded time.

Every phase counts micro-batches, each of `--batch-size` images: with `--grad-accum G` an optimizer step
trains G of them, and its time is spread over the G, so ms/batch means the same batch in every row and the
fixed-cost estimate compares like with like.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from cnnpar.data.transforms import TextbookDataset, resolve_augment
from cnnpar.engine.harness import next_group, run_step, training_batches
from cnnpar.engine.trainer import Trainer
from cnnpar.report.meters import DataWait, sync

GPU_IDLE_PROBE_STEPS = 5


@dataclass
class Phase:
    name: str
    batches: int  # micro-batches of --batch-size images (an optimizer step holds --grad-accum of them)
    seconds: float
    images: int
    data_wait_s: float = 0.0
    # batches timed in all where this is the best of several rounds (the step alone: rounds of steps // 10 each),
    # which is what settles it, not the best round's own few; 0: `batches`
    measured_batches: int = 0

    @property
    def settled_by(self) -> int:
        return self.measured_batches or self.batches

    @property
    def images_per_batch(self) -> float:
        """The batch this row measured, from its own counts: a try's is the batch its Trainer ran (capped to the
        training split where the change asked for more), which the report's batch column shows."""
        return self.images / max(1, self.batches)

    @property
    def s_per_batch(self) -> float:
        return self.seconds / max(1, self.batches)

    @property
    def s_per_image(self) -> float:
        return self.seconds / max(1, self.images)

    @property
    def images_per_s(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else 0.0

    @property
    def data_wait_share(self) -> float:
        return self.data_wait_s / self.seconds if self.seconds > 0 else 0.0

    def row(self) -> dict:
        return {
            **asdict(self),
            "images_per_batch": round(self.images_per_batch, 1),
            "ms_per_batch": round(1e3 * self.s_per_batch, 3),
            "images_per_s": round(self.images_per_s, 2),
            "data_wait_share": round(self.data_wait_share, 4),
        }


def _timed(
    name: str, device: torch.device, warmup: int, steps: int, max_s: float, body: Callable[[int], tuple[int, int]]
) -> Phase:
    """body(i) runs one unit of work (a batch read, or an optimizer step) and returns how many images and
    micro-batches it handled."""
    for i in range(warmup):
        body(i)
    sync(device)  # note: a CPU-GPU sync point: warm-up work must not leak into the measured window
    t0 = time.perf_counter()
    images = batches = calls = 0
    while calls < steps:
        done, micro = body(warmup + calls)
        images, batches, calls = images + done, batches + micro, calls + 1
        if calls >= 2 and time.perf_counter() - t0 > max_s:
            break
    sync(device)  # note: a CPU-GPU sync point: the window ends when the device's work does
    return Phase(name, batches, time.perf_counter() - t0, images)


def measure_pipeline(trainer: Trainer, warmup: int, steps: int, max_s: float) -> Phase:
    """Batches delivered to the device (read, decode, copy, device transform), with no training."""
    batches = training_batches(trainer)
    try:
        return _timed(
            "input pipeline alone", trainer.info.device, warmup, steps, max_s, lambda i: (next(batches)[1].shape[0], 1)
        )
    finally:
        batches.close()  # ends the loader iterator (and non-persistent workers) now, not at GC time


def first_batch(trainer: Trainer) -> tuple[torch.Tensor, torch.Tensor]:
    batches = training_batches(trainer)
    try:
        return next(batches)
    finally:
        batches.close()


def measure_step(
    trainer: Trainer, x: torch.Tensor, y: torch.Tensor, warmup: int, steps: int, max_s: float, name: str = ""
) -> Phase:
    """The train step alone on one batch already on the device, repeated (an accumulation group
    holds it `grad_accum` times); `steps` counts optimizer steps."""
    trainer.model.train()
    group = next_group(trainer, itertools.repeat((x, y)))

    def body(i: int) -> tuple[int, int]:
        return run_step(trainer, group), len(group)

    return _timed(name or "train step alone", trainer.info.device, warmup, steps, max_s, body)


def measure_step_scaling(
    trainer: Trainer, x: torch.Tensor, y: torch.Tensor, warmup: int, steps: int, max_s: float, max_rounds: int = 10
) -> tuple[Phase, Phase]:
    """The step at the full batch and at half of it, in alternating rounds; the best round of each.

    Alternating exposes both sizes to the same background load, and the best round is the one a
    busy machine disturbed least (noise only ever adds time), which the fixed-cost estimate
    2 * t(B/2) - t(B) needs: it is a difference of two measurements. Many short rounds beat a few
    long ones here: with 3 rounds a loaded 2-core host still disturbed every half-batch round now
    and then, and the estimate crossed the host-bound line.
    """
    rounds = max(3, min(steps, max_rounds))
    half_n = y.shape[0] // 2
    xh, yh = x[:half_n], y[:half_n]
    measure_step(trainer, x, y, warmup, 0, max_s)
    measure_step(trainer, xh, yh, warmup, 0, max_s)
    per_round = max(1, steps // rounds)
    full: list[Phase] = []
    half: list[Phase] = []
    for _ in range(rounds):
        full.append(measure_step(trainer, x, y, 0, per_round, max_s / rounds))
        half.append(measure_step(trainer, xh, yh, 0, per_round, max_s / rounds, "train step, half batch"))
    best_full, best_half = min(full, key=lambda p: p.s_per_batch), min(half, key=lambda p: p.s_per_batch)
    best_full.measured_batches = sum(p.batches for p in full)
    best_half.measured_batches = sum(p.batches for p in half)
    return best_full, best_half


def fixed_cost(full: Phase, half: Phase) -> float:
    """Seconds of a micro-batch's step that do not grow with the batch: 2 * t(B/2) - t(B), within [0, t(B)].
    Per micro-batch, as both phases count time: with accumulation it holds the micro-batch's own launches and
    its share of the optimizer step's."""
    return min(full.s_per_batch, max(0.0, 2 * half.s_per_batch - full.s_per_batch))


def measure_end_to_end(trainer: Trainer, warmup: int, steps: int, max_s: float, name: str = "") -> Phase:
    """The training loop as `Trainer.train_epoch` runs it: wait for a batch, then train on it."""
    trainer.model.train()
    batches = training_batches(trainer)
    waited = DataWait(trainer.info.device)

    def body(i: int) -> tuple[int, int]:
        with waited.waiting(counted=i >= warmup):
            group = next_group(trainer, batches)
        return run_step(trainer, group), len(group)

    try:
        phase = _timed(name or "end to end", trainer.info.device, warmup, steps, max_s, body)
    finally:
        batches.close()
    phase.data_wait_s = waited.seconds()  # after _timed's closing sync
    return phase


def gpu_idle_share(trainer: Trainer, x: torch.Tensor, y: torch.Tensor, step_s: float) -> float | None:
    """Share of the step's wall time in which no kernel or copy runs on the GPU.

    Kernel intervals come from a short torch.profiler capture (their union, so overlapping
    streams count once); the wall time per micro-batch is the unprofiled `step_s` (a Phase's
    s_per_batch), so the profiler's own host overhead cannot inflate the idle share.
    """
    if trainer.info.device.type != "cuda":
        return None
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from cnnpar.report.profiler import one_cycle_options

    trainer.model.train()
    group = next_group(trainer, itertools.repeat((x, y)))
    run_step(trainer, group)  # outside the capture: a CUDA graph for this shape is captured on first use
    sync(trainer.info.device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], **one_cycle_options()) as prof:
        for _ in range(GPU_IDLE_PROBE_STEPS):
            run_step(trainer, group)
        sync(trainer.info.device)  # note: a CPU-GPU sync point: every kernel must land in the capture
    events = prof.events()
    # Kineto mirrors every record_function range onto the GPU timeline as a "user annotation"
    # that spans the gaps between its kernels; only kernels, copies and memsets are busy time.
    # The annotations carry their CPU range's name (older torch has no is_user_annotation flag).
    cpu_names = {e.name for e in events if e.device_type == DeviceType.CPU}
    spans = sorted(
        (e.time_range.start, e.time_range.end)
        for e in events
        if e.device_type == DeviceType.CUDA
        and e.time_range.end > e.time_range.start
        and not getattr(e, "is_user_annotation", False)
        and e.name not in cpu_names
    )
    if not spans:
        return None
    busy, cur_start, cur_end = 0.0, *spans[0]
    for s, e in spans[1:]:
        if s > cur_end:
            busy += cur_end - cur_start
            cur_start, cur_end = s, e
        else:
            cur_end = max(cur_end, e)
    busy += cur_end - cur_start
    busy_per_batch_s = busy * 1e-6 / (GPU_IDLE_PROBE_STEPS * len(group))  # per micro-batch, as step_s
    return min(1.0, max(0.0, 1.0 - busy_per_batch_s / step_s))


def textbook_cost_ratio(trainer: Trainer, samples: int = 8) -> float | None:
    """Per-sample cost of reading alone over reading plus the textbook float transform (<= 1).

    Measures what switching `data.loader` from textbook to fast saves per sample on the host.
    """
    if trainer.cfg.data.loader != "textbook":
        return None
    base = trainer.bundle.train
    n = min(samples, len(base))
    augment = resolve_augment(
        trainer.cfg.data.augment, trainer.bundle.shape, trainer.bundle.loader_crops, trainer.bundle.grey
    )
    min_scale = trainer.cfg.data.crop_min_scale
    textbook = TextbookDataset(base, trainer.bundle.mean, trainer.bundle.std, augment, True, min_scale)
    for i in range(n):  # warm the page cache so neither timing below pays for the disk
        base[i]

    def clock(ds) -> float:
        t0 = time.perf_counter()
        for i in range(n):
            ds[i]
        return time.perf_counter() - t0

    with_transform, plain = clock(textbook), clock(base)
    return min(1.0, plain / with_transform) if with_transform > 0 else None
