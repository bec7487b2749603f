"""Where the time of the JPEG paths goes, per batch.

`--stages gpu` (the default): the GPU path's decode alone, crop+resize alone (the per-image loop
against the batched kernels) and the whole `GpuDecoder` call. Reads each folder once into encoded
batches (as the DataLoader workers would hand them over, headers read), first checks which files
torchvision's `decode_jpeg` refuses on the device when decoded alone, then times each stage.

`--stages cpu`: what one DataLoader worker (one process, one thread) decodes per second for
ResNet-50's input (`--size` 224): `today` is the per-image path (`ImageFolderDataset`: whole
photo decoded, shorter side resized, centre crop; default collate), `batch` the batch-level
`CpuDecodedFolder` with random-resized crops decoded at full size by Pillow / torchvision,
`batch+draft` the same with JPEGs decoded reduced where the crop allows, `simplejpeg` the same
through simplejpeg (what training runs where it is installed), `pillow-resize` Pillow's
`resize(box=...)` instead of torch's uint8 kernel (the design the module rejected). All of them
are timed in turn in each round, so that the shared host's changing load falls on each alike;
rows carry the fastest and slowest round and the speed-up over `today`.

`--stages cpu-profile`: one worker's time per image, step by step (reading, header, each JPEG
decode whole and at libjpeg-turbo's M/8 scales, nvImageCodec's CPU region decode, crop+resize).
`--stages cpu-quality`: the pixel differences between the CPU decodes and the GPU path's float
reference, on the same crop boxes.

Each stage runs on batches cycled from the folder: warm-up first, then `--repeats` timed runs,
median reported. Two times per row: `host_s`, until the call returns (what the Python thread
spends, launches included), and `total_s`, until the device is idle (torch.cuda.synchronize;
equal to host_s on the CPU). Rows go to benchmarks/results/jpeg_decode_<device type>.csv with
environment facts and the 1-minute load average (the host may be shared).

DCT scaling pays for photos much larger than the crop; `--make-photos DIR --photo-size 1600x1200`
writes `--photos` synthetic JPEGs (smooth colour waves plus `--photo-noise` noise, Pillow quality
90; the default noise gives about 0.28 bytes a pixel) to DIR/photos/ and measures that folder too:

    python benchmarks/jpeg_decode.py --folder .devdata/imagenet_sample --device cpu --batch-size 128 \
        --repeats 3 --stages gpu,cpu
    python benchmarks/jpeg_decode.py --make-photos .devdata/photos_1600x1200 --device cpu \
        --batch-size 128 --repeats 3 --stages cpu --append
    python benchmarks/jpeg_decode.py --folder .devdata/imagenet_sample --device cpu --batch-size 128 \
        --repeats 7 --stages cpu,cpu-profile,cpu-quality --out benchmarks/results/jpeg_decode_cpu_simplejpeg.csv
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout, not whichever cnnpar is installed

import numpy as np  # noqa: E402
import torch  # noqa: E402

from cnnpar.data import crop_resize  # noqa: E402
from cnnpar.data.cpu_decode import CpuDecodedFolder, reduction, resize_into, simplejpeg_module  # noqa: E402
from cnnpar.data.crop_resize import draw_crop_boxes, resized_crops, resized_crops_loop  # noqa: E402
from cnnpar.data.folder import ImageFolderDataset, decode_rgb, read_encoded  # noqa: E402
from cnnpar.data.gpu_decode import (  # noqa: E402
    EncodedFolderDataset,
    GpuDecoder,
    collate_encoded,
    nvjpeg_decode,
)
from cnnpar.data.jpeg_header import read_jpeg_header  # noqa: E402
from cnnpar.data.nvimgcodec_decode import nvimgcodec_available  # noqa: E402
from cnnpar.data.nvjpeg_hw import EngineSettings, hardware_decoder_available  # noqa: E402
from cnnpar.data.tv_codecs import TV_CODEC_DEPRECATION  # noqa: E402
from cnnpar.errors import UserError, main_saying_user_errors  # noqa: E402
from cnnpar.report.environment import environment  # noqa: E402
from cnnpar.report.files import read_csv, write_csv_atomic  # noqa: E402
from cnnpar.report.meters import sync  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
SUFFIXES = {".jpg", ".jpeg", ".png"}


def timed(fn, device: torch.device, repeats: int, warmup: int = 1) -> tuple[float, float]:
    """Median (host_s, total_s) of `fn()` over `repeats` runs after `warmup` runs."""
    host, total = [], []
    for i in range(warmup + repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        sync(device)
        t2 = time.perf_counter()
        if i >= warmup:
            host.append(t1 - t0)
            total.append(t2 - t0)
    return statistics.median(host), statistics.median(total)


def failing_files(files: list[Path], device: torch.device) -> list[tuple[Path, str]]:
    """Files that `decode_jpeg(device=...)` refuses when decoded alone."""
    bad = []
    for f in files:
        buf = torch.frombuffer(bytearray(f.read_bytes()), dtype=torch.uint8)
        try:
            nvjpeg_decode([buf], device)
        except (RuntimeError, ValueError) as e:
            bad.append((f, str(e).splitlines()[0][:120]))
    return bad


def write_photos(folder: Path, n: int, width: int, height: int, noise: float, seed: int = 0) -> Path:
    """n synthetic JPEGs of width x height in folder/photos/ (kept if already there): smooth colour
    waves plus Gaussian noise of sigma `noise` (8: about 0.28 bytes a pixel, near a camera's
    photo; 0: smooth, 0.06 bytes a pixel), Pillow quality 90."""
    import numpy as np
    from PIL import Image

    out = folder / "photos"
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32) / max(width, height)
    for i in range(n):
        path = out / f"{i:04d}.jpg"
        if path.exists():
            continue
        waves = [127 + 90 * np.sin(2 * np.pi * (f * xx + g * yy) + ph) for f, g, ph in rng.uniform(0.5, 4, (3, 3))]
        pixels = np.stack(waves, -1) + rng.normal(0, noise, (height, width, 3))
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(path, quality=90)
    return folder


def pillow_resize_batch(ds: CpuDecodedFolder, indices: list[int]) -> torch.Tensor:
    """`CpuDecodedFolder` with draft, but Pillow decodes every JPEG and crops+resizes in one
    `resize(box=...)` call: the alternative the module measured and rejected."""
    import numpy as np
    from PIL import Image

    datas = [read_encoded(ds.files[i]) for i in indices]
    opened = [Image.open(io.BytesIO(memoryview(d.numpy()))) for d in datas]
    sizes = torch.tensor([(im.height, im.width) for im in opened])
    boxes = draw_crop_boxes(sizes, ds.train, ds.generator(indices)).tolist()
    out = torch.empty(len(indices), 3, ds.size, ds.size, dtype=torch.uint8)
    for k, (im, (top, left, ch, cw)) in enumerate(zip(opened, boxes)):
        r, width = reduction(ch, cw, ds.size), im.width
        got = im.draft("RGB", (width // r, im.height // r)) if r > 1 else None
        s = width / got[1][2] if got is not None else 1.0
        small = im.resize((ds.size, ds.size), Image.BILINEAR, box=(left / s, top / s, (left + cw) / s, (top + ch) / s))
        out[k].copy_(torch.from_numpy(np.array(small.convert("RGB"))).permute(2, 0, 1))
    return out


def folder_facts(files: list[Path]) -> dict:
    from PIL import Image

    pixels = []
    for f in files:
        with Image.open(f) as im:
            pixels.append(im.width * im.height)
    return {
        "mean_megapixels": round(statistics.mean(pixels) / 1e6, 3),
        "mean_file_kb": round(statistics.mean(f.stat().st_size for f in files) / 1e3, 1),
    }


def image_files(folder: Path) -> list[Path]:
    """The images under `folder`, sorted; a UserError where there are none (or no such folder)."""
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in SUFFIXES)
    if not files:
        raise UserError(f"{folder}: no .jpg/.jpeg/.png files found")
    return files


def photo_size(text: str) -> tuple[int, int]:
    """--photo-size WIDTHxHEIGHT as two whole numbers (a ValueError traceback otherwise)."""
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise UserError(f"--photo-size {text}: expected WIDTHxHEIGHT, e.g. 1600x1200") from None
    return width, height


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folder", type=Path, nargs="*", default=[], help="image folder(s) (searched recursively)")
    ap.add_argument(
        "--make-photos", type=Path, default=None, metavar="DIR", help="write synthetic photos here, measure them"
    )
    ap.add_argument("--photo-size", default="1600x1200", help="WIDTHxHEIGHT of --make-photos")
    ap.add_argument("--photos", type=int, default=128, help="how many --make-photos writes")
    ap.add_argument("--photo-noise", type=float, default=8.0, help="noise sigma of --make-photos (0: smooth)")
    ap.add_argument(
        "--stages",
        default="gpu",
        help="comma list: gpu (GpuDecoder's stages), engines (the JPEG engines driven each --hw-variants way), "
        "cpu (one worker's rows), cpu-profile (its time per image), cpu-quality (pixel differences between the "
        "CPU decodes)",
    )
    ap.add_argument(
        "--hw-variants",
        default="bits=device;out=rgb;pools=1;pipe=0;pipe=0+pools=1",
        help="for --stages engines: ';'-separated ways to drive the engines besides the defaults "
        "(nvjpeg_hw.EngineSettings: bits=host|device, out=rgbi|rgb, pools=0|1, pipe=1|0, on=engines|sms, "
        "chunk=<files a library call, each on a decode state of its own>, prio=<the engines' stream priority>, "
        "'+'-joined)",
    )
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--size", type=int, default=224, help="output side in pixels")
    ap.add_argument("--batches", type=int, default=2, help="distinct batches (files cycled if too few)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--gil", action="store_true", help="also time each decoder beside a spinning Python thread")
    ap.add_argument("--pipeline-batches", type=int, default=24, help="batches per timed run of the pipelined rows")
    ap.add_argument("--profile", action="store_true", help="also print a torch.profiler table of one decoder call")
    ap.add_argument("--backends", default="", help="GPU decoders to measure, comma list (default: every one available)")
    ap.add_argument(
        "--out", type=Path, default=None, help="CSV path (default benchmarks/results/jpeg_decode_<device>.csv)"
    )
    ap.add_argument("--append", action="store_true", help="keep the rows already in --out, add these")
    args = ap.parse_args()
    # torchvision 0.29 deprecates its codecs in favour of TorchCodec (docs/decoding.md: the plan, and
    # why cnnpar keeps them until they are removed). A script owns its process: one filter for that
    # notice alone, rather than cnnpar's per-call tv_codecs(), keeps the timed calls bare.
    warnings.filterwarnings("ignore", message=TV_CODEC_DEPRECATION, category=DeprecationWarning)
    stages = set(args.stages.split(","))
    if not stages <= {"gpu", "engines", "cpu", "cpu-profile", "cpu-quality"}:
        raise UserError(
            f"--stages {args.stages}: expected a comma list of gpu, engines, cpu, cpu-profile and cpu-quality"
        )
    try:
        [EngineSettings.parse(v) for v in args.hw_variants.split(";") if v]
    except ValueError as e:
        raise UserError(f"--hw-variants: {e}") from None
    # each folder given is checked before any is measured: a second one missing stopped the run half done
    for folder in args.folder:
        image_files(folder)
    device = torch.device(args.device)
    folders = list(args.folder)
    if args.make_photos is not None:
        width, height = photo_size(args.photo_size)
        folders.append(write_photos(args.make_photos, args.photos, width, height, args.photo_noise))
    if not folders:
        raise UserError("give --folder and/or --make-photos")
    rows = []
    env = environment(device, 1)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = args.out or RESULTS / f"jpeg_decode_{device.type}.csv"
    earlier = read_csv(out) if args.append and out.exists() else []

    def save() -> None:  # after every row: a run cut off by its time limit keeps what it measured
        write_csv_atomic(out, earlier + [{**r, **env} for r in rows])

    for folder in folders:
        files = image_files(folder)
        print(f"{len(files)} files under {folder}, device {device}, batch {args.batch_size}, size {args.size}")
        facts = {"folder": folder.name, **folder_facts(files)}
        print(f"  {facts['mean_megapixels']} megapixels, {facts['mean_file_kb']} kB a file on average")
        indices = [
            [(b * args.batch_size + k) % len(files) for k in range(args.batch_size)] for b in range(args.batches)
        ]
        recorder = Recorder(args, device, len(files), facts, rows, save)
        if "gpu" in stages:
            gpu_stages(files, indices, args, device, recorder)
        if "engines" in stages:
            engine_stages(files, indices, args, device, recorder)
        if "cpu" in stages:
            cpu_stages(files, indices, args, recorder)
        if "cpu-profile" in stages:
            cpu_profile(files, args, recorder)
        if "cpu-quality" in stages:
            cpu_quality(files, indices, args, recorder)

    save()
    print(f"-> {out}")
    return 0


class Recorder:
    """Times `fn(b)` for each batch b and keeps one flat row per stage."""

    def __init__(self, args, device: torch.device, files: int, facts: dict, rows: list[dict], save=None) -> None:
        self.args, self.device, self.files, self.facts, self.rows = args, device, files, facts, rows
        self.save = save or (lambda: None)
        self.refused: int | str = ""  # files decode_jpeg refuses alone, once the GPU stages have looked

    def rate(self, stage: str, method: str, mode: str, fn) -> None:
        """A row for `fn()`, which makes many batches and returns how many images: the median time
        per batch of its repeats (after one warm-up run)."""
        counts = []

        def run():
            counts.append(fn())

        host, total = timed(run, self.device, self.args.repeats)
        per_batch = self.args.batch_size / counts[-1]
        self.keep(stage, method, mode, host * per_batch, total * per_batch)

    def __call__(self, stage: str, method: str, mode: str, fn) -> None:
        args = self.args
        per_batch = [timed(lambda b=b: fn(b), self.device, args.repeats) for b in range(args.batches)]
        host = statistics.median(h for h, _ in per_batch)
        total = statistics.median(t for _, t in per_batch)
        self.keep(stage, method, mode, host, total)

    def keep(self, stage: str, method: str, mode: str, host: float, total: float, per: int = 0, **extra) -> None:
        """One row: `per` items in `total` seconds (default a batch)."""
        args, per = self.args, per or self.args.batch_size
        self.rows.append(
            {
                "stage": stage,
                "method": method,
                "mode": mode,
                "batch_size": args.batch_size,
                "size": args.size,
                "host_s": round(host, 6),
                "total_s": round(total, 6),
                "images_per_s": round(per / total, 1),
                "batches": args.batches,
                "repeats": args.repeats,
                "files": self.files,
                "files_refused_alone": self.refused,
                "torch_threads": torch.get_num_threads(),
                "load_avg_1m": round(os.getloadavg()[0], 2),  # the host is shared: context for CPU rows
                **extra,
                **self.facts,
            }
        )
        print(
            f"{stage:12s} {method:22s} {mode:5s} host {host * 1e3:8.2f} ms  total {total * 1e3:8.2f} ms  "
            f"{per / total:8.0f} img/s  (load {os.getloadavg()[0]:.2f})"
            + "".join(f"  {k} {v}" for k, v in extra.items())
        )
        self.save()

    def interleaved(self, stage: str, cases: list[tuple[str, str, object]], per: int = 0, warmup: int = 1) -> None:
        """Times each case's `fn(b)` for every batch b, all cases in turn in each of `repeats` rounds,
        so that a change in the shared host's load falls on every case alike; one row per case:
        the median round, its slowest and fastest (the noise), and the speed-up over the first case."""
        args, rounds = self.args, {method + "/" + mode: [] for method, mode, _ in cases}
        for r in range(warmup + args.repeats):
            for method, mode, fn in cases:
                t0 = time.perf_counter()
                for b in range(args.batches):
                    fn(b)
                if r >= warmup:
                    rounds[method + "/" + mode].append((time.perf_counter() - t0) / args.batches)
        base = statistics.median(next(iter(rounds.values())))
        for method, mode, _ in cases:
            ts = rounds[method + "/" + mode]
            med = statistics.median(ts)
            extra = {"fastest_s": round(min(ts), 6), "slowest_s": round(max(ts), 6)}
            if per:  # a profile: each case's own cost, per image
                extra["ms_per_image"] = round(med / per * 1e3, 4)
            else:
                extra["speedup_vs_first"] = round(base / med, 3)
            self.keep(stage, method, mode, med, med, per, **extra)


def with_kernel(kernel: str, fn):
    """`fn` with crop_resize.KERNEL set to `kernel` while it runs (the resize's two implementations)."""

    def run(*args):
        crop_resize.KERNEL = kernel
        try:
            return fn(*args)
        finally:
            crop_resize.KERNEL = "auto"

    return run


def gpu_stages(files: list[Path], indices: list[list[int]], args, device: torch.device, record: Recorder) -> None:
    bad = failing_files(files, device)
    record.refused = len(bad)
    print(f"decode_jpeg on {device.type} refuses {len(bad)} of {len(files)} files alone")
    for f, why in bad:
        print(f"  {f}: {why}")

    ds = EncodedFolderDataset(files, [0] * len(files), args.size)
    items = [ds[i] for i in range(len(files))]
    batches = [collate_encoded([items[i] for i in idx])[0] for idx in indices]
    gpu_ok = int(sum(np.asarray(b.nvjpeg_ok).sum() for b in batches))
    print(f"header check: {gpu_ok} of {args.batches * args.batch_size} images go to the batched decode")

    backends = ["nvjpeg"] + (["nvimgcodec"] if nvimgcodec_available() else [])
    why_not_hw = hardware_decoder_available(device.index or 0) if device.type == "cuda" else "no CUDA"
    backends += [] if why_not_hw else ["hardware"]
    if args.backends:
        backends = [b for b in backends if b in args.backends.split(",")]
    print(f"GPU decode backends here: {', '.join(backends)}" + (f" (hardware: {why_not_hw})" if why_not_hw else ""))
    tensors = [batches[0].data, batches[-1].data]
    from torchvision.io import ImageReadMode, decode_jpeg

    # torchvision's batched call alone, as the reference measurement called it (no header check,
    # no private stream): what any wrapper around it should approach
    record("decode", "torchvision", "raw", lambda b: decode_jpeg(tensors[b % 2], mode=ImageReadMode.RGB, device=device))
    if "nvimgcodec" in backends and device.type == "cuda":
        # the library alone on its hardware engines, as the reference measurement called it (code
        # streams made beforehand, no crop boxes, no tensors): what the nvimgcodec backend should approach
        from nvidia import nvimgcodec as nic

        hw_only = nic.Decoder(backends=[nic.Backend(nic.BackendKind.HW_GPU_ONLY)])
        streams = [[nic.CodeStream(t.numpy()) for t in ts] for ts in tensors]
        record("decode", "nvimgcodec", "raw", lambda b: hw_only.decode(streams[b % 2]))
    if "hardware" in backends:
        # the JPEG engines through nvJPEG's hardware backend alone: one library call per batch,
        # whole images into one flat buffer (no crop boxes, no resize)
        from cnnpar.data.nvjpeg_hw import HardwareJpegDecoder

        engines = HardwareJpegDecoder(device)
        print(f"hardware decoder: nvJPEG {engines.version} from {engines.lib.path}")
        stream = torch.cuda.current_stream(device)
        # the files the engines take (a progressive, CMYK or PNG file would make the library refuse the batch)
        engine_ids = [np.flatnonzero(np.asarray(b.hardware_ok)) for b in batches]
        record(
            "decode",
            "hardware",
            "raw",
            lambda b: engines.decode(
                batches[b].flat,
                np.asarray(batches[b].offsets),
                engine_ids[b],
                np.asarray(batches[b].hw)[engine_ids[b]],
                stream,
            ),
        )
    for backend in backends:
        for regions in (False, True) if backend == "nvimgcodec" else (False,):
            dec = GpuDecoder(files, args.size, device, train=True, backend=backend)
            if dec.nvimgcodec is not None:
                dec.nvimgcodec.regions = regions
            label = backend + ("-region" if regions else "")
            record("decode", label, "train", lambda b, d=dec: d.decode(batches[b]))
    probe = GpuDecoder(files, args.size, device, train=False)
    images = [probe.decode(b)[0] for b in batches]
    sync(device)
    g = torch.Generator().manual_seed(0)
    for mode in ("train", "eval"):
        boxes = [draw_crop_boxes(torch.tensor([img.shape[1:] for img in imgs]), mode == "train", g) for imgs in images]
        # "batched": the matrix products (crop_resize.KERNEL = "matmul"); "fused": the Triton kernels
        for method, resize, kernel in (
            ("loop", resized_crops_loop, "auto"),
            ("batched", resized_crops, "matmul"),
            ("fused", resized_crops, "fused"),
        ):
            record(
                "crop_resize",
                method,
                mode,
                with_kernel(kernel, lambda b, f=resize, bx=boxes: f(images[b], bx[b], args.size)),
            )
    images.clear()  # free the decoded batches before the whole-call rows
    for backend in backends:
        resizes = [("batched", "matmul"), ("fused", "fused")] + ([("loop", "auto")] if backend == "nvjpeg" else [])
        for label, kernel in resizes:
            for mode in ("train", "eval"):
                resize = "loop" if label == "loop" else "batched"
                dec = GpuDecoder(files, args.size, device, train=mode == "train", resize=resize, backend=backend)
                record("gpu_decoder", f"{backend}/{label}", mode, with_kernel(kernel, lambda b, d=dec: d(batches[b])))
    if args.gil:
        gil_rows(files, batches, backends, args, device, record)
    # as training runs it: DeviceFeeder's two threads (decode batch i+1 while batch i is resized)
    for backend in backends:
        record.rate("pipelined", backend, "train", lambda d=backend: feed_all(files, batches, args, device, d))
    if args.profile:
        # where one whole decoder call spends host and device time, for each backend
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        for backend in backends:
            dec = GpuDecoder(files, args.size, device, train=True, backend=backend)
            dec(batches[0])
            sync(device)
            with profile(activities=acts) as prof:
                dec(batches[0])
                sync(device)
            print(f"--- profile: one GpuDecoder call, {backend}, batch {args.batch_size}")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=50))


