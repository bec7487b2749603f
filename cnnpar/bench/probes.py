"""Measurements that are not a whole train step: a host loader alone, a preprocessing function,
compile wall time, and the memory a train step takes. Used by the claims."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import torch

from cnnpar.config import Config
from cnnpar.data import DataBundle
from cnnpar.data.loader import build_loader
from cnnpar.data.transforms import DeviceTransform
from cnnpar.dist import DistInfo
from cnnpar.engine.harness import cycle_batches, reset_compiler
from cnnpar.engine.train_step import TrainStep, build_standalone_step
from cnnpar.models import build_model
from cnnpar.parallel import resolve_for
from cnnpar.parallel.apply import apply_channels_last, apply_stem_space_to_depth
from cnnpar.report.meters import free_device_memory, sync

from .timing import Spread, Timing


class HostSide:
    """The DataLoader under a feeder: the batches the host produces, before the device's transform."""

    def __init__(self, feeder) -> None:
        self.feeder = feeder

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.feeder.sampler, "set_epoch"):
            self.feeder.sampler.set_epoch(epoch)

    def __iter__(self):
        slots = getattr(self.feeder.decoder, "slots", None)
        for x, y in self.feeder.loader:
            if slots is not None and getattr(x, "slot", None) is not None:  # never decoded: its slot goes back
                slots.release(x.slot)
                x.slot = None
            yield x, y


def host_loader_rate(cfg: Config, bundle: DataBundle, timing: Timing, host_only: bool = False) -> tuple[Spread, int]:
    """Images/s of the train loader alone on the CPU (no device copy, no model): median and range of
    repeats, and the batches each repeat timed. `host_only`: stop before the device-side transform (normalise,
    crop, flip), which a GPU run does on the GPU, so the figure is the host's work alone."""
    cpu = DistInfo(0, 0, 1, torch.device("cpu"))
    feeder = build_loader(bundle, resolve_for(cfg, cpu.device), cpu, train=True)
    batches = cycle_batches(HostSide(feeder) if host_only else feeder, first_epoch=0)
    try:
        for _ in range(timing.warmup):
            next(batches)
        t0 = time.perf_counter()
        next(batches)
        steps = timing.steps_for(time.perf_counter() - t0)
        rates = []
        for _ in range(timing.repeats):
            start, images = time.perf_counter(), 0
            for _ in range(steps):
                images += next(batches)[1].shape[0]
            rates.append(images / (time.perf_counter() - start))
    finally:
        batches.close()
    return Spread.of(rates), steps


def time_calls(fn: Callable[[], object], device: torch.device, timing: Timing) -> tuple[Spread, int]:
    """Milliseconds per call (median and range over repeats), after warm-up calls, and the calls each repeat
    timed."""
    for _ in range(max(3, timing.warmup)):
        fn()
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)  # note: a CPU-GPU sync point, outside the measured region
    steps = timing.steps_for(time.perf_counter() - t0)
    per_call = []
    for _ in range(timing.repeats):
        sync(device)  # note: a CPU-GPU sync point, before the clock starts
        start = time.perf_counter()
        for _ in range(steps):
            fn()
        sync(device)
        per_call.append(1000.0 * (time.perf_counter() - start) / steps)
    return Spread.of(per_call), steps


def preprocess_ms(batch: torch.Tensor, compiled: bool, device: torch.device, timing: Timing) -> tuple[Spread, int]:
    """Milliseconds per batch of the device-side transform a train step's batch goes through (data/transforms.py
    `DeviceTransform`: pad-4 crop and flip on the uint8 batch, then one multiply-add to normalised floats), eager or
    torch.compile'd whole, and the batches each repeat timed. It timed a copy that normalised first and cropped and
    flipped floats, four times the bytes of each pass cnnpar runs, so its eager side was not the one training pays."""
    reset_compiler()
    c = batch.shape[1]
    transform = DeviceTransform([0.5] * c, [0.25] * c, "crop+flip", False, device)
    # the global RNG stands in for the transform's generator, which Dynamo cannot trace: on both sides alike
    transform.generator = None
    x = batch.to(device)
    fn = torch.compile(transform.__call__) if compiled else transform
    return time_calls(lambda: fn(x, True), device, timing)


