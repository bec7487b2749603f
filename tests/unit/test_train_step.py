"""The one train step (engine/train_step.py): training and the tools take the same steps, and an
accumulation group of any size gives the gradient of one big batch of its samples."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from cnnpar.config import Config
from cnnpar.data import load_data
from cnnpar.dist import DistInfo
from cnnpar.engine.harness import build_trainer, next_group, training_batches
from cnnpar.engine.train_step import TrainStep, graphs_blocked_by
from cnnpar.parallel import Precision
from cnnpar.presets import with_overrides

CPU = DistInfo(0, 0, 1, torch.device("cpu"))

pytestmark = pytest.mark.usefixtures("one_thread")


def small(accum: int = 1, samples: int = 96, **optim) -> Config:
    """cnn3 on 3x8x8 synthetic images with random crops and flips, so every step draws random numbers."""
    return with_overrides(
        Config(),
        data={"source": "synthetic", "image_shape": "3x8x8", "synthetic_samples": samples, "augment": "crop+flip"},
        model={"name": "cnn3"},
        optim={"grad_accum": accum, **optim},
        speed={"device": "cpu", "precision": "fp32", "channels_last": "off"},
        run={"batch_size": 8, "epochs": 1, "seed": 5},
    )


def recording(trainer) -> list[tuple[float, int, list[int]]]:
    """Wrap the trainer's step to note each call's loss sum, correct count and micro-batch sizes."""
    seen, step = [], trainer.train_step

    def record(group):
        loss, right = step(group)
        seen.append((loss.item(), right.item(), [y.shape[0] for _, y in group]))  # test only: host reads
        return loss, right

    trainer.train_step = record
    return seen


@pytest.mark.parametrize("accum", [1, 2])
def test_the_tools_harness_takes_exactly_the_steps_training_takes(accum):
    # EMA, label smoothing and clipping on: the step owns all of them, so both paths must run them.
    # 80 samples, 16 held out: 8 batches of 8 an epoch; two epochs, since epoch 2's seeds differ
    # from the generators' initial ones (epoch 1 would match even without the per-epoch reseed).
    cfg = small(accum, samples=80, ema=0.8, label_smoothing=0.1, grad_clip=0.5)
    cfg = with_overrides(cfg, run={"epochs": 2})
    bundle = load_data(cfg.data, cfg.run.seed)

    trained = build_trainer(cfg, CPU, bundle)
    by_training = recording(trained)
    trained.train_epoch(1)
    trained.train_epoch(2)

    timed = build_trainer(cfg, CPU, bundle)
    by_harness = recording(timed)
    batches = training_batches(timed, first_epoch=1)
    for _ in range(2 * trained.steps_per_epoch):
        timed.train_step(next_group(timed, batches))
    batches.close()

    steps = 16 // accum
    assert [sizes for *_, sizes in by_training] == [[8] * accum] * steps
    assert by_harness == by_training  # the same losses and counts, to the last bit
    for a, b in ((trained.raw_model, timed.raw_model), (trained.average.averaged, timed.average.averaged)):
        for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
            assert torch.equal(x, y), name
    assert trained.scheduler.last_epoch == timed.scheduler.last_epoch == steps


def test_a_step_with_clipping_and_an_average_walks_no_module_tree(monkeypatch):
    """The clip's parameters and the average's tensors are listed once: listing them at every step walked the model's
    modules (a few hundred microseconds of host time a step for a ResNet on a 2-core EPYC). The clip still sees every
    parameter of the model."""
    trainer = build_trainer(small(ema=0.8, ema_every=1, grad_clip=0.5), CPU)
    batches = training_batches(trainer)
    groups = [next_group(trainer, batches) for _ in range(3)]
    walks, clipped = [], []
    walk, clip = nn.Module.named_modules, torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(
        nn.Module, "named_modules", lambda m, *a, **k: walks.append(type(m).__name__) or walk(m, *a, **k)
    )
    monkeypatch.setattr(
        torch.nn.utils, "clip_grad_norm_", lambda params, *a, **k: clipped.append(params) or clip(params, *a, **k)
    )
    for group in groups:
        trainer.train_step(group)
    monkeypatch.undo()
    assert walks == []
    assert len(clipped) == 3
    assert [id(p) for p in clipped[0]] == [id(p) for p in trainer.raw_model.parameters()]
    trainer.close()


def test_an_epochs_short_last_group_is_one_optimizer_step_over_its_own_micro_batches():
    cfg = small(accum=2, samples=50)  # 40 training samples: 5 micro-batches of 8
    trainer = build_trainer(cfg, CPU)
    steps = recording(trainer)
    trainer.train_epoch(1)
    assert [sizes for *_, sizes in steps] == [[8, 8], [8, 8], [8]]
    assert trainer.scheduler.last_epoch == 3


def test_each_micro_batch_weighs_by_its_samples_so_any_group_is_one_big_batch():
    """5 micro-batches of unequal size with accumulation 2: groups [3, 5], [2, 4] and a short last
    [6]. Each update equals one SGD step on the group's samples as a single batch; weighting by
    1/accum, as before, would have halved the last group's update."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 5))
    ref = copy.deepcopy(model)
    step = TrainStep(model, Precision("fp32", CPU.device), torch.optim.SGD(model.parameters(), lr=1.0))
    ref_opt = torch.optim.SGD(ref.parameters(), lr=1.0)
    batches = [(torch.randn(n, 3, 2, 2), torch.randint(0, 5, (n,))) for n in (3, 5, 2, 4, 6)]
    for group in (batches[0:2], batches[2:4], batches[4:]):
        x = torch.cat([b[0] for b in group])
        y = torch.cat([b[1] for b in group])
        before = [p.detach().clone() for p in model.parameters()]
        with torch.no_grad():
            logits = ref(x)
        loss_sum, correct = step(group)
        ref_opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        ref_opt.step()
        assert loss_sum.item() == pytest.approx(F.cross_entropy(logits, y, reduction="sum").item(), rel=1e-6)
        assert correct.item() == int((logits.argmax(1) == y).sum())
        moved = max(float((p.detach() - b).abs().max()) for p, b in zip(model.parameters(), before))
        assert moved > 1e-3  # the step did move the weights, so the comparison below means something
        for p, r in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p, r, rtol=1e-6, atol=1e-7)


