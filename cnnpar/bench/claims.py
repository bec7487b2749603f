"""The founding document's quantitative claims, each measured on the workload it names, with a verdict
that states its noise.

Every claim is stated as an improvement factor (> 1 in the claimed direction) and measured as one
ratio of two measurements taken in this run, each the median of repeats. The repeats' range gives
the ratio's range (worst pairing to best). *confirmed*: the median effect (ratio - 1) is at least
half the claimed effect and the whole range lies above 1; *inside the noise*: the median effect
would confirm it but the range reaches 1; *not reproduced*: the median effect falls short (the
verdict adds whether the difference is inside the noise). A claim measured once per side (a
compile time, a memory size) has no range: its verdict adds *(single sample each, noise unknown)*.
A claim measured on a CPU stand-in for the model it names is *not comparable (measured on a
stand-in)*: the ratio is shown, but it is about another model. A claim that needs hardware this
run lacks is *not measurable here*, with the reason; one whose measurement raised is *failed*, with the error.

Each claim names its workload (`Claim.workload`): ResNet-18 at 32 px for the compile claims,
ResNet-50 at 224 for cuDNN and AMP, a torch DataLoader of ImageNet-sized images for pinned memory
and collate. On a CPU a claim runs on `Claim.cpu_workload`, the same one where it fits in a few
minutes on 2 cores, else a smaller stand-in that the table names as such.

Time: the whole table fits a budget (`--budget-s`; 170 s with CUDA, so the command ends within
3 minutes on one H200). The timed part of every measurement is sized from one step's time
(`Timing.seconds`); the two claims whose compile has no known bound (max-autotune, dynamic=True)
run last, each in a child process killed at the time left (bench/trial.py), and a claim cut off
says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from cnnpar.config import Config, command_line, to_dict
from cnnpar.presets import with_overrides

from .timing import Spread, Timing

CONFIRM_SHARE = 0.5  # share of the claimed effect a measurement must reach to confirm it
MIN_CLAIM_S = 5.0  # no claim starts with less time left than this
CUDA_BUDGET_S = 170.0  # the table's default budget with CUDA: the command ends within 3 minutes
CPU_BUDGET_S = 300.0  # and on a CPU: a few minutes on 2 cores
BUDGET_SPENT = "budget was spent"  # a claim's note where --budget-s left it no time (bench/run reads it)
CUT_OFF_VERDICT = "cut off"  # its child passed the time limit the budget gave it
ALONE_MORE = "; measure it alone with more time: "  # a cut-off claim's note, before the command that does


class NotMeasurable(Exception):
    """The claim cannot be measured on this machine; the message says why."""


@dataclass(frozen=True)
class Workload:
    model: str
    shape: str  # CxHxW of the synthetic uint8 images (a speed claim does not depend on pixel values)
    batch: int
    samples: int  # synthetic training images: several batches, so epochs turn over as in training
    text: str  # what the table says
    stand_in: str = ""  # on a CPU: why this replaces the named workload ("" when it is the named one)


RESNET18_32 = Workload("resnet18", "3x32x32", 512, 4096, "ResNet-18, 3x32x32, batch 512")
# the preprocessing of ResNet-18's CIFAR batches alone: no model runs ("-" in the model column)
PREPROCESS_32 = Workload("-", "3x32x32", 512, 4096, "preprocessing alone (no model), 3x32x32 uint8, batch 512")
RESNET50_224 = Workload("resnet50", "3x224x224", 128, 1024, "ResNet-50, 3x224x224, batch 128")
LOADER_224 = Workload(
    "resnet50",
    "3x224x224",
    128,
    1024,
    "ResNet-50, 3x224x224, batch 128; torch DataLoader of per-sample float images (default collate)",
)
CNN3_16 = Workload(
    "cnn3",
    "1x16x16",
    32,
    512,
    "cnn3, 1x16x16, batch 32",
    stand_in="CPU stand-in for ResNet-18 at 32 px, whose compile takes many minutes on 2 cores",
)


@dataclass(frozen=True)
class Measured:
    baseline: Spread
    variant: Spread
    unit: str
    method: str
    higher_is_better: bool = True  # images/s: yes; ms, seconds, CPU %: no (the claim's ratio inverts)
    note: str = ""
    steps: str = ""  # timed steps per repeat, baseline/variant
    config: str = ""  # the two sides' configs (`config_cell`); "" where no train config is built (preprocessing)

    @property
    def ratio(self) -> float:
        a, b = self.baseline.median, self.variant.median
        return b / a if self.higher_is_better else a / b

    @property
    def ratio_range(self) -> tuple[float, float]:
        """The ratio's range over the repeats: the worst pairing of the two sides, and the best."""
        a, b = self.baseline, self.variant
        if self.higher_is_better:
            return b.low / a.high, b.high / a.low
        return a.low / b.high, a.high / b.low