@contextlib.contextmanager
def no_compile_caches():
    """Compile from scratch: the on-disk FX-graph and autograd caches would otherwise make a
    second run (or a second bench) look faster than a first compile is."""
    import torch._inductor.config as inductor_config

    if hasattr(inductor_config, "force_disable_caches"):
        with inductor_config.patch(force_disable_caches=True):
            yield
    else:  # older torch
        with inductor_config.patch(fx_graph_cache=False):
            yield


def fresh_step(
    cfg: Config, shape: tuple[int, int, int], num_classes: int, device: torch.device, compiled: bool = False, **compile
) -> TrainStep:
    """The run's own step (`build_train_step`: clipping, weight average and all) on a freshly built model,
    rewritten as the Trainer rewrites it (the stem) and torch.compile'd with `compile` where `compiled`."""
    c, h, w = shape
    model = build_model(cfg.model.name, c, num_classes, h, w)
    model = apply_stem_space_to_depth(model, cfg.speed.stem_space_to_depth == "on")
    model = apply_channels_last(model.to(device), cfg.speed.channels_last == "on")
    if compiled:
        model = torch.compile(model, **compile)
    return build_standalone_step(model, cfg, device, total_steps=1)  # one step: its weight average updates


def _random_batch(batch: int, shape: tuple[int, int, int], num_classes: int, cfg: Config, device: torch.device):
    x = torch.randn(batch, *shape, device=device)
    if cfg.speed.channels_last == "on":
        x = x.contiguous(memory_format=torch.channels_last)
    return x, torch.randint(0, num_classes, (batch,), device=device)


def warm_compiler(device: torch.device) -> None:
    """Pay Inductor's one-time start-up (imports, worker pool) on a toy model, so the first timed
    compile is not charged for it."""
    reset_compiler()
    toy = torch.compile(torch.nn.Linear(8, 8).to(device))
    toy(torch.randn(4, 8, device=device)).sum().backward()
    sync(device)


def compile_seconds(cfg: Config, shape, num_classes: int, device: torch.device, dynamic: bool | None) -> float:
    """Wall time of the first forward + backward of a freshly compiled model (the compile)."""
    reset_compiler()
    step = fresh_step(cfg, shape, num_classes, device, compiled=True, dynamic=dynamic)
    x, y = _random_batch(cfg.run.batch_size, shape, num_classes, cfg, device)
    with no_compile_caches():
        sync(device)
        start = time.perf_counter()
        step.rehearse(x, y)  # the trainer's compile warm-up: forward and backward, nothing trained
        sync(device)
        return time.perf_counter() - start


def _one_step(cfg: Config, shape, num_classes: int, device: torch.device, batch: int) -> None:
    step = fresh_step(cfg, shape, num_classes, device)
    x, y = _random_batch(batch, shape, num_classes, cfg, device)
    step([(x, y)])
    sync(device)


def step_memory(cfg: Config, shape, num_classes: int, device: torch.device, batches: tuple[int, int]) -> dict:
    """Peak CUDA memory of one train step (fresh model and optimizer) at two batch sizes, and the
    largest batch that the free memory holds by the straight line through them: memory grows
    linearly with the batch (activations) above a fixed part (weights, gradients, optimizer state).

    Two steps instead of doubling until out of memory: a search on a 141 GB GPU takes a dozen
    steps at batches of thousands (most of a minute for ResNet-50), the line two small ones.
    cuDNN autotuning is off here: its trial workspaces would be counted as the step's memory."""
    free, _ = torch.cuda.mem_get_info(device)
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False
    peaks = []
    try:
        for b in batches:
            free_device_memory(device)  # resets the peak too
            base = torch.cuda.memory_allocated(device)
            _one_step(cfg, shape, num_classes, device, b)
            peaks.append(torch.cuda.max_memory_allocated(device) - base)
    finally:
        torch.backends.cudnn.benchmark = before
        free_device_memory(device)
    (b0, b1), (m0, m1) = batches, peaks
    per_image = (m1 - m0) / (b1 - b0)
    fixed = m0 - per_image * b0
    return {"per_image": per_image, "fixed": fixed, "free": free, "largest": int((free - fixed) // per_image)}
