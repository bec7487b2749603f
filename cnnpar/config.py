"""The configuration tree: frozen dataclasses, validated on construction.

Every field carries its help text in `metadata["help"]`; the CLI builds one flag per field from
it (`cli_flag`), so the help a user reads and the field a run stores cannot drift apart. Values
that depend on the machine ("auto") stay "auto" here and are resolved against the device by
`resolve_for_device`; the resolved tree is what a run writes next to its results.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import sys
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from cnnpar.errors import ConfigError

PRECISIONS = ("auto", "fp32", "tf32", "bf16", "fp16")
COMPILE_MODES = ("auto", "off", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
TRISTATE = ("auto", "on", "off")
AUGMENTS = (
    "auto",
    "none",
    "flip",
    "crop",
    "crop+flip",
    "altflip",
    "crop+altflip",
    "translate",
    "translate+flip",
    "translate+altflip",
)
TTA_LEVELS = ("none", "flip", "flip+translate")
OPTIMIZERS = ("sgd", "adamw", "muon")
SCHEDULES = ("onecycle", "cosine", "constant")
LR_SCALINGS = ("none", "linear", "sqrt")
LOADERS = ("fast", "textbook")
DECODERS = ("auto", "cpu", "gpu", "hardware", "nvimgcodec", "nvimgcodec-workers")
STRATEGIES = ("ddp", "horovod")
DEVICES = ("auto", "cpu", "cuda")
CPU_BATCH = 64  # --batch-size auto on the CPU
MAX_CLASSES = 1_000_000  # a class count (or a label from which it is inferred) beyond any classifier's
# the largest --image-size: one 3x8192x8192 image is 201 MB of uint8 (805 MB as floats); a larger side is a typo
# (--image-size 20000 asked the digits' resize for 2.9 TB and stopped in a traceback)
MAX_IMAGE_SIZE = 8192
LR_BATCH = 64  # the batch --lr is the lr for when neither --lr-batch nor a fixed --batch-size says (optim.lr_batch)
# --lr auto: each optimizer's own peak lr at --lr-batch (`asked_lr`). One lr for all three trained Nesterov SGD at
# AdamW's 0.002: 75 % on the built-in digits in 3 epochs where 0.025 reached 98.5 % (5 seeds). sgd's is the linear
# rule's 0.1 at batch 256 (Goyal et al. 2017) at 64; muon's drives its SGD groups (the linear layers, biases and
# norms: its conv filters train at --muon-lr), which at 0.002 cost 4.4 points on 5,000 CIFAR-10 images. Measured:
# benchmarks/results/default_lr_cpu/ (cnn3, 3 epochs, the digits and those CIFAR-10 images)
DEFAULT_LRS = {"adamw": 2e-3, "sgd": 0.025, "muon": 0.025}

# What the data settings left at 0 or auto come to, kept here (the lowest layer that --help reads) so that the help
# states the values the loaders use rather than a copy of them (data/ and presets.py import them from here)
DIGITS_SIZE = 16  # --image-size 0 on the built-in 8x8 digits: enlarged once loaded
MIXED_SIDE = 224  # --image-size 0 on image folders of mixed or large sizes: the usual ImageNet input
# A shared size is kept up to ImageNet's resize side: small images (digits, CIFAR, 64-256 px sets) are not enlarged,
# and photos of one camera's size (1600x1200, 4032x3024) are not trained whole: at their shorter side a model's
# activations take 29-180x those at 224 (a doctor run on 1600x1200 photos grew to 24 GB and was killed unheard)
KEPT_UP_TO = 256
SYNTHETIC_SHAPE = "3x32x32"  # --data synthetic without --image-shape
SYNTHETIC_CLASSES = 10  # --data synthetic without --num-classes
RESIDENT_MEMORY_SHARE = 0.25  # --resident auto: at most this share of free device memory for a resident data set
# --compile-tiling/--compile-tuning auto: on from this many images a process trains (the measurement behind it:
# presets.py, beside long_compiles_default)
LONG_RUN_IMAGES = 40_000_000

# Which models torch.compile helps, by device, from benchmarks/results/h200-2026-11-29 (one H200,
# torch 2.11, bf16, channels_last, cnnpar's Trainer with resident data): ResNet-50 at 224, batch
# 256: 4,660 img/s eager, 6,753 compiled, 6,854 compiled with CUDA graphs; ResNet-18 at 32, batch
# 512: 59,258 eager, 37,872 compiled, 61,730 eager with CUDA graphs, 84,868 compiled with CUDA
# graphs. Compile alone slowed the small-input model (its step is launch-bound and compile adds
# host work per call); with the step captured as a graph the launches are gone and compile's
# fusions pay. CUDA graphs are on by default for one CUDA process (see resolve_for_device), so
# compile is on for both measured models. Models not measured stay eager. On the CPU the compile
# time (tens of seconds) is rarely repaid in a short run.
_COMPILE_HELPS_ON_CUDA = {"resnet18", "resnet50"}


def _f(
    default: Any,
    help: str,
    flag: str | None = None,
    choices: tuple | None = None,
    auto_zero: bool = False,
    shown: str = "",
    auto_minus_one: bool = False,
    advice: Any = None,
) -> Any:
    # auto_zero: a number field where 0 means "auto" (the CLI takes the word too, e.g. --batch-size auto)
    # auto_minus_one: a count where -1 means "auto", 0 being a count of its own (--workers 0: no worker process);
    # the CLI and a config file take the word too, as predict's --workers does
    # shown: the default as --help says it: "auto", not the 0 that stands for it; given, what an empty default
    # stands for (--name's '' is a name made at the start). No "%" in it: argparse formats help text with it
    # advice: value -> what to do instead, for a value outside `choices` that a habit explains ("" where none does)
    shown = shown or ("auto" if (auto_zero and default == 0) or (auto_minus_one and default == -1) else repr(default))
    meta = {"help": help, "flag": flag, "choices": choices, "auto_zero": auto_zero, "shown": shown, "advice": advice}
    meta["auto_minus_one"] = auto_minus_one
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: default, metadata=meta)
    return field(default=default, metadata=meta)


def setting_name(section: str, name: str) -> str:
    """`run.epochs (--epochs)`: the key a config file sets and the flag the command line types, for messages
    that must make sense to either."""
    cls = _SECTION_TYPES.get(section)
    f = next((f for f in fields(cls) if f.name == name), None) if cls is not None else None
    return f"{section}.{name}" if f is None else f"{section}.{name} ({cli_option(f)})"


def _check_choice(section: str, name: str, value: Any, choices: tuple, advice: str = "") -> None:
    if value not in choices:
        also = f" ({advice})" if advice else ""
        raise ConfigError(
            f"{setting_name(section, name)} = {value!r}: expected one of {', '.join(map(str, choices))}{also}"
        )


def choice_with_advice(choices: tuple, advice):
    """An argparse type for a flag whose wrong values a habit explains (`--device cuda:1`, `mps`): argparse's own
    "invalid choice" lists what is allowed but not how to get what was meant. Other values pass on to argparse's
    check of the choices."""

    def parse(text: str) -> str:
        if text not in choices and (why := advice(text)):
            raise argparse.ArgumentTypeError(f"{text!r}: expected one of {', '.join(choices)} ({why})")
        return text

    parse.__name__ = "choice"  # argparse names the type in some messages
    return parse


def workers_or_auto(text: str) -> int:
    """`--workers` of every command that has one (the config's, predict's, prepare's, the DDP scaling benchmark's): a
    count >= 0 (0: none, the work done in the command's own process), or auto (-1, as the config's workers takes it:
    sized to the machine)."""
    if text.strip().lower() in ("auto", "-1"):
        return -1
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number >= 0 or auto") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text}: expected a whole number >= 0 or auto")
    return value


def spelling_advice(text: str, meant: str) -> str:
    """How `text` misspells the choice `meant` (`CUDA`, `" cuda"`, for cuda): its case, spaces around it, or both; a
    "cuda " said to be "written in lower case" sent the user after a case that was right."""
    how = [
        words
        for words, wrong in (("in lower case", text.strip() != meant), ("without spaces", text != text.strip()))
        if wrong
    ]
    return f"written {' and '.join(how)}: {meant}"


def device_advice(value: Any) -> str:
    """What to do instead of a device cnnpar does not take, where a habit explains the value ("" otherwise): PyTorch's
    `cuda:N` (cnnpar gives each process the GPU of its local rank among those visible, so the GPU is chosen by
    CUDA_VISIBLE_DEVICES) or Apple's `mps` (no MPS path: its autocast, compile and pinned memory are untested here)."""
    text = str(value).strip().lower()
    if text in DEVICES:  # CUDA, Cpu, "cuda " (a config file's): the choices, as torch's device names, are lower case
        return spelling_advice(str(value), text)
    if m := re.fullmatch(r"cuda:(\d+)", text):
        n = m.group(1)
        which = (
            "--device cuda is GPU 0" if n == "0" else f"CUDA_VISIBLE_DEVICES={n} with --device cuda trains on GPU {n}"
        )
        # --nproc starts several processes for train alone (doctor, bench, tune and profile run one)
        return (
            f"a process trains on the GPU of its local rank among those visible: {which}; cnnpar train --nproc N "
            "trains on N GPUs"
        )
    if text == "mps":
        return "cnnpar trains on a CUDA GPU or the CPU, not on an Apple GPU through MPS: auto picks the CPU there"
    return ""


