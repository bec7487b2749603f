"""Where the time of the GPU JPEG path goes, per batch: decode alone, crop+resize alone (the old
per-image loop against the batched kernels), and the whole `GpuDecoder` call.

Reads an image folder once into encoded batches (as the DataLoader workers would hand them over,
headers read), first checks which files torchvision's `decode_jpeg` refuses on the device when
decoded alone, then times each stage on batches cycled from the folder: warm-up first, then
`--repeats` timed runs, median reported. Two times per row: `host_s`, until the call returns
(what the Python thread spends, launches included), and `total_s`, until the device is idle
(torch.cuda.synchronize; equal to host_s on the CPU). Rows go to
benchmarks/results/jpeg_decode_<device type>.csv with environment facts.

    python benchmarks/jpeg_decode.py --folder .devdata/imagenet_sample --device cpu --batch-size 64
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout, not whichever cnnpar is installed

import torch  # noqa: E402

from cnnpar.data.crop_resize import draw_crop_boxes, resized_crops, resized_crops_loop  # noqa: E402
from cnnpar.data.gpu_decode import (  # noqa: E402
    EncodedFolderDataset,
    GpuDecoder,
    collate_encoded,
    nvjpeg_decode,
)
from cnnpar.data.nvimgcodec_decode import nvimgcodec_available  # noqa: E402
from cnnpar.report.environment import environment  # noqa: E402
from cnnpar.report.files import write_csv_atomic  # noqa: E402
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folder", type=Path, required=True, help="image folder (searched recursively)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--size", type=int, default=224, help="output side in pixels")
    ap.add_argument("--batches", type=int, default=2, help="distinct batches (files cycled if too few)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--profile", action="store_true", help="also print a torch.profiler table of one decoder call")
    ap.add_argument(
        "--out", type=Path, default=None, help="CSV path (default benchmarks/results/jpeg_decode_<device>.csv)"
    )
    args = ap.parse_args()
    warnings.filterwarnings("ignore", category=DeprecationWarning)  # torchvision 0.29's codec notice
    device = torch.device(args.device)
    files = sorted(p for p in args.folder.rglob("*") if p.suffix.lower() in SUFFIXES)
    if not files:
        sys.exit(f"{args.folder}: no .jpg/.jpeg/.png files found")
    print(f"{len(files)} files under {args.folder}, device {device}, batch {args.batch_size}, size {args.size}")

    bad = failing_files(files, device)
    print(f"decode_jpeg on {device.type} refuses {len(bad)} of {len(files)} files alone")
    for f, why in bad:
        print(f"  {f}: {why}")

    ds = EncodedFolderDataset(files, [0] * len(files), args.size)
    items = [ds[i] for i in range(len(files))]
    batches = []
    for b in range(args.batches):
        idx = [(b * args.batch_size + k) % len(items) for k in range(args.batch_size)]
        batches.append(collate_encoded([items[i] for i in idx])[0])
    gpu_ok = sum(bool(x) for x in torch.cat([b.nvjpeg_ok for b in batches]).tolist())
    print(f"header check: {gpu_ok} of {args.batches * args.batch_size} images go to the batched decode")

    rows = []

    def record(stage: str, method: str, mode: str, fn) -> None:
        per_batch = [timed(lambda b=b: fn(b), device, args.repeats) for b in range(len(batches))]
        host = statistics.median(h for h, _ in per_batch)
        total = statistics.median(t for _, t in per_batch)
        rows.append(
            {
                "stage": stage,
                "method": method,
                "mode": mode,
                "batch_size": args.batch_size,
                "size": args.size,
                "host_s": round(host, 6),
                "total_s": round(total, 6),
                "images_per_s": round(args.batch_size / total, 1),
                "batches": len(batches),
                "repeats": args.repeats,
                "files": len(files),
                "files_refused_alone": len(bad),
                "torch_threads": torch.get_num_threads(),
                "load_avg_1m": round(os.getloadavg()[0], 2),  # the host is shared: context for CPU rows
            }
        )
        print(
            f"{stage:12s} {method:8s} {mode:5s} host {host * 1e3:8.1f} ms  total {total * 1e3:8.1f} ms  "
            f"{args.batch_size / total:8.0f} img/s"
        )

    backends = ["nvjpeg"] + (["nvimgcodec"] if nvimgcodec_available() else [])
    print(f"GPU decode backends here: {', '.join(backends)}")
    tensors = [batches[0].data, batches[-1].data]
    from torchvision.io import ImageReadMode, decode_jpeg

    # torchvision's batched call alone, as the reference measurement called it (no header check,
    # no private stream): what any wrapper around it should approach
    record("decode", "torchvision", "raw", lambda b: decode_jpeg(tensors[b % 2], mode=ImageReadMode.RGB, device=device))
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
        for method, resize in (("loop", resized_crops_loop), ("batched", resized_crops)):
            record("crop_resize", method, mode, lambda b, f=resize, bx=boxes: f(images[b], bx[b], args.size))
    images.clear()  # free the decoded batches before the whole-call rows
    for backend in backends:
        for resize in ("loop", "batched") if backend == "nvjpeg" else ("batched",):
            for mode in ("train", "eval"):
                dec = GpuDecoder(files, args.size, device, train=mode == "train", resize=resize, backend=backend)
                record("gpu_decoder", f"{backend}/{resize}", mode, lambda b, d=dec: d(batches[b]))

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

    env = environment(device, 1)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = args.out or RESULTS / f"jpeg_decode_{device.type}.csv"
    write_csv_atomic(out, [{**r, "folder": args.folder.name, **env} for r in rows])
    print(f"-> {out}")


if __name__ == "__main__":
    main()