def test_rehearsal_compiles_without_training():
    trainer = build_trainer(small(), CPU)
    before = {k: v.clone() for k, v in trainer.raw_model.state_dict().items()}
    x, y = next(iter(trainer.train_loader))
    trainer.train_step.rehearse(x, y)
    assert all(torch.equal(before[k], v) for k, v in trainer.raw_model.state_dict().items())
    assert all(p.grad is None for p in trainer.raw_model.parameters())
    assert trainer.scheduler.last_epoch == 0 and trainer.train_step.steps == 0


def test_compile_tuning_tunes_this_models_compile_and_no_other(monkeypatch):
    import torch._inductor.config as inductor_config

    from cnnpar.parallel import apply

    seen = []
    monkeypatch.setattr(apply.torch, "compile", lambda model, **kw: seen.append(kw) or model)
    for tuning in ("off", "on"):
        build_trainer(with_overrides(small(), speed={"compile": "default", "compile_tuning": tuning}), CPU).close()
    assert seen == [{"mode": None}, {"options": {"coordinate_descent_tuning": True}}]
    assert inductor_config.coordinate_descent_tuning is False  # the process's other compiles stay untuned
    # a named mode keeps its own options beside the tuning (torch.compile takes a mode or options, not both)
    assert apply.compile_options("reduce-overhead", True) == {
        "options": {"triton.cudagraphs": True, "coordinate_descent_tuning": True}
    }
    assert apply.compile_options("max-autotune", False) == {"mode": "max-autotune"}


def test_compile_tuning_options_are_ones_torch_compile_accepts():
    from cnnpar.parallel.apply import apply_compile

    # torch.compile checks an options dict when it is called: an option this torch lacks raises here
    model = apply_compile(nn.Linear(2, 2), "default", tuning=True)
    assert model(torch.ones(1, 2)).shape == (1, 2)
    model = apply_compile(nn.Linear(2, 2), "default", tiling=True)
    assert model(torch.ones(1, 2)).shape == (1, 2)


def test_compile_tiling_changes_this_models_compile_and_no_other(monkeypatch):
    import torch._inductor.config as inductor_config

    from cnnpar.parallel import apply

    seen = []
    monkeypatch.setattr(apply.torch, "compile", lambda model, **kw: seen.append(kw) or model)
    build_trainer(with_overrides(small(), speed={"compile": "default", "compile_tiling": "on"}), CPU).close()
    assert seen == [{"options": {"triton.prefer_nd_tiling": True, "max_autotune_pointwise": True}}]
    assert inductor_config.triton.prefer_nd_tiling is False and inductor_config.max_autotune_pointwise is False
    # beside tuning and a named mode: all three sets of options in one dict
    assert apply.compile_options("reduce-overhead", True, True) == {
        "options": {
            "triton.cudagraphs": True,
            "coordinate_descent_tuning": True,
            "triton.prefer_nd_tiling": True,
            "max_autotune_pointwise": True,
        }
    }


def test_compile_tiling_on_a_torch_without_its_options_is_a_config_error_naming_the_field(monkeypatch):
    from cnnpar.errors import ConfigError
    from cnnpar.parallel import apply

    have = apply.inductor_option_names()
    assert "triton.prefer_nd_tiling" in have  # this torch has it; an older one is made up below
    monkeypatch.setattr(apply, "inductor_option_names", lambda: have - {"triton.prefer_nd_tiling"})
    with pytest.raises(
        ConfigError, match=r"speed.compile_tiling \(--compile-tiling\): .* no triton.prefer_nd_tiling option"
    ):
        apply.compile_options("default", False, True)
    assert apply.compile_options("default", False, False) == {"mode": None}  # off: not asked


