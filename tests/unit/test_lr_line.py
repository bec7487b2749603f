"""The start-of-run lr line says what the lr was multiplied by, and by which rule."""

import pytest

from cnnpar.config import OptimConfig
from cnnpar.engine.optim import build_optimizer, describe_lr, scaled_lr, schedule_factor


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


def test_sgd_with_momentum_0_is_plain_sgd_and_the_lr_line_says_so():
    """torch refuses Nesterov at momentum 0: `--optimizer sgd --momentum 0` passed the config check and ended in
    torch's ValueError traceback (train, doctor) or failed every bench rung and tune trial."""
    import torch

    cfg = OptimConfig(optimizer="sgd", lr=0.1, momentum=0.0, weight_decay=0.0)
    model = torch.nn.Linear(3, 2)
    opt = build_optimizer(model, cfg, cfg.lr, torch.device("cpu"))
    assert all(g["momentum"] == 0.0 and not g["nesterov"] for g in opt.param_groups)
    before = model.weight.detach().clone()
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    assert torch.allclose(model.weight, before - 0.1 * model.weight.grad)  # w - lr * grad: no momentum
    assert describe_lr(cfg, 1).endswith("; plain SGD: --momentum 0 has no Nesterov step (sgd's otherwise)")
    nesterov = OptimConfig(optimizer="sgd", lr=0.1)
    assert all(g["nesterov"] for g in build_optimizer(model, nesterov, 0.1, torch.device("cpu")).param_groups)
    assert "Nesterov" not in describe_lr(nesterov, 1)


@pytest.mark.parametrize(
    "total, factors",
    [
        (1, [0.5]),
        (2, [0.5, 0.5]),
        (6, [0.5, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6]),  # int(6 * 0.15) = 0: no warm-up step had been taken
        (13, [0.5, 1.0, 11 / 12, 10 / 12]),  # int(13 * 0.15) = 1: one warm-up step, at (0 + 1) / 1, the peak
    ],
)
def test_a_positive_warmup_starts_below_the_peak_in_a_short_run(total, factors):
    """int(total * warmup) below 2 left no warm-up, or one step at the peak: a run of fewer than 2 / warmup steps
    (14 at the default 0.15) took its first step at the full lr. The steps after it stay where they were."""
    assert [schedule_factor(s, total, 0.15, "onecycle") for s in range(len(factors))] == pytest.approx(factors)
    assert schedule_factor(0, total, 0.0, "onecycle") == 1.0  # no warm-up asked for: none


@pytest.mark.parametrize("schedule", ["onecycle", "cosine", "constant"])
def test_a_long_runs_warmup_climbs_to_the_peak_over_its_share_of_the_steps(schedule):
    """The shape README describes, unchanged for runs of 2 / warmup steps or more: (step + 1) / warm-up steps."""
    total, warm = 100, 15
    assert [schedule_factor(s, total, 0.15, schedule) for s in range(warm)] == [(s + 1) / warm for s in range(warm)]
    assert schedule_factor(warm, total, 0.15, schedule) == 1.0
    assert schedule_factor(total - 1, total, 0.15, schedule) < 1.0 or schedule == "constant"


def test_the_optimizer_flags_typed_reach_the_optimizer_the_run_trains_and_saves(tmp_path):
    """--weight-decay, --bias-decay, --bias-lr-scale, --momentum, --lr and --schedule as the run's optimizer holds
    them (its checkpoint's param groups), not only as config.toml records them: a flag lost between the two trained
    the defaults under a record that named the flag."""
    import tomllib

    import torch

    from cnnpar import cli

    flags = ["--optimizer", "sgd", "--lr", "0.05", "--weight-decay", "0.3", "--bias-decay", "--bias-lr-scale", "4"]
    flags += ["--momentum", "0.5", "--schedule", "constant", "--warmup", "0"]
    quick = ["--data", "synthetic", "--synthetic-samples", "20", "--batch-size", "8", "--epochs", "1"]
    quick += ["--max-steps", "1", "--no-progress", "--no-tensorboard", "--out-dir", str(tmp_path), "--name", "r"]
    assert cli.main(["train", *flags, *quick]) == 0
    groups = torch.load(tmp_path / "r" / "ckpt" / "last.pt", weights_only=False)["optimizer"]["param_groups"]
    weights, biases = groups[0], groups[1]
    assert weights["params"] and biases["params"]
    assert weights["weight_decay"] == 0.3 and biases["weight_decay"] == pytest.approx(0.3 / 4)  # --bias-decay
    assert weights["initial_lr"] == 0.05 and biases["initial_lr"] == pytest.approx(0.05 * 4)  # --bias-lr-scale
    assert [g["lr"] for g in groups] == [g["initial_lr"] for g in groups]  # constant, no warm-up: still the peak
    assert all(g["momentum"] == 0.5 and g["nesterov"] for g in groups)
    optim = tomllib.loads((tmp_path / "r" / "config.toml").read_text())["optim"]
    assert (optim["weight_decay"], optim["bias_decay"], optim["bias_lr_scale"]) == (0.3, True, 4.0)
