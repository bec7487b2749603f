"""DeviceFeeder's decode thread: same batches as in line, errors reach the training thread, and an
abandoned iterator stops its thread. On the CPU the thread runs without streams or events."""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace

import pytest
import torch

from cnnpar.config import resolve_decode
from cnnpar.data.loader import DeviceFeeder
from cnnpar.data.transforms import DeviceTransform
from cnnpar.errors import DataError

pytestmark = pytest.mark.usefixtures("one_thread")  # one intra-op thread for the in-process runs (conftest)


@dataclass
class Raw:
    pixels: torch.Tensor
    index: torch.Tensor


class Decoder:
    """Stands in for GpuDecoder: raw batch in, uint8 images out; fails on a chosen batch."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at, self.calls = fail_at, 0

    def __call__(self, raw: Raw) -> torch.Tensor:
        self.calls += 1
        if self.fail_at is not None and int(raw.index[0]) == self.fail_at:
            raise DataError(f"photos/{self.fail_at}.jpg: cannot decode as an image")
        return raw.pixels


def batches(n: int = 6, size: int = 4):
    g = torch.Generator().manual_seed(0)
    for b in range(n):
        x = torch.randint(0, 256, (size, 3, 8, 8), generator=g, dtype=torch.uint8)
        yield Raw(x, torch.arange(b * size, (b + 1) * size)), torch.arange(size) + b


def feeder(decoder, threaded: bool, n: int = 6) -> DeviceFeeder:
    transform = DeviceTransform((0.5,) * 3, (0.25,) * 3, "none", False, torch.device("cpu"))
    return DeviceFeeder(list(batches(n)), None, transform, torch.device("cpu"), True, False, decoder, threaded)


def feeder_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "cnnpar-feeder"]


def test_threaded_feeder_yields_what_the_inline_feeder_yields():
    inline = list(feeder(Decoder(), threaded=False))
    threaded = list(feeder(Decoder(), threaded=True))
    assert len(threaded) == len(inline) == 6
    for (x1, y1), (x2, y2) in zip(inline, threaded):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not feeder_threads()


def test_a_decode_error_in_the_thread_reaches_the_training_thread():
    it = iter(feeder(Decoder(fail_at=8), threaded=True))
    next(it), next(it)
    with pytest.raises(DataError, match=r"photos/8\.jpg"):
        next(it)
    assert not feeder_threads()


def test_an_abandoned_iterator_stops_its_thread():
    dec = Decoder()
    it = iter(feeder(dec, threaded=True))
    next(it)
    del it  # as warm_up_compile does after one batch
    assert not feeder_threads()
    assert dec.calls < 6  # it stopped instead of decoding the whole epoch


class PassesCounted(list):
    """A loader's stand-in that counts the passes made of it (iter: where a DataLoader starts its workers)."""

    passes = 0

    def __iter__(self):
        self.passes += 1
        return super().__iter__()


def test_an_inline_feeders_pass_is_made_when_it_is_iterated_not_at_its_first_batch():
    """The step loop times each `next` as data wait: a DataLoader's workers that started (or, persistent, took the
    epoch) at the first `next` instead of at iter(feeder) put their start into epoch 1's data wait, and, without
    persistent workers, into every epoch's and evaluation's. (A threaded feeder's pipeline is started by `prepare`.)"""
    loader = PassesCounted(batches())
    transform = DeviceTransform((0.5,) * 3, (0.25,) * 3, "none", False, torch.device("cpu"))
    fed = DeviceFeeder(loader, None, transform, torch.device("cpu"), True, False, Decoder(), False)
    it = iter(fed)
    assert loader.passes == 1
    assert len([next(it)] + list(it)) == 6 and loader.passes == 1


