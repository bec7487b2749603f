"""`--batch-size auto`: the largest batch that fits with a margin and still raises measured throughput.

The search doubles the batch from 64 (the CPU default, and what every run used before; 256 for
photos decoded on the GPU and photo-sized inputs, `search_start`) and times
a few steps at each size; it keeps doubling while a size fits within the memory margin and is at
least `MIN_GAIN` faster per image than the size before it. Beyond the point where the device is
saturated a larger batch buys no speed, only fewer optimizer steps per epoch (which costs accuracy
per epoch), so the search stops at the first doubling that gains too little.

The learning rate follows the batch by a stated rule (`batch_lr_factor`, in config.py): `--lr` is the lr for
the batch `--lr-batch` names (`config.lr_reference`: 64 by default, a preset's own batch, a run record's
fixed batch), and an automatically chosen batch B multiplies it by B / lr_batch for SGD and for Muon's
SGD groups (the linear scaling rule, Goyal et al. 2017) or by sqrt(B / lr_batch) for AdamW (the
square-root rule for adaptive optimizers, Malladi et al. 2022); the schedule's warm-up stays as
configured (a one-cycle schedule warms up over its first 15 % of steps by default, which is what makes
the larger lr safe early on).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from cnnpar.config import Config, batch_lr_factor, lr_rule
from cnnpar.console import rate_text
from cnnpar.dist import DistInfo, all_reduce_max
from cnnpar.engine.memory_full import out_of_memory
from cnnpar.engine.train_step import TrainStep, build_standalone_step
from cnnpar.parallel.apply import apply_channels_last
from cnnpar.report.meters import free_device_memory

START = 64  # the CPU's fixed default, and the search's first size
# A doubling must be 10 % faster per image to be kept. It halves the optimizer steps of an epoch, and
# a small speed gain does not pay for them: ResNet-18 on CIFAR-10 on an H200 (benchmarks/results/
# 2026-12-01-h200/batch_auto.csv), the search measured 1024 -> 2048 +5 %, and batch 2048 reached 80 %
# validation accuracy only in its 10th epoch (82.5 % at the end, batch 64: 87.6 %).
MIN_GAIN = 1.10
MEMORY_SHARE = 0.5  # a probe step may use half the memory free at the search: room for resident data, compile's
# different buffers and the allocator's fragmentation later in the run
# Photos decoded on the GPU (a decoder in the training process) start the search at 256. Such a pipeline
# pays fixed costs per batch that the probe's step on device data does not see: the decode and resize
# calls, the feeder's hand-over and the step's kernel launches, all competing for one process's GIL
# (docs/decoding.md). ResNet-50 from 24,000 photos on an H200 with the JPEG engines: batch 128, which
# the search chose (256 measured +8.3 % on device data), trained at 3,304-3,381 img/s end to end; batch
# 256 ran at 5,177 (benchmarks/results/2026-12-01-h200/call-x).
#
# Photo-sized inputs (PHOTO_SIDE px or more) start there too, wherever they come from. ResNet-50 at 224 px from
# a prepared store on an H200 (call ZZC): the search from 64 measured 64 -> 128 at +9.4 %, just under the
# rule's 10 %, and kept 64; the compiled run then trained at 5,614 img/s with 4 % data wait. Started at 256,
# the same command trained at 7,092-7,122 img/s (call ZZE; the step alone 7,337 there): 64 had cost 21 %. One probe
# this close to the rule's edge decided that; 256 is what ImageNet-sized training runs per GPU anyway, and
# smaller images only need a larger batch. The cost is the one MIN_GAIN's comment names: a quarter of the
# optimizer steps per epoch (ZZE's first epoch reached 12.9 % validation accuracy against 79.5 % at 64 in
# ZZC; both 100 % at the third, on 300 photos repeated 80 times).
PHOTO_START = 256
PHOTO_SIDE = 128
MIN_STEPS_PER_EPOCH = 16  # never so large a batch that an epoch has fewer optimizer steps than this
WARMUP_STEPS = 3  # cuDNN autotuning and the CUDA graph's capture happen here, untimed
TIMED_STEPS = 6


@dataclass
class Probe:
    """One size tried: throughput and peak memory of a few timed steps, or why it failed."""

    batch: int
    images_per_s: float = 0.0
    peak_bytes: int = 0
    failed: str = ""


@dataclass
class BatchChoice:
    batch: int
    stopped: str  # why the search ended where it did
    probes: list[Probe] = field(default_factory=list)
    started: str = ""  # why the search did not start at START, if it did not

    def line(self) -> str:
        tried = ", ".join(f"{p.batch}: {p.failed or f'{rate_text(p.images_per_s)} img/s'}" for p in self.probes)
        started = f"; started at {self.started}" if self.started else ""
        measured = f"measured {tried}" if tried else "none measured"  # a split too small for any trial
        return f"batch size auto: {self.batch} ({measured}{started}; stopped: {self.stopped})"


def batch_cap(train_samples: int, world_size: int) -> int:
    """The largest batch that still gives every process MIN_STEPS_PER_EPOCH steps an epoch."""
    return max(1, train_samples // (world_size * MIN_STEPS_PER_EPOCH))


def search_start(gpu_decoder: bool, cap: int, image_side: int) -> tuple[int, str]:
    """The search's first size, and why where it is not START: PHOTO_START for photos decoded on the
    GPU or for photo-sized inputs (`image_side`, the smaller side of the model's input), where the data
    set allows that many (`cap`)."""
    if cap < PHOTO_START:
        return START, ""
    if gpu_decoder:
        return PHOTO_START, f"{PHOTO_START}: the photos are decoded on the GPU, at a fixed cost per batch"
    if image_side >= PHOTO_SIDE:
        return PHOTO_START, (
            f"{PHOTO_START}: the images are photo-sized ({image_side} px); from 64 a store of 224-px photos on an "
            "H200 measured 64 -> 128 at +9.4 %, kept 64 and trained 21 % slower"
        )
    return START, ""


def choose_batch_size(
    measure: Callable[[int], Probe], memory_budget: int, cap: int, start: int = START, min_gain: float = MIN_GAIN
) -> BatchChoice:
    """Double from `start` while a size fits `memory_budget` bytes, stays within `cap` and gains `min_gain`.

    A failure at the first size (out of memory) halves instead, down to 1, so a model too large for
    64 still trains; a failure anywhere later ends the search at the last size that worked.
    """
    too_few = f"the data set allows no larger batch ({MIN_STEPS_PER_EPOCH} steps per epoch)"
    if cap <= start == START:  # the fixed default: nothing to measure (a larger start is still checked for memory)
        return BatchChoice(start, too_few)
    probes: list[Probe] = []
    batch = start
    while True:  # the first size that fits: halve on failure
        p = measure(batch)
        probes.append(p)
        if not p.failed and p.peak_bytes <= memory_budget:
            break
        if batch == 1:
            why = p.failed or f"needs {gib(p.peak_bytes)} of the {gib(memory_budget)} allowed"
            return BatchChoice(1, f"batch 1 {why}: expect the run to run out of memory", probes)
        batch //= 2
    best = p
    if batch < start:
        return BatchChoice(best.batch, f"batch {2 * batch} did not fit", probes)
    if cap <= start:
        return BatchChoice(best.batch, too_few, probes)
    while True:
        batch *= 2
        if batch > cap:
            stopped = f"batch {batch} would leave fewer than {MIN_STEPS_PER_EPOCH} steps per epoch"
            break
        p = measure(batch)
        probes.append(p)
        if p.failed:
            stopped = f"batch {batch} failed ({p.failed})"
            break
        if p.peak_bytes > memory_budget:
            stopped = f"batch {batch} needs {gib(p.peak_bytes)}, over the margin of {gib(memory_budget)}"
            break
        if p.images_per_s < min_gain * best.images_per_s:
            stopped = (
                f"batch {batch} is less than {round(100 * (min_gain - 1))} % faster than {best.batch} "
                "(the device is saturated)"
            )
            break
        best = p
    return BatchChoice(best.batch, stopped, probes)


def lr_line(optimizer: str, lr: float, reference: int, batch: int) -> str:
    """`lr 0.2 at batch 512 x linear (SGD) of 64/512 = 0.025`: the lr asked for, the batch it is for, the rule
    and the lr the chosen `batch` trains at."""
    scaled = lr * batch_lr_factor(optimizer, batch, reference)
    return f"lr {lr:g} at batch {reference} x {lr_rule(optimizer)} of {batch}/{reference} = {scaled:.3g}"


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def probe_step(raw_model: nn.Module, cfg: Config, device: torch.device, cuda_graphs: bool) -> TrainStep:
    """The run's own step (`build_train_step`: precision, optimizer, clipping, label smoothing, the lr schedule,
    the weight average, CUDA graphs where the run will use them) on a copy of `raw_model`, which the Trainer
    has rewritten as it trains it (the stem). Its schedule is as long as the untimed warm-up: the weight
    average, which starts at a share of the run's steps, then updates in the timed steps as it does for most
    of a run (the lr it ends at changes nothing in the kernels timed)."""
    model = apply_channels_last(copy.deepcopy(raw_model), cfg.speed.channels_last == "on").to(device)
    return build_standalone_step(model, cfg, device, total_steps=WARMUP_STEPS, cuda_graphs=cuda_graphs)


def device_probe(
    raw_model: nn.Module, cfg: Config, info: DistInfo, shape: tuple[int, int, int], num_classes: int, cuda_graphs: bool
) -> Callable[[int], Probe]:
    """Time the run's own step (`probe_step`) at a batch size, on random inputs of its shape. Compile is left
    out: a compile per candidate size would take minutes, and compiled steps scale with the batch the same
    way."""
    device = info.device
    fmt = torch.channels_last if cfg.speed.channels_last == "on" else torch.contiguous_format

    def measure(batch: int) -> Probe:
        free_device_memory(device)
        base = torch.cuda.memory_allocated(device)
        step = probe_step(raw_model, cfg, device, cuda_graphs)
        try:
            x = torch.randn(batch, *shape, device=device).contiguous(memory_format=fmt)
            y = torch.randint(0, num_classes, (batch,), device=device)
            for _ in range(WARMUP_STEPS):
                step([(x, y)])
            torch.cuda.synchronize(device)  # note: a CPU-GPU sync point, before the clock starts
            t0 = time.perf_counter()
            for _ in range(TIMED_STEPS):
                step([(x, y)])
            torch.cuda.synchronize(device)  # note: a CPU-GPU sync point, so the time covers the device's work
            seconds = time.perf_counter() - t0
            return Probe(batch, batch * TIMED_STEPS / seconds, torch.cuda.max_memory_allocated(device) - base)
        except Exception as e:
            # memory_full's test, as the run's own line uses: cuBLAS's or cuDNN's allocation that fails outside the
            # caching allocator (a plain RuntimeError) is out of memory too, a size that does not fit, where it
            # ended the run's start in a traceback
            if out_of_memory(e) is None:
                raise
            return Probe(batch, failed="out of memory")
        finally:
            del step  # with its model, optimizer and weight average
            free_device_memory(device)

    return measure


def memory_budget(device: torch.device) -> int:
    return int(MEMORY_SHARE * torch.cuda.mem_get_info(device)[0])


def search_on_device(
    raw_model: nn.Module,
    cfg: Config,
    info: DistInfo,
    shape: tuple[int, int, int],
    num_classes: int,
    train_samples: int,
    cuda_graphs: bool,
    gpu_decoder: bool = False,
) -> BatchChoice:
    """`choose_batch_size` with `device_probe`, from `search_start`. Under DDP each rank searches its
    own GPU and all take the smallest answer."""
    measure = device_probe(raw_model, cfg, info, shape, num_classes, cuda_graphs)
    cap = batch_cap(train_samples, info.world_size * cfg.optim.grad_accum)
    start, why = search_start(gpu_decoder, cap, min(shape[1:]))
    choice = choose_batch_size(measure, memory_budget(info.device), cap, start=start)
    choice.started = why
    if info.distributed:  # the smallest rank's answer, so every rank trains the same batch
        agreed = -int(all_reduce_max(torch.tensor([-choice.batch], device=info.device), info).item())
        if agreed != choice.batch:
            choice = BatchChoice(agreed, f"{choice.stopped}; another rank's search ended at {agreed}", choice.probes)
    return choice
