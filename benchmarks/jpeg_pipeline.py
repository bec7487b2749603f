"""Where the JPEG-folder pipeline's time goes on a GPU: the loader alone (read, decode, crop, resize,
flip; no step) against whole epochs of ResNet-50 with the same settings, for a few variants
(decoder, worker count, the share of each batch the workers decode on the CPU beside a GPU decoder;
the decode thread's stream priority was a variant of an earlier run).

If the loader alone runs far faster than the epochs, the two compete (for the GPU, the GIL or
the cores); if it runs at the epochs' pace, the loader itself is the limit. Rows go to --out with
environment facts; nothing is typed in by hand.

    python benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep --out jpeg_pipeline.csv
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gil_profile import GilProfile  # noqa: E402  (beside this script)

from cnnpar.config import Config, DataConfig, ModelConfig, OptimConfig, RunConfig, SpeedConfig  # noqa: E402
from cnnpar.data import (  # noqa: E402
    byte_slots,
    crop_resize,
    load_data,
    nvjpeg_hw,  # noqa: E402
)
from cnnpar.data.loader import DeviceFeeder  # noqa: E402
from cnnpar.data.nvimgcodec_decode import NvImageCodecDecode  # noqa: E402
from cnnpar.data.nvjpeg_hw import EngineSettings  # noqa: E402
from cnnpar.dist import DEVICE_QUEUES_ENV, DistInfo, widen_device_queues  # noqa: E402
from cnnpar.engine.trainer import Trainer  # noqa: E402
from cnnpar.errors import UserError, main_saying_user_errors  # noqa: E402
from cnnpar.parallel import streams  # noqa: E402
from cnnpar.report.environment import environment  # noqa: E402
from cnnpar.report.files import write_csv_atomic  # noqa: E402
from cnnpar.report.meters import sync  # noqa: E402
from cnnpar.report.profiler import every_thread  # noqa: E402

# each knob and the values it takes (None: any number); a knob removed since, or a value out of its set,
# must stop the run before it starts, not run the plain variant under a label that says otherwise
VARIANT_KEYS = {
    "threads": None,
    "pipe": {"0", "1"},
    "switch": None,
    "graphs": {"auto", "on", "off"},
    "prio": None,
    "cpp": {"0", "1"},
    "trace": {"0", "1"},
    "batch": None,
    "kernel": set(crop_resize.KERNELS),
    "prepare": {"0", "1"},
    "gil": {"0", "1", "native"},
    "stream": {"own", "legacy"},
    "slots": {"0", "1", "locked"},  # locked: the slots page-locked (byte_slots.PAGE_LOCK)
    "stem": {"auto", "on", "off"},
    "hw": EngineSettings.parse,  # how the JPEG engines are driven, e.g. hw=bits=device+out=rgb+pools=1
}


def parse_variant(spec: str) -> tuple[list[str], dict[str, str]]:
    """`decode:workers:cpu_share[:key=value...]` -> ([decode, workers, cpu_share], {key: value})."""
    head, extra = spec.split(":")[:3], spec.split(":")[3:]
    if len(head) < 3:
        raise UserError(f"--variants {spec}: expected decode:workers:cpu_share[:key=value...]")
    opts = {}
    for kv in extra:
        key, eq, value = kv.partition("=")
        if not eq or key not in VARIANT_KEYS:
            raise UserError(f"--variants {spec}: {kv!r} is not one of {', '.join(k + '=' for k in VARIANT_KEYS)}")
        allowed = VARIANT_KEYS[key]
        if callable(allowed):
            try:
                allowed(value)
            except ValueError as e:
                raise UserError(f"--variants {spec}: {key}={value}: {e}") from None
        elif allowed is not None and value not in allowed:
            raise UserError(f"--variants {spec}: {key}={value}, expected one of {', '.join(sorted(allowed))}")
        if allowed is None:
            try:
                float(value)
            except ValueError:
                raise UserError(f"--variants {spec}: {key}={value}, expected a number") from None
        opts[key] = value
    return head, opts


def loader_alone(tr: Trainer) -> float:
    """Images/s of one epoch of the train loader, batches made and dropped, no step."""
    tr.train_loader.set_epoch(99)
    sync(tr.info.device)
    t0, n = time.perf_counter(), 0
    for _, y in tr.train_loader:
        n += y.shape[0]
    sync(tr.info.device)
    return n / (time.perf_counter() - t0)


def trace_epoch(tr: Trainer, epoch: int, path: Path) -> str:
    """One more epoch under torch.profiler, every thread's ops and ranges recorded (where this torch
    can), written to `path` (gzipped Chrome trace) with a summary beside it; returns the summary."""
    from torch.profiler import ProfilerActivity, profile

    from cnnpar.report import trace_reading

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if tr.info.device.type == "cuda" else [])
    names: dict[int, str] = {}
    done = threading.Event()

    def watch() -> None:  # the feeder's threads live only inside the epoch: their names, while they do
        while not done.wait(0.05):
            names.update({t.native_id: t.name for t in threading.enumerate()})

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        with every_thread() as extra, profile(activities=activities, **extra) as prof:  # the feeder's threads too
            tr.train_epoch(epoch)
    finally:
        done.set()
        watcher.join()
    raw = path.with_suffix("")  # trace.json.gz -> trace.json
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    events = trace_reading.load_events(raw)
    raw.unlink()
    text = trace_reading.report(trace_reading.summarize(events, names))
    path.with_name(path.name.replace(".json.gz", ".txt")).write_text(text + "\n")
    # the names travel with the trace, for trace_summary.py --threads later
    path.with_name(path.name.replace(".json.gz", ".threads.json")).write_text(json.dumps(names))
    return text


def step_alone(tr: Trainer, steps: int = 20) -> float:
    """Images/s of the train step on one batch already on the device, repeated: the ceiling the
    loader must keep up with (same model, precision, compile and graphs as the epochs)."""
    it = iter(tr.train_loader)
    x, y = next(it)
    batch = [(x.clone(), y.clone())]  # owned here, not a view the loader may reuse
    if hasattr(it, "close"):
        it.close()  # the decode threads stop: they must not compete with the timed steps
    for _ in range(3):
        tr.train_step(batch)
    sync(tr.info.device)
    t0 = time.perf_counter()
    for _ in range(steps):
        tr.train_step(batch)
    sync(tr.info.device)
    return steps * y.shape[0] / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folder", default=".devdata/imagenet_rep")
    ap.add_argument(
        "--variants",
        default="gpu:14:0,gpu:14:0.3,gpu:14:0.5,cpu:14:0",
        help="decode:workers:cpu_share[:threads=N][:pipe=0|1][:switch=S][:graphs=G][:prio=P][:cpp=1]"
        "[:trace=1][:batch=N][:kernel=K], ... (threads: nvImageCodec's host threads, 0 = one per core; "
        "pipe: decode and resize in two threads or one; "
        "switch: the GIL's switch interval in seconds, Python's default 0.005; "
        "graphs: --cuda-graphs for this variant; stem: --stem-space-to-depth; "
        "prio: the feeder threads' CUDA stream priority, -1 high; cpp: "
        "inductor's C++ wrapper launches the step's kernels; trace: one more epoch under torch.profiler, "
        "its trace and summary beside --out; batch: this variant's batch size instead of --batch-size; "
        "kernel: the resize's, auto, fused (Triton) or matmul; prepare: 0 = each epoch's pipeline starts with "
        "the epoch, not at the end of the one before; gil: 1 = the timed epochs sampled by py-spy (who holds the GIL, "
        "in what; each thread's CPU), written beside --out (its rate is then not comparable with the others'; "
        "native: C frames too, the process paused at each sample); "
        "stream: own = the training thread on a non-blocking stream beside a GPU decoder (the default), legacy = on "
        "the legacy default stream, which nvJPEG's blocking streams synchronise with; slots: 0 = each encoded batch "
        "in a shared segment of its own, as before data/byte_slots.py, locked = the slots page-locked once the "
        "workers run; "
        "any other key is refused)",
    )
    ap.add_argument("--compile", default="default")
    ap.add_argument("--graphs", default="auto", help="CUDA graphs for the step: auto (on, one GPU), on, off")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--out", default="benchmarks/results/jpeg_pipeline.csv")
    ap.add_argument("--budget-s", type=float, default=0, help="start no variant after this many seconds (0: all)")
    ap.add_argument(
        "--watchdog-s", type=float, default=0, help="print every thread's stack and exit after this many seconds"
    )
    args = ap.parse_args()
    if not Path(args.folder).exists():  # each variant failed on it in turn, a row of "failed" each, and exit 0
        raise UserError(f"--folder {args.folder}: no such folder (expected a folder of JPEGs)")
    specs = args.variants.split(",")
    for spec in specs:  # all checked before the first one spends device time (before CUDA starts, too)
        parse_variant(spec)
    if args.watchdog_s:
        import faulthandler

        faulthandler.dump_traceback_later(args.watchdog_s, exit=True)
    # as the cnnpar command does, before CUDA starts (a CUDA_DEVICE_MAX_CONNECTIONS of the caller's is kept: 8
    # measures CUDA's default)
    widen_device_queues()
    cuda = args.device == "cuda"
    info = DistInfo(0, 0, 1, torch.device("cuda", 0) if cuda else torch.device("cpu"))
    if cuda:
        torch.cuda.set_device(info.device)
    env = environment(info.device)
    rows = []
    bundle = None
    started = time.perf_counter()
    for spec in specs:
        if args.budget_s and time.perf_counter() - started > args.budget_s:
            print(f"skipped (--budget-s {args.budget_s:g} spent): {spec}", flush=True)
            rows.append({"variant": spec, "status": "skipped: budget spent"})
            continue
        decode, workers, share, *extra = spec.split(":")
        opts = parse_variant(spec)[1]
        NvImageCodecDecode.CPU_THREADS = int(opts.get("threads", 0))
        DeviceFeeder.PIPELINE = {"0": False, "1": True}.get(opts.get("pipe", ""))  # None: the default rule
        sys.setswitchinterval(float(opts.get("switch", 0.005)))
        DeviceFeeder.STREAM_PRIORITY = int(opts.get("prio", 0))
        streams.FOR_GPU_DECODERS = opts.get("stream", "own") == "own"
        byte_slots.ENABLED = opts.get("slots", "1") != "0"
        byte_slots.PAGE_LOCK = opts.get("slots") == "locked"
        nvjpeg_hw.SETTINGS = EngineSettings.parse(opts.get("hw", ""))
        DeviceFeeder.PREPARE = opts.get("prepare", "1") == "1"  # each epoch starts the next one's pipeline
        crop_resize.KERNEL = opts.get("kernel", "auto")  # the resize: Triton's fused kernels or matrix products
        # cpp=1: inductor's C++ wrapper launches the compiled step's kernels (no Python per launch)
        torch._inductor.config.cpp_wrapper = opts.get("cpp") == "1"
        graphs = opts.pop("graphs", args.graphs)
        batch = int(opts.pop("batch", args.batch_size))
        extra = [kv for kv in extra if not kv.startswith(("graphs=", "batch="))]
        cfg = Config(
            data=DataConfig(
                source=args.folder,
                image_size=args.image_size,
                decode=decode,
                val_fraction=0.0,
                workers=int(workers),
                cpu_share=float(share),
            ),
            model=ModelConfig(name=args.model),
            optim=OptimConfig(optimizer="sgd", lr=0.1),
            speed=SpeedConfig(
                device=args.device,
                precision="auto",
                channels_last="on",
                compile=args.compile,
                cuda_graphs=graphs,
                stem_space_to_depth=opts.get("stem", "auto"),
            ),
            run=RunConfig(epochs=4, batch_size=batch, progress=False, out_dir="/tmp/cnnpar-jp"),
        )
        row = {
            "variant": f"--decode {decode} --workers {workers} --cpu-share {share} --cuda-graphs {graphs} "
            f"--batch-size {batch}",
            "train_images": None,  # the folder's size sets how many batches an epoch has
            "device_queues": os.environ.get(DEVICE_QUEUES_ENV, "CUDA's default"),
        }
        if extra:
            row["variant"] += f" (bench: {' '.join(extra)})"
        # outside the try: data that cannot be read (an empty folder) is every variant's failure, so one line, exit 2
        bundle = bundle or load_data(cfg.data, 0)
        tr = None
        try:
            row["train_images"] = len(bundle.train)
            tr = Trainer(cfg, info, bundle=bundle, log=lambda *a, **k: None)
            tr.warm_up_compile()
            tr.train_epoch(1)  # warm: workers started, cuDNN tuned, graph captured
            # each epoch prepares the next as `cnnpar train` does (DeviceFeeder.prepare); the loader-alone
            # pass comes after the timed epochs, so that it does not discard a prepared one
            if opts.get("gil", "0") != "0":
                gil = Path(args.out).with_name(f"gil_{len(rows)}_{decode}.txt")
                with GilProfile(gil, native=opts["gil"] == "native") as prof:
                    epochs = [tr.train_epoch(e) for e in (2, 3)]
                print(f"{spec}: the timed epochs' GIL -> {gil}\n{prof.summary()}", flush=True)
            else:
                epochs = [tr.train_epoch(e) for e in (2, 3)]
            row["loader_alone_images_per_s"] = round(loader_alone(tr), 1)
            row["end_to_end_images_per_s"] = round(statistics.median(r["images_per_s"] for r in epochs), 1)
            row["data_wait_share"] = round(statistics.median(r["data_wait_share"] for r in epochs), 3)
            if opts.get("trace") == "1":
                trace = Path(args.out).with_name(f"trace_{len(rows)}_{decode}.json.gz")
                try:  # the epochs above are measured already: a failed trace must not void them
                    print(f"{spec}: epoch 4 under the profiler -> {trace}\n{trace_epoch(tr, 4, trace)}", flush=True)
                except Exception as e:
                    row["trace_error"] = repr(e)[:300]
            slots = getattr(tr.train_loader.decoder, "slots", None)
            row["slots"] = slots.describe() if slots is not None else "none"
            row["step_alone_images_per_s"] = round(step_alone(tr), 1)
            row["status"] = "ok"
        except Exception as e:  # one variant failing leaves the others' figures
            row.update(status="failed", error=repr(e)[:300])
        finally:  # its workers and decoders go before the next variant is measured
            if tr is not None:
                tr.close()
            tr = None
        print(row, flush=True)
        rows.append({**row, **{k: env[k] for k in ("device", "driver", "torch", "world_size", "git_rev", "date")}})
        torch._dynamo.reset()
        if cuda:
            torch.cuda.empty_cache()
        write_csv_atomic(args.out, rows)  # after every variant: a cut-off run keeps what it measured
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main_saying_user_errors(main, "jpeg_pipeline"))