def test_decode_rule():
    # On an H200 the JPEG engines ("hardware") beat nvJPEG in every call that ran both, and nvJPEG beat
    # the CPU workers and nvImageCodec: the engines where the GPU has them, else nvJPEG, else the CPU
    decoder, why = resolve_decode("auto", cuda=True, engines="")
    assert decoder == "hardware" and "4,570-5,484 img/s against nvJPEG's 4,318-5,056" in why
    decoder, why = resolve_decode("auto", cuda=True, engines="no hardware JPEG decoder on this GPU")
    assert decoder == "gpu" and "without JPEG engines for nvJPEG (no hardware JPEG decoder on this GPU)" in why
    assert resolve_decode("auto", cuda=True)[0] == "gpu"  # not asked (not a folder of photos)
    assert resolve_decode("auto", cuda=False, engines="") == ("cpu", "auto: no CUDA device")
    assert resolve_decode("nvimgcodec", cuda=True, engines="") == ("nvimgcodec", "as asked")
    assert resolve_decode("gpu", cuda=True, engines="") == ("gpu", "as asked")
    assert resolve_decode("hardware", cuda=True) == ("hardware", "as asked")


def test_the_engines_are_asked_about_only_for_a_folder_of_photos_on_a_cuda_device(tmp_path, monkeypatch):
    from cnnpar.config import Config, DataConfig
    from cnnpar.data import nvjpeg_hw
    from cnnpar.parallel.precision import resolve_for

    asked = []
    monkeypatch.setattr(nvjpeg_hw, "hardware_decoder_available", lambda i: asked.append(i) or "")
    folder = tmp_path / "photos"
    folder.mkdir()
    cuda0 = torch.device("cuda", 0)
    assert nvjpeg_hw.jpeg_engines("auto", str(folder), cuda0) == "" and asked == [0]
    assert nvjpeg_hw.jpeg_engines("gpu", str(folder), cuda0) is None  # a decoder was chosen
    assert nvjpeg_hw.jpeg_engines("auto", str(tmp_path / "x.npz"), cuda0) is None  # not a folder
    assert nvjpeg_hw.jpeg_engines("auto", str(folder), torch.device("cpu")) is None
    assert asked == [0]
    # the one resolution every command uses passes the answer on (on the CPU: not asked, the CPU decodes)
    cfg = Config(data=DataConfig(source=str(folder)))
    assert resolve_for(cfg, torch.device("cpu")).data.decode == "cpu" and asked == [0]


def test_a_run_from_photos_says_which_decoder_and_how_to_decode_once(tmp_path, monkeypatch):
    from PIL import Image

    from cnnpar.config import Config, DataConfig, ModelConfig
    from cnnpar.data import load_data, nvjpeg_hw
    from cnnpar.data.cpu_decode import cpu_jpeg_line
    from cnnpar.data.loader import decode_line
    from cnnpar.dist import DistInfo

    for c in ("cat", "dog"):
        (tmp_path / "photos" / c).mkdir(parents=True)
        for name in ("a.jpg", "b.jpg"):  # two a class: the hold-out leaves each class something to train on
            Image.new("RGB", (40, 30), (10, 200, 30)).save(tmp_path / "photos" / c / name)
    cfg = Config(data=DataConfig(source=str(tmp_path / "photos"), image_size=32), model=ModelConfig(name="cnn3"))
    cfg = replace(cfg, run=replace(cfg.run, epochs=7, name="mine"))  # the user's own flags, and a run name
    cpu = DistInfo(0, 0, 1, torch.device("cpu"))
    line = decode_line(cfg, load_data(cfg.data), cpu)
    assert line.startswith("decode: cpu (in ") and " worker process(es) (auto: the usable cores " in line
    assert "; auto: no CUDA device)" in line
    # --workers 0 decodes in the main process: the line had said "in worker processes" there too
    alone = replace(cfg, data=replace(cfg.data, workers=0))
    assert decode_line(alone, load_data(alone.data), cpu).startswith(
        "decode: cpu (in the main process (--workers 0); auto: no CUDA device)"
    )
    assert f"; JPEGs: {cpu_jpeg_line()}\n" in line  # simplejpeg or Pillow, whichever the workers use
    store = tmp_path / "photos.cnnpar"
    assert f"cnnpar prepare {tmp_path / 'photos'} --out {store} --short-side 40" in line
    # the user's run from the store: their flags kept, not their run's name (a new run, not one already there)
    assert line.endswith(f"cnnpar train --data {store} --image-size 32 --epochs 7")  # cnn3: the default model
    digits = Config()
    assert decode_line(digits, load_data(digits.data), cpu) == ""
    # the engines, asked for: no warning any more (the slow exit was torch's worker hook, any decoder)
    asked = Config(data=DataConfig(source=str(tmp_path / "photos"), image_size=32, decode="hardware"))
    line = decode_line(asked, load_data(asked.data), DistInfo(0, 0, 1, torch.device("cuda")))
    assert line.startswith("decode: hardware (the GPU's JPEG engines, nvJPEG's hardware backend; as asked)\n")
    assert "warning" not in line
    # left to the rule on a GPU with engines (the probe stood in for: no GPU here)
    monkeypatch.setattr(nvjpeg_hw, "hardware_decoder_available", lambda i: "")
    auto = Config(data=DataConfig(source=str(tmp_path / "photos"), image_size=32))
    line = decode_line(auto, load_data(auto.data), DistInfo(0, 0, 1, torch.device("cuda", 0)))
    assert line.startswith("decode: hardware (the GPU's JPEG engines, nvJPEG's hardware backend; auto: this GPU has")