def _check_positive(section: str, name: str, value: Any, allow_zero: bool = False) -> None:
    ok = value >= 0 if allow_zero else value > 0
    if not ok:
        raise ConfigError(
            f"{setting_name(section, name)} = {value!r}: expected a number {'>= 0' if allow_zero else '> 0'}"
        )


def _check_range(section: str, name: str, value: int, top: int) -> None:
    """An int field where 0 means auto and a count is bounded by `top`."""
    if not 0 <= value <= top:
        raise ConfigError(f"{setting_name(section, name)} = {value!r}: expected 0 (auto) or 1..{top:,}")


def _check_finite(section: str, cfg: Any) -> None:
    """Refuse NaN and inf in every float field, first: NaN fails no comparison, so a range check
    lets it through (momentum, weight_decay, ddp_bucket_mb have none), and inf passes `> 0` (lr)."""
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{setting_name(section, f.name)} = {value}: expected a finite number, not nan or inf")


def parse_shape(text: str) -> tuple[int, int, int]:
    """'3x32x32' -> (3, 32, 32); '28x28' -> (1, 28, 28)."""
    parts = text.lower().replace("×", "x").split("x")
    try:
        dims = [int(p) for p in parts]
    except ValueError:
        raise ConfigError(f"--image-shape {text}: expected CxHxW such as 3x32x32 (or HxW for grey)") from None
    if len(dims) == 2:
        dims = [1, *dims]
    if len(dims) != 3 or min(dims) <= 0:
        raise ConfigError(f"--image-shape {text}: expected CxHxW such as 3x32x32 (or HxW for grey)")
    c, h, w = dims
    if c not in (1, 3) and w in (1, 3):
        # HxWxC typed as numpy shapes it (16x16x3): read as CxHxW it made 16 channels of 16x3 and trained on that;
        # the models take any channel count, so a 4-channel 4x32x32 stays allowed
        raise ConfigError(f"--image-shape {text}: channels come first: expected {w}x{c}x{h}")
    return c, h, w


@dataclass(frozen=True)
class DataConfig:
    source: str = _f(
        "digits",
        "data: 'digits' (built in), 'synthetic', a train.csv, an .npz, a .npy of images (np.save; with --labels "
        "LABELS.npy), an image folder, or a .cnnpar store (cnnpar prepare)",
        flag="data",
    )
    labels: str = _f(
        "",
        "a CSV that labels a flat --data folder of images (Kaggle's train/<id>.jpg + labels.csv): a header; the "
        "first column names the image (its path under the folder, with or without its extension); the label is "
        "the column named 'label', else the second of exactly two columns; whole-number labels are classes in "
        "numeric order, other labels classes in sorted order; images it does not name are not read; --val-fraction "
        "holds out; '' reads class folders. Beside --data IMAGES.npy: a LABELS.npy of their class indices, read "
        "as an .npz's y_train",
    )
    format: str = _f(
        "auto",
        "how to read --data: digits, synthetic, csv, npz, npy, folder, store, or auto (from --data: its word, a "
        "folder, or its name's .csv, .csv.gz, .npz, .npy or .cnnpar)",
        choices=("auto", "digits", "synthetic", "csv", "npz", "npy", "folder", "store"),
    )
    image_shape: str = _f(
        "", f"CxHxW of CSV rows (inferred for square grey images) or of synthetic data ({SYNTHETIC_SHAPE} unless given)"
    )
    image_size: int = _f(
        0,
        "resize images to NxN, whatever the source: image folders and stores (decoded to this side), CSV rows, "
        ".npz arrays, synthetic data and the built-in digits (resized once loaded; non-square arrays become "
        f"square); 0 keeps the source size (folders and stores: the size their images share, up to {KEPT_UP_TO}; else "
        f"{MIXED_SIDE}, for mixed or larger sizes; digits: {DIGITS_SIZE}; CSV, .npz and synthetic: their own shape, "
        "--image-shape for CSV and synthetic)",
    )
    num_classes: int = _f(
        0,
        "classes: labels must lie in 0..N-1; 0 infers N from the labels (folders: one per subfolder; synthetic: "
        f"{SYNTHETIC_CLASSES})",
    )
    synthetic_samples: int = _f(4096, "samples of synthetic data (the --val-fraction hold-out comes out of them)")
    val_fraction: float = _f(0.2, "held-out fraction (seeded) when the data has no labelled test split")
    loader: str = _f(
        "fast",
        "'fast': uint8 batches, device-side transforms; 'textbook': per-sample float "
        "transforms and default collate (the baseline the benchmarks compare against)",
        choices=LOADERS,
    )
    workers: int = _f(
        -1,
        "DataLoader worker processes (0: in the main process); auto (or -1) sizes them to the machine and the source",
        auto_minus_one=True,
    )
    pin_memory: str = _f("auto", "page-locked host batches for faster copies (auto: on with CUDA)", choices=TRISTATE)
    persistent_workers: bool = _f(True, "keep worker processes alive between epochs")
    prefetch_factor: int = _f(4, "batches each worker prepares ahead")
    prefetch_stream: str = _f(
        "auto",
        "copy the next batch on a side CUDA stream while this one computes (auto: on with CUDA)",
        choices=TRISTATE,
    )
    resident: str = _f(
        "auto",
        "keep the whole uint8 data set in device memory (auto: on CUDA when it fits in "
        f"{RESIDENT_MEMORY_SHARE * 100:g} percent of the free device memory; off on the CPU)",
        choices=TRISTATE,
    )
    decode: str = _f(
        "auto",
        "where image-folder JPEGs are decoded: cpu (worker processes), gpu (torchvision's nvJPEG on the "
        "device), hardware (the GPU's JPEG engines through nvJPEG's hardware backend: A100, H100, H200; "
        "files they cannot take go the gpu way) or nvimgcodec (nvImageCodec: the GPU's hardware JPEG "
        "engines; pip install 'cnnpar[nvimgcodec]') or nvimgcodec-workers (nvImageCodec driven from the "
        "worker processes, "
        "each with its own CUDA context); auto: hardware where the GPU has JPEG engines (measured fastest "
        "on an H200), else gpu with CUDA, else cpu",
        choices=DECODERS,
    )
    cpu_share: float = _f(
        0.0,
        "with a GPU decoder: the share of each batch the worker processes decode on the CPU themselves, "
        "beside the GPU (0..1; photos only; gained nothing on an H200 host with 16 cores)",
    )
    gpu_resize: str = _f(
        "auto",
        "with a GPU decoder, how crops are resized: batched (a few kernels per batch; 3.4x the loop on an "
        "H200) or loop (one image at a time, the reference); auto: batched on CUDA, loop on the CPU",
        choices=("auto", "loop", "batched"),
    )
    crop_min_scale: float = _f(
        0.25,
        "image folders and stores: the smallest area of a training random-resized crop, as a share of the image "
        "(0 < value <= 1; each crop's area is drawn uniformly between it and the whole image, its aspect ratio "
        "between 3:4 and 4:3); torchvision's RandomResizedCrop and the classic ImageNet recipe use 0.08",
    )
    augment: str = _f(
        "auto",
        "device-side augmentation: crop (reflect-pad 4, random window) or translate (the same by 2 px), "
        "with flip (random each epoch) or altflip (seeded per image in the first epoch, then alternating); "
        "auto: crop+flip for colour (3-channel) images, none for grey ones (a mirrored digit reads as another), "
        "flip alone for image folders and stores (their loader already draws random-resized crops)",
        choices=AUGMENTS,
    )

    def __post_init__(self) -> None:
        _check_finite("data", self)
        _check_choice("data", "augment", self.augment, AUGMENTS)
        if not 0.0 <= self.val_fraction < 1.0:
            raise ConfigError(f"{setting_name('data', 'val_fraction')} = {self.val_fraction}: expected 0 <= value < 1")
        if self.image_shape:
            try:
                parse_shape(self.image_shape)
            except ConfigError as e:  # named as the other settings are, so a file's value is told from a flag's
                why = str(e).split(": ", 1)[1]
                raise ConfigError(f"{setting_name('data', 'image_shape')} = {self.image_shape!r}: {why}") from None
        # bounded above: num_classes = 2**63 - 1 built a list of that many class names until the OOM killer came
        _check_range("data", "num_classes", self.num_classes, MAX_CLASSES)
        _check_positive("data", "synthetic_samples", self.synthetic_samples)
        _check_range("data", "image_size", self.image_size, MAX_IMAGE_SIZE)
        _check_positive("data", "prefetch_factor", self.prefetch_factor)
        if not 0.0 <= self.cpu_share <= 1.0:
            raise ConfigError(f"{setting_name('data', 'cpu_share')} = {self.cpu_share}: expected 0 <= value <= 1")
        if not 0.0 < self.crop_min_scale <= 1.0:
            raise ConfigError(
                f"{setting_name('data', 'crop_min_scale')} = {self.crop_min_scale}: expected 0 < value <= 1"
            )
        if self.workers < -1:
            raise ConfigError(f"{setting_name('data', 'workers')} = {self.workers}: expected -1 (auto) or a count >= 0")


