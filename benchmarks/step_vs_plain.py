"""cnnpar's train step against hand-written plain PyTorch loops, side by side in one process.

The plain loops are what a skilled engineer writes by hand: data already on the device, fused
SGD, autocast, channels_last, optionally torch.compile. cnnpar runs its own Trainer (resident
uint8 data, device-side normalisation, its default switches for the device). Each variant:
warm-up (and compile) first, then `--repeats` timed runs of `--steps` steps between device
synchronisations; the median images/s is reported, with the model's FLOPs per image and the
device's matmul peak (bf16 on CUDA; cnnpar.bench.flops), both measured in the same run (MFU = FLOPs x
img/s / peak).

A cnnpar variant is `k=v,k=v`: SpeedConfig fields (`compile=max-autotune-no-cudagraphs`), or
`inductor.<option>=<value>` for an inductor setting patched around that variant's compile and
timing (`inductor.coordinate_descent_tuning=1`): levers measured here before any becomes a switch.

    python benchmarks/step_vs_plain.py --out benchmarks/results/step_vs_plain_h200.csv
    python benchmarks/step_vs_plain.py --plain compile --cases resnet18:32:512 \
        --variants "inductor.coordinate_descent_tuning=1;compile=max-autotune-no-cudagraphs"
    python benchmarks/step_vs_plain.py --device cpu --cases cnn3:28:128 --steps 10   # a quick CPU check
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cnnpar.bench.flops import flops_per_image, peak_flops  # noqa: E402
from cnnpar.config import Config, ConfigError, DataConfig, ModelConfig, OptimConfig, RunConfig, SpeedConfig  # noqa: E402
from cnnpar.dist import DistInfo  # noqa: E402
from cnnpar.engine.trainer import Trainer  # noqa: E402
from cnnpar.errors import UserError, main_saying_user_errors  # noqa: E402
from cnnpar.models import build_model  # noqa: E402
from cnnpar.parallel.precision import set_tf32  # noqa: E402
from cnnpar.report.environment import environment  # noqa: E402
from cnnpar.report.files import write_csv_atomic  # noqa: E402
from cnnpar.report.meters import sync  # noqa: E402

CUDA_VARIANTS = "compile=default;compile=off;compile=default,cuda_graphs=on;compile=off,cuda_graphs=on"
PLAIN_LOOPS = {  # name -> (label, precision, channels_last, compile mode)
    "fp32": ("plain fp32 NCHW", "fp32", False, None),
    "bf16": ("plain bf16 channels_last", "bf16", True, None),
    "compile": ("plain bf16 channels_last compile", "bf16", True, "default"),
}


BOOLEAN_WORDS = {"1": True, "true": True, "on": True, "0": False, "false": False, "off": False}


def _typed(value: str, like, what: str):
    """`value` as the type of `like` (an option's default): a bool only from 1/0/true/false/on/off."""
    if isinstance(like, bool):
        if value.lower() not in BOOLEAN_WORDS:
            raise UserError(f"--variants: {what}={value}, expected one of {', '.join(BOOLEAN_WORDS)}")
        return BOOLEAN_WORDS[value.lower()]
    if isinstance(like, (int, float)):
        try:
            return type(like)(value)
        except ValueError:
            raise UserError(f"--variants: {what}={value}, expected a {type(like).__name__}") from None
    return value


def parse_variant(spec: str) -> dict:
    """`k=v,k=v` -> {"speed": SpeedConfig overrides, "inductor": inductor options, "fallback": aten op names}.
    Each value takes the type of the field's or option's default (inductor does not check the types it is
    patched with); `fallback.<aten op>=1` has inductor call aten's own kernel for that op (`aten_fallbacks`)."""
    speed, inductor, fallback = {}, {}, []
    defaults = {f.name: f.default for f in dataclasses.fields(SpeedConfig)}
    for item in filter(None, spec.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"--variants: {item!r} in {spec!r} is not key=value")
        if key.startswith("inductor."):
            name = key.removeprefix("inductor.")
            import torch._inductor.config as inductor_config

            options = inductor_config.get_config_copy()  # dotted names too: triton.cudagraphs
            if name not in options:
                raise UserError(f"--variants: torch {torch.__version__} has no inductor option {name!r}")
            inductor[name] = _typed(value, options[name], key)
        elif key.startswith("fallback."):
            name = key.removeprefix("fallback.")
            if not hasattr(torch.ops.aten, name) or not _typed(value, True, key):
                raise UserError(f"--variants: {key}={value}: expected fallback.<an aten op>=1")
            fallback.append(name)
        elif key in defaults:
            speed[key] = _typed(value, defaults[key], key)  # compile_tuning=on, cuda_graphs=on: words
        else:
            raise UserError(
                f"--variants: {key!r} in {spec!r} is not a SpeedConfig field, inductor.<option> or fallback.<op>"
            )
    try:  # a value out of a field's choices (stem_space_to_depth=1) stops the run before any device time
        SpeedConfig(**speed)
    except ConfigError as e:
        raise UserError(f"--variants {spec!r}: {e}") from None
    return {"speed": speed, "inductor": inductor, "fallback": fallback}


@contextlib.contextmanager
def aten_fallbacks(names: list[str]):
    """While the variant compiles, inductor calls aten's own kernel (an extern kernel) for each named op instead
    of decomposing it or generating one; yields a Counter of how often each was lowered so, so that a row can say
    whether its fallback was used at all. A measuring tool only: it swaps entries of inductor's private
    decomposition and lowering tables and puts them back, and turns the compile caches off meanwhile (their keys
    do not see the tables: a cached graph would silently be the default's)."""
    if not names:
        yield collections.Counter()
        return
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    from torch._inductor import decomposition, lowering

    used: collections.Counter = collections.Counter()
    saved: list[tuple[dict, object, object]] = []

    def counted(name, overload):
        handler = lowering.fallback_handler(overload, add_to_fallback_set=False)

        def run(*args, **kwargs):
            used[name] += 1
            return handler(*args, **kwargs)

        run._is_fallback_handler = True  # what inductor checks to treat a lowering as a fallback
        return run

    missing = object()
    for name in names:
        packet = getattr(torch.ops.aten, name)
        overloads = [getattr(packet, o) for o in packet.overloads()]
        for key, overload in [(packet, packet.default), *((o, o) for o in overloads)]:
            saved.append((lowering.lowerings, key, lowering.lowerings.get(key, missing)))
            lowering.lowerings[key] = counted(name, overload)
            saved.append((decomposition.decompositions, key, decomposition.decompositions.pop(key, missing)))
    # the table the compile reads is a cached copy of `decompositions` (functools.cache): made again both ways
    cached_table = getattr(decomposition, "fast_random_decomps", None)
    if cached_table is not None:
        cached_table.cache_clear()
    try:
        caches = {"enable_autograd_cache": False} if hasattr(functorch_config, "enable_autograd_cache") else {}
        with inductor_config.patch(fx_graph_cache=False, force_disable_caches=True), functorch_config.patch(caches):
            yield used
    finally:
        for table, key, value in reversed(saved):
            if value is missing:
                table.pop(key, None)
            else:
                table[key] = value
        if cached_table is not None:
            cached_table.cache_clear()


def time_plain(model_name, size, batch, device, precision, channels_last, compile_mode, steps, repeats, warmup):
    torch.manual_seed(0)
    chans = 1 if model_name == "cnn3" else 3
    model = build_model(model_name, chans, 10, size).to(device)
    mf = torch.channels_last if channels_last else torch.contiguous_format
    model = model.to(memory_format=mf)
    opt = torch.optim.SGD(
        model.parameters(),
        lr=0.01,
        momentum=0.9,
        nesterov=True,
        **({"fused": True} if device.type == "cuda" else {"foreach": True}),
    )
    x = torch.randn(batch, chans, size, size, device=device).to(memory_format=mf)
    y = torch.randint(0, 10, (batch,), device=device)
    fwd = torch.compile(model, mode=None if compile_mode == "default" else compile_mode) if compile_mode else model
    dtype = torch.bfloat16 if precision == "bf16" else None

    def step():
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = F.cross_entropy(fwd(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    sync(device)
    warm_s = time.perf_counter() - t0
    rates = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        sync(device)
        rates.append(steps * batch / (time.perf_counter() - t0))
    return statistics.median(rates), warm_s


def time_cnnpar(model_name, size, batch, device, steps, repeats, overrides):
    import torch._inductor.config as inductor_config

    # patched around the compile (at warm-up) and the timed steps alike
    with inductor_config.patch(overrides.get("inductor", {})), aten_fallbacks(overrides.get("fallback", [])) as used:
        ips, warm, label = _time_cnnpar(model_name, size, batch, device, steps, repeats, overrides)
    for name in overrides.get("fallback", []):
        label += f"; aten's {name} called {used[name]} time(s) in the compiled graphs"
    return ips, warm, label


def _time_cnnpar(model_name, size, batch, device, steps, repeats, overrides):
    chans = 1 if model_name == "cnn3" else 3
    speed = SpeedConfig(device=device.type, **overrides.get("speed", {}))
    cfg = Config(
        data=DataConfig(
            source="synthetic",
            image_shape=f"{chans}x{size}x{size}",
            synthetic_samples=batch * steps,
            val_fraction=0.0,
            augment="none",
            **overrides.get("data", {}),
        ),
        model=ModelConfig(name=model_name),
        optim=OptimConfig(optimizer="sgd", lr=0.01),
        speed=speed,
        run=RunConfig(epochs=repeats + 1, batch_size=batch, max_steps=steps, progress=False, out_dir="/tmp/cnnpar-b"),
    )
    info = DistInfo(0, 0, 1, device)
    t0 = time.perf_counter()
    tr = Trainer(cfg, info, log=lambda *a, **k: None)
    tr.warm_up_compile()
    tr.train_epoch(1)  # warm-up epoch: cuDNN autotuning, allocator growth
    warm_s = time.perf_counter() - t0
    rates = [tr.train_epoch(e)["images_per_s"] for e in range(2, repeats + 2)]
    resolved = tr.cfg.speed
    loader = type(tr.train_loader.loader).__name__
    label = (
        f"{resolved.precision} cl={resolved.channels_last} compile={resolved.compile} "
        f"stem_s2d={resolved.stem_space_to_depth} {loader}"
    )
    return statistics.median(rates), warm_s, label


def _with_mfu(row: dict, flops: float, peak: float) -> dict:
    row["gflop_per_image"] = round(flops / 1e9, 3)
    if "images_per_s" in row:
        row["tflops"] = round(flops * row["images_per_s"] / 1e12, 1)
        row["mfu"] = round(flops * row["images_per_s"] / peak, 4)
    return row


def parse_cases(text: str) -> list[tuple[str, int, int]]:
    """--cases as (model, image size, batch), all read before the first is measured: a malformed one ended in a
    ValueError traceback once the cases before it had run."""
    cases = []
    for case in text.split(","):
        try:
            name, size, batch = case.split(":")
            cases.append((name, int(size), int(batch)))
        except ValueError:
            raise UserError(f"--cases {text}: {case!r}: expected model:size:batch, e.g. resnet18:32:512") from None
    return cases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--cases", default="resnet50:224:256,resnet18:32:512", help="model:size:batch,...")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--out", default="benchmarks/results/step_vs_plain.csv")
    ap.add_argument(
        "--cudnn-benchmark-limit",
        type=int,
        default=None,
        help="cuDNN algorithms timed per convolution under cudnn.benchmark (torch's default 10; 0: every one the "
        "heuristics return). For the whole process: torch caches the plan it picks per shape, so a variant cannot "
        "change it after another ran",
    )
    ap.add_argument(
        "--plain",
        default="fp32,bf16,compile",
        help="plain loops to run beside cnnpar's: a comma list of fp32, bf16, compile, or none",
    )
    ap.add_argument(
        "--variants",
        default=None,
        help="cnnpar variants besides its defaults: ';'-separated, each k=v,k=v (SpeedConfig fields or "
        "inductor.<option>); default on CUDA: " + CUDA_VARIANTS + "; none on the CPU",
    )
    ap.add_argument(
        "--skip-defaults",
        action="store_true",
        help="time only --variants, not cnnpar's defaults (a phase whose time is short; the defaults' row then "
        "comes from another process or call)",
    )
    args = ap.parse_args()
    cases = parse_cases(args.cases)
    device = torch.device(args.device)
    torch.backends.cudnn.benchmark = True
    if args.cudnn_benchmark_limit is not None:
        if args.cudnn_benchmark_limit < 0:
            raise UserError(f"--cudnn-benchmark-limit: {args.cudnn_benchmark_limit}, expected 0 or more")
        torch.backends.cudnn.benchmark_limit = args.cudnn_benchmark_limit
    env = environment(device)
    cuda = device.type == "cuda"
    wanted = [p for p in args.plain.split(",") if p and p != "none"]
    unknown = sorted(set(wanted) - set(PLAIN_LOOPS))
    if unknown:
        raise UserError(f"--plain: {unknown} are not among {sorted(PLAIN_LOOPS)} or none")
    cnnpar_variants = [] if args.skip_defaults else [("cnnpar defaults", {})]
    specs = args.variants if args.variants is not None else (CUDA_VARIANTS if cuda else "")
    for spec in filter(None, specs.split(";")):
        cnnpar_variants.append((f"cnnpar {spec}", parse_variant(spec)))
    peak, peak_kind = peak_flops(device)
    print(f"peak: {peak / 1e12:.1f} TFLOP/s ({peak_kind})", flush=True)
    rows = []
    stamp = {k: env[k] for k in ("device", "driver", "torch", "world_size", "git_rev", "date")}
    stamp.update(steps=args.steps, repeats=args.repeats, peak_tflops=round(peak / 1e12, 1), peak_kind=peak_kind)
    stamp.update(cudnn_benchmark_limit=torch.backends.cudnn.benchmark_limit)

    def keep(row: dict) -> None:
        """Record a row and rewrite the file: a phase cut short keeps the rows it finished."""
        rows.append({**row, **stamp})
        print(rows[-1], flush=True)
        write_csv_atomic(args.out, rows)

    for name, size, batch in cases:
        chans = 1 if name == "cnn3" else 3
        flops = flops_per_image(name, (chans, size, size), 10, device)
        print(f"{name} at {size}: {flops / 1e9:.2f} GFLOP an image, forward and backward", flush=True)
        plain = [PLAIN_LOOPS[p] for p in wanted if cuda or PLAIN_LOOPS[p][1] == "fp32"]
        if len(plain) < len(wanted):
            print(f"--plain: on the CPU only the fp32 loop runs (asked: {','.join(wanted)})", flush=True)
        for label, prec, cl, comp in plain:
            # plain fp32 means fp32, not TF32; each plain loop sets the flags, so none inherits another's
            if cuda:
                # as cnnpar's step sets them (set_tf32), not `cuda.matmul.allow_tf32`: after that step had set "high"
                # (oneDNN's matmuls at TF32 too), that flag alone left a mix newer torch refuses to read, and
                # inductor reads it to compile (the variant failed)
                set_tf32(prec != "fp32")
            try:
                ips, warm = time_plain(name, size, batch, device, prec, cl, comp, args.steps, args.repeats, args.warmup)
                row = {"variant": label, "images_per_s": round(ips, 1), "warmup_s": round(warm, 1), "status": "ok"}
            except Exception as e:  # a variant that fails is recorded, the rest still run
                row = {"variant": label, "status": "failed", "error": repr(e)[:300]}
            keep(_with_mfu({"model": name, "image_size": size, "batch": batch, **row}, flops, peak))
            torch._dynamo.reset()
        for label, ov in cnnpar_variants:
            try:
                ips, warm, resolved = time_cnnpar(name, size, batch, device, args.steps, args.repeats, ov)
                row = {
                    "variant": f"{label} ({resolved})",
                    "images_per_s": round(ips, 1),
                    "warmup_s": round(warm, 1),
                    "status": "ok",
                }
            except Exception as e:
                row = {"variant": label, "status": "failed", "error": repr(e)[:300]}
            keep(_with_mfu({"model": name, "image_size": size, "batch": batch, **row}, flops, peak))
            torch._dynamo.reset()
    print(f"wrote {args.out}")
    for r in rows:
        mfu = f"{r['mfu']:.1%}" if "mfu" in r else "-"
        print(
            f"{r['model']:>9} {r['image_size']:>4} b{r['batch']:<4} {r.get('images_per_s', '-'):>10} "
            f"MFU {mfu:>6}  {r['variant']}"
        )


if __name__ == "__main__":
    sys.exit(main_saying_user_errors(main, "step_vs_plain"))
