"""How long a measurement runs: warm-up steps, timed steps, repeats. Light to import (no torch),
so `cnnpar bench --compare` starts fast."""

from __future__ import annotations

from dataclasses import dataclass

from cnnpar.errors import UserError


@dataclass(frozen=True)
class Timing:
    warmup: int = 5  # steps run (and compiled) before any clock starts
    steps: int = 30  # timed steps per repeat
    repeats: int = 5  # the reported figures are medians over these

    def __post_init__(self) -> None:
        limits = (("warmup-steps", self.warmup, 0), ("timed-steps", self.steps, 1), ("repeats", self.repeats, 1))
        for flag, value, least in limits:
            if value < least:
                raise UserError(f"bench --{flag} = {value}: expected a count >= {least}")
