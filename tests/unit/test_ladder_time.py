"""What keeps the ResNet-50 ladder inside 3 minutes: repeats sized from the last warm-up step, a short
warm-up for host-bound steps, and the in-place rungs (CUDA graphs, resident data) measured on the
compile rung's Trainer instead of compiling again. Fake clocks and fake trainers stand in for a GPU;
the step times are those of the H200 ladder of 2026-12-01 (benchmarks/results/2026-12-01-h200/call-b)."""

from __future__ import annotations

import pytest
import torch

import cnnpar.bench.ladder as ladder
from cnnpar.bench.measure import warm_up
from cnnpar.bench.timing import Timing
from cnnpar.config import Config
from cnnpar.data import load_data
from cnnpar.data.loader import ResidentLoader
from cnnpar.dist import DistInfo
from cnnpar.engine.harness import build_trainer, continue_as, next_group, training_batches
from cnnpar.presets import with_overrides

CPU = DistInfo(0, 0, 1, torch.device("cpu"))
GPU = DistInfo(0, 0, 1, torch.device("cuda"))

pytestmark = pytest.mark.usefixtures("one_thread")


def test_repeats_shrink_to_three_only_where_the_fewest_steps_overshoot_the_timed_seconds():
    t = Timing(warmup=3, steps=30, repeats=5, seconds=1.5)
    assert t.plan(3.928) == (1, 3)  # the fp32 textbook baseline: 3 repeats of 1 step, not 5
    assert t.plan(0.244) == (3, 3)  # eager fp32 data rungs: 3 x 3 steps = 2.2 s instead of 3.7 s
    assert t.plan(0.107) == (3, 4)  # bf16: 4 x 3 steps fit 1.5 s
    assert t.plan(0.0888) == (3, 5)  # fp16: 5 x 3 steps fit already
    assert t.plan(0.040) == (7, 5)  # a compiled step: the steps per repeat shrink, the repeats stay
    assert Timing(repeats=2, seconds=1.5).plan(3.9) == (1, 2)  # never more repeats than asked for
    assert Timing(steps=30, repeats=5, seconds=0).plan(3.9) == (30, 5)  # --timed-s 0: fixed counts


def fake_steps(durations: list[float]):
    """A step that advances a fake clock by the next duration; returns (step, clock, calls)."""
    now, calls = [0.0], []

    def step():
        now[0] += durations[len(calls)]
        calls.append(now[0])

    return step, lambda: now[0], calls


def test_a_host_bound_step_stops_the_warm_up_after_two_steps_and_sizes_the_repeats():
    step, clock, calls = fake_steps([16.9, 3.9, 3.9])  # autotune + a textbook batch, then 3.9 s steps
    done, total, last = warm_up(step, Timing(warmup=3, seconds=1.5), CPU.device, clock)
    assert (done, len(calls), last) == (2, 2, pytest.approx(3.9)) and total == pytest.approx(20.8)


def test_a_compiled_step_keeps_its_full_warm_up_and_sizes_from_the_last_warm_step():
    step, clock, calls = fake_steps([40.0, 0.045, 0.040, 0.040])  # the first step compiles
    done, total, last = warm_up(step, Timing(warmup=3, seconds=1.5), CPU.device, clock)
    assert (done, len(calls), last) == (3, 3, pytest.approx(0.040)) and total == pytest.approx(40.085)


def test_without_sizing_every_warm_up_step_runs_and_without_warm_up_one_step_sizes():
    step, clock, calls = fake_steps([16.9, 3.9, 3.9])
    assert warm_up(step, Timing(warmup=3, seconds=0), CPU.device, clock)[0] == 3  # fixed counts: no early end
    step, clock, calls = fake_steps([0.5])
    done, total, last = warm_up(step, Timing(warmup=0, seconds=1.5), CPU.device, clock)
    assert (done, total, last, len(calls)) == (0, 0.0, pytest.approx(0.5), 1)  # an untimed step, not counted as warm-up