@dataclass
class ClaimContext:
    base: Config  # the user's: device, seed, workers
    info: object  # DistInfo
    timing: Timing
    log: Callable[[str], None]
    bundles: dict = field(default_factory=dict)

    @property
    def device(self):
        return self.info.device

    def config(self, w: Workload, **sections: dict) -> Config:
        """The workload as a config: defaults, synthetic images of its shape, its model and batch,
        the user's device and seed, and `sections` on top."""
        cfg = with_overrides(
            Config(),
            model={"name": w.model},
            data={
                "source": "synthetic",
                "format": "synthetic",
                "image_shape": w.shape,
                "synthetic_samples": w.samples,
                "val_fraction": 0.0,
            },
            run={"batch_size": w.batch, "seed": self.base.run.seed},
            speed={"device": self.base.speed.device},
        )
        return with_overrides(cfg, **sections) if sections else cfg

    def bundle(self, w: Workload):
        from cnnpar.data import load_data

        if w not in self.bundles:
            cfg = self.config(w)
            self.bundles[w] = load_data(cfg.data, cfg.run.seed)
        return self.bundles[w]

    def rate(self, cfg: Config, w: Workload) -> dict:
        from cnnpar.report.meters import free_device_memory

        from .measure import measure_config

        try:
            return measure_config(cfg, self.bundle(w), self.info, self.timing)
        finally:
            free_device_memory(self.device)  # before the second measurement of a pair


def config_cell(baseline: Config, variant: Config | None = None) -> str:
    """The `config` cell: each side as the `cnnpar train` line that runs its config (every setting that differs from
    the defaults: the workload's, the user's --seed and --workers), so a row read alone says what was measured, not
    only the method's words of it."""
    cell = f"baseline: {command_line(baseline)}"
    return cell if variant is None else f"{cell}; variant: {command_line(variant)}"


def _spread(row: dict, key: str = "images_per_s") -> Spread:
    return Spread(row[key], row[f"{key}_min"], row[f"{key}_max"])


def _speed(ctx: ClaimContext, w: Workload, a: Config, b: Config, method: str, note: str = "") -> Measured:
    ra = ctx.rate(a, w)
    ctx.log(f"  baseline {ra['images_per_s']:,.0f} img/s; now the variant ...")
    rb = ctx.rate(b, w)
    steps, config = _steps(ra, rb), config_cell(a, b)
    return Measured(_spread(ra), _spread(rb), "images/s", method, note=note, steps=steps, config=config)


def _steps(ra: dict, rb: dict) -> str:
    return per_repeat(ra["steps_per_repeat"], rb["steps_per_repeat"])


def per_repeat(baseline: int, variant: int) -> str:
    """The `steps_per_repeat` cell: the steps (batches, calls) each side timed per repeat, baseline/variant."""
    return f"{baseline}/{variant}"


