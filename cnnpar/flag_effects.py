"""Flags the user typed that do nothing in the config they end up in, said rather than silently ignored.

A typed `--muon-lr 0.1` beside the default AdamW, `--decode gpu` on an .npz or `--compile-eval` with `--compile
off` trained as if they had not been typed, and the run's result was not the one asked for. `unused_flags`
reads one table: for each flag, the config settings it needs to take effect (read where the flag is used:
engine/optim.build_optimizer, engine/averaging.build_weight_average, data/loader.build_loader, data/sources'
readers, config.resolve_for_device, the trainer's `evaluate`), and returns one line per typed flag whose settings
are not there, naming what would make it apply. A setting left at "auto" is read as the run will resolve it (the
device `--device auto` picks, config.compile_default's compile), so `--compile-eval` beside an auto compile that
is off on the CPU is named as beside `--compile off`. Where that depends on the data (its format, whether it holds its
own validation split) it is told from the file's name, keys or index, never by reading its images.
Only typed flags count (a preset or a --config file sets whatever its recipe needs, used or not), and a typed
value that asks for nothing (`--no-muon-normalize`, `--decode auto`, `--cpu-share 0`) gets no line.

`refuse_overridden` is for a typed wish that another setting overrides in the opposite direction: a note would
let the run do the opposite of what was asked.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

from cnnpar.config import SECTIONS, Config, cli_option, compile_default
from cnnpar.errors import ConfigError, UserError


@dataclass(frozen=True)
class Rule:
    keys: tuple[str, ...]  # the "section.field" settings whose flags this rule reads
    idle: Callable[[Config], str]  # why they do nothing in a config, and what makes them apply; "" where they apply
    asks: Callable[[object], bool] = lambda value: True  # whether a typed value asks for anything


def _switched_on(value: object) -> bool:
    return bool(value)


def _not_auto(value: object) -> bool:
    return value != "auto"


def _positive(value: object) -> bool:
    return value > 0


def _no_muon(cfg: Config) -> str:
    optimizer = cfg.optim.optimizer
    return "" if optimizer == "muon" else f"the optimizer is {optimizer}, and only Muon reads it: add --optimizer muon"


def _no_momentum(cfg: Config) -> str:
    # build_optimizer: SGD takes it, and Muon's SGD groups (all but the 4-D conv filters); AdamW has betas
    if cfg.optim.optimizer != "adamw":
        return ""
    return (
        "the optimizer is adamw, which has no momentum setting (its betas are torch's): --optimizer sgd or muon uses it"
    )


def _no_average(cfg: Config) -> str:
    # build_weight_average: an average only where ema > 0 (lookahead without one is refused by OptimConfig)
    return "" if cfg.optim.ema > 0 else "no weight average is kept (--ema is 0): give --ema a decay, e.g. --ema 0.95"


def _not_compiled(cfg: Config) -> str:
    """The trainer's `evaluate` goes through the compiled model only with compile on, one process and no weight
    average (the average's copy, and DDP's plain module, are what evaluate there). Compile as the run resolves it:
    `--compile auto` is off on the CPU and for most models on CUDA (config.compile_default)."""
    compile_mode = cfg.speed.compile
    if compile_mode == "auto":
        device = _device_type(cfg)
        if compile_default(cfg.model.name, device) == "off":
            where = "on the CPU" if device == "cpu" else f"for {cfg.model.name} on CUDA"
            return (
                f"--compile auto is off {where}, so there is no compiled model to evaluate through: give --compile "
                "a mode, e.g. default"
            )
    if compile_mode == "off":
        return (
            "--compile is off, so there is no compiled model to evaluate through: give --compile a mode, e.g. default"
        )
    if cfg.optim.ema > 0:
        return "the weight average (--ema) evaluates, as a plain module: it applies without --ema"
    processes = _processes(cfg)
    if processes > 1:
        return (
            f"each of the {processes} processes evaluates the plain module (DDP's wrapper would all-reduce inside "
            "its forward, which ranks with unequal evaluation batches cannot pair): it applies to one process"
        )
    return ""


def _device_type(cfg: Config) -> str:
    """The device type the run will get (dist.pick_device's rule): --device as typed, auto CUDA where it is
    visible."""
    if cfg.speed.device != "auto":
        return cfg.speed.device
    import torch  # (only where a rule reads an auto that depends on the device)

    return "cuda" if torch.cuda.is_available() else "cpu"


def _processes(cfg: Config) -> int:
    """The processes the run will have: `--nproc N`'s, else the launcher's world size (torchrun's WORLD_SIZE, a
    Horovod launcher's size), 1 for a process started alone or under the single-process debug switch."""
    from cnnpar.dist import debug_single_requested, launcher_world_size  # (imports torch: only when typed)

    if debug_single_requested(cfg.dist.debug_single):
        return 1
    return cfg.dist.nproc or launcher_world_size()


def _source_format(cfg: Config) -> str | None:
    """The format `--data` is read as (data/sources.detect_format), None where that cannot be told yet (a missing
    file: the run says so itself, in its own terms)."""
    from cnnpar.data.sources import detect_format  # (imports torch: only when a decode flag was typed)

    try:
        return detect_format(cfg.data.source, cfg.data.format)
    except (UserError, OSError):
        return None


def _in_memory(cfg: Config, fmt: str | None) -> str:
    """Why `--data` decodes no JPEG while training; "" for an image folder (or a format not told)."""
    source = cfg.data.source
    if fmt in ("digits", "synthetic"):
        return f"--data {source} is built-in data made in memory"
    if fmt in ("npz", "npy", "csv"):
        kind = {"npz": "an .npz", "npy": "a .npy"}.get(fmt, "a CSV")
        return f"--data {source} is {kind} read into memory as pixels"
    if fmt == "store":
        return f"--data {source} is a prepared store, its photos decoded once by cnnpar prepare"
    return ""


def _no_jpeg_decoding(cfg: Config) -> str:
    """data/loader.build_loader: --decode picks the decoder of an `ImageFolderDataset` (a folder of photos) under
    the fast loader, and of nothing else (a store's pixels are cropped on the device whatever it says)."""
    held = _in_memory(cfg, _source_format(cfg))
    if held:
        return f"{held}, so no JPEG is decoded while training: it applies to --data <a folder of photos>"
    if cfg.data.loader == "textbook":
        return "--loader textbook decodes each photo on the host in its per-sample reads: --loader fast uses it"
    return ""


def _no_gpu_decoder(cfg: Config) -> str:
    """--cpu-share and --gpu-resize act on a GPU decoder's batches (loader.decodes_on_gpu): with --decode gpu,
    hardware or nvimgcodec, or auto where it picks one of those (CUDA)."""
    why = _no_jpeg_decoding(cfg)
    if why:
        return why
    decode = cfg.data.decode
    if decode in ("cpu", "nvimgcodec-workers"):
        how = "the worker processes decode and resize" if decode == "cpu" else "the worker processes decode"
        return f"with --decode {decode} {how} each photo themselves: --decode gpu, hardware or nvimgcodec uses it"
    if decode == "auto" and _device_type(cfg) == "cpu":  # config.resolve_decode: no CUDA, CPU workers
        return "--decode auto picks cpu on the CPU (worker processes): --decode gpu uses it"
    return ""


def _no_random_resized_crops(cfg: Config) -> str:
    """data/loader.build_loader: random-resized crops (whose smallest area --crop-min-scale sets) are drawn for an
    image folder's photos and a store's, under either loader; arrays get --augment's pad-and-crop instead."""
    fmt = _source_format(cfg)
    if fmt in (None, "folder", "store"):
        return ""
    return (
        f"{_in_memory(cfg, fmt)}, whose images get --augment's pad-and-crop, not random-resized crops: it applies "
        "to --data <a folder of photos> or a .cnnpar store"
    )


def _not_synthetic(cfg: Config) -> str:
    """data/sources.load_synthetic is the one reader of --synthetic-samples: other data brings its own samples."""
    fmt = _source_format(cfg)
    if fmt in (None, "synthetic"):
        return ""
    return f"--data {cfg.data.source} holds its own samples: it sets how many --data synthetic makes"


def _own_validation_split(cfg: Config) -> str:
    """What validates where `--data` holds its own validation split (data/sources._split draws the seeded hold-out
    only where there is none); "" where there is none, or where that cannot be told (data the run refuses, saying
    why in its own terms). Told from an .npz's keys, a folder's names or a store's index: no image is read."""
    source, fmt = cfg.data.source, _source_format(cfg)
    if fmt == "npz":
        return _npz_test_split(source)
    if fmt == "folder":
        from cnnpar.data.folder import split_dirs

        # data/folder.scan_splits: train/ beside the first of these validates (or the folder is refused)
        _, held = split_dirs(Path(source))
        return f"its own validation split ({held[0].name}/)" if held else ""
    if fmt == "store":
        from cnnpar.data.store import StoreFile

        try:
            has_val = bool((StoreFile(source).splits == 1).any())
        except (UserError, OSError):
            return ""
        return "its own validation split (its folder's val/, valid/, validation/ or test/)" if has_val else ""
    return ""  # a CSV, a .npy, digits and synthetic data have none: the hold-out validates


def _npz_test_split(source: str) -> str:
    """data/sources.load_npz: y_test beside x_test (or test_jpeg/_png with test_offsets) validates, or x_val and
    the other held-out names (`npz_held_splits`: the first there)."""
    import numpy as np

    from cnnpar.data.encoded_arrays import encoded_keys
    from cnnpar.data.sources import npz_held_splits

    try:
        with np.load(source, allow_pickle=False) as archive:  # the zip's listing: no array is read
            keys = dict.fromkeys(archive.files)
    except (OSError, ValueError, zipfile.BadZipFile):
        return ""
    held = npz_held_splits(keys)
    if not held:
        return ""
    split = held[0]
    if f"y_{split}" not in keys or (f"x_{split}" not in keys and encoded_keys(keys, split) is None):
        return ""
    word = "test" if split in ("test", "testing") else "validation"
    return f"its own {word} split (x_{split}, y_{split})"


def _holds_nothing_out(cfg: Config) -> str:
    split = _own_validation_split(cfg)
    if not split:
        return ""
    return f"--data {cfg.data.source} validates on {split}, so nothing is held out: it applies to data without one"


def _nothing_validates(cfg: Config) -> str:
    """The trainer's `evaluate` runs every --eval-every epochs on the validation split, and with --val-fraction 0 on
    data without a split of its own there is none: no epoch is evaluated, whatever --eval-every says."""
    fmt = _source_format(cfg)
    # a file that is not there cannot be told: the run says so itself, in its own terms
    told = fmt in ("digits", "synthetic") or (fmt is not None and Path(cfg.data.source).exists())
    if cfg.data.val_fraction > 0 or not told or _own_validation_split(cfg):
        return ""
    return (
        f"--val-fraction 0 holds nothing out of --data {cfg.data.source}, which has no validation split of its own, "
        "so no epoch is evaluated: give --val-fraction a share, e.g. 0.2"
    )


def _no_workers(cfg: Config) -> str:
    """data/loader._host_loader: --prefetch-factor and --persistent-workers are settings of the DataLoader's worker
    processes, and a loader with none (--workers 0, or auto on arrays under the fast loader: loader.auto_workers)
    makes its batches in the main process. Told from --data's format: digits, synthetic data, an .npz and a CSV are
    held as arrays."""
    workers = cfg.data.workers
    if workers == 0:
        return "--workers 0 makes the batches in the main process, with no worker: --workers 1 or more uses it"
    fmt = _source_format(cfg)
    # the textbook loader reads even arrays sample by sample (transforms.TextbookDataset): auto starts workers there
    if workers > 0 or cfg.data.loader == "textbook" or fmt not in ("digits", "synthetic", "npz", "npy", "csv"):
        return ""
    return (
        f"{_in_memory(cfg, fmt)}, whose batches the main process indexes (--workers auto starts no worker for it): "
        "--workers 1 or more uses it"
    )


def _no_cuda(cfg: Config) -> str:
    # the trainer sets torch.backends.cudnn.benchmark, which only cuDNN's convolutions read
    if _device_type(cfg) == "cuda":
        return ""
    return "the run is on the CPU, and only cuDNN (CUDA) times its algorithms: it applies with --device cuda"


def _no_weight_decay(cfg: Config) -> str:
    # engine/optim.build_optimizer: the biases' decay is weight_decay / bias_lr_scale
    if cfg.optim.weight_decay > 0:
        return ""
    return "--weight-decay is 0, so there is no decay to share with the biases: give --weight-decay a value"


def _fixed_batch(cfg: Config) -> str:
    """config.resolve_for_device (the CPU's automatic 64) and the trainer's batch search scale --lr from --lr-batch
    to a batch --batch-size auto chose; a fixed batch trains at --lr as it is."""
    batch = cfg.run.batch_size
    if not batch:
        return ""
    return (
        f"the batch size is fixed ({batch}), and a fixed batch trains at --lr as it is: --batch-size auto scales the "
        "lr from --lr-batch to the batch it chooses"
    )


def _tta_level_decides(cfg: Config) -> str:
    level = cfg.run.tta_level
    if level == "none":
        return ""
    return f"--tta-level {level} decides the test-time augmentation: --tta-level none turns it off"


def _one_process(cfg: Config) -> str:
    """Settings of the processes' collectives (parallel/apply.py, dist.init_distributed) in a run of one process:
    --sync-bn was kept in config.toml and did nothing (under torchrun on the CPU it is refused)."""
    from cnnpar.dist import HOROVOD_LAUNCH_ENV, debug_single_requested

    if debug_single_requested(cfg.dist.debug_single):
        return "the debug switch (--debug-single, CNNPAR_DEBUG_SINGLE) runs one process, with no other to join"
    launched = os.environ.get("WORLD_SIZE", "1").strip() not in ("", "0", "1") or any(
        k in os.environ for k in HOROVOD_LAUNCH_ENV
    )
    if cfg.dist.nproc > 1 or launched:
        return ""
    return "one process runs, with no other to join: --nproc 2 or more (or torchrun) uses it"


MUON = ("optim.muon_lr", "optim.muon_momentum", "optim.muon_ns_steps", "optim.muon_normalize")
AVERAGE = ("optim.ema_every", "optim.ema_start", "optim.ema_warmup")

RULES = (
    Rule(MUON[:3], _no_muon),
    Rule(MUON[3:], _no_muon, _switched_on),
    Rule(("optim.momentum",), _no_momentum),
    Rule(AVERAGE, _no_average),
    Rule(("speed.compile_eval",), _not_compiled, _switched_on),
    Rule(("speed.cudnn_benchmark",), _no_cuda),
    Rule(("data.decode",), _no_jpeg_decoding, _not_auto),
    Rule(("data.cpu_share",), _no_gpu_decoder, _positive),
    Rule(("data.gpu_resize",), _no_gpu_decoder, _not_auto),
    Rule(("data.crop_min_scale",), _no_random_resized_crops),
    Rule(("data.synthetic_samples",), _not_synthetic),
    Rule(("data.val_fraction",), _holds_nothing_out, _positive),
    Rule(("run.eval_every",), _nothing_validates),
    Rule(("data.prefetch_factor", "data.persistent_workers"), _no_workers),
    Rule(("optim.bias_decay",), _no_weight_decay, _switched_on),
    Rule(("optim.lr_batch",), _fixed_batch, _positive),
    Rule(("run.tta_flip",), _tta_level_decides, lambda value: not value),  # --tta-flip is in every level
    Rule(("dist.sync_bn",), _one_process, _switched_on),
    Rule(("dist.timeout_s",), _one_process),
    # DDP's switches beside --strategy horovod are refused (config.DistConfig)
    Rule(("dist.ddp_bucket_mb", "dist.ddp_static_graph", "dist.ddp_broadcast_buffers"), _one_process),
    # --nproc N under the debug switch: said once, by its start-up line with the batch (dist.debug_switch_cut)
)


def _flags() -> dict[str, str]:
    """Each setting's flag, as config's fields name them: `optim.muon_lr` -> `--muon-lr`."""
    base = Config()
    return {f"{sec}.{f.name}": cli_option(f) for sec in SECTIONS for f in fields(getattr(base, sec))}


# whether a typed value of a run setting that a measuring command does not read asks for anything
RUN_ASKS: dict[str, Callable[[object], bool]] = {
    "run.name": lambda value: True,
    "run.eval_every": lambda value: True,
    "run.tta_level": lambda value: value != "none",
    "run.tta_flip": _switched_on,
    "run.tensorboard": _switched_on,
    "run.monitor": _switched_on,
    "run.progress": _switched_on,
}
_NO_RUN = ("run.name", "run.tensorboard", "run.monitor", "run.progress")  # engine/harness.build_trainer: never fit()

# the settings bench --claims reads (bench/claims.ClaimContext.config: every claim starts from the defaults, with the
# workload it names): the device, the seed of its synthetic images, the workers of pin_memory's DataLoader and the
# default results folder's root; a --lr or --precision typed beside --claims was dropped without a word
CLAIMS_READ = ("speed.device", "run.seed", "data.workers", "run.out_dir")

# the settings each command does not read, and why. `cnnpar profile` (doctor/profile.py) and `cnnpar bench`
# train through engine/harness.build_trainer's Trainer (no progress bar, run name or folder: fit(), which writes
# telemetry and TensorBoard, is never called) and write their own files; bench --time-to-accuracy evaluates after
# every epoch (bench/tta.py), with the test-time augmentation asked for. `cnnpar doctor` measures the same way, but
# the `cnnpar train` lines it advises carry every setting (config.command_line) but --name (doctor/run.advice_command:
# a folder that holds a run is refused), and --monitor samples its telemetry. `cnnpar tune` writes every setting
# into tuned.toml, for the train it is meant for: none is unread there. `cnnpar bench --compare` reads two CSVs
# already written and trains nothing: of the config it reads only --out-dir, where its compare.md goes without --out
# (bench/run._compare), so every other setting typed there (--lr 0.1, --model) is named; with --out, --out-dir too
# (UNREAD_TOO: both lines' reasons).
UNREAD: dict[str, tuple[tuple[str, ...], str]] = {
    "profile": (
        tuple(RUN_ASKS),
        "cnnpar profile records a few train steps, with no progress bar, evaluation, telemetry or run folder (its "
        "files go to --report-dir): it applies to cnnpar train",
    ),
    "bench": (
        tuple(RUN_ASKS),
        "cnnpar bench times train steps, with no progress bar, evaluation, telemetry or run folder (its tables go to "
        "--out): it applies to cnnpar train",
    ),
    "bench --compare": (
        tuple(key for key in _flags() if key != "run.out_dir"),
        "cnnpar bench --compare sets two bench tables already written side by side, training nothing: it applies to "
        "cnnpar train",
    ),
    "bench --compare --out": (
        ("run.out_dir",),
        "cnnpar bench --compare writes compare.md into --out; --out-dir places it only without --out",
    ),
    "bench --claims": (
        tuple(key for key in _flags() if key not in CLAIMS_READ),
        "cnnpar bench --claims measures each claim on the workload and settings the claim names (its own model, "
        "synthetic images, batch, precision and compile), reading of the config only --device, --seed, --workers "
        "and --out-dir: it applies to a ladder (cnnpar bench) and cnnpar train",
    ),
    "bench --time-to-accuracy": (
        (*_NO_RUN, "run.eval_every"),
        "cnnpar bench --time-to-accuracy evaluates after every epoch, to time the first that reaches --target, with "
        "no progress bar, telemetry or run folder (its tables go to --out): it applies to cnnpar train",
    ),
    "doctor": (
        ("run.name",),
        "cnnpar doctor writes its report to --report-dir, and the train commands it advises leave --name out (a "
        "folder that holds a run is refused): it applies to cnnpar train",
    ),
}
# a command that also leaves unread what another one does, first: bench --compare --out, all bench --compare does
UNREAD_TOO = {"bench --compare --out": ("bench --compare",)}


def unread_by_command(command: str, cfg: Config, typed: set[str]) -> list[str]:
    """One line per flag in `typed` that `command` ("bench --time-to-accuracy", "bench --compare" for those modes)
    does not read at all, whatever the config (UNREAD): the settings of a run's evaluation, progress bar and
    folder, and for bench --compare all but --out-dir (that too beside --out). A run setting's typed value that
    asks for nothing (`--no-progress`: RUN_ASKS) gets no line."""
    return list(_unread(command, cfg, typed).values())


def _unread(command: str, cfg: Config, typed: set[str]) -> dict[str, str]:
    """`unread_by_command`'s lines by the setting each names."""
    lines = {}
    for name in (*UNREAD_TOO.get(command, ()), command):
        keys, why = UNREAD.get(name, ((), ""))
        for key in [*(k for k in RUN_ASKS if k in keys), *(k for k in keys if k not in RUN_ASKS)]:  # run's first
            if key in typed and RUN_ASKS.get(key, _anything)(_value(cfg, key)):
                lines[key] = f"{typed_form(key, _value(cfg, key))} not used: {why}"
    return lines


def typed_notes(command: str, cfg: Config, typed: set[str]) -> list[str]:
    """The note lines for the flags `typed` for `command` (cliargs._command's name): one per flag that does
    nothing in `cfg` (`unused_flags`) or that `command` does not read (`unread_by_command`). A flag named for the
    second is not named for the first too: `--decode gpu` on digits under bench --compare is not read at all."""
    unread = _unread(command, cfg, typed)
    return [*unused_flags(cfg, typed - set(unread)), *unread.values()]


def _anything(value: object) -> bool:
    return True


def typed_form(key: str, value: object) -> str:
    """A setting as the user typed it: `--muon-lr 0.1`, `--compile-eval`, `--no-tta-flip`."""
    flag = _flags()[key]
    if isinstance(value, bool):
        return flag if value else "--no-" + flag[2:]
    return f"{flag} {value:g}" if isinstance(value, float) else f"{flag} {value}"


def unused_flags(cfg: Config, typed: set[str]) -> list[str]:
    """One line per flag in `typed` ("section.field" keys: the flags the user typed) that does nothing in `cfg`
    (the config after presets, --config, a resumed run's record and the flags, so a typed flag's value is the
    one in `cfg`): the flag as typed, why it does nothing, and what would make it apply."""
    lines = []
    for rule in RULES:
        for key in rule.keys:
            if key not in typed:
                continue
            value = _value(cfg, key)
            if not rule.asks(value):
                continue
            why = rule.idle(cfg)
            if why:
                lines.append(f"{typed_form(key, value)} not used: {why}")
    return lines


def _value(cfg: Config, key: str) -> object:
    sec, name = key.split(".", 1)
    return getattr(getattr(cfg, sec), name)


def refuse_overridden(cfg: Config, typed: set[str], origin: str = "") -> None:
    """Raise ConfigError where a typed flag asks for the opposite of what another, untyped setting makes the run do.

    `--no-tta-flip` under `--preset cifar10-speed`: the preset's tta_level = flip+translate decides over tta_flip
    (RunConfig.tta_in_effect), so the run would evaluate with the mirror it was told not to use. Typed beside a
    --tta-level, the level is the user's own: `unused_flags` says that the switch is not read."""
    if "run.tta_flip" not in typed or "run.tta_level" in typed:
        return
    level = cfg.run.tta_level
    if cfg.run.tta_flip or level == "none":
        return
    source = f" (from {origin})" if origin else ""
    raise ConfigError(
        f"--no-tta-flip with tta_level = {level!r}{source}: the level decides the test-time augmentation and "
        f"keeps the mirror: expected --tta-level none in place of --no-tta-flip (or --tta-level flip: the mirror "
        "without the shifts)"
    )
