"""Optimizer and learning-rate schedule from config."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from cnnpar.config import OptimConfig, setting_name
from cnnpar.engine.muon import MuonSGD
from cnnpar.errors import ConfigError

WHITEN_BIAS = "whiten_bias"  # the name of the param group that whiten_bias_epochs holds still


def whitening_params(model: nn.Module, cfg: OptimConfig) -> tuple[nn.Parameter, nn.Parameter] | None:
    """(filters, bias) of a data-whitened stem when a whitening switch is on; the switch names the
    field when the model has no such stem."""
    if not (cfg.whiten_frozen or cfg.whiten_bias_epochs):
        return None
    if not hasattr(model, "whitening_params"):
        field = "whiten_frozen" if cfg.whiten_frozen else "whiten_bias_epochs"
        raise ConfigError(
            f"{setting_name('optim', field)}: the model {type(model).__name__} has no data-whitened stem: expected "
            "fastnet, or the switch off"
        )
    return model.whitening_params()


def apply_frozen_whitening(model: nn.Module, cfg: OptimConfig) -> None:
    """Stop the whitened stem's filters from training (before DDP, which records what trains).

    Refused where the data cannot set every filter (1- or 2-channel images: a 2x2 patch has 4 or 8 eigenvectors,
    8 or 16 filters of fastnet's 24): the others would be frozen at their random init for the whole run."""
    found = whitening_params(model, cfg)
    if found is not None and cfg.whiten_frozen:
        filters = found[0]
        whitened = model.whitened_filters() if hasattr(model, "whitened_filters") else len(filters)
        if whitened < len(filters):
            channels = filters.shape[1]
            raise ConfigError(
                f"{setting_name('optim', 'whiten_frozen')}: {type(model).__name__}'s stem on {channels}-channel "
                f"images is whitened in {whitened} of its {len(filters)} filters (its "
                f"{channels * filters[0, 0].numel()} patch eigenvectors, +/-); the other {len(filters) - whitened} "
                "would stay random, frozen for the whole run: expected --no-whiten-frozen"
            )
        filters.requires_grad_(False)


def bias_to_freeze(model: nn.Module, cfg: OptimConfig, epochs: int, distributed: bool) -> nn.Parameter | None:
    """The whitened stem's bias, where it stops training during this run and may stop needing a
    gradient then: `whiten_bias_epochs` below the run's epochs, one process (DDP and Horovod fix
    at wrap time which parameters send gradients).

    From then on the schedule holds its lr at 0, so it would not move anyway; with requires_grad
    off the backward also skips everything that only fed its gradient: the first stage's first
    conv no longer computes the gradient of its input, nor the stem's GELU its own (airbench94
    detaches the bias then, for the same saving). The trainer turns it off and on per epoch
    (`set_bias_trains`), so a resumed run freezes it too."""
    if distributed or not 0 < cfg.whiten_bias_epochs < epochs:
        return None
    found = whitening_params(model, cfg)
    return found[1] if found is not None else None


def set_bias_trains(bias: nn.Parameter, trains: bool) -> None:
    bias.requires_grad_(trains)
    if not trains:
        bias.grad = None  # the optimizer skips a parameter without a gradient


def scaled_lr(cfg: OptimConfig, world_size: int) -> float:
    """The peak lr after scaling with the number of samples per optimizer step."""
    factor = world_size * cfg.grad_accum
    if cfg.lr_scaling == "linear":
        return cfg.lr * factor
    if cfg.lr_scaling == "sqrt":
        return cfg.lr * math.sqrt(factor)
    return cfg.lr


def describe_lr(cfg: OptimConfig, world_size: int, default_note: str = "") -> str:
    """The start-of-run lr line: the configured lr, the rule, and what it was multiplied by, e.g.
    `lr 0.1 x 2 processes = 0.2 (--lr-scaling linear)`; `default_note` (config.default_lr_note: the optimizer's
    default, where --lr was auto) after it; with Muon, the filters' lr last."""
    line = _describe_lr(cfg, world_size) + (f"; {default_note}" if default_note else "")
    if cfg.optimizer == "sgd" and cfg.momentum == 0:  # build_optimizer: Nesterov needs a momentum
        line += "; plain SGD: --momentum 0 has no Nesterov step (sgd's otherwise)"
    return line + (f"; conv filters: Muon, lr {cfg.muon_lr:g}" if cfg.optimizer == "muon" else "")


def _describe_lr(cfg: OptimConfig, world_size: int) -> str:
    lr = scaled_lr(cfg, world_size)
    what = f"{world_size} process{'es' if world_size != 1 else ''}"
    if cfg.grad_accum > 1:
        what += f" x {cfg.grad_accum} accumulation steps"
    if cfg.lr_scaling == "linear":
        return f"lr {cfg.lr:g} x {what} = {lr:g} (--lr-scaling linear)"
    if cfg.lr_scaling == "sqrt":
        return f"lr {cfg.lr:g} x sqrt({what}) = {lr:g} (--lr-scaling sqrt)"
    scale = "the world size" if cfg.grad_accum == 1 else "the world size or the accumulation"
    return f"lr {cfg.lr:g} (not scaled with {scale}: --lr-scaling none)"


def build_optimizer(model: nn.Module, cfg: OptimConfig, lr: float, device: torch.device) -> torch.optim.Optimizer:
    """SGD with Nesterov momentum (plain SGD at momentum 0), AdamW, or Muon for the conv filters beside SGD
    for the rest; no weight decay on biases and norm parameters unless `bias_decay`, and their lr `bias_lr_scale`
    times the rest's (airbench: 64, BatchNorm biases learn fastest that way).

    A whitened stem's bias gets a group of its own when `whiten_bias_epochs` will hold it still.
    On CUDA the fused implementation does the whole update in a few kernels; elsewhere the
    foreach (multi-tensor) path is the fast one.
    """
    whiten = whitening_params(model, cfg)
    held = whiten[1] if whiten is not None and cfg.whiten_bias_epochs else None
    filters, decay, no_decay = muon_split(model, held)
    if cfg.optimizer != "muon":  # the filters decay with the other weights, in the order parameters() gives
        decay = [p for p in model.parameters() if p.requires_grad and p is not held and p.ndim > 1]
    bias_lr = lr * cfg.bias_lr_scale
    # with bias_decay, coupled decay x lr is the same for every group: each shrinks by the same share per step
    bias_wd = cfg.weight_decay / cfg.bias_lr_scale if cfg.bias_decay else 0.0
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": bias_wd, "lr": bias_lr},
    ]
    if held is not None:
        groups.append({"params": [held], "weight_decay": bias_wd, "lr": bias_lr, "name": WHITEN_BIAS})
    impl = {"fused": True} if device.type == "cuda" else {"foreach": True}
    if cfg.optimizer == "sgd":
        # torch refuses Nesterov without momentum (a ValueError traceback at the run's start); at momentum 0 its
        # update is plain SGD's anyway, which `describe_lr` names
        return torch.optim.SGD(groups, lr=lr, momentum=cfg.momentum, nesterov=cfg.momentum > 0, **impl)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=lr, **impl)
    if not filters:
        raise ConfigError(
            f"{setting_name('optim', 'optimizer')} = 'muon': the model {type(model).__name__} has no trainable 4-D "
            "conv filters for Muon: expected a convolutional model, or --optimizer sgd"
        )
    muon = {
        "params": filters,
        "muon": True,
        "lr": cfg.muon_lr,
        "momentum": cfg.muon_momentum,
        "ns_steps": cfg.muon_ns_steps,
        "normalize": cfg.muon_normalize,
        "weight_decay": 0.0,
    }
    # last: param_groups[0] stays the group --lr names, the one a run's log reports
    return MuonSGD([*groups, muon], lr=lr, momentum=cfg.momentum, impl=impl)


