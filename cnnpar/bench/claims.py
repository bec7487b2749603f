"""The founding document's quantitative claims, each measured here and given a verdict.

Every claim is stated as an improvement factor (> 1 in the claimed direction) and measured as
one ratio of two measurements taken in this process. A claim is *confirmed* when the measured
effect (ratio - 1) is at least half the claimed effect; otherwise it is *not reproduced*. A claim
that needs hardware this run lacks is *not measurable here*, with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from cnnpar.config import Config, parse_shape
from cnnpar.data import DataBundle, load_data
from cnnpar.dist import DistInfo
from cnnpar.engine.harness import free_device_memory
from cnnpar.parallel import resolve_for
from cnnpar.presets import with_overrides

from . import probes
from .ladder import BASELINE, plan_ladder
from .measure import error_text, measure_config
from .timing import Timing

CONFIRM_SHARE = 0.5  # share of the claimed effect a measurement must reach to confirm it


class NotMeasurable(Exception):
    """The claim cannot be measured on this machine or with this data; the message says why."""


@dataclass(frozen=True)
class Measured:
    baseline: float
    variant: float
    ratio: float  # oriented like the claim: > 1 means the claimed direction
    unit: str
    method: str
    note: str = ""


@dataclass
class ClaimContext:
    base: Config
    bundle: DataBundle
    info: DistInfo
    timing: Timing
    log: Callable[[str], None]

    @property
    def device(self) -> torch.device:
        return self.info.device

    def rung(self, name: str) -> Config:
        plan = {p.rung.name: p for p in plan_ladder(self.base, self.device, self.bundle)}
        return plan[name].cfg

    def rate(self, cfg: Config, bundle: DataBundle | None = None) -> dict:
        try:
            return measure_config(cfg, bundle or self.bundle, self.info, self.timing)
        finally:
            free_device_memory(self.device)  # before the second measurement of a pair

    def fast(self, cfg: Config | None = None, **sections: dict) -> Config:
        """The user's config with the fast loader and its own auto switches, plus `sections`."""
        cfg = with_overrides(cfg or self.base, data={"loader": "fast"})
        return with_overrides(cfg, **sections) if sections else cfg

    def model_on_synthetic(self, model: str, shape: str) -> tuple[Config, DataBundle]:
        """The user's data when it already is this model at this shape, else synthetic data."""
        if self.base.model.name == model and self.bundle.shape == parse_shape(shape):
            return self.base, self.bundle
        n = max(512, 4 * self.base.run.batch_size)
        cfg = with_overrides(
            self.base,
            model={"name": model},
            data={"source": "synthetic", "format": "synthetic", "image_shape": shape, "synthetic_samples": n},
        )
        return cfg, load_data(cfg.data, cfg.run.seed)


def _speed(ctx: ClaimContext, a: Config, b: Config, method: str, note: str = "", bundle=None) -> Measured:
    ra = ctx.rate(a, bundle)["images_per_s"]
    rb = ctx.rate(b, bundle)["images_per_s"]
    return Measured(ra, rb, rb / ra, "images/s", method, note)


def pin_memory(ctx: ClaimContext) -> Measured:
    return _speed(
        ctx,
        ctx.rung("workers"),
        ctx.rung("pin_memory"),
        "train step images/s: textbook loader with workers, pin_memory off -> on",
    )


def collate_speed(ctx: ClaimContext) -> Measured:
    if not ctx.bundle.in_memory:
        raise NotMeasurable("the uint8 path indexes in-memory arrays; this data is an image folder")
    textbook = with_overrides(ctx.base, **BASELINE)
    fast = with_overrides(textbook, data={"loader": "fast"})
    a = probes.host_loader_rate(textbook, ctx.bundle, ctx.timing)
    b = probes.host_loader_rate(fast, ctx.bundle, ctx.timing)
    return Measured(
        a,
        b,
        b / a,
        "images/s",
        "host loader alone (no model), 0 workers: per-sample float + default collate -> "
        "one uint8 index per batch + batched normalise",
        "includes normalisation on both sides",
    )


