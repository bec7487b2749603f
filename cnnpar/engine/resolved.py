"""The config a run writes: every "auto" replaced by what the run actually does.

`resolve_for_device` settles what depends on the machine; what depends on the data (its format,
image size, class count, augmentation) or on the loader that was built (workers, resident data, the
GPU decoder's resize) is only known once those exist, so it is filled in here. The values the user
asked for stand beside the resolved ones as TOML comments: the file stays loadable with --config
(which then repeats exactly this run) and still says what was chosen automatically.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import fields, replace

import torch

from cnnpar.config import LONG_COMPILES, SECTIONS, Config, auto_number, to_dict
from cnnpar.data import DataBundle
from cnnpar.data.loader import DeviceFeeder, ResidentLoader
from cnnpar.data.sources import BUILT_IN, detect_format
from cnnpar.data.transforms import resolve_augment


def data_resolved(cfg: Config, bundle: DataBundle, train_loader: DeviceFeeder, graphs: bool) -> Config:
    """`graphs`: whether the step really runs as a CUDA graph (the trainer may turn a resolved "on"
    off where graphs cannot apply, and says why)."""
    decoder = train_loader.decoder
    resident = isinstance(train_loader.loader, ResidentLoader) or bool(getattr(decoder, "resident", False))
    d = cfg.data
    return replace(
        cfg,
        speed=replace(cfg.speed, cuda_graphs="on" if graphs else "off"),
        data=replace(
            d,
            format=detect_format(d.source, d.format),
            image_size=bundle.shape[-1],
            num_classes=bundle.num_classes,
            workers=int(getattr(train_loader.loader, "num_workers", 0)),
            resident="on" if resident else "off",
            gpu_resize=getattr(decoder, "resize", None) or ("batched" if cfg.speed.device == "cuda" else "loop"),
            augment=resolve_augment(d.augment, bundle.shape, bundle.loader_crops, bundle.grey),
        ),
    )


def long_compiles_resolved(cfg: Config, train_samples: int, world_size: int) -> tuple[Config, str]:
    """`compile_tiling` and `compile_tuning` at "auto" settled by the run's length (presets.long_compiles_default),
    and a line saying why where the rule had something to weigh (a compiled run on CUDA); "" otherwise.

    Known only once the data and the batch size are: a process trains epochs x its share of the samples, or
    fewer where max_steps stops each epoch early. A resumed run counts all its epochs, as the first start did, so
    that both compile alike. Tiling stays off, saying so, on a torch whose inductor lacks its options (an "auto"
    must not fail where an explicit "on" would)."""
    from cnnpar.parallel.apply import missing_tiling_options
    from cnnpar.presets import long_compiles_default

    s, r = cfg.speed, cfg.run
    auto = [name for name in LONG_COMPILES if getattr(s, name) == "auto"]
    if not auto:
        return cfg, ""
    per_epoch = train_samples // max(1, world_size)
    if r.max_steps:
        per_epoch = min(per_epoch, r.max_steps * cfg.optim.grad_accum * r.batch_size)
    on, why = long_compiles_default(cfg.model.name, s.device, s.compile, per_epoch * r.epochs)
    chosen = {name: "on" if on else "off" for name in auto}
    if on and "compile_tiling" in auto:
        missing = missing_tiling_options()
        if missing:
            chosen["compile_tiling"] = "off"
            why += f"; tiling off: torch {torch.__version__}'s inductor has no {', '.join(missing)}"
    cfg = replace(cfg, speed=replace(s, **chosen))
    if s.device != "cuda" or s.compile == "off":
        return cfg, ""
    said = [f"--{name.replace('_', '-')} {value}" for name, value in chosen.items()]
    return cfg, f"long compiles: {', '.join(said)} ({why})"


def as_measured(cfg: Config) -> Config:
    """The long compiles' "auto" as a measuring run resolves it: off. The doctor, bench, ladder, tuner and profiler
    time a few steps, not the epochs the config names, so they never pay minutes of compile that a long run
    would repay; an explicit "on" is measured as asked."""
    off = {name: "off" for name in LONG_COMPILES if getattr(cfg.speed, name) == "auto"}
    return replace(cfg, speed=replace(cfg.speed, **off))


REQUESTED = "# requested: "
# Beside each requested line, the value the run resolved it to: a value in the file that differs from it was
# edited by hand since, and is the user's own choice (cliargs reads both)
RESOLVED = "# resolved: "


def size_from_checkpoint(text: str) -> bool:
    """Whether a resume of the run whose config.toml reads `text` takes its image size from the checkpoint
    (cliargs._trained_side): a record written before the `# requested:` lines stores an automatic size as 0, which
    this cnnpar's rule could resolve otherwise than the older one that trained it."""
    if REQUESTED in text:
        return False
    try:
        data = tomllib.loads(text.removeprefix("\ufeff")).get("data", {})  # a BOM: as config.read_config_text
    except tomllib.TOMLDecodeError:  # refused where the resume reads it
        return False
    return isinstance(data, dict) and not data.get("image_size")


