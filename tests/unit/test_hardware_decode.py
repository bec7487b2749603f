"""The GPU's JPEG engines as a GpuDecoder backend ("hardware": nvJPEG's hardware backend through
ctypes). On the CPU a stand-in decodes the files the engines would get into the same flat buffer
the library fills; the real library runs in the CUDA-marked test."""

from __future__ import annotations

import contextlib
import io
import threading
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from cnnpar.data.gpu_decode import EncodedBatch, EncodedFolderDataset, GpuDecoder, collate_encoded
from cnnpar.data.jpeg_header import decode_route, hardware_ok, read_jpeg_header
from cnnpar.data.tv_codecs import TV_CODEC_DEPRECATION
from cnnpar.errors import ConfigError

pytestmark = pytest.mark.filterwarnings(f"ignore:{TV_CODEC_DEPRECATION}:DeprecationWarning")


def photo(h: int, w: int, phase: float = 0.0, mode: str = "RGB", **save) -> bytes:
    """A smooth picture as JPEG bytes, saved by Pillow with `save` (subsampling, progressive...)."""
    from PIL import Image

    y, x = np.mgrid[0:h, 0:w] / max(h, w)
    rgb = np.stack(
        [127 + 100 * np.sin(6 * x + 3 * y + phase), 127 + 100 * np.cos(5 * x * y + phase), 60 + 150 * x * y], -1
    )
    img = Image.fromarray(rgb.round().astype(np.uint8)).convert(mode)
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=90, **save)
    return buf.getvalue()


def with_luma_sampling(blob: bytes, factors: int) -> bytes:
    """The same file with its luma sampling factors in the frame header changed (header only)."""
    data = bytearray(blob)
    i = data.index(b"\xff\xc0") + 1  # the marker byte; the first component's factors are 10 bytes on
    data[i + 10] = factors
    return bytes(data)


def encoded(blobs: list[bytes]) -> EncodedBatch:
    data = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]
    offsets = torch.zeros(len(data) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor([len(d) for d in data]), 0)
    return EncodedBatch(torch.cat(data), offsets, torch.arange(len(data)))


def encoded_batches(blobs: list[bytes], size: int) -> list[tuple[EncodedBatch, torch.Tensor]]:
    """(encoded batch, labels) pairs as a DataLoader would yield them, each batch indexed by its files."""
    out = []
    for start in range(0, len(blobs), size):
        batch = encoded(blobs[start : start + size])
        batch.index = torch.arange(start, start + len(batch))
        out.append((batch, torch.arange(len(batch))))
    return out


class StandInEngines:
    """Decodes like HardwareJpegDecoder.decode (same arguments, same flat interleaved output), on
    the CPU with Pillow; refuses every batch when `refuse` is set, as the library refuses a batch."""

    def __init__(self, refuse: bool = False, planar: bool = False) -> None:
        self.refuse, self.calls, self.closed = refuse, [], False
        self.interleaved = not planar  # as HardwareJpegDecoder says which layout it writes

    def close(self) -> None:
        self.closed = True

    def decode(self, flat, offsets, ids, hw, stream, tail=0):
        from PIL import Image

        self.calls.append(list(ids))
        if self.refuse:
            raise RuntimeError("nvjpegDecodeBatched (hardware): status 4 (JPEG not supported)")
        parts, starts, pos = [], [], 0
        for k, (h, w) in zip(ids, hw):
            img = np.asarray(Image.open(io.BytesIO(flat[offsets[k] : offsets[k + 1]].numpy().tobytes())).convert("RGB"))
            assert img.shape == (h, w, 3)  # the sizes the workers read from the headers
            parts.append((img if self.interleaved else img.transpose(2, 0, 1)).reshape(-1))
            starts.append(pos)
            pos += img.size
        out = torch.from_numpy(np.concatenate(parts + [np.zeros(tail, np.uint8)]))
        return out, np.array(starts, dtype=np.int64)


def test_the_header_says_which_files_the_engines_take():
    baseline = photo(40, 60)  # Pillow's default: 4:2:0
    assert hardware_ok(read_jpeg_header(baseline)) and decode_route(read_jpeg_header(baseline), baseline) == 2
    assert read_jpeg_header(baseline).sampling == (0x22, 0x11, 0x11)
    for kind in ("4:4:4", "4:2:2"):
        assert hardware_ok(read_jpeg_header(photo(40, 60, subsampling=kind))), kind
    assert hardware_ok(read_jpeg_header(photo(40, 60, mode="L")))  # grey
    progressive = photo(40, 60, progressive=True)  # nvJPEG on the SMs takes it, the engines do not
    assert not hardware_ok(read_jpeg_header(progressive))
    assert decode_route(read_jpeg_header(progressive), progressive) == 1
    cmyk = photo(40, 60, mode="CMYK")
    assert decode_route(read_jpeg_header(cmyk), cmyk) == 0
    for factors in (0x41, 0x42):  # 4:1:1 and 4:1:0: "not supported" by the hardware backend
        assert not hardware_ok(read_jpeg_header(with_luma_sampling(baseline, factors)))
    assert decode_route(None, b"") == 0