def collate_cpu(ctx: ClaimContext) -> Measured:
    textbook = with_overrides(ctx.base, **BASELINE)
    fast = with_overrides(textbook, data={"loader": "fast"})
    a = ctx.rate(textbook)["main_cpu_pct"]
    b = ctx.rate(fast)["main_cpu_pct"]
    return Measured(
        a,
        b,
        a / b,
        "% of one core",
        "main-process CPU time / wall during train steps (0 workers): textbook -> uint8 loader",
        "top-style percentages (100% = one core busy)",
    )


def compiled_preprocess(ctx: ClaimContext) -> Measured:
    bs = ctx.base.run.batch_size
    if ctx.bundle.in_memory:
        batch = ctx.bundle.train.x[:bs]
    else:
        batch = torch.randint(0, 256, (bs, *ctx.bundle.shape), dtype=torch.uint8)
    probes.warm_compiler(ctx.device)
    eager = probes.preprocess_ms(batch, False, ctx.device, ctx.timing)
    compiled = probes.preprocess_ms(batch, True, ctx.device, ctx.timing)
    return Measured(
        eager,
        compiled,
        eager / compiled,
        "ms/batch",
        f"uint8 -> normalise, pad-4 crop, flip on a batch of {len(batch)}: eager -> torch.compile",
    )


def two_streams(ctx: ClaimContext) -> Measured:
    return _speed(
        ctx,
        ctx.rung("uint8_device"),
        ctx.rung("prefetch_stream"),
        "train step images/s: side-stream H2D prefetch off -> on",
        "closest honest variant: a forward and its own backward are sequential, so there is "
        "nothing to overlap between them; what can overlap is the next batch's copy",
    )


def max_autotune(ctx: ClaimContext) -> Measured:
    cfg, bundle = ctx.model_on_synthetic("resnet18", "3x32x32")
    return _speed(
        ctx,
        ctx.fast(cfg, speed={"compile": "off"}),
        ctx.fast(cfg, speed={"compile": "max-autotune"}),
        "ResNet-18 3x32x32 train step images/s: eager -> compile max-autotune (compile excluded)",
        bundle=bundle,
    )


def amp_speed(ctx: ClaimContext) -> Measured:
    return _speed(
        ctx,
        ctx.fast(speed={"precision": "fp32"}),
        ctx.fast(speed={"precision": "bf16"}),
        "train step images/s: fp32 (TF32 off) -> bf16 autocast",
    )


def amp_batch(ctx: ClaimContext) -> Measured:
    shape, n = ctx.bundle.shape, ctx.bundle.num_classes
    found = {}
    for kind in ("fp32", "bf16"):
        cfg = resolve_for(ctx.fast(speed={"precision": kind}), ctx.device)
        found[kind] = probes.largest_batch(cfg, shape, n, ctx.device)
    (a, a_cap, a_err), (b, b_cap, b_err) = found["fp32"], found["bf16"]
    if a_cap or b_cap or a == 0:
        raise NotMeasurable(f"largest batch fp32 {a}, bf16 {b}: memory did not limit below {probes.MAX_BATCH}")
    note = "; ".join((a_err + b_err)[:2])
    return Measured(
        a,
        b,
        b / a,
        "images/batch",
        "largest batch whose train step fits: doubling until it fails, then bisecting",
        note,
    )


def cudnn_benchmark(ctx: ClaimContext) -> Measured:
    cfg, bundle = ctx.model_on_synthetic("resnet50", "3x224x224")
    off = ctx.fast(cfg, speed={"compile": "default", "cudnn_benchmark": False})
    on = ctx.fast(cfg, speed={"compile": "default", "cudnn_benchmark": True})
    return _speed(
        ctx, off, on, "ResNet-50 3x224x224 compiled train step images/s: cudnn.benchmark off -> on", bundle=bundle
    )


def dynamic_compile(ctx: ClaimContext) -> Measured:
    cfg = resolve_for(ctx.fast(), ctx.device)
    shape, n = ctx.bundle.shape, ctx.bundle.num_classes
    probes.warm_compiler(ctx.device)
    static = probes.compile_seconds(cfg, shape, n, ctx.device, dynamic=None)
    dynamic = probes.compile_seconds(cfg, shape, n, ctx.device, dynamic=True)
    return Measured(
        static,
        dynamic,
        dynamic / static,
        "s",
        f"{cfg.model.name}: wall time of the first compiled forward + backward, caches off: static -> dynamic=True",
        "ratio is dynamic / static compile time (the claimed slow-down)",
    )


