"""Conversion, normalisation and augmentation of whole uint8 batches on the device.

One fused multiply-add turns uint8 into normalised floats; flips and crops are batched tensor
ops (a mask, a gather) rather than per-image Python, so the host only ever moves uint8 bytes.
The textbook per-sample transform lives here too, as the baseline the benchmarks measure against.

`augment` is a '+'-joined set of tokens:
- `crop`: reflect-pad 4 px and take a random window (a shift of up to 4 px each way);
- `translate`: the same with 2 px, as airbench94 does (a milder shift suits short CIFAR-10 runs);
- `flip`: mirror each image with probability 1/2, independently every epoch;
- `altflip`: alternating flip (airbench): in the first epoch each image is mirrored or not by a
  seeded coin of its own, and every later epoch does the opposite of the one before, so each
  image is seen both ways in every two consecutive epochs instead of by chance. The decision is a
  function of (sample index, epoch parity, seed) alone, so it needs the sample's index at
  transform time (the loaders hand it over) and is the same whichever rank draws the sample.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from cnnpar.data.crop_resize import RRC_SCALE

CROP_PAD = 4
TRANSLATE_PAD = 2
AUGMENT_TOKENS = ("crop", "translate", "flip", "altflip")


def augment_tokens(augment: str) -> frozenset[str]:
    """'crop+altflip' -> {'crop', 'altflip'}; 'none' -> {} (the config validates the spelling)."""
    return frozenset(t for t in augment.split("+") if t in AUGMENT_TOKENS)


def augment_pad(tokens: frozenset[str]) -> int:
    """Pixels of padding the crop (4) or the translate (2) draws its shifts from; 0 for neither."""
    return CROP_PAD if "crop" in tokens else TRANSLATE_PAD if "translate" in tokens else 0


def resolve_augment(augment: str, shape: tuple[int, int, int], loader_crops: bool = False, grey: bool = False) -> str:
    """auto: pad-and-crop plus flip for colour images, nothing for grey ones (digits read mirrored are other
    digits); only the flip where the loader already drew random-resized crops (photos). `grey`: the images are grey
    though they have 3 channels (a folder or store of grey files, decoded to RGB): grey, whatever `shape` says;
    the loader's random-resized crops stay (they are the folder's reading, not --augment's)."""
    if augment != "auto":
        return augment
    if grey:
        return "none"
    if loader_crops:
        return "flip"
    return "crop+flip" if shape[0] == 3 else "none"


MIRRORS = frozenset({"flip", "altflip"})


def _auto_mirrors(shape: tuple[int, int, int], loader_crops: bool, grey: bool) -> bool:
    """Whether --augment auto mirrors these images: where it does, a mirror keeps their labels."""
    return bool(augment_tokens(resolve_augment("auto", shape, loader_crops, grey)) & MIRRORS)


def _images(shape: tuple[int, int, int], grey: bool) -> str:
    return "grey (3-channel) images" if grey and shape[0] != 1 else f"{shape[0]}-channel images"


def mirror_warning(
    augment: str, shape: tuple[int, int, int], loader_crops: bool, origin: str, grey: bool = False
) -> str:
    """A warning line where `augment` (resolved) mirrors images that `resolve_augment`'s auto would not mirror
    (grey arrays such as the built-in digits, or a folder of grey files: a digit read mirrored is another digit,
    or none), "" otherwise. A preset for colour photos (cifar10-*) run on the digits mirrored them silently: cnn3
    on the digits, 4 epochs on a 2-core CPU, scored 98.89 % validation accuracy without augmentation and 82.17 %
    with crop+flip."""
    if not augment_tokens(augment) & MIRRORS or _auto_mirrors(shape, loader_crops, grey):
        return ""
    return (
        f"warning: augment {augment} mirrors the {_images(shape, grey)} of {origin}, which --augment auto "
        "leaves unmirrored (a mirrored digit reads as another): pass --augment none, crop or translate unless "
        "mirrored images keep their labels"
    )


def tta_mirror_warning(
    views: str, shape: tuple[int, int, int], loader_crops: bool, origin: str, grey: bool = False
) -> str:
    """The same warning for test-time views (`--tta-level flip`): the accuracy then averages in mirrored views of
    images whose mirror is another class (cnn3 on the digits scored far lower with them, and nothing said so)."""
    if "flip" not in views.split("+") or _auto_mirrors(shape, loader_crops, grey):
        return ""
    return (
        f"warning: test-time views {views} mirror the {_images(shape, grey)} of {origin}, which --augment auto "
        "leaves unmirrored (a mirrored digit reads as another): the validation accuracy averages in those views; "
        "pass --tta-level none unless mirrored images keep their labels"
    )


