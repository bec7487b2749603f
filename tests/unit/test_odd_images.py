"""Odd files in an image folder, through every decode path: the batch-level CPU decoder
(`CpuDecodedFolder` with simplejpeg, and with Pillow with and without DCT scaling), the
per-image path (`ImageFolderDataset`, what `cnnpar predict` reads) and the GPU path with the CPU
standing in for nvJPEG (`GpuDecoder` on batches the workers' `EncodedFolderDataset` reads).

Each file either decodes to the RGB picture it holds (compared with the GPU path's reference
resize of that picture) or fails with a one-line DataError naming the file and what was expected.
Truncated JPEGs fail on every path: libjpeg-turbo as torchvision 0.29 and Pillow 13 drive it
refuses them ("Image is incomplete or truncated" / "image file is truncated") wherever the cut
falls, even with only the end-of-image marker missing, so no half-grey picture gets through.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from cnnpar.data.cpu_decode import CpuDecodedFolder
from cnnpar.data.crop_resize import draw_crop_boxes, resized_crops_loop
from cnnpar.data.folder import ImageFolderDataset
from cnnpar.data.gpu_decode import EncodedBatch, EncodedFolderDataset, GpuDecoder, collate_encoded
from cnnpar.data.tv_codecs import TV_CODEC_DEPRECATION
from cnnpar.errors import DataError
from tests.datafiles import damaged_png, short_png, stray_bytes

# the tests' own torchvision.io calls (references, encoders): only its codec notice is known
pytestmark = pytest.mark.filterwarnings(f"ignore:{TV_CODEC_DEPRECATION}:DeprecationWarning")

SIZE = 32
H, W = 60, 80


def picture(h: int = H, w: int = W) -> np.ndarray:
    """A smooth (h, w, 3) uint8 picture: JPEG keeps it nearly intact, resizing it is well posed."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    rgb = [127 + 100 * np.sin(x / 13 + y / 21), 127 + 100 * np.cos(x * y / 900), 40 + 170 * x * y / (h * w)]
    return np.stack(rgb, -1).round().astype(np.uint8)


def saved(img, fmt: str, **options) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    (img if isinstance(img, Image.Image) else Image.fromarray(img)).save(buf, format=fmt, **options)
    return buf.getvalue()


def twelve_bit(jpeg: bytes) -> bytes:
    """A baseline JPEG with its frame header's precision byte patched to 12 (Pillow writes no
    12-bit JPEGs; the scan data no longer matches, but decoders refuse it before reading that)."""
    sof = jpeg.index(b"\xff\xc0")
    patched = bytearray(jpeg)
    patched[sof + 4] = 12  # FF C0, 2 length bytes, then the sample precision
    return bytes(patched)


def huge_header(jpeg: bytes, side: int = 15000) -> bytes:
    """A baseline JPEG whose frame header says side x side (15000: 225 megapixels, over the 179 of
    folder.MAX_PIXELS) over the scan data of the small picture: a decoder that trusts the header
    allocates 3 * side**2 bytes and fills them with made-up pixels."""
    sof = jpeg.index(b"\xff\xc0")
    patched = bytearray(jpeg)
    patched[sof + 5 : sof + 9] = side.to_bytes(2, "big") * 2  # FF C0, length, precision, then height and width
    return bytes(patched)


EXPECTED_TAIL = "expected a readable JPEG or PNG file"


@dataclass
class Case:
    data: bytes
    expected: np.ndarray | None = None  # the RGB picture the file holds, or None: an error
    error: str = ""  # regex the error must match after "<path>: "
    tolerance: tuple[float, int] = (1.0, 8)  # mean and max absolute difference allowed (JPEG loss)
    tail: str = EXPECTED_TAIL  # how the error ends


LOSSLESS = (0.25, 1)  # the same filter in uint8 integers (torch's kernel) or floats: a level at most


