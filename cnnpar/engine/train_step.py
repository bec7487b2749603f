"""One optimizer step, owned by one object: what `cnnpar train` runs and what every tool times.

`TrainStep` holds the model (and its DDP wrapper), the precision, the optimizer, the learning-rate
schedule, the weight average and the CUDA graphs. One call takes one accumulation group (the
micro-batches of one optimizer step) and runs it as a loop over micro-steps:

    for micro in range(len(group)):
        with no_sync unless micro is the last:          # DDP all-reduces once, after the last backward
            backward(mean loss of micro-batch * its samples / the group's samples)
    clip, optimizer step, schedule step, weight average

Weighting each micro-loss by its share of the group's samples makes the accumulated gradient the
mean over the group's samples, whatever the group holds: a short last group of an epoch (2 of 4
micro-batches) or micro-batches of unequal size give the gradient one big batch of the same
samples gives, instead of being scaled by a fixed 1/accum.

`build_train_step` makes one from the config. The Trainer builds one and its epoch loop groups the
loader's batches; the doctor, the profiler, the bench and the tuner drive the Trainer's object
(engine/harness.py), and the batch-size search and bench's probes, which time a step outside a
Trainer, build theirs with the same function: what they time is what training runs, CUDA graphs
included. Nothing here reads a device value on the host: a call returns
the group's summed loss and correct count as device tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn

from cnnpar.config import Config, asked_lr
from cnnpar.dist import DEVICE_QUEUES, DEVICE_QUEUES_ENV, device_queues
from cnnpar.engine.averaging import WeightAverage, build_weight_average
from cnnpar.engine.optim import build_optimizer, build_scheduler
from cnnpar.engine.step import forward_backward, optimizer_step, sync_context
from cnnpar.parallel.apply import unwrap
from cnnpar.parallel.graphs import GraphedForwardBackward
from cnnpar.parallel.precision import Precision

# Batch shapes captured as CUDA graphs per set of trainable parameters. Training needs one (train
# loaders drop the last partial batch); the doctor's fixed-cost probe times a half batch beside the
# full one, and both must run the way training would. Any further shape runs eagerly rather than
# holding a third memory pool. A run whose whitened stem's bias stops training (whiten_bias_epochs)
# changes which parameters train once, and gets a second graph for that: its backward no longer
# computes the gradient into the stem (engine/optim.py, `bias_to_freeze`).
MAX_GRAPHS = 2

Batch = tuple[torch.Tensor, torch.Tensor]


def compile_captures_graphs(compile_mode: str) -> bool:
    """torch.compile modes that record CUDA graphs of their own (cudagraph trees)."""
    return "reduce-overhead" in compile_mode or compile_mode == "max-autotune"


def graphs_blocked_by(cfg: Config, distributed: bool, gpu_decoder_auto: bool = False) -> str:
    """Why cnnpar's CUDA graphs cannot replay this run's step ("" when they can).

    `gpu_decoder_auto`: the photos are decoded on the GPU and the switch was left on auto. Graphs stay on
    beside such a decoder only where CUDA has its most hardware queues (dist.DEVICE_QUEUES, which the cnnpar
    command sets); with fewer, the decoder's work queues behind whole graph replays.
    """
    if distributed:
        return "several processes (DDP hooks are not captured)"
    if cfg.optim.grad_accum > 1:
        return "gradient accumulation (replays overwrite gradients)"
    if compile_captures_graphs(cfg.speed.compile):
        return f"compile mode {cfg.speed.compile} already captures graphs"
    queues = device_queues() if gpu_decoder_auto else 0
    if gpu_decoder_auto and queues < int(DEVICE_QUEUES):
        return (
            f"the photos are decoded on the GPU and CUDA has {queues} hardware queues "
            f"({DEVICE_QUEUES_ENV}), so the decoder's work waits behind whole graph replays (ResNet-50 from "
            "24,000 photos on an H200, the JPEG engines: 4,932 img/s with graphs against 6,063 without; with "
            f"{DEVICE_QUEUES} queues 6,604-6,733 with graphs against 6,357-6,524 without): set "
            f"{DEVICE_QUEUES_ENV}={DEVICE_QUEUES} before CUDA starts, as the cnnpar command does, or --cuda-graphs "
            "on to keep them"
        )
    return ""


class TrainStep:
    def __init__(
        self,
        model: nn.Module,
        precision: Precision,
        optimizer: torch.optim.Optimizer,
        *,
        ddp: nn.Module | None = None,
        scheduler=None,
        average=None,
        label_smoothing: float = 0.0,
        grad_clip: float = 0.0,
        cuda_graphs: bool = False,
        compile_mode: str = "off",
    ) -> None:
        """`model` is what the step calls (compiled and/or DDP-wrapped); `ddp` the DDP module inside
        it, whose no_sync skips the all-reduce; `cuda_graphs`: replay forward+backward from a CUDA
        graph (one process, one micro-batch per step: the caller decides that it applies)."""
        self.model, self.precision, self.optimizer = model, precision, optimizer
        self.raw_model = unwrap(model)
        self.ddp, self.scheduler, self.average = ddp, scheduler, average
        self.label_smoothing, self.grad_clip = label_smoothing, grad_clip
        self.cuda_graphs = cuda_graphs
        self.mark_steps = compile_captures_graphs(compile_mode)
        self.graphs: dict[tuple, GraphedForwardBackward] = {}  # by (batch shape, which parameters train)
        self._params = list(self.raw_model.parameters())
        self._bound: GraphedForwardBackward | None = None  # the graph whose gradients .grad holds
        self.steps = 0  # optimizer steps taken: the weight average's clock where there is no schedule

    @property
    def graphed(self) -> bool:
        """Whether a step has been replayed from a CUDA graph (what a benchmark row should report)."""
        return bool(self.graphs)

    def __call__(self, group: Sequence[Batch]) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step over `group`; returns (summed loss, correct count) on the device."""
        if not group:
            raise ValueError("TrainStep: an accumulation group needs at least one micro-batch")
        graph = self._graph_for(*group[0]) if len(group) == 1 else None
        if graph is not None:
            loss_sum, correct = graph(*group[0])
        else:
            loss_sum, correct = self._accumulate(group)
        self._update()
        return loss_sum, correct

    def _accumulate(self, group: Sequence[Batch]) -> tuple[torch.Tensor, torch.Tensor]:
        samples = sum(y.shape[0] for _, y in group)  # shapes are host ints: no device sync
        if self.graphs:  # .grad holds a graph's last replay, and backward would add to it
            self.optimizer.zero_grad(set_to_none=False)
        loss_sum = correct = None
        for micro in range(len(group)):
            x, y = group[micro]
            if self.mark_steps:  # a new iteration for compile's own graphs; its outputs are consumed below
                torch.compiler.cudagraph_mark_step_begin()
            with sync_context(self.ddp, last_micro_step=micro == len(group) - 1):
                loss, right = forward_backward(
                    self.model, x, y, self.precision, self.label_smoothing, y.shape[0] / samples
                )
            loss_sum = loss if loss_sum is None else loss_sum + loss
            correct = right if correct is None else correct + right
        return loss_sum, correct

    def _update(self) -> None:
        # Graphed backwards overwrite their gradient tensors in place: those must stay allocated.
        optimizer_step(self._params, self.optimizer, self.precision, self.grad_clip, zero_grad=not self.graphs)
        self.steps += 1
        if self.scheduler is not None:
            self.scheduler.step()
        if self.average is not None:  # eager, after the step: never inside a captured graph
            self.average.after_step(self.scheduler.last_epoch if self.scheduler is not None else self.steps)

    def _graph_for(self, x: torch.Tensor, y: torch.Tensor) -> GraphedForwardBackward | None:
        """The graph for this batch shape, captured on first sight (from this very batch: the
        capture's warm-up puts weights and buffers back, so the replay that follows trains on it once)."""
        if not self.cuda_graphs:
            return None
        # a graph replays the backward it captured, gradients of frozen parameters included
        trains = tuple(p.requires_grad for p in self._params)
        key = (tuple(x.shape), trains)
        graph = self.graphs.get(key)
        if graph is None:
            if sum(k[1] == trains for k in self.graphs) >= MAX_GRAPHS:
                return None
            graph = GraphedForwardBackward(self.model, self.precision, self.label_smoothing, x, y, forward_backward)
            self.graphs[key] = self._bound = graph  # the capture left .grad pointing at its gradients
        elif graph is not self._bound:
            graph.bind_grads()
            self._bound = graph
        return graph

    def capture(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Capture this batch shape's CUDA graph now (outside a timed region) instead of at its first
        step; trains nothing (the capture's warm-up puts weights and buffers back). No-op without graphs."""
        self._graph_for(x, y)

    def rehearse(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """One forward and backward that trains nothing: weights and BatchNorm buffers are put back and
        the gradients dropped. Compiles (torch.compile) outside the timed epochs."""
        saved = {k: v.clone() for k, v in self.raw_model.state_dict().items()}
        self.model.train()
        with sync_context(self.ddp, last_micro_step=True):
            forward_backward(self.model, x, y, self.precision, self.label_smoothing, 1.0)
        self.optimizer.zero_grad(set_to_none=not self.graphs)
        self.raw_model.load_state_dict(saved)


@dataclass
class StepParts:
    """What a step holds beside its model and optimizer, built from the config."""

    precision: Precision
    scheduler: torch.optim.lr_scheduler.LambdaLR
    average: WeightAverage | None  # --ema (and --lookahead): None without


def build_step_parts(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    cfg: Config,
    device: torch.device,
    total_steps: int,
    steps_per_epoch: int = 0,
) -> StepParts:
    """The precision, the lr schedule over `total_steps` and the weight average, as `cnnpar train` builds them."""
    return StepParts(
        Precision(cfg.speed.precision, device),
        build_scheduler(optimizer, cfg.optim, total_steps, steps_per_epoch),
        build_weight_average(unwrap(model), cfg.optim, total_steps),
    )


def build_train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    parts: StepParts,
    cfg: Config,
    *,
    ddp: nn.Module | None = None,
    cuda_graphs: bool = False,
) -> TrainStep:
    """The step `cnnpar train` runs, with the config's clipping, label smoothing and compile mode: the one
    constructor the Trainer, the batch-size search and bench's probes share. A step built by hand without the
    clip or the weight average is a cheaper step than the one that trains, and a search timing it picks
    another batch."""
    return TrainStep(
        model,
        parts.precision,
        optimizer,
        ddp=ddp,
        scheduler=parts.scheduler,
        average=parts.average,
        label_smoothing=cfg.optim.label_smoothing,
        grad_clip=cfg.optim.grad_clip,
        cuda_graphs=cuda_graphs,
        compile_mode=cfg.speed.compile,
    )


def build_standalone_step(
    model: nn.Module, cfg: Config, device: torch.device, total_steps: int, cuda_graphs: bool = False
) -> TrainStep:
    """`build_train_step` for a tool that times a step outside a Trainer, on `model` as the run would train it
    (on `device`, its stem rewritten where the run's is): its own optimizer at --lr (no --lr-scaling: one
    process; the optimizer's own for --lr auto, where `cfg` is not resolved yet: a claim's probe) and a schedule and
    weight average over `total_steps`."""
    optimizer = build_optimizer(unwrap(model), cfg.optim, asked_lr(cfg.optim), device)
    parts = build_step_parts(model, optimizer, cfg, device, total_steps)
    return build_train_step(model, optimizer, parts, cfg, cuda_graphs=cuda_graphs)
