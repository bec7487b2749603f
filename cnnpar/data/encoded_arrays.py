"""Arrays of encoded images in an .npz: `{split}_jpeg` (or `_png`) holding the files' bytes one after another,
and `{split}_offsets` (N + 1 integers) where image i is bytes offsets[i]:offsets[i+1]. A data set kept as JPEG
files is a fraction of its pixels' size (the shared CIFAR-10 copy: 55 MB of JPEG for 184 MB of pixels), so
data sets travel this way; cnnpar decodes them once, when it loads them, into the uint8 arrays an `x_train`
would hold. Small images only make sense here: every image must have the same size, as in any array.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from cnnpar.data.cpu_decode import simplejpeg_module, stray_bytes_warning, turbo_ready
from cnnpar.data.jpeg_header import read_jpeg_header
from cnnpar.data.png_header import PNG_SIGNATURE
from cnnpar.errors import DataError

KINDS = ("jpeg", "png")


def encoded_keys(arrays: dict, split: str) -> tuple[str, str] | None:
    """(bytes key, offsets key) of `split` ("train", "test") where the archive holds it encoded, else None."""
    for kind in KINDS:
        if f"{split}_{kind}" in arrays and f"{split}_offsets" in arrays:
            return f"{split}_{kind}", f"{split}_offsets"
    return None


@dataclass
class DecodeTally:
    """What decoded the JPEGs of one or more encoded arrays, for the load line: simplejpeg, or torchvision for the
    files simplejpeg declines; and the files libjpeg warned about that decoded anyway (`damaged`: where, image
    index, libjpeg's message), which libjpeg itself reported in a bare line naming none."""

    jpegs: int = 0
    by_torchvision: int = 0
    damaged: list[tuple[str, int, str]] = field(default_factory=list)

    def damaged_note(self) -> str:
        """One warning line for the damaged images, or ""."""
        if not self.damaged:
            return ""
        where, i, why = self.damaged[0]
        more = len(self.damaged) - 1
        shown = ", ".join(f"{w} image {k}" for w, k, _ in self.damaged[1:4])
        others = f"; {more:,} more such image(s), the first {shown}"
        return f"warning: {where} image {i}: damaged JPEG data (libjpeg: {why}), decoded anyway by torchvision" + (
            others if more else ""
        )


def decode_encoded(buf: np.ndarray, offsets: np.ndarray, where: str, tally: DecodeTally | None = None) -> np.ndarray:
    """(N, H, W, C) uint8 from the files in `buf` at `offsets`; C is 1 where every file is grey (`grey_file`),
    else 3 (grey files among colour ones decode to three equal channels). `where` ("data.npz[train_jpeg]") names
    the array in errors. What decoded the JPEGs is counted into `tally` where it is given."""
    from cnnpar.data.folder import check_pixel_count, decode_rgb

    buf, offsets = np.asarray(buf), np.asarray(offsets)
    if buf.ndim != 1 or buf.dtype != np.uint8:
        raise DataError(f"{where}: shape {buf.shape}, dtype {buf.dtype}: expected 1-D uint8 bytes")
    if offsets.ndim != 1 or not np.issubdtype(offsets.dtype, np.integer) or len(offsets) < 2:
        raise DataError(
            f"{where}: offsets of shape {offsets.shape}, dtype {offsets.dtype}: expected N + 1 whole numbers"
        )
    steps = np.diff(offsets)
    if offsets[0] < 0 or (steps < 0).any() or offsets[-1] > len(buf):
        bad = int(np.argmax(steps < 0)) if (steps < 0).any() else None
        detail = f"offset {bad + 1} is below offset {bad}" if bad is not None else f"they span 0..{len(buf)} no more"
        raise DataError(
            f"{where}: offsets {int(offsets[0])}..{int(offsets[-1])} for {len(buf)} bytes ({detail}): expected "
            "offsets that rise from 0 to at most the bytes' length"
        )
    data = torch.from_numpy(buf)
    images, grey = [], True
    for i in range(len(offsets) - 1):
        raw = buf[int(offsets[i]) : int(offsets[i + 1])]
        header = read_jpeg_header(raw.tobytes())
        if header is not None:  # before simplejpeg decodes it (decode_rgb checks every other file itself)
            check_pixel_count(f"{where} image {i}", header.height, header.width)
        img, declined = _turbo_decode(raw, header)  # HWC; None where simplejpeg is absent or declines the file
        fallback = img is None
        if fallback:
            img = decode_rgb(data[int(offsets[i]) : int(offsets[i + 1])], f"{where} image {i}").permute(1, 2, 0)
            img = img.numpy()
        if header is None:  # stray bytes between a JPEG's header segments hide its frame header from read_jpeg_header
            declined = stray_bytes_warning(raw)  # libjpeg's bare warning (torchvision's decode) named no image
        if tally is not None and (header is not None or declined):  # a JPEG (PNGs go to torchvision, as said)
            tally.jpegs += 1
            tally.by_torchvision += fallback
            if declined:
                tally.damaged.append((where, i, declined))
        if images and img.shape != images[0].shape:
            raise DataError(
                f"{where} image {i}: {img.shape[1]}x{img.shape[0]} pixels, image 0 {images[0].shape[1]}x"
                f"{images[0].shape[0]}: expected one size for every image of an array (a folder of image files "
                "takes any sizes)"
            )
        images.append(img)
        grey = grey and grey_file(raw, header)
    x = np.stack(images)  # N, H, W, 3
    return x[..., :1] if grey else x


def _turbo_decode(raw: np.ndarray, header) -> tuple[np.ndarray | None, str | None]:
    """A JPEG through simplejpeg (libjpeg-turbo, the same pixels as torchvision's decode: docs/decoding.md), ten
    times faster than torchvision's call on CIFAR-sized files (its per-call overhead dominates there), and None;
    or None and why not: None where simplejpeg is not installed or the file is not one it decodes as the other
    paths do, libjpeg's message where it refuses the file (strict: its warnings, such as corrupt data, refuse)."""
    sj = simplejpeg_module()
    if sj is None or not turbo_ready(header):
        return None, None
    try:
        return sj.decode_jpeg(raw.tobytes(), colorspace="RGB", strict=True), None
    except ValueError as e:
        return None, str(e) or type(e).__name__


def grey_file(data, header) -> bool:
    """Whether the file says it is grey: a JPEG of one component (`header`, its frame header or None), a PNG of
    colour type 0 or 4 (grey, grey + alpha). Colour images stay three channels even where every pixel is grey.
    `data`: the file's bytes, or its first 64 at least (bytes or a uint8 array). The one rule for grey files: an
    archive's encoded arrays (one channel where every file is grey) and an image folder's header sample
    (source_size.folder_sample: no flip under --augment auto) both ask it."""
    head = bytes(data[:64])
    if head.startswith(PNG_SIGNATURE) and len(head) > 25:
        return head[25] in (0, 4)
    return header is not None and header.components == 1
