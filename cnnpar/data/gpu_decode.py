"""JPEG decoding on the GPU (nvJPEG) for image folders.

CPU decoding is what starves a GPU training on photos: one core decodes a few hundred
ImageNet-sized JPEGs per second, a ResNet-50 step on an H200 consumes thousands. Here worker
processes only read file bytes (and look at each JPEG's header); the batch crosses to the device
still compressed, is decoded by `torchvision.io.decode_jpeg(list, device="cuda")` in one batched
call, then cropped and resized on the device in a few batched kernels (`crop_resize`).

Files nvJPEG cannot take (PNGs, CMYK JPEGs: see `jpeg_header`) are decoded on the CPU, one by one;
so is any file that makes the batched call fail, found by bisecting the batch, so that one odd
file costs a few extra batched calls instead of a whole batch decoded on the CPU. A file the CPU
cannot decode either is named in a DataError; one it decodes despite damage, in a warning (as the CPU
workers name it: nvJPEG and nvImageCodec report no damage in the files they decode themselves).

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
  outputs on a stream of its own (`private_stream`: not one of torch's pool, which other stages share)
  whose pool only ever holds earlier decode outputs, each marked with `record_stream` for the stream
  that reads it, so a block is reused only once its readers are done.
- It returns no partial results: one file that nvJPEG rejects fails the whole list.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from cnnpar.data.byte_slots import ByteSlots
from cnnpar.data.cpu_decode import decode_rgb_naming_damage
from cnnpar.data.crop_resize import (
    RRC_SCALE,
    check_min_scale,
    draw_crop_boxes,
    resized_crops,
    resized_crops_flat,
    resized_crops_loop,
    tail_room,
)
from cnnpar.data.folder import PathTable, check_pixel_count, read_encoded
from cnnpar.data.jpeg_header import decode_route, read_jpeg_header
from cnnpar.data.private_stream import private_stream
from cnnpar.data.tv_codecs import tv_codecs
from cnnpar.report.ranges import CROP_RESIZE, JPEG_DECODE, span

BatchDecode = Callable[[list[torch.Tensor], torch.device], list[torch.Tensor]]
GPU_BACKENDS = ("nvjpeg", "nvimgcodec", "hardware")


@dataclass
class EncodedBatch:
    """Compressed images of one batch as one flat byte buffer with offsets, their data-set indices
    (to name a file that fails) and, when the workers looked, which ones nvJPEG can take.

    One tensor per batch, not one per image: a worker hands each tensor to the main process
    through its own shared-memory segment, and 256 segments per batch cost more than the decode.
    The small per-image fields come from the workers as NumPy arrays (tensors made elsewhere work
    too): arrays are pickled by value, where each tensor costs the main process a segment to map
    and a dozen GIL round trips to rebuild, behind the training thread (docs/decoding.md).
    """

    flat: torch.Tensor | None  # None while the bytes lie in a loader slot (byte_slots): the decoder maps it in
    offsets: np.ndarray | torch.Tensor
    index: np.ndarray | torch.Tensor
    nvjpeg_ok: np.ndarray | torch.Tensor | None = None  # bool per image; None: the decoder reads the headers
    hw: np.ndarray | torch.Tensor | None = None  # (N, 2) height, width from each JPEG's header; 0, 0 where unknown
    hardware_ok: np.ndarray | torch.Tensor | None = None  # bool per image: the GPU's JPEG engines take it
    slot: int | None = None  # the loader's slot this batch holds (ByteSlots); its bytes lie there unless `flat` is set

    def __len__(self) -> int:
        return len(self.index)

    @cached_property
    def data(self) -> list[torch.Tensor]:
        # one call for the whole batch: a decode thread that takes the GIL back once per image
        # waits behind the training thread's Python each time (docs/decoding.md). Made on first use
        # only: the JPEG engines read `flat` itself and most batches never need these views.
        return list(torch.split(self.flat, np.diff(np.asarray(self.offsets)).tolist()))

    def pin_memory(self) -> EncodedBatch:
        return self  # compressed bytes are small; nothing worth pinning


class EncodedFolderDataset(Dataset):
    def __init__(self, files: list[Path], labels, size: int) -> None:
        self.files = PathTable(files)  # not a list: the workers share it (folder.PathTable)
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
        view = memoryview(data.numpy())
        header = read_jpeg_header(view)
        if header is not None:  # before any decoder sees it: nvJPEG, the engines and nvImageCodec have no limit here
            check_pixel_count(self.files[i], header.height, header.width)
        hw = (header.height, header.width) if header is not None else (0, 0)
        return data, self.labels[i], i, decode_route(header, view), hw


def collate_encoded(batch, slots: ByteSlots | None = None, slot: int | None = None):
    """Items of `EncodedFolderDataset` -> (EncodedBatch, labels). With a `slot` of `slots` the bytes are
    written there (the batch carries the slot's number); where they do not fit, into a tensor of their own."""
    data, labels, index, route, hw = zip(*batch)
    offsets = np.zeros(len(data) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(d) for d in data])
    route = np.asarray(route, dtype=np.int64)
    written = slot is not None and slots.write(slot, [d.numpy() for d in data]) >= 0
    encoded = EncodedBatch(
        None if written else torch.cat(data),  # too big for its slot: a tensor of its own, the slot still its
        offsets,
        np.asarray(index, dtype=np.int64),
        route >= 1,
        np.asarray(hw, dtype=np.int64).reshape(-1, 2),
        route == 2,
        slot=slot,
    )
    return encoded, torch.stack(labels)


