"""Image folders decoded on the CPU, a whole batch per call, into one uint8 tensor.

The worker-side twin of `gpu_decode`: a DataLoader built with `batch_size=None` and a
`BatchSampler` hands each worker a list of indices; the worker reads the files, draws the batch's
crop boxes in one call (`draw_crop_boxes`, the GPU path's distribution: random-resized crops for
training, the centre square otherwise), decodes, crops and resizes each image straight into one
preallocated (N, 3, S, S) uint8 tensor, and returns `(x, labels, index)`. One tensor per batch
crosses to the main process (one shared-memory segment), and nothing leaves uint8.

Why each step is done this way (timings per image on one core of a 2-core EPYC, ImageNet photos
of about 500x375; benchmarks/jpeg_decode.py measures the whole):
- JPEGs whose crop is at least 2x, 4x or 8x the output side are decoded at 1/2, 1/4 or 1/8 size
  by libjpeg-turbo's DCT scaling (Pillow's `draft`, simplejpeg's minimum size): a smaller inverse
  DCT, and upsampling, colour conversion and resizing on 1/4 to 1/64 of the pixels. The entropy (Huffman) decoding of
  the whole file remains, so the gain shrinks as files get more detailed: on a smooth 1600x1200
  picture a 1/2-size decode took 2.3 ms against 5.9 ms, on the same with noise (540 kB) 6.3 ms
  against 8.2 ms. The largest reduction that leaves the crop >= S pixels on both sides is used,
  so nothing the output could hold is lost beyond what the reduced IDCT's own filter does
  (within a few levels of the full-size reference: tests/unit/test_cpu_decode.py).
- The JPEG decoder is simplejpeg (a dependency; `pip install simplejpeg` where it is missing): the same
  libjpeg-turbo as Pillow and torchvision with the same pixels (identical on the ImageNet photos),
  without their per-call objects, into one buffer reused by every photo of a worker (rather than
  a fresh 5.8 MB array per 1600x1200 photo), cropped as a view. Whole photos: 1.10 ms against
  1.32 through torchvision (`decode_rgb`) and 1.28 through Pillow. libjpeg's M/8 scales other
  than 1/2, 1/4, 1/8 have no SIMD code and are slower than a whole decode: not used.
- Without simplejpeg, and for what it declines (CMYK/YCCK and 12-bit files, files libjpeg warns
  about, which simplejpeg run `strict` refuses), reduced decodes go through Pillow and whole ones
  through torchvision's `decode_image` (`decode_rgb`), shared with the per-image path and the GPU
  path's CPU fall-back, so odd files decode, or fail naming the file, alike everywhere.
- Crop and resize are `F.interpolate(bilinear, antialias=True)` on a uint8 view of the crop. Both
  decoders leave pixels interleaved (HWC), which torch's uint8 antialiased kernel takes as a
  channels-last batch of one, without a copy: 0.23 ms, where Pillow's `resize(box=...)` on the
  same crops took 0.72 ms and the same kernel on planar (CHW) input 0.49 ms. It is the filter of
  the GPU path's `resized_crops_loop`, computed in integers (within one level of it).
- Each photo is decoded only when its turn comes and freed after: a batch of decoded 12-megapixel
  photos would not fit in a worker's share of memory.

What it gains per worker over the per-image path (`ImageFolderDataset`: whole photo decoded and
resized, centre crop, default collate), ResNet-50's 224 crops, one thread, 2-core EPYC
(benchmarks/results/jpeg_decode_cpu_simplejpeg.csv; docs/decoding.md has the table): with
simplejpeg 1.19x on ImageNet photos (0.2 megapixels, 108 kB: the entropy decoding alone, a 1/8
decode, takes 0.79 of the 1.67 ms an image took, so 2x is out of reach), 1.45x on noisy
1600x1200 JPEGs (536 kB), 2.16x on smooth ones (113 kB); with Pillow 1.11x, 1.31x and 1.81x.
"""

from __future__ import annotations

