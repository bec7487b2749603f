"""The pieces of the training loop that the doctor, the profiler and the bench drive outside `Trainer.fit`.

A `Trainer` builds everything (data, model, wrappers, optimizer, loaders) and creates no folder
until `fit()`; these helpers drive its parts step by step. The step below is the trainer's own
micro-step (the same `forward_backward` and `optimizer_step`, the same accumulation rule); the
learning-rate schedule is left alone because timing runs may take more steps than it was built for.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from dataclasses import replace

import torch

from cnnpar.config import Config
from cnnpar.data import DataBundle
from cnnpar.dist import DistInfo
from cnnpar.engine.step import forward_backward, optimizer_step, sync_context
from cnnpar.engine.trainer import Trainer
from cnnpar.errors import DataError


def build_trainer(cfg: Config, info: DistInfo, bundle: DataBundle | None = None) -> Trainer:
    """A Trainer for measuring: no progress bar, no resume, a fresh run name (no folder is made)."""
    cfg = replace(cfg, run=replace(cfg.run, progress=False, resume="", name=""))
    return Trainer(cfg, info, bundle=bundle, log=lambda *a, **k: None)


def cycle_batches(loader, first_epoch: int = 1) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Device-ready batches without end: a new permutation every pass, like successive epochs."""
    epoch = first_epoch
    while True:
        loader.set_epoch(epoch)
        n = 0
        for batch in loader:
            n += 1
            yield batch
        if n == 0:
            raise DataError("the training split holds no batch: expected at least one sample per process")
        epoch += 1


def train_step(trainer: Trainer, x: torch.Tensor, y: torch.Tensor, micro_step: int) -> torch.Tensor:
    """One micro-step as `Trainer.train_epoch` takes it; returns the detached loss (no host sync)."""
    cfg = trainer.cfg
    accum = cfg.optim.grad_accum
    last = (micro_step + 1) % accum == 0
    with sync_context(trainer.ddp, last):
        loss, _ = forward_backward(trainer.model, x, y, trainer.precision, cfg.optim.label_smoothing, 1.0 / accum)
    if last:
        optimizer_step(trainer.model, trainer.optimizer, trainer.precision, cfg.optim.grad_clip)
    return loss


def free_device_memory(device: torch.device) -> None:
    """Drop what a finished (or failed, e.g. out of memory) measurement left behind before the next one."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def reset_compiler() -> None:
    # Each rung compiles its own model; without a reset, Dynamo's cache (and its recompile limit)
    # would carry guards from earlier rungs into later ones. Nothing to reset (and a slow import
    # to skip) when nothing has been compiled yet.
    if "torch._dynamo" in sys.modules:
        torch._dynamo.reset()
