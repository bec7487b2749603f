"""Time the train step of one Config: set-up and warm-up (compile) outside, medians over repeats.

The set-up is the Trainer's own (data -> resolved config -> model -> parallel wrappers ->
optimizer -> loaders), so a rung measures exactly what `cnnpar train` would run; the Trainer
creates its run folder only in `fit()`, which the bench never calls.
"""

from __future__ import annotations

import os
import statistics
import time

import psutil
import torch

from cnnpar.config import Config
from cnnpar.data import DataBundle
from cnnpar.dist import DistInfo
from cnnpar.engine.harness import build_trainer, next_group, reset_compiler, run_step, training_batches
from cnnpar.engine.trainer import Trainer
from cnnpar.errors import UserError
from cnnpar.report.meters import CPU_RSS, CUDA_PEAK, DataWait, sync

from .timing import Timing

ERROR_CHARS = 300


def error_text(e: BaseException) -> str:
    """A failed row's reason: the error's first line, cut to ERROR_CHARS (torch's own can run to pages), save
    cnnpar's own one line (a UserError), which ends in what to do (a worker crash's: the command that finds the
    file) and is kept whole."""
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    text = f"{type(e).__name__}: {first}"
    return text if isinstance(e, UserError) else text[:ERROR_CHARS]


def _cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def warm_up(step, timing: Timing, device: torch.device, clock=time.perf_counter) -> tuple[int, float, float]:
    """Run the warm-up steps, each timed alone (device synchronised after it, outside any timed
    region); returns (steps run, their wall time, the last step's time).

    The last warm-up step's time sizes the repeats (`Timing.plan`); with no warm-up steps (or no
    sizing) one more untimed step is run for it."""
    done, total, last = 0, 0.0, 0.0
    while done < timing.warmup:
        t0 = clock()
        step()
        sync(device)  # note: a CPU-GPU sync point, outside the measured region
        last = clock() - t0
        total += last
        done += 1
        if timing.warm(done, last):
            break
    if timing.seconds > 0 and done == 0:
        t0 = clock()
        step()
        sync(device)  # note: a CPU-GPU sync point, outside the measured region
        last = clock() - t0
    return done, total, last


def measure_steps(trainer: Trainer, timing: Timing) -> dict:
    """Warm-up steps, then repeats of timed steps with a device sync around each repeat only (steps
    per repeat and repeats sized by `timing` from the last warm-up step's time).

    A step is the Trainer's `TrainStep` on one accumulation group: with CUDA graphs where training
    would replay them, and with `grad_accum` micro-batches per step."""
    device = trainer.info.device
    proc = psutil.Process()
    # across epoch boundaries, calling set_epoch as training does, so the cost of starting an
    # epoch (worker start-up without persistent workers) is part of what is timed
    batches = training_batches(trainer, first_epoch=0)
    trainer.model.train()

    waited = DataWait(device)  # a new one for each repeat, below

    def step() -> int:
        with waited.waiting():
            group = next_group(trainer, batches)
        return run_step(trainer, group)

    try:
        warmup_steps, warmup_s, step_s = warm_up(step, timing, device)
        steps, repeats = timing.plan(step_s)
        rates, step_ms, waits, cpu_pct, rss = [], [], [], [], []
        for _ in range(repeats):
            sync(device)  # note: a CPU-GPU sync point, before the clock starts
            cpu0, start = _cpu_seconds(proc), time.perf_counter()
            waited = DataWait(device)
            images = 0
            for _ in range(steps):
                images += step()
            sync(device)  # note: a CPU-GPU sync point, so the time covers the device's work
            wall = time.perf_counter() - start
            rates.append(images / wall)
            step_ms.append(1000.0 * wall / steps)
            waits.append(waited.seconds() / wall)
            cpu_pct.append(100.0 * (_cpu_seconds(proc) - cpu0) / wall)
            rss.append(proc.memory_info().rss / 2**20)
    finally:
        batches.close()
    if device.type == "cuda":
        peak_mem, mem_kind = torch.cuda.max_memory_allocated(device) / 2**20, CUDA_PEAK
    else:
        peak_mem, mem_kind = max(rss), CPU_RSS
    return {
        "images_per_s": statistics.median(rates),
        "images_per_s_min": min(rates),
        "images_per_s_max": max(rates),
        "step_ms": statistics.median(step_ms),
        "data_wait_share": statistics.median(waits),
        "main_cpu_pct": statistics.median(cpu_pct),
        "main_cpu_pct_min": min(cpu_pct),
        "main_cpu_pct_max": max(cpu_pct),
        # Other processes on the host slow a CPU run down; the load says how busy it was.
        "host_load_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else "",
        "peak_mem_mb": peak_mem,
        "peak_mem_kind": mem_kind,
        "warmup_s": warmup_s,
        "warmup_steps_run": warmup_steps,
        "steps_per_repeat": steps,
        "repeats_run": repeats,
    }


def fresh_trainer(cfg: Config, bundle: DataBundle, info: DistInfo) -> Trainer:
    """A new Trainer for `cfg`, with Dynamo reset (no guards or recompile count carried over from an
    earlier measurement) and the device's peak-memory statistics reset."""
    reset_compiler()
    if info.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(info.device)
    return build_trainer(cfg, info, bundle)


def measure_config(cfg: Config, bundle: DataBundle, info: DistInfo, timing: Timing) -> dict:
    """Build, warm up and time one config.

    Exceptions propagate: the caller records them (the ladder as a failed row, a claim as
    unmeasurable), then calls `free_device_memory` once the traceback, which holds the failed
    step's tensors, is gone.
    """
    trainer = fresh_trainer(cfg, bundle, info)
    try:
        return measure_steps(trainer, timing)
    finally:
        trainer.close()
        del trainer
