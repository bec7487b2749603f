"""Command-line flags generated from the config dataclasses, so help text and fields cannot drift."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import fields, replace
from pathlib import Path

from cnnpar.config import (
    COMMAND_LINE,
    MACHINE_FIELDS,
    SECTIONS,
    Config,
    ConfigError,
    OptimConfig,
    choice_with_advice,
    cli_flag,
    cli_option,
    from_dict,
    load_toml,
    read_config_text,
    setting_name,
    to_dict,
    workers_or_auto,
)
from cnnpar.errors import UserError
from cnnpar.presets import PRESET_LINES, PRESETS, get_preset
from cnnpar.report.files import TEXT


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" to a flag's help unless the help already names its default
    (the config flags, "--out ... (default: SRC.cnnpar)") or there is nothing to show
    (an on/off switch, an empty string, a required flag)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.required or not action.option_strings:
            return text
        # identity, not ==: 0 is a default worth showing, False (a switch left off) is not
        if action.default is None or action.default is False or action.default is argparse.SUPPRESS:
            return text
        if action.default == "" or isinstance(action, argparse._StoreTrueAction):
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


def _positive_or_auto(text: str, kind: type, noun: str) -> int | float:
    """A `kind` > 0, or `auto` (stored as 0: resolved when the run starts). A typed 0 is refused: it would read as
    auto, not as the 0 typed (a config file's 0 still means auto, as its comments say)."""
    if text.strip().lower() == "auto":
        return kind(0)
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {noun} or auto") from None
    if value <= 0:  # (nan and inf pass, for the config's own message: optim.lr (--lr) = nan: expected a finite ...)
        raise argparse.ArgumentTypeError(f"{text!r}: expected {noun} > 0 or auto")
    return value


def int_or_auto(text: str) -> int:
    """A count, or `auto`: a search or rule resolves it when the run starts."""
    return _positive_or_auto(text, int, "a whole number")


def float_or_auto(text: str) -> float:
    """A number, or `auto`, as `--lr auto`: the optimizer's own, resolved when the run starts."""
    return _positive_or_auto(text, float, "a number")


def add_config_flags(parser: argparse.ArgumentParser, extra_presets: dict[str, str] | None = None) -> None:
    """One flag per config field; `extra_presets` are names a subcommand handles itself (bench's claims), each with
    its line for the --preset help."""
    # a group of its own, after the subcommand's own options (added before this): argparse lists its plain
    # "options" group first, which held these two above the doctor's or the bench's own flags
    start = parser.add_argument_group("config", "where the settings start from; the flags below change single ones")
    lines = {**PRESET_LINES, **(extra_presets or {})}  # bench's `claims` was a choice its help did not name
    named = "; ".join(f"'{name}' = {line}" for name, line in lines.items())
    start.add_argument("--preset", choices=sorted(PRESETS) + list(extra_presets or ()), help=f"a named preset: {named}")
    start.add_argument(
        "--config",
        metavar="FILE",
        help="start from a TOML config (a run's config.toml works: a new run with its settings; its resume line "
        "is not used, --resume continues a run, with that run's own settings: a note names what this file sets "
        "otherwise)",
    )
    base = Config()
    for sec_name in SECTIONS:
        group = parser.add_argument_group(sec_name)
        for f in fields(getattr(base, sec_name)):
            flag = cli_option(f)
            default = getattr(getattr(base, sec_name), f.name)
            kw = dict(
                dest=f"{sec_name}.{f.name}",
                default=argparse.SUPPRESS,
                help=f"{f.metadata.get('help', '')} (default: {f.metadata.get('shown', repr(default))})",
            )
            if isinstance(default, bool):
                group.add_argument(flag, action=argparse.BooleanOptionalAction, **kw)
            elif f.metadata.get("auto_zero") and isinstance(default, float):
                group.add_argument(flag, type=float_or_auto, metavar=f"{cli_flag(f).upper()}|auto", **kw)
            elif f.metadata.get("auto_zero"):
                group.add_argument(flag, type=int_or_auto, metavar="N|auto", **kw)
            elif f.metadata.get("auto_minus_one"):  # --workers: the word predict's --workers takes too
                group.add_argument(flag, type=workers_or_auto, metavar="N|auto", **kw)
            else:
                choices = f.metadata.get("choices")
                # `--lr LR`, not the dest's `OPTIM.LR`; a flag with choices shows them
                metavar = None if choices else cli_flag(f).upper()
                advice = f.metadata.get("advice")
                kind = choice_with_advice(choices, advice) if advice else type(default)
                group.add_argument(flag, type=kind, choices=choices, metavar=metavar, **kw)


# what --budget-s inf does, in bench's and tune's help: at_least(0, float) takes inf, a deadline that never comes
# (bench's ladder and claims, tune's trials: every check is `left < ...` or `elapsed > budget`, never a division)
INF_NO_LIMIT = "inf: no limit"


def at_least(low: float, kind: type = int):
    """An argparse type: a number of `kind` no smaller than `low`, refused in argparse's one line otherwise (a
    doctor measuring 0 steps gave a verdict from nothing; tune with 0 repeats failed on an empty median)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a {'whole ' if kind is int else ''}number") from None
        if not value >= low:  # NaN too
            raise argparse.ArgumentTypeError(f"{text}: expected {low:g} or more")
        return value

    parse.__name__ = f"{kind.__name__} >= {low:g}"  # argparse names the type in some messages
    return parse


def budget_seconds(text: str) -> float:
    """bench's and tune's `--budget-s`: seconds > 0, or inf (no limit). A typed 0 is refused in both, in one line
    naming the default and inf: bench took it as its mode's default (no limit for the ladder) while tune took it as
    0 s and refused it after start-up, so one figure meant "none" to one command and "unlimited" to the other. A
    negative or NaN is refused in the same words ("expected 0 or more" would invite the 0 refused here)."""
    expected = "expected seconds above 0, or inf for no limit (leave it out for the default)"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: {expected}") from None
    if not value > 0:  # NaN too
        raise argparse.ArgumentTypeError(f"{text}: {expected}")
    return value


def stored_run_config(
    resume: str, out_dir: str = "", name: str = "", search_again: bool = False
) -> tuple[Path, Config] | None:
    """The config.toml of the run that `--resume PATH` (or `--resume auto --name NAME`) continues, and the
    config a resume starts from, read from it; None when there is none.

    Resuming must train the same model on the same data as the run did, not the defaults;
    the machine-dependent switches go back to what the user asked for ("auto" where it was auto) so another
    machine can continue the run, and a switch the user set stays set (so does one edited in the file since).
    A run killed before its first checkpoint still has its config.toml: `auto` starts it again
    from that, not from the defaults.
    """
    record = _stored_record(resume, out_dir, name)
    return None if record is None else (record, _read_stored(record, search_again))


def rooted_data_paths(stored: Config, record: Path, given: dict) -> Config:
    """`stored` (a resumed run's config) with its relative data paths made absolute against the folder the run was
    started in (its `# started in:` line), so a resume from another folder reads the same data. A record written
    before that line keeps them relative to this folder, as it did: one not found here is refused in one line, where
    it read as data that is missing. A path typed now (--data, --labels) is the user's and stays as typed."""
    from cnnpar.engine.resolved import DATA_PATH_FIELDS, read_started_in, relative_file, rooted

    folder = read_started_in(record.read_text(**TEXT))
    changed = {}
    for name in DATA_PATH_FIELDS:
        value = getattr(stored.data, name)
        if f"data.{name}" in given or not relative_file(value):  # typed now (the user's), or nothing to root
            continue
        if folder is not None:
            changed[name] = rooted(value, folder)
        elif not Path(value).exists():
            flag = "--data" if name == "source" else f"--{name}"
            raise UserError(
                f"{record}: {flag} {value} is relative and not found from {Path.cwd()} (the record does not say which "
                f"folder the run was started in): expected {flag} PATH naming it, or resume from that folder"
            )
    return replace(stored, data=replace(stored.data, **changed)) if changed else stored


def _stored_record(resume: str, out_dir: str = "", name: str = "") -> Path | None:
    """The config.toml `stored_run_config` reads, None where there is none."""
    from cnnpar.engine.checkpoint import find_checkpoint, resumed_checkpoint, run_dir_of
    from cnnpar.engine.rundir import refuse_too_long_path

    if resume == "auto":
        if not name:
            return None  # a fresh default name: no earlier run to read
        folder = Path(out_dir) / name
        refuse_too_long_path(folder)  # its is_dir() raised on a path the system cannot take
        ckpt = find_checkpoint(folder) if folder.is_dir() else None
    else:
        ckpt = resumed_checkpoint(resume)
        if ckpt is None:
            return None
    run_dir = run_dir_of(ckpt) if ckpt is not None else folder
    stored = run_dir / "config.toml"
    return stored if stored.is_file() else None


def _read_stored(stored: Path, search_again: bool) -> Config:
    from cnnpar.engine.resolved import REQUESTED, size_from_checkpoint

    run_dir = stored.parent
    try:
        raw = to_dict(load_toml(stored))
    except ConfigError:
        # a run named `a/b` before --name had to be one folder name: runs/a/b resumes as b in runs/a (any other
        # error in the file is raised again by this second reading)
        own = {"out_dir": str(run_dir.resolve().parent), "name": run_dir.resolve().name}
        raw = to_dict(load_toml(stored, typed={"run": own}))
    if not _names_folder(raw["run"], run_dir):
        # a folder renamed or moved since (or a default-named run, stored as name = ""): the run is the folder
        # it resumes in, which the record written on this resume must name, not a run that may be another one
        raw["run"]["out_dir"], raw["run"]["name"] = str(run_dir.resolve().parent), run_dir.resolve().name
    text = stored.read_text(**TEXT)
    if REQUESTED not in text:  # written before the requested lines: choices unknown, so auto
        defaults = to_dict(Config())
        for sec, names in MACHINE_FIELDS.items():
            for name_ in names:
                raw[sec][name_] = defaults[sec][name_]
    if size_from_checkpoint(text):
        raw["data"]["image_size"] = _trained_side(run_dir)
    _as_requested(raw, text, lambda sec, name_: _found_again(sec, name_) or (search_again and (sec, name_) in SEARCHED))
    return from_dict(raw, origin=str(stored))


def _trained_side(run_dir: Path) -> int:
    """The side of the square images the run's checkpoint trained on, 0 (auto) where it tells none. A record written
    before the `# requested:` lines stores an automatic image size as 0, which this cnnpar's rule would resolve again
    otherwise: a folder of 40x48 photos that an older cnnpar trained at 224 (its rule then) resolved at 40 here, and
    the resume was refused, its line saying to give the --image-size it had not given. A non-square input (an
    array's own shape, never resized by auto) is left to auto."""
    from cnnpar.engine.checkpoint import find_checkpoint, stored_state

    ckpt = find_checkpoint(run_dir)
    # a file that does not load is refused by the resume's own load
    state = stored_state(ckpt) if ckpt is not None else None
    try:
        c, h, w = state["meta"]["image_shape"]
    except (TypeError, KeyError, ValueError):  # no state, no meta or shape, not 3 values
        return 0
    return h if isinstance(h, int) and h == w and h > 0 else 0


# What the data itself decides, found again from it wherever a run's record is reused: the same data gives the
# same values, and the run then says where they came from (a stored class count read as --num-classes did not).
# A resume keeps the image size its checkpoint's model was built for; a new run from a record (`_config_file`)
# finds every data-decided value again
FOUND_IN_DATA = (("data", "format"), ("data", "num_classes"))
# An automatic batch size and the lr the search scaled for it (trainer._choose_batch_size): searched again, the
# batch goes back to auto and the lr to the one asked for at its --lr-batch, or the new search scales a scaled lr again
SEARCHED = (("run", "batch_size"), ("optim", "lr"))


def _machine_field(sec: str, name: str) -> bool:
    return name in MACHINE_FIELDS.get(sec, ())


def _found_again(sec: str, name: str) -> bool:
    return _machine_field(sec, name) or (sec, name) in FOUND_IN_DATA


def _as_requested(raw: dict, text: str, which) -> None:
    """In `raw` (a stored run's config as a dict), the fields `which(section, name)` picks go back to what the
    run's user asked for (its `# requested:` lines: "auto", say), to be resolved again here.
    - The switches resolved for the run's machine (`_machine_field`): a CPU run's record re-run, or resumed,
      on a GPU machine must not train on the CPU.
    - What the run found in its own data: its format and class count wherever the record is reused; on --config
      (a new run) all of it, image size and augment too, and with other data the batch fitted to it (`_config_file`).
    A stored value without a requested line was the user's own choice (a resolved "auto" is always written as
    one) and stays: `--precision fp32` stays fp32, not whatever auto picks here. So does a value edited in the
    file since the run wrote it (`_edited`)."""
    from cnnpar.engine.resolved import read_requested

    edited = _edited(raw, text)
    for (sec, name), value in read_requested(text).items():
        if sec in raw and name in raw[sec] and which(sec, name) and (sec, name) not in edited:
            raw[sec][name] = value


def _edited(raw: dict, text: str) -> set[tuple[str, str]]:
    """The fields of `raw` (read from the config.toml `text`) whose value is not the one the run resolved and
    wrote there: edited by hand since (`precision = "fp32"` over the bf16 an auto chose). A record without
    `# resolved:` lines (written before them) tells none."""
    from cnnpar.engine.resolved import read_resolved

    return {
        (sec, name)
        for (sec, name), value in read_resolved(text).items()
        if sec in raw and name in raw[sec] and _plain(raw[sec][name]) != _plain(value)
    }


def _plain(value: object) -> object:
    """A value as TOML and repr compare alike (a TOML array reads as a list, a repr'd tuple as a tuple)."""
    return list(value) if isinstance(value, tuple) else value


def _names_folder(run: dict, folder: Path) -> bool:
    """A [run] table whose out_dir/name is `folder` (relative paths from this working folder)."""
    return bool(run["name"]) and (Path(run["out_dir"]) / run["name"]).resolve() == folder.resolve()


def _as_new_run(cfg: Config, file: str, given: dict) -> Config:
    """A --config file's settings without the identity of the run it may be the record of.

    A run's config.toml holds `resume = "runs/X"` once that run was resumed, and its own name: re-running it
    must start a new run with those settings, not continue X (and rewrite X's config.toml) or collide with it.
    So resume comes from the command line only, and a run's own config.toml (in out_dir/name) leaves the name
    to --name or a new default one. A name in any other file (a hand-written one) stands: a second run under it
    is refused, naming the fix, as for a typed --name.
    """
    run = to_dict(cfg)["run"]
    own_record = _names_folder(run, Path(file).parent)
    changes = {}
    if "run.resume" not in given and run["resume"]:
        changes["resume"] = ""
        if not own_record and _prints_notes():  # a run's own record resuming itself is no news
            resumed = run["resume"]
            print(
                f'cnnpar: note: {file}: resume = "{resumed}" not used: a --config file gives settings; '
                f"a run resumes with --resume on the command line",
                file=sys.stderr,
            )
    if "run.resume" not in given and "run.name" not in given and own_record:
        changes["name"] = ""
    return replace(cfg, run=replace(cfg.run, **changes)) if changes else cfg


def _prints_notes() -> bool:
    """Whether this process prints the notes on how its settings were read: the process the user started
    (`--nproc`'s launcher reads them first, so its workers keep quiet) and, under a torchrun or horovodrun
    launched by hand, rank 0."""
    from cnnpar.dist import LAUNCHED_NPROC_ENV, launcher_rank  # (here: the module imports torch, which --help must not)

    return launcher_rank() == 0 and LAUNCHED_NPROC_ENV not in os.environ


def config_from_args(args: argparse.Namespace) -> Config:
    """Preset or file first (or, for `--resume RUN` and `--resume auto --name RUN`, that run's
    stored config), then every flag the user actually typed on top."""
    return config_and_set_aside_lr(args)[0]


def config_and_set_aside_lr(args: argparse.Namespace) -> tuple[Config, str]:
    """`config_from_args`, and where a --preset's lr was set aside for the optimizer asked for (`preset_lr_set_aside`)
    the words for the run's lr line that say so ("--preset cifar10-resnet18's lr 0.2 is sgd's"), else ""."""
    given = vars(args)
    if given.get("run.name") == "":
        # '' stands for the default name in a config file (a default-named run's record); typed, it is a mistake
        raise ConfigError(
            f"{setting_name('run', 'name')} = '': expected one folder name inside --out-dir (leave --name out for "
            "a new default name)"
        )
    if given.get("run.resume") == "":
        # '' is no resume (the default): typed, `--resume ""` (an unset shell variable) started a new run unsaid
        raise ConfigError(
            f"{setting_name('run', 'resume')} = '': expected a run folder, a checkpoint file or 'auto' (leave "
            "--resume out for a new run)"
        )
    resume = given.get("run.resume", "")
    search_again = given.get("run.batch_size") == 0  # --batch-size auto typed over a record's searched batch
    origin = " / ".join(
        f"{flag} {value}"
        for flag, value in (("--config", getattr(args, "config", None)), ("--preset", getattr(args, "preset", None)))
        if value
    )
    if getattr(args, "config", None):
        cfg = _config_file(args, given, search_again)
    else:
        cfg = get_preset(args.preset) if getattr(args, "preset", None) else Config()
    cfg, set_aside = _preset_lr_set_aside(cfg, args)
    if resume:
        # `auto` names its folder by --out-dir/--name, typed or from the preset or file
        out_dir = given.get("run.out_dir", cfg.run.out_dir)
        found = stored_run_config(resume, out_dir, given.get("run.name", cfg.run.name), search_again)
        if found is not None:
            record, stored = found
            stored = rooted_data_paths(stored, record, given)
            if _prints_notes():
                _say_not_applied(args, given, cfg, stored, record.read_text(**TEXT))
            cfg, origin, set_aside = stored, str(record), ""  # the run's own lr, as it resumes
    overrides = _typed_settings(given)
    if not overrides:
        return cfg, set_aside
    merged = to_dict(cfg)
    for sec, values in overrides.items():
        merged[sec].update(values)
    cfg = from_dict(merged, origin=COMMAND_LINE)
    _check_typed(cfg, {key for key in given if "." in key}, origin, _command(args))
    return cfg, set_aside


# optimizers whose --lr means the same thing, an SGD step's: muon's drives its SGD groups (config.DEFAULT_LRS gives
# both 0.025), and cifar10-speed's sgd 1.5 and cifar10-record's muon 1.656 train the same fastnet
SGD_LR_FAMILY = {"sgd", "muon"}


def _preset_lr_set_aside(cfg: Config, args: argparse.Namespace) -> tuple[Config, str]:
    """`cfg` with a --preset's lr set aside where `preset_lr_set_aside` says so (auto: the optimizer asked for trains
    at its own default, resolve_for_device, at the preset's batch), and with it the preset's bias lr multiplier
    unless one is asked for; and the words for the lr line, else ""."""
    in_file = _file_optim(args.config) if getattr(args, "config", None) else {}
    words = preset_lr_set_aside(args, in_file)
    if not words:
        return cfg, ""
    optim, plain = replace(cfg.optim, lr=0.0), OptimConfig().bias_lr_scale
    if optim.bias_lr_scale != plain and "optim.bias_lr_scale" not in vars(args) and "bias_lr_scale" not in in_file:
        # airbench's x64 for biases and norms goes with the preset's SGD lr: AdamW's biases trained at 0.128
        words += f", as is its bias lr x{optim.bias_lr_scale:g} (x{plain:g} now)"
        optim = replace(optim, bias_lr_scale=plain)
    return replace(cfg, optim=optim), words


def preset_lr_set_aside(args: argparse.Namespace, in_file: dict) -> str:
    """Where the optimizer asked for (--optimizer, or a --config file's `optimizer`) is not the one a --preset's lr
    was tuned for, and no lr is asked for (no --lr, none in the file), that lr is set aside for the asked optimizer's
    own default (--lr auto): the words that say so for the run's lr line, else "". A preset's lr is tuned for its
    optimizer: kept for another, --optimizer adamw under cifar10-resnet18 trained at SGD's 0.2, 100x AdamW's own,
    as one lr for all optimizers had trained sgd at AdamW's (config.DEFAULT_LRS). A preset whose lr is auto sets
    nothing aside: the optimizer asked for takes its own default already; nor does sgd for muon or muon for sgd
    (SGD_LR_FAMILY)."""
    preset = getattr(args, "preset", None)
    given = vars(args)
    if not preset or "optim.lr" in given:
        return ""
    tuned = get_preset(preset).optim
    if not tuned.lr:
        return ""
    if "lr" in in_file:  # the --config file's [optim] table
        return ""
    asked = given.get("optim.optimizer", in_file.get("optimizer", tuned.optimizer))
    if asked == tuned.optimizer or {asked, tuned.optimizer} <= SGD_LR_FAMILY:
        return ""
    return f"--preset {preset}'s lr {tuned.lr:g} is {tuned.optimizer}'s"


def _file_optim(file: str) -> dict:
    """The [optim] table of the config file `file` as written (read and checked already by `_config_file`)."""
    import tomllib

    optim = tomllib.loads(read_config_text(file)).get("optim", {})
    return optim if isinstance(optim, dict) else {}


def _typed_settings(given: dict) -> dict[str, dict]:
    """The config flags typed ({section: {name: value}}): `given` holds a "section.name" key for each."""
    overrides: dict[str, dict] = {}
    for key, value in given.items():
        if "." in key:
            sec, name = key.split(".", 1)
            overrides.setdefault(sec, {})[name] = value
    return overrides


def _command(args: argparse.Namespace) -> str:
    """The command whose flags `args` holds, with bench's modes that read other settings than its ladder: one
    evaluates, one trains nothing, and reads not even --out-dir beside --out, one builds each claim's own config
    (flag_effects.UNREAD)."""
    command = getattr(args, "command", "train")
    mode = getattr(args, "bench_mode", "")  # set by cli.cmd_bench
    if command == "bench" and mode == "compare":
        return "bench --compare --out" if getattr(args, "out", "") else "bench --compare"
    if command == "bench" and mode == "claims":
        return "bench --claims"
    if command == "bench" and mode == "time_to_accuracy":
        return "bench --time-to-accuracy"
    return command


def _check_typed(cfg: Config, typed: set[str], origin: str, command: str) -> None:
    """Once per command, on the config it runs: a typed flag that another setting turns into its opposite is
    refused, and one that does nothing here, or that `command` does not read, is named in a note (flag_effects.py),
    not silently ignored."""
    from cnnpar.flag_effects import refuse_overridden, typed_notes

    refuse_overridden(cfg, typed, origin)
    if _prints_notes():
        for line in typed_notes(command, cfg, typed):
            print(f"cnnpar: note: {line}", file=sys.stderr)


def _config_file(args: argparse.Namespace, given: dict, search_again: bool) -> Config:
    """The settings of `--config FILE` (on `--preset`'s), as a new run takes them: a run's record's resolved
    "auto"s asked for again (`_as_requested`) wherever a fresh run would choose them afresh."""
    # the typed flags go in before the file's values are checked only where those fail: a file's bad value that a
    # flag replaces (val_fraction = 1.5 beside --val-fraction 0.1) then stops nothing
    base = get_preset(args.preset) if args.preset else None
    cfg = _as_new_run(load_toml(args.config, base, _typed_settings(given)), args.config, given)
    raw = to_dict(cfg)
    text = read_config_text(args.config)
    # a fixed batch, typed or edited into the file, is not searched: the record's lr stands beside it, as it does
    # without other data
    fixed_batch = given.get("run.batch_size", 0) != 0 or ("run", "batch_size") in _edited(raw, text)
    # the batch the run fitted to its data, with other data or where it was capped to the split (which the same data
    # caps alike), and an automatic batch size searched for that data's images, are chosen again
    refit = (_other_data(given, raw, text) or _batch_capped(raw, text)) and not fixed_batch
    searched = search_again and not fixed_batch
    # a record's lr that was its optimizer's default (--lr auto) is that optimizer's: another --optimizer typed
    # beside the file takes its own, as it would without the file (sgd's 0.025 trained AdamW 12x too fast)
    other_optimizer = given.get("optim.optimizer", raw["optim"]["optimizer"]) != raw["optim"]["optimizer"]

    def found_again(sec: str, name: str) -> bool:
        # What the run found in its data (its image size and augment as well as format and class count) is found
        # again from the data it names now: the same data gives the same values, and a file changed behind the same
        # path, or other data typed, what a fresh run would get. So is a --grad-accum capped to an epoch's batches.
        if _found_again(sec, name) or sec == "data" or (sec, name) == ("optim", "grad_accum"):
            return True
        if other_optimizer and (sec, name) == ("optim", "lr"):
            return True
        return (refit and (sec, name) in FITTED_BATCH) or (searched and (sec, name) in SEARCHED)

    _as_requested(raw, text, found_again)
    if "speed.device" not in given and _prints_notes():
        note = _tuned_elsewhere_note(args.config, text, raw["speed"]["device"])
        if note:
            print(f"cnnpar: note: {note}", file=sys.stderr)
    return from_dict(raw, origin=args.config, typed=frozenset(key for key in given if "." in key))


def _tuned_elsewhere_note(file: str, text: str, device: str) -> str:
    """A tuned.toml pins the device its trials ran on, and the switches they resolved there: one made on the CPU
    trained a GPU machine's run on the CPU without a word (its CUDA switches off), and one made on a GPU stops on a
    machine without one. "" where the file is no tune result or this machine has the device it names."""
    from cnnpar.bench.tune import TUNED_MARK

    if TUNED_MARK not in text or device not in ("cpu", "cuda"):
        return ""
    import torch  # here only: --help and the launcher's parent import this module without torch

    here = "cuda" if torch.cuda.is_available() else "cpu"
    if device == here:
        return ""
    if device == "cpu":
        return (
            f'{file} was tuned on the CPU and pins device = "cpu": this machine has a CUDA GPU, which this run '
            "leaves unused; `cnnpar tune` here tunes for it, or --device cuda trains on it with the file's other "
            "switches, tuned for the CPU (CUDA graphs, pinned memory and the like off)"
        )
    return (
        f'{file} was tuned on a CUDA GPU and pins device = "cuda": this machine has none; `cnnpar tune` here '
        "tunes for it, or --device cpu trains here with the file's other switches, tuned for the GPU"
    )


# What decides which images a run trains on and its training split: typed beside --config with another value than
# the record's (as resolved, or as its run asked for it), the record's run trained on other data
DECIDES_DATA = (
    ("data", "format"),
    ("data", "labels"),
    ("data", "image_shape"),
    ("data", "image_size"),
    ("data", "num_classes"),
    ("data", "synthetic_samples"),
    ("data", "val_fraction"),
)
# The batch fitted to a run's data (searched for its images, capped to its training split: trainer._choose_batch_size
# and _cap_batch_size), the lr scaled for it and the batch that lr is for (which a capped fixed batch sets to the cap)
FITTED_BATCH = (*SEARCHED, ("optim", "lr_batch"))


def _other_data(given: dict, raw: dict, text: str) -> bool:
    """Whether the flags typed beside `--config` (`given`) name other data than the record `text` (read as `raw`)
    trained on: another --data, or another value of what decides its images and split (`DECIDES_DATA`)."""
    from cnnpar.engine.resolved import read_requested
    from cnnpar.engine.rundir import same_source

    source = given.get("data.source")
    if source is not None and not same_source(source, raw["data"]["source"]):
        return True
    asked = read_requested(text)
    return any(
        f"{sec}.{name}" in given
        and given[f"{sec}.{name}"] not in (raw[sec][name], asked.get((sec, name), raw[sec][name]))
        for sec, name in DECIDES_DATA
    )


def _batch_capped(raw: dict, text: str) -> bool:
    """Whether the record's batch (`raw`, read from `text`) is one the trainer capped to its training split
    (trainer._cap_batch_size), told from the batch asked for: nothing else lowers a fixed batch, or the CPU's
    automatic one. Asked for again, the same data caps it alike, and a file changed behind the same path, or another
    --nproc, caps it to its own split. A GPU's automatic batch is searched within the split and cannot be told from
    a search's other limits: it stays, as searched (a search is not repeated for a record re-run on the same data)."""
    from cnnpar.config import CPU_BATCH
    from cnnpar.engine.resolved import read_requested

    asked = read_requested(text).get(("run", "batch_size"))
    stored = raw["run"]["batch_size"]
    if not isinstance(asked, int) or not isinstance(stored, int):
        return False
    return stored < asked if asked else raw["speed"]["device"] == "cpu" and stored < CPU_BATCH


# What names a run rather than setting how it trains: `--resume` picks the run, whatever a file says
IDENTITY = (("run", "out_dir"), ("run", "name"), ("run", "resume"))


def _say_not_applied(args: argparse.Namespace, given: dict, cfg: Config, stored: Config, record: str) -> None:
    """The note for a --preset or --config beside a --resume that continues a run: the run's own record replaces
    it whole. A note, not a refusal: re-running the command that started the run (`--preset X --resume auto`,
    `--config small.toml --resume auto`) is how a killed run continues. A file that sets what the run has (the
    file that started it, the run's own config.toml) is no news; one that differs names where."""
    from cnnpar.engine.resolved import read_requested

    typed = " (flags typed beside --resume change single settings)"
    if getattr(args, "preset", None):
        print(
            f"cnnpar: note: --preset {args.preset} not used: a resumed run continues with the settings of "
            f"its own config.toml{typed}",
            file=sys.stderr,
        )
    if not getattr(args, "config", None):
        return
    asked = read_requested(record)  # what the run asked for ("auto", 0) is the same setting as what it resolved
    theirs, ours = to_dict(cfg), to_dict(stored)
    differ = [
        f"{sec}.{name}"
        for sec in SECTIONS
        for name, value in theirs[sec].items()
        if (sec, name) not in IDENTITY
        and f"{sec}.{name}" not in given
        and value != ours[sec][name]
        and asked.get((sec, name), ours[sec][name]) != value
    ]
    if differ:
        print(
            f"cnnpar: note: --config {args.config}: not applied on resume: the run continues with the settings of "
            f"its own config.toml (differs in {', '.join(differ)}){typed}",
            file=sys.stderr,
        )


def passthrough_args(argv: list[str], drop: str) -> list[str]:
    """argv without `--drop N` / `--drop=N` (a horovodrun launch drops --nproc and --strategy; tune, --budget-s)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == drop:
            skip = True
            continue
        if a.startswith(drop + "="):
            continue
        out.append(a)
    return out
