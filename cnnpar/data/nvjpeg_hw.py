"""nvJPEG's hardware backend, called through ctypes: a batch of baseline JPEGs decoded on the GPU's
JPEG engines (A100, H100, H200 and others have them) in one library call, with the GIL released
for that call and the decoded pixels written into one flat device buffer.

Why beside the two decoders cnnpar had (measured on an H200, docs/decoding.md):
- torchvision's `decode_jpeg(list, device="cuda")` drives the same hardware backend for baseline
  files, but per image on the host (a header parse, a support query and an output tensor each),
  under a global mutex, on its own stream with a synchronisation before and after: 12,951-13,388
  img/s for 256 photos where this module's one call decodes 16,688-17,322;
- nvImageCodec reaches the same engines, but its Python API takes the GIL back several times per
  image, and the training thread holds it most of the time: 38 ms for a batch alone, 10,530 ms beside
  a busy Python thread. From spawned worker processes it needs a CUDA context each, and the GPU
  time-slices between contexts (3,915 img/s end to end).
Here the main process does a handful of calls per batch whatever its size (one allocation, one
decode call), and the engines' outputs land in the training process's own context, on a stream of
the decoder's own that is waited for once per batch, so the crop and resize that follow are ordinary
kernels of the caller's stream.

Which files the engines take is decided in the worker processes from each JPEG's header
(`jpeg_header.hardware_ok`); the rest go the slower ways. libnvjpeg comes from torchvision's wheel
(it bundles one for its own decoder), a `nvidia-nvjpeg` wheel, or the system, in that order.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import glob
import os
import queue
import re
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from functools import cache, lru_cache

import numpy as np
import torch

from cnnpar.data.private_stream import private_stream

BACKEND_GPU_HYBRID = 2  # nvjpegBackend_t: Huffman decoding on the SMs for batches over 50 baseline files
BACKEND_HARDWARE = 3
BACKEND_GPU_HYBRID_DEVICE = 4  # the SMs' backend, the encoded bytes read from device memory
BACKEND_HARDWARE_DEVICE = 5  # the same engines, the encoded bytes read from device memory
OUTPUT_RGB = 3  # nvjpegOutputFormat_t: planar RGB, channel[0..2]
OUTPUT_RGBI = 5  # interleaved RGB, written to channel[0] only
FLAG_HW_DECODE_NO_PIPELINE = 1  # NVJPEG_FLAGS_HW_DECODE_NO_PIPELINE: the engines' work not pipelined per image
FLAG_MEMORY_POOLS = 1 << 1  # NVJPEG_FLAGS_ENABLE_MEMORY_POOLS: the library keeps its buffers for reuse
MAX_COMPONENT = 4
ALIGN = 256
STATUS = {
    0: "success",
    1: "not initialized",
    2: "invalid parameter",
    3: "bad JPEG",
    4: "JPEG not supported",
    5: "allocator failure",
    6: "execution failed",
    7: "architecture mismatch (no hardware JPEG decoder on this GPU)",
    8: "internal error",
    9: "implementation not supported",
    10: "incomplete bitstream",
}


@dataclass(frozen=True)
class EngineSettings:
    """How the engines are driven. Each choice is a way to cut what the library waits for inside its
    call (call P's trace, session 8: per image, a colour-conversion kernel, a copy from pageable memory
    and a host wait on an event); benchmarks/jpeg_decode.py's `--hw-variants` times them and counts
    the library's host waits per batch, jpeg_pipeline.py's `hw=` key runs them end to end.
    - bitstreams "device": the batch's encoded bytes go to the GPU in one copy and the library reads
      them there (backend HARDWARE_DEVICE), instead of copying each file from host memory itself;
    - planar: planar RGB out (three planes per image) instead of interleaved; the resize reads either;
    - pools: NVJPEG_FLAGS_ENABLE_MEMORY_POOLS (buffers kept for reuse rather than freed and made again);
    - pipelined False: NVJPEG_FLAGS_HW_DECODE_NO_PIPELINE;
    - sms: the same batched call on backend GPU_HYBRID (Huffman and all on the SMs, not the engines), for
      its waits per batch.
    Measured on an H200 (session 19, benchmarks/results/2026-12-01-h200/call-zzy): with the defaults a batch
    of 256 photos costs 242 host waits on events, 256 copies and 256 kernels inside the library's call;
    device bitstreams added copies and waits (582 and 569) and ran 20 % slower; planar output and the pools
    changed none of the counts."""

    bitstreams: str = "host"
    planar: bool = False
    pools: bool = False
    pipelined: bool = True
    sms: bool = False
    # A batch cut into library calls of `chunk` files (0: one call for the batch), each call on a decode
    # state of its own, all queued on the engines' stream and waited for once, after the last. The library
    # keeps two images in flight per engine on a state and synchronises the host on the image that many
    # places back before it reuses a slot (242 waits for 256 files on an H200's 7 engines); a call of at
    # most that many files on a fresh state has no slot to wait for, and the engines' stream waits on the
    # GPU instead: calls of 7 or 14 files had no library host waits and decoded 15,837-16,719 img/s alone
    # (call ZZZN, session 22), but trained ResNet-50 at 5,212-5,479 img/s end to end against the defaults'
    # 6,651-6,838 (data wait 24-27 % against 2 %; calls ZZZO, ZZZP), so it is not the default. A state is
    # never given two calls of one batch: reused before the batch's one wait, the library hung (call ZZZM).
    chunk: int = 0
    # The CUDA priority of the engines' stream (0 torch's default; lower is higher, CUDA clamps to the
    # device's range). Measured for the cut calls above and changed nothing end to end (call ZZZR, session
    # 23): the library queues each image's copy and colour kernel on streams of its own, not on this one, a
    # stream per image with the cut (256 a batch of 256, against 14 with the defaults).
    priority: int = 0
    # Microseconds the library's thread sleeps between the calls of a cut batch (0: none). Why (session 27's guess,
    # from call ZZZY's trace): the defaults' per-image host waits also pace the library's submissions, and the
    # training thread's launches slip in between them (0.011 ms a launch); the cut submits a batch's 256 images in
    # one burst, and the training thread's launches took 0.87 ms each beside it. A host sleep is no wait on the GPU:
    # the cut keeps its one wait a batch. Measured (call ZZZZC): slower, not faster: 4,703 img/s end to end paced
    # 800 us, 5,367 unpaced, 6,702 the defaults; alone the sleeps add to a batch almost one for one (the library's
    # host-side submission sets the cut's pace). A measuring setting only.
    pace_us: int = 0

    def __post_init__(self) -> None:
        if self.bitstreams not in ("host", "device"):
            raise ValueError(f"bitstreams={self.bitstreams!r}: expected 'host' or 'device'")
        if self.chunk < 0:
            raise ValueError(f"chunk={self.chunk}: expected 0 (one call a batch) or more files a call")

    @classmethod
    def parse(cls, spec: str) -> EngineSettings:
        """'bits=device+out=rgb+pools=1' (any subset, '+'-separated; '' the defaults) -> settings."""
        known = {
            "bits": ("host", "device"),
            "out": ("rgbi", "rgb"),
            "pools": ("0", "1"),
            "pipe": ("1", "0"),
            "on": ("engines", "sms"),
        }
        counts = ("chunk", "pace")  # whole numbers
        signed = ("prio",)  # whole numbers, negative too
        got = {}
        for part in filter(None, spec.split("+")):
            key, _, value = part.partition("=")
            if key in got:
                raise ValueError(f"engine setting {key!r} given twice in {spec!r}: expected each key once")
            whole = (key in counts and value.isdigit()) or (key in signed and re.fullmatch(r"-?\d+", value))
            if value not in known.get(key, ()) and not whole:
                raise ValueError(
                    f"engine setting {part!r}: expected one of "
                    + ", ".join(f"{k}={'|'.join(v)}" for k, v in known.items())
                    + ", chunk=<files a call>, prio=<stream priority>, pace=<microseconds between calls>"
                )
            got[key] = value
        return cls(
            got.get("bits", "host"),
            got.get("out", "rgbi") == "rgb",
            got.get("pools", "0") == "1",
            got.get("pipe", "1") == "1",
            got.get("on", "engines") == "sms",
            int(got.get("chunk", 0)),
            int(got.get("prio", 0)),
            int(got.get("pace", 0)),
        )

    @property
    def label(self) -> str:
        out = "rgb" if self.planar else "rgbi"
        on = "sms" if self.sms else "engines"
        label = f"bits={self.bitstreams}+out={out}+pools={int(self.pools)}+pipe={int(self.pipelined)}+on={on}"
        # only where set: the rows stored before chunk and prio existed keep their labels
        label += f"+chunk={self.chunk}" if self.chunk else ""
        label += f"+prio={self.priority}" if self.priority else ""
        return label + (f"+pace={self.pace_us}" if self.pace_us else "")


SETTINGS = EngineSettings()  # what a decoder made without settings uses; the benchmarks set it


class HardwareDecoderUnavailable(RuntimeError):
    """No libnvjpeg could be loaded, or this GPU has no JPEG engines for it."""


def library_candidates() -> list[str]:
    """Where libnvjpeg may be, in the order tried: torchvision's own copy (built for the CUDA that
    torch uses), the nvidia-nvjpeg wheels, then the system's loader path."""
    found = []
    try:
        import torchvision

        site = os.path.dirname(os.path.dirname(torchvision.__file__))
        found += sorted(glob.glob(os.path.join(site, "torchvision.libs", "libnvjpeg*.so*")))
    except ImportError:
        pass
    for entry in sys.path:  # nvidia-nvjpeg (CUDA 13: nvidia/cu13/lib; CUDA 12: nvidia/nvjpeg/lib)
        found += sorted(glob.glob(os.path.join(entry or ".", "nvidia", "*", "lib", "libnvjpeg.so*")))
    system = ctypes.util.find_library("nvjpeg")
    return list(dict.fromkeys(found + ([system] if system else [])))


