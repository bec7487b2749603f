"""Every subcommand's --help names the defaults of its own flags, not only of the config flags."""

import argparse

import pytest

from cnnpar.cli import build_parser


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


@pytest.mark.parametrize(
    "command, flag, shown",
    [
        ("doctor", "--warmup-steps", "(default: 3)"),
        ("doctor", "--measure-steps", "(default: 20)"),
        ("doctor", "--max-seconds", "(default: 30.0)"),
        ("profile", "--prof-active", "(default: 5)"),
        ("bench", "--timed-steps", "(default: 30)"),
        ("bench", "--warmup-steps", "(default: 3)"),
        ("tune", "--budget-s", "(default: 600)"),
        ("tune", "--out", "(default: tuned.toml in a new <--out-dir>/tune/<model>-YYYYMMDD-HHMMSS/)"),
        ("prepare", "--short-side", "(default: 256, or none when a max side is given)"),
        ("prepare", "--workers", "(default: auto)"),
        ("predict", "--batch-size", "(default: 256)"),
        ("compare", "--timeout", "(default: 3600.0)"),
        ("train", "--epochs", "(default: "),
    ],
)
def test_help_shows_default(command, flag, shown):
    text = _option_help(command, flag)  # its own text may name other flags (--grad-accum)
    assert shown in text, f"{command} {flag}: {text}"


def test_help_does_not_repeat_a_stated_default():
    help_text = " ".join(_subparsers()["prepare"].format_help().split())
    stated = "(default: SRC.cnnpar beside SRC, in the current folder where SRC's cannot be written)"
    assert help_text.count(stated) == 1
    assert f"{stated} (default:" not in help_text
    assert "--verify check SRC, a store, against its pixel checksum --" in help_text  # switches: no "(default: False)"


def test_the_doctor_try_help_states_its_default_once():
    """--try's help ended "without --try: none) (default: 0)": two defaults, the second a number of tries."""
    text = _option_help("doctor", "--try")
    assert text.endswith("(default: none; --try alone: 3)"), text
    assert text.count("default") == 1, text