class FakeTrainer:
    def __init__(self, cfg):
        self.cfgs = [cfg]
        self.closed = 0

    @property
    def cfg(self):  # as a real Trainer's: the config it was last given (continue_as)
        return self.cfgs[-1]

    def close(self):
        self.closed += 1


def fake_gpu_ladder(monkeypatch, fail: frozenset = frozenset()):
    """run_ladder on a pretend GPU: trainers are FakeTrainers, measuring returns a fixed rate (or
    raises for the rungs in `fail`); returns the list of (rung, trainer) measured."""
    measured, current = [], {}
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a, **k: None)
    monkeypatch.setattr(ladder, "free_device_memory", lambda device: None)

    def fresh(cfg, bundle, info):
        return FakeTrainer(cfg)

    def cont(trainer, cfg):
        trainer.cfgs.append(cfg)

    def measure(trainer, timing):
        name = current["rung"]
        measured.append((name, trainer))
        if name in fail:
            raise RuntimeError(f"{name} failed (injected)")
        return {"images_per_s": 100.0, "images_per_s_min": 99.0, "images_per_s_max": 101.0, "step_ms": 1.0,
                "data_wait_share": 0.0, "repeats_run": 3, "steps_per_repeat": 3, "warmup_s": 0.1}  # fmt: skip

    real_measure = ladder._measure

    def tracking(p, *args):
        current["rung"] = p.rung.name
        return real_measure(p, *args)

    monkeypatch.setattr(ladder, "fresh_trainer", fresh)
    monkeypatch.setattr(ladder, "continue_as", cont)
    monkeypatch.setattr(ladder, "measure_steps", measure)
    monkeypatch.setattr(ladder, "_measure", tracking)
    return measured


@pytest.fixture(scope="module")
def synthetic():
    cfg = with_overrides(
        Config(),
        model={"name": "resnet50"},
        data={"source": "synthetic", "image_shape": "3x16x16", "synthetic_samples": 64},
        run={"batch_size": 16},
    )
    return cfg, load_data(cfg.data, cfg.run.seed)


def test_graphs_and_resident_continue_the_compile_rungs_trainer_and_say_so(monkeypatch, synthetic):
    cfg, bundle = synthetic
    measured = fake_gpu_ladder(monkeypatch)
    rows = ladder.run_ladder(cfg, bundle, GPU, Timing(), {}, log=lambda s: None)
    by = {r["name"]: r for r in rows}
    trainer_of = dict(measured)
    # 16 px: ResNet-50's small-image stem (3x3, stride 1) has nothing for the space-to-depth rung to rewrite
    assert by["stem_space_to_depth"]["status"] == "skipped"
    assert [r["status"] for r in rows if r["name"] != "stem_space_to_depth"] == ["ok"] * (len(ladder.RUNG_NAMES) - 1)
    assert trainer_of["cuda_graphs"] is trainer_of["compile"] is trainer_of["resident"]  # compiled once
    assert len({id(t) for t in trainer_of.values()}) == len(ladder.RUNG_NAMES) - 3  # every other rung: its own
    assert (by["cuda_graphs"]["continues"], by["resident"]["continues"]) == ("compile", "cuda_graphs")
    assert all(by[n]["continues"] == "" for n in ladder.RUNG_NAMES if n not in ("cuda_graphs", "resident"))
    # the continued Trainer was given each rung's own config: graphs on over compile default, then resident
    first, graphs, resident = trainer_of["compile"].cfgs
    assert (first.speed.compile, first.speed.cuda_graphs) == ("default", "off")
    assert (graphs.speed.compile, graphs.speed.cuda_graphs, graphs.data.resident) == ("default", "on", "off")
    assert (resident.speed.cuda_graphs, resident.data.resident) == ("on", "on")
    assert by["cuda_graphs"]["cuda_graphs"] == "on" and by["compile"]["cuda_graphs"] == "off"
    # every Trainer closed once, when the ladder let go of it (its workers and decoders go then)
    assert all(t.closed == 1 for t in trainer_of.values())


