"""Each batch decoded by two hands at once: the DataLoader workers decode a share of its photos on
the CPU (cropped and resized there), the GPU decoder the rest.

Why it exists: on an H200 with 16 host cores (benchmarks/results/2026-11-30-h200/), the GPU
decoder alone delivers 5.2-7.3k img/s and 14 CPU workers alone 3.3k, but during training the GPU
decode slows to the pace of the step beside it. Decoding part of every batch on otherwise idle
worker cores was meant to shorten what the GPU decoder must do per batch. Measured there, it gained
nothing (shares 0.3-0.7: 3,396-3,602 img/s against 3,734 with graphs; 0.5: 4,070 against 4,708
without): the waits, not the amount of decoding, set the pace. Off by default (`--cpu-share 0`);
kept for hosts where the GPU decoder's work, not its waits, is the limit.

A worker answers a whole batch of indices (`batch_size=None` with a `BatchSampler`): the first
`round(share * n)` indices are decoded by `CpuDecodedFolder` (random-resized crop, DCT scaling),
the rest are only read, as `EncodedFolderDataset` reads them. `GpuDecoder` decodes the encoded
part and puts the two together in the batch's order.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset

from cnnpar.data.cpu_decode import CpuDecodedFolder
from cnnpar.data.crop_resize import RRC_SCALE
from cnnpar.data.gpu_decode import EncodedBatch, EncodedFolderDataset, collate_encoded


@dataclass
class HybridBatch:
    """`decoded` (k, 3, S, S) uint8: the batch's first k images, done by a worker; `encoded`: the
    rest, still compressed. `index` is the data-set index of every image, in batch order."""

    decoded: torch.Tensor
    encoded: EncodedBatch
    decoded_index: torch.Tensor

    @property
    def index(self) -> torch.Tensor:
        return torch.cat([self.decoded_index, torch.as_tensor(self.encoded.index)])

    def __len__(self) -> int:
        return len(self.decoded) + len(self.encoded)

    def pin_memory(self) -> HybridBatch:
        return HybridBatch(self.decoded.pin_memory(), self.encoded, self.decoded_index)


class HybridFolder(Dataset):
    """`dataset[list of indices]` -> `(HybridBatch, labels)`; `share` of each batch decoded here."""

    answers_batches = True  # the loader hands it whole index lists (batch_size=None)

    def __init__(
        self,
        files: list[Path],
        labels,
        size: int,
        train: bool,
        share: float,
        min_scale: float = RRC_SCALE[0],
        named_damaged: torch.Tensor | None = None,
    ) -> None:
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"share: expected 0 <= share <= 1, got {share}")
        self.share = share
        self.cpu = CpuDecodedFolder(files, labels, size, train, min_scale=min_scale, named_damaged=named_damaged)
        # the CPU half's path table, not a second one made from the list: 2.5 s and 85 MiB more for ImageNet's
        # 1.28 million files (folder.PathTable)
        self.encoded = EncodedFolderDataset(self.cpu.files, labels, size)

    def __len__(self) -> int:
        return len(self.encoded)

    @property
    def epoch_seed(self) -> int | None:  # the CPU share's crops follow the epoch's seed (loader.ReseedingWorkers)
        return self.cpu.epoch_seed

    @epoch_seed.setter
    def epoch_seed(self, seed: int | None) -> None:
        self.cpu.epoch_seed = seed

    def encoded_batch(self, indices: list[int]) -> EncodedBatch:
        """All of `indices` read as bytes, as the GPU decoder alone would get them (for comparisons)."""
        return collate_encoded([self.encoded[i] for i in indices])[0]

    def __getitem__(self, indices):
        return self.__getitems__(indices)

    def __getitems__(self, indices: list[int]) -> tuple[HybridBatch, torch.Tensor]:
        k = round(self.share * len(indices))
        on_cpu, on_gpu = list(indices[:k]), list(indices[k:])
        if on_cpu:
            decoded, cpu_labels, cpu_index = self.cpu[on_cpu]
        else:
            decoded = torch.empty(0, 3, self.cpu.size, self.cpu.size, dtype=torch.uint8)
            cpu_labels = cpu_index = torch.empty(0, dtype=torch.int64)
        if on_gpu:
            encoded, gpu_labels = collate_encoded([self.encoded[i] for i in on_gpu])
        else:
            empty = torch.empty(0, dtype=torch.int64)
            encoded = EncodedBatch(torch.empty(0, dtype=torch.uint8), torch.zeros(1, dtype=torch.int64), empty)
            gpu_labels = empty
        return HybridBatch(decoded, encoded, cpu_index), torch.cat([cpu_labels, gpu_labels])