class SlottedEncodedFolder(EncodedFolderDataset):
    """`EncodedFolderDataset` answering whole batches (`ds[indices]` or, from `SlottedBatches`,
    `ds[(indices, slot)]`) and writing each into its slot of `slots` where the loader gave it one
    (byte_slots says why). `slots` is set by the loader once it knows how many workers it has."""

    answers_batches = True

    def __init__(self, files: list[Path], labels, size: int) -> None:
        super().__init__(files, labels, size)
        self.slots: ByteSlots | None = None

    def __getitem__(self, item):
        indices, slot = item if isinstance(item, tuple) else (item, None)
        return collate_encoded([super(SlottedEncodedFolder, self).__getitem__(i) for i in indices], self.slots, slot)


_alloc_streams: dict[torch.device, torch.cuda.Stream | None] = {}  # torchvision's outputs' stream, per device
_alloc_lock = threading.Lock()


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
    with _alloc_lock:
        if key not in _alloc_streams:
            _alloc_streams[key] = private_stream(key)
        alloc = _alloc_streams[key]
    if alloc is None:  # no stream of its own: the caller's queued work done first, then its pool is safe
        consumer.synchronize()
        alloc = consumer
    with torch.cuda.stream(alloc), tv_codecs():  # tv_codecs: see docs/decoding.md
        images = decode_jpeg(buffers, mode=ImageReadMode.RGB, device=key)  # note: host sync inside
    # Any kernel torchvision queued on the then-current stream after its decode (a layout change,
    # say) ran on `alloc`: the consumer must not read the images before that work is done.
    consumer.wait_stream(alloc)
    for img in images:
        img.record_stream(consumer)
    return images


def _flat_to_views(d: DecodedBatch) -> None:
    """Put the engines' images into `d.images` as (3, H, W) views of the flat buffer (one torch
    call each: for the per-image paths, not the batched resize, which reads the buffer directly)."""
    if d.flat is None:
        return
    for i, start, (h, w) in zip(d.flat_ids, d.flat_starts.tolist(), d.flat_hw.tolist()):
        pixels = d.flat[start : start + 3 * h * w]
        d.images[i] = pixels.view(h, w, 3).permute(2, 0, 1) if d.flat_hwc else pixels.view(3, h, w)
        d.interleaved[i] = d.flat_hwc
    d.flat = None


