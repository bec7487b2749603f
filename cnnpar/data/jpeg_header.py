"""Read a JPEG's frame header (size, components, coding) without decoding it.

nvJPEG, as torchvision calls it, refuses some JPEGs that libjpeg-turbo on the CPU decodes: CMYK
and YCCK files (4 components; torchvision never turns on `nvjpegDecodeParamsSetAllowCMYK`, and
ImageNet's training set holds about 22 of them), 12-bit, lossless and arithmetic-coded files. A
batched `decode_jpeg(list, device="cuda")` that meets one of them fails as a whole, so these are
found here, from the header, and sent to the CPU before the batched call is tried. Walking the
marker segments costs microseconds and runs in the DataLoader workers, not the main process.
"""

from __future__ import annotations

from typing import NamedTuple

# Start-of-frame markers: C0 baseline, C1 extended sequential, C2 progressive, C3 lossless,
# C5-C7 hierarchical, C9-CB and CD-CF arithmetic coding. C4 (DHT), C8 (JPG) and CC (DAC) are not frames.
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# Huffman-coded 8-bit baseline, extended and progressive frames: what nvJPEG decodes (progressive ones
# on its hybrid path, which torchvision runs one image at a time, still on the GPU).
_NVJPEG_SOF = frozenset({0xC0, 0xC1, 0xC2})
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM and RST0-7 carry no length field


class JpegHeader(NamedTuple):
    height: int
    width: int
    components: int
    precision: int
    sof: int  # the start-of-frame marker byte: 0xC0 baseline, 0xC2 progressive, ...
    sampling: tuple[int, ...] = ()  # per component, horizontal << 4 | vertical sampling factor


def _markers(data):
    """(marker, i) for each marker segment of a JPEG from its start, i the index of the marker byte;
    stops where a marker should stand and does not, or where the data ends before the segment's
    length. The one walk both the header reader and `first_scan` follow."""
    n = len(data)
    if n < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return
    i = 2
    while i + 3 < n:
        if data[i] != 0xFF:
            return  # garbage where a marker must be
        while i < n and data[i] == 0xFF:  # any number of fill bytes may precede a marker
            i += 1
        if i >= n:
            return
        marker = data[i]
        yield marker, i
        if marker in _STANDALONE:
            i += 1
            continue
        if i + 2 >= n:
            return
        i += 1 + ((data[i + 1] << 8) | data[i + 2])


def read_jpeg_header(data) -> JpegHeader | None:
    """The frame header of a JPEG in `data` (bytes, bytearray or memoryview), or None when `data` is
    not a JPEG or ends (or turns to scan data) before its frame header."""
    n = len(data)
    for marker, i in _markers(data):
        if marker in _STANDALONE:
            continue
        if marker in (0xD9, 0xDA) or i + 2 >= n:  # end of image or start of scan before any frame
            return None
        if marker in _SOF:
            if i + 8 >= n:
                return None
            precision = data[i + 3]
            height = (data[i + 4] << 8) | data[i + 5]
            width = (data[i + 6] << 8) | data[i + 7]
            components = data[i + 8]
            # each component: id, sampling factors (H << 4 | V), quantisation table
            sampling = tuple(data[i + 10 + 3 * c] for c in range(components) if i + 10 + 3 * c < n)
            return JpegHeader(height, width, components, precision, marker, sampling)
    return None


def nvjpeg_friendly(data) -> bool:
    """True for a JPEG that torchvision's nvJPEG decode accepts in a batch: 8-bit Huffman-coded
    (baseline, extended or progressive) with 1 (grey) or 3 components (YCbCr)."""
    return header_ok(read_jpeg_header(data))


# Luma sampling factors (H << 4 | V, chroma at 1x1) the GPU's JPEG engines take: 4:4:4, 4:4:0, 4:2:2,
# 4:2:0. nvjpeg.h: "NVJPEG_BACKEND_HARDWARE: supports baseline JPEG bitstream with single scan. 410
# and 411 sub-samplings are not supported".
_HARDWARE_LUMA = frozenset({0x11, 0x12, 0x21, 0x22})


def hardware_ok(h: JpegHeader | None) -> bool:
    """True for a JPEG that nvJPEG's hardware backend (the GPU's JPEG engines) decodes: 8-bit
    baseline, 1 or 3 components, with 4:4:4, 4:4:0, 4:2:2 or 4:2:0 chroma. The header does not say how
    many scans follow; a rare multi-scan baseline file fails the batch, which then goes the slower way.
    Three components are taken as YCbCr, as torchvision's nvJPEG path takes them: a rare file coded in
    RGB (an Adobe marker with transform 0) is not told apart by either."""
    if not header_ok(h) or h.sof != 0xC0:
        return False
    if h.components == 1:
        return True
    return len(h.sampling) == 3 and h.sampling[0] in _HARDWARE_LUMA and h.sampling[1] == h.sampling[2] == 0x11


def first_scan(data) -> int:
    """The offset of the image's first start-of-scan marker (FF DA), found by walking the marker
    segments from the start (so an EXIF thumbnail's own scan, inside its APP1 segment, is skipped),
    or -1 when there is none."""
    for marker, i in _markers(data):
        if marker == 0xDA:
            return i - 1
        if marker == 0xD9:
            return -1
    return -1


def ends_whole(data) -> bool:
    """Whether the file still holds an end-of-image marker (FF D9) after its first scan marker: a
    file cut short lacks it. Inside a scan the coder stuffs every FF byte, so only a real marker reads
    FF D9 there; an EXIF thumbnail's markers lie in a segment before the scan. The GPU's JPEG engines,
    which torchvision's nvJPEG call also uses for baseline files, decode a cut file without an error
    (what is missing comes out as made-up pixels; seen on an H200)."""
    sos = first_scan(data)
    if sos < 0:
        return False
    n = len(data)
    if b"\xff\xd9" in bytes(data[max(sos, n - 64) :]):  # nearly every file: its last two bytes
        return True
    return bytes(data[sos:]).rfind(b"\xff\xd9") >= 0


def decode_route(h: JpegHeader | None, data) -> int:
    """Which decoders take the file `data` with header `h`, for the workers to tell the main process
    in one byte: 0 only the CPU, 1 torchvision's nvJPEG call too, 2 `--decode hardware`'s one-call
    path too. A file cut short goes to the CPU, which names it (`ends_whole`)."""
    if not ends_whole(data):
        return 0
    return 2 if hardware_ok(h) else int(header_ok(h))


def header_ok(h: JpegHeader | None) -> bool:
    """`nvjpeg_friendly` for a header already read."""
    return (
        h is not None
        and h.sof in _NVJPEG_SOF
        and h.precision == 8
        and h.components in (1, 3)
        and h.height > 0
        and h.width > 0
    )
