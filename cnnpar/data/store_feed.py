"""Training from a prepared store: raw pixels on the host, crops resized on the device.

Host path: a DataLoader worker answers a whole batch of indices with one flat uint8 tensor (the
batch's HWC images back to back, copied out of the memory-mapped file) and one small table (where
each image starts, its height and width, its data-set index and its label): two shared-memory
segments per batch, however many images it holds. `StoreCropper` copies the flat tensor to the
device, draws the crop boxes on the host and crops and resizes on the device in a few batched
kernels (`resized_crops_flat`), reading each image where it lies in the buffer.

Resident path: the whole pixel area lives on the device (when it fits); a batch is only its images'
offsets and sizes from the index, so nothing is gathered and nothing crosses the bus per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset

from cnnpar.data.crop_resize import RRC_SCALE, check_min_scale, draw_crop_boxes, resized_crops_flat, tail_room
from cnnpar.data.folder import PathTable
from cnnpar.data.store import StoreFile


@dataclass
class RawBatch:
    """A batch of stored images: `flat` holds them back to back (None when the pixel area is on
    the device); `meta` is one (5, N) int64 table, so a worker ships two tensors per batch."""

    flat: torch.Tensor | None
    meta: torch.Tensor  # rows: start in `flat` (or in the pixel area), height, width, data-set index, label

    @property
    def starts(self) -> torch.Tensor:
        return self.meta[0]

    @property
    def hw(self) -> torch.Tensor:
        return self.meta[1:3].t()

    @property
    def index(self) -> torch.Tensor:
        return self.meta[3]

    @property
    def labels(self) -> torch.Tensor:
        return self.meta[4]

    def pin_memory(self) -> RawBatch:
        # The DataLoader's pin thread calls this on custom batch types; the table stays pageable:
        # the crop boxes are drawn from it on the host.
        return self if self.flat is None else RawBatch(self.flat.pin_memory(), self.meta)


class StoreDataset(Dataset):
    """Images `ids` of a store, seen at `size` x `size`. Indexing with a list of indices answers
    the whole batch at once (the DataLoader runs with batch_size=None and a BatchSampler)."""

    answers_batches = True  # the loader hands it whole index lists (batch_size=None)

    def __init__(self, store: StoreFile, ids: torch.Tensor, size: int, with_pixels: bool = True) -> None:
        self.store, self.size, self.with_pixels = store, size, with_pixels
        self.ids = ids.to(torch.int64)
        self.labels = torch.from_numpy(store.labels)[self.ids]

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def in_memory(self) -> bool:
        """True for index-only batches (a resident pixel area): a lookup, no worker processes needed."""
        return not self.with_pixels

    def subset(self, idx: torch.Tensor) -> StoreDataset:
        return StoreDataset(self.store, self.ids[idx], self.size, self.with_pixels)

    def index_only(self) -> StoreDataset:
        return StoreDataset(self.store, self.ids, self.size, with_pixels=False)

    def __getitem__(self, i):
        if isinstance(i, (list, tuple)):
            return self.__getitems__(i)
        # One image at a time (the textbook loader): the centre square at size x size, on the CPU.
        batch, y = self.__getitems__([i])
        boxes = draw_crop_boxes(batch.hw, False)
        return resized_crops_flat(batch.flat, batch.starts, batch.hw, boxes, self.size, hwc=True)[0], y[0]

    def random_resized_crop(self, i: int, generator: torch.Generator, min_scale: float):
        """Image i as a training sample of the textbook loader: a random-resized crop, drawn as `StoreCropper`
        draws a batch's, resized to size x size on the CPU."""
        batch, y = self.__getitems__([i])
        boxes = draw_crop_boxes(batch.hw, True, generator, min_scale)
        return resized_crops_flat(batch.flat, batch.starts, batch.hw, boxes, self.size, hwc=True)[0], y[0]

    def __getitems__(self, indices) -> tuple[RawBatch, torch.Tensor]:
        sel = torch.as_tensor(indices, dtype=torch.int64).view(-1)
        ids = self.ids[sel].numpy()
        offsets, hw = self.store.offsets[ids], self.store.hw[ids]
        meta = torch.empty(5, len(ids), dtype=torch.int64)
        meta[1:3] = torch.from_numpy(hw.T)
        meta[3], meta[4] = sel, self.labels[sel]
        if not self.with_pixels:
            meta[0] = torch.from_numpy(offsets)
            return RawBatch(None, meta), meta[4]
        src = self.store.pixels
        self.store.check_unchanged()  # before reading: a page past a truncated file's end kills the process (SIGBUS)
        flat, starts = pack_hwc(hw, (src[o : o + 3 * h * w] for o, (h, w) in zip(offsets.tolist(), hw.tolist())))
        meta[0] = torch.from_numpy(starts)
        return RawBatch(flat, meta), meta[4]