@pytest.mark.parametrize(
    "words, message",
    [
        (["doctor", "--measure-steps", "0"], "argument --measure-steps: 0: expected 2 or more"),
        (["doctor", "--warmup-steps", "-1"], "argument --warmup-steps: -1: expected 0 or more"),
        (["tune", "--repeats", "0"], "argument --repeats: 0: expected 1 or more"),
        (["tune", "--trial-s", "-5"], "argument --trial-s: -5: expected 0 or more"),
        (["profile", "--prof-active", "0"], "argument --prof-active: 0: expected 1 or more"),
        (["tune", "--steps", "two"], "argument --steps: 'two': expected a whole number"),
        (["tune", "--budget-s", "nan"], "argument --budget-s: nan: expected seconds above 0, or inf for no limit"),
    ],
)
def test_counts_that_cannot_measure_anything_are_refused_before_any_work(words, message, capsys):
    """The doctor measured 0 steps and still gave a verdict; tune with 0 repeats failed on an empty median."""
    from cnnpar.cli import main

    with pytest.raises(SystemExit) as e:
        main(words)
    assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(
    "words, message",
    [
        (["doctor", "--try", "-1"], "argument --try: -1: expected 0 or more"),  # tried all but the last advice
        (["bench", "--timed-s", "nan"], "argument --timed-s: nan: expected 0 or more"),
        (["bench", "--budget-s", "-1"], "argument --budget-s: -1: expected seconds above 0, or inf for no limit"),
    ],
)
def test_values_that_would_run_a_different_measurement_are_refused_while_parsing(words, message, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(words)
    assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("command", ["train", "doctor", "bench", "tune", "profile"])
@pytest.mark.parametrize(
    "device, advice",
    [
        (
            "cuda:1",
            "CUDA_VISIBLE_DEVICES=1 with --device cuda trains on GPU 1; cnnpar train --nproc N trains on N GPUs)",
        ),
        ("mps", "not on an Apple GPU through MPS: auto picks the CPU there)"),
        ("CUDA", "(written in lower case: cuda)"),  # a bare "invalid choice" too
        ("Cpu", "(written in lower case: cpu)"),
        ("cuda ", "(written without spaces: cuda)"),  # was "written in lower case", which it was
    ],
)
def test_a_torch_device_name_is_refused_with_what_to_do(command, device, advice, capsys):
    """`--device cuda:1` (PyTorch's habit) got argparse's bare "invalid choice", which does not say that cnnpar
    picks the GPU by local rank, so by CUDA_VISIBLE_DEVICES; `mps` did not say that Apple's GPU is not used."""
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([command, "--device", device])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert f"error: argument --device: '{device}': expected one of auto, cpu, cuda (" in err and advice in err


@pytest.mark.parametrize(
    "command, measures", [("doctor", "cnnpar.doctor.run.run_doctor"), ("tune", "cnnpar.bench.tune.tune")]
)
def test_doctor_and_tune_refuse_more_processes_than_the_one_they_measure(command, measures, capsys, monkeypatch):
    """Both measured one process and then advised, or wrote into tuned.toml, --nproc N from its figures."""
    from cnnpar.cli import main

    monkeypatch.setattr(measures, lambda *a, **k: pytest.fail(f"{command} measured"))
    assert main([command, "--nproc", "2", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"cnnpar: error: {command} measures one process: --nproc 2 (typed or from the config) is not measured here; "
        "expected --nproc 0 or 1 (then train with --nproc 2)\n"
    )
    monkeypatch.setenv("WORLD_SIZE", "2")  # started by torchrun: each rank would run the whole command alone
    monkeypatch.setenv("RANK", "1")
    assert main([command, "--device", "cpu"]) == 2
    assert f"{command} measures one process: started by a launcher with WORLD_SIZE=2" in capsys.readouterr().err
    # the debug switch runs one process, as for train: the surplus rank leaves at once, rank 0 measures
    assert main([command, "--device", "cpu", "--debug-single"]) == 0
    monkeypatch.setenv("RANK", "0")

    class Measured(Exception):
        pass

    def measured(*a, **k):
        raise Measured

    monkeypatch.setattr(measures, measured)
    with pytest.raises(Measured):
        main([command, "--device", "cpu", "--debug-single"])
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("RANK")
    with pytest.raises(Measured):  # --nproc 2 with the switch: one process, not refused
        main([command, "--device", "cpu", "--nproc", "2", "--debug-single"])


def test_doctor_and_profile_flags_default_to_their_options_fields():
    """The defaults are written once, in doctor/options.py: the flags read them from there."""
    from cnnpar.cli import doctor_options, profile_options
    from cnnpar.doctor.options import DoctorOptions, ProfileOptions

    parser = build_parser()
    assert doctor_options(parser.parse_args(["doctor"])) == DoctorOptions()
    assert profile_options(parser.parse_args(["profile"])) == ProfileOptions()
    typed = doctor_options(parser.parse_args(["doctor", "--measure-steps", "7", "--try"]))
    assert (typed.steps, typed.try_top) == (7, 3)


def test_the_parser_imports_no_torch():
    """cnnpar --help and every command's parsing stay quick: the options' defaults come from a module that
    imports no engine (importing doctor/run.py for DoctorOptions would import torch)."""
    import subprocess
    import sys

    code = "import sys; from cnnpar.cli import build_parser; build_parser(); assert 'torch' not in sys.modules"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _help(command: str) -> str:
    return " ".join(_subparsers()[command].format_help().split())  # undo argparse's line wrapping


def _option_help(command: str, flag: str) -> str:
    """The help text of one option in the option list, up to the next option or group (its own text may name
    other flags)."""
    lines = _subparsers()[command].format_help().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"  {flag} ") or line == f"  {flag}")
    end = next(
        (i for i in range(start + 1, len(lines)) if lines[i].startswith("  -") or not lines[i].startswith("  ")),
        len(lines),
    )
    return " ".join(" ".join(lines[start:end]).split())


@pytest.mark.parametrize(
    "flag, says",
    [
        ("--precision", "auto: bf16 on a GPU that computes it and on a CPU with native bf16 (AVX512-BF16 or AMX), "
         "else fp32"),
        ("--compile", "auto: default for resnet18 and resnet50 on CUDA (measured faster on an H200), off for other "
         "models and on the CPU"),
        ("--prefetch-stream", "(auto: on with CUDA)"),
        ("--channels-last", "(auto: on, CPU and CUDA alike"),
    ],
)  # fmt: skip
def test_train_help_says_in_words_what_auto_picks(flag, says):
    """--help pointed at source ("see config.compile_default") or said nothing of auto."""
    text = _option_help("train", flag)
    assert says in text, text
    assert "config.compile_default" not in _help("train")


def test_the_auto_rule_in_the_compile_help_is_the_one_the_run_applies():
    from cnnpar.config import compile_default

    text = _option_help("train", "--compile")
    for model in ("resnet18", "resnet50", "cnn3", "fastnet"):
        named = model in text.split("off for other models")[0]
        assert (compile_default(model, "cuda") == "default") == named, model
        assert compile_default(model, "cpu") == "off"


@pytest.mark.parametrize("command", ["train", "doctor", "bench", "tune", "profile", "predict", "prepare", "compare"])
def test_every_subcommand_has_a_description(command):
    description = _subparsers()[command].description
    assert description and len(description) > 80, command
    assert " ".join(description.split()) in _help(command)