# What a pipeline without cnnpar's fast paths does: no resident data, no side stream, eager.
PLAIN = {"resident": "off", "prefetch_stream": "off"}
EAGER = {"compile": "off", "cuda_graphs": "off"}
FAST_EAGER = {"precision": "bf16", "channels_last": "on", **EAGER}


def _workers(ctx: ClaimContext) -> int:
    from .ladder import ladder_workers

    return ladder_workers(ctx.base)


def pin_memory(ctx: ClaimContext, w: Workload) -> Measured:
    loader = {"loader": "textbook", "workers": _workers(ctx), "persistent_workers": True, **PLAIN}
    off = ctx.config(w, data={**loader, "pin_memory": "off"}, speed=FAST_EAGER)
    on = ctx.config(w, data={**loader, "pin_memory": "on"}, speed=FAST_EAGER)
    return _speed(ctx, w, off, on, "train step images/s, DataLoader with workers, bf16 eager: pin_memory off -> on")


def _textbook_and_fast(ctx: ClaimContext, w: Workload) -> tuple[Config, Config]:
    textbook = ctx.config(w, data={"loader": "textbook", "workers": 0, "pin_memory": "off", **PLAIN})
    return textbook, with_overrides(textbook, data={"loader": "fast"})


def collate_speed(ctx: ClaimContext, w: Workload) -> Measured:
    from . import probes

    textbook, fast = _textbook_and_fast(ctx, w)
    cuda = ctx.device.type == "cuda"
    a, a_steps = probes.host_loader_rate(textbook, ctx.bundle(w), ctx.timing)
    # with a GPU, the uint8 side's normalise, crop and flip run on the GPU: not host work
    b, b_steps = probes.host_loader_rate(fast, ctx.bundle(w), ctx.timing, host_only=cuda)
    how = "then batched normalise, crop, flip"
    if cuda:
        how = "the uint8 batch alone (normalise, crop, flip run on the GPU)"
    return Measured(
        a,
        b,
        "images/s",
        f"host loader alone (no model), 0 workers: per-sample float normalise, crop, flip + default collate -> "
        f"one uint8 index per batch, {how}",
        note="" if cuda else "on a CPU the batched transform is host work too, so it is counted",
        steps=per_repeat(a_steps, b_steps),  # batches the loader gave per repeat
        config=config_cell(textbook, fast),
    )


def collate_cpu(ctx: ClaimContext, w: Workload) -> Measured:
    textbook, fast = _textbook_and_fast(ctx, w)
    textbook, fast = (with_overrides(c, speed=FAST_EAGER) for c in (textbook, fast))
    ra, rb = ctx.rate(textbook, w), ctx.rate(fast, w)
    return Measured(
        _spread(ra, "main_cpu_pct"),
        _spread(rb, "main_cpu_pct"),
        "% of one core",
        "main-process CPU time / wall during bf16 train steps (0 workers): textbook -> uint8 loader",
        higher_is_better=False,
        note="top-style percentages (100% = one core busy)",
        steps=_steps(ra, rb),
        config=config_cell(textbook, fast),
    )


def compiled_preprocess(ctx: ClaimContext, w: Workload) -> Measured:
    import torch

    from . import probes

    c, h, wd = (int(v) for v in w.shape.split("x"))
    batch = torch.randint(0, 256, (w.batch, c, h, wd), dtype=torch.uint8)
    probes.warm_compiler(ctx.device)
    eager, eager_steps = probes.preprocess_ms(batch, False, ctx.device, ctx.timing)
    compiled, compiled_steps = probes.preprocess_ms(batch, True, ctx.device, ctx.timing)
    return Measured(
        eager,
        compiled,
        "ms/batch",
        f"cnnpar's device-side transform (pad-4 crop, flip on uint8, then normalise) on a batch of {w.batch}: "
        "eager -> torch.compile",
        higher_is_better=False,
        steps=per_repeat(eager_steps, compiled_steps),  # batches preprocessed per repeat
    )


