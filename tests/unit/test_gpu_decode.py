"""The encoded-bytes path for image folders: JPEG headers, crop boxes, batched crop-and-resize and
the decoder's fall-backs. CPU decode stands in for nvJPEG; the CUDA path has its own marked test."""

from __future__ import annotations

import io
import math
import random
import warnings
from pathlib import Path

import pytest
import torch

from cnnpar.config import DataConfig
from cnnpar.data.crop_resize import (
    RRC_RATIO,
    RRC_SCALE,
    draw_crop_boxes,
    fallback_boxes,
    resized_crops,
    resized_crops_loop,
)
from cnnpar.data.gpu_decode import (
    EncodedBatch,
    EncodedFolderDataset,
    GpuDecoder,
    collate_encoded,
    nvjpeg_decode,
)
from cnnpar.data.jpeg_header import nvjpeg_friendly, read_jpeg_header
from cnnpar.data.tv_codecs import TV_CODEC_DEPRECATION
from cnnpar.errors import ConfigError, DataError

# torchvision 0.29 deprecates its image codecs (for torchcodec) with a warning on every call.
# the tests' own torchvision.io calls (references, encoders): only its codec notice is known
pytestmark = pytest.mark.filterwarnings(f"ignore:{TV_CODEC_DEPRECATION}:DeprecationWarning")

SIZES = [(375, 500), (500, 333), (120, 90), (64, 300), (224, 224), (31, 29)]


def smooth_image(h: int, w: int, phase: float = 0.0) -> torch.Tensor:
    """A smooth (3, h, w) uint8 picture: JPEG keeps it nearly intact and resampling it is well posed."""
    y = torch.linspace(0, 1, h).view(h, 1)
    x = torch.linspace(0, 1, w).view(1, w)
    rgb = [127 + 100 * torch.sin(6 * x + 3 * y + phase), 127 + 100 * torch.cos(5 * x * y + phase), 60 + 150 * x * y]
    return torch.stack([c.expand(h, w) for c in rgb]).round().to(torch.uint8)


def jpeg_bytes(img: torch.Tensor) -> bytes:
    from torchvision.io import encode_jpeg

    return encode_jpeg(img, quality=90).numpy().tobytes()


def pil_jpeg(mode: str, size=(30, 20), **save) -> bytes:
    from PIL import Image

    color = {"CMYK": (10, 200, 30, 5), "L": 90}.get(mode, (10, 200, 30))
    buf = io.BytesIO()
    Image.new(mode, size, color).save(buf, format="JPEG", **save)
    return buf.getvalue()


def encoded(blobs: list[bytes]) -> EncodedBatch:
    """What collate_encoded makes of these files, without workers (nvjpeg_ok left for the decoder)."""
    data = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]
    offsets = torch.zeros(len(data) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor([len(d) for d in data]), 0)
    return EncodedBatch(torch.cat(data), offsets, torch.arange(len(data)))


def decoded(blobs: list[bytes]) -> list[torch.Tensor]:
    from torchvision.io import ImageReadMode, decode_image

    return [decode_image(torch.frombuffer(bytearray(b), dtype=torch.uint8), mode=ImageReadMode.RGB) for b in blobs]


def test_jpeg_header_reads_frames_and_flags_what_nvjpeg_refuses():
    img = smooth_image(40, 60)
    h = read_jpeg_header(jpeg_bytes(img))
    assert (h.height, h.width, h.components, h.precision, h.sof) == (40, 60, 3, 8, 0xC0)
    assert nvjpeg_friendly(jpeg_bytes(img))
    assert read_jpeg_header(pil_jpeg("L")).components == 1 and nvjpeg_friendly(pil_jpeg("L"))
    progressive = pil_jpeg("RGB", progressive=True)
    assert read_jpeg_header(progressive).sof == 0xC2 and nvjpeg_friendly(progressive)
    cmyk = pil_jpeg("CMYK")
    assert read_jpeg_header(cmyk).components == 4 and not nvjpeg_friendly(cmyk)
    from torchvision.io import encode_png

    assert read_jpeg_header(encode_png(img).numpy().tobytes()) is None
    assert read_jpeg_header(b"\xff\xd8 not really a jpeg") is None
    assert read_jpeg_header(jpeg_bytes(img)[:20]) is None  # ends before its frame header
    assert read_jpeg_header(memoryview(bytearray(jpeg_bytes(img)))) == h


