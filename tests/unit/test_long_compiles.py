"""The long compiles (--compile-tiling, --compile-tuning) at "auto": on only where a run is long enough to repay
them (presets.long_compiles_default), settled once the data and batch size are known, said on a line, stored."""

from __future__ import annotations

import pytest
import torch

from cnnpar.config import Config, load_toml
from cnnpar.dist import DistInfo
from cnnpar.engine.harness import build_trainer
from cnnpar.engine.resolved import long_compiles_resolved
from cnnpar.engine.trainer import Trainer
from cnnpar.presets import LONG_RUN_IMAGES, long_compiles_default, with_overrides

pytestmark = pytest.mark.usefixtures("one_thread")  # one intra-op thread for the in-process runs (conftest)

CPU = DistInfo(0, 0, 1, torch.device("cpu"))


def resnet50_on_cuda(epochs: int, batch: int = 256, **speed) -> Config:
    return with_overrides(
        Config(),
        model={"name": "resnet50"},
        speed={"device": "cuda", "compile": "default", **speed},
        run={"epochs": epochs, "batch_size": batch},
    )


def test_the_rule_turns_them_on_only_for_a_long_compiled_resnet50_run_on_cuda():
    long = LONG_RUN_IMAGES
    assert long_compiles_default("resnet50", "cuda", "default", long)[0]
    assert long_compiles_default("resnet50", "cuda", "reduce-overhead", 10 * long)[0]
    assert not long_compiles_default("resnet50", "cuda", "default", long - 1)[0]
    assert not long_compiles_default("resnet50", "cpu", "default", 10 * long)[0]
    assert not long_compiles_default("resnet18", "cuda", "default", 10 * long)[0]  # measured not to pay there
    assert not long_compiles_default("resnet50", "cuda", "max-autotune", 10 * long)[0]  # it tunes on its own
    on, why = long_compiles_default("resnet50", "cuda", "default", 115_200_000)
    assert on and why.startswith("auto: 115,200,000 images a process, at least 40,000,000: ResNet-50's step ran")
    on, why = long_compiles_default("resnet50", "cuda", "default", 72_000)
    assert not on and why.startswith("auto: 72,000 images a process, under the 40,000,000 from which")


def test_a_process_counts_its_share_of_the_samples_over_all_epochs_or_what_max_steps_leaves():
    imagenet = 1_281_167
    cfg, line = long_compiles_resolved(resnet50_on_cuda(epochs=90), imagenet, world_size=1)
    assert (cfg.speed.compile_tiling, cfg.speed.compile_tuning) == ("on", "on")
    assert line == (
        "long compiles: --compile-tiling on, --compile-tuning on (auto: 115,305,030 images a process, at least "
        "40,000,000: ResNet-50's step ran 1.085-1.088x as fast on an H200 for up to ~7 minutes more of compile)"
    )
    # the same 90 epochs over 8 processes: each trains an eighth, under the threshold
    cfg, line = long_compiles_resolved(resnet50_on_cuda(epochs=90), imagenet, world_size=8)
    assert (cfg.speed.compile_tiling, cfg.speed.compile_tuning) == ("off", "off")
    assert "14,413,050 images a process" in line and "--compile-tiling off, --compile-tuning off (" in line
    # max_steps stops each epoch early: 10 steps of 256 a process, 90 times
    short = with_overrides(resnet50_on_cuda(epochs=90), run={"max_steps": 10})
    cfg, line = long_compiles_resolved(short, imagenet, world_size=1)
    assert cfg.speed.compile_tiling == "off" and "230,400 images a process" in line


def test_a_choice_of_the_users_stands_and_only_the_auto_one_is_resolved():
    cfg, line = long_compiles_resolved(resnet50_on_cuda(epochs=90, compile_tiling="off"), 1_281_167, 1)
    assert (cfg.speed.compile_tiling, cfg.speed.compile_tuning) == ("off", "on")
    assert line.startswith("long compiles: --compile-tuning on (auto: 115,305,030 images")
    both = resnet50_on_cuda(epochs=1, compile_tiling="on", compile_tuning="off")
    assert long_compiles_resolved(both, 1_281_167, 1) == (both, "")


def test_nothing_is_said_where_there_is_nothing_to_weigh_but_auto_is_still_resolved():
    for cfg in (
        with_overrides(resnet50_on_cuda(epochs=90), speed={"device": "cpu"}),
        with_overrides(resnet50_on_cuda(epochs=90), speed={"compile": "off"}),
    ):
        resolved, line = long_compiles_resolved(cfg, 1_281_167, 1)
        assert line == ""
        assert (resolved.speed.compile_tiling, resolved.speed.compile_tuning) == ("off", "off")


