"""JPEG decoding on the GPU (nvJPEG) for image folders.

CPU decoding is what starves a GPU training on photos: one core decodes a few hundred
ImageNet-sized JPEGs per second, a ResNet-50 step on an H200 consumes thousands. Here worker
processes only read file bytes (and look at each JPEG's header); the batch crosses to the device
still compressed, is decoded by `torchvision.io.decode_jpeg(list, device="cuda")` in one batched
call, then cropped and resized on the device in a few batched kernels (`crop_resize`).

Files nvJPEG cannot take (PNGs, CMYK JPEGs: see `jpeg_header`) are decoded on the CPU, one by one;
so is any file that makes the batched call fail, found by bisecting the batch, so that one odd
file costs a few extra batched calls instead of a whole batch decoded on the CPU. A file the CPU
cannot decode either is named in a DataError.

What torchvision's batched CUDA decode does to the host and to streams (read in
torchvision/csrc/io/image/cuda/decode_jpegs_cuda.cpp, torchvision 0.19 to 0.29):
- It synchronises the host: `decode_images` calls cudaStreamSynchronize on the decoder's private
  stream before and after the batch (and once per image on the path for progressive JPEGs), under
  a global mutex. The caller's stream is not waited for, so a queued training step keeps the GPU
  busy meanwhile, but the calling thread launches nothing while a batch decodes. (The op releases
  the GIL, as torch.ops calls do, so a decode thread could overlap it with the Python of the step.)
- It allocates its outputs on the caller's current stream, then has nvJPEG write them from its own
  stream without waiting for the caller's: the caching allocator can hand it a block that kernels
  queued on the caller's stream are still reading, and nvJPEG overwrites it (pytorch/vision
  PR #9606, not merged; torchcodec #1634 fixed its own copy). `nvjpeg_decode` below allocates the
  outputs on a private stream whose pool only ever holds earlier decode outputs, each marked with
  `record_stream` for the stream that reads it, so a block is reused only once its readers are done.
- It returns no partial results: one file that nvJPEG rejects fails the whole list.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset

from cnnpar.data.crop_resize import draw_crop_boxes, resized_crops, resized_crops_loop
from cnnpar.data.folder import decode_rgb, read_encoded
from cnnpar.data.jpeg_header import nvjpeg_friendly

BatchDecode = Callable[[list[torch.Tensor], torch.device], list[torch.Tensor]]


@dataclass
class EncodedBatch:
    """Compressed images of one batch as one flat byte buffer with offsets, their data-set indices
    (to name a file that fails) and, when the workers looked, which ones nvJPEG can take.

    One tensor per batch, not one per image: a worker hands each tensor to the main process
    through its own shared-memory segment, and 256 segments per batch cost more than the decode.
    """

    flat: torch.Tensor
    offsets: torch.Tensor
    index: torch.Tensor
    nvjpeg_ok: torch.Tensor | None = None  # bool per image; None: the decoder reads the headers itself

    @property
    def data(self) -> list[torch.Tensor]:
        bounds = self.offsets.tolist()
        return [self.flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]

    def pin_memory(self) -> EncodedBatch:
        return self  # compressed bytes are small; nothing worth pinning


class EncodedFolderDataset(Dataset):
    def __init__(self, files: list[Path], labels, size: int) -> None:
        self.files = list(files)
        self.labels = torch.as_tensor(labels, dtype=torch.int64)
        self.size = size

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        # Plain bytes in ordinary tensor memory: a worker must be able to move the tensor through
        # shared memory, which failed (silently, in the queue's feeder thread) for read_file's.
        data = read_encoded(self.files[i])
        # The header is read here, in the worker, so the main process does no per-file Python work.
        return data, self.labels[i], i, nvjpeg_friendly(memoryview(data.numpy()))


def collate_encoded(batch):
    data, labels, index, ok = zip(*batch)
    offsets = torch.zeros(len(data) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.as_tensor([len(d) for d in data]), 0)
    encoded = EncodedBatch(torch.cat(data), offsets, torch.as_tensor(index), torch.as_tensor(ok, dtype=torch.bool))
    return encoded, torch.stack(labels)


_alloc_streams: dict[torch.device, torch.cuda.Stream] = {}


def nvjpeg_decode(buffers: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """`decode_jpeg(buffers, RGB, device)` in one call: nvJPEG on CUDA, libjpeg-turbo on the CPU.

    Raises RuntimeError (or ValueError) if any one buffer fails; returns (3, H, W) uint8 images.
    """
    from torchvision.io import ImageReadMode, decode_jpeg

    if device.type != "cuda":
        return decode_jpeg(buffers, mode=ImageReadMode.RGB, device=device)
    # Outputs come from a private stream's pool (see the module docstring: torchvision lets nvJPEG
    # write into blocks the caller's stream may still be reading); record_stream holds each block
    # until the consumer stream has finished with it.
    consumer = torch.cuda.current_stream(device)
    key = torch.device("cuda", consumer.device_index)
    if key not in _alloc_streams:
        _alloc_streams[key] = torch.cuda.Stream(key)
    alloc = _alloc_streams[key]
    with torch.cuda.stream(alloc):
        images = decode_jpeg(buffers, mode=ImageReadMode.RGB, device=key)  # note: host sync inside
    # Any kernel torchvision queued on the then-current stream after its decode (a layout change,
    # say) ran on `alloc`: the consumer must not read the images before that work is done.
    consumer.wait_stream(alloc)
    for img in images:
        img.record_stream(consumer)
    return images


class GpuDecoder:
    """Encoded batch in, (N, 3, size, size) uint8 batch on `device` out.

    `batch_decode` is the batched decode (swappable, so tests can make it fail for chosen files);
    `resize` picks the per-image loop ("loop", the default: the path measured on an H200) or the
    batched crop-and-resize ("batched": a few kernels per batch instead of ~6 per image, meant for
    CUDA, where launches cost; on the CPU it does far more arithmetic than the loop). The config
    switch is `data.gpu_resize` (`--gpu-resize`).
    """

    def __init__(
        self,
        files: list[Path],
        size: int,
        device: torch.device,
        train: bool,
        seed: int = 0,
        batch_decode: BatchDecode = nvjpeg_decode,
        resize: str | None = None,
    ) -> None:
        self.files, self.size, self.device, self.train = files, size, torch.device(device), train
        self.generator = torch.Generator().manual_seed(seed)
        self.batch_decode = batch_decode
        # The loop is the default everywhere until the batched path is measured on a GPU: on the
        # CPU the loop was 5-12x faster (benchmarks/results/jpeg_decode_cpu.csv).
        self.resize = resize or "loop"
        if self.resize not in ("batched", "loop"):
            raise ValueError(f"resize: expected 'batched' or 'loop', got {self.resize!r}")
        self.batched_calls = 0  # batched decode calls made, bisection included (for tests and benchmarks)
        self.cpu_decoded = 0  # images decoded on the CPU

    def _decode_cpu(self, buf: torch.Tensor, index: int) -> torch.Tensor:
        img = decode_rgb(buf, self.files[index])
        self.cpu_decoded += 1
        return img.to(self.device, non_blocking=True)

    def _decode_batched(self, data: list[torch.Tensor], ids: list[int], images: list) -> None:
        """Decode `ids` in one batched call; if it fails, bisect, so only the files that fail alone
        are left undecoded (for the CPU). k culprits in n files cost about 2 k log2(n / k) calls."""
        pending = [ids] if ids else []
        while pending:
            part = pending.pop()
            self.batched_calls += 1
            try:
                decoded = self.batch_decode([data[i] for i in part], self.device)
            except (RuntimeError, ValueError):
                if len(part) > 1:
                    mid = len(part) // 2
                    pending += [part[mid:], part[:mid]]
                continue
            for i, img in zip(part, decoded):
                images[i] = img

    def decode(self, batch: EncodedBatch) -> list[torch.Tensor]:
        data = batch.data
        ok = batch.nvjpeg_ok
        ok = ok.tolist() if ok is not None else [nvjpeg_friendly(memoryview(b.numpy())) for b in data]
        images: list[torch.Tensor | None] = [None] * len(data)
        self._decode_batched(data, [i for i, fast in enumerate(ok) if fast], images)
        for i, img in enumerate(images):
            if img is None:
                images[i] = self._decode_cpu(data[i], int(batch.index[i]))
        return images

    def __call__(self, batch: EncodedBatch) -> torch.Tensor:
        images = self.decode(batch)
        # Shapes are host metadata: reading them does not wait for the device.
        sizes = torch.tensor([img.shape[1:] for img in images], dtype=torch.int64).view(-1, 2)
        boxes = draw_crop_boxes(sizes, self.train, self.generator)
        if self.resize == "batched":
            return resized_crops(images, boxes, self.size)
        return resized_crops_loop(images, boxes, self.size)
