"""Weight averaging: an exponential moving average of the weights, or airbench's lookahead.

Built on `torch.optim.swa_utils.AveragedModel`, which keeps the copy, the count and the state
dict. The update itself is done here, with a decay that changes from update to update:

    decay_k = ema ** every * (step / total_steps) ** warmup

so the average follows the weights closely early on and averages strongly at the end (airbench94:
ema 0.95, every 5 steps, warm-up power 3, from 3 of its ~10 epochs on). With `lookahead` the
average is copied back into the trained weights after every update, as the Lookahead optimizer does.

BatchNorm buffers are averaged with the same decay as the weights (`use_buffers=True`), as
airbench and timm's model EMA do: the running statistics then describe roughly the averaged
network, where the live model's statistics would describe the live weights; re-estimating them
with `swa_utils.update_bn` would cost a pass over the data. Integer buffers (BatchNorm's batch
counter) are copied, not averaged.

The update is two foreach kernels and a CPU counter increment. `AveragedModel.update_parameters`
is not used: it copies its CPU counter to the device once per (device, dtype) group, a blocking
host-to-device copy that synchronises the stream, every `ema_every` steps inside the epoch.

All of this runs eagerly after the optimizer step, outside any captured CUDA graph: the lookahead
copy writes into the parameters in place, so a graph that captured them replays with the new
values. Under DDP every rank holds identical parameters after the step, so every rank's average of
them is identical; BatchNorm buffers differ by rank, and the trainer broadcasts rank 0's (of the
average as of the model) before evaluating.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.optim.swa_utils import AveragedModel

from cnnpar.config import OptimConfig


class WeightAverage:
    def __init__(self, model: nn.Module, cfg: OptimConfig, total_steps: int) -> None:
        self.model = model
        self.cfg = cfg
        self.total_steps = max(1, total_steps)
        self.start_step = int(cfg.ema_start * total_steps)
        self.decay = cfg.ema
        self.averaged = AveragedModel(model, use_buffers=True)
        self.averaged.requires_grad_(False)
        # Listed once, not at every update: walking both models' modules for them took 0.2 ms (fastnet) to 1.5 ms
        # (resnet50) of host time per update on a 2-core EPYC. The parameters are the objects the optimizer holds;
        # the buffers stay the same objects once the model is built (the Trainer builds the average after every
        # apply_*; loading a checkpoint or a graph capture's put-back copies into them in place).
        self._live = [*model.parameters(), *model.buffers()]
        self._avg = [*self.averaged.module.parameters(), *self.averaged.module.buffers()]
        floats = [t.is_floating_point() for t in self._avg]
        self._avg_floats = [t for t, f in zip(self._avg, floats) if f]
        self._live_floats = [t for t, f in zip(self._live, floats) if f]
        self._avg_ints = [t for t, f in zip(self._avg, floats) if not f]
        self._live_ints = [t for t, f in zip(self._live, floats) if not f]

    def decay_at(self, step: int) -> float:
        cfg = self.cfg
        # Capped at the planned end: a timing tool may step past it, and a decay above 1 would
        # push the average away from the weights instead of towards them.
        return cfg.ema**cfg.ema_every * (min(step, self.total_steps) / self.total_steps) ** cfg.ema_warmup

    @property
    def started(self) -> bool:
        return int(self.averaged.n_averaged) > 0  # a CPU tensor: no device sync

    def first_update(self, done: int = 0) -> int:
        """The step of the next update after step `done` (`after_step`'s rule): the first multiple of `ema_every`
        past the start, or past `done` once the average has started. Beyond `total_steps`, this run never makes
        it: where the average has not started, what is evaluated, saved and predicted with is the trained weights
        (`eval_model`), and lookahead copies nothing back."""
        after = done if self.started else max(done, self.start_step)
        return (after // self.cfg.ema_every + 1) * self.cfg.ema_every

    @torch.no_grad()
    def after_step(self, step: int) -> None:
        """Called after optimizer step number `step` (1-based, counted over the whole run).

        `start_step` is a share of this run's steps: a resume with more --epochs moves it later, past an average
        the checkpoint had already started, which then keeps updating (it would stay frozen until the new start);
        one not yet started starts where the new schedule puts it."""
        if step % self.cfg.ema_every or (step <= self.start_step and not self.started):
            return
        self.decay = self.decay_at(step)
        if not self.started:
            torch._foreach_copy_(self._avg, self._live)  # the first update copies the weights
        else:
            torch._foreach_lerp_(self._avg_floats, self._live_floats, 1.0 - self.decay)
            if self._avg_ints:
                torch._foreach_copy_(self._avg_ints, self._live_ints)
        self.averaged.n_averaged += 1  # stays on the CPU
        if self.cfg.lookahead:
            self.copy_back()

    @torch.no_grad()
    def copy_back(self) -> None:
        """The live weights (and buffers) become the average, in place."""
        torch._foreach_copy_(self._live, self._avg)

    def eval_model(self) -> nn.Module:
        """The module to evaluate and predict with: the average once it has started."""
        return self.averaged.module if self.started else self.model

    def state_dict(self) -> dict:
        return self.averaged.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.averaged.load_state_dict(state)


def build_weight_average(model: nn.Module, cfg: OptimConfig, total_steps: int) -> WeightAverage | None:
    return WeightAverage(model, cfg, total_steps) if cfg.ema > 0 else None


def averaged_weights(checkpoint: dict) -> dict | None:
    """The averaged model's state dict from a checkpoint (None when it holds no started average)."""
    state = checkpoint.get("average")
    if not state or int(state.get("n_averaged", 0)) == 0:
        return None
    return module_weights(state)


def module_weights(average_state: dict) -> dict:
    """An average's state dict's weights and buffers under the model's own names (its count left out)."""
    prefix = "module."
    return {k[len(prefix) :]: v for k, v in average_state.items() if k.startswith(prefix)}