def two_streams(ctx: ClaimContext, w: Workload) -> Measured:
    data = {"resident": "off", "pin_memory": "on"}
    off = ctx.config(w, data={**data, "prefetch_stream": "off"}, speed=FAST_EAGER)
    on = ctx.config(w, data={**data, "prefetch_stream": "on"}, speed=FAST_EAGER)
    return _speed(
        ctx,
        w,
        off,
        on,
        "train step images/s, uint8 batches from host memory, bf16 eager: side-stream H2D prefetch off -> on",
        "closest honest variant: a forward and its own backward are sequential, so there is "
        "nothing to overlap between them; what can overlap is the next batch's copy",
    )


def max_autotune(ctx: ClaimContext, w: Workload) -> Measured:
    eager = ctx.config(w, speed=FAST_EAGER)
    tuned = ctx.config(w, speed={**FAST_EAGER, "compile": "max-autotune"})
    return _speed(ctx, w, eager, tuned, "train step images/s, bf16: eager -> compile max-autotune (compile excluded)")


def amp_speed(ctx: ClaimContext, w: Workload) -> Measured:
    fp32 = ctx.config(w, speed={**FAST_EAGER, "precision": "fp32"})
    bf16 = ctx.config(w, speed=FAST_EAGER)
    return _speed(ctx, w, fp32, bf16, "train step images/s, channels_last, eager: fp32 (TF32 off) -> bf16 autocast")


def amp_batch(ctx: ClaimContext, w: Workload) -> Measured:
    from cnnpar.parallel import resolve_for

    from . import probes

    shape, found, cfgs = tuple(int(v) for v in w.shape.split("x")), {}, []
    for kind in ("fp32", "bf16"):
        cfgs.append(resolve_for(ctx.config(w, speed={**FAST_EAGER, "precision": kind}), ctx.device))
        found[kind] = probes.step_memory(cfgs[-1], shape, 10, ctx.device, (32, 64))
    a, b = found["fp32"], found["bf16"]
    return Measured(
        Spread.single(a["largest"]),
        Spread.single(b["largest"]),
        "images/batch",
        "largest batch the free memory holds, from the peak memory of one train step (fresh model, AdamW) "
        "at batches 32 and 64: (free - fixed) / per image",
        note=f"per image {a['per_image'] / 2**20:.1f} MiB fp32, {b['per_image'] / 2**20:.1f} MiB bf16; "
        f"free {a['free'] / 2**30:.0f} GiB; deterministic, no repeats",
        config=config_cell(*cfgs),
    )


def cudnn_benchmark(ctx: ClaimContext, w: Workload) -> Measured:
    off = ctx.config(w, speed={**FAST_EAGER, "cudnn_benchmark": False})
    on = ctx.config(w, speed={**FAST_EAGER, "cudnn_benchmark": True})
    return _speed(
        ctx,
        w,
        off,
        on,
        "train step images/s, bf16, channels_last, eager: cudnn.benchmark off -> on",
        "eager, to fit the 3-minute table: Inductor leaves convolutions to cuDNN (extern kernels), so "
        "the flag acts on the same calls with or without torch.compile",
    )


def dynamic_compile(ctx: ClaimContext, w: Workload) -> Measured:
    from cnnpar.parallel import resolve_for

    from . import probes

    cfg = resolve_for(ctx.config(w, speed={"compile": "default"}), ctx.device)
    shape = tuple(int(v) for v in w.shape.split("x"))
    probes.warm_compiler(ctx.device)
    ctx.log("bench: claim dynamic_compile: static compile ...")
    static = probes.compile_seconds(cfg, shape, 10, ctx.device, dynamic=None)
    ctx.log(f"bench: claim dynamic_compile: static compile {static:.1f} s; now dynamic=True ...")
    dynamic = probes.compile_seconds(cfg, shape, 10, ctx.device, dynamic=True)
    return Measured(
        Spread.single(static),
        Spread.single(dynamic),
        "s",
        "wall time of the first compiled forward + backward, caches off: static -> dynamic=True",
        higher_is_better=True,  # the claim is a slow-down: dynamic / static, > 1 in the claimed direction
        note="ratio is dynamic / static compile time (the claimed slow-down); one compile each, no spread",
        config=config_cell(cfg),  # both sides: the variant adds dynamic=True to its torch.compile
    )