@dataclass(frozen=True)
class ModelConfig:
    name: str = _f("cnn3", "model from the registry (see `cnnpar models`)", flag="model")

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError(f"{setting_name('model', 'name')} is empty: expected a name from `cnnpar models`")


@dataclass(frozen=True)
class OptimConfig:
    optimizer: str = _f(
        "adamw",
        "sgd (Nesterov momentum), adamw, or muon (Muon for the 4-D conv filters, SGD with Nesterov momentum "
        "for the rest)",
        choices=OPTIMIZERS,
    )
    lr: float = _f(
        0.0,
        "peak learning rate for the per-process batch (see --lr-scaling); with --batch-size auto, the lr at "
        "--lr-batch, scaled to the batch chosen (linear for sgd and muon, square root for adamw). auto (0): the "
        f"optimizer's own, at --lr-batch as a typed --lr: adamw {DEFAULT_LRS['adamw']:g}, sgd {DEFAULT_LRS['sgd']:g} "
        f"({DEFAULT_LRS['sgd'] * 256 / LR_BATCH:g} at batch 256, linear), muon {DEFAULT_LRS['muon']:g} (its SGD "
        "groups; the filters take --muon-lr). A preset's lr is for its own optimizer: another --optimizer beside "
        "it with no --lr takes its own (auto)",
        auto_zero=True,
    )
    lr_batch: int = _f(
        0,
        "the per-process batch --lr is the lr for: --batch-size auto scales the lr from it to the batch chosen "
        "(linear for sgd and for muon's SGD groups, square root for adamw; --muon-lr is not scaled); a fixed "
        "--batch-size trains at --lr as it is. auto (0): --batch-size where it is a number (a run's record: the "
        f"batch its lr trained at), else {LR_BATCH}; the presets set the batch they were tuned at",
        auto_zero=True,
    )
    weight_decay: float = _f(
        5e-4,
        "weight decay: decoupled for adamw (lr x this per step); coupled L2 for sgd and muon's SGD groups (added "
        "to the gradient, so it goes through the momentum)",
    )
    momentum: float = _f(
        0.9, "SGD's Nesterov momentum (--optimizer sgd, and Muon's SGD groups; AdamW has none); 0: plain SGD"
    )
    schedule: str = _f(
        "onecycle",
        "the lr after the --warmup: onecycle falls from the peak in a straight line to 0 at the end, cosine along "
        "half a cosine to 0, constant stays at the peak",
        choices=SCHEDULES,
    )
    warmup: float = _f(
        0.15,
        "fraction of all steps spent warming up, in a straight line to the peak lr (above 0: the first step at half "
        "the lr at most)",
    )
    label_smoothing: float = _f(0.0, "label smoothing of the cross-entropy loss")
    grad_clip: float = _f(0.0, "clip the global gradient norm to this (0: off)")
    grad_accum: int = _f(1, "micro-batches per optimizer step")
    lr_scaling: str = _f(
        "none", "scale lr with the global batch: none, linear or sqrt of world size x accum", choices=LR_SCALINGS
    )
    bias_lr_scale: float = _f(1.0, "lr multiplier for biases and norm parameters (airbench: 64)")
    ema: float = _f(
        0.0, "average the weights: per-step decay of an exponential moving average, evaluated and saved (0: off)"
    )
    ema_every: int = _f(
        1, "optimizer steps between updates of the average (each update decays by --ema to the power of this)"
    )
    ema_start: float = _f(0.0, "fraction of all steps trained before the average starts")
    ema_warmup: float = _f(
        0.0, "decay grows as (step / total steps) ** this: little averaging early, strong at the end (0: constant)"
    )
    lookahead: bool = _f(False, "copy the average back into the trained weights at every update (airbench)")
    whiten_bias_epochs: int = _f(0, "train a whitened stem's bias only for this many epochs, then hold it (0: always)")
    whiten_frozen: bool = _f(False, "keep a whitened stem's filters as the data set them (only its bias trains)")
    bias_decay: bool = _f(
        False,
        "decay biases and norm parameters too, by --weight-decay / --bias-lr-scale: the same share per step as "
        "the weights at their larger lr (airbench94_muon)",
    )
    muon_lr: float = _f(
        0.24,
        "--optimizer muon: the conv filters' peak lr, on the schedule --lr follows (not scaled with the world "
        "size: a Muon step's size does not depend on the gradient's)",
    )
    muon_momentum: float = _f(0.6, "--optimizer muon: the filters' Nesterov momentum")
    muon_ns_steps: int = _f(3, "--optimizer muon: Newton-Schulz iterations per step (torch's default is 5)")
    muon_normalize: bool = _f(
        False,
        "--optimizer muon: rescale each filter bank to norm sqrt(out channels) before every step, in place of "
        "weight decay (for filters that feed BatchNorm, as fastnet's do; airbench94_muon)",
    )

    def __post_init__(self) -> None:
        _check_finite("optim", self)
        _check_choice("optim", "optimizer", self.optimizer, OPTIMIZERS)
        _check_choice("optim", "schedule", self.schedule, SCHEDULES)
        _check_choice("optim", "lr_scaling", self.lr_scaling, LR_SCALINGS)
        _check_positive("optim", "lr", self.lr, allow_zero=True)
        _check_positive("optim", "lr_batch", self.lr_batch, allow_zero=True)
        # torch's optimizers refuse negative ones with a ValueError traceback at the run's start
        _check_positive("optim", "weight_decay", self.weight_decay, allow_zero=True)
        # momentum 1 never forgets a gradient and above 1 each one grows: both diverge, blamed on the lr
        if not 0.0 <= self.momentum < 1.0:
            raise ConfigError(f"{setting_name('optim', 'momentum')} = {self.momentum}: expected 0 <= value < 1")
        _check_positive("optim", "grad_accum", self.grad_accum)
        _check_positive("optim", "grad_clip", self.grad_clip, allow_zero=True)
        if not 0.0 <= self.warmup < 1.0:
            raise ConfigError(f"{setting_name('optim', 'warmup')} = {self.warmup}: expected 0 <= value < 1")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(
                f"{setting_name('optim', 'label_smoothing')} = {self.label_smoothing}: expected 0 <= value < 1"
            )
        if not 0.0 <= self.ema < 1.0:
            raise ConfigError(f"{setting_name('optim', 'ema')} = {self.ema}: expected 0 (off) or a decay 0 < value < 1")
        if not 0.0 <= self.ema_start < 1.0:
            raise ConfigError(f"{setting_name('optim', 'ema_start')} = {self.ema_start}: expected 0 <= value < 1")
        if self.lookahead and not self.ema:
            raise ConfigError(
                f"{setting_name('optim', 'lookahead')} = true needs an average to copy back: set "
                f"{setting_name('optim', 'ema')} (e.g. 0.95)"
            )
        _check_positive("optim", "ema_every", self.ema_every)
        _check_positive("optim", "ema_warmup", self.ema_warmup, allow_zero=True)
        _check_positive("optim", "bias_lr_scale", self.bias_lr_scale)
        _check_positive("optim", "whiten_bias_epochs", self.whiten_bias_epochs, allow_zero=True)
        _check_positive("optim", "muon_lr", self.muon_lr)
        if not 0.0 <= self.muon_momentum < 1.0:
            raise ConfigError(
                f"{setting_name('optim', 'muon_momentum')} = {self.muon_momentum}: expected 0 <= value < 1"
            )
        if not 1 <= self.muon_ns_steps < 100:
            raise ConfigError(
                f"{setting_name('optim', 'muon_ns_steps')} = {self.muon_ns_steps}: expected 1 <= value < 100"
            )


