"""What decoding PNGs with Pillow costs against torchvision, per image, and whether the pixels are the same.

`folder.decode_rgb` decodes PNGs with Pillow (`folder.decode_png`): torchvision 0.29's PNG decoder kills the
process on a damaged zlib stream. Three ways are timed on every file, in turn, so that a shared host's changing
load falls on each alike (one thread, one process: what a DataLoader worker does):

- `torchvision`: what decode_rgb did before (its header checks, then `decode_image(bytes, RGB)`);
- `pillow`: what decode_rgb does now;
- `zlib_check`: the alternative not taken, inflating the IDAT chunks with `zlib.decompressobj` to find damage
  before torchvision sees the file (only the check: torchvision's decode would come on top).

A row per way: the median and mean ms per image over every file and round, and its median ratio to `torchvision`
on the same file; the `pillow` row also counts the files whose pixels differ from torchvision's (0 expected).
`--from-jpegs DIR` first writes each JPEG under DIR as an RGB PNG (Pillow's default compression) to `--pngs`:

    python benchmarks/png_decode.py --from-jpegs .devdata/imagenet_sample --pngs /tmp/imagenet_png \
        --rounds 3 --out benchmarks/results/png_decode_cpu.csv
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import sys
import time
import warnings
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout, not whichever cnnpar is installed

import torch  # noqa: E402

from cnnpar.data.folder import _check_header_pixels, decode_rgb, read_encoded  # noqa: E402
from cnnpar.data.png_header import read_png_header  # noqa: E402
from cnnpar.data.tv_codecs import TV_CODEC_DEPRECATION  # noqa: E402
from cnnpar.errors import UserError, main_saying_user_errors, refuse_counts_under_one  # noqa: E402
from cnnpar.report.environment import environment  # noqa: E402
from cnnpar.report.files import write_csv_atomic  # noqa: E402

_CHUNK_HEAD = struct.Struct(">I4s")


def torchvision_rgb(data: torch.Tensor) -> torch.Tensor:
    """decode_rgb as it was for PNGs: the header checks, then torchvision (16-bit: the top 8 bits)."""
    from torchvision.io import ImageReadMode, decode_image

    _check_header_pixels(data, "x")
    img = decode_image(data, mode=ImageReadMode.RGB)
    return img if img.dtype == torch.uint8 else (img.to(torch.int32) >> 8).to(torch.uint8)


def zlib_check(data: torch.Tensor) -> int:
    """The bytes a PNG's IDAT chunks inflate to, 1 MB of output at a time (zlib.error where the stream is damaged)."""
    raw, i, inflater, out = memoryview(data.numpy()), 8, zlib.decompressobj(), 0
    while i + 8 <= len(raw):
        length, kind = _CHUNK_HEAD.unpack_from(raw, i)
        if kind == b"IEND":
            break
        part = raw[i + 8 : i + 8 + length] if kind == b"IDAT" else b""
        while part:
            out += len(inflater.decompress(part, 1 << 20))
            part = inflater.unconsumed_tail
        i += 12 + length
    return out


def write_pngs(jpegs: Path, out: Path) -> None:
    from PIL import Image

    out.mkdir(parents=True, exist_ok=True)
    for k, path in enumerate(sorted(p for p in jpegs.rglob("*") if p.suffix.lower() in {".jpg", ".jpeg"})):
        with Image.open(path) as im:
            im.convert("RGB").save(out / f"{k:05d}.png")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pngs", type=Path, required=True, help="a folder of PNGs (written first with --from-jpegs)")
    ap.add_argument("--from-jpegs", type=Path, default=None, metavar="DIR", help="write DIR's JPEGs as PNGs first")
    ap.add_argument("--rounds", type=int, default=3, help="timed passes over every file (default: 3)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "png_decode_cpu.csv")
    args = ap.parse_args()
    refuse_counts_under_one(("--rounds", args.rounds))  # no timed pass had no median (a StatisticsError traceback)
    if args.from_jpegs is not None and not args.from_jpegs.is_dir():  # it wrote no PNG, then said --pngs had none
        raise UserError(f"--from-jpegs {args.from_jpegs}: no such folder (expected a folder of JPEGs)")
    warnings.filterwarnings("ignore", message=TV_CODEC_DEPRECATION, category=DeprecationWarning)
    torch.set_num_threads(1)
    if args.from_jpegs is not None:
        write_pngs(args.from_jpegs, args.pngs)
    files = sorted(args.pngs.rglob("*.png"))
    if not files:
        raise UserError(f"--pngs {args.pngs}: no .png files")
    datas = [read_encoded(p) for p in files]
    headers = [read_png_header(memoryview(d.numpy())) for d in datas]
    ways = {"torchvision": torchvision_rgb, "pillow": lambda d: decode_rgb(d, "x"), "zlib_check": zlib_check}
    differ = sum(not torch.equal(torchvision_rgb(d), decode_rgb(d, "x")) for d in datas)  # the warm-up pass too
    times: dict[str, list[float]] = {w: [] for w in ways}
    for _ in range(args.rounds):
        for d in datas:
            for way, fn in ways.items():
                t = time.perf_counter()
                fn(d)
                times[way].append(time.perf_counter() - t)
    facts = {
        "files": len(files),
        "rounds": args.rounds,
        "mean_megapixels": round(statistics.mean(h.height * h.width for h in headers) / 1e6, 3),
        "mean_file_kb": round(statistics.mean(d.numel() for d in datas) / 1e3, 1),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        **environment(torch.device("cpu")),
    }
    rows = []
    for way, ts in times.items():
        ratio = statistics.median(t / b for t, b in zip(ts, times["torchvision"], strict=True))
        rows.append(
            {
                "way": way,
                "median_ms": round(statistics.median(ts) * 1e3, 3),
                "mean_ms": round(statistics.mean(ts) * 1e3, 3),
                "median_ratio_to_torchvision": round(ratio, 3),
                "files_with_other_pixels": differ if way == "pillow" else "",
                **facts,
            }
        )
        print(f"{way:12s} {rows[-1]['median_ms']:7.3f} ms median, x{ratio:.2f} of torchvision's")
    print(f"pillow: {differ} of {len(files)} files decode to pixels other than torchvision's")
    write_csv_atomic(args.out, rows)
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main_saying_user_errors(main, "png_decode"))  # a folder without PNGs: one line, exit 2