def engines_unavailable(device: torch.device) -> str:
    """'' where the JPEG engines work on `device`, else why not."""
    return hardware_decoder_available(device.index or 0) if device.type == "cuda" else "no CUDA"


def engines_call_ok(engines, batch, ids, stream) -> None:
    """One decode of `batch` (raises what the library raises), its output dropped."""
    engines.decode(batch.flat, np.asarray(batch.offsets), ids, np.asarray(batch.hw)[ids], stream)


# CUDA runtime calls that make the calling host thread wait for the GPU (cudaFree waits for the device;
# a plain cudaMemcpy for its copy)
HOST_WAITS = {
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cudaDeviceSynchronize",
    "cudaMemcpy",
    "cudaMemcpy2D",
    "cudaFree",
    "cudaFreeHost",
}


def engine_stages(files: list[Path], indices: list[list[int]], args, device: torch.device, record: Recorder) -> None:
    """`--stages engines`: the JPEG engines driven each way `--hw-variants` names (nvjpeg_hw.EngineSettings;
    the defaults first), each one's whole-image decode alone (one library call per batch), its pixels
    against the defaults', and what one call does on the host and the GPU, counted from torch.profiler's
    CUDA activity (all threads, the library's own included): the calls that wait for the GPU
    (HOST_WAITS), the copies and the kernels, per batch."""
    from torch.profiler import ProfilerActivity, profile

    from cnnpar.data.nvjpeg_hw import HardwareJpegDecoder

    why_not = engines_unavailable(device)
    if why_not:
        print(f"engines: not measured ({why_not})")
        return
    ds = EncodedFolderDataset(files, [0] * len(files), args.size)
    items = [ds[i] for i in range(len(files))]
    batches = [collate_encoded([items[i] for i in idx])[0] for idx in indices]
    engine_ids = [np.flatnonzero(np.asarray(b.hardware_ok)) for b in batches]
    print(f"engines: {sum(len(i) for i in engine_ids)} of {sum(len(b) for b in batches)} images are theirs")
    probe = HardwareJpegDecoder(device)
    # nvImageCodec sizes its calls to the engines by engines x cores (extensions/nvjpeg/hw_decoder.cpp)
    print(f"engines: nvjpegGetHardwareDecoderInfo says {probe.engine_info or 'nothing'} (engines, cores per engine)")
    probe.close()
    stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
    specs = [""] + [v for v in args.hw_variants.split(";") if v]
    reference = None
    for spec in specs:
        settings = EngineSettings.parse(spec)
        engines = None
        try:
            engines = HardwareJpegDecoder(device, settings)
            engines_call_ok(engines, batches[0], engine_ids[0], stream)
        except Exception as e:  # noqa: BLE001 - one way the library refuses must not end the others' rows
            print(f"  {settings.label}: not measured: {str(e)[:300]}")
            record.keep("decode", f"hardware[{settings.label}]", "raw", float("nan"), float("nan"), status=str(e)[:300])
            if engines is not None:
                engines.close()
            if not spec:  # the defaults: nothing to compare the other ways' pixels with
                reference = []
            continue

        def call(b: int, engines=engines):
            hw = np.asarray(batches[b].hw)[engine_ids[b]]
            return engines.decode(batches[b].flat, np.asarray(batches[b].offsets), engine_ids[b], hw, stream)

        out, starts = call(0)
        hw0 = np.asarray(batches[0].hw)[engine_ids[0]]
        images = []
        for j, (h, w) in enumerate(hw0.tolist()):
            pixels = out[int(starts[j]) : int(starts[j]) + 3 * h * w]
            images.append(pixels.view(h, w, 3).permute(2, 0, 1) if engines.interleaved else pixels.view(3, h, w))
        images = [img.cpu() for img in images]
        if reference is None:  # the defaults' own pixels
            reference = images
        # "" where the defaults were not measured: no comparison, rather than one against another way
        worst = max((int((a.int() - b.int()).abs().max()) for a, b in zip(reference, images)), default="")
        del out, images
        calls = 3
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for b in range(calls):
                call(b % len(batches))
            sync(device)
        runtime, kernels, copies, waited_us = {}, 0, 0, 0.0
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                if e.name.startswith("Memcpy") or e.name.startswith("Memset"):
                    copies += 1
                else:
                    kernels += 1
            elif e.name.startswith("cuda"):
                runtime[e.name] = runtime.get(e.name, 0) + 1
                if e.name in HOST_WAITS:  # a wait on work already done returns at once: the time says which
                    waited_us += e.cpu_time_total
        waits = sum(n for name, n in runtime.items() if name in HOST_WAITS)
        busiest = sorted(runtime.items(), key=lambda kv: -kv[1])[:6]
        record(
            "decode",
            f"hardware[{settings.label}]",
            "raw",
            call,
        )
        record.rows[-1].update(
            {
                "max_diff_vs_default": worst,
                "host_waits_per_batch": round(waits / calls, 2),
                "host_wait_ms_per_batch": round(waited_us / 1e3 / calls, 3),
                "library_calls_per_batch": len(engines.spans(len(engine_ids[0]))),
                "engines_x_cores": "x".join(map(str, engines.engine_info or ())),
                "kernels_per_batch": round(kernels / calls, 2),
                "copies_per_batch": round(copies / calls, 2),
                "runtime_calls_per_batch": "; ".join(f"{k} {v / calls:g}" for k, v in busiest),
            }
        )
        record.save()
        busy = record.rows[-1]["runtime_calls_per_batch"]
        print(
            f"  {settings.label}: max diff vs default {worst}, per batch: {waits / calls:g} host waits "
            f"({waited_us / 1e3 / calls:.2f} ms), "
            f"{kernels / calls:g} kernels, {copies / calls:g} copies; runtime calls: {busy}"
        )
        engines.close()