@dataclass(frozen=True)
class SpeedConfig:
    device: str = _f(
        "auto",
        "cpu, cuda or auto (CUDA where visible, else the CPU); a process trains on the GPU of its local rank among "
        "those visible: CUDA_VISIBLE_DEVICES=1 picks GPU 1, cnnpar train --nproc N trains on N GPUs",
        choices=DEVICES,
        advice=device_advice,
    )
    precision: str = _f(
        "auto",
        "fp32, tf32 (CUDA only), bf16, fp16 (with a GradScaler) or auto: bf16 on a GPU that computes it and on a CPU "
        "with native bf16 (AVX512-BF16 or AMX), else fp32 (emulated bf16 is slower than fp32)",
        choices=PRECISIONS,
    )
    channels_last: str = _f(
        "auto",
        "NHWC memory format (auto: on, CPU and CUDA alike: convolutions measured faster in NHWC)",
        choices=TRISTATE,
    )
    compile: str = _f(
        "auto",
        "torch.compile mode, or off. auto: default for "
        + " and ".join(sorted(_COMPILE_HELPS_ON_CUDA))
        + " on CUDA (measured faster on an H200), off for other models and on the CPU (its compile, tens of seconds "
        "to minutes, is rarely repaid in a short run)",
        choices=COMPILE_MODES,
    )
    cudnn_benchmark: bool = _f(True, "let cuDNN time its algorithms for fixed shapes")
    compile_tuning: str = _f(
        "auto",
        "tune the block sizes of inductor's own kernels by timing them (coordinate descent) at compile time "
        "(with --compile default or reduce-overhead; the max-autotune modes tune so already): "
        "ResNet-18 at 32 px ran 1.022x (b512), 1.027x (b2048) and 1.044x (b4096) as fast on an H200 for a compile "
        "85-120 s longer; ResNet-50 224 b512 with --compile-tiling on too: 1.088x and 1.085x the defaults in two "
        "calls, for a compile of ~6 minutes (benchmarks/results/2026-12-01-h200/call-zn, call-zp, call-zzp, "
        "call-zzq). auto: on where --compile-tiling's auto turns on (the same rule, below)",
        choices=TRISTATE,
    )
    compile_tiling: str = _f(
        "auto",
        "generate inductor's kernels with N-d tiling (triton.prefer_nd_tiling) and pick each pointwise kernel's "
        "config by timing (max_autotune_pointwise), for this model's compile only: ResNet-50 224 on an H200 "
        "1.057x as fast at b256 (7,545 against 7,139 img/s) and 1.062x at b512, for a compile 2-2.5 min "
        "longer; ResNet-18 32 px b512, tiling alone: 1.004x (benchmarks/results/2026-12-01-h200/call-zzi to "
        "call-zzo). auto: on, with --compile-tuning, for ResNet-50 compiled on CUDA when a process trains at "
        f"least {LONG_RUN_IMAGES:,} images (epochs x its share of the training set), the run length at which the "
        "faster step repays the longer compile; off otherwise. `cnnpar tune` tries it",
        choices=TRISTATE,
    )
    stem_space_to_depth: str = _f(
        "auto",
        "compute a stride-2 stem convolution on at most 4 channels (ResNet's 7x7 at 64 px and up) as the same "
        "function on 2x2 blocks of the input: a 4x4 stride-1 convolution on 12 channels, zero-padded to 16, "
        "for tensor-core kernels that 3 channels do not get; weights and checkpoints "
        "unchanged, equal to the plain convolution to rounding. auto: on with CUDA (ResNet-50 224 b256 on an "
        "H200: 1.048x and 1.044x the plain stem's img/s, benchmarks/results/2026-12-01-h200/call-zq, call-zr), "
        "off on the CPU (not measured there). Other GPUs, models and precisions are not measured: `cnnpar tune` "
        "tries it the other way",
        choices=TRISTATE,
    )
    compile_eval: bool = _f(
        False,
        "evaluate through the compiled model too (one more compile, at the first evaluation; one process "
        "without weight averaging, else the plain module evaluates)",
    )
    cuda_graphs: str = _f(
        "auto",
        "replay forward+backward as one CUDA graph (static shapes, one process, "
        "no accumulation; auto: on with CUDA where it applies, measured faster on an H200)",
        choices=TRISTATE,
    )

    def __post_init__(self) -> None:
        _check_choice("speed", "device", self.device, DEVICES, device_advice(self.device))  # a file's cuda:1
        for name, choices in (
            ("precision", PRECISIONS),
            ("channels_last", TRISTATE),
            ("compile", COMPILE_MODES),
            ("cuda_graphs", TRISTATE),
            ("stem_space_to_depth", TRISTATE),
            ("compile_tuning", TRISTATE),
            ("compile_tiling", TRISTATE),
        ):
            _check_choice("speed", name, getattr(self, name), choices)