def test_a_finished_run_closes_its_feeders(tmp_path, monkeypatch):
    """A run frees its decoders' outside resources (the JPEG engines' handle) when it ends, not at
    the interpreter's exit: with the engines, GPU runs were seen to hang there."""
    from cnnpar.config import Config, DataConfig, ModelConfig, RunConfig
    from cnnpar.data.loader import DeviceFeeder
    from cnnpar.dist import DistInfo
    from cnnpar.engine.trainer import Trainer

    closed = []
    monkeypatch.setattr(DeviceFeeder, "close", lambda self: closed.append(self.train))
    cfg = Config(
        data=DataConfig(source="synthetic", synthetic_samples=64, val_fraction=0.25, workers=0),
        model=ModelConfig(name="cnn3"),
        run=RunConfig(epochs=1, batch_size=16, progress=False, out_dir=str(tmp_path)),
    )
    Trainer(cfg, DistInfo(0, 0, 1, torch.device("cpu")), log=lambda *a, **k: None).fit()
    assert sorted(closed) == [False, True]  # the eval feeder and the train feeder


def test_shutting_down_a_loader_stops_its_persistent_workers_at_once_and_a_later_epoch_starts_new_ones():
    """torch's exit hook joins each persistent worker of a pinned loader with a 5 s timeout: a run whose
    loaders were still alive at exit took over 150 s to leave on an H200 (14 workers, two loaders).
    Shut down when the run ends, the workers leave now."""
    from torch.utils.data import DataLoader, TensorDataset

    from cnnpar.data.loader import shutdown_workers

    loader = DataLoader(TensorDataset(torch.arange(12.0)), batch_size=4, num_workers=2, persistent_workers=True)
    assert sum(len(b[0]) for b in loader) == 12
    workers = list(loader._iterator._workers)
    assert len(workers) == 2 and all(w.is_alive() for w in workers)
    shutdown_workers(loader)
    for w in workers:
        w.join(5)  # already told to stop: each leaves without being killed
    assert not any(w.is_alive() for w in workers) and all(w.exitcode == 0 for w in workers)
    assert loader._iterator is None
    assert sum(len(b[0]) for b in loader) == 12  # the loader still works: new workers
    shutdown_workers(loader)
    shutdown_workers(loader)  # nothing left to stop
    shutdown_workers(object())  # a loader without worker processes (the resident one)


