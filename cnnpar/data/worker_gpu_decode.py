"""Photos decoded on the GPU by the DataLoader's worker processes instead of the training process.

Why: on an H200 (benchmarks/results/2026-12-01-h200/call-f/), a GPU decoder's calls in a thread of
the training process are starved of the GIL. Beside a thread that keeps the interpreter busy, one
batch of 256 photos took 3.0 s with nvJPEG and 10.5 s with nvImageCodec instead of 0.02-0.04 s:
nvImageCodec gives the GIL back and takes it again several times per image, and torch releases it
around every op, so each retake waits for the busy thread. The training thread's own Python (a
compiled step's launches) is such a thread. In a worker process each decoder has a GIL of its own.

Each worker makes its own CUDA context on the training GPU (so the loader starts its workers with
"spawn": a forked child of a process that already uses CUDA cannot use it), decodes its batch with
`GpuDecoder` (nvImageCodec's hardware engines by default: the step's SMs stay free), crops and
resizes it there, and copies the (N, 3, S, S) uint8 result into shared memory in one copy. The
training process receives ready batches, as from the CPU workers (`CpuDecodedFolder`), and only
normalises and flips them.

The random-resized crops follow `torch.initial_seed()` of the worker, which the loader reseeds per
epoch (loader.ReseedingWorkers), as the CPU workers' crops do.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import Dataset

from cnnpar.data.cpu_decode import shared_uint8
from cnnpar.data.crop_resize import RRC_SCALE
from cnnpar.data.folder import PathTable
from cnnpar.data.gpu_decode import EncodedFolderDataset, GpuDecoder, collate_encoded

# nvImageCodec's own host threads per worker: the workers already run one per core between them
WORKER_CODEC_THREADS = 2


class WorkerGpuDecodedFolder(Dataset):
    """`dataset[list of indices]` -> `(uint8 batch (N, 3, size, size), labels, indices)`, decoded,
    cropped and resized on `device` by the process that asks (a DataLoader worker)."""

    answers_batches = True  # the loader hands it whole index lists (batch_size=None)
    start_method = "spawn"  # workers use CUDA: not from a fork of a process that already does

    def __init__(
        self,
        files: list[Path],
        labels,
        size: int,
        train: bool,
        device: torch.device,
        backend: str = "nvimgcodec",
        min_scale: float = RRC_SCALE[0],
    ) -> None:
        self.files, self.size, self.train, self.backend = PathTable(files), size, train, backend  # folder.PathTable
        self.min_scale = min_scale
        self.labels = torch.as_tensor(labels, dtype=torch.int64)
        self.device = torch.device(device)
        self.encoded = EncodedFolderDataset(self.files, self.labels, size)
        self._decoder: GpuDecoder | None = None
        self._seed: int | None = None

    def __len__(self) -> int:
        return len(self.files)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_decoder": None, "_seed": None}  # each process makes its own

    def decoder(self) -> GpuDecoder:
        if self._decoder is None:
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            self._decoder = GpuDecoder(
                self.files,
                self.size,
                self.device,
                self.train,
                backend=self.backend,
                codec_threads=WORKER_CODEC_THREADS,
                min_scale=self.min_scale,
            )
        seed = torch.initial_seed()
        if seed != self._seed:  # a new epoch (or worker): crops drawn from this process's seed
            self._decoder.generator.manual_seed(seed)
            self._seed = seed
        return self._decoder

    def __getitem__(self, indices):
        return self.__getitems__(indices)

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        index = torch.as_tensor(indices, dtype=torch.int64)
        encoded, labels = collate_encoded([self.encoded[i] for i in indices])
        out = self.decoder()(encoded)
        x = shared_uint8(tuple(out.shape))
        x.copy_(out)  # device to host, into the memory the main process will read: one copy
        return x, labels, index