@lru_cache(maxsize=1)
def load_library() -> ctypes.CDLL:
    tried = []
    for path in library_candidates():
        try:
            lib = ctypes.CDLL(path)  # CDLL, not PyDLL: each call runs with the GIL released
        except OSError as e:
            tried.append(f"{path}: {e}")
            continue
        _declare(lib)
        lib.path = path
        return lib
    raise HardwareDecoderUnavailable(
        "no libnvjpeg found (torchvision bundles one on Linux; or pip install nvidia-nvjpeg)"
        + (f"; tried: {'; '.join(tried)}" if tried else "")
    )


def _declare(lib: ctypes.CDLL) -> None:
    p, i, u = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint
    signatures = {
        "nvjpegCreateEx": [i, p, p, u, ctypes.POINTER(p)],
        "nvjpegJpegStateCreate": [p, ctypes.POINTER(p)],
        "nvjpegJpegStateDestroy": [p],
        "nvjpegDestroy": [p],
        "nvjpegDecodeBatchedInitialize": [p, p, i, i, i],
        "nvjpegDecodeBatched": [p, p, p, p, p, p],
        "nvjpegGetProperty": [i, ctypes.POINTER(i)],
    }
    for name, args in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, ctypes.c_int


def library_version(lib: ctypes.CDLL) -> str:
    parts = []
    for prop in range(3):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
        v = ctypes.c_int()
        lib.nvjpegGetProperty(prop, ctypes.byref(v))
        parts.append(str(v.value))
    return ".".join(parts)