def small_cpu(**speed) -> Config:
    return with_overrides(
        Config(),
        data={"source": "synthetic", "image_shape": "3x8x8", "synthetic_samples": 64},
        model={"name": "cnn3"},
        speed={"device": "cpu", "precision": "fp32", "channels_last": "off", "compile": "default", **speed},
        run={"batch_size": 8, "epochs": 1},
    )


def test_a_run_the_rule_turns_them_on_for_compiles_with_both_and_stores_on_beside_the_requested_auto(
    monkeypatch, tmp_path
):
    from cnnpar.parallel import apply

    seen = []
    monkeypatch.setattr(apply.torch, "compile", lambda model, **kw: seen.append(kw) or model)
    monkeypatch.setattr("cnnpar.presets.long_compiles_default", lambda *a: (True, "auto: on, a test's rule"))
    trainer = Trainer(with_overrides(small_cpu(), run={"out_dir": str(tmp_path), "progress": False}), CPU)
    trainer.fit()  # as `cnnpar train` runs it (cli.py)
    [kw] = seen
    options = kw["options"]
    assert options["coordinate_descent_tuning"] and options["triton.prefer_nd_tiling"]
    stored = (trainer.run_dir / "config.toml").read_text()
    assert "# requested: speed.compile_tiling = 'auto'" in stored
    assert "# requested: speed.compile_tuning = 'auto'" in stored
    assert load_toml(trainer.run_dir / "config.toml").speed.compile_tiling == "on"


def test_a_measuring_trainer_compiles_as_a_short_run_even_for_a_long_config_but_measures_an_explicit_on(monkeypatch):
    # the doctor, bench, ladder, tuner and profiler time a few steps of the user's config (build_trainer)
    from cnnpar.parallel import apply

    seen = []
    monkeypatch.setattr(apply.torch, "compile", lambda model, **kw: seen.append(kw) or model)
    monkeypatch.setattr("cnnpar.presets.long_compiles_default", lambda *a: (True, "auto: on, a test's rule"))
    build_trainer(small_cpu(), CPU).close()
    build_trainer(small_cpu(compile_tiling="on"), CPU).close()
    assert seen == [{"mode": None}, {"options": {"triton.prefer_nd_tiling": True, "max_autotune_pointwise": True}}]
    trainer = Trainer(small_cpu(), CPU, log=lambda *a: None)  # the same config trained: the rule decides
    trainer.close()
    assert seen[-1]["options"]["coordinate_descent_tuning"] and seen[-1]["options"]["triton.prefer_nd_tiling"]


def test_time_to_accuracy_compiles_as_cnnpar_train_would_for_the_run_it_trains(monkeypatch):
    # time to accuracy trains the whole run its config names, so its figures are that run's only where it compiles
    # as `cnnpar train` would: build_trainer's measuring "off" left a long ResNet-50 run's tiling out on CUDA
    from cnnpar.bench import tta
    from cnnpar.data import load_data
    from cnnpar.parallel import apply

    seen = []
    monkeypatch.setattr(apply.torch, "compile", lambda model, **kw: seen.append(kw) or model)
    monkeypatch.setattr("cnnpar.presets.long_compiles_default", lambda *a: (True, "auto: on, a test's rule"))
    monkeypatch.setattr(Trainer, "warm_up_compile", lambda self: None)  # the compile call is what is checked
    cfg = with_overrides(small_cpu(), run={"epochs": 1})
    tta.time_to_accuracy(cfg, load_data(cfg.data), CPU, 0.01, seed=0)
    assert seen[-1]["options"]["coordinate_descent_tuning"] and seen[-1]["options"]["triton.prefer_nd_tiling"]


def test_an_auto_the_rule_turns_on_keeps_tiling_off_on_a_torch_without_its_options(monkeypatch):
    from cnnpar.parallel import apply

    have = apply.inductor_option_names()
    monkeypatch.setattr(apply, "inductor_option_names", lambda: have - {"triton.prefer_nd_tiling"})
    cfg, line = long_compiles_resolved(resnet50_on_cuda(epochs=90), 1_281_167, 1)
    assert (cfg.speed.compile_tiling, cfg.speed.compile_tuning) == ("off", "on")
    assert line.startswith("long compiles: --compile-tiling off, --compile-tuning on (auto: 115,305,030")
    assert "; tiling off: torch " in line and "inductor has no triton.prefer_nd_tiling)" in line
    # an explicit "on" still fails, naming the field (apply.compile_options), as before


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_a_long_resnet50_run_resolves_both_on_says_so_and_compiles_with_both(monkeypatch):
    # the rule on a real CUDA device's resolution (resolve_for: device, compile auto -> default); not compiled
    from cnnpar.parallel import apply

    seen = []
    monkeypatch.setattr(apply.torch, "compile", lambda model, **kw: seen.append(kw) or model)
    cfg = with_overrides(
        Config(),
        data={"source": "synthetic", "image_shape": "3x64x64", "synthetic_samples": 512},
        model={"name": "resnet50"},
        run={"batch_size": 64, "epochs": 200_000, "progress": False},
    )
    trainer = Trainer(cfg, DistInfo(0, 0, 1, torch.device("cuda")), log=lambda *a: None)
    try:
        assert (trainer.cfg.speed.compile, trainer.cfg.speed.compile_tiling) == ("default", "on")
        assert trainer.cfg.speed.compile_tuning == "on"
        assert trainer.long_compiles_line.startswith("long compiles: --compile-tiling on, --compile-tuning on (auto: ")
        [kw] = seen
        assert kw["options"]["coordinate_descent_tuning"] and kw["options"]["triton.prefer_nd_tiling"]
    finally:
        trainer.close()