def muon_split(model: nn.Module, held: nn.Parameter | None = None) -> tuple[list, list, list]:
    """(4-D conv filters for Muon, other weights, biases and norm parameters) among the trainable
    parameters, each exactly once (a parameter shared by two modules is listed once); `held` (a
    whitened stem's bias with a group of its own) in none of them."""
    filters, decay, no_decay = [], [], []
    for p in model.parameters():  # parameters() yields a shared tensor once
        if p.requires_grad and p is not held:
            (filters if p.ndim == 4 else decay if p.ndim > 1 else no_decay).append(p)
    return filters, decay, no_decay


def warmup_steps(total: int, warmup: float) -> int:
    """The optimizer steps `schedule_factor` warms up over: its share of `total`, the first step at least where
    `warmup` is above 0."""
    return max(int(total * warmup), 1 if warmup > 0 else 0)


def schedule_factor(step: int, total: int, warmup: float, schedule: str) -> float:
    """The lr of optimizer step `step` (0-based) of `total`, as a share of the peak: a linear warm-up over `warmup`
    of the steps, (step + 1) / its steps, then the schedule from the peak down.

    A positive warm-up takes the first step at least, at half the peak: in a run of fewer than 2 / warmup steps (14
    at 0.15) int(total * warmup) is 0, no warm-up, or 1, a single warm-up step at (0 + 1) / 1, the peak, and the
    run's first step took the full lr. The steps after it stay where the schedule had them."""
    warm = int(total * warmup)
    if step < warmup_steps(total, warmup):  # (one rule, read by the resume's warm-up line too)
        return (step + 1) / max(2, warm)
    if schedule == "constant":
        return 1.0
    progress = (step - warm) / max(1, total - warm)
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return max(0.0, 1.0 - progress)  # onecycle: linear up, linear down to zero


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int, steps_per_epoch: int = 0):
    """One schedule for every group; the whitened stem's bias group drops to lr 0 after
    `whiten_bias_epochs` (the lr is what holds it: where the trainer also turns its gradient off,
    `bias_to_freeze`, a CUDA-graphed step replays a second graph captured for that)."""

    def factor(step: int) -> float:
        return schedule_factor(step, total_steps, cfg.warmup, cfg.schedule)

    hold_from = cfg.whiten_bias_epochs * steps_per_epoch

    def held_factor(step: int) -> float:
        return 0.0 if step >= hold_from else factor(step)

    lambdas = [held_factor if g.get("name") == WHITEN_BIAS else factor for g in optimizer.param_groups]
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambdas)


def last_step_lr(scheduler) -> float:
    """The first group's lr at the last optimizer step taken: what an epoch's `lr` column reports. The groups'
    own lr is already the next step's (LambdaLR moves it after each step), 0 at the end of a one-cycle run."""
    step = max(0, scheduler.last_epoch - 1)
    return scheduler.base_lrs[0] * scheduler.lr_lambdas[0](step)


def rebuild_after_resume(scheduler, optimizer: torch.optim.Optimizer) -> list[float]:
    """Put every group's lr where this schedule (built for this run's total steps) stands at the
    resumed step, and return them.

    A checkpoint's optimizer holds the lr of the step it stopped at: after a finished one-cycle
    or cosine run that is 0, and the next step would train at 0 even though the schedule, rebuilt
    for more epochs, says otherwise (LambdaLR moves the lr only after each step)."""
    lrs = [base * lam(scheduler.last_epoch) for base, lam in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    for group, lr in zip(optimizer.param_groups, lrs):
        group["lr"] = lr
    scheduler._last_lr = lrs
    return lrs