@dataclass(frozen=True)
class Claim:
    id: str
    text: str
    claimed_ratio: float
    measure: Callable[[ClaimContext, Workload], Measured]
    workload: Workload  # the workload the claim names (on CUDA)
    cpu_workload: Workload | None  # on a CPU; None: the claim needs CUDA (`needs_cuda` says why)
    needs_cuda: str = ""
    isolate: int = 0  # > 0: a compile with no known bound; runs in a child, after the others, in this order


CLAIMS: tuple[Claim, ...] = (
    Claim(
        "pin_memory",
        "pin_memory=True: +18% throughput",
        1.18,
        pin_memory,
        LOADER_224,
        None,
        "page-locked memory only speeds host-to-GPU copies",
    ),
    Claim(
        "collate_speed",
        "uint8/NumPy collate 3x faster than the default collate",
        3.0,
        collate_speed,
        LOADER_224,
        LOADER_224,
    ),
    Claim(
        "collate_cpu",
        "uint8/NumPy collate: CPU 95% -> 42%",
        95 / 42,
        collate_cpu,
        LOADER_224,
        None,
        "on the CPU the same cores run the model, so the loader's CPU share cannot be told apart",
    ),
    Claim(
        "compiled_preprocess",
        "compiled preprocessing 2.3x faster",
        2.3,
        compiled_preprocess,
        PREPROCESS_32,
        PREPROCESS_32,
    ),
    Claim(
        "two_streams",
        "separate CUDA streams for forward and backward: -14% epoch time",
        1 / 0.86,
        two_streams,
        RESNET18_32,
        None,
        "CUDA streams",
    ),
    Claim(
        "max_autotune",
        "torch.compile(mode='max-autotune'): 2.1x on ResNet-18",
        2.1,
        max_autotune,
        RESNET18_32,
        None,
        "max-autotune tunes GPU (Triton) kernels; the claim is a GPU claim",
        isolate=2,
    ),
    Claim(
        "amp_speed",
        "AMP: 1.6x speed",
        1.6,
        amp_speed,
        RESNET50_224,
        None,
        "the claim is about GPU tensor cores (CPU autocast is in the ladder's bf16 rung)",
    ),
    Claim(
        "amp_batch",
        "AMP: 1.8x batch size",
        1.8,
        amp_batch,
        RESNET50_224,
        None,
        "needs a device memory limit to run into",
    ),
    Claim(
        "cudnn_benchmark",
        "cudnn.benchmark set before compile: 1.4x on ResNet-50",
        1.4,
        cudnn_benchmark,
        RESNET50_224,
        None,
        "cuDNN",
    ),
    Claim(
        "dynamic_compile",
        "torch.compile(dynamic=True): compile time 12 s -> 89 s",
        89 / 12,
        dynamic_compile,
        RESNET18_32,
        CNN3_16,
        isolate=1,
    ),
)
CLAIM_IDS = tuple(c.id for c in CLAIMS)
BY_ID = {c.id: c for c in CLAIMS}


def workload_for(claim: Claim, device_type: str) -> Workload | None:
    """The workload a claim runs on here: the one it names on CUDA, its CPU workload on a CPU."""
    return claim.workload if device_type == "cuda" else claim.cpu_workload


STAND_IN_VERDICT = "not comparable (measured on a stand-in)"
FAILED = "failed"  # the measurement raised (the note gives the error): not to be read as "needs other hardware"
SINGLE_SAMPLE = "single sample each, noise unknown"


