"""The pieces of the training loop that the doctor, the profiler and the bench drive outside `Trainer.fit`.

A `Trainer` builds everything (data, model, wrappers, optimizer, loaders, its `TrainStep`) and
creates no folder until `fit()`; these helpers drive its parts step by step. A step here is the
Trainer's own `TrainStep` call on one accumulation group: the same forward and backward (CUDA-graphed
where training would be), clip, optimizer, schedule and weight average. Past the end of the schedule
(a timing run may take more steps than it was built for) the lr stays at the schedule's last value.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import fields, replace

import torch

from cnnpar.config import Config
from cnnpar.data import DataBundle
from cnnpar.data.loader import build_loader, decodes_on_gpu
from cnnpar.dist import DistInfo
from cnnpar.engine.resolved import as_measured
from cnnpar.engine.train_step import Batch
from cnnpar.engine.trainer import Trainer
from cnnpar.errors import DataError, raise_pending_stop
from cnnpar.parallel import resolve_for
from cnnpar.parallel.streams import TrainingStream

# Switches a built Trainer can take on in place: neither touches the model, its compile or the
# optimizer. CUDA graphs are captured at the next step (from the compiled module, as `cnnpar train`
# captures them after its compile); a resident data set only needs new loaders.
IN_PLACE = frozenset({("speed", "cuda_graphs"), ("data", "resident")})


def build_trainer(cfg: Config, info: DistInfo, bundle: DataBundle | None = None, whole_run: bool = False) -> Trainer:
    """A Trainer for measuring: no progress bar, no resume, a fresh run name (no folder is made), and the long
    compiles' "auto" off (`as_measured`) unless it trains the `whole_run` its config names (time to accuracy), where
    they resolve as `cnnpar train` resolves them: its figures are that run's."""
    cfg = replace(cfg, run=replace(cfg.run, progress=False, resume="", name=""))
    return Trainer(cfg if whole_run else as_measured(cfg), info, bundle=bundle, log=lambda *a, **k: None)


def changed_switches(a: Config, b: Config) -> set[tuple[str, str]]:
    """(section, field) of every setting that differs between two configs."""
    out = set()
    for section in fields(a):
        sa, sb = getattr(a, section.name), getattr(b, section.name)
        out |= {(section.name, f.name) for f in fields(sa) if getattr(sa, f.name) != getattr(sb, f.name)}
    return out


def continue_as(trainer: Trainer, cfg: Config) -> None:
    """Turn a built (warmed, maybe compiled) Trainer into the one `cfg` would build, where `cfg`
    differs from its config only in IN_PLACE switches; the next step then runs what a new Trainer's
    step would, without a second compile. Raises ValueError for any other difference.

    CUDA graphs go only from off to on (graphs once captured stay), and only where a new Trainer
    would use them (`Trainer._graphs_allowed`, which says why not)."""
    new = resolve_for(as_measured(cfg), trainer.info.device)  # as build_trainer built it
    if new.run.batch_size == 0:  # --batch-size auto: the batch (and lr) the trainer measured for itself
        new = replace(new, run=replace(new.run, batch_size=trainer.cfg.run.batch_size), optim=trainer.cfg.optim)
    run = trainer.cfg.run  # what build_trainer set for measuring (no progress bar, resume or run name)
    new = replace(new, run=replace(new.run, progress=run.progress, resume=run.resume, name=run.name))
    changed = changed_switches(trainer.cfg, new)
    if changed - IN_PLACE:
        names = ", ".join(f"{s}.{f}" for s, f in sorted(changed - IN_PLACE))
        raise ValueError(f"continue_as: {names} changed; only {sorted(IN_PLACE)} can change in place")
    if ("speed", "cuda_graphs") in changed and new.speed.cuda_graphs != "on":
        raise ValueError("continue_as: CUDA graphs can be turned on in place, not off")
    trainer.requested_cfg, trainer.cfg = cfg, new
    if any(section == "data" for section, _ in changed):
        trainer.close_loaders()  # the old loaders' workers and decoders go now, not at the interpreter's exit
        trainer.train_loader = build_loader(trainer.bundle, new, trainer.info, train=True)
        val = trainer.bundle.val
        trainer.val_loader = build_loader(trainer.bundle, new, trainer.info, train=False) if val else None
        # the training stream as a new Trainer would choose it for the new decoder (parallel/streams.py)
        trainer.stream.exit()
        trainer.stream = TrainingStream(trainer.info.device, decodes_on_gpu(new, trainer.bundle))
        trainer.stream.enter()
    if ("speed", "cuda_graphs") in changed:
        trainer.graphs_requested = cfg.speed.cuda_graphs
        trainer.use_graphs = trainer._graphs_allowed()
        trainer.train_step.cuda_graphs = trainer.use_graphs


def cycle_batches(loader, first_epoch: int = 1, begin_epoch=None) -> Iterator[Batch]:
    """Device-ready batches without end: a new permutation every pass, like successive epochs.
    `begin_epoch(epoch)` starts each pass (default: the loader's `set_epoch`)."""
    epoch = first_epoch
    while True:
        (begin_epoch or loader.set_epoch)(epoch)
        n = 0
        for batch in loader:
            raise_pending_stop()  # a stop whose raise was dropped (errors.pending_stop): each pass starts a loader
            n += 1
            yield batch
        if n == 0:
            raise DataError("the training split holds no batch: expected at least one sample per process")
        epoch += 1


def training_batches(trainer: Trainer, first_epoch: int = 1) -> Iterator[Batch]:
    """The batches `Trainer.train_epoch` would see, epoch after epoch, seeded as it seeds them."""
    return cycle_batches(trainer.train_loader, first_epoch, trainer.begin_epoch)


def next_group(trainer: Trainer, batches: Iterator[Batch]) -> list[Batch]:
    """The micro-batches of one optimizer step (`grad_accum` of them), as `Trainer.train_epoch` groups them."""
    return [next(batches) for _ in range(trainer.cfg.optim.grad_accum)]


def group_images(group: list[Batch]) -> int:
    return sum(y.shape[0] for _, y in group)


def run_step(trainer: Trainer, group: list[Batch]) -> int:
    """One optimizer step on `group` through the Trainer's `TrainStep`; returns the images it
    trained on. Reads nothing back from the device."""
    trainer.train_step(group)
    return group_images(group)


def reset_compiler() -> None:
    # Each rung compiles its own model; without a reset, Dynamo's cache (and its recompile limit)
    # would carry guards from earlier rungs into later ones. Nothing to reset (and a slow import
    # to skip) when nothing has been compiled yet.
    if "torch._dynamo" in sys.modules:
        torch._dynamo.reset()
