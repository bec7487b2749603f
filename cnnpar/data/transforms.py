"""Conversion, normalisation and augmentation of whole uint8 batches on the device.

One fused multiply-add turns uint8 into normalised floats; flips and crops are batched tensor
ops (a mask, a gather) rather than per-image Python, so the host only ever moves uint8 bytes.
The textbook per-sample transform lives here too, as the baseline the benchmarks measure against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

CROP_PAD = 4


def resolve_augment(augment: str, shape: tuple[int, int, int]) -> str:
    """auto: pad-and-crop plus flip for colour images, nothing for grey ones (digits read mirrored
    are other digits)."""
    if augment != "auto":
        return augment
    return "crop+flip" if shape[0] == 3 else "none"


def random_flip(x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    flip = torch.rand(x.shape[0], 1, 1, 1, device=x.device, generator=generator) < 0.5
    return torch.where(flip, x.flip(-1), x)


def random_crop(x: torch.Tensor, pad: int, generator: torch.Generator | None) -> torch.Tensor:
    """Reflect-pad by `pad` and take a random HxW window per image, in one gather."""
    n, c, h, w = x.shape
    padded = F.pad(x, (pad, pad, pad, pad), mode="reflect")
    dy = torch.randint(0, 2 * pad + 1, (n, 1), device=x.device, generator=generator)
    dx = torch.randint(0, 2 * pad + 1, (n, 1), device=x.device, generator=generator)
    rows = (dy + torch.arange(h, device=x.device)).view(n, 1, h, 1)
    cols = (dx + torch.arange(w, device=x.device)).view(n, 1, 1, w)
    batch = torch.arange(n, device=x.device).view(n, 1, 1, 1)
    chan = torch.arange(c, device=x.device).view(1, c, 1, 1)
    return padded[batch, chan, rows, cols]


class DeviceTransform:
    def __init__(self, mean, std, augment: str, channels_last: bool, device: torch.device, seed: int = 0) -> None:
        std_t = torch.tensor(std, dtype=torch.float32, device=device).view(1, -1, 1, 1)
        mean_t = torch.tensor(mean, dtype=torch.float32, device=device).view(1, -1, 1, 1)
        # (x / 255 - mean) / std == x * scale + shift, one fused op over the batch
        self.scale = 1.0 / (255.0 * std_t)
        self.shift = -mean_t / std_t
        self.flip = "flip" in augment
        self.crop = "crop" in augment
        self.channels_last = channels_last
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def __call__(self, x: torch.Tensor, train: bool) -> torch.Tensor:
        x = torch.addcmul(self.shift, x.to(torch.float32), self.scale) if x.dtype == torch.uint8 else x
        if train and self.crop:
            x = random_crop(x, CROP_PAD, self.generator)
        if train and self.flip:
            x = random_flip(x, self.generator)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x


class TextbookDataset(Dataset):
    """What most tutorials write: per-sample float conversion, normalisation and augmentation on
    the CPU, then the default collate stacks float tensors. Kept only as a measured baseline."""

    def __init__(self, base: Dataset, mean, std, augment: str, train: bool) -> None:
        self.base, self.train = base, train
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)
        self.flip, self.crop = "flip" in augment, "crop" in augment

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int):
        x, y = self.base[i]
        x = (x.float() / 255.0 - self.mean) / self.std
        if self.train and self.crop:
            x = random_crop(x[None], CROP_PAD, None)[0]
        if self.train and self.flip and torch.rand(()) < 0.5:
            x = x.flip(-1)
        return x, y