def test_a_finished_run_leaves_no_worker_process_behind(tmp_path):
    """The end of `fit` stops the loaders' persistent workers (not the interpreter's exit hooks)."""
    import multiprocessing

    from cnnpar.config import Config, DataConfig, ModelConfig, RunConfig
    from cnnpar.dist import DistInfo
    from cnnpar.engine.trainer import Trainer

    cfg = Config(
        data=DataConfig(source="synthetic", synthetic_samples=64, val_fraction=0.25, workers=2, resident="off"),
        model=ModelConfig(name="cnn3"),
        run=RunConfig(epochs=2, batch_size=16, progress=False, out_dir=str(tmp_path), tensorboard=True),
    )
    tr = Trainer(cfg, DistInfo(0, 0, 1, torch.device("cpu")), log=lambda *a, **k: None)
    assert tr.train_loader.loader.num_workers == 2 and tr.train_loader.loader.persistent_workers
    tr.fit()
    assert tr.train_loader.loader._iterator is None and tr.val_loader.loader._iterator is None
    assert multiprocessing.active_children() == []  # (the trainer itself is still referenced here)


def test_cuda_graphs_left_on_auto_yield_to_a_gpu_jpeg_decoder_unless_cuda_has_32_queues(monkeypatch):
    """Measured on an H200: with CUDA's default 8 hardware queues graph replays and the GPU decoder's work
    hardly overlap (4,932 img/s with graphs against 6,063 without); with 32 graphs win (6,604-6,733 against
    6,357-6,524). The rule is checked here on the Trainer's method with stand-ins (graphs need CUDA)."""
    from pathlib import Path
    from types import SimpleNamespace

    from cnnpar.data.gpu_decode import GpuDecoder
    from cnnpar.engine.trainer import Trainer

    said = []

    def trainer(requested: str, decoder) -> SimpleNamespace:
        cfg = SimpleNamespace(
            speed=SimpleNamespace(cuda_graphs="on", compile="default"), optim=SimpleNamespace(grad_accum=1)
        )
        t = SimpleNamespace(
            cfg=cfg,
            info=SimpleNamespace(distributed=False),
            graphs_requested=requested,
            train_loader=SimpleNamespace(decoder=decoder),
            log=said.append,
        )
        t.graphs_blocked_reason = lambda: Trainer.graphs_blocked_reason(t)
        return t

    jpeg = GpuDecoder([Path("a.jpg")], 32, torch.device("cpu"), train=True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)  # the variable counts (dist.queues_setting)
    for queues in (None, "8"):  # CUDA's default, unset or said
        if queues:
            monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", queues)
        assert not Trainer._graphs_allowed(trainer("auto", jpeg))
        assert "decoded on the GPU" in said[-1] and "--cuda-graphs on" in said[-1]
        assert Trainer._graphs_allowed(trainer("on", jpeg))  # asked for: kept
        assert Trainer._graphs_allowed(trainer("auto", None))  # arrays, stores: kept
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32")  # as the cnnpar command sets it
    said.clear()
    assert Trainer._graphs_allowed(trainer("auto", jpeg)) and said == []


def test_photos_cropped_by_the_loader_get_only_the_flip():
    from cnnpar.data.transforms import resolve_augment

    assert resolve_augment("auto", (3, 224, 224), loader_crops=True) == "flip"
    assert resolve_augment("auto", (3, 32, 32)) == "crop+flip"  # arrays: pad-and-crop as before
    assert resolve_augment("crop+flip", (3, 224, 224), loader_crops=True) == "crop+flip"  # asked for


class TwoStageDecoder(Decoder):
    """Stands in for GpuDecoder's two stages (decode, then resize): the feeder runs them in two threads."""

    two_stage = True  # GpuDecoder's rule says so for nvJPEG

    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__(fail_at)
        self.threads: set[str] = set()

    def decode_stage(self, raw: Raw):
        self.threads.add(threading.current_thread().name)
        return self(raw)  # counts calls and fails where asked

    def resize_stage(self, decoded: torch.Tensor) -> torch.Tensor:
        self.threads.add(threading.current_thread().name)
        return decoded


