"""Does every tool time the step `cnnpar train` runs? One config, one device, one process, three timers:

  train    `Trainer.train_epoch` (what `cnnpar train` and `cnnpar tune` time): a warm-up epoch,
           then the median images/s of --repeats epochs (of --steps steps each), data included
  bench    `cnnpar bench`'s timer (ladder rungs and claims: `bench.measure.measure_steps`), data included
  doctor   `cnnpar doctor`'s "train step alone": one batch already on the device, repeated

All three drive the Trainer's one `TrainStep`; each row says whether that step replayed a CUDA
graph, read from the step itself. Agreement within a few per cent (the doctor's figure has no data
loading in it, so it may read a little higher) is the point of issue 15 item 1; before it, the
bench and the doctor timed an eager step while training replayed a graph.

    python benchmarks/one_step.py          # ResNet-18 32px b512 (bf16, channels_last), compile off and default
    python benchmarks/one_step.py --device cpu --model cnn3 --image-size 16 --batch-size 32 \
        --steps 5 --repeats 2 --compile off

Through the device tool, write into $OUT so the rows come back:
    python3 benchmarks/one_step.py --out $OUT/one_step_h200.csv
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, not an installed cnnpar

from cnnpar.bench.measure import measure_steps  # noqa: E402
from cnnpar.bench.timing import Timing  # noqa: E402
from cnnpar.config import Config, DataConfig, ModelConfig, RunConfig, SpeedConfig  # noqa: E402
from cnnpar.data import load_data  # noqa: E402
from cnnpar.dist import DistInfo  # noqa: E402
from cnnpar.doctor.measure import first_batch, measure_step  # noqa: E402
from cnnpar.engine.harness import build_trainer, reset_compiler  # noqa: E402
from cnnpar.errors import main_saying_user_errors  # noqa: E402
from cnnpar.report.environment import environment  # noqa: E402
from cnnpar.report.files import write_csv_atomic  # noqa: E402
from cnnpar.report.meters import free_device_memory  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    p.add_argument("--model", default="resnet18")
    p.add_argument("--data", default="synthetic", help="synthetic, or a data file such as cifar10.npz")
    p.add_argument("--image-size", type=int, default=32, help="synthetic data: side of the 3xSxS images")
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--compile", default="off,default", help="comma-separated compile modes, one set of rows each")
    p.add_argument("--cuda-graphs", default="auto", choices=("auto", "on", "off"))
    p.add_argument("--steps", type=int, default=50, help="timed steps per repeat (and per training epoch)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=5, help="untimed steps before the bench and doctor timers")
    p.add_argument("--out", default="", help="CSV path (default benchmarks/results/one_step_<device>.csv)")
    return p.parse_args(argv)


def config(args, compile_mode: str) -> Config:
    """An epoch is exactly --steps steps (synthetic data of steps x batch samples, nothing held out),
    so the bench timer, which crosses epoch boundaries as training does, pays the same per-epoch
    start-up (a new permutation, the loader's iterator) per step as the training epochs do."""
    s = args.image_size
    data = DataConfig(source=args.data, augment="crop+flip", val_fraction=0.0)
    if args.data == "synthetic":
        n = args.steps * args.batch_size
        data = DataConfig(source="synthetic", image_shape=f"3x{s}x{s}", augment="crop+flip", synthetic_samples=n,
                          val_fraction=0.0)  # fmt: skip
    return Config(
        data=data,
        model=ModelConfig(name=args.model),
        speed=SpeedConfig(device=args.device, compile=compile_mode, cuda_graphs=args.cuda_graphs),
        run=RunConfig(epochs=args.repeats + 1, batch_size=args.batch_size, progress=False, out_dir="/tmp"),
    )


def time_train(cfg, info, bundle, args) -> tuple[float, bool]:
    trainer = build_trainer(cfg, info, bundle)
    trainer.warm_up_compile()
    trainer.train_epoch(1)  # warm-up: cuDNN autotuning, graph capture
    rates = [trainer.train_epoch(e)["images_per_s"] for e in range(2, args.repeats + 2)]
    return statistics.median(rates), trainer.train_step.graphed


def time_bench(cfg, info, bundle, args) -> tuple[float, bool]:
    trainer = build_trainer(cfg, info, bundle)
    trainer.warm_up_compile()
    out = measure_steps(trainer, Timing(args.warmup, args.steps, args.repeats))
    return out["images_per_s"], trainer.train_step.graphed


def time_doctor(cfg, info, bundle, args) -> tuple[float, bool]:
    trainer = build_trainer(cfg, info, bundle)
    trainer.warm_up_compile()
    x, y = first_batch(trainer)
    measure_step(trainer, x, y, args.warmup, 0, 1e9)  # warm-up only
    rates = [measure_step(trainer, x, y, 0, args.steps, 1e9).images_per_s for _ in range(args.repeats)]
    return statistics.median(rates), trainer.train_step.graphed


TIMERS = {"train": time_train, "bench": time_bench, "doctor": time_doctor}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    info = DistInfo(0, 0, 1, torch.device(args.device))
    env = environment(info.device, 1)
    rows = []
    for mode in [m.strip() for m in args.compile.split(",") if m.strip()]:
        cfg = config(args, mode)
        bundle = load_data(cfg.data, cfg.run.seed)
        if args.data != "synthetic":  # a file's epoch is its whole training split
            args.steps = len(bundle.train) // args.batch_size
            print(f"{args.data}: {args.steps} steps an epoch", flush=True)
        for tool, timer in TIMERS.items():
            reset_compiler()
            t0 = time.perf_counter()
            row = {"tool": tool, "compile": mode, "cuda_graphs_requested": args.cuda_graphs}
            try:
                ips, graphed = timer(cfg, info, bundle, args)
                row.update(images_per_s=round(ips, 1), step="cuda-graphed" if graphed else "eager", status="ok")
            except Exception as e:  # one failing timer (out of memory, say) must not lose the others' rows
                row.update(status="failed", error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
            row.update(
                wall_s=round(time.perf_counter() - t0, 1),
                model=args.model,
                data=bundle.origin,
                image_shape="x".join(map(str, bundle.shape)),
                batch_size=args.batch_size,
                steps=args.steps,
                repeats=args.repeats,
                **env,
            )
            rows.append(row)
            print({k: row.get(k) for k in ("tool", "compile", "images_per_s", "step", "status", "error", "wall_s")},
                  flush=True)  # fmt: skip
            free_device_memory(info.device)
        ok = [r for r in rows if r["compile"] == mode and r["status"] == "ok"]
        if len(ok) >= 2:
            lo, hi = min(r["images_per_s"] for r in ok), max(r["images_per_s"] for r in ok)
            kinds = sorted({r["step"] for r in ok})
            print(f"compile {mode}: timers within {100 * (hi / lo - 1):.1f} % of each other; step {', '.join(kinds)}")
    out = Path(args.out) if args.out else Path(__file__).parent / "results" / f"one_step_{args.device}.csv"
    write_csv_atomic(out, rows)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main_saying_user_errors(main, "one_step"))  # a missing --data: one line, exit 2
