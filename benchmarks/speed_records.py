"""Issue 8's targets measured side by side on one GPU, in one process per part.

Parts (choose with --parts):
  jpeg      ResNet-50 224x224, bf16, end to end from a JPEG image folder (random-resized crop +
            flip): the decoder `--decode auto` chooses (the JPEG engines on an H100/H200), then
            nvImageCodec (where installed), torchvision's nvJPEG and CPU decoding in worker processes,
            and the same photos from a `cnnpar prepare` store (--store).
  cifar     ResNet-18 32x32 on CIFAR-10, whole-epoch throughput including data (resident uint8 set,
            crop+flip on the device): CUDA graphs off and on.
  speedrun  cnnpar's cifar10-speed preset over several seeds (time to train, accuracy with flip
            test-time augmentation), and, if the `airbench` package from PyPI is importable, its
            train94 in the same process on the same data, for a side-by-side record.

Every row carries the GPU, torch version, git revision and the settings. Figures are printed and
written to --out; nothing is typed in by hand.

    python benchmarks/speed_records.py --parts jpeg,cifar,speedrun --folder .devdata/imagenet_rep \
        --cifar .devdata/cifar10.npz --out benchmarks/results/speed_records.csv
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cnnpar.config import Config, DataConfig, ModelConfig, OptimConfig, RunConfig, SpeedConfig  # noqa: E402
from cnnpar.data import load_data  # noqa: E402
from cnnpar.dist import DistInfo  # noqa: E402
from cnnpar.engine.trainer import Trainer  # noqa: E402
from cnnpar.errors import UserError, main_saying_user_errors, refuse_counts_under_one  # noqa: E402
from cnnpar.presets import cifar10_speed  # noqa: E402
from cnnpar.report.environment import environment  # noqa: E402
from cnnpar.report.files import write_csv_atomic  # noqa: E402

QUIET = {"log": lambda *a, **k: None}


def throughput(cfg: Config, info: DistInfo, epochs: int, bundle=None) -> dict:
    """Warm-up epoch (compile, autotuning), then the median images/s of `epochs` whole epochs."""
    t0 = time.perf_counter()
    tr = Trainer(cfg, info, bundle=bundle, **QUIET)
    tr.warm_up_compile()
    tr.train_epoch(1)
    warm = time.perf_counter() - t0
    rows = [tr.train_epoch(e) for e in range(2, epochs + 2)]
    rates = [r["images_per_s"] for r in rows]
    return {
        "images_per_s": round(statistics.median(rates), 1),
        "data_wait_share": round(statistics.median(r["data_wait_share"] for r in rows), 3),
        "warmup_s": round(warm, 1),
        "resolved": f"{tr.cfg.speed.precision} cl={tr.cfg.speed.channels_last} compile={tr.cfg.speed.compile} "
        f"graphs={'on' if tr.use_graphs else 'off'} decode={tr.cfg.data.decode} workers={tr.cfg.data.workers}",
    }


def jpeg_variants(args) -> list[tuple[str, str, str, int]]:
    """(label, --data, --decode, --workers) of each way cnnpar reads the photos that this machine
    has: first the decoder a user gets without --decode (`auto`: the JPEG engines where the GPU has
    them; the row's `resolved` names it), then each one asked for by name. The store's workers are
    cnnpar's own choice: none when its pixels sit on the GPU."""
    from cnnpar.data.nvimgcodec_decode import nvimgcodec_available

    variants = [("default", args.folder, "auto", args.workers)]
    variants += [("nvimgcodec", args.folder, "nvimgcodec", args.workers)] if nvimgcodec_available() else []
    variants += [("nvjpeg", args.folder, "gpu", args.workers), ("cpu", args.folder, "cpu", args.workers)]
    if args.store and Path(args.store).exists():
        variants.append(("store", args.store, "auto", -1))
    return variants


def part_jpeg(args, info) -> list[dict]:
    rows = []
    for label, source, decode, workers in jpeg_variants(args):
        cfg = Config(
            data=DataConfig(source=source, image_size=224, decode=decode, val_fraction=0.0, workers=workers),
            model=ModelConfig(name="resnet50"),
            optim=OptimConfig(optimizer="sgd", lr=0.1),
            speed=SpeedConfig(device="cuda", precision="bf16", channels_last="on", compile=args.jpeg_compile),
            run=RunConfig(epochs=3, batch_size=256, progress=False, out_dir="/tmp/cnnpar-sr"),
        )
        variant = f"resnet50 224 {label}: --data {Path(source).name} --decode {decode} --workers {workers}"
        try:
            res = throughput(cfg, info, epochs=2)
            rows.append({"part": "jpeg", "variant": variant, **res, "status": "ok"})
        except Exception as e:
            rows.append({"part": "jpeg", "variant": variant, "status": "failed", "error": repr(e)[:300]})
        print(rows[-1], flush=True)
        torch._dynamo.reset()
    return rows


def part_cifar(args, info) -> list[dict]:
    rows = []
    base = Config(
        data=DataConfig(source=args.cifar, augment="crop+flip", resident="on"),
        model=ModelConfig(name="resnet18"),
        optim=OptimConfig(optimizer="sgd", lr=0.2, label_smoothing=0.1),
        speed=SpeedConfig(device="cuda", precision="bf16", channels_last="on", compile="off"),
        run=RunConfig(epochs=4, batch_size=512, progress=False, out_dir="/tmp/cnnpar-sr"),
    )
    bundle = load_data(base.data, 0)
    for graphs in ("off", "on"):
        cfg = replace(base, speed=replace(base.speed, cuda_graphs=graphs))
        try:
            res = throughput(cfg, info, epochs=3, bundle=bundle)
            rows.append({"part": "cifar", "variant": f"resnet18 32 cifar10 graphs={graphs}", **res, "status": "ok"})
        except Exception as e:
            rows.append({"part": "cifar", "variant": f"graphs={graphs}", "status": "failed", "error": repr(e)[:300]})
        print(rows[-1], flush=True)
    return rows


def part_speedrun(args, info) -> list[dict]:
    rows = []
    base = cifar10_speed()
    base = replace(
        base,
        data=replace(base.data, source=args.cifar),
        speed=replace(base.speed, device="cuda", cuda_graphs=args.graphs, compile=args.speed_compile),
        run=replace(base.run, progress=False, out_dir="/tmp/cnnpar-sr", epochs=args.speed_epochs),
    )
    bundle = load_data(base.data, 0)
    for seed in range(args.seeds):
        cfg = replace(base, run=replace(base.run, seed=seed, name=f"speed-{seed}-{time.time_ns()}"))
        tr = Trainer(cfg, info, bundle=bundle, **QUIET)
        tr.warm_up_compile()
        train_s = 0.0
        for epoch in range(1, cfg.run.epochs + 1):
            train_s += tr.train_epoch(epoch)["epoch_s"]
        t0 = time.perf_counter()
        acc = tr.evaluate()["val_acc"]
        eval_s = time.perf_counter() - t0
        rows.append(
            {
                "part": "speedrun",
                "variant": f"cnnpar cifar10-speed seed={seed} epochs={cfg.run.epochs}",
                "train_s": round(train_s, 3),
                "eval_s": round(eval_s, 3),
                "val_acc": round(acc, 4),
                "warmup_s": round(tr.compile_s, 1),
                "status": "ok",
            }
        )
        print(rows[-1], flush=True)
    try:
        import airbench
    except ImportError:
        rows.append({"part": "speedrun", "variant": "airbench94 (PyPI)", "status": "skipped", "error": "not installed"})
        return rows
    loader = airbench.CifarLoader(
        args.airbench_data, train=True, batch_size=1024, aug={"flip": True, "translate": 2}, altflip=True
    )
    test_loader = airbench.CifarLoader(args.airbench_data, train=False, batch_size=2000)
    airbench.warmup94(train_loader=loader, verbose=False)
    for run in range(args.seeds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model = airbench.train94(train_loader=loader, run=run, verbose=False)
        torch.cuda.synchronize()
        train_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        acc = airbench.evaluate(model, test_loader, tta_level=2)  # its own flip+translate test-time augmentation
        rows.append(
            {
                "part": "speedrun",
                "variant": f"airbench94 (PyPI airbench) run={run}",
                "train_s": round(train_s, 3),
                "eval_s": round(time.perf_counter() - t0, 3),
                "val_acc": round(float(acc), 4),
                "status": "ok",
            }
        )
        print(rows[-1], flush=True)
    return rows


def check_inputs(args, parts: dict) -> list[str]:
    """The parts to run, each known and its input there, before CUDA starts. Each part catches its own
    failure so that the others' figures stay: an unknown part or a missing folder was a "failed" row, exit 0, and
    a --store that was not there was left out of the jpeg part without a word."""
    names = args.parts.split(",")
    for name in names:
        if name not in parts:
            raise UserError(f"--parts {args.parts}: {name!r} is not one of {', '.join(parts)}")
    wanted = {"--folder": args.folder, "--store": args.store} if "jpeg" in names else {}
    if {"cifar", "speedrun"} & set(names):
        wanted["--cifar"] = args.cifar
    for flag, path in wanted.items():
        if path and not Path(path).exists():
            raise UserError(f"{flag} {path}: no such file or folder")
    refuse_counts_under_one(("--seeds", args.seeds))
    return names


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="jpeg,cifar,speedrun")
    ap.add_argument("--folder", default=".devdata/imagenet_rep")
    ap.add_argument("--store", default="", help="a `cnnpar prepare` store of --folder, for the jpeg part")
    ap.add_argument("--workers", type=int, default=14)
    ap.add_argument("--jpeg-compile", default="default", help="compile mode of the JPEG part's ResNet-50")
    ap.add_argument("--cifar", default=".devdata/cifar10.npz")
    ap.add_argument("--airbench-data", default=".devdata/cifar10")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--speed-epochs", type=int, default=10)
    ap.add_argument("--speed-compile", default="off")
    ap.add_argument("--graphs", default="on")
    ap.add_argument("--out", default="benchmarks/results/speed_records.csv")
    args = ap.parse_args()
    parts = {"jpeg": part_jpeg, "cifar": part_cifar, "speedrun": part_speedrun}
    names = check_inputs(args, parts)
    info = DistInfo(0, 0, 1, torch.device("cuda", 0))
    torch.cuda.set_device(info.device)
    env = environment(info.device)
    rows = []
    for name in names:
        try:
            rows += parts[name](args, info)
        except Exception as e:  # one part failing leaves the others' figures
            rows.append({"part": name, "status": "failed", "error": repr(e)[:300]})
            print(rows[-1], flush=True)
    for r in rows:
        r.update({k: env[k] for k in ("device", "driver", "torch", "world_size", "git_rev", "date")})
    write_csv_atomic(args.out, rows)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main_saying_user_errors(main, "speed_records"))  # a missing input: one line, exit 2
