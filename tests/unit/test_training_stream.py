"""Beside a GPU decoder the training thread works on a non-blocking stream of its own (parallel/streams.py):
nvJPEG's blocking streams synchronise with the legacy default stream, both ways."""

from __future__ import annotations

import pytest
import torch

from cnnpar.parallel import streams
from cnnpar.parallel.streams import TrainingStream, wants_own_stream

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


def test_a_run_without_a_gpu_decoder_prints_no_stream_line(tmp_path):
    from cnnpar.config import Config, DataConfig, ModelConfig, RunConfig
    from cnnpar.dist import DistInfo
    from cnnpar.engine.trainer import Trainer

    said = []
    cfg = Config(
        data=DataConfig(source="synthetic", synthetic_samples=32, val_fraction=0.25, workers=0),
        model=ModelConfig(name="cnn3"),
        run=RunConfig(epochs=1, batch_size=8, progress=False, out_dir=str(tmp_path)),
    )
    tr = Trainer(cfg, DistInfo(0, 0, 1, torch.device("cpu")), log=lambda *a, **k: said.append(" ".join(map(str, a))))
    tr.fit()
    assert said and not any(line.startswith("training stream") for line in said)


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