class Spinner:
    """A Python thread that keeps the interpreter busy (as a training thread's Python does), to
    see how much a decoder's calls slow down when they must win the GIL back from it."""

    def __init__(self) -> None:
        import threading

        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.spin, daemon=True)

    def spin(self) -> None:
        x = 0
        while not self.stop.is_set():
            for _ in range(1000):
                x += 1

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def gil_rows(files, batches, backends, args, device, record) -> None:
    """Each decoder's call alone, beside a spinning Python thread at the default GIL switch
    interval (5 ms), and beside it at 0.2 ms; then the resize stage of its decoded batches beside
    the spinner, with the matrix products and with the fused kernels (each torch call of the
    products takes the GIL back after its launch, so the count of calls is what the spinner costs)."""
    default = sys.getswitchinterval()
    for backend in backends:
        dec = GpuDecoder(files, args.size, device, train=True, backend=backend)
        decoded = [dec.decode_stage(b) for b in batches]  # the batched resize reads these, changes nothing
        sync(device)
        with Spinner():
            for label, kernel in (("batched", "matmul"), ("fused", "fused")):
                resize = with_kernel(kernel, lambda b, d=dec, ds=decoded: d.resize_stage(ds[b]))
                record("resize_spin", f"{backend}/{label}", "train", resize)
            # decode_stage, what the feeder's decode thread runs (`decode` also makes a view per image of
            # the engines' buffer: 256 more torch calls, which call Z's 8 s a batch beside the spinner timed)
            record("decode_spin", backend, "train", lambda b, d=dec: d.decode_stage(batches[b]))
            sys.setswitchinterval(0.0002)
            try:
                record("decode_spin_0.2ms", backend, "train", lambda b, d=dec: d.decode_stage(batches[b]))
            finally:
                sys.setswitchinterval(default)


