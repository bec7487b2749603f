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