@dataclass(frozen=True)
class Claim:
    id: str
    text: str
    claimed_ratio: float
    measure: Callable[[ClaimContext], Measured]
    needs_cuda: str = ""  # why the claim needs CUDA ("" when the CPU can measure it)


CLAIMS: tuple[Claim, ...] = (
    Claim(
        "pin_memory",
        "pin_memory=True: +18% throughput",
        1.18,
        pin_memory,
        "page-locked memory only speeds host-to-GPU copies",
    ),
    Claim("collate_speed", "uint8/NumPy collate 3x faster than the default collate", 3.0, collate_speed),
    Claim(
        "collate_cpu",
        "uint8/NumPy collate: CPU 95% -> 42%",
        95 / 42,
        collate_cpu,
        "on the CPU the same cores run the model, so the loader's CPU share cannot be told apart",
    ),
    Claim("compiled_preprocess", "compiled preprocessing 2.3x faster", 2.3, compiled_preprocess),
    Claim(
        "two_streams",
        "separate CUDA streams for forward and backward: -14% epoch time",
        1 / 0.86,
        two_streams,
        "CUDA streams",
    ),
    Claim(
        "max_autotune",
        "torch.compile(mode='max-autotune'): 2.1x on ResNet-18",
        2.1,
        max_autotune,
        "max-autotune tunes GPU (Triton) kernels; the claim is a GPU claim",
    ),
    Claim(
        "amp_speed",
        "AMP: 1.6x speed",
        1.6,
        amp_speed,
        "the claim is about GPU tensor cores (CPU autocast is in the ladder's bf16 rung)",
    ),
    Claim("amp_batch", "AMP: 1.8x batch size", 1.8, amp_batch, "needs a device memory limit to run into"),
    Claim("cudnn_benchmark", "cudnn.benchmark set before compile: 1.4x on ResNet-50", 1.4, cudnn_benchmark, "cuDNN"),
    Claim("dynamic_compile", "torch.compile(dynamic=True): compile time 12 s -> 89 s", 89 / 12, dynamic_compile),
)
CLAIM_IDS = tuple(c.id for c in CLAIMS)


def verdict(claimed_ratio: float, measured_ratio: float) -> str:
    return "confirmed" if measured_ratio - 1 >= CONFIRM_SHARE * (claimed_ratio - 1) else "not reproduced"


def run_claims(
    base: Config,
    bundle: DataBundle,
    info: DistInfo,
    timing: Timing,
    meta: dict,
    only: set[str] | None = None,
    log: Callable[[str], None] = print,
) -> list[dict]:
    ctx = ClaimContext(base, bundle, info, timing, log)
    rows = []
    for claim in CLAIMS:
        row = {**meta, "claim": claim.id, "claim_text": claim.text, "claimed_ratio": claim.claimed_ratio}
        if claim.needs_cuda and info.device.type != "cuda":
            row.update(verdict="not measurable here", note=f"needs CUDA: {claim.needs_cuda}")
        elif only is not None and claim.id not in only:
            row.update(verdict="not measured", note="not selected (--only)")
        else:
            log(f"bench: claim {claim.id}: {claim.text} ...")
            try:
                m = claim.measure(ctx)
                row.update(
                    verdict=verdict(claim.claimed_ratio, m.ratio),
                    measured_ratio=m.ratio,
                    baseline_value=m.baseline,
                    variant_value=m.variant,
                    unit=m.unit,
                    method=m.method,
                    note=m.note,
                )
            except NotMeasurable as e:
                row.update(verdict="not measurable here", note=str(e))
            except Exception as e:  # a failed measurement is reported, and the other claims go on
                row.update(verdict="not measurable here", note=f"measurement failed: {error_text(e)}")
            free_device_memory(info.device)
        log(f"bench: claim {claim.id}: {claim_line(row)}")
        rows.append(row)
    return rows


def claim_line(row: dict) -> str:
    measured = f"measured {row['measured_ratio']:.2f}x" if "measured_ratio" in row else row.get("note", "")
    return f"claimed {row['claimed_ratio']:.2f}x, {measured} -> {row['verdict']}"