def cases() -> dict[str, Case]:
    from PIL import Image

    rgb = picture()
    grey = np.asarray(Image.fromarray(rgb).convert("L"))
    palette = Image.fromarray(rgb).convert("P")  # the web palette, dithered
    grey16 = (np.arange(H * W, dtype=np.uint32).reshape(H, W) * 13 % 65536).astype(np.uint16)
    jpeg = saved(rgb, "JPEG", quality=95)
    rgba = np.concatenate([rgb, np.linspace(0, 255, H * W).reshape(H, W, 1).astype(np.uint8)], -1)
    return {
        "cmyk_jpeg": Case(saved(Image.fromarray(rgb).convert("CMYK"), "JPEG", quality=95), rgb),
        "grey_jpeg": Case(saved(grey, "JPEG", quality=95), np.repeat(grey[..., None], 3, -1)),
        "progressive_jpeg": Case(saved(rgb, "JPEG", quality=95, progressive=True), rgb),
        "png_named_jpg": Case(saved(rgb, "PNG"), rgb, tolerance=LOSSLESS),
        "rgba_png": Case(saved(rgba, "PNG"), rgb, tolerance=LOSSLESS),  # alpha dropped
        "palette_png": Case(saved(palette, "PNG"), np.asarray(palette.convert("RGB")), tolerance=LOSSLESS),
        # 16-bit: the top 8 bits (a plain cast would clip nearly every pixel to 255)
        "grey16_png": Case(
            saved(Image.fromarray(grey16), "PNG"),
            np.repeat((grey16 >> 8).astype(np.uint8)[..., None], 3, -1),
            tolerance=LOSSLESS,
        ),
        "12bit_jpeg": Case(twelve_bit(jpeg), error=r"cannot decode as an image \(Unsupported JPEG data precision 12\)"),
        # damaged but whole (libjpeg: "Corrupt JPEG data: 219 extraneous bytes before marker 0xd9"): its picture
        "jpeg_with_extraneous_bytes": Case(jpeg[:-2] + bytes(219) + b"\xff\xd9", rgb),
        # libjpeg: "Corrupt JPEG data: 7 extraneous bytes before marker 0xdb", and the picture the bytes did not touch
        "jpeg_with_stray_bytes_between_segments": Case(stray_bytes(jpeg), rgb),
        "truncated_jpeg": Case(jpeg[: len(jpeg) // 2], error=r"cannot decode as an image \(.*truncated"),
        "jpeg_without_end_marker": Case(jpeg[:-2], error=r"cannot decode as an image \(.*truncated"),
        "jpeg_header_only": Case(jpeg[:400], error=r"cannot decode as an image \("),
        "empty_file": Case(b"", error=r"empty file \(0 bytes\)"),
        "text_named_jpg": Case(b"class,label\ncat,1\n", error=r"cannot decode as an image \(Unsupported image file"),
        # refused from its header on every path, the GPU decoders' included, before anything decodes it
        "jpeg_over_179_megapixels": Case(
            huge_header(jpeg),
            error=r"15000x15000 pixels \(225 megapixels\): expected at most 179 megapixels",
            tail="shrink it or leave it out",
        ),
    }


CASES = cases()


def reference(expected: np.ndarray, centre_square: bool = True) -> torch.Tensor:
    """What a decoder should make of the picture `expected`, as (3, SIZE, SIZE): the GPU path's
    reference resize of its centre square, or (per-image path) the shorter side resized, then
    the centre cropped."""
    from torchvision.transforms.v2 import functional as TF

    img = torch.from_numpy(expected.copy()).permute(2, 0, 1).contiguous()
    if not centre_square:
        return TF.center_crop(TF.resize(img, SIZE, antialias=True), [SIZE, SIZE])
    box = draw_crop_boxes(torch.tensor([img.shape[1:]]), train=False)
    return resized_crops_loop([img], box, SIZE)[0]


def write(tmp_path: Path, name: str, data: bytes) -> list[Path]:
    """A folder of one ordinary JPEG and the odd file (named .jpg, whatever it holds)."""
    plain = tmp_path / "photos" / "a" / "plain.jpg"
    plain.parent.mkdir(parents=True)
    plain.write_bytes(saved(picture(), "JPEG", quality=95))
    odd = tmp_path / "photos" / "a" / f"{name}.jpg"
    odd.write_bytes(data)
    return [plain, odd]


def cpu_batch(files: list[Path], draft: bool = True, backend: str | None = None) -> torch.Tensor:
    return CpuDecodedFolder(files, [0, 1], SIZE, train=False, draft=draft, backend=backend)[[0, 1]][0]


def cpu_batch_simplejpeg(files: list[Path]) -> torch.Tensor:
    pytest.importorskip("simplejpeg")
    return cpu_batch(files, backend="simplejpeg")


def per_image(files: list[Path]) -> torch.Tensor:
    ds = ImageFolderDataset(files, [0, 1], SIZE)
    return torch.stack([ds[i][0] for i in range(len(ds))])


def gpu_standin(files: list[Path]) -> torch.Tensor:
    ds = EncodedFolderDataset(files, [0, 1], SIZE)
    batch, _ = collate_encoded([ds[i] for i in range(len(ds))])
    return GpuDecoder(files, SIZE, torch.device("cpu"), train=False)(batch)


PATHS: dict[str, Callable[[list[Path]], torch.Tensor]] = {
    "cpu_batch_pillow": lambda files: cpu_batch(files, backend="pillow"),
    "cpu_batch_pillow_no_draft": lambda files: cpu_batch(files, draft=False, backend="pillow"),
    "cpu_batch_simplejpeg": cpu_batch_simplejpeg,
    "per_image": per_image,
    "gpu_standin": gpu_standin,
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", CASES)
def test_odd_file_decodes_to_its_picture_or_is_named_in_one_line(tmp_path, name, path):
    case = CASES[name]
    files = write(tmp_path, name, case.data)
    if case.expected is None:
        with pytest.raises(DataError) as e:
            PATHS[path](files)
        message = str(e.value)
        assert "\n" not in message and ".cpp" not in message, message
        assert message.startswith(f"{files[1]}: ") and message.endswith(case.tail), message
        assert re.search(case.error, message), message
        return
    out = PATHS[path](files)
    assert out.shape == (2, 3, SIZE, SIZE) and out.dtype == torch.uint8
    diff = (out[1].int() - reference(case.expected, centre_square=path != "per_image").int()).abs().float()
    # Measured (torch 2.14, torchvision 0.29, Pillow 13): JPEGs (quality 95) 0.1-0.6 mean, 4 max;
    # lossless files 0.14 mean, 1 max through CpuDecodedFolder (uint8 kernel), 0 elsewhere.
    assert diff.mean() <= case.tolerance[0] and diff.max() <= case.tolerance[1], (diff.mean(), diff.max())


# Not among CASES: torchvision 0.29's PNG decoder crashes the process on these (SIGSEGV after libpng's "Not enough
# image data"), so a path that handed one to it would end pytest; below, torchvision is kept from them instead
SHORT_PNGS = {
    # its image data (12 bytes) cannot hold its pixels however compressed: refused from its chunk lengths
    "png_short_of_its_pixels": short_png(100, 100, 100),
    # 20,000 of the 30,100 bytes its rows need, in 42 bytes of zlib (the bound asks for 30): the run names the crash
    "png_short_but_plausible": short_png(100, 100, 20_000),
}


@pytest.mark.parametrize("path", PATHS)
def test_a_png_too_short_for_its_pixels_is_named_on_every_path_before_torchvision_sees_it(tmp_path, monkeypatch, path):
    import torchvision.io

    short = SHORT_PNGS["png_short_of_its_pixels"]
    files = write(tmp_path, "short", short)
    decode_image = torchvision.io.decode_image

    def guarded(data, *args, **kwargs):  # the other file still decodes
        assert bytes(data.numpy()) != short, "torchvision was handed a PNG it crashes on"
        return decode_image(data, *args, **kwargs)

    monkeypatch.setattr(torchvision.io, "decode_image", guarded)
    with pytest.raises(DataError) as e:
        PATHS[path](files)
    assert str(e.value) == (
        f"{files[1]}: cannot decode as an image (PNG image data of 12 bytes, where its 100x100 pixels need at least 30 "
        f"however compressed: cut short or damaged): {EXPECTED_TAIL}"
    )


# PNGs whose image data passes the bound but is damaged or cut inside, and Pillow's reason, which names no file
DAMAGED_PNGS = {
    "png_with_a_damaged_zlib_stream": (damaged_png(), "broken data stream when reading image file"),
    "png_short_but_plausible": (
        SHORT_PNGS["png_short_but_plausible"],
        "image file is truncated (0 bytes not processed)",
    ),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", DAMAGED_PNGS)
def test_a_png_damaged_inside_is_named_on_every_path_and_never_reaches_torchvision(tmp_path, monkeypatch, name, path):
    """torchvision 0.29's PNG decoder kills the process on these (SIGSEGV after libpng's "IDAT: invalid distance too
    far back" or "Not enough image data"), naming no file: with no DataLoader worker between (--workers 0, predict,
    the GPU decoders' CPU fall-back) it ended the whole run. PNGs go to Pillow (folder.decode_png), which raises."""
    import torchvision.io

    data, reason = DAMAGED_PNGS[name]
    files = write(tmp_path, name, data)
    decode_image = torchvision.io.decode_image

    def guarded(encoded, *args, **kwargs):  # the other file, a JPEG, still decodes
        assert bytes(encoded.numpy()) != data, "torchvision was handed a PNG it crashes on"
        return decode_image(encoded, *args, **kwargs)

    monkeypatch.setattr(torchvision.io, "decode_image", guarded)
    with pytest.raises(DataError) as e:
        PATHS[path](files)
    assert str(e.value) == f"{files[1]}: cannot decode as an image ({reason}): {EXPECTED_TAIL}"


@pytest.mark.parametrize("path", [p for p in PATHS if p != "per_image"])
def test_a_jpeg_with_stray_bytes_between_its_segments_is_named_once_where_damaged_jpegs_are(tmp_path, capfd, path):
    """Stray bytes stop jpeg_header's walk before the frame header, so the file is decoded whole by torchvision,
    whose libjpeg says only "Corrupt JPEG data: 7 extraneous bytes before marker 0xdb" and decodes the picture
    (CASES above: on every path). Where cpu_decode names damaged JPEGs (the CPU workers, the GPU decoders' CPU
    fall-back; not the textbook loader's per-image path, which names none), it names this one too, once."""
    pytest.importorskip("simplejpeg")
    files = write(tmp_path, "stray", stray_bytes(saved(picture(), "JPEG", quality=95)))
    PATHS[path](files)
    PATHS[path](files)
    said = [line for line in capfd.readouterr().err.splitlines() if line.startswith("warning: ")]
    assert said == [
        f"warning: {files[1]}: damaged JPEG data (libjpeg: Corrupt JPEG data: 7 extraneous bytes before marker 0xdb), "
        "decoded anyway"
    ]


@pytest.mark.parametrize("name", SHORT_PNGS)
def test_cnnpar_prepare_names_a_png_short_of_its_pixels_even_where_the_bound_passes_it(tmp_path, name):
    """What a run whose decoding worker crashed advises (data/worker_crash.py): `cnnpar prepare` decodes with Pillow,
    which names the file, where the bound refuses it and where it does not."""
    from cnnpar.data.png_header import data_shortfall, read_png_header
    from cnnpar.data.store_write import Sides, decode_for_store

    data = SHORT_PNGS[name]
    assert (data_shortfall(data, read_png_header(data)) is None) == (name == "png_short_but_plausible")
    odd = write(tmp_path, name, data)[1]
    with pytest.raises(DataError) as e:
        decode_for_store(odd, Sides(256))
    assert (
        str(e.value)
        == f"{odd}: cannot decode as an image (image file is truncated (0 bytes not processed)): {EXPECTED_TAIL}"
    )


def cuda_decoder(backend: str) -> Callable[[list[Path]], torch.Tensor]:
    """`GpuDecoder` on a real GPU with `backend`, on batches the workers' `EncodedFolderDataset` reads;
    skips where this machine lacks the backend."""

    def run(files: list[Path]) -> torch.Tensor:
        if backend == "hardware":
            from cnnpar.data.nvjpeg_hw import hardware_decoder_available

            why = hardware_decoder_available(0)
            if why:
                pytest.skip(why)
        if backend == "nvimgcodec":
            pytest.importorskip("nvidia.nvimgcodec", reason="the nvimgcodec extra is part of the test extra")
        ds = EncodedFolderDataset(files, [0, 1], SIZE)
        batch, _ = collate_encoded([ds[i] for i in range(len(ds))])
        out = GpuDecoder(files, SIZE, torch.device("cuda"), train=False, backend=backend)(batch)
        return out.cpu()

    return run


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["nvjpeg", "hardware", "nvimgcodec"])
@pytest.mark.parametrize("name", CASES)
def test_cuda_decoders_decode_each_odd_file_to_its_picture_or_name_it_in_one_line(tmp_path, name, backend):
    """Issue 11 item 7 on the GPU decoders themselves (the test above runs the GPU path with the CPU
    standing in for them): each odd file reaches its picture or the same one-line error."""
    case = CASES[name]
    files = write(tmp_path, name, case.data)
    decode = cuda_decoder(backend)
    if case.expected is None:
        with pytest.raises(DataError) as e:
            decode(files)
        message = str(e.value)
        assert "\n" not in message and ".cpp" not in message, message
        assert message.startswith(f"{files[1]}: ") and message.endswith(case.tail), message
        assert re.search(case.error, message), message
        return
    out = decode(files)
    assert out.shape == (2, 3, SIZE, SIZE) and out.dtype == torch.uint8
    diff = (out[1].int() - reference(case.expected).int()).abs().float()
    print(f"{backend} {name}: mean {float(diff.mean()):.3f} max {int(diff.max())}")
    # nvJPEG's and the engines' IDCT, chroma upsampling and colour conversion differ from libjpeg-turbo's
    # (item 8's cause, docs/decoding.md): the bound of the CUDA decoders' other comparisons
    mean, most = (1.0, 20) if case.tolerance != LOSSLESS else LOSSLESS
    assert diff.mean() <= mean and diff.max() <= most, (diff.mean(), diff.max())


@pytest.mark.parametrize("backend", ["pillow", "simplejpeg"])
def test_a_truncated_photo_decoded_reduced_is_named_too(tmp_path, backend):
    """Pillow or simplejpeg decodes the reduced JPEGs (DCT scaling): a cut file must fail there as
    well (simplejpeg refuses it, then Pillow names it)."""
    if backend == "simplejpeg":
        pytest.importorskip("simplejpeg")
    big = saved(picture(600, 800), "JPEG", quality=90)
    files = write(tmp_path, "cut", big[: len(big) * 2 // 3])
    # training crops (evaluation decodes at full size): every crop of a 600x800 photo is >= 2x SIZE, so reduced
    ds = CpuDecodedFolder(files, [0, 1], SIZE, train=True, backend=backend)
    with pytest.raises(DataError, match=rf"^{files[1]}: cannot decode as an image \(image file is truncated"):
        ds[[0, 1]]


def test_an_empty_buffer_in_an_encoded_batch_is_named():
    """The GPU path's workers refuse empty files (above); bytes handed over otherwise are checked too."""
    data = [torch.frombuffer(bytearray(saved(picture(), "JPEG")), dtype=torch.uint8), torch.empty(0, dtype=torch.uint8)]
    offsets = torch.tensor([0, len(data[0]), len(data[0])])
    batch = EncodedBatch(torch.cat(data), offsets, torch.arange(2))
    files = [Path("a/ok.jpg"), Path("a/empty.jpg")]
    with pytest.raises(DataError, match=r"^a/empty\.jpg: empty file \(0 bytes\)"):
        GpuDecoder(files, SIZE, torch.device("cpu"), train=False)(batch)


def test_a_cut_file_never_reaches_a_gpu_decoder_that_would_decode_it_silently(tmp_path):
    """On an H200 torchvision's nvJPEG call (the JPEG engines, for baseline files) decoded a file cut
    in half without an error. The workers' end-marker check sends such a file to the CPU, which names
    it: here a batched decoder that never fails stands in for the engines."""
    jpeg = saved(picture(), "JPEG")
    files = write(tmp_path, "cut", jpeg[: len(jpeg) // 2])
    seen: list[int] = []

    def lenient(buffers, device):  # decodes whatever it is given, as the engines did
        seen.extend(len(b) for b in buffers)
        return [torch.zeros(3, 8, 8, dtype=torch.uint8) for _ in buffers]

    ds = EncodedFolderDataset(files, [0, 1], SIZE)
    batch, _ = collate_encoded([ds[i] for i in range(len(ds))])
    with pytest.raises(DataError, match=rf"^{re.escape(str(files[1]))}: cannot decode as an image \(.*truncated"):
        GpuDecoder(files, SIZE, torch.device("cpu"), train=False, batch_decode=lenient)(batch)
    assert len(jpeg) // 2 not in seen  # the cut file never went to the batched decoder


def test_a_cut_file_in_a_batch_made_without_workers_is_named_too():
    """Batches made without DataLoader workers carry no routes: the decoder reads the headers and
    checks the end markers itself, with the same outcome."""
    jpeg = saved(picture(), "JPEG")
    data = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in (jpeg, jpeg[: len(jpeg) // 2])]
    offsets = torch.tensor([0, len(data[0]), len(data[0]) + len(data[1])])
    batch = EncodedBatch(torch.cat(data), offsets, torch.arange(2))
    assert batch.nvjpeg_ok is None  # no routes: the decoder decides
    seen: list[int] = []

    def lenient(buffers, device):
        seen.extend(len(b) for b in buffers)
        return [torch.zeros(3, 8, 8, dtype=torch.uint8) for _ in buffers]

    files = [Path("a/ok.jpg"), Path("a/cut.jpg")]
    with pytest.raises(DataError, match=r"^a/cut\.jpg: cannot decode as an image \(.*truncated"):
        GpuDecoder(files, SIZE, torch.device("cpu"), train=False, batch_decode=lenient)(batch)
    assert len(jpeg) // 2 not in seen


def test_a_damaged_jpeg_the_gpu_decoders_leave_to_the_cpu_is_named_as_the_cpu_workers_name_it(tmp_path, capfd):
    """libjpeg's own line ("Corrupt JPEG data: ...") names no file. The CPU workers add a warning naming it; the
    GPU path's CPU fall-back (here for a file the batched decoder refuses, as nvJPEG may) printed only libjpeg's."""
    pytest.importorskip("simplejpeg")
    jpeg = saved(picture(), "JPEG", quality=95)
    damaged = jpeg[:-2] + bytes(219) + b"\xff\xd9"
    cpu_files = write(tmp_path / "cpu", "damaged", damaged)
    cpu_batch_simplejpeg(cpu_files)
    said = [line for line in capfd.readouterr().err.splitlines() if line.startswith("warning: ")]
    assert len(said) == 1 and "damaged JPEG data (libjpeg: Corrupt JPEG data: " in said[0], said

    def refusing(buffers, device):  # nvJPEG refusing the damaged file: the batch is bisected, the file left
        if any(b.numpy().tobytes() == damaged for b in buffers):
            raise RuntimeError("Error while decoding JPEG images: Failed to decode batch: 6")
        return [torch.zeros(3, H, W, dtype=torch.uint8) for _ in buffers]

    files = write(tmp_path / "gpu", "damaged", damaged)
    ds = EncodedFolderDataset(files, [0, 1], SIZE)
    decoder = GpuDecoder(files, SIZE, torch.device("cpu"), train=False, batch_decode=refusing)
    out = decoder(collate_encoded([ds[i] for i in range(len(ds))])[0])
    assert decoder.cpu_decoded == 1
    assert said[0].replace(str(cpu_files[1]), str(files[1])) in capfd.readouterr().err.splitlines()
    assert (out[1].int() - reference(picture()).int()).abs().max() <= 8  # its picture


@pytest.mark.parametrize("workers", [True, False])
def test_a_jpeg_over_the_pixel_limit_never_reaches_a_gpu_decoder(tmp_path, workers):
    """nvJPEG, the JPEG engines and nvImageCodec size their output from the header and have no limit of their
    own: a 225-megapixel header over a small file's scan data was decoded into 675 MB of made-up pixels (a
    batched decoder that never fails stands in for them here). Refused as `--decode cpu` refuses it, whether the
    workers read the headers or the decoder does (batches made without workers)."""
    files = write(tmp_path, "huge", huge_header(saved(picture(), "JPEG", quality=95)))
    seen: list[int] = []

    def lenient(buffers, device):
        seen.extend(len(b) for b in buffers)
        return [torch.zeros(3, 8, 8, dtype=torch.uint8) for _ in buffers]

    decoder = GpuDecoder(files, SIZE, torch.device("cpu"), train=False, batch_decode=lenient)
    expected = rf"^{re.escape(str(files[1]))}: 15000x15000 pixels \(225 megapixels\): expected at most 179 "
    with pytest.raises(DataError, match=expected):
        if workers:
            ds = EncodedFolderDataset(files, [0, 1], SIZE)
            decoder(collate_encoded([ds[i] for i in range(len(ds))])[0])
        else:
            data = [torch.frombuffer(bytearray(f.read_bytes()), dtype=torch.uint8) for f in files]
            offsets = torch.tensor([0, len(data[0]), len(data[0]) + len(data[1])])
            decoder(EncodedBatch(torch.cat(data), offsets, torch.arange(2)))
    assert seen == []


@pytest.mark.parametrize("name", CASES)
def test_cnnpar_prepare_stores_each_odd_files_picture_or_names_it_in_one_line(tmp_path, name):
    """`cnnpar prepare` decodes with Pillow (store_write.decode_for_store), not through the paths above: the same
    pictures must reach the store (a 16-bit grey PNG was stored pure white) or the same one-line error."""
    from cnnpar.data.store_write import Sides, decode_for_store

    case = CASES[name]
    odd = write(tmp_path, name, case.data)[1]
    if case.expected is None:
        with pytest.raises(DataError) as e:
            decode_for_store(odd, Sides(max(H, W)))
        assert str(e.value).startswith(f"{odd}: ") and "\n" not in str(e.value), str(e.value)
        return
    pixels, h, w = decode_for_store(odd, Sides(max(H, W)))  # the full size: no resize
    stored = np.frombuffer(pixels, np.uint8).reshape(h, w, 3).astype(np.int32)
    diff = np.abs(stored - case.expected.astype(np.int32))
    # at full size a JPEG's loss is not averaged away by a resize: measured up to 10 levels (progressive, q95)
    mean, most = case.tolerance if case.tolerance == LOSSLESS else (case.tolerance[0], 16)
    assert (h, w) == (H, W) and diff.mean() <= mean and diff.max() <= most, (diff.mean(), diff.max())


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    ("frames", "side", "error"),
    [(1, 40, r"40x40 pixels \(0 megapixels\)"), (3, 10, r"3 frames of 10x10 pixels \(0 megapixels, every frame")],
)
def test_a_gif_named_jpg_is_held_to_the_pixel_limit_before_torchvision_decodes_it(
    tmp_path, monkeypatch, path, frames, side, error
):
    """torchvision decodes a GIF named .jpg (and every frame of it): neither a JPEG's nor a PNG's header was read,
    so a 296 KB GIF of 20000x20000 decoded to 1.2 GB past the 179-megapixel limit. Here the limit is 200 pixels:
    a 40x40 GIF, or 3 frames of 10x10 (each under it), are over it."""
    from PIL import Image

    monkeypatch.setattr("cnnpar.data.folder.MAX_PIXELS", 200)
    gif = io.BytesIO()
    shown = [Image.new("L", (side, side), 60 * k) for k in range(frames)]
    shown[0].save(gif, "GIF", save_all=True, append_images=shown[1:])
    files = write(tmp_path, "gif", gif.getvalue())
    files[0].write_bytes(saved(picture(8, 8), "JPEG"))  # the plain photo within the limit too
    with pytest.raises(DataError, match=rf"gif.jpg: {error}"):
        PATHS[path](files)


@pytest.mark.parametrize("path", PATHS)
def test_a_webp_past_pillow_s_own_limit_or_a_truncated_gif_named_jpg_ends_in_one_line(tmp_path, monkeypatch, path):
    """Pillow's WebP reader refuses a canvas past its decompression-bomb limit itself (DecompressionBombError), and
    its GIF reader counting frames indexes a truncated file unchecked (IndexError): both were tracebacks from the
    pixel check, where a WebP past the limit is refused in one line and a damaged GIF left to the decoder, whose
    error names it. Pillow's limit is 2 x 50 pixels here: the 20x20 WebP is past it."""
    from PIL import Image

    gif = io.BytesIO()
    shown = [Image.new("L", (10, 10), 60 * k) for k in range(3)]
    shown[0].save(gif, "GIF", save_all=True, append_images=shown[1:])
    files = write(tmp_path, "gif", gif.getvalue()[:137])  # cut inside the second frame
    files[0].write_bytes(saved(Image.new("RGB", (20, 20), (200, 10, 10)), "WEBP"))
    files[0] = files[0].rename(files[0].with_name("webp.jpg"))
    try:
        PATHS[path](files[1:])
    except DataError as e:
        assert "gif.jpg" in str(e) and "\n" not in str(e)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 50)
    with pytest.raises(DataError, match=r"webp.jpg: Image size \(400 pixels\) exceeds limit .*: expected at most"):
        PATHS[path](files[:1])
