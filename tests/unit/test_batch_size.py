"""The batch-size search's logic, driven by a fake measurement (throughput and memory by batch)."""

import math

import pytest

from cnnpar.cliargs import int_or_auto
from cnnpar.config import Config, RunConfig, batch_lr_factor, resolve_for_device
from cnnpar.engine.batch_size import Probe, batch_cap, choose_batch_size

pytestmark = pytest.mark.usefixtures("one_thread")  # one intra-op thread for the in-process runs (conftest)

GIB = 2**30


def fake_device(rates: dict[int, float], gib_per_image: float = 0.01, oom_above: int = 10**9):
    calls = []

    def measure(batch: int) -> Probe:
        calls.append(batch)
        if batch > oom_above:
            return Probe(batch, failed="out of memory")
        return Probe(batch, rates[batch], int(batch * gib_per_image * GIB))

    return measure, calls


def test_doubles_while_throughput_rises_and_stops_at_saturation():
    measure, calls = fake_device({64: 30_000, 128: 50_000, 256: 70_000, 512: 80_000, 1024: 82_000})
    choice = choose_batch_size(measure, memory_budget=100 * GIB, cap=10_000)
    assert choice.batch == 512  # 1024 gains 2.5 %, under the 10 % a doubling must buy
    assert calls == [64, 128, 256, 512, 1024]
    assert "saturated" in choice.stopped and "1024" in choice.line() and "82,000" in choice.line()


def test_a_doubling_that_gains_under_10_percent_is_not_kept():
    # the probe's figures for ResNet-18 at 32 px on an H200 (benchmarks/results/2026-12-01-h200/call-a):
    # with a 5 % rule 2048 (+5.1 %) was kept and the run lost 5 points of accuracy at 10 epochs
    rates = {64: 28_330, 128: 41_746, 256: 51_746, 512: 59_532, 1024: 66_199, 2048: 69_573}
    choice = choose_batch_size(fake_device(rates)[0], memory_budget=100 * GIB, cap=3125)
    assert choice.batch == 1024 and "less than 10 % faster" in choice.stopped


def test_memory_margin_and_oom_end_the_search_at_the_last_size_that_fitted():
    rates = {b: float(b) for b in (64, 128, 256, 512, 1024)}  # always faster
    by_margin = choose_batch_size(fake_device(rates, gib_per_image=0.1)[0], memory_budget=30 * GIB, cap=10_000)
    assert by_margin.batch == 256 and "over the margin" in by_margin.stopped  # 512 images need 51 GiB
    by_oom = choose_batch_size(fake_device(rates, oom_above=128)[0], memory_budget=100 * GIB, cap=10_000)
    assert by_oom.batch == 128 and "out of memory" in by_oom.stopped


def test_small_data_sets_keep_enough_steps_per_epoch():
    assert batch_cap(50_000, 1) == 3125 and batch_cap(50_000, 4) == 781 and batch_cap(10, 1) == 1
    measure, calls = fake_device({b: float(b) for b in (64, 128, 256, 512)})
    choice = choose_batch_size(measure, memory_budget=100 * GIB, cap=batch_cap(6_000, 1))  # cap 375
    assert choice.batch == 256 and calls == [64, 128, 256] and "steps per epoch" in choice.stopped
    tiny = choose_batch_size(measure, memory_budget=100 * GIB, cap=batch_cap(1_000, 1))  # cap 62
    assert tiny.batch == 64 and tiny.probes == []  # nothing measured: the data set decides


def test_a_model_too_large_for_64_halves_until_it_fits():
    measure, calls = fake_device({b: float(b) for b in (8, 16, 32, 64)}, oom_above=16)
    choice = choose_batch_size(measure, memory_budget=100 * GIB, cap=10_000)
    assert choice.batch == 16 and calls == [64, 32, 16]


def test_lr_follows_the_batch_by_the_optimizers_rule():
    assert batch_lr_factor("sgd", 512) == 8.0
    assert batch_lr_factor("adamw", 512) == pytest.approx(math.sqrt(8))
    assert batch_lr_factor("adamw", 64) == 1.0


def test_auto_is_a_word_on_the_command_line_and_64_on_the_cpu():
    assert int_or_auto("auto") == 0 and int_or_auto("128") == 128
    assert Config().run.batch_size == 0  # auto by default
    cpu = resolve_for_device(Config(), "cpu", bf16_ok=False)
    assert cpu.run.batch_size == 64
    gpu = resolve_for_device(Config(), "cuda", bf16_ok=True)
    assert gpu.run.batch_size == 0  # measured by the trainer on the device
    fixed = resolve_for_device(Config(run=RunConfig(batch_size=32)), "cuda", bf16_ok=True)
    assert fixed.run.batch_size == 32