def stage_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(("cnnpar-feeder", "cnnpar-decode"))]


def test_a_two_stage_decoder_runs_in_two_threads_and_yields_the_inline_batches():
    dec = TwoStageDecoder()
    fed = feeder(dec, threaded=True)
    assert fed.pipelined
    piped = list(fed)
    inline = list(feeder(Decoder(), threaded=False))
    assert len(piped) == len(inline) == 6
    for (x1, y1), (x2, y2) in zip(inline, piped):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert dec.threads == {"cnnpar-decode", "cnnpar-feeder"}
    assert not stage_threads()


def test_a_decode_stage_error_reaches_the_training_thread_and_stops_both_threads():
    it = iter(feeder(TwoStageDecoder(fail_at=8), threaded=True))
    next(it), next(it)
    with pytest.raises(DataError, match=r"photos/8\.jpg"):
        next(it)
    assert not stage_threads()


def test_an_abandoned_two_stage_iterator_stops_both_threads():
    dec = TwoStageDecoder()
    it = iter(feeder(dec, threaded=True, n=20))
    next(it)
    del it
    assert not stage_threads()
    assert dec.calls < 20  # both stages stopped: at most a few batches decoded ahead


def test_only_the_nvjpeg_decoder_runs_its_stages_in_two_threads():
    pytest.importorskip("nvidia.nvimgcodec", reason="the nvimgcodec extra is part of the test extra")
    from cnnpar.data.gpu_decode import GpuDecoder

    transform = DeviceTransform((0.5,) * 3, (0.25,) * 3, "none", False, torch.device("cpu"))
    for backend, two in (("nvjpeg", True), ("nvimgcodec", False)):
        dec = GpuDecoder([], 8, torch.device("cpu"), train=True, backend=backend)
        fed = DeviceFeeder([], None, transform, torch.device("cpu"), True, False, dec, threaded=True)
        assert fed.pipelined is two, backend


def iterator_closes(monkeypatch) -> list[str]:
    """Events that record each DeviceFeeder batch iterator's close."""
    events, plain_iter = [], DeviceFeeder.__iter__

    def batches(feeder):
        try:
            yield from plain_iter(feeder)
        finally:
            events.append("iterator closed")

    monkeypatch.setattr(DeviceFeeder, "__iter__", batches)
    return events


def test_an_epoch_that_fails_stops_its_feeder_before_the_run_closes_the_decoders(tmp_path, monkeypatch):
    """An error mid-epoch (out of memory, Ctrl-C) must not leave the feeder decoding ahead while the
    run's end closes its decoders: the epoch closes its batch iterator on the way out."""
    from cnnpar.config import Config, DataConfig, ModelConfig, RunConfig
    from cnnpar.dist import DistInfo
    from cnnpar.engine.trainer import Trainer

    cfg = Config(
        data=DataConfig(source="synthetic", synthetic_samples=96, val_fraction=0.0, workers=0),
        model=ModelConfig(name="cnn3"),
        run=RunConfig(epochs=1, batch_size=16, progress=False, out_dir=str(tmp_path)),
    )
    tr = Trainer(cfg, DistInfo(0, 0, 1, torch.device("cpu")), log=lambda *a, **k: None)
    events = iterator_closes(monkeypatch)
    steps = []

    def failing_step(group):
        steps.append(len(group))
        if len(steps) == 2:
            raise RuntimeError("CUDA out of memory (stand-in)")
        return torch.zeros(()), torch.zeros((), dtype=torch.int64)

    monkeypatch.setattr(tr, "train_step", failing_step)
    with pytest.raises(RuntimeError, match="stand-in") as failure:
        tr.train_epoch(1)
    # the iterator closed although the traceback (kept here, as a caller handling the error keeps it) holds the
    # epoch's frame, which references it
    assert steps == [1, 1] and events == ["iterator closed"]
    assert any(entry.name == "train_epoch" for entry in failure.traceback)


