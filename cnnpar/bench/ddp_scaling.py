"""DDP scaling of cnnpar's own training step and input pipeline, at several world sizes in one run.

For each world size N this module starts `torchrun --standalone --nproc_per_node=N` on itself.
Each worker builds cnnpar's `Trainer` (model, DDP, precision, optimizer, loaders exactly as
`cnnpar train` would) over an in-memory synthetic uint8 data set, kept on the host: every batch
is gathered by the DataLoader, pinned, copied on the side stream and normalised/augmented on
the device. Nothing is GPU-resident. A warm-up call of `Trainer.train_epoch` (cuDNN autotuning,
allocator growth, compile if asked) is followed by `--repeats` timed calls of `--steps` steps,
each ending in a device synchronisation; the median is reported.

Every world size runs the same kind of step, the Trainer's eager `TrainStep`: cnnpar's CUDA graphs
cannot capture DDP's all-reduce hooks, so they are off at world size 1 too (left on auto, the
baseline would replay graphs and the speed-up would compare two different steps). Each row's
`step` column says which kind ran, read from the step itself.

The data set holds `--real-samples` distinct images and is indexed modulo that count up to a
length of exactly one timed call per rank, so no call crosses an epoch boundary (where the side
stream's prefetch restarts) while memory stays small.

Results: per world size, images/s (all GPUs and per GPU), step time, speed-up and scaling
efficiency over world size 1, written as CSV + JSON with the device name, torch version, world
size, config and git revision. A world size whose launch fails (a worker's error, out of memory, a timeout)
or is stopped (Ctrl-C, SIGTERM) after 1 was measured ends the run (exit 1; a stop's own status) with the sizes
measured before it written, and the JSON's `ended_at` naming it and why.

    python benchmarks/ddp_scaling.py                                  # ResNet-50 224², bf16, 1 and 2 GPUs
    python benchmarks/ddp_scaling.py --world-sizes 1,2,4,8 --compile default
    python benchmarks/ddp_scaling.py --device cpu --model cnn3 --image-size 32 --steps 5 --batch-size 16
    cnnpar bench --ddp 1,2 ...                                        # the same rows beside a ladder

Through the device tool, write into $OUT so the files come back:
    python3 benchmarks/ddp_scaling.py --world-sizes 1,2 --out $OUT/ddp_scaling_h200x2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cnnpar.checkout import ROOT, env_importing_this_checkout, is_checkout
from cnnpar.config import DEVICES, choice_with_advice, device_advice, workers_or_auto
from cnnpar.errors import UserError, raise_pending_stop
from cnnpar.host_facts import usable_cores
from cnnpar.process_tree import owned_temp_folder, parent_env, stop_process_tree

TARGET_SPEEDUP_2 = 1.97  # issue 3: 2 GPUs must give at least this many times the images/s of 1


WORLD_SIZES_EXPECTED = "expected process counts of 1 or more, comma-separated, 1 first (the baseline), e.g. 1,2"


def threads_per_process(asked: int, sizes: list[int]) -> int:
    """--threads, or the usable cores (a container's CPU quota counted: os.cpu_count gave the host's 64 on a 2-CPU
    pod) shared by the largest world size's processes, at most 8, so that each size runs the same threads a process."""
    return asked or max(1, min(8, usable_cores() // max(sizes)))


def parse_world_sizes(text: str) -> list[int]:
    """The world sizes of `--world-sizes` (and `cnnpar bench --ddp`); ValueError, saying what was expected."""
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(WORLD_SIZES_EXPECTED) from None
    if not sizes or sizes[0] != 1 or min(sizes) < 1:
        raise ValueError(WORLD_SIZES_EXPECTED)
    return sizes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    # prog as in its error lines: run as `python -m` argparse named it after the file (ddp_scaling.py)
    p = argparse.ArgumentParser(prog="ddp_scaling", description=__doc__.split("\n\n")[0])
    p.add_argument("--world-sizes", default="1,2", help="comma-separated process counts, 1 first")
    # as train's --device: cuda:1 and CUDA are refused saying what to do, not with argparse's bare invalid choice
    p.add_argument("--device", default="auto", type=choice_with_advice(DEVICES, device_advice), choices=DEVICES)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument(
        "--image-shape", default="", help="CxHxW the model sees (default: 3 channels of --image-size squared)"
    )
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=256, help="per process")
    p.add_argument(
        "--precision",
        default="auto",
        help="auto: as cnnpar train (bf16 on CUDA and on CPUs with native bf16, else fp32)",
    )
    p.add_argument("--channels-last", default="auto", choices=("auto", "on", "off"))
    p.add_argument("--compile", default="off", help="torch.compile mode or off (compile adds minutes per size)")
    p.add_argument("--optimizer", default="sgd", choices=("sgd", "adamw", "muon"))
    p.add_argument(  # as every cnnpar command's --workers: `auto` was refused as not an int
        "--workers",
        type=workers_or_auto,
        default=-1,
        metavar="N|auto",
        help="DataLoader workers (auto: cnnpar's choice)",
    )
    p.add_argument("--ddp-bucket-mb", type=float, default=0.0, help="DDP gradient bucket MiB (0: torch's own, 25)")
    p.add_argument("--ddp-static-graph", choices=("on", "off"), default="off", help="DDP static_graph")
    p.add_argument(
        "--ddp-broadcast-buffers", choices=("on", "off"), default="on", help="DDP's buffer broadcast every forward"
    )
    p.add_argument("--steps", type=int, default=100, help="steps per timed call")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per world size (median reported)")
    p.add_argument("--warmup-calls", type=int, default=1, help="untimed calls of --steps steps first")
    p.add_argument("--real-samples", type=int, default=1024, help="distinct images held in memory per process")
    p.add_argument("--threads", type=int, default=0, help="OMP threads per process (0: cores / largest size)")
    p.add_argument(
        "--out",
        default="",
        help="output prefix (default: a checkout's benchmarks/results/ddp_scaling_<device>, else "
        "runs/ddp_scaling_<device> in the working folder)",
    )
    p.add_argument("--git-rev", default="", help="record this revision (default: this checkout's)")
    p.add_argument("--launch-timeout", type=int, default=1200, help="seconds per torchrun launch")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", default="", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def default_prefix(device: str) -> Path:
    """Where the rows go without --out: beside the repository's other results in a checkout; an installed cnnpar has
    no benchmarks/ folder, and its package folder (site-packages) is no place for results, so runs/ (git-ignored,
    as every cnnpar command's output) of the working folder."""
    name = f"ddp_scaling_{device}"
    return ROOT / "benchmarks" / "results" / name if is_checkout(ROOT) else Path("runs") / name


def image_shape(args: argparse.Namespace) -> str:
    """The CxHxW every process trains on: --image-shape, or 3 channels of --image-size squared."""
    return args.image_shape or f"3x{args.image_size}x{args.image_size}"


# ---- worker: one process of one torchrun launch ------------------------------------------------


def worker(args: argparse.Namespace) -> None:
    import torch

    from cnnpar.config import Config, DataConfig, DistConfig, ModelConfig, OptimConfig, RunConfig, SpeedConfig
    from cnnpar.data.bundle import ArrayDataset
    from cnnpar.data.loader import ResidentLoader
    from cnnpar.data.sources import load_synthetic
    from cnnpar.dist import barrier, destroy_distributed, init_distributed
    from cnnpar.engine.trainer import Trainer
    from cnnpar.report.environment import environment
    from cnnpar.report.meters import peak_memory

    class CycledArrays(ArrayDataset):
        """`length` samples read from fewer real images (index modulo their count)."""

        def __init__(self, base: ArrayDataset, length: int) -> None:
            super().__init__(base.x, base.y)
            self.length = length

        def __len__(self) -> int:
            return self.length

        def __getitem__(self, i):  # the DataLoader hands a whole index list (batch_size=None)
            idx = torch.as_tensor(i, dtype=torch.int64) % len(self.x)
            return self.x.index_select(0, idx), self.y.index_select(0, idx)

        __getitems__ = __getitem__

    info = init_distributed(args.device, timeout_s=args.launch_timeout)
    try:
        calls = args.warmup_calls + args.repeats
        cfg = Config(
            data=DataConfig(
                source="synthetic",
                image_shape=image_shape(args),
                num_classes=args.num_classes,
                synthetic_samples=args.real_samples,
                val_fraction=0.0,
                resident="off",  # the point: batches travel from host memory every step
                workers=args.workers,
            ),
            model=ModelConfig(name=args.model),
            optim=OptimConfig(optimizer=args.optimizer, lr=0.1, schedule="constant", warmup=0.0),
            speed=SpeedConfig(
                device=info.device.type,
                precision=args.precision,
                channels_last=args.channels_last,
                compile=args.compile,
                cuda_graphs="off",  # as DDP must run: one kind of step at every world size (see above)
            ),
            dist=DistConfig(
                ddp_bucket_mb=args.ddp_bucket_mb,
                ddp_static_graph=args.ddp_static_graph == "on",
                ddp_broadcast_buffers=args.ddp_broadcast_buffers == "on",
            ),
            run=RunConfig(
                epochs=calls,
                batch_size=args.batch_size,
                max_steps=args.steps,
                out_dir=tempfile.gettempdir(),  # the Trainer's run folder is never created here
                name="cnnpar-ddp-scaling-unused",
                progress=False,
            ),
        )
        bundle = load_synthetic(cfg.data, seed=0)
        bundle.train = CycledArrays(bundle.train, args.steps * args.batch_size * info.world_size)
        trainer = Trainer(cfg, info, bundle=bundle, log=lambda *a, **k: None)
        try:
            trainer.warm_up_compile()
            rows = [trainer.train_epoch(epoch) for epoch in range(1, calls + 1)]
        finally:
            trainer.close()  # its loader's workers: now, not in the interpreter's exit hooks
        timed = rows[args.warmup_calls :]
        epoch_s = statistics.median(r["epoch_s"] for r in timed)
        images_per_s = statistics.median(r["images_per_s"] for r in timed)
        if info.is_main:
            peak, peak_kind = peak_memory(info.device)  # rank 0's
            result = {
                "world_size": info.world_size,
                "images_per_s": images_per_s,
                "images_per_s_per_device": images_per_s / info.world_size,
                "step_ms": 1000 * epoch_s / args.steps,
                "data_wait_share": statistics.median(r["data_wait_share"] for r in timed),
                "images_per_s_all_repeats": [r["images_per_s"] for r in timed],
                "peak_mem_mb": peak,
                "peak_mem_kind": peak_kind,
                "step": "cuda-graphed" if trainer.train_step.graphed else "eager",
                "resolved": {
                    "precision": trainer.cfg.speed.precision,
                    "channels_last": trainer.cfg.speed.channels_last,
                    "compile": trainer.cfg.speed.compile,
                    "pin_memory": trainer.cfg.data.pin_memory,
                    "prefetch_stream": trainer.cfg.data.prefetch_stream,
                    "resident": isinstance(trainer.train_loader.loader, ResidentLoader),
                    "loader_workers": getattr(trainer.train_loader.loader, "num_workers", None),
                    # read off the DDP module the steps ran through (none in one process)
                    "ddp": None
                    if trainer.ddp is None
                    else {
                        "bucket_mb": trainer.ddp.bucket_bytes_cap / 2**20,
                        "static_graph": trainer.ddp.static_graph,
                        "broadcast_buffers": trainer.ddp.broadcast_buffers,
                    },
                },
                "environment": environment(info.device, info.world_size),
            }
            Path(args.result).write_text(json.dumps(result))
        # Ranks leave together: a rank that tore its gloo group down while rank 0 was still writing
        # was seen to abort at exit ("terminate called without an active exception").
        barrier(info)
    finally:
        destroy_distributed()


# ---- parent: one torchrun launch per world size --------------------------------------------------


# What a worker needs from the parent's flags; everything else is the parent's business.
WORKER_FLAGS = (
    "device", "model", "image_size", "image_shape", "num_classes", "batch_size", "precision", "channels_last",
    "compile", "optimizer", "workers", "steps", "repeats", "warmup_calls", "real_samples", "launch_timeout",
    "ddp_bucket_mb", "ddp_static_graph", "ddp_broadcast_buffers",
)  # fmt: skip


def launch(args: argparse.Namespace, world_size: int, threads: int, result: Path) -> dict:
    from cnnpar.dist import PARENT_ENV

    flags = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in WORKER_FLAGS]
    cmd = [  # torchrun as `cnnpar train --nproc N` launches it: stopped with this process however it ends
        sys.executable,
        "-m",
        "cnnpar.torchrun",
        "--standalone",
        f"--nproc_per_node={world_size}",
        "-m",
        "cnnpar.bench.ddp_scaling",
        *flags,
        "--worker",
        f"--result={result}",
    ]
    env = env_importing_this_checkout()
    env.update(
        NCCL_NVLS_ENABLE="0",  # NVLink multicast off: the device machines require it (KINDS.md)
        OMP_NUM_THREADS=str(threads),  # the same per process at every size, so only N changes
        PYTHONUNBUFFERED="1",
    )
    # torchrun, in a session of its own, ends with this process however it ends: a SIGKILLed `cnnpar bench --ddp`
    # left it and its workers measuring on, reparented to init (cnnpar.torchrun.stop_with_parent)
    env.update(parent_env(PARENT_ENV))
    # a stop noted, not raised, inside an import (errors.stop_on_signals): each world size launched and measured in
    # full before `cnnpar bench --ddp` stopped
    raise_pending_stop()
    print(f"== world size {world_size}: {' '.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    # torchrun stopped with every process it started on any exit from here (a timeout, Ctrl-C, SIGTERM): killing
    # torchrun alone, as subprocess.run does, or its session, leaves its workers (each in a session of its own)
    # measuring on
    with subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    ) as launched:
        try:
            stdout, stderr = launched.communicate(timeout=args.launch_timeout)
        except subprocess.TimeoutExpired:
            stop_process_tree(launched)
            why = f"timed out after {args.launch_timeout} s: stopped with its processes"
            raise SystemExit(f"ddp_scaling: world size {world_size} {why}") from None
        except BaseException:
            stop_process_tree(launched)
            raise
    if launched.returncode != 0 or not result.is_file():
        # the workers' own lines first (the failing rank's error, cnnpar.torchrun's line naming it), each tail ending
        # its line, so that this module's line on the launch is the last, on a line of its own
        for tail in (stdout[-4000:], stderr[-6000:]):
            sys.stderr.write(tail if not tail or tail.endswith("\n") else tail + "\n")
        # exit 1, not a user error's 2; a launch that exited 0 without its result said "failed (exit 0)"
        why = (
            f"torchrun exited {launched.returncode}" if launched.returncode else "torchrun exited 0 without its result"
        )
        raise SystemExit(f"ddp_scaling: world size {world_size} failed: {why}")
    out = json.loads(result.read_text())
    out["launch_s"] = time.perf_counter() - t0
    return out