def search_instead_of(monkeypatch, fake_search) -> None:
    """The trainer searches its batch (as on a GPU) with `fake_search` in place of the device probe."""
    import cnnpar.engine.trainer as trainer_mod
    from cnnpar.presets import with_overrides

    real_resolve = trainer_mod.resolve_for
    monkeypatch.setattr(
        trainer_mod, "resolve_for", lambda cfg, device: with_overrides(real_resolve(cfg, device), run={"batch_size": 0})
    )
    monkeypatch.setattr(trainer_mod, "search_on_device", fake_search)


def test_the_trainer_trains_the_searched_batch_with_the_lr_scaled(monkeypatch, tmp_path):
    """The trainer's glue, with the device search replaced (it needs CUDA): the loaders, the lr and the
    stored config follow the batch the search chose, and the start of the run says how it was chosen."""
    import cnnpar.engine.trainer as trainer_mod
    from cnnpar.dist import init_distributed
    from cnnpar.engine.batch_size import BatchChoice
    from cnnpar.presets import with_overrides

    seen = {}

    def fake_search(raw_model, cfg, info, shape, num_classes, train_samples, cuda_graphs, gpu_decoder):
        seen.update(shape=shape, samples=train_samples, graphs=cuda_graphs, gpu_decoder=gpu_decoder)
        return BatchChoice(256, "batch 512 is less than 5 % faster than 256", [Probe(64, 1000.0), Probe(256, 3000.0)])

    search_instead_of(monkeypatch, fake_search)
    cfg = with_overrides(
        Config(),
        data={"source": "synthetic", "image_shape": "3x8x8", "synthetic_samples": 2048, "val_fraction": 0.25},
        speed={"device": "cpu"},
        run={"epochs": 1, "out_dir": str(tmp_path), "name": "auto", "progress": False},
    )
    lines = []
    tr = trainer_mod.Trainer(cfg, init_distributed("cpu", debug_single=True), log=lambda *a, **k: lines.append(a[0]))
    assert seen == {"shape": (3, 8, 8), "samples": 1536, "graphs": False, "gpu_decoder": False}
    assert tr.cfg.run.batch_size == 256 and len(tr.train_loader) == 1536 // 256
    assert tr.cfg.optim.lr == pytest.approx(0.002 * 2)  # AdamW: sqrt(256 / 64)
    tr.fit()
    assert any(ln.startswith("batch size auto: 256 (measured 64: 1,000 img/s, 256: 3,000 img/s") for ln in lines)
    assert any("lr 0.002 at batch 64 x square root (AdamW) of 256/64 = 0.004" in ln for ln in lines)
    stored = (tmp_path / "auto" / "config.toml").read_text()
    assert "batch_size = 256" in stored and "# requested: run.batch_size = auto" in stored
    # --lr auto (AdamW's 0.002 at batch 64), stored as asked: a search again scales the optimizer's own lr once more
    assert "# requested: optim.lr = auto" in stored and "# resolved: optim.lr = 0.004" in stored


def test_the_search_times_the_trainers_own_step_on_the_rewritten_stem(monkeypatch, tmp_path):
    """The search once timed a step built by hand (no clipping, label smoothing, schedule or weight average) on
    the model before parallelize swapped its stem, while the doctor's search timed the rewritten one: the two
    could pick different batches, and neither timed the step that trains. The stem is forced on here (auto
    turns it on with CUDA only): a ResNet at 64 px has the 7x7 stem it rewrites."""
    import torch

    import cnnpar.engine.trainer as trainer_mod
    from cnnpar.dist import init_distributed
    from cnnpar.engine.batch_size import BatchChoice, probe_step
    from cnnpar.parallel.stem import SpaceToDepthConv2d
    from cnnpar.presets import with_overrides

    seen = {}

    def fake_search(raw_model, cfg, info, shape, num_classes, train_samples, cuda_graphs, gpu_decoder):
        seen["step"] = probe_step(raw_model, cfg, info.device, cuda_graphs)
        return BatchChoice(32, "faked")

    search_instead_of(monkeypatch, fake_search)
    cfg = with_overrides(
        Config(),
        data={"source": "synthetic", "image_shape": "3x64x64", "synthetic_samples": 256, "val_fraction": 0.25},
        model={"name": "resnet18"},
        optim={"grad_clip": 1.5, "label_smoothing": 0.1, "ema": 0.9, "lookahead": True},
        speed={"device": "cpu", "stem_space_to_depth": "on"},
        run={"epochs": 1, "out_dir": str(tmp_path), "name": "s", "progress": False, "tensorboard": False},
    )
    tr = trainer_mod.Trainer(cfg, init_distributed("cpu", debug_single=True), log=lambda *a, **k: None)
    try:
        probe, trains = seen["step"], tr.train_step
        stems = [isinstance(m, SpaceToDepthConv2d) for m in (probe.raw_model.conv1, trains.raw_model.conv1)]
        assert stems == [True, True]
        assert (probe.grad_clip, probe.label_smoothing) == (trains.grad_clip, trains.label_smoothing) == (1.5, 0.1)
        assert probe.average is not None and probe.average.cfg.lookahead and probe.scheduler is not None
        assert probe.precision.kind == trains.precision.kind
        probe([(torch.randn(2, 3, 64, 64), torch.tensor([0, 1]))])  # a step of it runs, average included
        assert probe.average.started
    finally:
        tr.close()