def test_a_file_cut_short_goes_to_the_cpu_which_names_it():
    """The engines (torchvision's nvJPEG call uses them too) decode a truncated file without an error,
    seen on an H200: a file without its end marker after the scan goes to the CPU decoder."""
    whole = photo(40, 60)
    cut = whole[: len(whole) // 2]
    assert hardware_ok(read_jpeg_header(cut))  # its header alone looks fine
    assert decode_route(read_jpeg_header(cut), cut) == 0
    assert decode_route(read_jpeg_header(whole), whole + b"\0" * 1000) == 2  # data after the marker: whole
    # an EXIF thumbnail: a whole JPEG (its own scan and end marker) inside an APP1 segment before the
    # image's scan; cut anywhere after it, the photo must still count as cut
    thumb = photo(16, 24)
    app1 = b"Exif\0\0" + thumb
    sos = whole.index(b"\xff\xda")
    camera = whole[:2] + b"\xff\xe1" + (len(app1) + 2).to_bytes(2, "big") + app1 + whole[2:]
    assert decode_route(read_jpeg_header(camera), camera) == 2
    after_app1 = 2 + 4 + len(app1)
    for cut_at in (after_app1, after_app1 + sos, len(camera) // 2, len(camera) - 100):
        piece = camera[:cut_at]
        assert decode_route(read_jpeg_header(piece), piece) == 0, cut_at


def test_a_file_cut_inside_its_marker_fill_bytes_is_routed_not_raised():
    """The end-marker check walks the segments the header reader walks: a file that ends between
    fill bytes and a segment's length goes to the CPU (which names it) instead of failing the worker."""
    for cut in (b"\xff\xd8" + b"\xff" * 5 + b"\xe1", b"\xff\xd8\xff\xe1\x00", b"\xff\xd8\xff"):
        assert read_jpeg_header(cut) is None
        assert decode_route(read_jpeg_header(cut), cut) == 0


def test_workers_mark_the_engines_files_in_the_batch(tmp_path):
    blobs = [photo(30, 40), photo(30, 40, progressive=True), photo(30, 40, mode="CMYK")]
    files = []
    for i, b in enumerate(blobs):
        files.append(tmp_path / f"{i}.jpg")
        files[-1].write_bytes(b)
    ds = EncodedFolderDataset(files, [0, 1, 0], 16)
    batch, _ = collate_encoded([ds[i] for i in range(3)])
    assert batch.nvjpeg_ok.tolist() == [True, True, False]
    assert batch.hardware_ok.tolist() == [True, False, False]


@pytest.mark.parametrize("resize", ["batched", "loop"])
def test_engines_decode_their_files_and_the_rest_go_the_nvjpeg_way(resize):
    from torchvision.io import encode_png

    blobs = [photo(48 + 3 * i, 64 - 2 * i, phase=i) for i in range(9)]
    blobs[2] = photo(50, 40, progressive=True)
    blobs[5] = photo(40, 52, mode="CMYK")
    blobs[7] = encode_png(torch.zeros(3, 20, 30, dtype=torch.uint8)).numpy().tobytes()
    files = [Path(f"photos/{i}.jpg") for i in range(len(blobs))]
    engines = StandInEngines()
    dec = GpuDecoder(
        files, 24, torch.device("cpu"), True, seed=5, resize=resize, backend="hardware", hardware_decoder=engines
    )
    assert dec.two_stage  # the feeder runs decode and resize in two threads, as for nvJPEG
    out = dec(encoded(blobs))
    assert engines.calls == [[0, 1, 3, 4, 6, 8]]  # one call for every file the engines take
    assert dec.hardware_decoded == 6 and dec.cpu_decoded == 2  # CMYK and PNG; the progressive one: nvJPEG's way
    dec.close()  # the run's end: the engines' handle goes with it
    assert engines.closed
    ref = GpuDecoder(files, 24, torch.device("cpu"), True, seed=5, resize=resize)(encoded(blobs))
    # the same crops from the same pixels (Pillow and libjpeg-turbo agree here): resize rounding only
    assert out.shape == ref.shape == (9, 3, 24, 24)
    assert (out.int() - ref.int()).abs().max() <= 1


def in_thread(name: str, fn, *args):
    """fn(*args) in a new thread called `name`; its result."""
    out = []
    t = threading.Thread(target=lambda: out.append(fn(*args)), name=name)
    t.start()
    t.join()
    return out[0]


def test_each_calling_thread_gets_its_own_engines_handle_and_keeps_it_and_all_close_with_the_decoder():
    """nvjpeg.h: a decode state per thread. The feeder's decode thread is made anew every epoch under
    the same name: it keeps its handle (keyed by name), and every handle is closed with the decoder."""
    files = [Path(f"photos/{i}.jpg") for i in range(12)]
    blobs = [photo(40 + i % 7, 52 - i % 5, phase=i) for i in range(12)]
    (b1, _), (b2, _), (b3, _) = encoded_batches(blobs, 4)
    made: list[StandInEngines] = []

    def factory():
        made.append(StandInEngines())
        return made[-1]

    first = StandInEngines()
    dec = GpuDecoder(
        files, 16, torch.device("cpu"), True, backend="hardware", hardware_decoder=first, hardware_factory=factory
    )
    assert dec(b1).shape == (4, 3, 16, 16)  # this thread: the first handle
    assert in_thread("cnnpar-decode", dec, b2).shape == (4, 3, 16, 16)  # another thread: its own
    assert in_thread("cnnpar-decode", dec, b3).shape == (4, 3, 16, 16)  # the next epoch's thread, same name
    assert len(first.calls) == 1 and len(made) == 1 and len(made[0].calls) == 2
    assert dec.hardware_decoded == 12
    dec.close()
    assert first.closed and made[0].closed


def test_a_thread_without_an_engines_handle_decodes_the_nvjpeg_way_and_is_not_retried_every_batch():
    """A second handle that cannot be made (the library's limit, say) leaves that thread's batches to
    the nvJPEG way, and is not tried again for every batch."""
    files = [Path(f"photos/{i}.jpg") for i in range(12)]
    blobs = [photo(40, 52, phase=i) for i in range(12)]
    (b1, _), (b2, _), (b3, _) = encoded_batches(blobs, 4)
    tries = []

    def failing_factory():
        tries.append(1)
        raise RuntimeError("status 5 (allocator failure)")

    dec = GpuDecoder(  # the first handle is there; no other can be made
        files,
        16,
        torch.device("cpu"),
        True,
        backend="hardware",
        hardware_decoder=StandInEngines(),
        hardware_factory=failing_factory,
    )
    assert dec(b1).shape == (4, 3, 16, 16)
    for batch in (b2, b3):
        assert in_thread("cnnpar-decode", dec, batch).shape == (4, 3, 16, 16)
    assert dec.hardware_decoded == 4 and dec.hardware_refused == 2  # the other thread's two batches
    assert len(tries) == 1  # once for that thread, not once per batch


def test_a_batch_the_engines_refuse_is_decoded_the_nvjpeg_way():
    blobs = [photo(40, 50, phase=i) for i in range(6)]
    files = [Path(f"{i}.jpg") for i in range(6)]
    engines = StandInEngines(refuse=True)
    dec = GpuDecoder(files, 16, torch.device("cpu"), False, backend="hardware", hardware_decoder=engines)
    out = dec(encoded(blobs))
    assert dec.hardware_refused == 1 and dec.hardware_decoded == 0 and dec.batched_calls == 1
    assert torch.equal(out, GpuDecoder(files, 16, torch.device("cpu"), False)(encoded(blobs)))


def test_no_hardware_decoder_is_a_config_error_naming_the_field():
    with pytest.raises(ConfigError, match=r"data\.decode \(--decode\) = 'hardware': .*CUDA device.*--decode gpu"):
        GpuDecoder([Path("a.jpg")], 16, torch.device("cpu"), True, backend="hardware")


def test_the_library_is_found_and_loaded_where_torchvision_bundles_it():
    from cnnpar.data import nvjpeg_hw

    candidates = nvjpeg_hw.library_candidates()
    if not candidates:
        pytest.skip("no libnvjpeg on this machine (torchvision without CUDA)")
    lib = nvjpeg_hw.load_library()
    major, minor, patch = nvjpeg_hw.library_version(lib).split(".")
    assert int(major) >= 11 and minor.isdigit() and patch.isdigit()  # batched hardware decode: CUDA 11+


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_engines_match_the_nvjpeg_path_and_keep_the_batch_order():
    from cnnpar.data.nvjpeg_hw import hardware_decoder_available

    why = hardware_decoder_available(0)
    if why:
        pytest.skip(why)
    dev = torch.device("cuda")
    blobs = [photo(60 + 3 * i, 150 - 2 * i, phase=i, **({"subsampling": "4:4:4"} if i % 3 else {})) for i in range(40)]
    blobs[4] = photo(50, 40, progressive=True)
    blobs[9] = photo(40, 52, mode="CMYK")
    blobs[11] = photo(41, 37, mode="L")
    files = [Path(f"{i}.jpg") for i in range(len(blobs))]
    hw = GpuDecoder(files, 32, dev, train=False, backend="hardware")
    out = hw(encoded(blobs))
    torch.cuda.synchronize()
    assert hw.hardware_refused == 0 and hw.hardware_decoded == 38 and hw.cpu_decoded == 1
    ref = GpuDecoder(files, 32, dev, train=False)(encoded(blobs))
    diff = (out.int() - ref.int()).abs()
    # both decoders are nvJPEG's (engines against SMs): IDCT and colour rounding, resized
    assert diff.float().mean() < 1.0 and diff.max() <= 8, (diff.float().mean(), diff.max())
    for _ in range(3):  # the state initialised once per batch size; repeated batches stay right
        again = hw(encoded(blobs))
    assert torch.equal(again, out)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_engines_never_write_over_memory_the_callers_queued_kernels_still_read():
    """The engines ignore the order of the stream they are given, and the call no longer waits for
    the caller's stream first. (1) A block freed on the caller's stream while a kernel still reads it
    must not become the engines' output; (2) an output the caller's kernels still read must not become
    the next call's output. The caller works on a stream of its own, as cnnpar's stages do (nvJPEG's
    blocking streams would wait for the legacy default stream and hide the race)."""
    from PIL import Image

    from cnnpar.data import nvjpeg_hw

    why = nvjpeg_hw.hardware_decoder_available(0)
    if why:
        pytest.skip(why)
    dev = torch.device("cuda")
    dec = nvjpeg_hw.HardwareJpegDecoder(dev)
    assert isinstance(dec._stream, torch.cuda.ExternalStream)  # a stream of its own, not one of torch's pool
    blobs = [photo(96, 128, phase=i) for i in range(8)]
    batch = encoded(blobs)
    other = encoded([photo(96, 128, phase=3.0 + i) for i in range(8)])  # other pixels, same sizes
    hw = np.array([[96, 128]] * len(blobs))
    need = len(blobs) * 3 * 96 * 128
    ref = torch.from_numpy(np.array(Image.open(io.BytesIO(blobs[0])).convert("RGB"))).int()
    unlike = torch.from_numpy(np.array(Image.open(io.BytesIO(other.flat[: other.offsets[1]].numpy().tobytes()))))
    assert (unlike.int() - ref).abs().float().mean() > 20  # an overwrite would show
    caller = torch.cuda.Stream(dev)
    with torch.cuda.stream(caller):
        for _ in range(3):
            held = torch.full((need,), 7, dtype=torch.uint8, device=dev)
            torch.cuda._sleep(50_000_000)  # ~tens of ms of queued work before the read below
            copy = held.clone()  # queued behind the sleep, reads `held`
            del held  # its block is free for the caller's stream at once
            out, _ = dec.decode(batch.flat, batch.offsets.numpy(), np.arange(len(blobs)), hw, caller)
            torch.cuda._sleep(50_000_000)
            first = out[: 3 * 96 * 128].clone()  # queued behind the sleep, reads `out`
            del out  # freed while the read is queued: held for the caller's stream (record_stream)
            # other photos: written into the block the read above still reads, they would show in `first`
            dec.decode(other.flat, other.offsets.numpy(), np.arange(len(blobs)), hw, caller)
            caller.synchronize()
            assert bool((copy == 7).all()), "the engines wrote into a block a queued kernel was still reading"
            got = first.view(96, 128, 3).cpu().int()
            assert (got - ref).abs().float().mean() < 2.0, "an output was reused while a kernel still read it"
    dec.close()


class LibraryStandIn:
    """Reads nvjpegDecodeBatched's arguments the way libnvjpeg does (pointer arrays, lengths,
    nvjpegImage_t destinations with channel[0] and pitch[0]) and writes Pillow's pixels through them."""

    def __init__(self) -> None:
        self.initialised, self.destroyed, self.calls = [], [], []
        self.files_of = {}  # state -> the file count it was last initialised for

    def nvjpegJpegStateDestroy(self, state):
        self.destroyed.append(state)
        return 0

    def nvjpegDestroy(self, handle):
        self.destroyed.append(handle)
        return 0

    def nvjpegJpegStateCreate(self, handle, state):
        self.made = getattr(self, "made", 0) + 1
        state._obj.value = 1000 + self.made
        return 0

    def nvjpegDecodeBatchedInitialize(self, handle, state, n, threads, fmt):
        self.initialised.append((n, fmt))
        self.files_of[id(state)] = n
        return 0

    def nvjpegDecodeBatched(self, handle, state, data, lengths, destinations, stream):
        import ctypes

        from PIL import Image

        n = self.files_of[id(state)]
        self.calls.append((state, n))
        pointers = (ctypes.c_void_p * n).from_address(data)
        sizes = (ctypes.c_size_t * n).from_address(lengths)

        class Image_t(ctypes.Structure):
            _fields_ = [("channel", ctypes.c_void_p * 4), ("pitch", ctypes.c_size_t * 4)]

        from cnnpar.data.nvjpeg_hw import OUTPUT_RGB, OUTPUT_RGBI

        fmt = self.initialised[-1][1]
        assert fmt in (OUTPUT_RGB, OUTPUT_RGBI)
        dest = (Image_t * n).from_address(destinations)
        for k in range(n):
            blob = ctypes.string_at(pointers[k], sizes[k])
            img = np.ascontiguousarray(np.asarray(Image.open(io.BytesIO(blob)).convert("RGB")))
            h, w, _ = img.shape
            # RGBI: row by row at channel[0]'s pitch; RGB: each plane at its own channel and pitch
            planes = (
                [img.reshape(h, 3 * w)] if fmt == OUTPUT_RGBI else [np.ascontiguousarray(img[..., c]) for c in range(3)]
            )
            for c, plane in enumerate(planes):
                for row in range(h):
                    ctypes.memmove(dest[k].channel[c] + row * dest[k].pitch[c], plane[row].ctypes.data, plane.shape[1])
        return 0


def test_planar_output_is_three_planes_per_image_and_the_library_is_asked_for_planar_rgb():
    from PIL import Image

    from cnnpar.data import nvjpeg_hw

    blobs = [photo(30 + i, 41 - i, phase=i) for i in range(4)]
    batch = encoded(blobs)
    dec = stand_in_decoder(nvjpeg_hw.EngineSettings(planar=True))
    assert not dec.interleaved
    ids = np.array([3, 0, 2])
    hw = np.array([[30 + i, 41 - i] for i in ids])
    stream = types.SimpleNamespace(cuda_stream=0, synchronize=lambda: None)
    out, starts = dec.decode(batch.flat, batch.offsets.numpy(), ids, hw, stream)
    assert dec.lib.initialised == [(3, nvjpeg_hw.OUTPUT_RGB)]
    for j, k in enumerate(ids):
        h, w = hw[j]
        want = torch.from_numpy(np.array(Image.open(io.BytesIO(blobs[k])).convert("RGB"))).permute(2, 0, 1)
        assert torch.equal(out[starts[j] : starts[j] + 3 * h * w].view(3, h, w), want)
    dec._library.shutdown()


@pytest.mark.parametrize("resize", ["batched", "loop"])
def test_the_resize_reads_planar_engine_output_as_it_reads_interleaved(resize):
    blobs = [photo(48 + 3 * i, 64 - 2 * i, phase=i) for i in range(6)]
    blobs[2] = photo(40, 52, mode="CMYK")  # decoded on the CPU: the engines' planes beside another image
    files = [Path(f"photos/{i}.jpg") for i in range(len(blobs))]
    outs = []
    for planar in (False, True):
        engines = StandInEngines(planar=planar)
        dec = GpuDecoder(
            files, 24, torch.device("cpu"), True, seed=5, resize=resize, backend="hardware", hardware_decoder=engines
        )
        outs.append(dec(encoded(blobs)))
        assert dec.hardware_decoded == 5 and dec.cpu_decoded == 1
    assert torch.equal(outs[0], outs[1])


def test_a_batch_cut_into_calls_gives_each_call_a_state_of_its_own_and_the_one_calls_pixels():
    """EngineSettings chunk (issue 11 item 2: the library's per-image host waits): the batch's files go to
    the library in calls of `chunk`, each on a decode state of its own (made as needed, kept for the next
    batches, never two calls of one batch on one: the library hung so on an H200), each state initialised
    for its call's count, and the pixels are the one call's."""
    from cnnpar.data import nvjpeg_hw

    blobs = [photo(30 + i, 41 - i, phase=i) for i in range(5)]
    batch = encoded(blobs)
    ids = np.array([4, 0, 2, 1, 3])
    hw = np.array([[30 + i, 41 - i] for i in ids])
    stream = types.SimpleNamespace(cuda_stream=0, synchronize=lambda: None)
    outs = []
    for settings in (nvjpeg_hw.EngineSettings(), nvjpeg_hw.EngineSettings.parse("chunk=2")):
        dec = stand_in_decoder(settings)
        out, starts = dec.decode(batch.flat, batch.offsets.numpy(), ids, hw, stream)
        outs.append((out, starts, dec.lib.calls))
        if settings.chunk:  # a second batch of 3: two calls, on the states made for the first
            dec.decode(batch.flat, batch.offsets.numpy(), ids[:3], hw[:3], stream)
            made = [dec.state, *dec.more_states]
            assert len(made) == 3 == len({id(m) for m in made}) and dec.lib.calls[3:] == [(made[0], 2), (made[1], 1)]
        dec._library.shutdown()
    (one, one_starts, one_calls), (cut, cut_starts, cut_calls) = outs
    assert one_calls == [("state", 5)]
    made = [dec.state, *dec.more_states]
    assert cut_calls[:3] == [(made[0], 2), (made[1], 2), (made[2], 1)]
    assert np.array_equal(one_starts, cut_starts)
    for j, (h, w) in enumerate(hw.tolist()):  # each image's bytes (the gaps between them are not written)
        image = slice(int(one_starts[j]), int(one_starts[j]) + 3 * h * w)
        assert torch.equal(one[image], cut[image]), j


def test_a_paced_cut_sleeps_between_its_calls_and_not_after_the_last(monkeypatch):
    """EngineSettings pace: the host sleeps between a cut batch's library calls (no wait on the GPU), so a batch of 5
    in calls of 2 sleeps twice; an uncut batch never sleeps."""
    from cnnpar.data import nvjpeg_hw

    blobs = [photo(30 + i, 41 - i, phase=i) for i in range(5)]
    batch = encoded(blobs)
    ids = np.arange(5)
    hw = np.array([[30 + i, 41 - i] for i in ids])
    stream = types.SimpleNamespace(cuda_stream=0, synchronize=lambda: None)
    for spec, sleeps in (("chunk=2+pace=700", [0.0007, 0.0007]), ("pace=700", [])):
        slept = []
        monkeypatch.setattr(nvjpeg_hw.time, "sleep", slept.append)
        dec = stand_in_decoder(nvjpeg_hw.EngineSettings.parse(spec))
        dec.decode(batch.flat, batch.offsets.numpy(), ids, hw, stream)
        dec._library.shutdown()
        assert slept == pytest.approx(sleeps), spec
        assert len(dec.lib.calls) == len(sleeps) + 1


@pytest.mark.parametrize(
    "spec, backend, flags, interleaved",
    [
        ("", 3, 0, True),
        ("bits=device+pools=1", 5, 2, True),
        ("out=rgb", 3, 0, False),
        ("pipe=0+pools=1", 3, 3, True),
        ("on=sms", 2, 0, True),
        ("chunk=14", 3, 0, True),
        ("chunk=7+prio=-5", 3, 0, True),
        ("chunk=14+pace=800", 3, 0, True),
    ],
)
def test_engine_settings_choose_how_the_library_is_started(monkeypatch, spec, backend, flags, interleaved):
    from cnnpar.data import nvjpeg_hw

    lib = FakeLibrary()
    fake_cuda(monkeypatch, lib)
    settings = nvjpeg_hw.EngineSettings.parse(spec)
    assert nvjpeg_hw.EngineSettings.parse(settings.label) == settings
    dec = nvjpeg_hw.HardwareJpegDecoder(torch.device("cuda", 0), settings)
    assert lib.created == (backend, flags) and dec.interleaved is interleaved
    dec.close()
    monkeypatch.setattr(nvjpeg_hw, "SETTINGS", settings)  # what a decoder made without settings uses
    assert nvjpeg_hw.HardwareJpegDecoder(torch.device("cuda", 0)).settings == settings


@pytest.mark.parametrize("spec", ["bits=gpu", "out=yuv", "pool=1", "bits"])
def test_engine_settings_refuse_what_they_do_not_know_naming_what_is_expected(spec):
    from cnnpar.data.nvjpeg_hw import EngineSettings

    with pytest.raises(
        ValueError, match=r"expected one of bits=host\|device, out=rgbi\|rgb, pools=0\|1, pipe=1\|0, on=engines\|sms"
    ):
        EngineSettings.parse(spec)
    with pytest.raises(ValueError, match="'pools' given twice"):  # which would win is not for the reader to guess
        EngineSettings.parse("pools=0+pools=1")
    with pytest.raises(ValueError, match="chunk=<files a call>"):
        EngineSettings.parse("chunk=-1")
    for prio in ("high", "--5", "-"):
        with pytest.raises(ValueError, match="prio=<stream priority>"):
            EngineSettings.parse(f"prio={prio}")


def test_the_engines_stream_is_made_with_the_settings_priority(monkeypatch):
    from cnnpar.data import nvjpeg_hw

    fake_cuda(monkeypatch, FakeLibrary())
    asked = []
    stream = types.SimpleNamespace(cuda_stream=0, synchronize=lambda: None)
    monkeypatch.setattr(nvjpeg_hw, "private_stream", lambda device, priority=0: asked.append(priority) or stream)
    for spec in ("", "prio=-5"):
        nvjpeg_hw.HardwareJpegDecoder(torch.device("cuda", 0), nvjpeg_hw.EngineSettings.parse(spec)).close()
    assert asked == [0, -5]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "spec",
    [
        "bits=device",
        "out=rgb",
        "pools=1",
        "pipe=0",
        "on=sms",
        "bits=device+out=rgb+pools=1",
        "chunk=5",
        "chunk=7",
        "chunk=7+prio=-5",
    ],
)
def test_cuda_engine_settings_decode_the_default_settings_pixels(spec):
    """Each way of driving the engines (benchmarks/jpeg_decode.py --hw-variants) must give the same
    pixels as the default one, from a host batch as the workers hand it over (the SMs' decoder: within
    its rounding)."""
    from cnnpar.data import nvjpeg_hw

    why = nvjpeg_hw.hardware_decoder_available(0)
    if why:
        pytest.skip(why)
    dev = torch.device("cuda", 0)
    blobs = [photo(60 + 3 * i, 90 - 2 * i, phase=i, **({"subsampling": "4:4:4"} if i % 2 else {})) for i in range(12)]
    batch = encoded(blobs)
    ids = np.arange(len(blobs))
    hw = np.array([[60 + 3 * i, 90 - 2 * i] for i in ids])
    stream = torch.cuda.current_stream(dev)
    results = []
    for settings in (nvjpeg_hw.EngineSettings(), nvjpeg_hw.EngineSettings.parse(spec)):
        dec = nvjpeg_hw.HardwareJpegDecoder(dev, settings)
        out, starts = dec.decode(batch.flat, batch.offsets.numpy(), ids, hw, stream)
        images = []
        for j, (h, w) in enumerate(hw.tolist()):
            pixels = out[starts[j] : starts[j] + 3 * h * w]
            images.append(pixels.view(h, w, 3).permute(2, 0, 1) if dec.interleaved else pixels.view(3, h, w))
        results.append([img.cpu() for img in images])
        dec.close()
    for base, other in zip(*results):
        if "on=sms" in spec:  # the SMs' decoder: another IDCT and colour conversion than the engines'
            diff = (base.int() - other.int()).abs()
            assert diff.float().mean() < 1.0 and diff.max() <= 8, (diff.float().mean(), diff.max())
        else:  # the same engines driven another way: the same pixels
            assert torch.equal(base, other)


def test_the_library_call_gets_pointers_lengths_and_destinations_laid_out_as_nvjpeg_h_says(monkeypatch):
    from cnnpar.data import nvjpeg_hw

    blobs = [photo(30 + i, 41 - i, phase=i) for i in range(5)]
    batch = encoded(blobs)
    dec = stand_in_decoder()  # no GPU here: the library's side is a stand-in
    callers = []
    real = dec._decode_batched
    monkeypatch.setattr(dec, "_decode_batched", lambda *a: callers.append(threading.get_ident()) or real(*a))
    order = []
    stream = types.SimpleNamespace(cuda_stream=0, synchronize=lambda: order.append("caller's stream waited for"))
    dec._stream = types.SimpleNamespace(cuda_stream=77, synchronize=lambda: order.append("synchronize"))
    library_call = dec.lib.nvjpegDecodeBatched
    given_streams = []

    def call(*a):
        order.append("decode")
        given_streams.append(a[-1].value)
        return library_call(*a)

    dec.lib.nvjpegDecodeBatched = call
    ids = np.array([4, 1, 3])
    hw = np.array([[30 + i, 41 - i] for i in ids])
    out, starts = dec.decode(batch.flat, batch.offsets.numpy(), ids, hw, stream, tail=64)
    assert dec.lib.initialised == [(3, nvjpeg_hw.OUTPUT_RGBI)]
    # one wait on the GPU per batch (issue 11.2): the call's end on the decoder's own stream, before the
    # inputs may go; none before it (the output's block comes from that stream's pool, see `decode`), and
    # none on the caller's stream
    assert order == ["decode", "synchronize"]
    assert given_streams == [dec._stream.cuda_stream]  # the engines ran on the decoder's own stream
    assert (starts % nvjpeg_hw.ALIGN == 0).all() and out.numel() >= starts[-1] + 3 * hw[-1].prod() + 64
    from PIL import Image

    for j, k in enumerate(ids):
        h, w = hw[j]
        got = out[starts[j] : starts[j] + 3 * h * w].view(h, w, 3)
        assert torch.equal(got, torch.from_numpy(np.array(Image.open(io.BytesIO(blobs[k])).convert("RGB"))))
    other = threading.Thread(target=dec.decode, args=(batch.flat, batch.offsets.numpy(), ids, hw, stream))
    other.start()
    other.join()
    assert len(dec.lib.initialised) == 1  # the same batch size: no second initialisation
    # every library call ran on the decoder's own thread, whichever thread asked for it
    assert len(callers) == 2 and len(set(callers)) == 1 and callers[0] != threading.get_ident()
    dec._library.shutdown()


def test_the_engines_stream_is_made_for_them_with_the_cuda_runtime_not_drawn_from_torchs_pool(monkeypatch):
    # torch.cuda.Stream() hands out a fixed pool's streams in turn, which other stages also get
    from cnnpar.data import private_stream as streams

    made = []

    class Runtime:
        def cudaStreamCreateWithPriority(self, handle, flags, priority):
            made.append((flags, priority))
            handle._obj.value = 4242
            return 0

    monkeypatch.setattr(streams, "_cuda_runtime", lambda: Runtime())
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "ExternalStream", lambda ptr, device=None: ("external", ptr, device))
    monkeypatch.setattr(torch.cuda, "Stream", lambda *a, **k: pytest.fail("a pool stream was drawn"))
    assert streams.private_stream(torch.device("cuda", 0)) == ("external", 4242, torch.device("cuda", 0))
    assert made == [(1, 0)]  # cudaStreamNonBlocking: it does not wait for the legacy default stream
    monkeypatch.setattr(streams, "_cuda_runtime", lambda: None)  # no runtime found by its soname
    assert streams.private_stream(torch.device("cuda", 0)) is None  # the caller then waits before the call


