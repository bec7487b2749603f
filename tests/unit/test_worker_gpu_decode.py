"""Photos decoded by the worker processes' own decoders (`--decode nvimgcodec-workers`): the
batches a spawned worker hands over are the in-process decoder's, seeded per epoch like the CPU
workers' crops. On the CPU the workers run nvImageCodec's CPU backend; on a GPU the same code
drives the hardware engines from each worker's own CUDA context."""

from __future__ import annotations

import pytest
import torch

from cnnpar.config import Config, DataConfig, RunConfig, resolve_for_device
from cnnpar.data import load_data
from cnnpar.data.gpu_decode import GpuDecoder, collate_encoded
from cnnpar.data.loader import build_loader
from cnnpar.data.worker_gpu_decode import WorkerGpuDecodedFolder
from cnnpar.dist import DistInfo
from cnnpar.engine.rng import epoch_seed
from tests.datafiles import write_image_folder

pytest.importorskip("nvidia.nvimgcodec", reason="the nvimgcodec extra is part of the test extra")
CPU = torch.device("cpu")


def test_a_batch_is_the_in_process_decoders_batch_from_the_same_seed(tmp_path):
    root = write_image_folder(tmp_path / "photos", per_class=5, classes=2, side=24)
    bundle = load_data(DataConfig(source=str(root), image_size=16, val_fraction=0.0))
    files, labels = bundle.train.files, bundle.train.labels
    for train in (True, False):
        ds = WorkerGpuDecodedFolder(files, labels, 16, train, CPU)
        torch.manual_seed(11)  # what the loader does in each worker, per epoch
        x, y, index = ds[[3, 0, 7, 5]]
        ref = GpuDecoder(files, 16, CPU, train, seed=11, backend="nvimgcodec")
        encoded, ref_labels = collate_encoded([ds.encoded[i] for i in [3, 0, 7, 5]])
        assert torch.equal(x, ref(encoded))
        assert torch.equal(y, ref_labels) and index.tolist() == [3, 0, 7, 5]
        assert x.dtype == torch.uint8 and x.shape == (4, 3, 16, 16)


def test_spawned_workers_hand_over_batches_that_follow_the_epoch_seed(tmp_path):
    root = write_image_folder(tmp_path / "photos", per_class=6, classes=2, side=20)
    bundle = load_data(DataConfig(source=str(root), image_size=16, val_fraction=0.25))
    data = DataConfig(augment="flip", decode="nvimgcodec-workers", workers=2, persistent_workers=True)
    cfg = resolve_for_device(Config(data=data, run=RunConfig(batch_size=4, seed=3)), "cpu", False)
    info = DistInfo(0, 0, 1, CPU)

    def epoch(feeder, e: int) -> list[torch.Tensor]:
        feeder.set_epoch(e, epoch_seed(3, 0, e))
        return [x for x, _ in feeder]

    feeder = build_loader(bundle, cfg, info, train=True)
    assert feeder.loader.multiprocessing_context.get_start_method() == "spawn"  # CUDA in the workers
    assert feeder.decoder is None  # nothing decoded in the training process
    first, second = epoch(feeder, 1), epoch(feeder, 2)
    again = epoch(build_loader(bundle, cfg, info, train=True), 2)
    assert all(torch.equal(a, b) for a, b in zip(second, again, strict=True))  # the epoch's seed alone
    assert not all(torch.equal(a, b) for a, b in zip(first, second))
    assert first[0].shape == (4, 3, 16, 16) and first[0].dtype == torch.float32