def pack_hwc(hw: np.ndarray, images) -> tuple[torch.Tensor, np.ndarray]:
    """One flat uint8 buffer of HWC images of sizes `hw` (N, 2), each given as its bytes (an array or buffer), and
    where each starts: what `resized_crops_flat` reads. Tail room follows them, zeroed, for its row windows, so it
    never copies the buffer to pad it."""
    nbytes = 3 * hw[:, 0] * hw[:, 1]
    starts = np.cumsum(nbytes) - nbytes
    total = int(nbytes.sum())
    flat = torch.empty(total + tail_room(int(hw[:, 1].max())), dtype=torch.uint8)
    dst = flat.numpy()
    dst[total:] = 0
    for a, k, pixels in zip(starts.tolist(), nbytes.tolist(), images):
        dst[a : a + k] = np.frombuffer(pixels, dtype=np.uint8) if isinstance(pixels, bytes | bytearray) else pixels
    return flat, starts


def store_resident(mode: str, store: StoreFile, device: torch.device, share: float) -> bool:
    """Whether the store's pixel area goes to the device: `mode` 'on', or 'auto' on CUDA when it fits
    in `share` of the free memory (or is there already: the train loader put it there)."""
    if mode != "auto":
        return mode == "on"
    if device.type != "cuda":
        return False
    if store.is_on(device):
        return True
    free, _ = torch.cuda.mem_get_info(device)
    return store.pixel_bytes + store.tail_padding() < share * free


class StoreCropper:
    """RawBatch in, (N, 3, size, size) uint8 on `device` out, as `GpuDecoder` answers an encoded
    batch: a random-resized crop of each image when training, its centre square otherwise.

    The boxes come from a host generator seeded `seed` (the caller passes seed + rank). With
    `resident`, the store's whole pixel area is put on the device once and batches carry only
    offsets into it.
    """

    def __init__(
        self,
        ds: StoreDataset,
        device: torch.device,
        train: bool,
        seed: int = 0,
        resident: bool = False,
        min_scale: float = RRC_SCALE[0],
    ) -> None:
        self.size, self.device, self.train = ds.size, torch.device(device), train
        check_min_scale(min_scale)
        self.min_scale = min_scale
        self.generator = torch.Generator().manual_seed(seed)
        self.pixels = ds.store.on_device(self.device) if resident else None

    @property
    def resident(self) -> bool:
        return self.pixels is not None

    def __call__(self, batch: RawBatch) -> torch.Tensor:
        boxes = draw_crop_boxes(batch.hw, self.train, self.generator, self.min_scale)
        flat = self.pixels if self.pixels is not None else batch.flat.to(self.device, non_blocking=True)
        return resized_crops_flat(flat, batch.starts, batch.hw, boxes, self.size, hwc=True)


class PreparedFolder(Dataset):
    """An image folder read as a store's validation reads its photos, for `cnnpar predict` with a run trained from
    a store: each photo as `cnnpar prepare` stored it (`decode_for_store` within the store's `sides`: Pillow, DCT
    scaling, bilinear), then the centre square resized as `StoreCropper` resizes it (`resized_crops_flat`).
    Read the way a folder's validation reads it (a full decode, the centre square resized), the same photos
    differed from the store's validation pixels by 2.3 levels mean, so predict scored other pixels than val_acc.
    `dataset[list of indices]` is one batch `(x (N, 3, size, size) uint8, labels (N,) of -1, index (N,))`."""

    answers_batches = True

    def __init__(self, files: list, size: int, max_side: int, short_side: int) -> None:
        from cnnpar.data.store_write import Sides

        self.files, self.size = PathTable(files), size  # not a list: the workers share it (folder.PathTable)
        self.sides = Sides(max_side, short_side)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, indices):
        from cnnpar.data.store_write import decode_for_store

        indices = [indices] if isinstance(indices, int) else list(indices)
        decoded = [decode_for_store(self.files[i], self.sides) for i in indices]
        hw = np.array([(h, w) for _, h, w in decoded], dtype=np.int64).reshape(-1, 2)
        flat, starts = pack_hwc(hw, (pixels for pixels, _, _ in decoded))
        boxes = draw_crop_boxes(hw, False)
        x = resized_crops_flat(flat, starts, hw, boxes, self.size, hwc=True)
        index = torch.as_tensor(indices, dtype=torch.int64)
        return x, torch.full_like(index, -1), index