@pytest.mark.gpu
def test_the_search_on_a_real_gpu_measures_growing_batches():
    import torch

    from cnnpar.dist import init_distributed
    from cnnpar.engine.batch_size import search_on_device
    from cnnpar.models import build_model

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    cfg = resolve_for_device(Config(), "cuda", bf16_ok=True)
    info = init_distributed("cuda", debug_single=True)
    model = build_model("resnet18", 3, 10, 32)
    choice = search_on_device(model, cfg, info, (3, 32, 32), 10, 50_000, cuda_graphs=True)
    assert choice.probes[0].batch == 64 and all(p.images_per_s > 0 for p in choice.probes if not p.failed)
    assert choice.batch >= 128, choice.line()  # ResNet-18 at 32 px leaves an H200 idle at 64
    assert all(p.peak_bytes > 0 for p in choice.probes if not p.failed)
    print(choice.line())


def test_photos_decoded_on_the_gpu_or_photo_sized_inputs_start_the_search_at_256():
    from cnnpar.engine.batch_size import PHOTO_START, search_start

    assert search_start(False, 10_000, 16) == (64, "")
    assert search_start(False, 10_000, 32) == (64, "")  # CIFAR-sized: the search from 64, as before
    start, why = search_start(True, 10_000, 32)  # the decoder's rule, whatever the size
    assert start == PHOTO_START == 256 and "decoded on the GPU" in why
    assert search_start(True, 200, 224)[0] == 64  # too few photos for 16 steps of 256: the usual search
    # a prepared store (or arrays) of 224-px photos: the same start, and the line says why
    start, why = search_start(False, 10_000, 224)
    assert start == 256 and "photo-sized (224 px)" in why
    assert search_start(False, 200, 224)[0] == 64 and search_start(False, 10_000, 127)[0] == 64
    assert search_start(False, 10_000, 128)[0] == 256  # the boundary is photo-sized
    # the device-data probe saw +8.3 % from 128 to 256 (call X): from 64 the search stops at 128
    rates = {64: 3_837.0, 128: 4_358.0, 256: 4_719.0, 512: 4_950.0}
    assert choose_batch_size(fake_device(rates)[0], memory_budget=100 * GIB, cap=1_200).batch == 128
    measure, calls = fake_device(rates)
    choice = choose_batch_size(measure, memory_budget=100 * GIB, cap=1_200, start=start)
    assert choice.batch == 256 and calls == [256, 512]  # 512 gains 4.9 %: kept at 256
    measure, calls = fake_device(rates, oom_above=128)  # a smaller GPU: halves until it fits
    assert choose_batch_size(measure, memory_budget=100 * GIB, cap=1_200, start=start).batch == 128
    assert calls == [256, 128]
    measure, calls = fake_device(rates)  # just enough photos for 256: measured once, for its memory
    edge = choose_batch_size(measure, memory_budget=100 * GIB, cap=256, start=start)
    assert edge.batch == 256 and calls == [256] and "steps per epoch" in edge.stopped
    measure, calls = fake_device(rates, gib_per_image=0.5)  # over the margin at 256: 128 is tried
    assert choose_batch_size(measure, memory_budget=100 * GIB, cap=256, start=start).batch == 128