def engine_info(lib, handle) -> tuple[int, int] | None:
    """(engines, cores per engine) as nvjpegGetHardwareDecoderInfo tells them (nvJPEG 11.9 and later; the
    count nvImageCodec sizes its calls by), or None where the library has no such call or refuses it."""
    fn = getattr(lib, "nvjpegGetHardwareDecoderInfo", None)
    if fn is None:
        return None
    if isinstance(lib, ctypes.CDLL):
        fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_uint)]
        fn.restype = ctypes.c_int
    engines, cores = ctypes.c_uint(), ctypes.c_uint()
    if fn(handle, ctypes.byref(engines), ctypes.byref(cores)) != 0:
        return None
    return engines.value, cores.value


def _check(status: int, call: str) -> None:
    if status != 0:
        raise RuntimeError(f"{call}: nvJPEG status {status} ({STATUS.get(status, 'unknown')})")


class LibraryThread:
    """One long-lived daemon thread that runs the calls handed to it, in order (`submit` -> Future).

    Not a ThreadPoolExecutor: an executor's worker leaves when the executor object becomes garbage
    (a weak-reference callback), and the garbage collector runs those callbacks before any `__del__`.
    A decoder caught in a reference cycle with its executor therefore closed itself into a queue no
    thread served, and waited for ever: on an H200 a benchmark hung inside a compile whose garbage
    collection reached such a decoder (benchmarks/results/2026-12-01-h200/call-s/). This thread's loop
    holds only its queue, so it serves until `shutdown`; as a daemon it never holds up the process's
    exit."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()  # a call queued is queued before the end marker, or refused
        self._stopped = False
        self._thread = threading.Thread(target=_serve, args=(self._jobs,), name=name, daemon=True)
        self._thread.start()
        self.ident = self._thread.ident

    def submit(self, fn, *args) -> Future:
        """Queue fn(*args); RuntimeError once `shutdown` was called (no thread would ever run it)."""
        done: Future = Future()
        with self._lock:
            if self._stopped:
                raise RuntimeError("the hardware JPEG decoder is closed")
            self._jobs.put((done, fn, args))
        return done

    def shutdown(self, wait: bool = True) -> None:
        """The thread ends after the calls already queued; `wait`: until it has."""
        with self._lock:
            if not self._stopped:
                self._stopped = True
                self._jobs.put(None)
        if wait and threading.get_ident() != self.ident:
            self._thread.join()


def _serve(jobs: queue.SimpleQueue) -> None:
    while (job := jobs.get()) is not None:
        done, fn, args = job
        if not done.set_running_or_notify_cancel():
            continue
        try:
            done.set_result(fn(*args))
        except BaseException as e:  # handed to the caller, who raises it
            done.set_exception(e)
        del job, done, fn, args  # nothing of the caller's kept alive between calls


class HardwareJpegDecoder:
    """One nvJPEG handle on the hardware backend and one decode state, used from one thread of their
    own for their whole life.

    Why a thread of their own (for every call that touches the handle or the state): nvjpeg.h asks
    for a decode state per thread, and cnnpar's decode threads are new each epoch. With the state
    shared by threads in turn, a decode hung inside nvjpegDecodeBatched on an H200
    (benchmarks/results/2026-12-01-h200/call-l/jpeg_pipeline.log); with this thread the same
    benchmark completed (call M). `decode` hands the call to `self._library`, a single long-lived
    thread (`LibraryThread`), and waits (the GIL released).

    Known limit: each output image is sized from the (height, width) the workers read in its frame
    header (`jpeg_header`), not from nvJPEG's own parse (torchvision asks nvjpegGetImageInfo per
    image); both read the same SOF segment, and a file whose header the reader cannot read goes
    another way.

    `decode` takes the encoded batch as it arrives from the workers (one flat host buffer with
    offsets) and returns one flat uint8 device buffer holding the chosen images as interleaved RGB,
    one after another, with each image's start: what `crop_resize.resized_crops_flat` reads.
    """

    def __init__(self, device: torch.device, settings: EngineSettings | None = None) -> None:
        self.settings = settings or SETTINGS
        self.interleaved = not self.settings.planar  # the layout of `decode`'s output, for the resize
        device = torch.device(device)
        if device.type != "cuda":
            raise HardwareDecoderUnavailable("the hardware JPEG decoder needs a CUDA device")
        # an index: the library's thread makes that device current (torch.cuda.set_device needs one)
        self.device = device if device.index is not None else torch.device("cuda", torch.cuda.current_device())
        self.lib = load_library()
        self.handle = self.state = None
        self.more_states = []  # the states past the first, made as a batch cut into calls needs them
        self.engine_info = None  # (engines, cores per engine), where the library says
        self._stream = None  # the engines' own stream (`_create`; see `decode`), None where none could be made
        self._library = LibraryThread("cnnpar-nvjpeg")  # every handle/state call runs on it
        self._library_thread = self._library.ident
        try:
            self._library.submit(self._create).result()
        except BaseException:
            self._library.shutdown(wait=False)
            self._library = None  # nothing to close: the half-made decoder's finalizer has no thread to wait for
            raise
        self.version = library_version(self.lib)
        self._batch = {}  # state -> the number of files it was initialised for
        self.calls = 0

    def _create(self) -> None:
        torch.cuda.set_device(self.device)  # the library works in the context current on its thread
        handle = ctypes.c_void_p()
        device_bits = self.settings.bitstreams == "device"
        if self.settings.sms:
            backend = BACKEND_GPU_HYBRID_DEVICE if device_bits else BACKEND_GPU_HYBRID
        else:
            backend = BACKEND_HARDWARE_DEVICE if device_bits else BACKEND_HARDWARE
        flags = (FLAG_MEMORY_POOLS if self.settings.pools else 0) | (
            0 if self.settings.pipelined else FLAG_HW_DECODE_NO_PIPELINE
        )
        status = self.lib.nvjpegCreateEx(backend, None, None, flags, ctypes.byref(handle))
        if status != 0:
            raise HardwareDecoderUnavailable(
                f"nvJPEG {library_version(self.lib)} could not start its hardware backend on "
                f"{torch.cuda.get_device_name(self.device)}: status {status} ({STATUS.get(status, 'unknown')})"
            )
        self.handle = handle
        self.engine_info = engine_info(self.lib, handle)
        try:
            self.state = self._new_state()
        except RuntimeError:
            self._destroy()  # the handle made above goes with the failed start
            raise
        self._stream = private_stream(self.device, self.settings.priority)

    def decode(
        self,
        flat: torch.Tensor,
        offsets: np.ndarray,
        ids: np.ndarray,
        hw: np.ndarray,
        stream: torch.cuda.Stream,
        tail: int = 0,
    ) -> tuple[torch.Tensor, np.ndarray]:
        """Decode the files `ids` of the encoded batch (`flat`, host uint8; file k is bytes
        offsets[k]:offsets[k+1]) whose (height, width) are `hw` (len(ids), 2), for `stream`, the
        caller's current stream, which reads the output next (the engines write it on the decoder's own).

        Returns (out, starts): `out` a device uint8 buffer with image j at out[starts[j]:] as
        (H, W, 3), or (3, H, W) where the settings ask for planar output (`self.interleaved` False),
        and `tail` spare bytes after the last image (for readers that look past it).
        Raises RuntimeError if the library refuses the batch (one bad file fails all of it).
        """
        n = len(ids)
        ids = np.asarray(ids, dtype=np.int64)
        hw = np.asarray(hw, dtype=np.int64).reshape(n, 2)
        sizes = 3 * hw[:, 0] * hw[:, 1]
        # each image starts on a 256-byte boundary, the alignment cudaMalloc gives a lone image
        spans = (sizes + ALIGN - 1) // ALIGN * ALIGN
        starts = np.cumsum(spans) - spans
        # The engines do not wait for work queued on the stream they are given before writing
        # (meta-pytorch/torchcodec PR #1634): a block taken from the caller's pool, freed by kernels still
        # queued there, could be overwritten under them. So the output comes from the pool of the
        # decoder's own stream (`private_stream`: no kernel is ever queued on it), which holds nothing but
        # its earlier outputs, each held by record_stream until the stream that read it is done with it: a
        # block handed out there has no work queued on it anywhere, no wait is needed before the call, and
        # the batch costs one wait on the GPU, after it. Without a stream of its own the decoder waits for
        # the caller's stream before the call too (`_decode_batched`).
        with self._allocating_on_own_stream():
            out = torch.empty(int(starts[-1] + sizes[-1]) + tail, dtype=torch.uint8, device=self.device)
        if out.is_cuda and self._stream is not None:
            out.record_stream(stream)  # the caller's crop and resize read it there
        # nvjpegImage_t: unsigned char *channel[4]; size_t pitch[4]. RGBI uses channel[0] alone, RGB
        # three planes of H x W, one after another
        dest = np.zeros((n, 2 * MAX_COMPONENT), dtype=np.uint64)
        first = np.uint64(out.data_ptr()) + starts.astype(np.uint64)
        if self.interleaved:
            dest[:, 0] = first
            dest[:, MAX_COMPONENT] = (3 * hw[:, 1]).astype(np.uint64)
        else:
            plane = (hw[:, 0] * hw[:, 1]).astype(np.uint64)
            for c in range(3):
                dest[:, c] = first + np.uint64(c) * plane
                dest[:, MAX_COMPONENT + c] = hw[:, 1].astype(np.uint64)
        offsets = np.asarray(offsets, dtype=np.int64)
        encoded = self._encoded_where_read(flat, stream)
        pointers = (np.uint64(encoded.data_ptr()) + offsets[ids].astype(np.uint64)).astype(np.uint64)
        lengths = (offsets[ids + 1] - offsets[ids]).astype(np.uint64)
        library = self._library
        if library is None:
            raise RuntimeError("the hardware JPEG decoder is closed")
        # the call returns once the engines are done with `encoded` and the arrays, and `out` is written
        library.submit(self._decode_batched, n, pointers, lengths, dest, stream).result()
        del encoded  # a device copy goes back to its stream's pool only now, after the call's wait
        self.calls += 1
        return out, starts

    def _encoded_where_read(self, flat: torch.Tensor, caller) -> torch.Tensor:
        """The batch's encoded bytes where the library reads them: `flat` itself (host memory), or
        with device bitstreams one copy of it on the GPU, queued on the stream the library's call
        runs on (the engines' own, else the caller's), whose wait after the call covers it; allocated
        from that stream's pool, like the output (see `decode`)."""
        if self.settings.bitstreams != "device" or flat.device.type == self.device.type:
            return flat
        with torch.cuda.stream(self._stream if self._stream is not None else caller):
            copy = torch.empty(flat.numel(), dtype=torch.uint8, device=self.device)
            copy.copy_(flat, non_blocking=True)
        return copy

    def _allocating_on_own_stream(self):
        # on the CPU a stand-in library in the tests writes host memory
        if self.device.type != "cuda" or self._stream is None:
            return contextlib.nullcontext()
        return torch.cuda.stream(self._stream)

    def _decode_batched(self, n: int, pointers, lengths, dest, caller) -> None:
        """On the library's thread: (re)initialise the state for `n` files, then one batched call on
        the decoder's own stream, waited for once, after the call: the encoded bytes (the workers'
        shared memory) and the pointer arrays may be freed once this returns, and the caller's
        kernels, queued after, read finished pixels. No wait before it (torchvision synchronises
        there): see `decode` for why the output needs none. Without a stream of its own the call runs
        on `caller`, the caller's stream, waited for before the call too. What the library waits for
        inside its own call (nvJPEG's hardware backend synchronises once per image, measured in
        session 8) is outside cnnpar's reach."""
        if self.handle is None or self.state is None:  # closed while this call waited in the queue
            raise RuntimeError("the hardware JPEG decoder is closed")
        stream = self._stream
        if stream is None:
            stream = caller
            stream.synchronize()
        try:
            spans = self.spans(n)
            while 1 + len(self.more_states) < len(spans):
                self.more_states.append(self._new_state())
            for k, ((first, last), state) in enumerate(zip(spans, [self.state, *self.more_states])):
                if k and self.settings.pace_us:
                    time.sleep(self.settings.pace_us / 1e6)  # see EngineSettings.pace_us
                self._call_library(state, first, last, pointers, lengths, dest, stream)
        finally:  # also after a refused batch: the caller frees the output and the arrays next
            stream.synchronize()

    def spans(self, n: int) -> list[tuple[int, int]]:
        """(first, last) files of each library call for a batch of `n` files: one call by default, calls of
        `settings.chunk` files where it is set; call k runs on state k."""
        chunk = self.settings.chunk or n
        return [(a, min(a + chunk, n)) for a in range(0, n, chunk)]

    def _new_state(self) -> ctypes.c_void_p:
        state = ctypes.c_void_p()
        _check(self.lib.nvjpegJpegStateCreate(self.handle, ctypes.byref(state)), "nvjpegJpegStateCreate")
        return state

    def _call_library(self, state, first: int, last: int, pointers, lengths, dest, stream) -> None:
        """One nvjpegDecodeBatched of files first..last-1 on `state` (initialised again when its last call
        had another count), queued on `stream`; no wait."""
        n = last - first
        key = id(state)
        if self._batch.get(key) != n:
            fmt = OUTPUT_RGBI if self.interleaved else OUTPUT_RGB
            _check(
                self.lib.nvjpegDecodeBatchedInitialize(self.handle, state, n, 1, fmt), "nvjpegDecodeBatchedInitialize"
            )
            self._batch[key] = n
        status = self.lib.nvjpegDecodeBatched(
            self.handle,
            state,
            pointers[first:last].ctypes.data,
            lengths[first:last].ctypes.data,
            dest[first:last].ctypes.data,
            ctypes.c_void_p(stream.cuda_stream),
        )
        if status != 0:
            self._batch.pop(key, None)  # nvjpeg.h: initialise again to reset a failed batch
            raise RuntimeError(
                f"nvjpegDecodeBatched (hardware, {n} files): status {status} ({STATUS.get(status, 'unknown')})"
            )

    def _destroy(self) -> None:
        self._stream = None  # the CUDA stream itself is left alive: data/private_stream.py says why
        for state in [self.state, *self.more_states]:
            if state:
                self.lib.nvjpegJpegStateDestroy(state)
        self.state, self.more_states = None, []
        if self.handle:
            self.lib.nvjpegDestroy(self.handle)
            self.handle = None

    def close(self, timeout: float | None = None) -> None:
        """Free the library's handle and state, on the thread that made them. Decodes asked for
        afterwards raise RuntimeError (GpuDecoder then decodes the nvJPEG way). `timeout`: give up
        waiting for the library's thread after that many seconds (the handle is then left to the
        process's end) instead of waiting as long as a decode queued before the close takes."""
        library = getattr(self, "_library", None)
        if library is None:
            return
        self._library = None
        if threading.get_ident() == self._library_thread:
            # on the library's own thread (a last reference dropped there): waiting for a job
            # queued behind this one would never end
            self._destroy()
            library.shutdown(wait=False)
            return
        try:
            library.submit(self._destroy).result(timeout)
        finally:
            library.shutdown(wait=False)

    def __del__(self) -> None:
        # Not at interpreter shutdown: the process's end frees the handle anyway, and the library's
        # thread may already be gone. A finalizer never waits long: it may run inside any call.
        if sys.is_finalizing():
            return
        try:
            self.close(timeout=10)
        except Exception:  # a library already unloaded, or its thread busy: left to the process's end
            pass


@cache
def hardware_decoder_available(device_index: int = 0) -> str:
    """'' when nvJPEG's hardware backend works on this GPU, else why not (for the printed line)."""
    try:
        HardwareJpegDecoder(torch.device("cuda", device_index)).close()
    except Exception as e:  # noqa: BLE001 - any failure (an old libnvjpeg without a symbol too) means "no"
        return str(e) or type(e).__name__
    return ""


def jpeg_engines(decode: str, source: str, device: torch.device) -> str | None:
    """The decode rule's question (config.resolve_decode), asked only where its answer matters: with
    decode "auto", a CUDA device and a folder of photos. '' when this GPU's JPEG engines work, else
    why not; None when not asked."""
    if decode != "auto" or device.type != "cuda" or not os.path.isdir(source):
        return None
    return hardware_decoder_available(device.index if device.index is not None else torch.cuda.current_device())