@dataclass(frozen=True)
class DistConfig:
    strategy: str = _f("ddp", "ddp (torchrun) or horovod (horovodrun)", choices=STRATEGIES)
    nproc: int = _f(0, "start this many local processes through torchrun (0: run as launched)")
    sync_bn: bool = _f(False, "convert BatchNorm to SyncBatchNorm under DDP")
    debug_single: bool = _f(False, "ignore the torchrun environment and run one process (also CNNPAR_DEBUG_SINGLE=1)")
    timeout_s: int = _f(600, "collective timeout in seconds")
    # DDP's own switches (issue 13: scale-out like plain DDP): benchmarks/ddp_scaling.py measures them
    ddp_bucket_mb: float = _f(
        0.0,
        "DDP gradient bucket size in MiB (0: torch's own, 25): larger buckets, fewer all-reduce calls; "
        "smaller, the first starts earlier beside the backward",
    )
    ddp_static_graph: bool = _f(
        False, "tell DDP the model uses the same parameters every step (it then skips its per-step bookkeeping)"
    )
    ddp_broadcast_buffers: bool = _f(
        True,
        "DDP sends rank 0's buffers (BatchNorm statistics) to every rank before each forward; off: one "
        "collective less a step, each rank keeps its own until the next evaluation (which gives every "
        "rank rank 0's; a checkpoint holds rank 0's)",
    )

    def __post_init__(self) -> None:
        _check_finite("dist", self)
        _check_choice("dist", "strategy", self.strategy, STRATEGIES)
        _check_positive("dist", "nproc", self.nproc, allow_zero=True)
        _check_positive("dist", "timeout_s", self.timeout_s)
        if self.ddp_bucket_mb < 0:
            raise ConfigError(
                f"{setting_name('dist', 'ddp_bucket_mb')} = {self.ddp_bucket_mb}: expected 0 (torch's own) or a size "
                "in MiB"
            )
        changed = self.ddp_bucket_mb or self.ddp_static_graph or not self.ddp_broadcast_buffers
        if self.strategy == "horovod" and changed:
            raise ConfigError(
                f"{setting_name('dist', 'ddp_bucket_mb')}, {setting_name('dist', 'ddp_static_graph')} and "
                f"{setting_name('dist', 'ddp_broadcast_buffers')} are DDP's switches; "
                f"{setting_name('dist', 'strategy')} = 'horovod' averages in its optimizer instead: expected them "
                "at their defaults"
            )


SEED_LIMIT = 2**63
# the most epochs: TOML's integers (the run's config.toml) are 64-bit; 10**400 reached the schedule's float
# maths and ended in an OverflowError traceback
MAX_EPOCHS = 2**63 - 1


NAME_MAX_BYTES = 255  # the longest file name Linux, macOS and Windows file systems take (NAME_MAX)
PATH_MAX_BYTES = 4096  # the longest path Linux takes (PATH_MAX, its final NUL included)


def system_path_limits(path: str | Path) -> tuple[int, int]:
    """The longest name and path (NAME_MAX, PATH_MAX, in bytes) the file system holding `path` takes, asked of the
    nearest folder above it that is there: a FAT or network mount takes shorter names than Linux's 255, and macOS's
    paths end at 1024. NAME_MAX_BYTES and PATH_MAX_BYTES where the system cannot say (Windows has no pathconf)."""
    given = Path(os.path.abspath(path))
    place = next((place for place in (given, *given.parents) if os.path.isdir(place)), given.anchor)
    return _pathconf(place, "PC_NAME_MAX", NAME_MAX_BYTES), _pathconf(place, "PC_PATH_MAX", PATH_MAX_BYTES)


def _pathconf(place: str | Path, key: str, fallback: int) -> int:
    pathconf = getattr(os, "pathconf", None)
    if pathconf is None or key not in getattr(os, "pathconf_names", {}):
        return fallback
    try:
        limit = pathconf(place, key)
    except (OSError, ValueError):
        return fallback
    return limit if limit > 0 else sys.maxsize  # -1: the system sets no limit


def read_as_ascii_note() -> str:
    """Why a UTF-8 name reads as one that is not, where Python reads file names in another encoding than UTF-8."""
    return (
        f"Python reads file names as {sys.getfilesystemencoding()} here, the encoding of a locale that is not UTF-8 "
        "(such as LC_ALL=C with PYTHONUTF8=0, or a Latin-1 one): run with PYTHONUTF8=1 (or a UTF-8 locale, "
        "LC_ALL=C.UTF-8)"
    )


def _nameable(text: str) -> bool:
    """Whether `text` can name a file here: a config file's café (UTF-8 text) cannot where Python reads file names as
    ASCII. The command line's can always (Python read it with the same encoding)."""
    try:
        os.fsencode(text)
    except UnicodeEncodeError:
        return False
    return True


def path_length_problem(path: str | Path, room: int = 0) -> str:
    """Why the system cannot take `path` ('' where it can): a name in it over NAME_MAX, or the whole path, with
    `room` bytes left for the files to be made inside it, at PATH_MAX or over (the limits of the system it is on,
    `system_path_limits`). Checked before an output is made: train, bench, doctor, tune, profile and prepare ended
    in an OSError traceback ("File name too long") at their first look at the path."""
    name_max, path_max = system_path_limits(path)
    for part in Path(path).parts:
        size = len(os.fsencode(part))
        if size > name_max:
            return f"a name in it is {size} bytes long: expected names of at most {name_max} bytes (the system's limit)"
    size = len(os.fsencode(os.path.abspath(path)))
    if size + room >= path_max:
        return (
            f"the path is {size} bytes long: expected at most {path_max - room - 1} bytes (the system's path "
            f"limit is {path_max}, with room left for the files made in it)"
        )
    return ""


def run_name_problem(name: str) -> str:
    """Why `name` cannot name a run folder inside --out-dir ('' where it can): `..` or `a/../../b` wrote a run
    outside --out-dir (into the working folder), and a name too long for the file system ended in a traceback."""
    expected = "expected one folder name inside --out-dir (no '/', not '.' or '..')"
    seps = {"/", os.sep, os.altsep or "/"}
    if name in (".", "..") or any(sep in name for sep in seps) or "\0" in name:
        return expected
    if len(os.fsencode(name)) > NAME_MAX_BYTES:
        return f"{len(os.fsencode(name))} bytes long: expected a folder name of at most {NAME_MAX_BYTES} bytes"
    return ""