import functools
import io
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from cnnpar.data.crop_resize import RRC_SCALE, check_min_scale, draw_crop_boxes
from cnnpar.data.folder import PathTable, check_pixel_count, decode_error, decode_rgb, read_encoded
from cnnpar.data.jpeg_header import JpegHeader, read_jpeg_header
from cnnpar.data.png_header import png_size
from cnnpar.data.transforms import keyed_generator
from cnnpar.errors import DataError

DCT_SCALES = (8, 4, 2)  # the reductions libjpeg-turbo's scaled IDCT offers through Pillow's draft
# libjpeg-turbo also scales by M/8 (3/8, 5/8, 3/4, 7/8), but only 1/2, 1/4 and 1/8 have SIMD code:
# on the ImageNet photos 5/8, 6/8 and 7/8 took 1.29, 1.46 and 1.86 ms against 1.10 at full size
# (benchmarks/results/jpeg_decode_cpu_simplejpeg.csv, cpu_profile rows).
# A worker keeps its decode buffer between photos up to this size (a 12-megapixel photo's 36 MB
# fits); the rare larger decode gets a buffer of its own, freed with it.
KEEP_BUFFER_BYTES = 64 << 20
_DRAFT_SOF = frozenset({0xC0, 0xC1, 0xC2})  # Huffman-coded baseline, extended and progressive frames


def reduction(crop_h: int, crop_w: int, size: int) -> int:
    """The largest DCT scale-down (8, 4, 2, else 1) that leaves a crop at least `size` on each side."""
    side = min(crop_h, crop_w)
    return next((k for k in DCT_SCALES if side >= k * size), 1)


def draftable(h: JpegHeader | None) -> bool:
    """An 8-bit Huffman-coded JPEG with its size in the frame header: Pillow can decode it reduced."""
    return h is not None and h.precision == 8 and h.sof in _DRAFT_SOF and h.height > 0 and h.width > 0


def scaled_box(box: tuple[int, int, int, int], scale: float, h: int, w: int) -> tuple[int, int, int, int]:
    """Box (top, left, height, width) in original pixels -> in an (h, w) decode made at 1/scale,
    rounded to whole pixels: off by at most half a reduced pixel, under 0.25% of a crop side >= 224."""
    top, left, ch, cw = box
    if scale == 1.0:
        return top, left, ch, cw
    ch, cw = max(1, min(h, round(ch / scale))), max(1, min(w, round(cw / scale)))
    return min(round(top / scale), h - ch), min(round(left / scale), w - cw), ch, cw