def test_an_evaluation_that_fails_stops_its_feeder_too(tmp_path, monkeypatch):
    """The evaluation's batch iterator is closed on an error (out of memory at evaluation, Ctrl-C) as the
    epoch's is: its decode thread could otherwise still wait in the val loader's `next()` while the run's end
    shuts the workers down (loader.shutdown_workers: it would wait for ever)."""
    from cnnpar.config import Config, DataConfig, ModelConfig, RunConfig
    from cnnpar.dist import DistInfo
    from cnnpar.engine import trainer
    from cnnpar.engine.trainer import Trainer

    cfg = Config(
        data=DataConfig(source="synthetic", synthetic_samples=96, val_fraction=0.5, workers=0),
        model=ModelConfig(name="cnn3"),
        run=RunConfig(epochs=1, batch_size=16, progress=False, out_dir=str(tmp_path)),
    )
    tr = Trainer(cfg, DistInfo(0, 0, 1, torch.device("cpu")), log=lambda *a, **k: None)
    assert isinstance(tr.val_loader, DeviceFeeder)
    events = iterator_closes(monkeypatch)
    steps = []

    def failing_eval_batch(*args):
        steps.append(1)
        if len(steps) == 2:
            raise RuntimeError("CUDA out of memory (stand-in)")
        return torch.zeros(()), torch.zeros((), dtype=torch.int64)

    monkeypatch.setattr(trainer, "eval_batch", failing_eval_batch)
    with pytest.raises(RuntimeError, match="stand-in") as failure:
        tr.evaluate()
    # closed although the traceback kept here holds the evaluation's frame, which references the iterator
    assert steps == [1, 1] and events == ["iterator closed"]
    assert any(entry.name == "evaluate" for entry in failure.traceback)


def test_a_feeder_that_fails_to_close_is_reported_and_the_other_still_closes():
    from cnnpar.engine.stops import closing_feeders

    class Feeder:
        def __init__(self, fails: bool) -> None:
            self.fails, self.closed = fails, False

        def close(self) -> None:
            self.closed = True
            if self.fails:
                raise RuntimeError("nvjpegDestroy: status 8 (internal error)")

    first, second = Feeder(fails=True), Feeder(fails=False)
    with pytest.warns(UserWarning, match="closing a data feeder failed: .*status 8"):
        with pytest.raises(ValueError, match="the run's own error"):  # not replaced by the close's
            with closing_feeders(first, None, second):
                raise ValueError("the run's own error")
    assert first.closed and second.closed


class SeededDecoder(Decoder):
    """Draws from its generator per batch, as GpuDecoder draws crop boxes: the feeder reseeds it."""

    def __init__(self) -> None:
        super().__init__()
        self.generator = torch.Generator().manual_seed(0)

    def __call__(self, raw: Raw) -> torch.Tensor:
        self.calls += 1
        return raw.pixels ^ torch.randint(0, 256, raw.pixels.shape, generator=self.generator, dtype=torch.uint8)


def flipping_feeder(decoder, n: int = 6) -> DeviceFeeder:
    transform = DeviceTransform((0.5,) * 3, (0.25,) * 3, "flip", False, torch.device("cpu"))
    return DeviceFeeder(list(batches(n)), None, transform, torch.device("cpu"), True, False, decoder, True)


