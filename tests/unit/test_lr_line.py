"""The start-of-run lr line says what the lr was multiplied by, and by which rule."""

import pytest

from cnnpar.config import OptimConfig
from cnnpar.engine.optim import describe_lr, scaled_lr


@pytest.mark.parametrize(
    "scaling, world, accum, line",
    [
        ("none", 2, 1, "lr 0.1 (not scaled with the world size: --lr-scaling none)"),
        ("none", 2, 4, "lr 0.1 (not scaled with the world size or the accumulation: --lr-scaling none)"),
        ("linear", 2, 1, "lr 0.1 x 2 processes = 0.2 (--lr-scaling linear)"),
        ("linear", 1, 1, "lr 0.1 x 1 process = 0.1 (--lr-scaling linear)"),
        ("linear", 2, 4, "lr 0.1 x 2 processes x 4 accumulation steps = 0.8 (--lr-scaling linear)"),
        ("sqrt", 4, 1, "lr 0.1 x sqrt(4 processes) = 0.2 (--lr-scaling sqrt)"),
    ],
)
def test_describe_lr(scaling, world, accum, line):
    cfg = OptimConfig(lr=0.1, lr_scaling=scaling, grad_accum=accum)
    assert describe_lr(cfg, world) == line
    assert f"{scaled_lr(cfg, world):g}" in line