def test_without_a_stream_of_its_own_the_call_waits_for_the_callers_stream_before_and_after():
    blobs = [photo(30, 40)]
    batch = encoded(blobs)
    dec = stand_in_decoder()
    dec._stream = None  # private_stream could not make one (no CUDA runtime found by its soname)
    order, given = [], []
    stream = types.SimpleNamespace(cuda_stream=5, synchronize=lambda: order.append("caller's stream"))
    library_call = dec.lib.nvjpegDecodeBatched

    def call(*a):
        order.append("decode")
        given.append(a[-1].value)
        return library_call(*a)

    dec.lib.nvjpegDecodeBatched = call
    dec.decode(batch.flat, batch.offsets.numpy(), np.array([0]), np.array([[30, 40]]), stream)
    # the engines would not wait for the caller's queued work (torchcodec PR #1634): waited for first
    assert order == ["caller's stream", "decode", "caller's stream"] and given == [5]
    dec._library.shutdown()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_engines_name_a_truncated_file_as_the_other_paths_do():
    """Issue 11 item 7 on the engines' path: a file cut short passes the header check; the batch must
    still end in the one-line error naming it, not in pixels made up (the engines decode it silently:
    the end-marker check sends it to the CPU)."""
    from cnnpar.data.nvjpeg_hw import hardware_decoder_available
    from cnnpar.errors import DataError

    why = hardware_decoder_available(0)
    if why:
        pytest.skip(why)
    blobs = [photo(60, 80, phase=i) for i in range(8)]
    blobs[5] = blobs[5][: len(blobs[5]) // 2]
    assert hardware_ok(read_jpeg_header(blobs[5]))
    files = [Path(f"photos/c{i % 2}/{i}.jpg") for i in range(8)]
    with pytest.raises(DataError, match=r"photos/c1/5\.jpg"):
        GpuDecoder(files, 16, torch.device("cuda"), train=True, backend="hardware")(encoded(blobs))


def stand_in_decoder(settings=None):
    """A HardwareJpegDecoder whose library is LibraryStandIn (no GPU here), with its own thread."""
    from cnnpar.data import nvjpeg_hw

    dec = object.__new__(nvjpeg_hw.HardwareJpegDecoder)
    dec.settings = settings or nvjpeg_hw.EngineSettings()
    dec.interleaved = not dec.settings.planar
    dec.lib, dec.handle, dec.state, dec.device = LibraryStandIn(), "handle", "state", torch.device("cpu")
    dec._batch, dec.calls, dec.more_states = {}, 0, []
    dec._stream = types.SimpleNamespace(cuda_stream=0, synchronize=lambda: None)
    dec._library = nvjpeg_hw.LibraryThread("test-nvjpeg")
    dec._library_thread = dec._library.ident
    assert dec._library.submit(threading.get_ident).result(timeout=10) == dec._library_thread
    return dec


class FakeLibrary:
    """libnvjpeg's handle and state calls as HardwareJpegDecoder.__init__ and close make them, recording
    the thread each destroy runs on; `create_status` != 0 answers as a GPU without JPEG engines does."""

    def __init__(self, create_status: int = 0) -> None:
        self.create_status, self.destroyed = create_status, []

    def nvjpegCreateEx(self, backend, dev_alloc, pinned_alloc, flags, handle):
        self.created = (backend, flags)
        if self.create_status == 0:
            handle._obj.value = 11
        return self.create_status

    def nvjpegJpegStateCreate(self, handle, state):
        state._obj.value = 22
        return 0

    def nvjpegJpegStateDestroy(self, state):
        self.destroyed.append(("state", threading.get_ident()))

    def nvjpegDestroy(self, handle):
        self.destroyed.append(("handle", threading.get_ident()))


def fake_cuda(monkeypatch, lib: FakeLibrary) -> None:
    """HardwareJpegDecoder(torch.device("cuda", 0)) made with `lib` on this machine without a GPU."""
    from cnnpar.data import nvjpeg_hw

    monkeypatch.setattr(nvjpeg_hw, "load_library", lambda: lib)
    monkeypatch.setattr(nvjpeg_hw, "library_version", lambda lib: "13.0.0")
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a GPU without JPEG engines")
    stream = types.SimpleNamespace(cuda_stream=0, synchronize=lambda: None)
    monkeypatch.setattr(nvjpeg_hw, "private_stream", lambda device, priority=0: stream)


def library_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "cnnpar-nvjpeg"]