@dataclass
class DecodedBatch:
    """What the decode stage hands the resize stage: each image (3, H, W) (a view, possibly of
    interleaved memory), its crop box, whether nvImageCodec owns its memory (kept alive by the
    decoder until the resize's copy is done; allocator memory otherwise, held with record_stream),
    images the workers already decoded (a HybridBatch's share), and the CUDA stream it was decoded
    on (the resize, on another stream, must hold the allocator's images and that share for its own)."""

    images: list[torch.Tensor]
    boxes: torch.Tensor
    library_owned: list[bool]
    interleaved: list[bool]  # views of (H, W, 3) memory (nvImageCodec's outputs), else planes
    holds: list = field(default_factory=list)  # nvImageCodec's buffers, let go after the resize's copy
    done: torch.Tensor | None = None
    stream: torch.cuda.Stream | None = None
    # the hardware decoder's images (their `images` entries are None): one flat device buffer of
    # interleaved RGB (planar where the engines' settings ask), the batch positions it holds, each
    # one's start and (height, width)
    flat: torch.Tensor | None = None
    flat_hwc: bool = True
    flat_ids: list[int] = field(default_factory=list)
    flat_starts: np.ndarray | None = None
    flat_hw: np.ndarray | None = None


class _NoEngines:
    """Stands where a decode thread's engines handle could not be made: refuses every batch."""

    def __init__(self, why: str) -> None:
        self.why = why

    def decode(self, *args, **kwargs):
        raise RuntimeError(f"no JPEG-engines handle for this thread: {self.why}")