def test_a_prepared_epoch_runs_ahead_and_yields_what_a_pipeline_started_at_the_epoch_yields():
    fresh = flipping_feeder(SeededDecoder())
    fresh.set_epoch(2, seed=42)
    expected = list(fresh)
    dec = SeededDecoder()
    ahead = flipping_feeder(dec)
    list(ahead)  # epoch 1 draws from the generators: the prepared epoch must not depend on that
    ahead.prepare(2, seed=42)
    for _ in range(200):  # the pipeline fills before anyone asks for a batch
        if dec.calls > 6:
            break
        threading.Event().wait(0.01)
    assert dec.calls > 6
    ahead.set_epoch(2, seed=42)  # as begin_epoch does: the same epoch and seed change nothing
    got = list(ahead)
    assert len(got) == len(expected) == 6
    for (x1, y1), (x2, y2) in zip(expected, got):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert dec.calls == 12  # the prepared pipeline was the one iterated: no batch decoded twice
    assert not feeder_threads()


def test_a_prepared_epoch_that_is_not_trained_is_stopped_and_replaced():
    dec = SeededDecoder()
    fed = flipping_feeder(dec)
    fed.prepare(2, seed=42)
    fed.set_epoch(3, seed=7)  # another epoch (a benchmark's loader-alone pass, say): the prepared one goes
    assert not feeder_threads()
    fresh = flipping_feeder(SeededDecoder())
    fresh.set_epoch(3, seed=7)
    expected, got = list(fresh), list(fed)
    assert len(got) == len(expected) == 6  # the whole epoch: a stopped pipeline handed on would yield none
    assert all(torch.equal(a[0], b[0]) for a, b in zip(expected, got))
    fed.prepare(4, seed=9)
    fed.close()  # the run ends (or fails) with an epoch prepared: its threads stop
    assert not feeder_threads()


def test_each_epoch_but_the_last_prepares_the_next_with_the_seed_it_will_get(tmp_path, monkeypatch):
    from cnnpar.config import Config
    from cnnpar.dist import init_distributed
    from cnnpar.engine.rng import epoch_seed
    from cnnpar.engine.trainer import Trainer
    from cnnpar.presets import with_overrides

    prepared = []
    real = DeviceFeeder.prepare
    monkeypatch.setattr(
        DeviceFeeder, "prepare", lambda self, e, seed=None: prepared.append((e, seed)) or real(self, e, seed)
    )
    cfg = with_overrides(
        Config(),
        data={"source": "synthetic", "image_shape": "3x8x8", "synthetic_samples": 256, "val_fraction": 0.25},
        model={"name": "cnn3"},
        speed={"device": "cpu"},
        run={"epochs": 3, "batch_size": 32, "out_dir": str(tmp_path), "progress": False, "seed": 5},
    )
    Trainer(cfg, init_distributed("cpu", debug_single=True), log=lambda *a, **k: None).fit()
    assert prepared == [(2, epoch_seed(5, 0, 2)), (3, epoch_seed(5, 0, 3))]  # the val loader prepares nothing


def test_a_prepared_pipeline_survives_an_iterator_closed_before_its_first_batch_and_stops_with_the_feeder():
    fed = flipping_feeder(SeededDecoder())
    fed.prepare(2, seed=42)
    it = iter(fed)
    it.close()  # an error between iter() and the first next(): the generator's finally never runs
    assert feeder_threads()  # still the feeder's to stop
    fed.close()
    assert not feeder_threads()


def test_a_prepared_two_stage_pipeline_is_used_or_stopped_with_both_its_threads():
    dec = TwoStageDecoder()
    fed = feeder(dec, threaded=True)
    assert fed.pipelined
    fed.prepare(2, seed=3)
    assert {t.name for t in stage_threads()} == {"cnnpar-decode", "cnnpar-feeder"}
    fed.set_epoch(2, seed=3)
    assert len(list(fed)) == 6 and dec.calls == 6  # the prepared pipeline, nothing decoded twice
    assert not stage_threads()
    fed.prepare(3, seed=4)
    fed.set_epoch(5, seed=6)  # another epoch: both threads of the prepared one stop
    assert not stage_threads()
    fed.prepare(6, seed=7)
    fed.close()
    assert not stage_threads()