def verdict(
    claimed_ratio: float,
    measured_ratio: float,
    low: float | None = None,
    high: float | None = None,
    stand_in: bool = False,
) -> str:
    """confirmed / inside the noise / not reproduced (see the module's docstring). No range (low, high
    None): one sample per side, so the verdict says its noise is unknown rather than treat it as none.
    A stand-in's ratio is about another model than the claim's, so it neither confirms nor refutes."""
    if stand_in:
        return STAND_IN_VERDICT
    enough = measured_ratio - 1 >= CONFIRM_SHARE * (claimed_ratio - 1)
    if low is None or high is None:
        return f"{'confirmed' if enough else 'not reproduced'} ({SINGLE_SAMPLE})"
    noisy = low <= 1.0 <= high
    if enough:
        return "inside the noise" if noisy else "confirmed"
    return "not reproduced (difference inside the noise)" if noisy else "not reproduced"


def measured_fields(claim: Claim, m: Measured, stand_in: bool = False) -> dict:
    low, high = m.ratio_range
    single = m.baseline.low == m.baseline.high and m.variant.low == m.variant.high
    return {
        "verdict": verdict(claim.claimed_ratio, m.ratio, None if single else low, None if single else high, stand_in),
        "measured_ratio": m.ratio,
        "ratio_low": "" if single else low,
        "ratio_high": "" if single else high,
        "baseline_value": m.baseline.median,
        "baseline_min": m.baseline.low,
        "baseline_max": m.baseline.high,
        "variant_value": m.variant.median,
        "variant_min": m.variant.low,
        "variant_max": m.variant.high,
        "unit": m.unit,
        "method": m.method,
        "note": m.note,
        "steps_per_repeat": m.steps,
        "config": m.config,
    }


def workload_fields(w: Workload) -> dict:
    return {
        "workload": w.text,
        "stand_in": w.stand_in,
        "model": w.model,
        "data": f"synthetic {w.shape}",
        "image_shape": w.shape,
        "batch_size": w.batch,
    }


def _measure_here(claim: Claim, ctx: ClaimContext, w: Workload) -> dict:
    """Measure in this process; any failure becomes a row, and the other claims go on."""
    from cnnpar.engine.stops import raise_if_the_stop
    from cnnpar.report.meters import free_device_memory

    from .measure import error_text

    try:
        return measured_fields(claim, claim.measure(ctx, w), bool(w.stand_in))
    except NotMeasurable as e:
        return {"verdict": "not measurable here", "note": str(e)}
    except Exception as e:
        raise_if_the_stop(e)  # a stop's doing is the stop, not a failed claim
        return {"verdict": FAILED, "note": f"measurement failed: {error_text(e)}"}
    finally:
        free_device_memory(ctx.device)  # after the traceback (and the tensors it holds) is gone


def _measure_in_child(claim: Claim, ctx: ClaimContext, limit_s: float) -> dict:
    from .trial import CUT_OFF, OK, run_child

    spec = {
        "kind": "claim",
        "claim": claim.id,
        "config": to_dict(ctx.base),
        "timing": asdict(ctx.timing),
    }
    r = run_child(spec, limit_s, ctx.log)
    if r.status == OK:
        m = r.value["measured"]
        m = Measured(**{**m, "baseline": Spread(*m["baseline"]), "variant": Spread(*m["variant"])})
        w = workload_for(claim, ctx.device.type)  # the one the child measured (measure_claim_in_child)
        return measured_fields(claim, m, bool(w and w.stand_in))
    if r.status == CUT_OFF:
        more = f"cnnpar bench --claims --only {claim.id} --device {ctx.device.type} --budget-s 900"
        return {"verdict": CUT_OFF_VERDICT, "note": f"{r.error}{ALONE_MORE}{more}"}
    return {"verdict": FAILED, "note": f"measurement failed: {r.error}"}