def test_the_search_starts_from_the_shorter_side_of_the_models_input(monkeypatch):
    # search_on_device, as the Trainer calls it: the input's shape decides the start, not a default
    from cnnpar.engine import batch_size as bs

    measured = []
    monkeypatch.setattr(bs, "device_probe", lambda *a: fake_device({b: 1000.0 * b for b in (64, 128, 256, 512)})[0])
    monkeypatch.setattr(bs, "memory_budget", lambda device: 100 * GIB)
    monkeypatch.setattr(
        bs,
        "choose_batch_size",
        lambda measure, budget, cap, start: measured.append(start) or bs.BatchChoice(start, "stub"),
    )
    info = type("Info", (), {"world_size": 1, "distributed": False, "device": None})()
    for shape in ((3, 224, 160), (3, 96, 224), (3, 32, 32)):
        bs.search_on_device(None, Config(), info, shape, 10, 50_000, cuda_graphs=False)
    assert measured == [256, 64, 64]  # 160 px and 224 px -> photo-sized; 96 px is the shorter side; 32 px
    assert "photo-sized (160 px)" in bs.search_on_device(None, Config(), info, (3, 224, 160), 10, 50_000, False).started


@pytest.mark.parametrize("decode, gpu_decoder", [("gpu", True), ("cpu", False)])
def test_the_trainer_tells_the_search_whether_a_gpu_decoder_feeds_the_step(monkeypatch, tmp_path, decode, gpu_decoder):
    import cnnpar.engine.trainer as trainer_mod
    from cnnpar.dist import init_distributed
    from cnnpar.engine.batch_size import BatchChoice
    from cnnpar.presets import with_overrides
    from tests.unit.test_hybrid_decode import photo_folder

    seen = {}

    def fake_search(*args, gpu_decoder, **kw):
        seen["gpu_decoder"] = gpu_decoder
        return BatchChoice(4, "a stand-in", [Probe(4, 10.0)], started="4: a stand-in")

    search_instead_of(monkeypatch, fake_search)
    cfg = with_overrides(
        Config(),
        data={"source": str(photo_folder(tmp_path / "photos")), "image_size": 24, "decode": decode, "workers": 0},
        model={"name": "cnn3"},
        speed={"device": "cpu"},
        run={"epochs": 1, "out_dir": str(tmp_path / "runs"), "progress": False},
    )
    tr = trainer_mod.Trainer(cfg, init_distributed("cpu", debug_single=True), log=lambda *a, **k: None)
    try:
        assert seen == {"gpu_decoder": gpu_decoder}
        assert tr.cfg.run.batch_size == 4 and "started at 4: a stand-in" in tr.batch_line
    finally:
        tr.close()


def test_a_search_that_measured_nothing_says_so():
    """A split too small for any trial printed `(measured ; stopped: ...)` on an H200 (call ZZZZP's doctor)."""
    from cnnpar.engine.batch_size import BatchChoice

    line = BatchChoice(64, "the data set allows no larger batch").line()
    assert line == "batch size auto: 64 (none measured; stopped: the data set allows no larger batch)"


def test_slow_rates_keep_three_figures_where_whole_numbers_read_zero():
    """ResNet-50 at 224 px on a laptop CPU trains under 1 img/s: the search's line, the epoch line and `done:` printed
    "0 img/s" (`,.0f`). They print through console.rate_text."""
    from cnnpar.console import rate_text
    from cnnpar.engine.batch_size import BatchChoice

    assert [rate_text(x) for x in (0.0, 0.4213, 7.5, 99.4, 100.0, 85215.4)] == [
        "0",
        "0.421",
        "7.5",
        "99.4",
        "100",
        "85,215",
    ]
    line = BatchChoice(64, "the CPU's fixed size", [Probe(64, 0.4213), Probe(128, failed="out of memory")]).line()
    assert "measured 64: 0.421 img/s, 128: out of memory" in line


@pytest.mark.parametrize(
    ("error", "fits"),
    [
        (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), False),
        (RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED"), False),
        (RuntimeError("CUDA error: device-side assert triggered"), None),  # not memory: still raised
    ],
)
def test_a_probe_whose_allocation_fails_outside_torchs_allocator_is_a_size_that_does_not_fit(monkeypatch, error, fits):
    """The run's own line calls cuBLAS's and cuDNN's failed allocations out of memory (engine/memory_full); the
    search took only torch.cuda.OutOfMemoryError as a size that does not fit, and such a failure in a probe ended
    the run's start in a traceback. The device's calls are stubbed: the probe runs on the CPU."""
    import torch

    import cnnpar.engine.batch_size as bs
    from cnnpar.dist import DistInfo

    def step(batches):
        raise error

    monkeypatch.setattr(bs, "probe_step", lambda *a: step)
    monkeypatch.setattr(bs, "free_device_memory", lambda device: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 0)
    info = DistInfo(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    measure = bs.device_probe(torch.nn.Linear(1, 1), Config(), info, (1, 8, 8), 10, cuda_graphs=False)
    if fits is None:
        with pytest.raises(RuntimeError, match="device-side assert"):
            measure(64)
    else:
        assert measure(64) == Probe(64, failed="out of memory")
