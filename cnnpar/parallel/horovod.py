"""Horovod as a strategy for cnnpar's engine: `horovodrun -np N python -m cnnpar train --strategy horovod`.

What Horovod replaces, and where:
- process set-up: `init_horovod` (hvd.init) instead of torchrun's process group; the DistInfo it
  returns carries `HorovodCollectives`, so cnnpar.dist's reductions (epoch metrics, evaluation
  sums, the run-folder name) go through hvd.allreduce / hvd.broadcast_object;
- gradient averaging: `apply_horovod` wraps the optimizer in hvd.DistributedOptimizer (instead of
  wrapping the model in DDP) and broadcasts rank 0's parameters, buffers and optimizer state;
- sharding: unchanged, the loader's DistributedSampler already takes rank and size from DistInfo.

Horovod 0.28.1 does not build against current PyTorch as released: scripts/install_horovod.sh
builds it, patched, into its own virtualenv. Nothing here imports horovod until it is asked for.
"""

from __future__ import annotations

import torch

from cnnpar.dist import DistInfo, pick_device
from cnnpar.errors import ConfigError


def _hvd():
    try:
        import horovod.torch as hvd
    except ImportError as e:
        raise ConfigError(
            f"dist.strategy = 'horovod' but horovod.torch cannot be imported ({e}); build it with "
            "scripts/install_horovod.sh and run that virtualenv's python under horovodrun"
        ) from None
    return hvd


class HorovodCollectives:
    """The collectives cnnpar.dist needs, on Horovod (in place where dist's are in place)."""

    def __init__(self, hvd) -> None:
        self.hvd = hvd

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        t.copy_(self.hvd.allreduce(t, op=self.hvd.Sum))
        return t

    def all_reduce_max(self, t: torch.Tensor) -> torch.Tensor:
        t.copy_(self.hvd.allreduce(t, op=self.hvd.Max))
        return t

    def broadcast_object(self, obj, src: int = 0):
        return self.hvd.broadcast_object(obj, root_rank=src)

    def barrier(self) -> None:
        self.hvd.barrier()

    def broadcast_buffers(self, model: torch.nn.Module) -> None:
        for name, b in model.named_buffers():
            self.hvd.broadcast_(b, root_rank=0, name=f"buffer.{name}")


def init_horovod(device_request: str = "auto") -> DistInfo:
    hvd = _hvd()
    hvd.init()
    device = pick_device(device_request, hvd.local_rank(), hvd.local_size())
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return DistInfo(hvd.rank(), hvd.local_rank(), hvd.size(), device, collectives=HorovodCollectives(hvd))


def shutdown_horovod() -> None:
    try:
        import horovod.torch as hvd
    except ImportError:
        return
    if hvd.is_initialized():
        hvd.shutdown()


def apply_horovod(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, info: DistInfo, grad_accum: int, grad_clip: float
) -> torch.optim.Optimizer:
    """hvd.DistributedOptimizer plus the start-of-training broadcasts; call before building the
    schedule (the wrapped optimizer is a new object) and before any checkpoint is restored."""
    if not info.distributed:
        return optimizer
    if grad_clip > 0:
        # Clipping would have to sit between DistributedOptimizer.synchronize() and step(); the
        # engine's step does not make that split, so refuse rather than clip unaveraged gradients.
        raise ConfigError("optim.grad_clip > 0 is not supported with dist.strategy = 'horovod'; use ddp or set 0")
    hvd = _hvd()
    wrapped = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        backward_passes_per_step=grad_accum,  # the all-reduce waits for the last micro-step
        op=hvd.Average,
    )
    horovod_zero_grad = wrapped.zero_grad

    def zero_grad(set_to_none: bool = True) -> None:
        # Horovod 0.28's zero_grad() takes no arguments; torch >= 2.0 sets gradients to None by
        # default, which is what the engine asks for.
        if not set_to_none:
            raise ValueError("zero_grad(set_to_none=False) is not supported under Horovod 0.28")
        horovod_zero_grad()

    wrapped.zero_grad = zero_grad
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # parameters and BN buffers
    if any(wrapped.state.values()):
        hvd.broadcast_optimizer_state(wrapped, root_rank=0)
    # A fresh optimizer has no state to send. hvd.broadcast_optimizer_state would first create
    # some by taking a step with zero gradients, which for Adam(W) advances the step count (so
    # every later bias correction is off by one) and applies one round of weight decay: training
    # would then differ from the same run under DDP. Skipping it keeps the two identical.
    return wrapped