class GpuDecoder:
    """Encoded batch in, (N, 3, size, size) uint8 batch on `device` out, in two stages.

    `decode_stage`: files the GPU decoders cannot take (PNGs, CMYK: from the headers the workers
    read) are decoded on the CPU first; then the crop boxes are drawn for the whole batch from the
    image sizes (random-resized crops for training, the centre square for evaluation); then the
    rest is decoded by `backend`:
    - "nvjpeg": torchvision's batched nvJPEG call (the JPEG engines for baseline files where the GPU
      has them, the SMs otherwise); a failing batch is bisected;
    - "nvimgcodec": nvImageCodec, on the GPU's hardware JPEG engines (optionally the crop region
      only); an undecodable file comes back alone;
    - "hardware": nvJPEG's hardware backend through ctypes (`nvjpeg_hw`): the files the workers
      found the engines take, in one call into one flat buffer; the others, and a whole batch the
      engines refuse, go the "nvjpeg" way;
    A file the batched calls did not decode goes to the CPU.
    `resize_stage`: all crops resized in one batched call per memory layout ("batched", a few
    kernels) or one at a time ("loop", the reference).

    Both decode calls make the host wait for the device (torchvision synchronises its decode
    stream; nvImageCodec waits for its engines), so `DeviceFeeder` runs the decoder in a thread of
    its own, and for nvJPEG (`two_stage`) the two stages in two threads: batch i+1 decodes while
    batch i is resized. `__call__` runs both in the caller's thread. `batch_decode` replaces the
    nvJPEG call in tests.
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
        codec_threads: int | None = None,
        hardware_decoder=None,
        hardware_factory: Callable | None = None,
        min_scale: float = RRC_SCALE[0],
    ) -> None:
        self.files, self.size, self.device, self.train = files, size, torch.device(device), train
        check_min_scale(min_scale)
        self.min_scale = min_scale  # the training crops' smallest area share (data.crop_min_scale)
        self.generator = torch.Generator().manual_seed(seed)
        self.batch_decode = batch_decode
        # batched: 33,557 img/s against the loop's 9,939 for 256 ImageNet photos on an H200
        # (shared/measurements/h200-2026-11-30/jpeg_decode_cuda.log); on the CPU the loop was
        # 6-15x faster (benchmarks/results/jpeg_decode_cpu.csv): launches are cheap there.
        self.resize = resize if resize not in (None, "auto") else ("batched" if self.device.type == "cuda" else "loop")
        if self.resize not in ("batched", "loop"):
            raise ValueError(f"resize: expected 'batched' or 'loop', got {self.resize!r}")
        if backend not in GPU_BACKENDS:
            raise ValueError(f"backend: expected one of {', '.join(GPU_BACKENDS)}, got {backend!r}")
        self.backend = backend
        # Whether DeviceFeeder runs the stages in two threads. On an H200 (benchmarks/results/
        # 2026-12-01-h200/call-e/jpeg_decode_cuda.csv) two threads raised nvJPEG's batches from
        # 8,284 to 8,830 img/s but dropped nvImageCodec's from 5,629 to 3,392 (its calls give the
        # GIL back and take it again per image, and a second busy Python thread makes each retake wait).
        self.two_stage = backend in ("nvjpeg", "hardware")
        self.nvimgcodec = self.hardware = None
        if backend == "nvimgcodec":
            from cnnpar.data.nvimgcodec_decode import NvImageCodecDecode

            self.nvimgcodec = NvImageCodecDecode(self.device, cpu_threads=codec_threads)
        # One engines handle per calling thread (nvjpeg.h: a decode state per thread): the first thread
        # takes `self.hardware`, another (the feeder's decode thread beside a direct call, say) gets
        # its own from the factory.
        self._engines_by_thread: dict[str, object] = {}
        self._lock = threading.Lock()  # the handles above and the counters below, from decode threads
        self._closed = False
        if backend == "hardware":  # `hardware_decoder` / `hardware_factory` replace the engines in tests
            from cnnpar.config import setting_name
            from cnnpar.data.nvjpeg_hw import HardwareDecoderUnavailable, HardwareJpegDecoder
            from cnnpar.errors import ConfigError

            device = self.device  # not `self` in the closure: no reference cycle keeps a decoder for the collector
            self._engines_factory = hardware_factory or (lambda: HardwareJpegDecoder(device))
            try:
                self.hardware = hardware_decoder or self._engines_factory()
            except (HardwareDecoderUnavailable, RuntimeError) as e:
                raise ConfigError(
                    f"{setting_name('data', 'decode')} = 'hardware': {e} (choose --decode gpu or cpu)"
                ) from e
        self.slots: ByteSlots | None = None  # the train or eval loader's, where its batches come in slots
        self.batched_calls = 0  # batched decode calls made, bisection included (for tests and benchmarks)
        self.cpu_decoded = 0  # images decoded on the CPU
        self.hardware_decoded = 0  # images decoded by the JPEG engines ("hardware")
        self.hardware_refused = 0  # batches the engines refused (then decoded the "nvjpeg" way)

    def _count(self, name: str, k: int = 1) -> None:
        with self._lock:  # decode threads may run at once
            setattr(self, name, getattr(self, name) + k)

    def _engines(self):
        """The calling thread's JPEG-engines handle, made on its first batch. Keyed by the thread's
        name: the feeder makes its decode threads anew every epoch under the same names, so each
        name keeps one handle for the decoder's life (nvjpeg.h: one decode state per thread)."""
        key = threading.current_thread().name
        with self._lock:
            engines = self._engines_by_thread.get(key)
            if engines is None and self._closed:  # refuses, and the batch goes the nvJPEG way
                return self.hardware
            if engines is None:
                taken = any(e is self.hardware for e in self._engines_by_thread.values())
                try:
                    engines = self._engines_factory() if taken else self.hardware
                except RuntimeError as e:  # no second handle: this thread's batches go the nvJPEG way
                    engines = _NoEngines(str(e))
                self._engines_by_thread[key] = engines
            return engines

    def _decode_cpu(self, buf: torch.Tensor, index: int) -> torch.Tensor:
        img = decode_rgb_naming_damage(buf, self.files[index])  # a damaged JPEG named, as the CPU workers name it
        self._count("cpu_decoded")
        return img.to(self.device, non_blocking=True)

    def _bisected(self, ids: list[int], decode_part: Callable[[list[int]], None]) -> None:
        """`decode_part(ids)` in one call; where a call raises, each half again, so that only the files that
        fail alone are left undecoded (for the CPU, which decodes them or names them). k culprits in n files
        cost about 2 k log2(n / k) calls."""
        pending = [ids] if ids else []
        while pending:
            part = pending.pop()
            self._count("batched_calls")
            try:
                decode_part(part)
            except (RuntimeError, ValueError):
                if len(part) > 1:
                    mid = len(part) // 2
                    pending += [part[mid:], part[:mid]]

    def _decode_batched(self, data: list[torch.Tensor], ids: list[int], images: list) -> None:
        """Decode `ids` in one batched call (nvJPEG fails the whole call for one file it refuses: bisected)."""

        def decode_part(part: list[int]) -> None:
            for i, img in zip(part, self.batch_decode([data[i] for i in part], self.device)):
                images[i] = img

        self._bisected(ids, decode_part)

    def _decode_nvimgcodec(self, data, ids, boxes, images: list, owned: list, hwc: list, holds: list, stream) -> None:
        """Decode `ids` with nvImageCodec: a file it cannot parse or decode comes back None (for the CPU); a call
        that raises (a library or CUDA error, a region it refuses) is bisected as nvJPEG's is."""
        region = self.nvimgcodec.regions

        def decode_part(part: list[int]) -> None:
            decoded = self.nvimgcodec([data[i] for i in part], boxes[part], stream=stream)
            if self.nvimgcodec.last_hold is not None:  # this call's buffers on the device (None: it decoded none)
                holds.append(self.nvimgcodec.last_hold)
            for i, img in zip(part, decoded):
                if img is not None:
                    images[i] = img.permute(2, 0, 1)  # (3, H, W) view of interleaved memory
                    owned[i], hwc[i] = self.device.type == "cuda", True
                    if region:  # the image is the crop
                        boxes[i] = torch.tensor([0, 0, boxes[i, 2], boxes[i, 3]])

        self._bisected(ids, decode_part)

    def decode(self, batch: EncodedBatch) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The batch's images, each (3, H, W), and the crop boxes (N, 4) in each image's own
        coordinates (the decode stage in the caller's thread, without its event)."""
        d = self.decode_stage(batch)
        _flat_to_views(d)
        return d.images, d.boxes

    def decode_stage(self, batch) -> DecodedBatch:
        slot = getattr(batch, "slot", None)
        if slot is not None and batch.flat is None:  # the bytes lie in the loader's slot: read in place
            self.slots.page_lock_once()
            batch.flat = self.slots.view(slot, int(batch.offsets[-1]))
        try:
            with span(JPEG_DECODE):
                return self._decode_stage(batch)
        finally:
            if slot is not None:
                # every decoder has finished with the bytes here (each call synchronises); drop the views
                # too, so nothing reads the slot once the loader hands it to another batch
                batch.flat, batch.slot = None, None
                batch.__dict__.pop("data", None)
                self.slots.release(slot)

    def _decode_stage(self, batch) -> DecodedBatch:
        if hasattr(batch, "decoded"):  # a HybridBatch: the workers decoded its first images
            d = self._decode_stage(batch.encoded)
            d.done = batch.decoded.to(self.device, non_blocking=True)
            if self.device.type == "cuda":  # allocated on this stream, read on the resize's: held there too
                d.stream = torch.cuda.current_stream(self.device)  # (an empty encoded part set none)
            return d
        n = len(batch)
        if n == 0:
            return DecodedBatch([], torch.empty(0, 4, dtype=torch.int64), [], [])
        ok, hard = batch.nvjpeg_ok, batch.hardware_ok
        if ok is None or batch.hw is None:  # batches made without workers: read the headers here
            views = [memoryview(b.numpy()) for b in batch.data]
            headers = [read_jpeg_header(v) for v in views]
            for h, index in zip(headers, np.asarray(batch.index).tolist()):
                if h is not None:  # as the workers check (EncodedFolderDataset)
                    check_pixel_count(self.files[index], h.height, h.width)
            routes = [decode_route(h, v) for h, v in zip(headers, views)]
            ok, hard = [r >= 1 for r in routes], [r == 2 for r in routes]
            hw = np.array([(h.height, h.width) if h else (0, 0) for h in headers], dtype=np.int64).reshape(n, 2)
        else:
            # NumPy from here: in a decode thread each torch call gives the GIL up and must win it back
            # from the training thread (crop_resize.draw_crop_boxes says what that costs)
            ok, hw = ok.tolist(), np.array(batch.hw, dtype=np.int64)  # a copy: sizes the CPU finds go in
            hard = hard.tolist() if hard is not None else [False] * n
        stream = torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None
        images: list[torch.Tensor | None] = [None] * n
        owned, hwc_, holds = [False] * n, [False] * n, []
        for i in range(n):
            if not ok[i]:  # no GPU decoder takes it; its size comes from decoding it
                images[i] = self._decode_cpu(batch.data[i], int(batch.index[i]))
                hw[i] = images[i].shape[1:]
        boxes = draw_crop_boxes(hw, self.train, self.generator, self.min_scale)
        fast = [i for i in range(n) if ok[i]]
        d = DecodedBatch(images, boxes, owned, hwc_, holds, stream=stream)
        if self.hardware is not None:
            fast = self._decode_hardware(batch, [i for i in fast if hard[i]], hw, d, stream) + [
                i for i in fast if not hard[i]
            ]
            fast.sort()
        if fast and self.backend == "nvimgcodec":
            self._decode_nvimgcodec(batch.data, fast, boxes, images, owned, hwc_, holds, stream)
        elif fast:
            self._decode_batched(batch.data, fast, images)
        engines = set(d.flat_ids)
        for i in range(n):
            if images[i] is None and i not in engines:  # refused alone: the CPU decodes it or names it
                images[i] = self._decode_cpu(batch.data[i], int(batch.index[i]))
                if tuple(images[i].shape[1:]) != tuple(hw[i].tolist()):  # the header lied
                    boxes[i] = draw_crop_boxes(
                        torch.tensor([images[i].shape[1:]]), self.train, self.generator, self.min_scale
                    )[0]
        return d

    def _decode_hardware(
        self, batch: EncodedBatch, ids: list[int], hw: np.ndarray, d: DecodedBatch, stream
    ) -> list[int]:
        """Decode `ids` on the JPEG engines into `d.flat`; returns the ids left for the other decoders
        (none, or all of them when the engines refused the batch)."""
        if not ids:
            return []
        sizes = hw[ids]
        engines = self._engines()
        try:
            flat, starts = engines.decode(
                batch.flat, np.asarray(batch.offsets), ids, sizes, stream, tail_room(int(sizes[:, 1].max()))
            )
        except RuntimeError:
            self._count("hardware_refused")
            return ids
        d.flat, d.flat_ids, d.flat_hwc = flat, list(ids), getattr(engines, "interleaved", True)
        d.flat_starts, d.flat_hw = starts, sizes  # host arrays: the resize reads them as they are
        self._count("hardware_decoded", len(ids))
        return []

    def resize_stage(self, d: DecodedBatch) -> torch.Tensor:
        """Crop and resize a decoded batch on the current stream. On another thread's stream, the
        caller has already ordered it after the decode (DeviceFeeder's hand-over event does)."""
        with span(CROP_RESIZE):
            return self._resize_stage(d)

    def _resize_stage(self, d: DecodedBatch) -> torch.Tensor:
        if d.stream is not None:
            stream = torch.cuda.current_stream(self.device)
            if stream != d.stream:  # on the decode's own stream the decode already held them
                for img, lib in zip(d.images, d.library_owned):
                    if img is not None and not lib:  # allocator memory: not reused while this stream reads it
                        img.record_stream(stream)
                if d.flat is not None:
                    d.flat.record_stream(stream)
                if d.done is not None:  # the workers' share: freed when the batch is, while the cat may be queued
                    d.done.record_stream(stream)
        n = len(d.images)
        if self.resize == "loop":  # the reference path, image by image: views of the flat buffer
            _flat_to_views(d)
        if n == 0:
            out = torch.empty(0, 3, self.size, self.size, dtype=torch.uint8, device=self.device)
        elif self.resize == "loop":
            out = resized_crops_loop(d.images, d.boxes, self.size)
        elif d.flat is not None:
            out = self._resize_with_flat(d)
        else:
            out = self._resize_batched(d)
        if d.holds:
            event = torch.cuda.Event()
            event.record()
            for hold in d.holds:
                self.nvimgcodec.copied(hold, event)
        return torch.cat([d.done, out]) if d.done is not None else out

    def _resize_batched(self, d: DecodedBatch) -> torch.Tensor:
        """One batched call per memory layout: nvImageCodec's images are interleaved, nvJPEG's and
        the CPU's planar; gathering both into one layout would cost another pass over the pixels."""
        hwc = [i for i, flag in enumerate(d.interleaved) if flag]
        if len(hwc) in (0, len(d.images)):
            return resized_crops(d.images, d.boxes, self.size, hwc=bool(hwc))
        chw = [i for i, flag in enumerate(d.interleaved) if not flag]
        out = torch.empty(len(d.images), 3, self.size, self.size, dtype=torch.uint8, device=self.device)
        for ids, layout in ((hwc, True), (chw, False)):
            part = resized_crops([d.images[i] for i in ids], d.boxes[ids], self.size, hwc=layout)
            out.index_copy_(0, torch.tensor(ids, device=self.device), part)
        return out

    def _resize_with_flat(self, d: DecodedBatch) -> torch.Tensor:
        """The engines' images straight from their flat buffer (no gather), the rest as usual."""
        ids = d.flat_ids
        boxes = d.boxes if len(ids) == len(d.images) else d.boxes[ids]  # ids are sorted: all of them, in order
        engine = resized_crops_flat(d.flat, d.flat_starts, d.flat_hw, boxes, self.size, hwc=d.flat_hwc)
        if len(ids) == len(d.images):
            return engine
        taken = set(ids)
        rest = [i for i in range(len(d.images)) if i not in taken]
        others = self._resize_batched(
            DecodedBatch(
                [d.images[i] for i in rest], d.boxes[rest], [False] * len(rest), [d.interleaved[i] for i in rest]
            )
        )
        out = torch.empty(len(d.images), 3, self.size, self.size, dtype=torch.uint8, device=self.device)
        out.index_copy_(0, torch.tensor(ids, device=self.device), engine)
        out.index_copy_(0, torch.tensor(rest, device=self.device), others)
        return out

    def close(self) -> None:
        """Free the JPEG engines' handles now (each on the thread that made it), not whenever the
        garbage collector gets to them. Later batches are refused and go the nvJPEG way."""
        with self._lock:
            handles = {id(e): e for e in [self.hardware, *self._engines_by_thread.values()] if e is not None}
            self._engines_by_thread.clear()
            self._closed = True
        for engines in handles.values():
            if hasattr(engines, "close"):
                engines.close()
        if self.slots is not None:  # the decode calls are done: no copy reads a slot any more
            self.slots.unlock()

    def __call__(self, batch) -> torch.Tensor:
        if len(batch) == 0:
            if getattr(batch, "slot", None) is not None:  # nothing to read in it: the slot goes back now
                self.slots.release(batch.slot)
                batch.slot = None
            return torch.empty(0, 3, self.size, self.size, dtype=torch.uint8, device=self.device)
        return self.resize_stage(self.decode_stage(batch))