def measure_claim_in_child(spec: dict) -> dict:
    """The child's side of an isolated claim (bench/trial.py)."""
    from cnnpar.config import from_dict
    from cnnpar.dist import init_distributed

    from .timing import Timing
    from .trial import say

    base = from_dict(spec["config"], origin="claim trial")
    info = init_distributed(base.speed.device, debug_single=True)
    claim = BY_ID[spec["claim"]]
    ctx = ClaimContext(base, info, Timing(**spec["timing"]), say)
    w = workload_for(claim, info.device.type)
    say(f"measuring {claim.id} on {w.text}")  # the parent's progress line until the claim says more
    m = claim.measure(ctx, w)
    out = asdict(m)
    out["baseline"], out["variant"] = list(asdict(m.baseline).values()), list(asdict(m.variant).values())
    return {"measured": out}


def run_claims(
    base: Config,
    info,
    timing: Timing,
    meta: dict,
    only: set[str] | None = None,
    log: Callable[[str], None] = print,
    budget_s: float = 0.0,
    started: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    claims: tuple[Claim, ...] = CLAIMS,
    on_row: Callable[[list[dict]], None] = lambda rows: None,
) -> list[dict]:
    """One row per claim, in the table's order; claims run cheapest-bounded first and each is printed
    as it finishes. `budget_s` 0: the default for the device. `on_row` gets every claim's row after each
    measurement, those not yet measured saying so (what a stopped bench still writes)."""
    cuda = info.device.type == "cuda"
    budget_s = budget_s or (CUDA_BUDGET_S if cuda else CPU_BUDGET_S)
    t0 = clock() if started is None else started
    ctx = ClaimContext(base, info, timing, log)
    rows: dict[str, dict] = {}
    todo = []
    for claim in claims:
        w = workload_for(claim, info.device.type)
        row = {**meta, **workload_fields(w or claim.workload), "claim": claim.id, "claim_text": claim.text}
        row.update(claimed_ratio=claim.claimed_ratio)
        rows[claim.id] = row
        if w is None:
            row.update(verdict="not measurable here", note=f"needs CUDA: {claim.needs_cuda}")
        elif only is not None and claim.id not in only:
            row.update(verdict="not measured", note="not selected (--only)")
        else:
            todo.append((claim, w))
    todo.sort(key=lambda cw: cw[0].isolate)  # the unbounded compiles last, so they get what is left
    log(f"bench: {len(todo)} claim(s) to measure within {budget_s:.0f} s")
    for i, (claim, w) in enumerate(todo):
        row, left = rows[claim.id], t0 + budget_s - clock()
        if left < MIN_CLAIM_S:
            more = f"cnnpar bench --claims --only {claim.id} --device {info.device.type}"
            row.update(verdict="not measured", note=f"the {budget_s:.0f} s {BUDGET_SPENT}; alone: {more}")
        else:
            log(f"bench: claim {claim.id} on {w.text} ...")
            start = clock()
            if claim.isolate:
                isolated_left = sum(1 for c, _ in todo[i:] if c.isolate)
                row.update(_measure_in_child(claim, ctx, left / isolated_left))
            else:
                row.update(_measure_here(claim, ctx, w))
            row["seconds"] = clock() - start
        log(f"bench: claim {claim.id}: {claim_line(row)}  [{clock() - t0:.0f} s]")
        stopped = {"verdict": "not measured", "note": "the bench stopped before it ran"}  # if it stops next
        on_row([rows[c.id] if "verdict" in rows[c.id] else {**rows[c.id], **stopped} for c in claims])
    return [rows[c.id] for c in claims]


def claim_line(row: dict) -> str:
    if row.get("measured_ratio", "") == "":
        return f"claimed {row['claimed_ratio']:.2f}x: {row['verdict']} ({row.get('note', '')})"
    spread = f", range {row['ratio_low']:.2f}-{row['ratio_high']:.2f}x" if row.get("ratio_low", "") != "" else ""
    return f"claimed {row['claimed_ratio']:.2f}x, measured {row['measured_ratio']:.2f}x{spread} -> {row['verdict']}"