def world_sizes_here(text: str, device: str) -> list[int]:
    """--world-sizes, each size one this machine can run: a UserError (one line, exit 2, as `cnnpar bench --ddp`'s
    own check) where not; both ended in a SystemExit of exit 1, as a failed launch does."""
    import torch

    try:
        sizes = parse_world_sizes(text)
    except ValueError as e:
        raise UserError(f"--world-sizes {text}: {e}") from None
    if device == "cuda" and max(sizes) > (visible := torch.cuda.device_count()):
        raise UserError(
            f"--world-sizes {text}: {max(sizes)} processes need as many GPUs: expected at most {visible} here"
        )
    return sizes


def speedup_range(one: list[float], two: list[float]) -> tuple[float, float] | None:
    """The 2-process speed-up's range over the repeats: the worst pairing (slowest 2-process repeat over the fastest
    1-process one) to the best; None where either side ran one repeat (no range: the noise is unknown)."""
    if len(one) < 2 or len(two) < 2:
        return None
    return min(two) / max(one), max(two) / min(one)


def two_process_line(
    speedup: float, device_type: str, device_name: str, spread: tuple[float, float] | None = None
) -> str:
    """The 2-process figure, judged against TARGET_SPEEDUP_2 on GPUs only: that target is for two GPUs over NCCL,
    and gloo processes sharing a CPU's cores cannot reach it (2 shared cores: 1.24x), so a verdict there said
    nothing about DDP. `spread` (`speedup_range`): a median that meets or misses the target while the repeats' range
    reaches across it says so (the median alone judged it), and none says the noise is unknown."""
    if device_type != "cuda":
        return f"2 processes: {speedup:.3f}x of 1 ({device_name}; the {TARGET_SPEEDUP_2}x target is for 2 GPUs)"
    verdict = "meets" if speedup >= TARGET_SPEEDUP_2 else "misses"
    if spread is None:
        noise = "; one repeat a side: noise unknown"
    elif spread[0] < TARGET_SPEEDUP_2 <= spread[1]:
        noise = f"; inside the noise: repeats {spread[0]:.3f}-{spread[1]:.3f}x"
    else:
        noise = f"; repeats {spread[0]:.3f}-{spread[1]:.3f}x"
    return f"2 processes: {speedup:.3f}x of 1, {verdict} the {TARGET_SPEEDUP_2}x target ({device_name}{noise})"


