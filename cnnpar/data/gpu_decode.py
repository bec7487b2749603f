"""JPEG decoding on the GPU (nvJPEG) for image folders.

CPU decoding is what starves a GPU training on photos: one core decodes a few hundred
ImageNet-sized JPEGs per second, a ResNet-50 step on an H200 consumes thousands. Here worker
processes only read file bytes; the batch crosses to the device still compressed, is decoded
by `torchvision.io.decode_jpeg(list, device="cuda")` in one batched call, then cropped and
resized on the device. PNGs (and any JPEG nvJPEG refuses) are decoded on the CPU instead, one by
one, which also finds and names a corrupt file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from cnnpar.errors import DataError

JPEG_MAGIC = b"\xff\xd8"
RRC_SCALE = (0.25, 1.0)  # random-resized-crop area range; 0.08 is ImageNet's classic lower bound
RRC_RATIO = (3 / 4, 4 / 3)


@dataclass
class EncodedBatch:
    """Compressed images of one batch as one flat byte buffer with offsets, and their data-set
    indices (to name a file that fails).

    One tensor per batch, not one per image: a worker hands each tensor to the main process
    through its own shared-memory segment, and 256 segments per batch cost more than the decode.
    """

    flat: torch.Tensor
    offsets: torch.Tensor
    index: torch.Tensor

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
        try:
            data = self.files[i].read_bytes()
        except OSError as e:
            raise DataError(f"{self.files[i]}: cannot read ({e.strerror})") from None
        return torch.frombuffer(bytearray(data), dtype=torch.uint8), self.labels[i], i


def collate_encoded(batch):
    data, labels, index = zip(*batch)
    offsets = torch.zeros(len(data) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.as_tensor([len(d) for d in data]), 0)
    return EncodedBatch(torch.cat(data), offsets, torch.as_tensor(index)), torch.stack(labels)


def _crop_box(h: int, w: int, train: bool, size: int, g: torch.Generator) -> tuple[int, int, int, int]:
    """(top, left, height, width): a random-resized crop for training, a centre square otherwise."""
    if train:
        area = h * w
        for _ in range(10):
            target = area * float(torch.empty(1).uniform_(*RRC_SCALE, generator=g))
            log_r = torch.empty(1).uniform_(math.log(RRC_RATIO[0]), math.log(RRC_RATIO[1]), generator=g)
            ratio = math.exp(float(log_r))
            cw, ch = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
            if 0 < cw <= w and 0 < ch <= h:
                top = int(torch.randint(0, h - ch + 1, (1,), generator=g))
                left = int(torch.randint(0, w - cw + 1, (1,), generator=g))
                return top, left, ch, cw
    side = min(h, w)
    return (h - side) // 2, (w - side) // 2, side, side


class GpuDecoder:
    def __init__(self, files: list[Path], size: int, device: torch.device, train: bool, seed: int = 0) -> None:
        self.files, self.size, self.device, self.train = files, size, device, train
        self.generator = torch.Generator().manual_seed(seed)

    def _decode_cpu(self, buf: torch.Tensor, index: int) -> torch.Tensor:
        from torchvision.io import ImageReadMode, decode_image

        try:
            return decode_image(buf, mode=ImageReadMode.RGB).to(self.device, non_blocking=True)
        except (RuntimeError, ValueError) as e:
            raise DataError(
                f"{self.files[index]}: cannot decode as an image ({str(e).splitlines()[0]}): "
                f"expected a readable JPEG or PNG file"
            ) from None

    def decode(self, batch: EncodedBatch) -> list[torch.Tensor]:
        from torchvision.io import ImageReadMode, decode_jpeg

        data = batch.data
        jpeg = [i for i, b in enumerate(data) if bytes(b[:2].tolist()) == JPEG_MAGIC]
        images: list[torch.Tensor | None] = [None] * len(data)
        if jpeg:
            try:
                decoded = decode_jpeg([data[i] for i in jpeg], mode=ImageReadMode.RGB, device=self.device)
                for i, img in zip(jpeg, decoded):
                    images[i] = img
            except RuntimeError:
                pass  # one bad file fails the whole batched call: decode the rest one by one below
        for i, img in enumerate(images):
            if img is None:
                images[i] = self._decode_cpu(data[i], int(batch.index[i]))
        return images

    def __call__(self, batch: EncodedBatch) -> torch.Tensor:
        out = torch.empty(len(batch.index), 3, self.size, self.size, dtype=torch.uint8, device=self.device)
        for i, img in enumerate(self.decode(batch)):
            top, left, ch, cw = _crop_box(img.shape[1], img.shape[2], self.train, self.size, self.generator)
            crop = img[None, :, top : top + ch, left : left + cw].float()
            resized = F.interpolate(crop, size=(self.size, self.size), mode="bilinear", antialias=True)
            out[i] = resized[0].round_().clamp_(0, 255).to(torch.uint8)
        return out