def decode_reduced(
    data: torch.Tensor, path: Path | str, k: int, h: int, w: int, box: tuple[int, int, int, int]
) -> torch.Tensor:
    """Decode the (h, w) JPEG in `data` at 1/k size with Pillow; return crop `box` (original
    pixels) of it as a (3, h', w') uint8 view of interleaved (HWC) pixels."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(memoryview(data.numpy())), formats=["JPEG"]) as im:
            got = im.draft("RGB", (w // k, h // k))
            im.load()
            # draft returns the original extent in reduced pixels (None if it could not reduce)
            scale = w / got[1][2] if got is not None else 1.0
            top, left, ch, cw = scaled_box(box, scale, im.height, im.width)
            # Crop before copying out of Pillow: only the crop's pixels cross (and turn RGB).
            crop = im.crop((left, top, left + cw, top + ch))
            rgb = crop if crop.mode == "RGB" else crop.convert("RGB")  # grey and CMYK files
            pixels = torch.frombuffer(bytearray(rgb.tobytes()), dtype=torch.uint8)
    except (OSError, SyntaxError, ValueError) as e:  # PIL.UnidentifiedImageError is an OSError
        raise decode_error(path, e) from None
    return pixels.view(ch, cw, 3).permute(2, 0, 1)


@functools.cache
def simplejpeg_module():
    """simplejpeg (libjpeg-turbo's TurboJPEG API, bundled in its wheels), or None when not installed."""
    try:
        import simplejpeg
    except ImportError:
        return None
    return simplejpeg


def cpu_jpeg_backend() -> str:
    """What decodes the JPEGs of a `CpuDecodedFolder` here: simplejpeg where installed, else Pillow."""
    return "simplejpeg" if simplejpeg_module() is not None else "pillow"


def cpu_jpeg_line() -> str:
    """What decodes JPEGs in the CPU workers, for the run's decode line."""
    if cpu_jpeg_backend() == "simplejpeg":
        return "simplejpeg (libjpeg-turbo, whole or at 1/2, 1/4, 1/8 size; Pillow and torchvision: files it declines)"
    return (
        "Pillow and torchvision (simplejpeg, a dependency of cnnpar and faster, is not installed: "
        "pip install simplejpeg)"
    )


def turbo_ready(h: JpegHeader | None) -> bool:
    """A JPEG simplejpeg decodes to RGB as the other paths do: 8-bit Huffman-coded, grey or YCbCr
    (CMYK and YCCK files keep the Pillow / torchvision conversion the other paths use)."""
    return draftable(h) and h.components in (1, 3)


class TurboDecoder:
    """JPEG decodes through simplejpeg into one reused buffer, whole or at 1/2, 1/4, 1/8 size.

    Against Pillow (`decode_reduced`) and torchvision (`decode_rgb`) on the same libjpeg-turbo it
    saves their per-call overheads (a file object and an image object, a fresh output array per
    photo) and crops a view, copying nothing.
    `strict`: libjpeg's warnings (a truncated file, corrupt data) raise, and the caller then
    decodes the file the old way, which either reads it as every other path does or names it.
    """

    def __init__(self) -> None:
        self.sj = simplejpeg_module()
        self.buffer = torch.empty(0, dtype=torch.uint8)
        self.refused = ""  # libjpeg's message where the last call was refused (strict), else ""

    def __call__(self, data: torch.Tensor, k: int, h: int, w: int, box: tuple[int, int, int, int]):
        """Crop `box` (original pixels) of the (h, w) JPEG in `data`, decoded at 1/k, as a (3, h', w')
        uint8 view of interleaved pixels in the reused buffer; None where simplejpeg declines (`refused` then
        holds libjpeg's reason where it raised)."""
        raw = memoryview(data.numpy())
        self.refused = ""
        try:
            full_h, full_w, _, _ = self.sj.decode_jpeg_header(raw)
            if (full_h, full_w) != (h, w):
                return None  # the header reader and libjpeg disagree: the checked path decides
            # the smallest libjpeg scale whose output is at least 1/k of the photo: exactly 1/k
            oh, ow, _, _ = self.sj.decode_jpeg_header(raw, min_height=-(-h // k), min_width=-(-w // k))
            if self.buffer.numel() < oh * ow * 3:
                self.buffer = torch.empty(oh * ow * 3, dtype=torch.uint8)
            self.sj.decode_jpeg(raw, colorspace="RGB", min_height=oh, min_width=ow, buffer=self.buffer.numpy())
        except ValueError as e:  # libjpeg's errors and (strict) warnings
            self.refused = str(e) or type(e).__name__
            return None
        # libjpeg scales by M/8: output pixel i covers original pixels 8i/M .. 8(i+1)/M, so the box
        # maps with 8/M exactly (w / ow would be off by the last, partly covered, pixel)
        m = next((m for m in range(1, 9) if (-(-h * m // 8), -(-w * m // 8)) == (oh, ow)), None)
        if m is None:
            return None
        top, left, ch, cw = scaled_box(box, 8 / m, oh, ow)
        img = self.buffer[: oh * ow * 3].view(oh, ow, 3)
        if self.buffer.numel() > KEEP_BUFFER_BYTES:  # the crop view holds it until it is resized
            self.buffer = torch.empty(0, dtype=torch.uint8)
        return img[top : top + ch, left : left + cw].permute(2, 0, 1)


_SAID_DAMAGED: set[str] = set()  # the files say_damaged named in this process, since the command began


def forget_said_damaged() -> None:
    """At each command's start (cli.run_command): its damaged files are named again, once each."""
    _SAID_DAMAGED.clear()


def say_damaged(path: Path | str, why: str) -> None:
    """A warning naming a JPEG that libjpeg warned about (strict simplejpeg refused it) and that decoded anyway,
    once per file in each command and process that decodes it (each DataLoader worker keeps its own count):
    libjpeg's line ("Corrupt JPEG data: 219 extraneous bytes before marker 0xd9") named none of 100,000 photos."""
    if str(path) in _SAID_DAMAGED:
        return
    _SAID_DAMAGED.add(str(path))
    print(f"warning: {path}: damaged JPEG data (libjpeg: {why}), decoded anyway", file=sys.stderr, flush=True)


def stray_bytes_warning(raw) -> str:
    """libjpeg's warning about a JPEG (bytes or a uint8 array) that decoded whole although jpeg_header found no frame
    header in it, else "": stray bytes between two of its header's segments stop that walk, and libjpeg skips them
    with a warning that names no file ("Corrupt JPEG data: 7 extraneous bytes before marker 0xdb") and decodes the
    picture the bytes did not touch. simplejpeg's header reader raises that warning; "" where simplejpeg is not
    installed or the bytes are not a JPEG (no SOI marker). Ask it only after the decode succeeded."""
    sj = simplejpeg_module()
    if sj is None or bytes(raw[:3]) != b"\xff\xd8\xff":
        return ""
    try:
        sj.decode_jpeg_header(raw)
    except ValueError as e:  # libjpeg's warnings, as errors
        return str(e) or type(e).__name__
    return ""


def say_stray_bytes(data: torch.Tensor, path: Path | str) -> None:
    """`say_damaged` for a JPEG of `stray_bytes_warning`'s, naming the file. Call it only after the decode
    succeeded; a file that is not a JPEG (no SOI marker) is left alone."""
    why = stray_bytes_warning(memoryview(data.numpy()))
    if why:
        say_damaged(path, why)


def decode_rgb_naming_damage(data: torch.Tensor, path: Path | str) -> torch.Tensor:
    """`decode_rgb`'s (3, H, W) image, decoded as `CpuDecodedFolder` decodes a whole JPEG: through strict
    simplejpeg where it takes the file, else `decode_rgb`, with `say_damaged`'s warning where simplejpeg refused
    it with libjpeg's message and it decoded all the same. For the GPU decoders' CPU fall-back, where libjpeg's
    own line named no file. The same pixels either way (the same libjpeg-turbo: see the module's docstring)."""
    header = read_jpeg_header(memoryview(data.numpy()))
    if simplejpeg_module() is None or not turbo_ready(header):
        img = decode_rgb(data, path)
        if header is None:
            say_stray_bytes(data, path)
        return img
    check_pixel_count(path, header.height, header.width)  # decode_rgb's check, before simplejpeg sees it
    turbo = TurboDecoder()  # a buffer of its own: decode threads may call at once, and the image leaves here
    img = turbo(data, 1, header.height, header.width, (0, 0, header.height, header.width))
    if img is not None:
        return img.contiguous()  # planes, as decode_rgb's
    img = decode_rgb(data, path)
    if turbo.refused:
        say_damaged(path, turbo.refused)
    return img


def decode_as_header_says(data: torch.Tensor, path: Path | str, h: int, w: int) -> torch.Tensor:
    """Full-size decode of an image whose crop box was drawn from its header's size: a decode of
    another size (a header that lies) would put the box outside the image, so it is refused."""
    img = decode_rgb(data, path)
    if tuple(img.shape[1:]) != (h, w):
        raise DataError(
            f"{path}: decodes to {img.shape[2]}x{img.shape[1]} pixels: expected {w}x{h}, as its header says"
        )
    return img


def resize_into(out: torch.Tensor, crop: torch.Tensor) -> None:
    """Resize a (3, h, w) uint8 crop to out's (3, S, S), antialiased bilinear, in uint8 (torch's
    kernel for channels-last uint8 input: HWC views qualify as they are)."""
    out.copy_(F.interpolate(crop[None], size=out.shape[1:], mode="bilinear", antialias=True)[0])


def shared_uint8(shape: tuple[int, ...]) -> torch.Tensor:
    """An empty uint8 tensor, in shared memory inside a DataLoader worker (as default_collate
    allocates its batches there) so that sending it to the main process copies nothing."""
    if torch.utils.data.get_worker_info() is None:
        return torch.empty(shape, dtype=torch.uint8)
    elem = torch.empty(0, dtype=torch.uint8)
    storage = elem._typed_storage()._new_shared(math.prod(shape), device=elem.device)
    return elem.new(storage).view(shape)


def _damage_flags(count: int) -> torch.Tensor:
    """CpuDecodedFolder's flags of damaged files already named, in shared memory where the system gives it; else
    private ones (each worker then names a file once, as before the flags): a read-only or missing /dev/shm, where
    README's way out is --workers 0, must not stop a run that starts no worker before it loads."""
    flags = torch.zeros(count, dtype=torch.uint8)
    try:
        return flags.share_memory_()
    except (RuntimeError, OSError):
        return flags


def damage_flags_of(source) -> torch.Tensor:
    """The damaged-file flags of `source` (the command's data set of an image folder, whose files every loader the
    command builds from it reads), made once and kept on it: bench's rungs, tune's and doctor's trials each build
    their own loaders, and each one's fresh flags named the same photo again, once a rung."""
    flags = getattr(source, "named_damaged", None)
    if flags is None:
        flags = source.named_damaged = _damage_flags(len(source.files))
    return flags


class CpuDecodedFolder(Dataset):
    """Files and labels of an image folder; `dataset[list of indices]` is one decoded batch
    `(x (N, 3, size, size) uint8, labels (N,) int64, index (N,) int64)`.

    `train`: random-resized crops (else the centre square). `draft`: in training, decode JPEGs reduced
    where the crop allows (off only to measure what it gains). Evaluation (and `cnnpar predict`, which
    reads a folder through this class) always decodes at full size: a reduced decode's pixels differ from a
    full decode's (3-4 levels mean, up to ~100 at edges, on photos whose centre square is >= 2x the input),
    and the GPU decoders' validation decodes at full size, so the CPU path's val_acc and predictions
    would score other pixels than the GPU's. `backend`: what decodes the JPEGs,
    "simplejpeg" or "pillow" (Pillow reduced, torchvision at full size); None picks
    `cpu_jpeg_backend()`. The crop boxes of a batch come from a generator seeded with the epoch's
    seed and the batch's first index: the epoch's seed is `epoch_seed` where the loader's
    `ReseedingWorkers` set it in a worker, else `torch.initial_seed()` of the process (the main
    process's is the epoch's seed, engine/rng.py). So runs seeded alike repeat, epochs differ, and
    the crops do not depend on how many workers decode (a batch's boxes were the draws of whichever
    worker it was dealt to, so --workers changed the augmentation).
    """

    answers_batches = True  # the loader hands it whole index lists (batch_size=None)

    def __init__(
        self,
        files: list[Path],
        labels,
        size: int,
        train: bool,
        draft: bool = True,
        backend: str | None = None,
        min_scale: float = RRC_SCALE[0],
        named_damaged: torch.Tensor | None = None,
    ) -> None:
        backend = backend or cpu_jpeg_backend()
        if backend not in ("simplejpeg", "pillow"):
            raise ValueError(f"backend {backend!r}: expected 'simplejpeg' or 'pillow'")
        if backend == "simplejpeg" and simplejpeg_module() is None:
            raise ValueError('backend "simplejpeg": not installed (pip install simplejpeg)')
        self.files = PathTable(files)  # not a list: the workers share it (folder.PathTable)
        self.labels = torch.as_tensor(labels, dtype=torch.int64)
        self.size, self.train, self.draft, self.backend = size, train, draft, backend
        check_min_scale(min_scale)
        self.min_scale = min_scale  # the training crops' smallest area share (data.crop_min_scale)
        self.epoch_seed: int | None = None  # set in each worker by loader.ReseedingWorkers
        self._turbo: TurboDecoder | None = None
        # a flag a file, in shared memory (before any worker starts, so each maps the same one): a damaged file one
        # DataLoader worker named is not named again by another, nor by each epoch's fresh workers without
        # --persistent-workers (say_damaged's count is a process's: it was named once an epoch). `named_damaged`:
        # the command's flags for these files (damage_flags_of), shared with its other loaders of them
        self.named_damaged = _damage_flags(len(self.files)) if named_damaged is None else named_damaged

    def __len__(self) -> int:
        return len(self.files)

    def __getstate__(self) -> dict:
        # each process grows its own decode buffer
        return {**self.__dict__, "_turbo": None}

    def generator(self, indices: list[int]) -> torch.Generator:
        """The batch's own generator: a function of the epoch's seed and the batch, not of the process."""
        return keyed_generator(self.epoch_seed, indices[0])

    def __getitem__(self, index):
        # batch_size=None: the DataLoader passes the BatchSampler's whole list here
        if isinstance(index, int):
            x, y, _ = self.__getitems__([index])
            return x[0], y[0]
        return self.__getitems__(index)

    @staticmethod
    def _crop_checked(data, img, path, r: int, hw: tuple[int, int], box) -> torch.Tensor:
        """The crop through Pillow (reduced) or torchvision (whole): every odd file's way."""
        if img is None and r > 1:
            return decode_reduced(data, path, r, *hw, box)
        if img is None:
            img = decode_as_header_says(data, path, *hw)
        return img[:, box[0] : box[0] + box[2], box[1] : box[1] + box[3]]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        index = torch.as_tensor(indices, dtype=torch.int64)
        n, size = len(indices), self.size
        # Pass 1: bytes and sizes, from the headers (JPEG, PNG) or, for other formats, by decoding.
        datas, sizes, images, reducible, turbo = [], [], [], [], []
        for i in indices:
            path = self.files[i]
            data = read_encoded(path)
            view = memoryview(data.numpy())
            jpeg = read_jpeg_header(view)
            hw = (jpeg.height, jpeg.width) if jpeg is not None and jpeg.height and jpeg.width else png_size(view)
            if hw is not None:  # before any decoder sees it: simplejpeg and Pillow have no limit of their own here
                check_pixel_count(path, *hw)
            img = None
            if hw is None:  # no size from a header: found by decoding
                img = decode_rgb(data, path)
                say_stray_bytes(data, path)
            datas.append(data)
            images.append(img)
            sizes.append(hw or tuple(img.shape[1:]))
            reducible.append(self.draft and self.train and draftable(jpeg))
            turbo.append(self.backend == "simplejpeg" and turbo_ready(jpeg))
        boxes = draw_crop_boxes(
            torch.tensor(sizes, dtype=torch.int64).view(n, 2), self.train, self.generator(indices), self.min_scale
        )
        x = shared_uint8((n, 3, size, size))
        # Pass 2: one image at a time (a batch of whole photos would not fit in a worker's share
        # of memory), at the largest reduction its crop allows, then crop+resize into x.
        for k, (i, box) in enumerate(zip(indices, boxes.tolist())):
            r = reduction(box[2], box[3], size) if reducible[k] else 1
            crop, refused = None, ""
            if turbo[k]:
                self._turbo = self._turbo or TurboDecoder()
                crop = self._turbo(datas[k], r, *sizes[k], box)  # None: the Pillow / torchvision way decides
                refused = self._turbo.refused
            if crop is None:
                crop = self._crop_checked(datas[k], images[k], self.files[i], r, sizes[k], box)
                if refused and not self.named_damaged[i]:  # decoded all the same: libjpeg's line names no file
                    self.named_damaged[i] = 1  # (two workers at once may both name it: rare, and said, not lost)
                    say_damaged(self.files[i], refused)
            resize_into(x[k], crop)
            datas[k] = images[k] = None  # free each photo as soon as it is used
        return x, self.labels[index], index