@dataclass(frozen=True)
class RunConfig:
    epochs: int = _f(6, "training epochs")
    batch_size: int = _f(
        0,
        "samples per process per micro-step; auto (0): on a GPU the largest batch that fits with a margin and "
        f"still raises measured throughput, found in a few seconds at start; {CPU_BATCH} on the CPU; the lr scaled "
        "to it from --lr-batch",
        auto_zero=True,
    )
    seed: int = _f(
        0,
        "seed, 0 <= seed < 2**63; each rank and epoch draws from seed + rank + a stride per epoch (resumes repeat "
        "exactly); on --data synthetic it also draws the images and labels: another seed is another data set",
    )
    out_dir: str = _f("runs", "folder that holds run folders")
    name: str = _f(
        "", "run folder name", shown="MODEL-YYYYMMDD-HHMMSS, or MODEL-JOBID under a torchrun job id: a new folder"
    )
    resume: str = _f("", "resume a run: its folder, a checkpoint file, or 'auto' (this run's folder)")
    max_steps: int = _f(
        0,
        "stop each epoch after this many optimizer steps (0: whole epoch); training only: each evaluation still "
        "scores the whole validation split (--val-fraction 0 skips one held out of the training data)",
    )
    tta_flip: bool = _f(False, "evaluate on each image and its mirror, averaging the logits")
    tta_level: str = _f(
        "none",
        "test-time augmentation: none (or as --tta-flip says), flip (= --tta-flip), flip+translate "
        "(also the image shifted 1 px up-left and down-right, each with its mirror, weighted 1/4 each)",
        choices=TTA_LEVELS,
    )
    eval_every: int = _f(1, "validate every N epochs (and after the last)")
    progress: bool = _f(True, "show a progress bar (rank 0 only)")
    monitor: bool = _f(False, "sample GPU/host telemetry into the run folder")
    tensorboard: bool = _f(True, 'TensorBoard scalars in the run folder (rank 0; pip install "cnnpar[tensorboard]")')

    def __post_init__(self) -> None:
        _check_positive("run", "epochs", self.epochs)
        if self.epochs > MAX_EPOCHS:
            raise ConfigError(
                f"{setting_name('run', 'epochs')} = {self.epochs}: expected 1..{MAX_EPOCHS:,} (2**63 - 1)"
            )
        _check_positive("run", "batch_size", self.batch_size, allow_zero=True)
        _check_positive("run", "max_steps", self.max_steps, allow_zero=True)
        _check_positive("run", "eval_every", self.eval_every)
        _check_choice("run", "tta_level", self.tta_level, TTA_LEVELS)
        # torch's generators take a seed below 2**64; below 2**63 leaves room for the + rank and + repeat offsets
        if not 0 <= self.seed < SEED_LIMIT:
            raise ConfigError(f"{setting_name('run', 'seed')} = {self.seed}: expected 0 <= value < 2**63")
        if self.name:  # '' is a default name, made at the start
            why = run_name_problem(self.name)
            if why:
                raise ConfigError(f"{setting_name('run', 'name')} = {self.name!r}: {why}")

    @property
    def tta_in_effect(self) -> str:
        """The test-time augmentation in effect: `tta_level`, or flip where only the older `tta_flip` asks."""
        return self.tta_level if self.tta_level != "none" else ("flip" if self.tta_flip else "none")


