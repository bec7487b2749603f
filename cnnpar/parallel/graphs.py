"""Forward and backward replayed as one CUDA graph.

For small inputs (ResNet-18 at 32x32) a GPU step is a few hundred short kernels and the host
cannot launch them as fast as the device runs them; a graph replays the whole sequence with one
launch. What is captured: forward, loss, backward, and the loss/accuracy sums. What stays eager:
the optimizer step (a few fused kernels; keeping it outside means the learning-rate schedule
keeps working with a plain float lr on every torch version) and gradient clipping.

Rules that make this safe:
- shapes are static: one graph per batch shape (train loaders drop the last partial batch, so
  training needs one; `engine/train_step.py` keeps a second for the doctor's half-batch probe and
  runs any other shape eagerly);
- gradients live in the graph's memory pool and are *overwritten* by each replay, so the
  optimizer must not set them to None (`optimizer_step(..., zero_grad=False)`) and gradient
  accumulation is not possible. Each graph keeps its own gradient tensors (`grads`); `bind_grads`
  points the parameters' `.grad` back at them when another graph ran in between;
- warm-up iterations (needed before capture: cuDNN autotuning, autocast caches, lazy
  allocations) run forward/backward only, and the module's parameters and BatchNorm buffers are
  put back afterwards in place, so capturing changes nothing about training;
- one process only: DDP's all-reduce hooks are not captured here.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from cnnpar.parallel.precision import Precision
from cnnpar.report.ranges import GRAPH_REPLAY, span

WARMUP_ITERS = 3


class GraphedForwardBackward:
    def __init__(
        self,
        model: nn.Module,
        precision: Precision,
        label_smoothing: float,
        x: torch.Tensor,
        y: torch.Tensor,
        forward_backward,
    ) -> None:
        self.static_x = x.clone()
        self.static_y = y.clone()
        saved = {k: v.detach().clone() for k, v in model.state_dict().items()}
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_ITERS):
                for p in model.parameters():
                    p.grad = None
                forward_backward(model, self.static_x, self.static_y, precision, label_smoothing, 1.0)
        torch.cuda.current_stream().wait_stream(side)
        for p in model.parameters():
            p.grad = None  # let backward allocate the gradients inside the graph's pool
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: the feeder's thread keeps decoding meanwhile (nvJPEG synchronises its own
        # stream, allocations happen); in the default "global" mode that would break the capture.
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
            self.loss, self.correct = forward_backward(
                model, self.static_x, self.static_y, precision, label_smoothing, 1.0
            )
        with torch.no_grad():
            for k, v in model.state_dict().items():
                v.copy_(saved[k])  # in place: the graph holds these very tensors
        self.shape = tuple(x.shape)
        # The tensors this graph's backward writes: held here so that another graph's capture
        # (which sets .grad to None first) cannot free them.
        self.grads = [(p, p.grad) for p in model.parameters() if p.grad is not None]
        # and those it computes none for (frozen since another graph's capture): the optimizer skips them
        self.no_grads = [p for p in model.parameters() if p.grad is None]

    def bind_grads(self) -> None:
        """Point every parameter's .grad at this graph's gradient tensors (what the optimizer reads),
        and to None where this graph computes none."""
        for p, g in self.grads:
            p.grad = g
        for p in self.no_grads:
            p.grad = None

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.static_x.copy_(x, non_blocking=True)
        self.static_y.copy_(y, non_blocking=True)
        with span(GRAPH_REPLAY):
            self.graph.replay()
        # The graph's own output tensors, overwritten by the next replay: callers must consume
        # them before that (the trainer adds them to its sums at once, on the same stream).
        return self.loss, self.correct
