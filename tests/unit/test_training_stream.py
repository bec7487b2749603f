"""Beside a GPU decoder the training thread works on a non-blocking stream of its own (parallel/streams.py):
nvJPEG's blocking streams synchronise with the legacy default stream, both ways."""

from __future__ import annotations

import pytest
import torch

from cnnpar.parallel import streams
from cnnpar.parallel.streams import TrainingStream, wants_own_stream

pytestmark = pytest.mark.usefixtures("one_thread")  # one intra-op thread for the in-process runs (conftest)

CUDA = torch.device("cuda", 0)


def test_only_a_cuda_run_fed_by_a_gpu_decoder_gets_its_own_stream(monkeypatch):
    assert wants_own_stream(CUDA, gpu_decoder=True)
    assert not wants_own_stream(CUDA, gpu_decoder=False)  # arrays, stores, CPU decode: torch's default stream
    assert not wants_own_stream(torch.device("cpu"), gpu_decoder=True)
    monkeypatch.setattr(streams, "FOR_GPU_DECODERS", False)  # the benchmark's stream=legacy
    assert not wants_own_stream(CUDA, gpu_decoder=True)


def test_on_the_cpu_the_switch_does_nothing_and_says_nothing():
    s = TrainingStream(torch.device("cpu"), gpu_decoder=True)
    s.enter()
    s.exit()
    assert s.stream is None and s.describe() == ""


@pytest.mark.parametrize("gpu_decoder", [False, True])
def test_the_run_says_it_trains_on_its_own_stream_only_beside_a_gpu_decoder(tmp_path, monkeypatch, gpu_decoder):
    from cnnpar.config import Config, DataConfig, ModelConfig, RunConfig
    from cnnpar.dist import DistInfo
    from cnnpar.engine import trainer as trainer_module
    from cnnpar.engine.trainer import Trainer

    fake = FakeStreams(monkeypatch)
    monkeypatch.setattr(trainer_module, "decodes_on_gpu", lambda cfg, bundle: gpu_decoder)
    said = []
    cfg = Config(
        data=DataConfig(source="synthetic", synthetic_samples=32, val_fraction=0.25, workers=0),
        model=ModelConfig(name="cnn3"),
        run=RunConfig(epochs=1, batch_size=8, progress=False, out_dir=str(tmp_path)),
    )
    tr = Trainer(cfg, DistInfo(0, 0, 1, torch.device("cpu")), log=lambda *a, **k: said.append(" ".join(map(str, a))))
    tr.fit()
    lines = [line for line in said if line.startswith("training stream")]
    assert lines == (
        ["training stream: own non-blocking stream (a GPU decoder's library streams block the default one)"]
        if gpu_decoder
        else []
    )
    assert fake.made == int(gpu_decoder) and fake.current is fake.default  # given back at the end of fit


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_run_decoding_photos_on_the_gpu_trains_on_its_own_stream_and_gives_the_default_back(tmp_path):
    from cnnpar.config import Config, DataConfig, ModelConfig, RunConfig
    from cnnpar.dist import DistInfo
    from cnnpar.engine.trainer import Trainer
    from tests.datafiles import write_image_folder

    folder = write_image_folder(tmp_path / "photos", per_class=16, classes=2, side=48)
    said = []
    cfg = Config(
        data=DataConfig(source=str(folder), image_size=32, decode="gpu", val_fraction=0.25, workers=0),
        model=ModelConfig(name="cnn3"),
        run=RunConfig(epochs=2, batch_size=8, progress=False, out_dir=str(tmp_path / "runs")),
    )
    default = torch.cuda.current_stream(CUDA)
    tr = Trainer(cfg, DistInfo(0, 0, 1, CUDA), log=lambda *a, **k: said.append(" ".join(map(str, a))))
    assert torch.cuda.current_stream(CUDA) == tr.stream.stream != default
    result = tr.fit()
    assert torch.cuda.current_stream(CUDA) == default  # given back at the end of fit
    assert any(line.startswith("training stream: own non-blocking stream") for line in said)
    assert all(torch.isfinite(p).all() for p in tr.raw_model.parameters())
    assert len(result.history) == 2


class FakeStreams:
    """torch.cuda's stream calls, recorded: which stream is current, and which waited for which."""

    def __init__(self, monkeypatch) -> None:
        self.made = 0
        self.current = self.default = self.Stream("default")
        monkeypatch.setattr(streams, "wants_own_stream", lambda device, gpu_decoder: gpu_decoder)
        monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: self.Stream(f"s{self._next()}"))
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: self.current)
        monkeypatch.setattr(torch.cuda, "set_stream", lambda s: setattr(self, "current", s))

    def _next(self) -> int:
        self.made += 1
        return self.made

    class Stream:
        def __init__(self, name: str) -> None:
            self.name, self.waited = name, []

        def wait_stream(self, other) -> None:
            self.waited.append(other.name)


def test_each_switch_waits_for_the_work_before_it_and_an_earlier_one_left_first_leaves_the_later_in_force(
    monkeypatch,
):
    fake = FakeStreams(monkeypatch)
    a, b = TrainingStream(CUDA, True), TrainingStream(CUDA, True)
    a.enter()
    assert fake.current is a.stream and a.stream.waited == ["default"]
    b.enter()
    assert fake.current is b.stream and b.stream.waited == ["s1"]
    a.exit()  # out of order (a tool keeping an older Trainer): b's stream stays, after a's work
    assert fake.current is b.stream and b.stream.waited == ["s1", "s1"]
    b.exit()
    assert fake.current is a.stream  # b gives back what it found
    assert TrainingStream(CUDA, False).stream is None


def test_a_trainer_switches_only_once_built_and_gives_the_stream_back_on_close(tmp_path, monkeypatch):
    from cnnpar.config import Config, DataConfig, ModelConfig, RunConfig
    from cnnpar.dist import DistInfo
    from cnnpar.engine import trainer as trainer_module
    from cnnpar.engine.trainer import Trainer

    fake = FakeStreams(monkeypatch)
    monkeypatch.setattr(trainer_module, "decodes_on_gpu", lambda cfg, bundle: True)  # as beside a GPU decoder
    cfg = Config(
        data=DataConfig(source="synthetic", synthetic_samples=32, val_fraction=0.25, workers=0),
        model=ModelConfig(name="cnn3"),
        run=RunConfig(epochs=1, batch_size=8, progress=False, out_dir=str(tmp_path)),
    )
    info = DistInfo(0, 0, 1, torch.device("cpu"))

    def fails(self):
        raise RuntimeError("a late step of building fails")

    with monkeypatch.context() as m:
        m.setattr(Trainer, "_graphs_allowed", fails)
        with pytest.raises(RuntimeError, match="late step"):
            Trainer(cfg, info, log=lambda *a, **k: None)
    assert fake.current is fake.default and fake.made == 0  # a Trainer that failed to build switched nothing
    tr = Trainer(cfg, info, log=lambda *a, **k: None)
    assert fake.current is tr.stream.stream
    tr.close()
    assert fake.current is fake.default and fake.default.waited == ["s1"]