def test_the_doctor_says_when_train_would_compile_longer_than_what_it_timed():
    from cnnpar.doctor.run import long_compiles_note

    asked = resnet50_on_cuda(epochs=90)
    measured = resnet50_on_cuda(epochs=90, compile_tiling="off", compile_tuning="off")  # as build_trainer ran it
    note = long_compiles_note(asked, measured, 1_281_167)
    assert note.startswith("doctor: the figures below are the default compile's; `cnnpar train` with this config")
    assert note.endswith("--compile-tiling on, --compile-tuning on (auto: 115,305,030 images a process, at least "
                         "40,000,000: ResNet-50's step ran 1.085-1.088x as fast on an H200 for up to ~7 minutes more "
                         "of compile)")  # fmt: skip
    short = resnet50_on_cuda(epochs=3, compile_tiling="off", compile_tuning="off")
    assert long_compiles_note(resnet50_on_cuda(epochs=3), short, 1_281_167) == ""  # train would not either
    off = resnet50_on_cuda(epochs=90, compile_tiling="off", compile_tuning="off")
    assert long_compiles_note(off, measured, 1_281_167) == ""  # the user's own off: the doctor timed what runs
    on = resnet50_on_cuda(epochs=90, compile_tiling="on", compile_tuning="on")
    assert long_compiles_note(on, on, 1_281_167) == ""  # an explicit on is measured as asked
    # tiling asked on (and measured on), tuning auto: only the tuning's auto is weighed, and only if it turns on
    mixed = resnet50_on_cuda(epochs=90, compile_tiling="on")
    mixed_measured = resnet50_on_cuda(epochs=90, compile_tiling="on", compile_tuning="off")
    assert long_compiles_note(mixed, mixed_measured, 1_281_167).endswith("--compile-tuning on (auto: 115,305,030 "
                                                                          "images a process, at least 40,000,000: "
                                                                          "ResNet-50's step ran 1.085-1.088x as fast "
                                                                          "on an H200 for up to ~7 minutes more of "
                                                                          "compile)")  # fmt: skip
    mixed_short = resnet50_on_cuda(epochs=3, compile_tiling="on", compile_tuning="off")
    assert long_compiles_note(with_overrides(mixed, run={"epochs": 3}), mixed_short, 1_281_167) == ""
    # `--nproc 8`: train would count an eighth of the samples a process, under the threshold
    eight = with_overrides(asked, dist={"nproc": 8})
    assert long_compiles_note(eight, with_overrides(measured, dist={"nproc": 8}), 1_281_167) == ""


def test_the_doctor_prints_the_note_after_its_baseline(monkeypatch, tmp_path):
    from cnnpar.doctor import run as doctor_run

    seen = []
    monkeypatch.setattr(
        doctor_run, "long_compiles_note", lambda asked, measured, n: seen.append((asked, measured, n)) or "NOTE"
    )
    cfg = with_overrides(
        Config(),
        data={"source": "synthetic", "image_shape": "3x16x16", "synthetic_samples": 32, "workers": 0},
        model={"name": "cnn3"},
        speed={"device": "cpu"},
        run={"batch_size": 8},
    )
    lines = []
    opts = doctor_run.DoctorOptions(warmup=1, steps=2, try_top=0, report_dir=str(tmp_path / "rep"))
    doctor_run.run_doctor(cfg, opts, log=lines.append)
    assert "NOTE" in lines
    [(asked, measured, n)] = seen
    from cnnpar.data import load_data

    # the user's config as asked, and the training split's samples (the rest of the 32 validates)
    assert asked == cfg and n == len(load_data(cfg.data, cfg.run.seed).train) < 32
    assert measured.speed.device == "cpu" and measured.run.batch_size == 8  # the measuring trainer's, resolved
    assert (measured.speed.compile_tiling, measured.speed.compile_tuning) == ("off", "off")
