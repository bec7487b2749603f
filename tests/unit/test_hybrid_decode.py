"""`--cpu-share`: workers decode the first share of every batch, the GPU decoder (its CPU stand-in
here) the rest; the two are put together in the batch's order."""

from __future__ import annotations

import pytest
import torch

from cnnpar.config import Config, DataConfig, ModelConfig, OptimConfig, RunConfig
from cnnpar.data import load_data
from cnnpar.data.gpu_decode import GpuDecoder
from cnnpar.data.hybrid_decode import HybridFolder
from cnnpar.data.loader import build_loader
from cnnpar.data.tv_codecs import TV_CODEC_DEPRECATION
from cnnpar.dist import DistInfo
from cnnpar.errors import ConfigError
from tests.datafiles import write_noise_jpegs

# the tests' own torchvision.io calls (references, encoders): only its codec notice is known
pytestmark = pytest.mark.filterwarnings(f"ignore:{TV_CODEC_DEPRECATION}:DeprecationWarning")


def photo_folder(root, n: int = 12):
    return write_noise_jpegs(root, n)


@pytest.mark.parametrize("share", [0.0, 0.25, 0.5, 1.0])
def test_a_hybrid_batch_holds_each_image_once_in_order(tmp_path, share):
    bundle = load_data(DataConfig(source=str(photo_folder(tmp_path / "photos")), image_size=24, val_fraction=0))
    ds = bundle.train
    hybrid = HybridFolder(ds.files, ds.labels, 24, train=False, share=share)
    indices = [7, 2, 9, 0, 11, 5, 3, 1]
    batch, labels = hybrid[indices]
    k = round(share * len(indices))
    assert len(batch.decoded) == k and len(batch.encoded) == len(indices) - k
    assert batch.index.tolist() == indices and labels.tolist() == ds.labels[indices].tolist()
    out = GpuDecoder(ds.files, 24, torch.device("cpu"), train=False)(batch)
    assert out.shape == (8, 3, 24, 24) and out.dtype == torch.uint8
    # Evaluation crops are the centre square: each part is exactly what its decoder makes alone.
    if k:
        assert torch.equal(out[:k], hybrid.cpu[indices[:k]][0])
    if k < len(indices):
        alone = GpuDecoder(ds.files, 24, torch.device("cpu"), train=False)(hybrid.encoded_batch(indices[k:]))
        assert torch.equal(out[k:], alone)


def test_cpu_share_trains_through_the_loader_and_is_validated(tmp_path):
    cfg = Config(
        data=DataConfig(source=str(photo_folder(tmp_path / "photos")), image_size=24, decode="gpu", cpu_share=0.5),
        model=ModelConfig(name="cnn3"),
        optim=OptimConfig(),
        run=RunConfig(batch_size=4, progress=False),
    )
    info = DistInfo(0, 0, 1, torch.device("cpu"))
    bundle = load_data(cfg.data)
    loader = build_loader(bundle, cfg, info, train=True)
    loader.set_epoch(1)
    seen = [y for _, y in loader]
    assert sum(len(y) for y in seen) == 8  # 12 photos, 20 % held out (3 val), drop_last: 2 batches of 4
    x, _ = next(iter(loader))
    assert x.shape == (4, 3, 24, 24) and x.dtype == torch.float32
    with pytest.raises(ConfigError, match="cpu_share"):
        DataConfig(cpu_share=1.5)


def test_the_workers_share_is_held_for_the_resize_stream_as_the_decoded_images_are(tmp_path, monkeypatch):
    """On CUDA the decode stage copies the workers' share to the device on its own stream and the resize reads it
    on another (the feeder's two threads). Freed with the batch, the share's block went back to the decode
    stream's pool while the resize's cat could still be queued behind the step, and the next share's copy could
    write over it. Every tensor that crosses is marked for the reading stream (record_stream), the share too.
    Streams stand in here; the CUDA test below runs the race itself."""
    bundle = load_data(DataConfig(source=str(photo_folder(tmp_path / "photos")), image_size=24, val_fraction=0))
    ds = bundle.train
    hybrid = HybridFolder(ds.files, ds.labels, 24, train=False, share=0.5)
    decoder = GpuDecoder(ds.files, 24, torch.device("cpu"), train=False)
    d = decoder.decode_stage(hybrid[[7, 2, 9, 0]][0])
    d.stream = "the decode thread's stream"  # what the decode stage records on CUDA
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "the resize thread's stream")
    held = []
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: held.append((self, stream)))
    decoder.resize_stage(d)
    assert d.done is not None and len(d.done) == 2
    crossing = [d.done, *(img for img in d.images if img is not None)]
    assert len(held) == len(crossing) == 3  # the share and the two images decoded here
    assert all(any(t is x for t, _ in held) for x in crossing)
    assert {stream for _, stream in held} == {"the resize thread's stream"}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("share", [0.5, 1.0])
def test_cuda_the_workers_share_is_not_overwritten_while_the_resize_stream_still_reads_it(tmp_path, share):
    """The race above on a GPU: the resize's stream is kept busy, the first batch's share freed, and the next
    share copied on the decode stream; the first batch must still hold its own share's pixels."""
    dev = torch.device("cuda")
    bundle = load_data(DataConfig(source=str(photo_folder(tmp_path / "photos")), image_size=24, val_fraction=0))
    ds = bundle.train
    hybrid = HybridFolder(ds.files, ds.labels, 24, train=False, share=share)
    decoder = GpuDecoder(ds.files, 24, dev, train=False)
    decoder(hybrid[[4, 6, 8, 10]][0])  # kernels compiled and loaded first: the resize below only queues work
    first, second = hybrid[[7, 2, 9, 0]][0], hybrid[[1, 3, 5, 11]][0]
    first.decoded, second.decoded = first.decoded.pin_memory(), second.decoded.pin_memory()  # truly async copies
    k = len(first.decoded)
    decode_stream, resize_stream = torch.cuda.Stream(dev), torch.cuda.Stream(dev)
    with torch.cuda.stream(decode_stream):
        d = decoder.decode_stage(first)
    resize_stream.wait_stream(decode_stream)  # DeviceFeeder's hand-over event
    with torch.cuda.stream(resize_stream):
        torch.cuda._sleep(100_000_000)  # the step ahead of the resize: its cat stays queued
        out = decoder.resize_stage(d)
    del d  # the feeder drops the batch once resized
    with torch.cuda.stream(decode_stream):
        decoder.decode_stage(second)  # the next share's copy, on the decode stream
    torch.cuda.synchronize()
    assert torch.equal(out[:k].cpu(), first.decoded) and not torch.equal(first.decoded, second.decoded)