def test_train_crop_boxes_fit_and_follow_the_random_resized_crop_distribution():
    g = torch.Generator().manual_seed(0)
    n = 20000
    sizes = torch.stack([torch.randint(200, 900, (n,), generator=g), torch.randint(200, 900, (n,), generator=g)], 1)
    boxes = draw_crop_boxes(sizes, train=True, generator=g)
    top, left, ch, cw = boxes.unbind(1)
    h, w = sizes.unbind(1)
    assert (top >= 0).all() and (left >= 0).all() and (ch >= 1).all() and (cw >= 1).all()
    assert (top + ch <= h).all() and (left + cw <= w).all()
    centre = (boxes == torch.as_tensor(fallback_boxes(h.numpy(), w.numpy()))).all(1)  # ten draws failed
    rrc = ~centre
    near_square = (w / h > 0.8) & (w / h < 1.25)
    # Ten draws fail in a row only for elongated images; near-square ones (almost) never fall back.
    assert centre[near_square].float().mean() < 0.001 and centre[~near_square].float().mean() > 0.02
    frac = (ch * cw).double()[rrc] / (h * w).double()[rrc]
    ratio = cw.double()[rrc] / ch.double()[rrc]
    # Rounding a side to whole pixels moves area and ratio by about 1/side (side >= ~100 here).
    assert frac.min() > RRC_SCALE[0] * 0.98 and frac.max() <= 1.0
    assert ratio.min() > RRC_RATIO[0] * 0.98 and ratio.max() < RRC_RATIO[1] * 1.02
    # Same distribution as the per-image sampler it replaced (rebuilt below with Python's random):
    # compare means, spreads and fall-back rates, each within ~5 standard errors.
    ref = [reference_crop(hh, ww, random.Random(k)) for k, (hh, ww) in enumerate(sizes.tolist())]
    ref_centre = torch.tensor([c for *_, c in ref])
    ref_frac = torch.tensor([f for f, _, c in ref if not c])
    ref_log_ratio = torch.tensor([r for _, r, c in ref if not c])
    assert abs(centre.double().mean() - ref_centre.double().mean()) < 0.01
    assert abs(frac.mean() - ref_frac.mean()) < 0.01 and abs(frac.std() - ref_frac.std()) < 0.01
    assert abs(ratio.log().mean() - ref_log_ratio.mean()) < 0.01
    assert abs(ratio.log().std() - ref_log_ratio.std()) < 0.01
    # Positions spread over the free room: mean relative offset near 1/2.
    room = (h - ch)[rrc].double()
    rel = top[rrc].double()[room > 0] / room[room > 0]
    assert abs(rel.mean() - 0.5) < 0.02


def reference_crop(h: int, w: int, rng: random.Random) -> tuple[float, float, bool]:
    """The former per-image random-resized crop: (area fraction, log ratio, fell back to centre)."""
    for _ in range(10):
        target = h * w * rng.uniform(*RRC_SCALE)
        ratio = math.exp(rng.uniform(math.log(RRC_RATIO[0]), math.log(RRC_RATIO[1])))
        cw, ch = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
        if 0 < cw <= w and 0 < ch <= h:
            return ch * cw / (h * w), math.log(cw / ch), False
    return 1.0, 0.0, True


def test_crop_boxes_fall_back_as_torchvision_does_and_eval_uses_the_centre_square():
    g = torch.Generator().manual_seed(1)
    sizes = torch.tensor([[10, 1000], [1000, 12], [375, 500], [7, 7]])
    eval_boxes = draw_crop_boxes(sizes, train=False)
    assert eval_boxes.tolist() == [[0, 495, 10, 10], [494, 0, 12, 12], [0, 62, 375, 375], [0, 0, 7, 7]]
    train = draw_crop_boxes(sizes.repeat(50, 1), train=True, generator=g).view(50, 4, 4)
    # A 1:100 strip never fits a crop of ratio 3/4..4/3 and area >= 1/4: always the fall-back, torchvision's
    # 4:3 (3:4) box of the full short side, centred; not the 1:1 centre square evaluation reads.
    assert (train[:, 0] == torch.tensor([0, 493, 10, 13])).all()
    assert (train[:, 1] == torch.tensor([492, 0, 16, 12])).all()
    assert (train[:, 2] != eval_boxes[2]).any(dim=1).float().mean() > 0.9


# tiny images (whose rounded crops only sometimes fit) and strips, which no draw of ratio 3:4..4:3 fits
STRIPS = [(3, 1000), (1000, 3), (10, 1000), (1000, 12), (100, 10000)]
FALLBACK_SIZES = [(1, 1), (1, 5), (5, 1), (2, 3), *STRIPS]


@pytest.mark.parametrize("hw", FALLBACK_SIZES)
def test_train_boxes_stay_in_bounds_and_fall_back_to_torchvisions_box(hw):
    from torchvision.transforms import RandomResizedCrop

    h, w = hw
    boxes = draw_crop_boxes(torch.tensor([hw] * 2000), True, torch.Generator().manual_seed(0))
    top, left, ch, cw = boxes.unbind(1)
    assert (top >= 0).all() and (left >= 0).all() and (ch >= 1).all() and (cw >= 1).all()
    assert (top + ch <= h).all() and (left + cw <= w).all()
    # where no draw fits, torchvision's RandomResizedCrop (same scale and ratio) returns its fall-back box, a
    # fixed one, which ours must be
    if hw in STRIPS:
        tv = RandomResizedCrop(8, scale=(RRC_SCALE[0], 1.0), ratio=RRC_RATIO)
        expected = tv.get_params(torch.zeros(1, h, w), list(tv.scale), list(tv.ratio))
        assert boxes[0].tolist() == list(expected) and (boxes == boxes[0]).all()


