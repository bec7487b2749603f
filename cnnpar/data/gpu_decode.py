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
from cnnpar.data.jpeg_header import header_ok, read_jpeg_header
from cnnpar.data.tv_codecs import tv_codecs

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
    hw: torch.Tensor | None = None  # (N, 2) height, width from each JPEG's header; 0, 0 where unknown

    def __len__(self) -> int:
        return len(self.index)

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
        # The header is read here, in the worker, so the main process does no per-file Python work;
        # its size lets the crop be drawn before decoding (and only the crop be decoded).
        header = read_jpeg_header(memoryview(data.numpy()))
        hw = (header.height, header.width) if header is not None else (0, 0)
        return data, self.labels[i], i, header_ok(header), hw


def collate_encoded(batch):
    data, labels, index, ok, hw = zip(*batch)
    offsets = torch.zeros(len(data) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.as_tensor([len(d) for d in data]), 0)
    encoded = EncodedBatch(
        torch.cat(data),
        offsets,
        torch.as_tensor(index),
        torch.as_tensor(ok, dtype=torch.bool),
        torch.as_tensor(hw, dtype=torch.int64).view(-1, 2),
    )
    return encoded, torch.stack(labels)


_alloc_streams: dict[torch.device, torch.cuda.Stream] = {}


def nvjpeg_decode(buffers: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """`decode_jpeg(buffers, RGB, device)` in one call: nvJPEG on CUDA, libjpeg-turbo on the CPU.

    Raises RuntimeError (or ValueError) if any one buffer fails; returns (3, H, W) uint8 images.
    """
    from torchvision.io import ImageReadMode, decode_jpeg

    if device.type != "cuda":
        with tv_codecs():  # torchvision 0.29's deprecation notice: known, see docs/decoding.md
            return decode_jpeg(buffers, mode=ImageReadMode.RGB, device=device)
    # Outputs come from a private stream's pool (see the module docstring: torchvision lets nvJPEG
    # write into blocks the caller's stream may still be reading); record_stream holds each block
    # until the consumer stream has finished with it.
    consumer = torch.cuda.current_stream(device)
    key = torch.device("cuda", consumer.device_index)
    if key not in _alloc_streams:
        _alloc_streams[key] = torch.cuda.Stream(key)
    alloc = _alloc_streams[key]
    with torch.cuda.stream(alloc), tv_codecs():  # tv_codecs: see docs/decoding.md
        images = decode_jpeg(buffers, mode=ImageReadMode.RGB, device=key)  # note: host sync inside
    # Any kernel torchvision queued on the then-current stream after its decode (a layout change,
    # say) ran on `alloc`: the consumer must not read the images before that work is done.
    consumer.wait_stream(alloc)
    for img in images:
        img.record_stream(consumer)
    return images


class GpuDecoder:
    """Encoded batch in, (N, 3, size, size) uint8 batch on `device` out.

    Per batch: files the GPU decoders cannot take (PNGs, CMYK: from the headers the workers read)
    are decoded on the CPU first; then the crop boxes are drawn for the whole batch from the
    image sizes (random-resized crops for training, the centre square for evaluation); then the
    rest is decoded in one batched call, `backend` "nvjpeg" (torchvision's nvJPEG call; a failing
    batch is bisected) or "nvimgcodec" (hardware engines; only the crop region, an undecodable
    file comes back alone); a file the batched call did not decode goes to the CPU; finally all
    crops are resized in one batched call ("batched", a few kernels per batch) or one at a time
    ("loop", the reference). `batch_decode` replaces the nvJPEG call in tests.

    The host waits for the device at most inside the decode call itself (torchvision synchronises
    its decode stream); everything else is queued. `DeviceFeeder` runs this in its own thread.
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
        backend: str = "nvjpeg",
    ) -> None:
        self.files, self.size, self.device, self.train = files, size, torch.device(device), train
        self.generator = torch.Generator().manual_seed(seed)
        self.batch_decode = batch_decode
        # batched: 33,557 img/s against the loop's 9,939 for 256 ImageNet photos on an H200
        # (shared/measurements/h200-2026-11-30/jpeg_decode_cuda.log); on the CPU the loop was
        # 6-15x faster (benchmarks/results/jpeg_decode_cpu.csv): launches are cheap there.
        self.resize = resize if resize not in (None, "auto") else ("batched" if self.device.type == "cuda" else "loop")
        if self.resize not in ("batched", "loop"):
            raise ValueError(f"resize: expected 'batched' or 'loop', got {self.resize!r}")
        if backend not in ("nvjpeg", "nvimgcodec"):
            raise ValueError(f"backend: expected 'nvjpeg' or 'nvimgcodec', got {backend!r}")
        self.nvimgcodec = None
        if backend == "nvimgcodec":
            from cnnpar.data.nvimgcodec_decode import NvImageCodecDecode

            self.nvimgcodec = NvImageCodecDecode(self.device)
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

    def decode(self, batch: EncodedBatch) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The batch's images, each (3, H, W) (a view, possibly of HWC memory), and the crop boxes
        (N, 4) in each returned image's own coordinates."""
        data = batch.data
        n = len(data)
        ok = batch.nvjpeg_ok
        if ok is None or batch.hw is None:  # batches made without workers: read the headers here
            headers = [read_jpeg_header(memoryview(b.numpy())) for b in data]
            ok = [header_ok(h) for h in headers]
            hw = torch.tensor([(h.height, h.width) if h else (0, 0) for h in headers], dtype=torch.int64).view(n, 2)
        else:
            ok, hw = ok.tolist(), batch.hw.clone()
        images: list[torch.Tensor | None] = [None] * n
        for i in range(n):
            if not ok[i]:  # no GPU decoder takes it; its size comes from decoding it
                images[i] = self._decode_cpu(data[i], int(batch.index[i]))
                hw[i] = torch.tensor(images[i].shape[1:])
        boxes = draw_crop_boxes(hw, self.train, self.generator)
        fast = [i for i in range(n) if ok[i]]
        if self.nvimgcodec is not None:
            region = self.nvimgcodec.regions
            decoded = self.nvimgcodec([data[i] for i in fast], boxes[fast] if fast else None)
            self.batched_calls += 1
            for i, img in zip(fast, decoded):
                if img is not None:
                    images[i] = img.permute(2, 0, 1)  # (3, H, W) view of interleaved memory
                    if region:  # the image is the crop
                        boxes[i] = torch.tensor([0, 0, boxes[i, 2], boxes[i, 3]])
        else:
            self._decode_batched(data, fast, images)
        for i in range(n):
            if images[i] is None:  # the batched decode refused it alone; the CPU decodes or names it
                images[i] = self._decode_cpu(data[i], int(batch.index[i]))
                if tuple(images[i].shape[1:]) != tuple(hw[i].tolist()):  # the header lied
                    boxes[i] = draw_crop_boxes(torch.tensor([images[i].shape[1:]]), self.train, self.generator)[0]
        return images, boxes

    def __call__(self, batch) -> torch.Tensor:
        if hasattr(batch, "decoded"):  # a HybridBatch: the workers decoded its first images
            done = batch.decoded.to(self.device, non_blocking=True)
            return torch.cat([done, self(batch.encoded)]) if len(batch.encoded) else done
        if len(batch) == 0:
            return torch.empty(0, 3, self.size, self.size, dtype=torch.uint8, device=self.device)
        images, boxes = self.decode(batch)
        if self.resize == "loop":
            out = resized_crops_loop(images, boxes, self.size)
        else:
            out = resized_crops(images, boxes, self.size, hwc=self.nvimgcodec is not None)
        if self.nvimgcodec is not None and self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
            self.nvimgcodec.copied(event)
        return out