def test_a_rung_measured_alone_or_after_a_failed_parent_builds_its_own_trainer(monkeypatch, synthetic):
    cfg, bundle = synthetic
    measured = fake_gpu_ladder(monkeypatch, fail=frozenset({"compile"}))
    rows = ladder.run_ladder(cfg, bundle, GPU, Timing(), {}, only={"compile", "cuda_graphs", "resident"},
                             log=lambda s: None)  # fmt: skip
    by = {r["name"]: r for r in rows}
    assert by["compile"]["status"] == "failed" and by["cuda_graphs"]["continues"] == ""
    trainer_of = dict(measured)
    assert trainer_of["cuda_graphs"] is not trainer_of["compile"]  # a new Trainer (it compiles for itself)
    assert trainer_of["resident"] is trainer_of["cuda_graphs"]  # ... which resident then continues
    assert trainer_of["compile"].closed == 1 and trainer_of["resident"].closed == 1  # the failed one's too

    measured = fake_gpu_ladder(monkeypatch)
    [row] = ladder.run_ladder(cfg, bundle, GPU, Timing(), {}, only={"cuda_graphs"}, log=lambda s: None)
    assert row["status"] == "ok" and row["continues"] == "" and len(measured[0][1].cfgs) == 1


def test_a_rungs_row_records_the_batch_its_trainer_ran(monkeypatch, synthetic):
    """--batch-size auto on a GPU: each Trainer searches its own batch; the row said the unresolved 0."""
    cfg, bundle = synthetic
    fake_gpu_ladder(monkeypatch)
    searched = lambda c, bundle, info: FakeTrainer(with_overrides(c, run={"batch_size": 384}))  # noqa: E731
    monkeypatch.setattr(ladder, "fresh_trainer", searched)
    auto = with_overrides(cfg, run={"batch_size": 0})
    [row] = ladder.run_ladder(auto, bundle, GPU, Timing(), {"batch_size": 0}, only={"bf16"}, log=lambda s: None)
    assert row["status"] == "ok" and row["batch_size"] == 384


def test_graphs_rung_is_skipped_saying_why_where_cnnpars_graphs_cannot_replay(monkeypatch, synthetic):
    cfg, bundle = synthetic
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    plan = {
        p.rung.name: p for p in ladder.plan_ladder(with_overrides(cfg, optim={"grad_accum": 2}), GPU.device, bundle)
    }
    assert "gradient accumulation" in plan["cuda_graphs"].skip_reason
    assert plan["resident"].builds_on == "compile" and plan["resident"].cfg.speed.cuda_graphs == "off"


def small_cpu(resident: str) -> Config:
    return with_overrides(
        Config(),
        data={
            "source": "synthetic",
            "image_shape": "3x8x8",
            "synthetic_samples": 96,
            "augment": "crop+flip",
            "resident": resident,
            "loader": "fast",
            "workers": 0,
        },  # fmt: skip
        model={"name": "cnn3"},
        speed={"device": "cpu", "precision": "fp32", "channels_last": "off", "compile": "off"},
        run={"batch_size": 8, "epochs": 1, "seed": 5},
    )


def losses(trainer, steps: int = 4) -> list[float]:
    batches = training_batches(trainer, first_epoch=0)
    out = [trainer.train_step(next_group(trainer, batches))[0].item() for _ in range(steps)]  # test only: reads
    batches.close()
    return out


def test_a_trainer_continued_in_place_takes_the_steps_a_new_one_takes():
    bundle = load_data(small_cpu("off").data, 5)
    new = build_trainer(small_cpu("on"), CPU, bundle)
    continued = build_trainer(small_cpu("off"), CPU, bundle)
    assert not isinstance(continued.train_loader.loader, ResidentLoader)
    continue_as(continued, small_cpu("on"))
    assert isinstance(continued.train_loader.loader, ResidentLoader) and continued.cfg.data.resident == "on"
    assert losses(continued) == losses(new)  # the same batches and steps, to the last bit