@dataclass(frozen=True)
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    speed: SpeedConfig = field(default_factory=SpeedConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def __post_init__(self) -> None:
        if self.dist.strategy == "horovod" and self.optim.grad_clip > 0:
            # Clipping would have to sit between DistributedOptimizer.synchronize() and step(); the engine's step
            # does not make that split. Refused here, not in each rank after hvd.init() (horovodrun then added a
            # traceback of its own), and before anything is launched.
            raise ConfigError(
                f"{setting_name('optim', 'grad_clip')} = {self.optim.grad_clip} is not supported with "
                f"{setting_name('dist', 'strategy')} = 'horovod': expected --strategy ddp, or --grad-clip 0"
            )
        if self.dist.ddp_static_graph and self.optim.grad_accum > 1:
            # seen on torch 2.14 with gloo: "expect_autograd_hooks_ INTERNAL ASSERT FAILED" (reducer.cpp)
            raise ConfigError(
                f"{setting_name('dist', 'ddp_static_graph')} with {setting_name('optim', 'grad_accum')} = "
                f"{self.optim.grad_accum}: DDP records its static graph on the first step, which accumulation runs "
                "under no_sync, and torch refuses that; drop one of the two"
            )


SECTIONS = tuple(f.name for f in fields(Config))
_SECTION_TYPES = {sec: type(getattr(Config(), sec)) for sec in SECTIONS}


def auto_number(f: dataclasses.Field) -> int | None:
    """The number a count field stores for "auto": 0, or -1 where 0 is a count of its own (--workers 0 is no worker
    process); None for a field without one."""
    return 0 if f.metadata.get("auto_zero") else -1 if f.metadata.get("auto_minus_one") else None


def cli_flag(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or f.name


def cli_option(f: dataclasses.Field) -> str:
    """The field's option as typed: `--batch-size`."""
    return "--" + cli_flag(f).replace("_", "-")


def to_dict(cfg: Config) -> dict[str, dict[str, Any]]:
    return dataclasses.asdict(cfg)


def command_line(cfg: Config, change: dict | None = None, command: str = "train") -> str:
    """`cnnpar train ...` that runs `cfg` with `change` applied: one flag per field that differs from
    the defaults, so advice printed by a tool can be pasted as it stands."""
    import shlex

    merged = to_dict(cfg)
    for sec, values in (change or {}).items():
        merged[sec].update(values)
    defaults = to_dict(Config())
    base = Config()
    args = ["cnnpar", command]
    for sec_name in SECTIONS:
        for f in fields(getattr(base, sec_name)):
            value = merged[sec_name][f.name]
            if value == defaults[sec_name][f.name]:
                continue
            flag = cli_option(f)
            if isinstance(value, bool):
                args.append(flag if value else "--no-" + flag[2:])
            elif (f.metadata.get("auto_zero") and value == 0) or (f.metadata.get("auto_minus_one") and value == -1):
                args += [flag, "auto"]
            else:
                args += [flag, str(value)]
    return shlex.join(args)


# what a config file's value must look like, by the field's type, in the words of TOML
_TOML_WORDS = {bool: "true or false", int: "a whole number", float: "a number", str: "a quoted string"}


# from_dict's origin for the flags typed: their range errors name the flag, no file (nor the default "config")
COMMAND_LINE = "command line"


def from_dict(
    raw: dict[str, Any], base: Config | None = None, origin: str = "config", typed: frozenset[str] = frozenset()
) -> Config:
    """Build a Config from nested dicts, naming the unknown key or wrong type precisely, and `origin` (the file)
    in a range error of a value it gave: `typed` names the settings ("data.val_fraction") that came from the
    command line instead, whose errors name the flag alone."""
    try:
        return _from_dict(raw, base, origin)
    except ConfigError as e:
        # a type error names its origin already; a range error (a dataclass's __post_init__) does not
        failed = re.match(r"(\w+\.\w+) ", str(e))
        if origin in ("config", COMMAND_LINE) or str(e).startswith(f"{origin}: ") or (failed and failed[1] in typed):
            raise
        raise ConfigError(f"{origin}: {e}") from None


# Defaults an earlier cnnpar stored in a run's config that a later one changed: a resume holding one, where the
# user asked for no other value, meets the new default, not the user's change (resume_checks.recorded_changes).
EARLIER_DEFAULTS = {("data", "gpu_resize"): ("loop", "batched")}  # "loop" until 2026-11-30, "batched" until 12-01


def as_stored_now(section: str, name: str, value: Any) -> Any:
    """A setting's value as a stored config of an earlier cnnpar wrote it, in today's encoding: a switch that was
    a bool before it became on/off/auto (speed.compile_tuning, compile_tiling, stem_space_to_depth) reads as
    "on"/"off", so that False and "off" compare as the same setting. Other values come back as they are."""
    known = {f.name: f for f in fields(getattr(Config(), section))} if section in SECTIONS else {}
    f = known.get(name)
    if f is not None and isinstance(value, bool) and f.metadata.get("choices") == TRISTATE:
        return "on" if value else "off"
    return value


def _from_dict(raw: dict[str, Any], base: Config | None, origin: str) -> Config:
    base = base or Config()
    sections = {}
    for sec_name in SECTIONS:
        sec = getattr(base, sec_name)
        values = raw.get(sec_name, {})
        if not isinstance(values, dict):
            raise ConfigError(f"{origin}: [{sec_name}] must be a table of settings")
        known = {f.name: f for f in fields(sec)}
        for key, value in values.items():
            if key not in known:
                raise ConfigError(f"{origin}: unknown setting {sec_name}.{key}; known: {', '.join(known)}")
            want = type(getattr(sec, key))
            value = as_stored_now(sec_name, key, value)
            auto_zero = known[key].metadata.get("auto_zero")
            auto_minus_one = known[key].metadata.get("auto_minus_one")
            if auto_zero and isinstance(value, str) and value.strip().lower() == "auto":
                value = 0  # as the flag takes it (--batch-size auto) and a run's record writes it (# requested:)
            elif auto_minus_one and isinstance(value, str) and value.strip().lower() == "auto":
                value = -1  # as the flag takes it (--workers auto)
            if want is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, want) or (want is int and isinstance(value, bool)):
                number = "a whole number" if want is int else "a number"
                expected = (
                    f'{number} or "auto" (0 means auto)'
                    if auto_zero
                    else f'{number} >= 0 or "auto" (-1 means auto)'
                    if auto_minus_one
                    else _TOML_WORDS.get(want, f"a value of type {want.__name__}")
                )
                raise ConfigError(f"{origin}: {setting_name(sec_name, key)} = {value!r}: expected {expected}")
            if isinstance(value, str) and not _nameable(value):
                # a resume's own config.toml too: os.fsencode's traceback at the first look at the path
                raise ConfigError(
                    f"{origin}: {setting_name(sec_name, key)} = {value!r}: cannot name a file here: "
                    f"{read_as_ascii_note()}"
                )
            values = {**values, key: value}
        sections[sec_name] = replace(sec, **values)
    unknown = set(raw) - set(SECTIONS)
    if unknown:
        raise ConfigError(f"{origin}: unknown section(s) {sorted(unknown)}; known: {', '.join(SECTIONS)}")
    return Config(**sections)


def read_config_text(path: str | Path) -> str:
    """A config file's text; ConfigError naming the file where it is none (missing, a folder, not UTF-8)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: a folder: expected a TOML config file") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror})") from None
    try:
        # utf-8-sig: Windows Notepad starts a file with a BOM, which tomllib refuses as "Invalid statement"
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}): expected a TOML config file "
            "saved as UTF-8 (a run's is runs/<run>/config.toml)"
        ) from None


def load_toml(path: str | Path, base: Config | None = None, typed: dict[str, dict] | None = None) -> Config:
    """The config in the TOML file `path`, on `base`. `typed`: the flags typed beside it ({section: {name:
    value}}), which replace the file's values before they are checked, so that `--val-fraction 0.1` rescues a
    file's 1.5; where the file's values pass, they are read as they stand (the flags apply later, on top)."""
    path = Path(path)
    try:
        raw = tomllib.loads(read_config_text(path))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML ({e})") from None
    try:
        return from_dict(raw, base, origin=str(path))
    except ConfigError:
        # a section that is no table ([data] given as a string) is the file's error whatever is typed
        if not typed or any(not isinstance(raw.get(sec, {}), dict) for sec in typed):
            raise
    merged = {**raw, **{sec: {**raw.get(sec, {}), **values} for sec, values in typed.items()}}
    names = frozenset(f"{sec}.{name}" for sec, values in typed.items() for name in values)
    return from_dict(merged, base, origin=str(path), typed=names)


def dumps_toml(cfg: Config | dict) -> str:
    import tomli_w

    return tomli_w.dumps(cfg if isinstance(cfg, dict) else to_dict(cfg))


# The fields `resolve_for_device` fills in for the machine: a run stores them resolved, and a
# resumed run sets the ones that were "auto" back to "auto" (its `# requested:` lines say which) to
# resolve them again for its own machine; the ones the user set stay set. A new
# device-dependent "auto" below belongs here too.
MACHINE_FIELDS = {
    "speed": (
        "device",
        "precision",
        "channels_last",
        "compile",
        "cuda_graphs",
        "stem_space_to_depth",
        "compile_tuning",
        "compile_tiling",
    ),
    "data": ("pin_memory", "prefetch_stream", "decode", "workers", "resident", "gpu_resize"),
}


# The speed fields whose "auto" the run's length settles, once its data and batch size are known
# (engine/resolved.long_compiles_resolved); also in MACHINE_FIELDS, so a resumed run settles them again.
LONG_COMPILES = ("compile_tiling", "compile_tuning")


def resolve_decode(requested: str, cuda: bool, engines: str | None = None) -> tuple[str, str]:
    """The image-folder decoder and why, for a printed line: a rule from measurements, not a guess.

    `engines`: whether this GPU's JPEG engines work for nvJPEG's hardware backend ('' yes, else why
    not; None: not asked, e.g. the data is not a folder of photos).

    On an H200 with 16 host cores, ResNet-50 from 6,000 ImageNet photos, whole epochs, 14 workers:
    torchvision's nvJPEG 4,526 img/s, CPU workers 3,009, nvImageCodec 2,718 (2026-11-30-h200/; the
    same order in every other run of the three). The GPU's JPEG engines (`hardware`) ran faster than
    nvJPEG in each of seven calls that ran both: 4,944, 4,570, 4,967, 4,939, 5,177, 5,408 and 5,484
    img/s against 4,560, 4,318, 4,457, 4,340, 4,736, 4,946 and 5,056 (2026-12-01-h200/call-j, call-m,
    call-n, call-t, call-x, call-y, call-z). So: the engines where the
    GPU has them, nvJPEG on other GPUs, CPU workers without CUDA. (The engines were opt-in until
    `cnnpar train` was seen to take minutes to exit; the cause was torch's exit hook for persistent
    workers, with either decoder: call-v, fixed in loader.shutdown_workers, call-w.)
    """
    if requested != "auto":
        return requested, "as asked"
    if not cuda:
        return "cpu", "auto: no CUDA device"
    if engines == "":
        return "hardware", (
            "auto: this GPU has JPEG engines; ResNet-50 from photos, each of seven H200 calls that ran both: "
            "4,570-5,484 img/s against nvJPEG's 4,318-5,056"
        )
    if engines:
        return "gpu", f"auto: CUDA without JPEG engines for nvJPEG ({engines}); nvJPEG measured next fastest"
    return "gpu", "auto: CUDA; nvJPEG measured fastest of gpu, cpu and nvimgcodec on an H200"


def compile_default(model_name: str, device_type: str) -> str:
    if device_type == "cuda" and model_name in _COMPILE_HELPS_ON_CUDA:
        return "default"
    return "off"


def speed_reasons(asked: Config, resolved: Config, device_type: str) -> str:
    """Why precision, channels_last and compile are what `resolve_for_device` made of an "auto", for the run's start
    (a typed value or a preset's needs no reason; "" where none was auto): the rules below and their measurements."""
    cuda = device_type == "cuda"
    reasons = []
    precision = resolved.speed.precision
    if asked.speed.precision == "auto":
        if cuda:
            why = "this GPU computes bf16" if precision == "bf16" else "this GPU has no bf16"
        else:
            why = (
                "this CPU computes bf16 natively (AVX512-BF16 or AMX)"
                if precision == "bf16"
                else "this CPU has no native bf16, and emulated bf16 is slower than fp32"
            )
        reasons.append(f"{precision}: {why}")
    if asked.speed.channels_last == "auto" and resolved.speed.channels_last == "on":
        where = "on the GPU" if cuda else "in oneDNN's CPU kernels (1.4x NCHW for cnn3 on a 2-core EPYC)"
        reasons.append(f"channels_last on: convolutions run faster on NHWC {where}")
    if asked.speed.compile == "auto":
        mode = resolved.speed.compile
        if mode != "off":
            why = f"measured faster for {asked.model.name} on an H200"
        elif cuda:
            why = f"not measured for {asked.model.name}: only {', '.join(sorted(_COMPILE_HELPS_ON_CUDA))} are"
        else:
            why = "on the CPU its tens of seconds of compile are rarely repaid in a short run"
        reasons.append(f"compile {mode}: {why}")
    return "auto: " + "; ".join(reasons) if reasons else ""


def asked_lr(optim: OptimConfig) -> float:
    """--lr as asked, the lr at the batch `lr_reference` names: the number given (typed, a preset's, a file's, a
    run's record's), or for auto (0) the optimizer's own (`DEFAULT_LRS`)."""
    return optim.lr or DEFAULT_LRS[optim.optimizer]


def default_lr_note(asked: OptimConfig, resolved: OptimConfig, set_aside: str = "") -> str:
    """What the run's lr line adds where --lr was auto: that the lr is the optimizer's default, and for which batch
    (`resolved.lr_batch`), and `set_aside`, the lr the optimizer's default replaced (a preset's, tuned for another
    optimizer: cliargs.preset_lr_set_aside); "" where an lr was given. One lr for every optimizer left users of
    `--optimizer sgd` training at AdamW's without a word."""
    if asked.lr:
        return ""
    optimizer = resolved.optimizer
    why = f" ({set_aside})" if set_aside else ""
    return f"--lr auto: {optimizer}'s default, {DEFAULT_LRS[optimizer]:g} at batch {resolved.lr_batch}{why}"


def lr_reference(cfg: Config) -> int:
    """The batch `cfg`'s --lr is the lr for (optim.lr_batch): as set, else a fixed --batch-size (the lr trains at
    it), else LR_BATCH. Read from the config as asked, before --batch-size auto is resolved."""
    return cfg.optim.lr_batch or cfg.run.batch_size or LR_BATCH


def batch_lr_factor(optimizer: str, batch: int, reference: int = LR_BATCH) -> float:
    """How much the lr grows from the batch it is for (`reference`) to an automatically chosen `batch`: linear
    (Goyal et al. 2017) where --lr drives SGD, square root (Malladi et al. 2022) for AdamW. Muon's --lr drives
    SGD with Nesterov momentum for every parameter but the 4-D conv filters (engine/optim.build_optimizer), so
    linear too; the filters' --muon-lr is not scaled (a Muon step's size does not depend on the gradient's)."""
    ratio = batch / reference
    return math.sqrt(ratio) if optimizer == "adamw" else ratio


def lr_rule(optimizer: str) -> str:
    if optimizer == "adamw":
        return "square root (AdamW)"
    return "linear (SGD)" if optimizer == "sgd" else "linear (Muon's SGD groups; --muon-lr not scaled)"


def resolve_batch_size(batch_size: int, device_type: str) -> int:
    """--batch-size auto (0) stays 0 on a GPU, where the trainer measures it (engine/batch_size.py) with the
    model on the device; the CPU keeps the fixed 64 it always had (no search: its throughput barely grows)."""
    return batch_size or (0 if device_type == "cuda" else CPU_BATCH)


def bf16_by_default(device_type: str, bf16_ok: bool, cpu_bf16: bool) -> bool:
    """Whether --precision auto is bf16 on this device: on a GPU where it supports bf16 (`bf16_ok`), on a CPU only
    where it computes bf16 natively (`cpu_bf16`; see `resolve_for_device`)."""
    return bf16_ok if device_type == "cuda" else cpu_bf16


def resolve_for_device(
    cfg: Config, device_type: str, bf16_ok: bool, cpu_bf16: bool = False, jpeg_engines: str | None = None
) -> Config:
    """Replace every 'auto' that depends on the device with a concrete choice (`jpeg_engines`: see
    `resolve_decode`; the caller asks the GPU, this module does not touch devices).

    The choices for compile come from measurements kept in `compile_default`, not from a
    rule of thumb: compile slowed ResNet-18 at 32x32 on an H200 but sped up ResNet-50 at 224x224.
    On the CPU, channels_last is on (oneDNN's convolutions and max pooling vectorise over NHWC
    channels) and bf16 is chosen only where `cpu_bf16` says the CPU computes it natively (AVX512-BF16
    or AMX): emulated bf16 is slower than fp32. benchmarks/results/cpu_vs_textbook.csv holds the
    measurements (cnn3, MNIST, 2-core EPYC: NHWC 1.4x NCHW in fp32; bf16 on top of NHWC 1.3x more).
    `optim.lr` auto (0) becomes the optimizer's own (`asked_lr`), and `optim.lr_batch` is stored as `lr_reference`
    (the batch the lr asked for is for); where --batch-size auto is the CPU's 64, the lr is scaled to it from there by
    `batch_lr_factor`, as the trainer scales it to a searched batch.
    """
    cuda = device_type == "cuda"
    speed = cfg.speed
    precision = speed.precision
    if precision == "auto":
        precision = "bf16" if bf16_by_default(device_type, bf16_ok, cpu_bf16) else "fp32"
    channels_last = speed.channels_last
    if channels_last == "auto":
        channels_last = "on"
    compile_mode = speed.compile
    if compile_mode == "auto":
        compile_mode = compile_default(cfg.model.name, device_type)
    graphs = speed.cuda_graphs
    if graphs == "on" and not cuda:
        raise ConfigError(
            f"{setting_name('speed', 'cuda_graphs')} = 'on' needs a CUDA device (on {device_type}: expected auto or "
            "off)"
        )
    if precision == "tf32" and not cuda:  # a CUDA matmul mode: on the CPU it would run plain fp32 under its name
        raise ConfigError(
            f"{setting_name('speed', 'precision')} = 'tf32' needs a CUDA device (on {device_type}: expected fp32, "
            "bf16, fp16 or auto)"
        )
    if graphs == "auto":
        # measured faster for both models of benchmarks/results/h200-2026-11-29 (presets.py); the
        # trainer still turns it off, saying why, where it cannot apply (DDP, accumulation)
        graphs = "on" if cuda else "off"
    # the stem on 2x2 blocks: measured faster on an H200 (ResNet-50 224, calls ZQ and ZR); not measured on a CPU
    stem = speed.stem_space_to_depth if speed.stem_space_to_depth != "auto" else ("on" if cuda else "off")
    for name in ("compile_tiling", "compile_tuning"):  # options of torch.compile: a record saying "on" must mean it ran
        if getattr(speed, name) == "on" and compile_mode == "off":
            raise ConfigError(
                f"{setting_name('speed', name)} = 'on' tunes torch.compile's kernels, and compile is off here: "
                "expected --compile default (or another mode), or this switch at auto"
            )
    data = cfg.data
    for name in ("pin_memory", "prefetch_stream"):  # host-to-device copies: nothing to do without CUDA
        if getattr(data, name) == "on" and not cuda:
            raise ConfigError(
                f"{setting_name('data', name)} = 'on' needs a CUDA device (on {device_type}: expected auto or off)"
            )
    pin = data.pin_memory if data.pin_memory != "auto" else ("on" if cuda else "off")
    decode, _ = resolve_decode(data.decode, cuda, jpeg_engines)
    stream = data.prefetch_stream if data.prefetch_stream != "auto" else ("on" if cuda else "off")
    batch = resolve_batch_size(cfg.run.batch_size, device_type)
    reference = lr_reference(cfg)
    lr = asked_lr(cfg.optim)
    if batch and not cfg.run.batch_size:  # auto, the CPU's fixed batch: the lr follows it as it follows a search's
        lr *= batch_lr_factor(cfg.optim.optimizer, batch, reference)
    return replace(
        cfg,
        run=replace(cfg.run, batch_size=batch),
        optim=replace(cfg.optim, lr=lr, lr_batch=reference),
        speed=replace(
            speed,
            device=device_type,
            precision=precision,
            channels_last=channels_last,
            compile=compile_mode,
            cuda_graphs=graphs,
            stem_space_to_depth=stem,
        ),
        data=replace(data, pin_memory=pin, prefetch_stream=stream, decode=decode),
    )
