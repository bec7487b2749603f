"""Issue 8, item 4: airbench's pieces in cnnpar's terms (weight averaging, alternating flip,
translate, flip+translate TTA, the whitening and bias switches), on the CPU."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn as nn

from cnnpar.config import (
    Config,
    ConfigError,
    DataConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    SpeedConfig,
    from_dict,
    resolve_for_device,
)
from cnnpar.data.bundle import ArrayDataset, DataBundle
from cnnpar.data.loader import build_loader
from cnnpar.data.transforms import DeviceTransform
from cnnpar.dist import DistInfo
from cnnpar.engine import fault
from cnnpar.engine.averaging import WeightAverage, averaged_weights
from cnnpar.engine.checkpoint import load_checkpoint
from cnnpar.engine.optim import apply_frozen_whitening, build_optimizer, build_scheduler
from cnnpar.engine.step import tta_logits
from cnnpar.engine.trainer import Trainer
from cnnpar.models import build_model

CPU = torch.device("cpu")


def _info(rank: int = 0, world: int = 1) -> DistInfo:
    return DistInfo(rank, rank, world, CPU)


# ---- weight averaging ------------------------------------------------------------------------
def _bn_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(18, 3))


def test_ema_equals_a_hand_computation_with_every_start_and_warmup():
    net = _bn_net()
    cfg = OptimConfig(ema=0.9, ema_every=2, ema_start=0.25, ema_warmup=2.0)
    total = 12
    avg = WeightAverage(net, cfg, total)
    hand = None
    for step in range(1, total + 1):
        with torch.no_grad():  # stand-in for an optimizer step and a train-mode forward
            for p in net.parameters():
                p.add_(torch.randn_like(p))
            net(torch.randn(4, 1, 5, 5))
        avg.after_step(step)
        current = {k: v.detach().clone() for k, v in net.state_dict().items()}
        if step <= 3 or step % 2:  # start_step = int(0.25 * 12) = 3; updates on even steps only
            continue
        if hand is None:
            hand = current  # the first update copies
            continue
        decay = 0.9**2 * (step / total) ** 2.0
        for k, v in current.items():
            hand[k] = v if not v.is_floating_point() else decay * hand[k] + (1 - decay) * v
    got = avg.eval_model().state_dict()
    assert int(avg.averaged.n_averaged) == 5  # steps 4, 6, 8, 10, 12
    for k, v in hand.items():
        assert torch.allclose(got[k], v, rtol=1e-6, atol=1e-6), k
    assert got["1.running_mean"].abs().sum() > 0  # the BatchNorm statistics were averaged too
    assert got["1.num_batches_tracked"] == net.state_dict()["1.num_batches_tracked"]  # copied


def test_the_live_model_is_evaluated_until_the_average_starts():
    net = _bn_net()
    avg = WeightAverage(net, OptimConfig(ema=0.5, ema_start=0.5), 10)
    avg.after_step(5)
    assert avg.eval_model() is net
    avg.after_step(6)
    assert avg.eval_model() is avg.averaged.module


def test_lookahead_copies_the_average_back_into_the_same_tensors():
    net = nn.Linear(3, 2)
    weight = net.weight  # a captured CUDA graph holds these very tensors: the copy must be in place
    avg = WeightAverage(net, OptimConfig(ema=0.5, lookahead=True), 10)
    avg.after_step(1)
    with torch.no_grad():
        before = net.weight.clone()
        net.weight.add_(1.0)
    avg.after_step(2)
    assert net.weight is weight
    assert torch.allclose(net.weight, before + 0.5)  # lerp half way, then copied back
    assert torch.equal(net.weight, avg.averaged.module.weight)


def test_an_update_walks_neither_model_and_still_averages_what_trains(monkeypatch):
    """The tensors an update reads are listed when the average is built: listing them at every update walked both
    models' modules (0.2 ms of host time per update for fastnet, 1.5 ms for resnet50 on a 2-core EPYC). The lists
    hold the parameters and buffers themselves, so what an update averages is what the step and forward changed."""
    net = _bn_net()
    avg = WeightAverage(net, OptimConfig(ema=0.5, ema_every=1, lookahead=True), 10)
    walks = []
    walk = nn.Module.named_modules
    monkeypatch.setattr(
        nn.Module, "named_modules", lambda m, *a, **k: walks.append(type(m).__name__) or walk(m, *a, **k)
    )
    avg.after_step(1)  # the first update copies the weights
    with torch.no_grad():
        before = net[0].weight.clone()
        net[0].weight.add_(1.0)
        net(torch.randn(4, 1, 5, 5))  # train mode: the BatchNorm statistics move in place
    stats = net[1].running_mean.clone()
    avg.after_step(2)  # decay 0.5 ** 1 * (2 / 10) ** 0
    assert walks == []
    monkeypatch.undo()
    assert torch.allclose(net[0].weight, before + 0.5)  # half way, and copied back (lookahead)
    assert torch.allclose(avg.averaged.module[1].running_mean, 0.5 * stats)  # half way from the copied zeros


def test_lookahead_without_an_average_is_refused_with_the_field_name():
    with pytest.raises(ConfigError, match="optim.lookahead"):
        OptimConfig(lookahead=True)
    with pytest.raises(ConfigError, match="optim.ema"):
        OptimConfig(ema=1.0)


def _small_run(tmp_path, name: str, **optim) -> Config:
    return Config(
        data=DataConfig(source="synthetic", image_shape="3x16x16", synthetic_samples=160, augment="altflip"),
        # the alternating flip is a function of (index, epoch): a resumed run sees the same
        # augmented batches as an uninterrupted one, so their weights can be compared exactly
        optim=OptimConfig(ema=0.8, **optim),
        speed=SpeedConfig(precision="fp32", channels_last="off"),
        run=RunConfig(epochs=2, batch_size=16, max_steps=3, seed=4, out_dir=str(tmp_path), name=name, progress=False),
    )


def test_resume_restores_the_average_exactly(tmp_path, monkeypatch):
    quiet = dict(log=lambda *a, **k: None)
    full = Trainer(_small_run(tmp_path, "full"), _info(), **quiet)
    full.fit()
    monkeypatch.setenv(fault.RAISE_ENV, "2")  # dies half-way through epoch 2, after epoch 1's checkpoint
    fault._plan.cache_clear()
    with pytest.raises(RuntimeError, match="injected fault"):
        Trainer(_small_run(tmp_path, "cut"), _info(), **quiet).fit()
    saved = load_checkpoint(tmp_path / "cut")
    monkeypatch.delenv(fault.RAISE_ENV)
    fault._plan.cache_clear()
    cut = _small_run(tmp_path, "cut")
    resumed = Trainer(replace(cut, run=replace(cut.run, resume=str(tmp_path / "cut"))), _info(), **quiet)
    restored = resumed.average.state_dict()
    assert int(restored["n_averaged"]) == 3 == int(saved["average"]["n_averaged"])
    for k, v in saved["average"].items():
        assert torch.equal(restored[k], v), k
    resumed.fit()
    a, b = full.average.state_dict(), resumed.average.state_dict()
    assert int(b["n_averaged"]) == 6
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # predict reads the averaged weights, which differ from the live ones
    final = load_checkpoint(tmp_path / "cut")
    weights = averaged_weights(final)
    assert any(not torch.equal(weights[k], final["model"][k]) for k in weights)


@pytest.mark.parametrize(
    ("every", "start", "total", "done", "first"),
    [(1, 0.0, 22, 0, 1), (5, 0.3, 22, 0, 10), (100, 0.0, 22, 0, 100), (5, 0.99, 22, 0, 25), (5, 0.0, 22, 12, 15)],
)
def test_the_first_update_is_the_first_multiple_of_ema_every_past_the_start(every, start, total, done, first):
    avg = WeightAverage(_bn_net(), OptimConfig(ema=0.9, ema_every=every, ema_start=start), total)
    assert avg.first_update(done) == first
    for step in range(done + 1, first + 1):
        avg.after_step(step)
        assert avg.started == (step == first)


TINY_RUN = ["train", "--data", "synthetic", "--image-shape", "1x16x16", "--synthetic-samples", "64", "--batch-size"]
TINY_RUN += ["16", "--epochs", "1", "--max-steps", "3", "--device", "cpu", "--precision", "fp32", "--no-progress"]
TINY_RUN += ["--no-tensorboard"]


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        (["--ema-every", "100"], "the first would be step 100: --ema-every 100, --ema-start 0"),
        (
            ["--ema-every", "2", "--ema-start", "0.9", "--lookahead"],
            "the first would be step 4: --ema-every 2, --ema-start 0.9",
        ),
    ],
)
def test_a_weight_average_that_never_updates_is_said_at_the_start_and_the_end(tmp_path, capsys, one_thread, flags, why):
    """--ema-every past the run's steps, or a late --ema-start with no later multiple of it, never started the
    average: validation, best.pt and predict scored the trained weights, and nothing said so."""
    import json

    from cnnpar.cli import main

    assert main([*TINY_RUN, "--ema", "0.9", *flags, "--out-dir", str(tmp_path), "--name", "never"]) == 0
    out = capsys.readouterr().out
    lookahead = ", nor does --lookahead copy it back" if "--lookahead" in flags else ""
    note = f"note: weight average (--ema 0.9): no update in this run's 3 optimizer steps ({why}){lookahead}: "
    assert f"{note}validation, ckpt/best.pt and predict use the trained weights" in out.splitlines(), out
    done = [line for line in out.splitlines() if line.startswith("done: ")]
    assert done and "the weight average never started: the results are the trained weights' | " in done[0], out
    assert json.loads((tmp_path / "never" / "summary.json").read_text())["average_started"] is False
    assert main([*TINY_RUN, "--ema", "0.9", "--out-dir", str(tmp_path), "--name", "ran"]) == 0
    out = capsys.readouterr().out
    assert "weight average" not in out, out
    assert json.loads((tmp_path / "ran" / "summary.json").read_text())["average_started"] is True


# ---- alternating flip and translate ----------------------------------------------------------
N = 400


def _marked_bundle() -> DataBundle:
    """Left half dark, right half bright: a mirrored image is bright on the left. Labels are indices."""
    x = torch.zeros(N, 1, 4, 4, dtype=torch.uint8)
    x[..., 2:] = 255
    return DataBundle(ArrayDataset(x, torch.arange(N)), None, (1, 4, 4), N, (0.5,), (0.5,), "marked")


def _flips(resident: str, rank: int = 0, world: int = 1, epochs=(1, 2, 3)) -> dict[int, dict[int, bool]]:
    cfg = Config(data=DataConfig(augment="altflip", resident=resident), run=RunConfig(batch_size=32, seed=7))
    loader = build_loader(_marked_bundle(), resolve_for_device(cfg, "cpu", False), _info(rank, world), train=True)
    seen = {}
    for epoch in epochs:
        loader.set_epoch(epoch)
        seen[epoch] = {int(i): bool(img[0, 0, 0] > img[0, 0, -1]) for xb, yb in loader for img, i in zip(xb, yb)}
    return seen


@pytest.mark.parametrize("resident", ["on", "off"])
def test_alternating_flip_flips_each_image_in_exactly_one_of_two_consecutive_epochs(resident):
    seen = _flips(resident)
    assert len(seen[1]) == N - N % 32  # the train loader drops the partial batch
    common = seen[1].keys() & seen[2].keys() & seen[3].keys()
    assert len(common) > N // 2
    for i in common:
        assert seen[2][i] != seen[1][i] and seen[3][i] == seen[1][i]
    share = sum(seen[1].values()) / len(seen[1])
    assert 0.4 < share < 0.6  # epoch 1: a coin per image


def test_alternating_flip_is_the_same_whichever_rank_draws_the_sample():
    alone = _flips("off", epochs=(2,))[2]
    for rank in (0, 1):
        drawn = _flips("off", rank, 2, epochs=(2,))[2]
        both = drawn.keys() & alone.keys()  # each loader drops its own partial last batch
        assert len(both) > len(drawn) // 2 > 0, (len(both), len(drawn))  # else nothing below would be compared
        assert {i: drawn[i] for i in both} == {i: alone[i] for i in both}


def test_translate_shifts_by_at_most_two_pixels_and_crop_by_four():
    x = torch.zeros(2000, 1, 16, 16, dtype=torch.uint8)
    x[:, :, 8, 8] = 255
    for augment, pad in (("translate", 2), ("crop", 4)):
        out = DeviceTransform((0.0,), (1.0,), augment, False, CPU, seed=1)(x, train=True)
        where = out.flatten(1).argmax(1)
        dy, dx = where // 16 - 8, where % 16 - 8
        assert dy.abs().max() == pad and dx.abs().max() == pad  # every shift up to the pad occurs
        assert len(set(zip(dy.tolist(), dx.tolist()))) == (2 * pad + 1) ** 2


def test_unknown_augment_in_a_config_file_names_the_field():
    with pytest.raises(ConfigError, match="data.augment"):
        from_dict({"data": {"augment": "crop+spin"}})


# ---- test-time augmentation ------------------------------------------------------------------
def test_flip_translate_tta_averages_six_views_with_airbench_weights():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(2 * 6 * 6, 3))
    x = torch.randn(4, 2, 6, 6)
    pad = nn.functional.pad(x, (1, 1, 1, 1), mode="reflect")
    up_left, down_right = pad[..., :6, :6], pad[..., 2:, 2:]

    def mirror(v):
        return 0.5 * (model(v) + model(v.flip(-1)))

    want = 0.5 * mirror(x) + 0.25 * (mirror(up_left) + mirror(down_right))
    assert torch.allclose(tta_logits(model, x, flip=True, translate=True), want, atol=1e-6)
    assert torch.allclose(tta_logits(model, x, flip=True, translate=False), mirror(x), atol=1e-6)


def test_tta_level_keeps_the_older_tta_flip_switch():
    assert RunConfig(tta_flip=True).tta_in_effect == "flip"
    assert RunConfig(tta_level="flip+translate").tta_in_effect == "flip+translate"
    assert RunConfig().tta_in_effect == "none"


# ---- whitening and bias switches -------------------------------------------------------------
def test_whitened_stem_bias_is_held_after_its_epochs_and_its_filters_can_be_frozen():
    model = build_model("fastnet", 3, 10, 32)
    cfg = OptimConfig(optimizer="sgd", lr=0.1, bias_lr_scale=8.0, whiten_bias_epochs=2, whiten_frozen=True)
    apply_frozen_whitening(model, cfg)
    weight, bias = model.whitening_params()
    assert not weight.requires_grad
    opt = build_optimizer(model, cfg, cfg.lr, CPU)
    in_opt = [p for g in opt.param_groups for p in g["params"]]
    assert not any(p is weight for p in in_opt)
    sched = build_scheduler(opt, cfg, total_steps=30, steps_per_epoch=3)
    lrs = []
    for _ in range(7):
        lrs.append([g["lr"] for g in opt.param_groups])
        opt.step()
        sched.step()
    held = [g.get("name") for g in opt.param_groups].index("whiten_bias")
    assert all(row[held] > 0 for row in lrs[:6]) and lrs[6][held] == 0.0  # 2 epochs x 3 steps, then 0
    assert lrs[6][0] > 0  # the rest keeps training
    assert lrs[3][1] == pytest.approx(8.0 * lrs[3][0])  # biases and norms: bias_lr_scale x lr
    bias.grad = torch.ones_like(bias)
    before = bias.detach().clone()
    opt.step()
    assert torch.equal(bias, before)


def test_whitening_switches_on_a_model_without_a_whitened_stem_are_refused():
    with pytest.raises(ConfigError, match="optim.whiten_bias_epochs"):
        build_optimizer(build_model("cnn3", 1, 10, 16), OptimConfig(whiten_bias_epochs=1), 0.1, CPU)


def test_speed_preset_uses_the_new_switches():
    from cnnpar.presets import get_preset

    cfg = get_preset("cifar10-speed")
    assert cfg.model == ModelConfig(name="fastnet")
    assert "altflip" in cfg.data.augment and cfg.run.tta_in_effect == "flip+translate"
    assert cfg.optim.ema > 0 and cfg.optim.lookahead and cfg.optim.whiten_bias_epochs > 0