def test_a_decoder_in_a_reference_cycle_is_closed_by_the_collector_without_waiting_for_ever(monkeypatch):
    """On an H200 a benchmark hung in a compile whose garbage collection reached a decoder in a
    reference cycle: the collector had already ended its executor's thread (a weak-reference callback,
    run before any __del__), and the close waited on a queue no thread served. The library's thread
    must outlive the collection, and the handles be freed on it."""
    import gc

    from cnnpar.data import nvjpeg_hw

    lib = FakeLibrary()
    fake_cuda(monkeypatch, lib)
    before = set(library_threads())
    dec = nvjpeg_hw.HardwareJpegDecoder(torch.device("cuda", 0))
    (thread,) = set(library_threads()) - before
    library_thread = dec._library_thread
    holder = types.SimpleNamespace(decoder=dec)
    holder.me = holder  # the cycle: only the collector frees the decoder
    dec.holder = holder
    del dec, holder
    finished = threading.Event()
    collector = threading.Thread(target=lambda: (gc.collect(), finished.set()), daemon=True)
    collector.start()
    assert finished.wait(15), "the collection hung closing the decoder"
    assert lib.destroyed == [("state", library_thread), ("handle", library_thread)]  # on the library's thread
    thread.join(10)
    assert not thread.is_alive()  # and the thread ended after the close