def test_continuing_refuses_a_switch_that_needs_a_new_model_or_compile():
    bundle = load_data(small_cpu("off").data, 5)
    trainer = build_trainer(small_cpu("off"), CPU, bundle)
    for change in ({"speed": {"precision": "bf16"}}, {"speed": {"compile": "default"}}, {"run": {"batch_size": 16}}):
        with pytest.raises(ValueError, match="only .* can change in place"):
            continue_as(trainer, with_overrides(small_cpu("off"), **change))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graphs_turned_on_in_place_capture_the_compiled_step_as_a_new_graphed_trainer_does():
    gpu = DistInfo(0, 0, 1, torch.device("cuda"))

    def cfg(graphs: str) -> Config:
        return with_overrides(
            small_cpu("off"), speed={"device": "cuda", "compile": "default", "cuda_graphs": graphs, "precision": "bf16"}
        )

    bundle = load_data(cfg("off").data, 5)
    new = build_trainer(cfg("on"), gpu, bundle)
    continued = build_trainer(cfg("off"), gpu, bundle)
    continue_as(continued, cfg("on"))
    expected, got = losses(new), losses(continued)
    assert new.train_step.graphed and continued.train_step.graphed
    assert got == pytest.approx(expected, rel=1e-3)  # the same compiled step, captured the same way
    # as the ladder does it: compiled steps first, then the graphs captured from the warm module
    ladder_like = build_trainer(cfg("off"), gpu, bundle)
    losses(ladder_like, 2)
    continue_as(ladder_like, cfg("on"))
    assert all(torch.isfinite(torch.tensor(losses(ladder_like, 3)))) and ladder_like.train_step.graphed


def test_a_trainer_continued_with_other_loaders_chooses_its_training_stream_again(monkeypatch):
    """Its loaders are rebuilt (`close_loaders`, not `close`): the stream a new Trainer would pick for the
    new data settings (parallel/streams.py) replaces the old one, entered after it."""
    from cnnpar.engine import harness
    from cnnpar.engine import trainer as trainer_module
    from tests.unit.test_training_stream import FakeStreams

    fake = FakeStreams(monkeypatch)
    bundle = load_data(small_cpu("off").data, 5)
    monkeypatch.setattr(trainer_module, "decodes_on_gpu", lambda cfg, b: False)
    continued = build_trainer(small_cpu("off"), CPU, bundle)
    assert continued.stream.stream is None and fake.current is fake.default
    monkeypatch.setattr(harness, "decodes_on_gpu", lambda cfg, b: True)  # as if the new settings decoded on a GPU
    continue_as(continued, small_cpu("on"))
    assert fake.current is continued.stream.stream and fake.current.waited == ["default"]
    continued.close()
    assert fake.current is fake.default


def test_the_stem_rung_runs_on_a_gpu_only_where_the_model_has_a_stem_it_rewrites():
    cfg = with_overrides(Config(), model={"name": "resnet50"})
    [rung] = [r for r in ladder.RUNGS if r.name == "stem_space_to_depth"]
    big = load_data(with_overrides(cfg, data={"source": "synthetic", "image_shape": "3x64x64",
                                               "synthetic_samples": 4}).data)  # fmt: skip
    small = load_data(with_overrides(cfg, data={"source": "synthetic", "image_shape": "3x16x16",
                                                 "synthetic_samples": 4}).data)  # fmt: skip
    assert ladder._skip_reason(rung, cfg, torch.device("cuda"), big) == ""
    assert ladder._skip_reason(rung, cfg, torch.device("cuda"), small).startswith("the model has no stride-2 stem")
    assert ladder._skip_reason(rung, cfg, torch.device("cpu"), big) == "needs CUDA"
    assert ladder.BASELINE["speed"]["stem_space_to_depth"] == "off"  # the textbook rung is the plain stem