def test_crop_min_scale_sets_the_smallest_training_crop():
    sizes = torch.tensor([[400, 400]] * 20000)
    for lo in (0.08, 0.25, 0.9):
        boxes = draw_crop_boxes(sizes, True, torch.Generator().manual_seed(3), min_scale=lo)
        frac = (boxes[:, 2] * boxes[:, 3]).double() / 400**2
        assert frac.min() > lo * 0.98 and frac.min() < lo * 1.05 and frac.max() <= 1.0
    assert DataConfig().crop_min_scale == RRC_SCALE[0]  # the config's default is the drawing's
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ConfigError, match=r"crop_min_scale \(--crop-min-scale\)"):
            DataConfig(crop_min_scale=bad)
        with pytest.raises(ValueError, match="crop min scale"):
            draw_crop_boxes(sizes[:1], True, min_scale=bad)


@pytest.mark.parametrize("train", [True, False])
def test_batched_resize_matches_the_per_image_loop_on_real_jpegs(train):
    images = decoded([jpeg_bytes(smooth_image(h, w, phase=i)) for i, (h, w) in enumerate(SIZES)])
    g = torch.Generator().manual_seed(2)
    boxes = draw_crop_boxes(torch.tensor([img.shape[1:] for img in images]), train, g)
    for size in (64, 200):  # downscale for most, upscale for the smallest crops
        reference = resized_crops_loop(images, boxes, size).int()
        for budget in (1 << 26, 1):  # one chunk; one image per chunk
            diff = (resized_crops(images, boxes, size, canvas_budget=budget).int() - reference).abs()
            # Same filter in a different summation order: at most a one-level rounding flip, rarely.
            assert diff.max() <= 1, (size, budget)
            assert (diff > 0).float().mean() < 1e-3, (size, budget)
    # fp16, as on CUDA: pixel sums keep ~0.1 of a level, so rounding flips a few percent of pixels.
    diff = (resized_crops(images, boxes, 200, compute_dtype=torch.float16).int() - reference).abs()
    assert diff.max() <= 1 and diff.float().mean() < 0.1


def test_decoder_output_matches_loop_and_batched_paths():
    blobs = [jpeg_bytes(smooth_image(h, w, phase=i)) for i, (h, w) in enumerate(SIZES)]
    files = [Path(f"img{i}.jpg") for i in range(len(blobs))]
    outs = [GpuDecoder(files, 48, torch.device("cpu"), False, resize=r)(encoded(blobs)) for r in ("loop", "batched")]
    assert outs[0].shape == (len(blobs), 3, 48, 48) and outs[0].dtype == torch.uint8
    assert (outs[0].int() - outs[1].int()).abs().max() <= 1
    with pytest.raises(ValueError, match="resize"):
        GpuDecoder(files, 48, torch.device("cpu"), False, resize="nearest")


class FlakyDecode:
    """A batched decode that fails, like nvJPEG, for the whole call when any buffer is in `bad`."""

    def __init__(self, bad: set[bytes]) -> None:
        self.bad, self.calls = bad, []

    def __call__(self, buffers, device):
        self.calls.append(len(buffers))
        if any(b.numpy().tobytes() in self.bad for b in buffers):
            raise RuntimeError("Error while decoding JPEG images: Failed to decode batch: 6")
        return nvjpeg_decode(buffers, device)


def test_one_file_the_batch_decode_rejects_is_bisected_out_and_decoded_alone():
    blobs = [jpeg_bytes(smooth_image(40 + i, 50, phase=i)) for i in range(32)]
    files = [Path(f"photos/{i}.jpg") for i in range(32)]
    flaky = FlakyDecode({blobs[13]})
    dec = GpuDecoder(files, 24, torch.device("cpu"), train=False, batch_decode=flaky)
    out = dec(encoded(blobs))
    clean = GpuDecoder(files, 24, torch.device("cpu"), train=False)(encoded(blobs))
    assert torch.equal(out, clean)
    assert dec.cpu_decoded == 1  # only the culprit went to the CPU
    assert sum(flaky.calls[1:]) < 2 * 32 and len(flaky.calls) <= 2 * math.log2(32) + 1
    assert flaky.calls[0] == 32