def test_a_gpu_without_engines_is_answered_at_once_and_leaves_no_thread_behind(monkeypatch):
    """The decode rule asks every GPU run from photos whether the engines start: on a GPU without them
    the answer must come at once (a half-made decoder once waited 10 s in its finalizer for a thread
    that had already ended) and name the status."""
    import time

    from cnnpar.data import nvjpeg_hw

    fake_cuda(monkeypatch, FakeLibrary(create_status=7))
    before = set(library_threads())
    t0 = time.perf_counter()
    why = nvjpeg_hw.hardware_decoder_available.__wrapped__(0)  # (uncached)
    assert time.perf_counter() - t0 < 2
    assert "status 7 (architecture mismatch" in why and "a GPU without JPEG engines" in why
    for t in set(library_threads()) - before:
        t.join(5)
        assert not t.is_alive()


def test_a_library_thread_refuses_calls_once_shut_down_instead_of_queueing_them_for_ever():
    from cnnpar.data.nvjpeg_hw import LibraryThread

    library = LibraryThread("cnnpar-nvjpeg")
    assert library.submit(lambda a, b: a + b, 2, 3).result(5) == 5
    library.shutdown()
    with pytest.raises(RuntimeError, match="closed"):  # GpuDecoder then decodes the nvJPEG way
        library.submit(lambda: None)
    library.shutdown()  # again: nothing more