@pytest.mark.parametrize(
    "command, own",
    [("doctor", "--warmup-steps"), ("bench", "--timed-steps"), ("profile", "--prof-wait"), ("tune", "--budget-s")],
)
def test_a_subcommands_own_options_come_before_the_train_flags(command, own):
    """They came last, after some 300 lines of train flags."""
    text = _help(command)
    options = text.split(" options: ", 1)[1]  # past the usage lines
    assert options.index(own + " ") < options.index("--preset ") < options.index("--data ")


def test_the_doctor_description_says_how_long_it_takes_and_what_a_stop_leaves():
    description = " ".join(_subparsers()["doctor"].description.split())
    assert "data-bound" in description and "compute-bound" in description and "host-bound" in description
    assert "a few minutes at the defaults" in description and "minutes compiling" in description
    assert "a Ctrl-C or SIGTERM during the tries still writes the report" in description


def test_the_bench_ddp_help_names_the_files_it_writes():
    assert "(ddp.csv and ddp.json in --out)" in _option_help("bench", "--ddp")


def test_the_preset_help_names_every_preset_in_one_line_each():
    from cnnpar.presets import PRESET_LINES, PRESETS

    assert set(PRESET_LINES) == set(PRESETS)
    text = _option_help("train", "--preset")
    for name, line in PRESET_LINES.items():
        assert f"'{name}' = {' '.join(line.split())}" in text
    assert "presets.py" not in text


def _every_option_help():
    """(command, flag, help text) of every option of every subcommand, argparse's wrapping undone."""
    for command, parser in _subparsers().items():
        for action in parser._actions:
            if action.option_strings and action.help and action.help != argparse.SUPPRESS:
                yield command, action.option_strings[-1], " ".join(action.help.split())


def test_no_option_help_names_a_setting_by_its_config_key_or_points_at_source():
    """A learner reads --help for flags: `lr_scaling`, `weight_decay / bias_lr_scale`, `grad_accum` named settings
    by their config keys, and `(engine/batch_size.py)`, `(presets.long_compiles_default)` pointed at source."""
    import re
    from dataclasses import fields

    from cnnpar.config import SECTIONS, Config, cli_option

    keys = {f.name: cli_option(f) for section in SECTIONS for f in fields(getattr(Config(), section))}
    wrong = []
    for command, flag, text in _every_option_help():
        for word in re.findall(r"(?<![\w.-])[a-z]+(?:_[a-z0-9]+)+\b|\bema \*\*", text):
            if word in keys or word == "ema **":
                wrong.append(f"{command} {flag}: {word!r} (the flag: {keys.get(word, '--ema')})")
        wrong += [f"{command} {flag}: {path!r}" for path in re.findall(r"\b[\w/]+\.py\b", text)]
        wrong += [f"{command} {flag}: {name!r}" for name in re.findall(r"\b(?:presets|config)\.(?!toml\b)\w+", text)]
    assert not wrong, "\n".join(wrong)


def test_the_numbers_the_train_help_states_for_auto_are_the_ones_the_run_uses():
    """Every number the help gives for an auto or a 0 is read from the code that applies it, for each optimizer and
    source the help names: a changed default shows in --help without a second edit."""
    import re

    import numpy as np

    from cnnpar.config import OPTIMIZERS, Config, DataConfig, OptimConfig, asked_lr, lr_reference, resolve_batch_size
    from cnnpar.data.source_size import pick_side
    from cnnpar.data.sources import load_digits, load_synthetic

    lr_help = _option_help("train", "--lr")
    for optimizer in OPTIMIZERS:
        assert f"{optimizer} {asked_lr(OptimConfig(optimizer=optimizer)):g}" in lr_help, optimizer
    cpu_batch = resolve_batch_size(0, "cpu")
    assert f"{cpu_batch} on the CPU" in _option_help("train", "--batch-size")
    assert f"else {lr_reference(Config())};" in _option_help("train", "--lr-batch")
    size_help = _option_help("train", "--image-size")
    kept, mixed = map(int, re.search(r"up to (\d+); else (\d+), for mixed or larger sizes", size_help).groups())
    assert pick_side(np.array([[kept, kept]]), False)[0] == kept
    assert pick_side(np.array([[kept + 1, kept + 1]]), False)[0] == mixed
    assert pick_side(np.array([[32, 32], [64, 64]]), False)[0] == mixed
    assert f"digits: {load_digits(DataConfig(), 0).shape[-1]};" in size_help
    synthetic = load_synthetic(DataConfig(source="synthetic", synthetic_samples=64), 0)
    c, h, w = synthetic.shape
    assert f"({c}x{h}x{w} unless given)" in _option_help("train", "--image-shape")
    assert f"synthetic: {synthetic.num_classes})" in _option_help("train", "--num-classes")