def test_cmyk_jpeg_and_png_skip_the_batched_call_instead_of_failing_it():
    from torchvision.io import encode_png

    cmyk = pil_jpeg("CMYK", size=(48, 40))
    png = encode_png(smooth_image(30, 30)).numpy().tobytes()
    blobs = [jpeg_bytes(smooth_image(40, 50, phase=i)) for i in range(6)]
    blobs[2:2] = [cmyk]
    blobs.append(png)
    flaky = FlakyDecode({cmyk})  # nvJPEG, as torchvision drives it, refuses CMYK
    dec = GpuDecoder([Path(f"{i}.jpg") for i in range(len(blobs))], 16, torch.device("cpu"), False, batch_decode=flaky)
    out = dec(encoded(blobs))
    assert flaky.calls == [6]  # one batched call, the six plain JPEGs, nothing bisected
    assert dec.cpu_decoded == 2
    images = decoded(blobs)  # libjpeg-turbo on the CPU for all, PIL's inverted CMYK included
    ref = resized_crops_loop(images, draw_crop_boxes(torch.tensor([img.shape[1:] for img in images]), False), 16)
    assert torch.equal(out, ref)


def test_a_corrupt_jpeg_in_a_batch_is_named():
    blobs = [jpeg_bytes(smooth_image(40, 50, phase=i)) for i in range(8)]
    blobs[5] = blobs[5][: len(blobs[5]) // 2]  # header intact, scan cut short: passes the header check
    assert nvjpeg_friendly(blobs[5])
    files = [Path(f"photos/c{i % 2}/{i}.jpg") for i in range(8)]
    with pytest.raises(DataError, match=r"photos/c1/5\.jpg: cannot decode as an image"):
        GpuDecoder(files, 16, torch.device("cpu"), train=True)(encoded(blobs))


def test_workers_read_headers_into_the_batch(tmp_path):
    from torchvision.io import encode_png

    blobs = [jpeg_bytes(smooth_image(20, 30)), pil_jpeg("CMYK"), encode_png(smooth_image(8, 8)).numpy().tobytes()]
    files = []
    for i, b in enumerate(blobs):
        files.append(tmp_path / f"{i}.img")
        files[-1].write_bytes(b)
    ds = EncodedFolderDataset(files, [0, 1, 0], 16)
    batch, labels = collate_encoded([ds[i] for i in range(3)])
    assert batch.nvjpeg_ok.tolist() == [True, False, False] and labels.tolist() == [0, 1, 0]
    assert [d.numpy().tobytes() for d in batch.data] == blobs
    flaky = FlakyDecode(set())
    out = GpuDecoder(files, 16, torch.device("cpu"), True, batch_decode=flaky)(batch)
    assert out.shape == (3, 3, 16, 16) and flaky.calls == [1]


def test_a_batch_crosses_from_a_worker_with_its_bytes_as_the_only_shared_tensor(tmp_path):
    """The per-image fields travel as arrays (pickled by value): each tensor would be a shared-memory
    segment for the main process to map and rebuild, a dozen GIL round trips behind the training thread."""
    import numpy as np
    from torch.utils.data import DataLoader

    blobs = [jpeg_bytes(smooth_image(20 + i, 30, phase=i)) for i in range(4)]
    files = []
    for i, b in enumerate(blobs):
        files.append(tmp_path / f"{i}.jpg")
        files[-1].write_bytes(b)
    ds = EncodedFolderDataset(files, [0, 1, 0, 1], 16)
    loader = DataLoader(ds, batch_size=4, num_workers=1, collate_fn=collate_encoded)
    (batch, labels), *_ = list(loader)
    arrays = (batch.offsets, batch.index, batch.nvjpeg_ok, batch.hw, batch.hardware_ok)
    assert all(isinstance(a, np.ndarray) for a in arrays) and isinstance(batch.flat, torch.Tensor)
    assert batch.hw.tolist() == [[20 + i, 30] for i in range(4)] and batch.index.tolist() == [0, 1, 2, 3]
    assert [d.numpy().tobytes() for d in batch.data] == blobs and labels.tolist() == [0, 1, 0, 1]
    whole = GpuDecoder(files, 16, torch.device("cpu"), False)(batch)
    assert torch.equal(whole, GpuDecoder(files, 16, torch.device("cpu"), False)(encoded(blobs)))


def plain_upsampling_decode(blobs: list[bytes]) -> list[torch.Tensor]:
    """libjpeg-turbo with "fancy" (triangle-filtered) chroma upsampling turned off: each chroma
    sample repeated over its 2x2 pixels, as nvJPEG does. Via nvImageCodec's CPU backend, which
    exposes the switch (torchvision and Pillow do not)."""
    import numpy as np
    from nvidia import nvimgcodec

    dec = nvimgcodec.Decoder(
        device_id=nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY,
        backends=[nvimgcodec.Backend(nvimgcodec.BackendKind.CPU_ONLY)],
        options=":fancy_upsampling=0",
    )
    params = nvimgcodec.DecodeParams(color_spec=nvimgcodec.ColorSpec.SRGB, sample_format=nvimgcodec.I_RGB)
    out = dec.decode([nvimgcodec.CodeStream(b) for b in blobs], params=params)
    return [torch.from_numpy(np.array(img, copy=True)).permute(2, 0, 1) for img in out]


def test_chroma_upsampling_alone_moves_small_smooth_jpegs_by_up_to_20_levels():
    """Why the CUDA decoder differs from the CPU path by more than IDCT rounding (issue 11 item 8):
    the test images are 4:2:0 JPEGs; libjpeg-turbo interpolates chroma, nvJPEG repeats it. On the
    CPU alone, turning libjpeg-turbo's interpolation off moves these pixels by up to ~20 levels,
    most on the 31x29 image, where a chroma sample covers the largest share of the picture."""
    pytest.importorskip("nvidia.nvimgcodec", reason="the nvimgcodec extra is part of the test extra")
    blobs = [jpeg_bytes(smooth_image(h, w, phase=i)) for i, (h, w) in enumerate(SIZES)]
    fancy, plain = decoded(blobs), plain_upsampling_decode(blobs)
    worst = [int((a.int() - b.int()).abs().max()) for a, b in zip(fancy, plain)]
    assert max(worst) > 12 and worst.index(max(worst)) == SIZES.index((31, 29))
    assert max(worst[:2]) <= 4  # the large images: a few levels


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_decoder_matches_the_cpu_path_and_leaves_other_streams_memory_alone():
    pytest.importorskip("nvidia.nvimgcodec", reason="the reference decode (chroma repeated) is nvImageCodec's CPU one")
    dev = torch.device("cuda")
    blobs = [jpeg_bytes(smooth_image(h, w, phase=i)) for i, (h, w) in enumerate(SIZES * 8)]
    blobs.insert(3, pil_jpeg("CMYK", size=(64, 48)))
    files = [Path(f"{i}.jpg") for i in range(len(blobs))]
    gpu = GpuDecoder(files, 64, dev, train=False, resize="batched")
    images, _ = gpu.decode(encoded(blobs))
    # Decoded pixels against libjpeg-turbo decoding the same way (chroma repeated, not
    # interpolated): IDCT and colour-conversion rounding only.
    plain = plain_upsampling_decode([b for k, b in enumerate(blobs) if k != 3])
    for img, ref in zip([im for k, im in enumerate(images) if k != 3], plain):
        assert (img.cpu().int() - ref.int()).abs().max() <= 3
    out = gpu(encoded(blobs))
    ref = GpuDecoder(files, 64, torch.device("cpu"), train=False, resize="loop")(encoded(blobs))
    diff = (out.cpu().int() - ref.int()).abs()
    # Against the CPU path (interpolated chroma): the upsampling difference above, resized.
    assert diff.float().mean() < 1.0 and diff.max() <= 20
    assert gpu.batched_calls == 2 and gpu.cpu_decoded == 2
    # Blocks freed on the current stream while kernels that read them are still queued must not
    # be handed to nvJPEG (torchvision writes its outputs from another stream without waiting;
    # vision PR #9606). The held tensors have the decoded images' byte sizes, so that a decode
    # allocating on the current stream would be handed exactly these blocks.
    shapes = [(3, h, w) for h, w in SIZES]
    buffers = [torch.frombuffer(bytearray(jpeg_bytes(smooth_image(h, w))), dtype=torch.uint8) for h, w in SIZES]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bad = 0
        for _ in range(20):
            held = [torch.full(s, k + 1, dtype=torch.uint8, device=dev) for k, s in enumerate(shapes)]
            torch.cuda.synchronize()
            torch.cuda._sleep(20_000_000)  # keep the stream busy so the sums below stay queued
            sums = [t.sum() for t in held]
            del held
            nvjpeg_decode(buffers, dev)
            torch.cuda.synchronize()
            bad += sum(int(t) != (k + 1) * math.prod(s) for k, (t, s) in enumerate(zip(sums, shapes)))
    assert bad == 0


def test_flat_buffer_resize_reads_hwc_and_chw_layouts_alike_at_any_offsets():
    from cnnpar.data.crop_resize import resized_crops_flat

    images = [smooth_image(h, w, phase=i) for i, (h, w) in enumerate(SIZES)]
    boxes = draw_crop_boxes(torch.tensor([img.shape[1:] for img in images]), True, torch.Generator().manual_seed(3))
    reference = resized_crops(images, boxes, 40)
    # Images interleaved (HWC), out of order, with gaps between them, and no room after the last.
    hw = torch.tensor([img.shape[1:] for img in images])
    parts, starts, pos = [], [], 0
    for k in reversed(range(len(images))):
        gap = torch.full((7 + k,), 255, dtype=torch.uint8)
        parts += [gap, images[k].permute(1, 2, 0).reshape(-1)]
        pos += len(gap)
        starts.append(pos)
        pos += images[k].numel()
    flat = torch.cat(parts)
    starts = torch.tensor(list(reversed(starts)))
    out = resized_crops_flat(flat, starts, hw, boxes, 40, hwc=True)
    assert torch.equal(out, reference)


def jpegs_with_fallbacks() -> tuple[list[bytes], list[Path]]:
    """JPEGs of SIZES with a CMYK JPEG and a PNG at positions 2 and 3: files the GPU decoders leave
    to the CPU's planar decode."""
    from torchvision.io import encode_png

    blobs = [jpeg_bytes(smooth_image(h, w, phase=i)) for i, (h, w) in enumerate(SIZES)]
    blobs[2:2] = [pil_jpeg("CMYK", size=(48, 40)), encode_png(smooth_image(30, 30)).numpy().tobytes()]
    return blobs, [Path(f"{i}.jpg") for i in range(len(blobs))]


def test_nvimgcodec_backend_decodes_only_the_crop_and_matches_the_nvjpeg_path():
    pytest.importorskip("nvidia.nvimgcodec", reason="the nvimgcodec extra is part of the test extra")
    blobs, files = jpegs_with_fallbacks()
    cpu = torch.device("cpu")
    for train in (True, False):
        ref = GpuDecoder(files, 32, cpu, train, seed=5)
        nvi = GpuDecoder(files, 32, cpu, train, seed=5, backend="nvimgcodec")
        nvi.nvimgcodec.regions = True  # off by default (no faster on an H200); correct either way
        images, boxes = nvi.decode(encoded(blobs))
        full, ref_boxes = ref.decode(encoded(blobs))
        for k, (img, box, whole, rbox) in enumerate(zip(images, boxes, full, ref_boxes)):
            top, left, h, w = rbox.tolist()
            if k in (2, 3):  # CMYK and PNG: decoded whole on the CPU by both
                assert torch.equal(img, whole) and torch.equal(box, rbox)
            else:  # only the crop was decoded: libjpeg-turbo's pixels of that region exactly
                assert box.tolist() == [0, 0, h, w]
                assert torch.equal(img, whole[:, top : top + h, left : left + w])
        assert nvi.cpu_decoded == 2
        diff = (nvi(encoded(blobs)).int() - ref(encoded(blobs)).int()).abs()
        assert diff.max() <= 1


def test_batched_resize_takes_interleaved_and_planar_images_in_one_batch():
    """nvImageCodec's images are views of interleaved memory, the CPU's fallbacks (CMYK, PNG)
    planar: the batched resize handles each layout in its own call, into one batch in order."""
    pytest.importorskip("nvidia.nvimgcodec", reason="the nvimgcodec extra is part of the test extra")
    blobs, files = jpegs_with_fallbacks()
    cpu = torch.device("cpu")
    for train in (True, False):
        ref = GpuDecoder(files, 32, cpu, train, seed=5, resize="batched")
        nvi = GpuDecoder(files, 32, cpu, train, seed=5, resize="batched", backend="nvimgcodec")
        d = nvi.decode_stage(encoded(blobs))
        assert d.interleaved == [k not in (2, 3) for k in range(len(blobs))]  # the fallbacks are planar
        diff = (nvi.resize_stage(d).int() - ref(encoded(blobs)).int()).abs()
        assert diff.max() <= 1


def test_nvimgcodec_backend_names_a_corrupt_file():
    pytest.importorskip("nvidia.nvimgcodec", reason="the nvimgcodec extra is part of the test extra")
    blobs = [jpeg_bytes(smooth_image(40, 50, phase=i)) for i in range(4)]
    blobs[1] = b"\xff\xd8\xff\xe0 not a jpeg at all"
    files = [Path(f"photos/{i}.jpg") for i in range(4)]
    with pytest.raises(DataError, match=r"photos/1\.jpg: cannot decode as an image"):
        GpuDecoder(files, 16, torch.device("cpu"), train=True, backend="nvimgcodec")(encoded(blobs))


class FlakyNvImageCodec:
    """nvImageCodec's decode (`NvImageCodecDecode`) raising for the whole call, as a library or CUDA error
    does, when any buffer is in `bad` (every call where `bad` is None); the real one otherwise."""

    def __init__(self, real, bad: set[bytes] | None) -> None:
        self.real, self.bad, self.calls = real, bad, []

    def __getattr__(self, name):  # regions, last_hold, copied: the real decoder's
        return getattr(self.real, name)

    def __call__(self, buffers, boxes, stream=None):
        self.calls.append(len(buffers))
        self.real.last_hold = None  # as the real call leaves it when it raises
        if self.bad is None or any(b.numpy().tobytes() in self.bad for b in buffers):
            raise RuntimeError("nvImageCodec: CUDA error 700 (stand-in)")
        return self.real(buffers, boxes, stream=stream)


def test_an_nvimgcodec_call_that_raises_is_bisected_and_its_files_left_to_the_cpu():
    """The nvJPEG way bisects a batch whose call raises and the engines' falls back; nvImageCodec's call had no
    handling and its error ended the run without naming a file. Now only the culprit goes to the CPU, and
    where every call raises (a library error), the CPU decodes the batch or names the file it cannot."""
    pytest.importorskip("nvidia.nvimgcodec", reason="the nvimgcodec extra is part of the test extra")
    blobs = [jpeg_bytes(smooth_image(40 + i, 50, phase=i)) for i in range(16)]
    files = [Path(f"photos/{i}.jpg") for i in range(16)]
    cpu = torch.device("cpu")
    clean = GpuDecoder(files, 24, cpu, train=False, backend="nvimgcodec")(encoded(blobs))
    dec = GpuDecoder(files, 24, cpu, train=False, backend="nvimgcodec")
    dec.nvimgcodec = flaky = FlakyNvImageCodec(dec.nvimgcodec, {blobs[5]})
    assert torch.equal(dec(encoded(blobs)), clean)
    assert dec.cpu_decoded == 1 and flaky.calls[0] == 16 and len(flaky.calls) <= 2 * math.log2(16) + 1
    dec = GpuDecoder(files, 24, cpu, train=False, backend="nvimgcodec")
    dec.nvimgcodec = FlakyNvImageCodec(dec.nvimgcodec, None)
    reference = GpuDecoder(files, 24, cpu, train=False)(encoded(blobs))  # libjpeg-turbo, as the CPU's fallback
    assert torch.equal(dec(encoded(blobs)), reference) and dec.cpu_decoded == 16
    blobs[3] = b"\xff\xd8\xff\xe0 not a jpeg at all"
    with pytest.raises(DataError, match=r"^photos/3\.jpg: cannot decode as an image"):
        dec(encoded(blobs))


@pytest.mark.parametrize("before", ["first batch", "after a batch"])
def test_an_nvimgcodec_batch_that_parses_no_file_hands_on_no_hold(before):
    """A batch of which nvImageCodec parses no file comes back all None (for the CPU) and keeps no buffer of
    the library's: it handed on the previous batch's hold, or None on the first batch, which the resize's
    `copied(hold, event)` failed on (TypeError) instead of the CPU decoding the batch."""
    pytest.importorskip("nvidia.nvimgcodec", reason="the nvimgcodec extra is part of the test extra")
    unparsable = torch.frombuffer(bytearray(b"\xff\xd8\xff\xe0 not a jpeg at all"), dtype=torch.uint8)
    dec = GpuDecoder([Path("photos/0.jpg")], 16, torch.device("cpu"), train=False, backend="nvimgcodec")
    dec.device = torch.device("cuda")  # the CUDA branch (nothing here reaches a GPU: no file parses)
    if before == "after a batch":
        dec.nvimgcodec.last_hold = ["the previous batch's buffers", None]
    images, owned, hwc, holds = [None], [False], [False], []
    dec._decode_nvimgcodec([unparsable], [0], torch.tensor([[0, 0, 8, 8]]), images, owned, hwc, holds, None)
    assert holds == [] and images == [None] and dec.nvimgcodec.last_hold is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_nvimgcodec_decoder_matches_the_cpu_path():
    pytest.importorskip("nvidia.nvimgcodec", reason="the nvimgcodec extra is part of the test extra")
    dev = torch.device("cuda")
    blobs = [jpeg_bytes(smooth_image(h, w, phase=i)) for i, (h, w) in enumerate(SIZES * 8)]
    blobs.insert(3, pil_jpeg("CMYK", size=(64, 48)))
    files = [Path(f"{i}.jpg") for i in range(len(blobs))]
    for train in (True, False):
        gpu = GpuDecoder(files, 64, dev, train=train, seed=1, backend="nvimgcodec")
        cpu = GpuDecoder(files, 64, torch.device("cpu"), train=train, seed=1, resize="loop")
        diff = (gpu(encoded(blobs)).cpu().int() - cpu(encoded(blobs)).int()).abs()
        print(f"nvimgcodec train={train}: max {int(diff.max())} mean {float(diff.float().mean()):.3f}")
        assert diff.float().mean() < 1.0 and diff.max() <= 20


class RefusingParser:
    """nvImageCodec's module with a CodeStream that refuses every buffer, as its parser refuses a file that our
    header reader sends it (none such is known: this stands in for one)."""

    def __init__(self, real) -> None:
        self.real = real

    def __getattr__(self, name):
        return getattr(self.real, name)

    def CodeStream(self, *args, **kwargs):
        raise RuntimeError("Failed to get image info (stand-in)")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_nvimgcodec_batches_it_cannot_take_go_to_the_cpu(monkeypatch):
    """On the GPU, where nvImageCodec's buffers are held until the resize's copy: a batch of which it parses no
    file (first, and after a batch it decoded) and a call that raises end on the CPU, not in a TypeError or the
    library's error."""
    pytest.importorskip("nvidia.nvimgcodec", reason="the nvimgcodec extra is part of the test extra")
    from cnnpar.data import nvimgcodec_decode

    blobs = [jpeg_bytes(smooth_image(h, w, phase=i)) for i, (h, w) in enumerate(SIZES)]
    files = [Path(f"{i}.jpg") for i in range(len(blobs))]
    ref = GpuDecoder(files, 32, torch.device("cpu"), train=False, resize="loop")(encoded(blobs))
    gpu = GpuDecoder(files, 32, torch.device("cuda"), train=False, backend="nvimgcodec")
    real = nvimgcodec_decode._module()
    outs = []
    for parses in (False, True, False):
        monkeypatch.setattr(nvimgcodec_decode, "_module", (lambda: real) if parses else (lambda: RefusingParser(real)))
        outs.append(gpu(encoded(blobs)).cpu())
    monkeypatch.setattr(nvimgcodec_decode, "_module", lambda: real)  # every file parses; one call raises
    gpu.nvimgcodec = FlakyNvImageCodec(gpu.nvimgcodec, {blobs[2]})
    outs.append(gpu(encoded(blobs)).cpu())
    torch.cuda.synchronize()
    assert gpu.cpu_decoded == 2 * len(blobs) + 1
    for out in outs:
        diff = (out.int() - ref.int()).abs()
        assert diff.float().mean() < 1.0 and diff.max() <= 20


def test_the_resize_default_is_batched_on_cuda_and_the_loop_elsewhere():

    files = [Path("a.jpg")]
    assert DataConfig().gpu_resize == "auto"
    # batched: 3.4x the loop per 256 photos on an H200; the loop: 5-12x the batched path on a CPU
    assert GpuDecoder(files, 8, torch.device("cuda"), True).resize == "batched"  # a device name, no GPU needed
    assert GpuDecoder(files, 8, torch.device("cpu"), True, resize="auto").resize == "loop"
    assert GpuDecoder(files, 8, torch.device("cuda"), True, resize="loop").resize == "loop"


def test_asking_for_nvimgcodec_without_it_installed_names_the_field_and_the_install(monkeypatch):
    from cnnpar.data import nvimgcodec_decode
    from cnnpar.errors import ConfigError

    monkeypatch.setattr(nvimgcodec_decode, "nvimgcodec_available", lambda: False)
    with pytest.raises(ConfigError, match=r"data\.decode: nvimgcodec .*pip install 'cnnpar\[nvimgcodec\]'"):
        GpuDecoder([Path("a.jpg")], 16, torch.device("cpu"), train=True, backend="nvimgcodec")


def test_kernels_that_fail_on_first_use_give_way_to_the_products_once_and_say_so(monkeypatch):
    from cnnpar.data import crop_resize, resize_kernel

    images = decoded([jpeg_bytes(smooth_image(h, w, phase=i)) for i, (h, w) in enumerate(SIZES[:3])])
    boxes = draw_crop_boxes(torch.tensor([img.shape[1:] for img in images]), False)
    products = resized_crops(images, boxes, 32)  # on the CPU "auto" runs the products
    calls = []

    def broken(*a, **k):
        calls.append(1)
        raise RuntimeError("Triton: failed to compile the launcher (no C compiler)")

    monkeypatch.setattr(crop_resize, "_fused", {"proven": False, "failed": ""})
    monkeypatch.setattr(resize_kernel, "fused_resized_crops", broken)
    monkeypatch.setattr(resize_kernel, "fused_available", lambda device: True)
    monkeypatch.setattr(crop_resize, "KERNEL", "fused")  # asked for by name: the error is the caller's
    with pytest.raises(RuntimeError, match="no C compiler"):
        resized_crops(images, boxes, 32)
    monkeypatch.setattr(crop_resize, "KERNEL", "auto")
    monkeypatch.setattr(crop_resize, "uses_fused_kernels", lambda device: not crop_resize._fused["failed"])
    with pytest.warns(UserWarning, match="failed on cpu: RuntimeError.*no C compiler.*matrix products"):
        first = resized_crops(images, boxes, 32)
    assert torch.equal(first, products)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        assert torch.equal(resized_crops(images, boxes, 32), products)
    assert len(calls) == 2  # the named request, then the first automatic use; not again
    monkeypatch.undo()  # the real rule: after a failure "auto" leaves CUDA to the products too
    cuda = torch.device("cuda")
    monkeypatch.setattr(crop_resize, "_fused", {"proven": False, "failed": ""})
    assert crop_resize.uses_fused_kernels(cuda) == crop_resize._triton_importable()
    monkeypatch.setattr(crop_resize, "_fused", {"proven": False, "failed": "RuntimeError('no C compiler')"})
    assert not crop_resize.uses_fused_kernels(cuda)
