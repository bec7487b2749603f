"""The train and eval steps: no .item(), no logging, no branches on tensor values.

They return device tensors; the trainer decides when to read them (a host sync).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn
import torch.nn.functional as F

from cnnpar.parallel.precision import Precision
from cnnpar.report.ranges import BACKWARD, FORWARD, OPTIMIZER_STEP, span


def forward_backward(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, precision: Precision, label_smoothing: float, loss_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """One micro-step: returns (summed loss, correct count), both detached, on the device."""
    with span(FORWARD), precision.autocast():
        logits = model(x)
        loss = F.cross_entropy(logits.float(), y, label_smoothing=label_smoothing)
    with span(BACKWARD):
        precision.backward(loss * loss_scale)
    correct = (logits.detach().argmax(dim=1) == y).sum()
    return loss.detach() * y.shape[0], correct


def optimizer_step(
    params: list[torch.Tensor],
    optimizer: torch.optim.Optimizer,
    precision: Precision,
    grad_clip: float,
    zero_grad: bool = True,
) -> torch.Tensor | None:
    """Clip `params`' gradients (after DDP's all-reduce, so the norm is global and equal on every rank) and step.
    `params`: the model's parameters, listed once by the caller (listing them walks the model's modules, a few
    hundred microseconds of host time a step for a ResNet).

    DDP has already averaged the gradients when backward returns, so a plain clip_grad_norm_ on
    each rank sees the same gradients and computes the same norm: a separate "distributed clip"
    that all-reduces norms would only repeat that work. Returns the pre-clip norm (a device
    tensor, not read here) when clipping is on, else None.
    """
    norm = None
    with span(OPTIMIZER_STEP):
        if grad_clip > 0:
            precision.unscale(optimizer)
            norm = torch.nn.utils.clip_grad_norm_(params, grad_clip, foreach=True)
        precision.step(optimizer)
    if zero_grad:  # a CUDA-graphed backward overwrites its gradients in place: they must stay allocated
        optimizer.zero_grad(set_to_none=True)
    return norm


def sync_context(ddp_module: nn.Module | None, last_micro_step: bool):
    """Skip DDP's gradient all-reduce on all but the last micro-step of an accumulation."""
    if ddp_module is None or last_micro_step:
        return contextlib.nullcontext()
    return ddp_module.no_sync()


TTA_SHIFT = 1  # pixels the translated test-time views move


def tta_logits(model: nn.Module, x: torch.Tensor, flip: bool, translate: bool) -> torch.Tensor:
    """Logits averaged over test-time views: the image and (flip) its mirror; with translate also
    the image shifted by one pixel up-left and down-right (reflect-padded), each with its mirror
    when flipping, weighted so the unshifted views count half (airbench's level 2: six views)."""

    def views(v: torch.Tensor) -> torch.Tensor:
        return 0.5 * (model(v) + model(v.flip(-1))) if flip else model(v)

    logits = views(x)
    if translate:
        h, w = x.shape[-2:]
        s = TTA_SHIFT
        padded = F.pad(x, (s, s, s, s), mode="reflect")
        shifted = [padded[..., :h, :w], padded[..., 2 * s :, 2 * s :]]
        logits = 0.5 * logits + 0.25 * (views(shifted[0]) + views(shifted[1]))
    return logits


@torch.no_grad()
def eval_batch(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    precision: Precision,
    tta_flip: bool = False,
    tta_translate: bool = False,
):
    """Summed loss and correct count.

    The per-sample losses are summed in float64: a float32 sum over a batch rounds differently
    for each batch composition (about 1e-8 relative), so sharded sums would not match a
    single-process evaluation of the same weights to the last digit. With tta_flip and
    tta_translate the logits are averaged over test-time views (`tta_logits`); each sample's
    views are its own, so a sharded evaluation still sees exactly what one process sees.
    """
    with precision.autocast():
        logits = tta_logits(model, x, tta_flip, tta_translate)
    loss = F.cross_entropy(logits.double(), y, reduction="sum")
    return loss, (logits.argmax(dim=1) == y).sum()
