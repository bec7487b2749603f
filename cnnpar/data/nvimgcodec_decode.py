"""JPEG decoding with nvImageCodec (`pip install "cnnpar[nvimgcodec]"`): the GPU's hardware JPEG
engines, and decoding of the crop region only.

Why a second GPU decoder beside torchvision's nvJPEG call:
- Where the GPU has JPEG engines (A100, H100, H200: NVJPG), nvImageCodec's hardware backend
  decodes on them, not on the SMs that the training step needs. (This was the reason it was added;
  torchvision's batched call, it turned out later, uses the same engines for baseline JPEGs:
  docs/decoding.md.)
- It can decode a region (`regions`): a random-resized crop keeps --crop-min-scale (25 % by default) to 100 %
  of the photo (crop_resize.RRC_SCALE). Off by default: on an H200 (nvJPEG 13.0) it was no faster, and the
  library turns it off for images with interpolated chroma, warning once per image.
- An image it cannot decode comes back as None in its place; the rest of the batch is kept (a
  batched torchvision call fails as a whole).

Backends are tried in order for each image: the hardware engines first, then nvJPEG on the SMs
(hybrid CPU/GPU Huffman), then the CPU. Outputs are interleaved RGB (H, W, 3) uint8; crop_resize
reads that layout directly.

The library loads every codec extension it ships and prints an error for each codec whose wheel
is missing (JPEG 2000, TIFF): harmless for JPEG photos. (Pointing NVIMGCODEC_EXTENSIONS_PATH at
links to the JPEG extensions alone would silence it, but the nvJPEG extension finds libnvjpeg
through an $ORIGIN-relative run path, which a link's folder breaks.)
"""

from __future__ import annotations

import functools
import importlib.util

import torch


@functools.cache
def nvimgcodec_available() -> bool:
    try:
        return importlib.util.find_spec("nvidia.nvimgcodec") is not None
    except ModuleNotFoundError:  # no `nvidia` namespace package at all
        return False


@functools.cache
def _module():
    from nvidia import nvimgcodec

    return nvimgcodec


class NvImageCodecDecode:
    """A batched decode: encoded buffers (and crop boxes) in, (H, W, 3) uint8 images or None out.

    On a CUDA device: hardware engines, then nvJPEG on the SMs, then the CPU. On the CPU (tests,
    and machines without a GPU) its libjpeg-turbo backend. With `regions`, only each box (top,
    left, height, width) is decoded, so the image returned for it is the crop itself.
    """

    hwc = True
    # Host threads of the library's own pool (0: one per core), where the caller gives none.
    # Benchmarks set it to compare.
    CPU_THREADS = 0
    MAX_HELD = 6  # batches whose buffers are kept for copies in flight (decode and resize threads, queues)

    def __init__(self, device: torch.device, regions: bool = False, cpu_threads: int | None = None) -> None:
        if not nvimgcodec_available():
            from cnnpar.errors import ConfigError

            raise ConfigError(
                "data.decode: nvimgcodec and nvimgcodec-workers need nvImageCodec, which is not installed: "
                "pip install 'cnnpar[nvimgcodec]' (or choose --decode gpu)"
            )
        n = _module()
        self.device, self.regions = device, regions
        if device.type == "cuda":
            # load_hint 1: every image the engines can take goes to them, none balanced away
            backends = [n.Backend(n.BackendKind.HW_GPU_ONLY, load_hint=1.0)]
            backends += [n.Backend(n.BackendKind.HYBRID_CPU_GPU), n.Backend(n.BackendKind.CPU_ONLY)]
            device_id = device.index if device.index is not None else torch.cuda.current_device()
        else:
            backends, device_id = [n.Backend(n.BackendKind.CPU_ONLY)], n.NVIMGCODEC_DEVICE_CPU_ONLY
        threads = self.CPU_THREADS if cpu_threads is None else cpu_threads
        self.decoder = n.Decoder(device_id=device_id, max_num_cpu_threads=threads, backends=backends)
        # sRGB, 8 bits, interleaved; no EXIF rotation, like torchvision's decode_jpeg and the CPU path
        self.params = n.DecodeParams(
            color_spec=n.ColorSpec.SRGB, sample_format=n.I_RGB, allow_any_depth=False, apply_exif_orientation=False
        )
        # The library's image buffers, each batch's kept with an event recorded after the copy
        # that reads them (`copied`), and let go only once that event has passed.
        self._held: list[list] = []  # [images, event or None], in call order
        self.last_hold: list | None = None

    def __call__(
        self, buffers: list[torch.Tensor], boxes: torch.Tensor | None, stream: torch.cuda.Stream | None = None
    ) -> list[torch.Tensor | None]:
        """`stream`: the CUDA stream whose later work reads the images (default: the current one;
        a caller decoding in a second thread passes its own). `last_hold` is then this call's buffers, or
        None where it decoded nothing on the device (no file parsed, or the call raised)."""
        self.last_hold = None  # never an earlier call's: the caller hands it to `copied` with this batch's event
        n = _module()
        streams = []
        for k, buf in enumerate(buffers):
            try:
                cs = n.CodeStream(buf.numpy())
            except RuntimeError:  # not a parsable image: the caller decodes it on the CPU, or names it
                cs = None
            if cs is not None and self.regions and boxes is not None:
                top, left, h, w = boxes[k].tolist()
                cs = cs.get_sub_code_stream(region=n.Region(top, left, top + h, left + w))
            streams.append(cs)
        todo = [k for k, cs in enumerate(streams) if cs is not None]
        out: list[torch.Tensor | None] = [None] * len(buffers)
        if not todo:
            return out
        if self.device.type == "cuda":
            stream = stream or torch.cuda.current_stream(self.device)
            # Decoded on the library's streams, then ordered before `stream`'s later work (from_dlpack
            # orders the current stream after the image's: make that `stream` in any thread).
            images = self.decoder.decode([streams[k] for k in todo], params=self.params, cuda_stream=stream.cuda_stream)
            with torch.cuda.stream(stream):
                for k, img in zip(todo, images):
                    out[k] = torch.from_dlpack(img) if img is not None else None
            # The tensors borrow the library's buffers: they must outlive the copy queued after this.
            self.last_hold = [images, None]
            self._held.append(self.last_hold)
        else:
            import numpy as np

            images = self.decoder.decode([streams[k] for k in todo], params=self.params)
            for k, img in zip(todo, images):
                out[k] = torch.from_numpy(np.array(img, copy=True)) if img is not None else None
        return out

    def copied(self, hold: list, event: torch.cuda.Event) -> None:
        """The caller queued the copy of the images of `hold` (a call's `last_hold`) and recorded
        `event` after it; buffers whose copies have finished are let go, oldest first. Holds stay
        in call order, so with a decode thread ahead of the resize thread the newest may still
        wait for its copy."""
        hold[1] = event
        while self._held and self._held[0][1] is not None and self._held[0][1].query():
            self._held.pop(0)
        # Bounded: wait for the oldest copy rather than hold more. A hold without an event is a batch
        # still on its way to the resize (or one that failed): never let go of it here.
        while len(self._held) > self.MAX_HELD and self._held[0][1] is not None:
            self._held.pop(0)[1].synchronize()