def test_each_pipeline_stage_keeps_one_stream_of_its_own_across_epochs(monkeypatch):
    # streams drawn anew each epoch from torch's pool would come round to the training thread's own
    from cnnpar.data import loader as loader_mod

    made = []
    monkeypatch.setattr(loader_mod, "private_stream", lambda device, priority=0: made.append(priority) or object())
    given = []  # the stream each stage thread was started with, epoch after epoch
    monkeypatch.setattr(
        loader_mod,
        "_in_thread",
        lambda source, fn, device, depth, name, stream, **kw: given.append((name, stream)) or iter(()),
    )
    feeder = object.__new__(loader_mod.DeviceFeeder)
    feeder.loader, feeder.device, feeder._stage_streams, feeder.pipelined = [], torch.device("cuda", 0), {}, True
    for _ in range(40):  # 40 epochs' pipelines
        feeder._start_threaded()
    assert len(made) == 2 and made == [loader_mod.DeviceFeeder.STREAM_PRIORITY] * 2  # one per stage, once
    decode = {id(st) for name, st in given if name == "cnnpar-decode"}
    feed = {id(st) for name, st in given if name == "cnnpar-feeder"}
    assert len(given) == 80 and len(decode) == 1 and len(feed) == 1 and decode != feed
    # where the runtime makes no stream: one pool stream per stage, drawn once, not every epoch
    monkeypatch.setattr(loader_mod, "private_stream", lambda device, priority=0: None)
    drawn = []
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None, priority=0: drawn.append(priority) or object())
    feeder._stage_streams = {}
    for _ in range(40):
        feeder._start_threaded()
    assert len(drawn) == 2
    feeder.device, feeder._stage_streams = torch.device("cpu"), {}
    assert feeder._stage_stream("feed") is None and len(made) == 2 and len(drawn) == 2  # no streams off CUDA


def test_a_worker_that_died_of_the_runs_own_stop_is_not_reported_as_a_failure():
    """`timeout` signals the whole process group: the loader's workers died of the same SIGTERM, and closing the loader
    warned "closing a data feeder failed: ... is killed by signal: Terminated" above the stop line."""
    import warnings

    from cnnpar.engine.stops import closing_feeders
    from cnnpar.errors import Terminated

    class Feeder:
        def __init__(self, signal_name: str) -> None:
            self.signal_name = signal_name

        def close(self) -> None:
            raise RuntimeError(f"DataLoader worker (pid 4242) is killed by signal: {self.signal_name}. ")

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for stop in (Terminated, KeyboardInterrupt):
            with pytest.raises(stop), closing_feeders(Feeder("Terminated"), Feeder("Interrupt")):
                raise stop
    # a worker killed by something else while stopping, and one killed by SIGTERM in a run not stopping, are said
    with pytest.warns(UserWarning, match="is killed by signal: Killed"):
        with pytest.raises(Terminated), closing_feeders(Feeder("Killed")):
            raise Terminated
    with pytest.warns(UserWarning, match="is killed by signal: Terminated"):
        with closing_feeders(Feeder("Terminated")):
            pass


def test_closing_a_trainer_in_the_clean_up_of_a_stop_does_not_report_the_workers_the_stop_killed():
    """The doctor's `--try` stopped by `timeout`: its Trainer was closed in a `finally` the SIGTERM unwound, and
    closing its loader warned "closing a data feeder failed: ... is killed by signal: Terminated" above the stop."""
    import warnings
    from types import SimpleNamespace

    from cnnpar.engine.trainer import Trainer
    from cnnpar.errors import Terminated

    class Feeder:
        def close(self) -> None:
            raise RuntimeError("DataLoader worker (pid 4797) is killed by signal: Terminated. ")

    trainer = SimpleNamespace(train_loader=Feeder(), val_loader=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(Terminated):
            try:
                raise Terminated
            finally:
                Trainer.close_loaders(trainer)
    with pytest.warns(UserWarning, match="is killed by signal: Terminated"):  # closed with no stop in flight
        Trainer.close_loaders(trainer)