# The folder the run was started in: a resume from another folder reads the run's relative data paths from there
STARTED_IN = "# started in: "
# the config fields that name files, relative to the folder the run was started in
DATA_PATH_FIELDS = ("source", "labels")


def started_in_line() -> str:
    """`# started in: FOLDER`, this process's working folder: the one the record's relative paths are relative to
    (a resume read them made absolute where an earlier start wrote the line, cliargs.rooted_data_paths)."""
    return f"{STARTED_IN}{os.getcwd()}"


def relative_file(path: str) -> bool:
    """A data path read from the working folder: neither empty, a built-in data set, nor absolute."""
    return bool(path) and path not in BUILT_IN and not os.path.isabs(path)


def rooted(path: str, started_in: str | None) -> str:
    """`path` as a run started in `started_in` read it: a relative file path joined to that folder; anything else,
    or a record without the folder (None), unchanged."""
    return os.path.join(started_in, path) if started_in is not None and relative_file(path) else path


def read_started_in(text: str) -> str | None:
    """The folder of a record's `# started in:` line, None in a record written before it."""
    for line in text.splitlines():
        if line.startswith(STARTED_IN):
            return line[len(STARTED_IN) :]
    return None


def requested_lines(requested: Config, resolved: Config) -> list[str]:
    """`# requested: section.field = value` for each field the run resolved to something else (read back by
    `read_requested`), each followed by `# resolved: section.field = value` (`read_resolved`). An "auto" always
    resolves to something else, so a field without a line was the user's own choice and is stored as chosen."""
    lines = []
    for sec in SECTIONS:
        want, got = getattr(requested, sec), getattr(resolved, sec)
        for f in fields(want):
            a, b = getattr(want, f.name), getattr(got, f.name)
            if a != b:
                auto = auto_number(f)
                shown = "auto" if auto is not None and a == auto else repr(a)
                lines.append(f"{REQUESTED}{sec}.{f.name} = {shown}")
                lines.append(f"{RESOLVED}{sec}.{f.name} = {b!r}")
    return lines


def kept_requested_lines(old_record: str, requested: Config, lines: list[str]) -> list[str]:
    """The `# requested:` lines of a resumed run's earlier record, or of the record a run was started from with
    `--config` (`old_record`, its config.toml text), that the new record must keep beside `lines`: a resume takes
    the image size and the batch size from that record as resolved, and a re-run the batch size (searched for the
    same data), so they reach `requested` as values, and without the earlier lines a later `--config` of this
    record would not resolve them again (other data would train at the first run's image size and batch). Kept
    where this run did not set another value."""
    import tomllib

    try:
        stored = tomllib.loads(old_record)
    except tomllib.TOMLDecodeError:
        return []
    now = to_dict(requested)
    have = {line.partition(" = ")[0] for line in lines}
    kept = []
    for line in old_record.splitlines():
        key = line.partition(" = ")[0]
        prefix = next((p for p in (REQUESTED, RESOLVED) if line.startswith(p)), None)
        if prefix is None or key in have:
            continue
        sec, _, name = key[len(prefix) :].partition(".")
        if name in now.get(sec, {}) and stored.get(sec, {}).get(name) == now[sec][name]:
            kept.append(line)  # a requested line and its resolved partner, both or neither
    return kept


def read_requested(text: str) -> dict[tuple[str, str], object]:
    """{(section, field): value} from a stored config.toml's `# requested:` lines (`auto` reads as the number its
    field stores for it: 0, or data.workers' -1)."""
    return _read_comment_lines(text, REQUESTED, auto_is_zero=True)


def read_resolved(text: str) -> dict[tuple[str, str], object]:
    """{(section, field): value} from a stored config.toml's `# resolved:` lines (none in a record written before
    they were)."""
    return _read_comment_lines(text, RESOLVED, auto_is_zero=False)


def _read_comment_lines(text: str, prefix: str, auto_is_zero: bool) -> dict[tuple[str, str], object]:
    """{(section, field): value} from the lines `prefix section.field = repr(value)` of a config.toml. A value
    that does not read back (written by another version) is left out: the stored one stands. `auto` reads as the
    number the field stores for it (a record before data.workers was written `auto` says -1, read as written)."""
    import ast

    known = {sec: {f.name: f for f in fields(getattr(Config(), sec))} for sec in SECTIONS}
    out = {}
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        key, _, shown = line[len(prefix) :].partition(" = ")
        sec, _, name = key.partition(".")
        try:
            if auto_is_zero and shown == "auto":
                f = known.get(sec, {}).get(name)
                out[(sec, name)] = (f is not None and auto_number(f)) or 0  # data.workers' -1; any other, 0
            else:
                out[(sec, name)] = ast.literal_eval(shown)
        except (ValueError, SyntaxError):
            continue
    return out
