"""Horovod as a strategy for cnnpar's engine, run as
`.venv-horovod/bin/horovodrun -np N -H localhost:N .venv-horovod/bin/python -m cnnpar train --strategy horovod`
(scripts/install_horovod.sh builds that venv).

What Horovod replaces, and where:
- process set-up: `init_horovod` (hvd.init) instead of torchrun's process group; the DistInfo it
  returns carries `HorovodCollectives`, so cnnpar.dist's reductions (epoch metrics, evaluation
  sums, the run-folder name) go through hvd.allreduce / hvd.broadcast_object;
- gradient averaging: `apply_horovod` wraps the optimizer in hvd.DistributedOptimizer (instead of
  wrapping the model in DDP) and broadcasts rank 0's parameters and buffers;
- sharding: unchanged, the loader's DistributedSampler already takes rank and size from DistInfo.

Horovod 0.28.1 does not build against current PyTorch as released: scripts/install_horovod.sh
builds it, patched, into its own virtualenv. Nothing here imports horovod until it is asked for.
"""

from __future__ import annotations

import itertools
import os
import sys

import torch

from cnnpar.config import setting_name
from cnnpar.dist import DistInfo, pick_device, start_cuda
from cnnpar.errors import ConfigError


def _hvd():
    try:
        import horovod.torch as hvd
    except ImportError as e:
        raise ConfigError(
            f"{setting_name('dist', 'strategy')} = 'horovod' but horovod.torch cannot be imported ({e}); build it with "
            "scripts/install_horovod.sh (in a cnnpar source checkout: an installed cnnpar has no scripts/) and run "
            "that virtualenv's python under horovodrun"
        ) from None
    return hvd


class ContiguousGradients:
    """A Horovod `Compression` that hands its collectives contiguous gradients.

    Horovod's ops refuse any tensor that is not contiguous in the default (NCHW) layout, and
    under channels_last (cnnpar's default) every conv weight and its gradient are NHWC. A
    non-contiguous gradient is all-reduced as an NCHW copy and copied back into the gradient, so
    the optimizer keeps seeing the parameter's layout. DistributedOptimizer calls these two as
    `compression.compress(grad)` and `compression.decompress(output, ctx)`, then `grad.set_(...)`.
    """

    @staticmethod
    def compress(tensor: torch.Tensor):
        if tensor.is_contiguous():
            return tensor, None
        return tensor.contiguous(), tensor

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx):
        if ctx is None:
            return tensor
        return ctx.copy_(tensor)


def broadcast_tensors(hvd, tensors: dict[str, torch.Tensor], prefix: str, root_rank: int = 0) -> None:
    """hvd.broadcast_parameters for tensors of any layout: rank 0's values into every rank's
    tensors, in place; a channels_last tensor goes through a contiguous copy (see above)."""
    pending = []
    for name, t in tensors.items():
        buf = t if t.is_contiguous() else t.contiguous()
        pending.append((t, buf, hvd.broadcast_async_(buf, root_rank, name=f"{prefix}.{name}")))
    for t, buf, handle in pending:
        hvd.synchronize(handle)
        if buf is not t:
            t.copy_(buf)


class HorovodCollectives:
    """The collectives cnnpar.dist needs, on Horovod (in place where dist's are in place).

    Horovod pairs the ranks' collectives by name, and its defaults do not suit: an unnamed
    broadcast_object is named after the object's type, so rank 0 sending a tuple and rank 1 a
    placeholder str wait for each other forever. Every call here gets a name from a counter that
    all ranks advance in step, as they make the same calls in the same order (what torch.distributed
    requires too).
    """

    def __init__(self, hvd) -> None:
        self.hvd = hvd
        self._calls = itertools.count()

    def _name(self, kind: str) -> str:
        return f"cnnpar.{kind}.{next(self._calls)}"

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        t.copy_(self.hvd.allreduce(t.contiguous(), op=self.hvd.Sum, name=self._name("sum")))
        return t

    def all_reduce_max(self, t: torch.Tensor) -> torch.Tensor:
        t.copy_(self.hvd.allreduce(t.contiguous(), op=self.hvd.Max, name=self._name("max")))
        return t

    def broadcast_object(self, obj, src: int = 0):
        return self.hvd.broadcast_object(obj, root_rank=src, name=self._name("object"))

    def barrier(self) -> None:
        self.hvd.barrier()

    def broadcast_buffers(self, model: torch.nn.Module) -> None:
        broadcast_tensors(self.hvd, dict(model.named_buffers()), self._name("buffers"))


def init_horovod(device_request: str = "auto") -> DistInfo:
    hvd = _hvd()
    hvd.init()
    if hvd.local_size() > 1 and "OMP_NUM_THREADS" not in os.environ:
        # torchrun's rule, which horovodrun lacks: N processes on a node each start one OpenMP thread
        # per core, oversubscribe the cores, and (on the CPU) sum in another order than the same
        # run under torchrun, so the two no longer agree to 1e-4.
        os.environ["OMP_NUM_THREADS"] = "1"  # DataLoader workers and other children too
        torch.set_num_threads(1)
        if hvd.local_rank() == 0:
            print(
                f"cnnpar: OMP_NUM_THREADS=1 for each of the {hvd.local_size()} processes on this node, as torchrun "
                "sets it; set OMP_NUM_THREADS to choose another count",
                file=sys.stderr,
                flush=True,
            )
    device = pick_device(device_request, hvd.local_rank(), hvd.local_size())
    if device.type == "cuda":
        start_cuda(device)
    return DistInfo(hvd.rank(), hvd.local_rank(), hvd.size(), device, collectives=HorovodCollectives(hvd))


def horovod_version() -> str:
    """The installed Horovod's version, for the run's record ("" where it cannot be imported)."""
    try:
        import horovod
    except ImportError:
        return ""
    return getattr(horovod, "__version__", "")


def strategy_record(strategy: str) -> dict[str, str]:
    """What a run's summary.json and config.toml header say of its strategy (a Horovod run's read as a DDP
    one's): the strategy, and Horovod's version under it."""
    record = {"strategy": strategy}
    if strategy == "horovod":
        record["horovod"] = horovod_version()
    return record


def shutdown_horovod() -> None:
    try:
        import horovod.torch as hvd
    except ImportError:
        return
    if hvd.is_initialized():
        hvd.shutdown()


def apply_horovod(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, info: DistInfo, grad_accum: int
) -> torch.optim.Optimizer:
    """hvd.DistributedOptimizer plus the start-of-training broadcasts; call before building the
    schedule (the wrapped optimizer is a new object) and before any checkpoint is restored.
    Gradient clipping is refused with the config (Config.__post_init__): it would clip unaveraged gradients."""
    if not info.distributed:
        return optimizer
    hvd = _hvd()
    wrapped = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        compression=ContiguousGradients,  # channels_last gradients
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
    broadcast_tensors(hvd, model.state_dict(), "state")  # parameters and BN buffers, any layout
    # The optimizer is fresh here (a resumed run restores its checkpoint afterwards, on every rank
    # from the same file), so it has no state to broadcast. hvd.broadcast_optimizer_state would
    # first create some by taking a step with zero gradients, which for Adam(W) advances the step
    # count (so every later bias correction is off by one) and applies one round of weight decay:
    # training would then differ from the same run under DDP.
    return wrapped