def test_graphs_are_blocked_where_they_cannot_replay_the_step():
    base = small()
    assert graphs_blocked_by(base, distributed=False) == ""
    assert "several processes" in graphs_blocked_by(base, distributed=True)
    assert "accumulation" in graphs_blocked_by(small(accum=2), distributed=False)
    for mode in ("reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"):
        why = graphs_blocked_by(with_overrides(base, speed={"compile": mode}), distributed=False)
        assert ("already captures graphs" in why) == (mode != "max-autotune-no-cudagraphs")


def test_graphs_stay_on_beside_a_gpu_decoder_only_where_cuda_has_its_32_queues(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)  # the variable counts (dist.queues_setting)
    base = small()
    for value, blocked in (("8", True), ("16", True), ("32", False), ("many", True)):
        monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", value)
        why = graphs_blocked_by(base, distributed=False, gpu_decoder_auto=True)
        assert bool(why) == blocked, (value, why)
        if blocked:
            assert "decoded on the GPU" in why and "CUDA_DEVICE_MAX_CONNECTIONS=32" in why
        assert graphs_blocked_by(base, distributed=False) == ""  # no GPU decoder: the queues do not matter
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS")
    assert "CUDA has 8 hardware queues" in graphs_blocked_by(base, distributed=False, gpu_decoder_auto=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_graphed_steps_match_eager_ones_across_two_captured_shapes_and_an_eager_third():
    """Full and half batch each get a graph (the doctor times both); a third shape runs eagerly
    beside them. Every step must train as the eager step does."""
    from cnnpar.models import build_model

    dev = torch.device("cuda")
    torch.manual_seed(0)
    graphed_model = build_model("cnn3", 3, 10, 16).to(dev)
    eager_model = copy.deepcopy(graphed_model)
    precision = Precision("fp32", dev)
    graphed = TrainStep(graphed_model, precision, torch.optim.SGD(graphed_model.parameters(), lr=0.1), cuda_graphs=True)
    eager = TrainStep(eager_model, precision, torch.optim.SGD(eager_model.parameters(), lr=0.1))
    g = torch.Generator(device=dev).manual_seed(1)
    for n in (16, 16, 8, 16, 8, 4, 16, 4, 8):
        x = torch.randn(n, 3, 16, 16, device=dev, generator=g)
        y = torch.randint(0, 10, (n,), device=dev, generator=g)
        la, ca = graphed([(x, y)])
        lb, cb = eager([(x, y)])
        torch.testing.assert_close(la, lb, rtol=1e-4, atol=1e-4)
        assert int(ca) == int(cb)
    assert len(graphed.graphs) == 2
    for p, q in zip(graphed_model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_compile_tiling_compiles_with_triton_and_trains_as_the_default_compile_does():
    # the options reach inductor's Triton kernels through torch.compile(options=...), not a global patch
    CUDA = DistInfo(0, 0, 1, torch.device("cuda"))
    cfg = with_overrides(
        small(samples=256),
        data={"image_shape": "3x32x32"},
        model={"name": "resnet18"},
        speed={"device": "cuda", "precision": "bf16", "channels_last": "on", "compile": "default"},
        run={"batch_size": 32},
    )
    losses = {}
    for tiling in ("off", "on"):
        trainer = build_trainer(with_overrides(cfg, speed={"compile_tiling": tiling}), CUDA)
        try:
            losses[tiling] = trainer.train_epoch(1)["train_loss"]
        finally:
            trainer.close()
    assert all(math.isfinite(v) for v in losses.values())
    # the same seed and data: other kernels, the same arithmetic up to bf16 rounding
    assert abs(losses["on"] - losses["off"]) <= 0.05 * abs(losses["off"]), losses


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "precision, optim",
    [("bf16", {}), ("fp16", {}), ("fp16", {"grad_clip": 1.0, "ema": 0.99})],
    ids=["bf16", "fp16", "fp16-clip-ema"],
)
def test_on_cuda_a_train_step_never_waits_for_the_gpu(precision, optim):
    # a host read in the step (a GradScaler's get_scale(), a count read back) drains the launch queue every step:
    # fp16 read its scale twice a step to count skipped steps. Eager, no compile, no graphs: the step's own work
    # alone; the batches are on the device already, so only the step can synchronise
    cuda = DistInfo(0, 0, 1, torch.device("cuda"))
    cfg = with_overrides(
        small(samples=256, **optim),
        data={"image_shape": "3x32x32", "augment": "none"},
        speed={"device": "cuda", "precision": precision, "compile": "off", "cuda_graphs": "off"},
        run={"batch_size": 32},
    )
    trainer = build_trainer(cfg, cuda)
    try:
        batches = training_batches(trainer)
        groups = [[(x.cuda(), y.cuda()) for x, y in next_group(trainer, batches)] for _ in range(4)]
        trainer.train_step(groups[0])  # the first step builds the optimizer's and the scaler's state
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for group in groups[1:]:
                trainer.train_step(group)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    finally:
        trainer.close()
