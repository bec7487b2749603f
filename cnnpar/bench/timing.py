"""How long a measurement runs: warm-up steps, timed steps, repeats. Light to import (no torch),
so `cnnpar bench --compare` starts fast."""

from __future__ import annotations

from dataclasses import dataclass

from cnnpar.errors import UserError

MIN_STEPS = 3  # timed steps per repeat at least: one or two short steps say little about a mean
# ... except a step this slow (the fp32 textbook-loader baseline of the ResNet-50 ladder: 3.9 s on an
# H200, 15 timed steps = 59 s of a 3-minute budget): it averages over a whole batch's host work
# already, and one per repeat keeps the 5 repeats' spread while the later rungs still get their turn
SLOW_STEP_S = 1.0


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
        if self.seconds < 0:
            raise UserError(f"bench --timed-s = {self.seconds}: expected seconds >= 0 (0: a fixed step count)")

    def steps_for(self, step_s: float) -> int:
        """Timed steps per repeat when one step takes `step_s` seconds."""
        if self.seconds <= 0 or step_s <= 0:
            return self.steps
        if step_s >= SLOW_STEP_S:
            return 1
        fit = int(self.seconds / (self.repeats * step_s))
        return max(min(MIN_STEPS, self.steps), min(self.steps, fit))


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