def feed_all(files: list[Path], batches: list, args, device: torch.device, backend: str) -> int:
    """Every batch of `--pipeline-batches` (cycled) through DeviceFeeder as training gets it:
    decode and resize in their own threads, uint8 out (no normalisation); returns the image count."""
    from cnnpar.data.loader import DeviceFeeder
    from cnnpar.data.transforms import DeviceTransform

    labels = torch.zeros(args.batch_size, dtype=torch.int64)
    raw = [(batches[k % len(batches)], labels) for k in range(args.pipeline_batches)]
    dec = GpuDecoder(files, args.size, device, train=True, backend=backend)
    transform = DeviceTransform((0.0,) * 3, (1.0,) * 3, "none", False, device)
    feeder = DeviceFeeder(raw, None, transform, device, True, False, dec, threaded=True)
    n = 0
    for x, _ in feeder:
        n += x.shape[0]
    return n


def cpu_stages(files: list[Path], indices: list[list[int]], args, record: Recorder) -> None:
    """One DataLoader worker's work per batch, in this process on one thread; every method in
    each round (`Recorder.interleaved`), `today` first, so each row carries its speed-up over it."""
    from torch.utils.data import default_collate

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a worker's share: the DataLoader sets 1 thread in each worker too
    try:
        labels = [0] * len(files)
        today = ImageFolderDataset(files, labels, args.size)
        # today's path has no random-resized crop: it resizes the whole photo, then takes the centre
        cases = [("today", "train", lambda b: default_collate([today[i] for i in indices[b]]))]
        for method, draft in (("batch", False), ("batch+draft", True)):
            ds = CpuDecodedFolder(files, labels, args.size, train=True, draft=draft, backend="pillow")
            cases.append((method, "train", lambda b, d=ds: d[indices[b]]))
        # evaluation decodes at full size since the 2026-12 audit (a reduced decode differed from the GPU
        # decoders' validation pixels): its rows are "batch", where those before were "batch+draft"
        ds = CpuDecodedFolder(files, labels, args.size, train=False, backend="pillow")
        cases.append(("batch", "eval", lambda b, d=ds: d[indices[b]]))
        if simplejpeg_module() is not None:
            for mode in ("train", "eval"):
                ds = CpuDecodedFolder(files, labels, args.size, train=mode == "train", backend="simplejpeg")
                cases.append(("simplejpeg", mode, lambda b, d=ds: d[indices[b]]))
        else:
            print("simplejpeg not installed: no simplejpeg rows (pip install simplejpeg)")
        ds = CpuDecodedFolder(files, labels, args.size, train=True, backend="pillow")
        cases.append(("pillow-resize", "train", lambda b, d=ds: pillow_resize_batch(d, indices[b])))
        record.interleaved("cpu_worker", cases)
    finally:
        torch.set_num_threads(threads)


