"""Optimizer and learning-rate schedule from config."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from cnnpar.config import OptimConfig


def scaled_lr(cfg: OptimConfig, world_size: int) -> float:
    """The peak lr after scaling with the number of samples per optimizer step."""
    factor = world_size * cfg.grad_accum
    if cfg.lr_scaling == "linear":
        return cfg.lr * factor
    if cfg.lr_scaling == "sqrt":
        return cfg.lr * math.sqrt(factor)
    return cfg.lr


def build_optimizer(model: nn.Module, cfg: OptimConfig, lr: float, device: torch.device) -> torch.optim.Optimizer:
    """SGD with Nesterov momentum or AdamW; no weight decay on biases and norm parameters.

    On CUDA the fused implementation does the whole update in a few kernels; elsewhere the
    foreach (multi-tensor) path is the fast one.
    """
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim > 1 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    impl = {"fused": True} if device.type == "cuda" else {"foreach": True}
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=cfg.momentum, nesterov=True, **impl)
    return torch.optim.AdamW(groups, lr=lr, **impl)


def lr_factor(step: int, total: int, warmup: float, schedule: str) -> float:
    warm = int(total * warmup)
    if step < warm:
        return (step + 1) / warm
    if schedule == "constant":
        return 1.0
    progress = (step - warm) / max(1, total - warm)
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return max(0.0, 1.0 - progress)  # onecycle: linear up, linear down to zero


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, total_steps, cfg.warmup, cfg.schedule))