def test_the_train_help_names_what_train_runs_with_no_flags():
    from cnnpar.config import Config
    from cnnpar.data.sources import BUILT_IN, detect_format

    base = Config()
    assert base.data.source in BUILT_IN  # "the built-in ..." below
    for text in (_subparsers()["train"].description, _option_help("train", "--preset")):
        said = " ".join(text.split()).split(f"{base.model.name} on the built-in ", 1)[1]
        assert said.split(")")[0].split(",")[0].endswith(base.data.source), said[:80]
    assert f"(defaults: {base.model.name} on the built-in {base.data.source})" in " ".join(
        build_parser().format_help().split()
    )
    format_help = _option_help("train", "--format")
    for name in ("x.csv", "x.csv.gz", "x.npz", "x.cnnpar"):
        assert name[1:] in format_help and detect_format(name, "auto") in format_help, name


# choices whose word says what they do (a switch's off) or that are torch's own names (torch.compile's modes), and
# --augment's pairs, made of the parts its help explains
SAYS_ITSELF = {"off", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"}


def test_every_choice_of_every_option_is_named_in_its_help():
    """--schedule's help was "learning-rate schedule" (onecycle falls in a straight line, not as torch's OneCycleLR),
    bench's --preset took `claims` and did not name it, predict's --tta-level named none of its views."""
    import re

    unsaid = []
    for command, parser in _subparsers().items():
        for action in parser._actions:
            if not (action.choices and action.option_strings):
                continue
            text = re.sub(r" \(default: [^)]*\)$", "", " ".join((action.help or "").split()))  # not the default
            for choice in map(str, action.choices):
                parts = choice.split("+") if action.dest == "data.augment" else [choice]
                named = all(re.search(rf"(?<![\w+-]){re.escape(part)}(?![\w-])", text) for part in parts)
                if choice not in SAYS_ITSELF and not named:
                    unsaid.append(f"{command} {action.option_strings[-1]} {choice}")
    assert not unsaid, unsaid


def test_the_schedule_help_says_where_each_schedule_takes_the_lr():
    from cnnpar.config import SCHEDULES
    from cnnpar.engine.optim import schedule_factor

    text = _option_help("train", "--schedule")
    for schedule in SCHEDULES:
        end = schedule_factor(999, 1000, 0.15, schedule)
        said = text.split(f"{schedule} ", 1)[1].split(",")[0]
        assert ("to 0" in said) == (end < 0.01) and ("at the peak" in said) == (end == 1.0), (schedule, said)


def test_the_bench_and_tune_help_numbers_are_the_ones_they_measure_with():
    """The least steps and repeats bench --timed-s sizes to, the slow step that warms sooner, the claims' budgets
    and tune's default trial limit, read from the help and checked against the code that applies them."""
    import re

    from cnnpar.bench.claims import CPU_BUDGET_S, CUDA_BUDGET_S
    from cnnpar.bench.timing import Timing

    text = _option_help("bench", "--timed-s")
    least, slow, repeats = re.search(
        r"at least (\d+) \(1 for a step of ([\d.]+) s or more\).*\(at least (\d+)\)", text
    ).groups()
    timing = Timing(3, 30, 5, 1e-9)  # no time at all: every count at its least
    assert timing.plan(float(slow) * 0.99) == (int(least), int(repeats))
    assert timing.plan(float(slow)) == (1, int(repeats))
    assert timing.warm(2, float(slow)) and not timing.warm(2, float(slow) * 0.99)
    assert f"2 where the second takes {slow} s or more" in _option_help("bench", "--warmup-steps")
    budget = _option_help("bench", "--budget-s")
    assert f"claims {CUDA_BUDGET_S:g} with CUDA" in budget and f"{CPU_BUDGET_S:g} on a CPU" in budget
    from fractions import Fraction

    from cnnpar.bench import tune

    share, factor = re.search(
        r"the larger of (.+?) of the budget and ([\d.]+)x", _option_help("tune", "--trial-s")
    ).groups()
    words = {"half": Fraction(1, 2), "a third": Fraction(1, 3), "a quarter": Fraction(1, 4)}
    assert words[share] == Fraction(tune.TRIAL_SHARE).limit_denominator(100) and float(factor) == tune.START_FACTOR


@pytest.mark.parametrize("command", ["bench", "tune"])
def test_a_budget_of_inf_parses_and_the_help_says_it_is_no_limit(command):
    """--budget-s inf was taken, and ran with no limit, while the help promised an end within the budget."""
    args = build_parser().parse_args([command, "--budget-s", "inf"])
    assert args.budget_s == float("inf")
    assert "inf: no limit" in _option_help(command, "--budget-s")