def stop_words(world_size: int, stop: KeyboardInterrupt) -> str:
    """A world size's launch stopped by a Ctrl-C or a SIGTERM (errors.Terminated), as its `ended_at` says it."""
    from cnnpar.errors import Terminated

    name = stop.signal_name if isinstance(stop, Terminated) else "SIGINT"
    return f"world size {world_size} stopped ({name}) before its rows were measured"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        # Leave without the interpreter's teardown. The result is on disk and the group is gone, yet a
        # worker has still aborted at exit, rarely ("terminate called without an active exception": rank 1
        # of 2 gloo processes in a CI run, after the barrier at the end of `worker` was added for the same
        # message; 12 local runs did not repeat it). Where in the teardown was not found; nothing the
        # worker did needs the teardown.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    import torch

    from cnnpar.bench.output import ROOM
    from cnnpar.report.environment import git_revision
    from cnnpar.report.files import write_csv_atomic, write_errors_explained, write_json_atomic

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    args.device = device
    sizes = world_sizes_here(args.world_sizes, device)
    threads = threads_per_process(args.threads, sizes)
    rev = args.git_rev or git_revision()
    config = {k: v for k, v in vars(args).items() if k not in ("worker", "result", "out", "git_rev", "launch_timeout")}
    config["threads_per_process"] = threads

    results = []
    # A later world size's failed launch (a worker's error, out of memory, a timeout) or a stop (Ctrl-C, SIGTERM)
    # while it ran: the sizes measured before it, minutes of work, are still written, with that size and why beside
    # them; the run then ends as it would have (exit 1 for the failure, the stop's own status), saying what was kept.
    ended_at: dict | None = None
    ended: SystemExit | KeyboardInterrupt | None = None
    with owned_temp_folder("cnnpar-ddp-scaling-") as tmp:  # swept by the next run where this one was killed outright
        for n in sizes:
            try:
                r = launch(args, n, threads, Path(tmp) / f"world{n}.json")
            except (SystemExit, KeyboardInterrupt) as e:
                if not results:  # the baseline failed or was stopped: nothing measured, nothing to keep
                    raise
                ended = e
                why = str(e.code).removeprefix("ddp_scaling: ") if isinstance(e, SystemExit) else stop_words(n, e)
                ended_at = {"world_size": n, "why": why}
                break
            results.append(r)
            print(
                f"   {r['images_per_s']:,.0f} img/s ({r['images_per_s_per_device']:,.0f} per process), "
                f"step {r['step_ms']:.1f} ms, data wait {100 * r['data_wait_share']:.1f} %",
                flush=True,
            )

    base = results[0]["images_per_s"]
    env = results[-1]["environment"]
    rows = []
    for r in results:
        n = r["world_size"]
        rows.append(
            {
                "world_size": n,
                "images_per_s": round(r["images_per_s"], 2),
                "images_per_s_per_device": round(r["images_per_s_per_device"], 2),
                "step_ms": round(r["step_ms"], 3),
                "speedup": round(r["images_per_s"] / base, 4),
                "scaling_efficiency": round(r["images_per_s"] / (n * base), 4),
                "data_wait_share": round(r["data_wait_share"], 4),
                "peak_mem_mb": round(r["peak_mem_mb"], 1),
                "peak_mem_kind": r["peak_mem_kind"],
                "step": r["step"],
                "device": env["device"],
                "torch": env["torch"],
                "cuda": env["cuda"],
                "git_rev": rev,
                "model": args.model,
                "image_size": args.image_size,
                # the workload: `cnnpar bench --ddp` passes its ladder's, so a row read alone says what ran
                "image_shape": image_shape(args),
                "num_classes": args.num_classes,
                "optimizer": args.optimizer,
                "batch_per_process": args.batch_size,
                "precision": r["resolved"]["precision"],
                "channels_last": r["resolved"]["channels_last"],
                "compile": r["resolved"]["compile"],
                "pinned": r["resolved"]["pin_memory"],
                "side_stream": r["resolved"]["prefetch_stream"],
                "resident": r["resolved"]["resident"],
                # what the DDP module ran with ("" in one process, where there is none)
                "ddp_bucket_mb": (r["resolved"]["ddp"] or {}).get("bucket_mb", ""),
                "ddp_static_graph": (r["resolved"]["ddp"] or {}).get("static_graph", ""),
                "ddp_broadcast_buffers": (r["resolved"]["ddp"] or {}).get("broadcast_buffers", ""),
                "steps": args.steps,
                "repeats": args.repeats,
                "date": env["date"],
            }
        )

    prefix = Path(args.out) if args.out else default_prefix(device)
    csv, js = prefix.with_suffix(".csv"), prefix.with_suffix(".json")
    # a full disk or a read-only folder: one line naming the file and what is kept (a UserError), not a traceback
    # after every world size was measured; a launch that failed or was stopped before is said in that line too
    also = f"; before that, {ended_at['why']}" if ended_at else ""
    with write_errors_explained(csv, f"{ROOM}; the DDP rows measured are not saved{also}"):
        write_csv_atomic(csv, rows)
    with write_errors_explained(js, f"{ROOM}; the DDP rows measured are kept, whole, in {csv}{also}"):
        write_json_atomic(
            js,
            {
                "config": config,
                "git_rev": rev,
                "rows": rows,
                "workers": results,
                "target_speedup_2": TARGET_SPEEDUP_2,
                # null where every world size asked for was measured; else the one whose launch failed or was
                # stopped, and why (the rows stop before it)
                "ended_at": ended_at,
            },
        )
    print(f"\n{'N':>3} {'img/s':>10} {'per proc':>10} {'step ms':>8} {'speedup':>8} {'eff':>6}")
    for row in rows:
        print(
            f"{row['world_size']:>3} {row['images_per_s']:>10,.0f} {row['images_per_s_per_device']:>10,.0f} "
            f"{row['step_ms']:>8.1f} {row['speedup']:>7.3f}x {100 * row['scaling_efficiency']:>5.1f}%"
        )
    kinds = sorted({row["step"] for row in rows})
    if len(kinds) == 1:
        print(f"step: {kinds[0]} TrainStep at every world size (CUDA graphs cannot capture DDP's hooks)")
    else:  # cannot happen with cuda_graphs off; said rather than hidden should a later change allow it
        print(f"warning: the world sizes ran different steps ({', '.join(kinds)}): the speed-ups mix them")
    two = next((row for row in rows if row["world_size"] == 2), None)
    if two is not None:
        one_all, two_all = (r.get("images_per_s_all_repeats", []) for r in (results[0], results[sizes.index(2)]))
        print(two_process_line(two["speedup"], device, env["device"], speedup_range(one_all, two_all)))
    print(f"wrote {csv} and {js}")
    if ended is not None:
        kept = f"world size{'s' if len(rows) > 1 else ''} {','.join(str(row['world_size']) for row in rows)}"
        kept = f"the rows of {kept}, measured before it, are kept in {csv} and {js}"
        if isinstance(ended, SystemExit):  # exit 1, as any failed launch: the rows asked for were not all measured
            raise SystemExit(f"ddp_scaling: {ended_at['why']}; {kept}")
        print(f"ddp_scaling: {ended_at['why']}; {kept}", file=sys.stderr, flush=True)
        raise ended  # the stop goes on: its line and exit status are the command's (130, 143)
    return 0


def entry() -> int:
    """`python -m cnnpar.bench.ddp_scaling` and benchmarks/ddp_scaling.py: a UserError (ddp.csv on a full disk) ends
    in one line and exit 2, as under `cnnpar bench --ddp`, not in a traceback."""
    from cnnpar.errors import main_saying_user_errors

    return main_saying_user_errors(main, "ddp_scaling")


if __name__ == "__main__":
    sys.exit(entry())