def test_a_decoder_made_by_gpu_decoder_is_not_held_in_a_cycle_by_its_factory():
    """GpuDecoder's engines factory must not close over the decoder: the handles then go with the
    last reference, not whenever the cycle collector runs."""
    import gc
    import weakref

    dec = GpuDecoder(
        [Path("a.jpg")], 8, torch.device("cpu"), train=True, backend="hardware", hardware_decoder=stand_in_decoder()
    )
    gone = weakref.ref(dec)
    gc.disable()
    try:
        del dec
        assert gone() is None
    finally:
        gc.enable()


def test_closing_the_engines_frees_them_once_from_any_thread_and_later_decodes_are_refused():
    blobs = [photo(30, 40)]
    batch, stream = encoded(blobs), types.SimpleNamespace(cuda_stream=0, synchronize=lambda: None)
    args = (batch.flat, batch.offsets.numpy(), np.array([0]), np.array([[30, 40]]), stream)
    dec = stand_in_decoder()
    library = dec._library
    library.submit(dec.close).result(timeout=10)  # from the library's own thread: no wait on itself
    assert dec.lib.destroyed == ["state", "handle"]
    with pytest.raises(RuntimeError, match="closed"):  # GpuDecoder then decodes the nvJPEG way
        dec.decode(*args)
    dec.close()  # again: nothing left to free
    assert dec.lib.destroyed == ["state", "handle"]
    other = stand_in_decoder()
    other.close()  # from another thread: the library's thread frees them, then ends
    assert other.lib.destroyed == ["state", "handle"]
    with pytest.raises(RuntimeError, match="closed"):
        other._decode_batched(1, None, None, None, stream)  # a call that was queued behind the close