def cpu_profile(files: list[Path], args, record: Recorder) -> None:
    """Where one worker's time goes per image (random-resized crops, one thread): reading, the
    header, each JPEG decode (whole, at libjpeg-turbo's scales, and at 1/8, whose cost is nearly
    all entropy decoding: the floor of any decode of the whole file), nvImageCodec's CPU decode of
    the crop region alone (it stops after the crop's last row), and the crop+resize into the
    batch. (Flips are done on the device, not in the workers.) Rows: stage cpu_profile, ms/image."""
    import numpy as np

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        datas = [read_encoded(f) for f in files]
        raws = [memoryview(d.numpy()) for d in datas]
        sizes = [tuple(decode_rgb(d, f).shape[1:]) for d, f in zip(datas, files)]
        boxes = draw_crop_boxes(torch.tensor(sizes), True, torch.Generator().manual_seed(0)).tolist()
        jpeg = [k for k, d in enumerate(raws) if read_jpeg_header(d) is not None]
        each = lambda fn: lambda b: [fn(k) for k in jpeg]  # noqa: E731
        out = torch.empty(3, args.size, args.size, dtype=torch.uint8)
        whole = [decode_rgb(d, f).permute(1, 2, 0).contiguous() for d, f in zip(datas, files)]

        def crop_resize(k: int) -> None:
            top, left, h, w = boxes[k]
            resize_into(out, whole[k][top : top + h, left : left + w].permute(2, 0, 1))

        cases = [
            ("read file", "-", each(lambda k: read_encoded(files[k]))),
            ("jpeg header", "-", each(lambda k: read_jpeg_header(raws[k]))),
            ("torchvision whole", "-", each(lambda k: decode_rgb(datas[k], files[k]))),
            ("pillow whole", "-", each(lambda k: pillow_whole(raws[k]))),
            ("crop+resize into batch", "-", each(crop_resize)),
        ]
        sj = simplejpeg_module()
        if sj is not None:
            buf = np.empty(max(h * w for h, w in sizes) * 3, np.uint8)
            for m in range(8, 0, -1):

                def scaled(k: int, m: int = m) -> None:
                    h, w = sizes[k]
                    sj.decode_jpeg(raws[k], min_height=-(-h * m // 8), min_width=-(-w * m // 8), buffer=buf)

                cases.append((f"simplejpeg {m}/8", "-", each(scaled)))
            fast = lambda k: sj.decode_jpeg(raws[k], fastdct=True, fastupsample=True, buffer=buf)  # noqa: E731
            cases.append(("simplejpeg whole fastdct+ups", "-", each(fast)))
        if nvimgcodec_available():
            from nvidia import nvimgcodec as n

            dec = n.Decoder(device_id=n.NVIMGCODEC_DEVICE_CPU_ONLY, backends=[n.Backend(n.BackendKind.CPU_ONLY)])
            params = n.DecodeParams(color_spec=n.ColorSpec.SRGB, sample_format=n.I_RGB, apply_exif_orientation=False)

            def region(k: int, crop: bool) -> None:
                cs = n.CodeStream(datas[k].numpy())
                if crop:
                    top, left, h, w = boxes[k]
                    cs = cs.get_sub_code_stream(region=n.Region(top, left, top + h, left + w))
                dec.decode(cs, params=params)

            cases.append(("nvimgcodec-cpu whole", "-", each(lambda k: region(k, False))))
            cases.append(("nvimgcodec-cpu crop region", "train", each(lambda k: region(k, True))))
        record.interleaved("cpu_profile", cases, per=len(jpeg))
    finally:
        torch.set_num_threads(threads)


def cpu_quality(files: list[Path], indices: list[list[int]], args, record: Recorder) -> None:
    """How far the CPU decodes' pixels lie from today's training input. The same batches (one
    seed, so the same crop boxes) through the simplejpeg path against the Pillow path and against
    the GPU path's float reference (`resized_crops_loop` of torchvision's whole decode); and the
    decodes left out of the CPU path (fast DCT + fast upsampling, nvImageCodec's region decode)
    against simplejpeg's accurate whole decode. Rows: stage cpu_quality, the mean absolute
    difference in levels (0-255) over all pixels, the worst image's mean, and the largest."""
    import numpy as np

    labels, rows = [0] * len(files), []

    def compare(method: str, mode: str, pairs) -> None:
        means, worst = [], 0
        for a, b in pairs:
            d = (a.int() - b.int()).abs()
            means.append(d.float().mean().item())
            worst = max(worst, int(d.max()))
        rows.append((method, mode, len(means), statistics.mean(means), max(means), worst))

    def batches(backend: str, train: bool):
        if backend == "reference":
            sizes = [[tuple(decode_rgb(read_encoded(files[i]), files[i]).shape[1:]) for i in idx] for idx in indices]
        out = []
        torch.manual_seed(0)  # the decoders seed their boxes from it: the same boxes on every path
        for b, idx in enumerate(indices):
            if backend == "reference":
                gen = CpuDecodedFolder(files, labels, args.size, train=train).generator(idx)
                boxes = draw_crop_boxes(torch.tensor(sizes[b]), train, gen)
                images = [decode_rgb(read_encoded(files[i]), files[i]) for i in idx]
                out.append(resized_crops_loop(images, boxes, args.size))
            else:
                out.append(CpuDecodedFolder(files, labels, args.size, train=train, backend=backend)[idx][0])
        return [img for x in out for img in x]

    sj = simplejpeg_module()
    for train, mode in ((True, "train"), (False, "eval")):
        ref, pil = batches("reference", train), batches("pillow", train)
        compare("pillow path vs float reference", mode, zip(pil, ref))
        if sj is not None:
            turbo = batches("simplejpeg", train)
            compare("simplejpeg path vs float reference", mode, zip(turbo, ref))
            compare("simplejpeg path vs pillow path", mode, zip(turbo, pil))
    if sj is not None:
        raws = [bytes(read_encoded(f).numpy()) for f in files if read_jpeg_header(f.read_bytes()) is not None]
        accurate = [torch.from_numpy(sj.decode_jpeg(r)) for r in raws]
        tv = (decode_rgb(torch.frombuffer(bytearray(r), dtype=torch.uint8), "-").permute(1, 2, 0) for r in raws)
        compare("simplejpeg whole vs torchvision whole", "-", zip(accurate, tv))
        fast = (torch.from_numpy(sj.decode_jpeg(r, fastdct=True, fastupsample=True)) for r in raws)
        compare("simplejpeg fastdct+ups vs accurate", "-", zip(fast, accurate))
        if nvimgcodec_available():
            from nvidia import nvimgcodec as n

            dec = n.Decoder(device_id=n.NVIMGCODEC_DEVICE_CPU_ONLY, backends=[n.Backend(n.BackendKind.CPU_ONLY)])
            params = n.DecodeParams(color_spec=n.ColorSpec.SRGB, sample_format=n.I_RGB, apply_exif_orientation=False)
            boxes = draw_crop_boxes(
                torch.tensor([a.shape[:2] for a in accurate]), True, torch.Generator().manual_seed(0)
            )
            pairs = []
            for r, a, (top, left, h, w) in zip(raws, accurate, boxes.tolist()):
                cs = n.CodeStream(np.frombuffer(r, np.uint8)).get_sub_code_stream(
                    region=n.Region(top, left, top + h, left + w)
                )
                pairs.append(
                    (torch.from_numpy(np.array(dec.decode(cs, params=params))), a[top : top + h, left : left + w])
                )
            compare("nvimgcodec-cpu region vs simplejpeg crop", "train", pairs)
    for method, mode, n_img, mean, worst_mean, worst in rows:
        record.rows.append(
            {
                "stage": "cpu_quality",
                "method": method,
                "mode": mode,
                "batch_size": args.batch_size,
                "size": args.size,
                "files": record.files,
                "images": n_img,
                "mean_abs_diff": round(mean, 4),
                "worst_image_mean_abs_diff": round(worst_mean, 4),
                "max_abs_diff": worst,
                **record.facts,
            }
        )
        print(f"cpu_quality  {method:42s} {mode:5s} mean {mean:.3f}  worst image {worst_mean:.3f}  max {worst}")


def pillow_whole(raw) -> None:
    from PIL import Image

    with Image.open(io.BytesIO(raw)) as im:
        im.load()


if __name__ == "__main__":
    sys.exit(main_saying_user_errors(main, "jpeg_decode"))  # a folder without images: one line, exit 2
