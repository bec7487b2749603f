"""`cnnpar predict`'s photos read by the loader that evaluates a run (data/loader.build_loader): worker processes
sized as train's --workers, decoding overlapped with the model, and on CUDA the GPU decoder --decode picks. One
owner for reading photos: predict's pixels are the evaluation's, whichever way the run read them."""

from __future__ import annotations

from dataclasses import replace

import torch

from cnnpar.config import Config, resolve_decode
from cnnpar.data.bundle import DataBundle
from cnnpar.data.cpu_decode import CpuDecodedFolder
from cnnpar.data.folder import ImageFolderDataset
from cnnpar.data.loader import build_loader, workers_cap_line
from cnnpar.data.nvjpeg_hw import jpeg_engines
from cnnpar.dist import DistInfo

AUTO_WORKERS = -1  # train's --workers default: sized to the machine (loader.auto_workers)


def photo_config(data: str, batch_size: int, workers: int, decode: str, dev: torch.device, textbook: bool) -> Config:
    """The settings build_loader reads, as `resolve_for_device` resolves them for an evaluation on `dev`: one pass,
    so no persistent workers; nothing held resident (a folder is decoded batch by batch anyway); the model's own
    memory format (predict does not convert its model to channels_last)."""
    cuda = dev.type == "cuda"
    decoder, _ = resolve_decode(decode, cuda, jpeg_engines(decode, data, dev))
    base = Config()
    on_cuda = "on" if cuda else "off"
    return replace(
        base,
        data=replace(
            base.data,
            source=data,
            workers=workers,
            decode=decoder,
            loader="textbook" if textbook else "fast",
            persistent_workers=False,
            resident="off",
            pin_memory=on_cuda,
            prefetch_stream=on_cuda,
        ),
        speed=replace(base.speed, channels_last="off", device=dev.type),
        run=replace(base.run, batch_size=batch_size),
    )


def photo_bundle(ds, data: str, mean, std) -> DataBundle:
    """A bundle whose validation split is the folder to predict. A CpuDecodedFolder (the run's validation's centre
    square) goes back to its files, which build_loader hands to the decoder --decode picks (the GPU decoders share
    its boxes); the other photo readers (a textbook run's, a store run's `PreparedFolder`) are read as they are."""
    if isinstance(ds, CpuDecodedFolder):
        ds = ImageFolderDataset(ds.files, ds.labels, ds.size)
    return DataBundle(ds, ds, (3, ds.size, ds.size), 1, tuple(mean), tuple(std), data)


def photo_batches(ds, data: str, batch_size: int, workers: int, decode: str, dev: torch.device, mean, std, log):
    """Normalised batches on `dev`, in the folder's order (the eval loader's exact shards of one process)."""
    cfg = photo_config(data, batch_size, workers, decode, dev, textbook=type(ds) is ImageFolderDataset)
    info = DistInfo(rank=0, local_rank=0, world_size=1, device=dev)
    if line := workers_cap_line(cfg, info):
        log(line)
    feeder = build_loader(photo_bundle(ds, data, mean, std), cfg, info, train=False)
    try:
        for x, _ in feeder:
            yield x
    finally:  # an error or a stop mid-folder: the workers and the GPU decoder's handles go with it
        feeder.close()
