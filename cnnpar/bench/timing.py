"""How long a measurement runs: warm-up steps, timed steps, repeats. Light to import (no torch),
so `cnnpar bench --compare` starts fast."""

from __future__ import annotations

import math
from dataclasses import dataclass

from cnnpar.errors import UserError

MIN_STEPS = 3  # timed steps per repeat at least: one or two short steps say little about a mean
# ... except a step this slow (the fp32 textbook-loader baseline of the ResNet-50 ladder: 3.9 s on an
# H200, 15 timed steps = 59 s of a 3-minute budget): it averages over a whole batch's host work
# already, and one per repeat keeps a spread while the later rungs still get their turn. Such a step
# is also warm after one step past the first (which autotunes or compiles): see `Timing.warm`.
SLOW_STEP_S = 1.0
# Repeats at least, where even the fewest steps per repeat would run past `seconds`: three give a
# median with a repeat on either side of it, so a range (the noise) is still reported.
MIN_REPEATS = 3
# `cnnpar tune`'s default limit on a trial (--trial-s 0), here beside the other durations because its --help states
# them and the parser imports no torch (bench/tune.py does)
TRIAL_SHARE = 1 / 3  # this share of the budget ...
START_FACTOR = 1.5  # ... or this many times the start trial's wall time, whichever is larger
TRIAL_SHARE_WORDS = {1 / 2: "half", 1 / 3: "a third", 1 / 4: "a quarter"}.get(TRIAL_SHARE, f"{TRIAL_SHARE:g}")


@dataclass(frozen=True)
class Timing:
    warmup: int = 3  # steps run (and compiled) before any clock starts
    steps: int = 30  # timed steps per repeat (with `seconds`: at most this many)
    repeats: int = 5  # the reported figures are medians over these; their spread is the noise
    # timed seconds per measurement (all repeats together); the steps per repeat are sized from the
    # time of one step after the warm-up, so a 240 ms fp32 ResNet-50 step and a 6 ms graphed
    # ResNet-18 step cost about the same wall time. 0: always `steps` steps.
    seconds: float = 1.5

    def __post_init__(self) -> None:
        limits = (("warmup-steps", self.warmup, 0), ("timed-steps", self.steps, 1), ("repeats", self.repeats, 1))
        for flag, value, least in limits:
            if value < least:
                raise UserError(f"bench --{flag} = {value}: expected a count >= {least}")
        if not 0 <= self.seconds < math.inf:  # NaN too; inf is no time to size the steps by
            raise UserError(f"bench --timed-s = {self.seconds}: expected seconds >= 0, finite (0: a fixed step count)")

    def steps_for(self, step_s: float) -> int:
        """Timed steps per repeat when one step takes `step_s` seconds."""
        if self.seconds <= 0 or step_s <= 0:
            return self.steps
        if step_s >= SLOW_STEP_S:
            return 1
        # capped before int(): --timed-s 1e308 over a 1 ms step is inf steps (an OverflowError that failed every rung)
        fit = int(min(self.steps, self.seconds / (self.repeats * step_s)))
        return max(min(MIN_STEPS, self.steps), fit)

    def plan(self, step_s: float) -> tuple[int, int]:
        """(timed steps per repeat, repeats) when one step takes `step_s` seconds.

        The steps per repeat shrink first (`steps_for`); where even the fewest would take the repeats
        past `seconds`, the repeats shrink too, to no fewer than MIN_REPEATS (never more than asked):
        ResNet-50's 0.25 s eager fp32 steps get 3 x 3 steps, its 3.9 s textbook baseline 3 x 1."""
        steps = self.steps_for(step_s)
        if self.seconds <= 0 or step_s <= 0 or steps * self.repeats * step_s <= self.seconds:
            return steps, self.repeats
        fit = int(self.seconds / (steps * step_s))
        return steps, max(min(MIN_REPEATS, self.repeats), min(self.repeats, fit))

    def warm(self, done: int, last_step_s: float) -> bool:
        """Whether the warm-up is over after `done` steps, the last of which took `last_step_s`.

        `warmup` steps, or fewer where a step after the first is slow (>= SLOW_STEP_S): the first
        step pays for cuDNN's autotuning, compile and CUDA-graph capture; a step that is still slow
        after it is host-bound (the textbook loader's per-sample work), and one more such step costs
        seconds without warming anything."""
        if done >= self.warmup:
            return True
        return self.seconds > 0 and done >= 2 and last_step_s >= SLOW_STEP_S


@dataclass(frozen=True)
class Spread:
    """The median of repeats and their range: what a figure is, and how much it moved."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        ordered = sorted(values)
        n = len(ordered)
        mid = ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])
        return cls(mid, ordered[0], ordered[-1])

    @classmethod
    def single(cls, value: float) -> Spread:
        return cls(value, value, value)