def random_flip(x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    flip = torch.rand(x.shape[0], 1, 1, 1, device=x.device, generator=generator) < 0.5
    return torch.where(flip, x.flip(-1), x)


def alternating_flip_bits(n: int, seed: int) -> torch.Tensor:
    """One seeded coin per sample (uint8 0/1): whether it is mirrored in odd-numbered epochs.

    Drawn on the CPU from `seed` alone (not seed + rank): under DDP a sample moves between ranks
    from epoch to epoch, and its flip must not depend on which rank draws it."""
    return torch.randint(0, 2, (n,), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


def alternating_flip(x: torch.Tensor, bits: torch.Tensor, index: torch.Tensor, epoch: int) -> torch.Tensor:
    """Mirror image k when bits[index[k]] XOR (epoch is even): epoch e + 1 undoes epoch e's choice."""
    flip = (bits.index_select(0, index) ^ (1 - epoch % 2)).bool().view(-1, 1, 1, 1)
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
    def __init__(
        self,
        mean,
        std,
        augment: str,
        channels_last: bool,
        device: torch.device,
        seed: int = 0,
        num_samples: int = 0,
        flip_seed: int = 0,
    ) -> None:
        std_t = torch.tensor(std, dtype=torch.float32, device=device).view(1, -1, 1, 1)
        mean_t = torch.tensor(mean, dtype=torch.float32, device=device).view(1, -1, 1, 1)
        # (x / 255 - mean) / std == x * scale + shift, one fused op over the batch
        self.scale = 1.0 / (255.0 * std_t)
        self.shift = -mean_t / std_t
        tokens = augment_tokens(augment)
        self.flip = "flip" in tokens
        self.pad = augment_pad(tokens)
        self.crop = self.pad > 0
        # altflip: the per-sample coins live on the device beside the data (one byte a sample)
        self.alt_bits = alternating_flip_bits(num_samples, flip_seed).to(device) if "altflip" in tokens else None
        self.epoch = 0
        self.channels_last = channels_last
        self.generator = torch.Generator(device=device).manual_seed(seed)

    @property
    def needs_index(self) -> bool:
        return self.alt_bits is not None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __call__(self, x: torch.Tensor, train: bool, index: torch.Tensor | None = None) -> torch.Tensor:
        # Crops and flips only move pixels and the normalisation is the same affine map for every
        # pixel of a channel, so augmenting first gives the same floats bit for bit: on uint8 each
        # pass moves a quarter of the bytes (a 2,000-image CIFAR-10 batch: 6 MB, not 25 MB a pass).
        if train and self.crop:
            x = random_crop(x, self.pad, self.generator)
        if train and self.flip:
            x = random_flip(x, self.generator)
        if train and self.alt_bits is not None:
            if index is None:
                raise RuntimeError("alternating flip needs the batch's sample indices (the loader hands them over)")
            index = torch.as_tensor(index)  # a JPEG batch's indices come as an array (gpu_decode.EncodedBatch)
            x = alternating_flip(x, self.alt_bits, index.to(x.device, non_blocking=True), self.epoch)
        if self.channels_last:  # on uint8 too: the multiply-add below keeps the layout it is given
            x = x.contiguous(memory_format=torch.channels_last)
        if x.dtype == torch.uint8:
            x = torch.addcmul(self.shift, x.to(torch.float32), self.scale)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)  # a no-op where addcmul kept the layout
        return x


def keyed_generator(epoch_seed: int | None, key: int) -> torch.Generator:
    """The generator of one batch's or one sample's augmentation: a function of the epoch's seed (`epoch_seed`,
    set in each worker by loader.ReseedingWorkers; else this process's seed, which in the main process is the
    epoch's, engine/rng.py) and `key` (the batch's first index, or the sample's), not of the worker that draws it,
    so --workers cannot change the augmentation."""
    base = epoch_seed if epoch_seed is not None else torch.initial_seed()
    return torch.Generator().manual_seed(mix_seed(base, int(key)))


_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """SplitMix64's output function (Steele et al. 2014): a bijection of 64-bit ints whose outputs for nearby
    inputs look unrelated."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def mix_seed(base: int, key: int) -> int:
    """A seed in [0, 2**63) for the pair (base, key), deterministic in every process (integer arithmetic, no
    `hash()`). It was base * 1,000,003 + key: the epoch seeds of neighbouring ranks are consecutive
    (engine/rng.py), so rank r's sample k + 1,000,003 drew the crops of rank r + 1's sample k in a data set of
    more than a million images. Hashing base first, then key into it, leaves no such linear relation."""
    return _splitmix64(_splitmix64(base & _MASK64) ^ (key & _MASK64)) >> 1


class TextbookDataset(Dataset):
    """What most tutorials write: per-sample float conversion, normalisation and augmentation on
    the CPU, then the default collate stacks float tensors. Kept only as a measured baseline: it
    sees no batch, so `altflip` is a plain random flip here. Each sample's crop and flip come from
    `keyed_generator(epoch_seed, index)`, as CpuDecodedFolder's crops do: drawn from the global
    generator, they were the draws of whichever worker a sample was dealt to.

    A base that reads photos (an image folder, a store: `random_resized_crop`) gives training samples as
    random-resized crops with area share `min_scale` to 1, as the fast loader's decoders do: --augment auto
    adds only the flip there (`resolve_augment`'s `loader_crops`), and the base's own item is the evaluation's
    centre crop, so every epoch trained on the same crop, mirrored or not, under a log line saying otherwise."""

    def __init__(self, base: Dataset, mean, std, augment: str, train: bool, min_scale: float = RRC_SCALE[0]) -> None:
        self.base, self.train, self.min_scale = base, train, min_scale
        self.crops = train and hasattr(base, "random_resized_crop")
        self.epoch_seed: int | None = None
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)
        tokens = augment_tokens(augment)
        self.flip = "flip" in tokens or "altflip" in tokens
        self.pad = augment_pad(tokens)

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int):
        g = keyed_generator(self.epoch_seed, i) if self.train else None
        # the crop draws first, then the flip, from the sample's one generator
        x, y = self.base.random_resized_crop(i, g, self.min_scale) if self.crops else self.base[i]
        x = (x.float() / 255.0 - self.mean) / self.std
        if not self.train or not (self.pad or self.flip):
            return x, y
        if self.pad:
            x = random_crop(x[None], self.pad, g)[0]
        if self.flip and torch.rand((), generator=g) < 0.5:
            x = x.flip(-1)
        return x, y
