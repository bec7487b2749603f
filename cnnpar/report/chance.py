"""Whether a validation accuracy shows a model that learned anything: one rule for `cnnpar compare`'s "did not
learn" and the trainer's fp16 end-of-run divergence."""

from __future__ import annotations

# At or below this many times 1 / classes the final val acc is chance (a 1-epoch digits run: 87 %, against 15 %),
# but never more than CHANCE_MARGIN above 1 / classes: 1.5 / 2 classes is 75 %, and a binary run at 65 % learned.
CHANCE_FACTOR = 1.5
CHANCE_MARGIN = 0.05


def at_chance_level(val_acc: float, classes: int) -> bool:
    """`val_acc` (a fraction) at or below the smaller of CHANCE_FACTOR / classes and 1 / classes + CHANCE_MARGIN."""
    if classes < 2:
        return False
    return val_acc <= min(CHANCE_FACTOR / classes, 1 / classes + CHANCE_MARGIN)
