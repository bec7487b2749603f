"""`--workers auto`, as predict took it, in every command with a --workers (train, profile, doctor, tune and bench
through the config's flag, prepare through its own): the automatic choice each command makes by default, shown as
"auto" in --help, and a value that means nothing refused in one wording everywhere."""

from __future__ import annotations

import argparse

import pytest

from cnnpar import cli
from cnnpar.cliargs import config_from_args
from cnnpar.config import load_toml

CONFIG_COMMANDS = ["train", "profile", "doctor", "tune", "bench"]
ALL_COMMANDS = [*CONFIG_COMMANDS, "predict", "prepare"]
PREDICT = ["--checkpoint", "run", "--data", "photos"]
REFUSAL = "argument --workers: {}: expected a whole number >= 0 or auto"


def _parse(words: list[str]) -> argparse.Namespace:
    return cli.build_parser().parse_args(words)


def _extra(command: str) -> list[str]:
    """The positional arguments a command needs before its --workers parses."""
    return {"predict": PREDICT, "prepare": ["photos"]}.get(command, [])


@pytest.mark.parametrize("command", CONFIG_COMMANDS)
@pytest.mark.parametrize("typed, held", [("auto", -1), ("AUTO", -1), ("-1", -1), ("0", 0), ("3", 3)])
def test_config_commands_take_auto_as_their_default(command, typed, held):
    cfg = config_from_args(_parse([command, "--workers", typed]))
    assert cfg.data.workers == held
    if typed.lower() == "auto":
        assert cfg == config_from_args(_parse([command])), "auto is the default, nothing else"


def test_predict_and_prepare_take_auto_as_their_own_default():
    assert _parse(["predict", *PREDICT, "--workers", "auto"]).workers == _parse(["predict", *PREDICT]).workers == -1
    assert _parse(["prepare", "photos", "--workers", "auto"]).workers == _parse(["prepare", "photos"]).workers == -1
    assert _parse(["prepare", "photos", "--workers", "-1"]).workers == -1
    assert _parse(["prepare", "photos", "--workers", "0"]).workers == 0  # in this process, as train's 0
    assert _parse(["prepare", "photos", "--workers", "5"]).workers == 5


@pytest.mark.parametrize("command", ALL_COMMANDS)
@pytest.mark.parametrize("typed", ["many", "-2", "1.5"])
def test_a_value_that_means_nothing_is_refused_in_one_wording(command, typed, capsys):
    with pytest.raises(SystemExit) as e:
        _parse([command, *_extra(command), "--workers", typed])
    assert e.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    shown = repr(typed) if typed in ("many", "1.5") else typed
    assert last == f"cnnpar {command}: error: {REFUSAL.format(shown)}", last


@pytest.mark.parametrize("command", ALL_COMMANDS)
def test_help_shows_auto_as_the_default(command):
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    action = next(a for a in sub.choices[command]._actions if "--workers" in a.option_strings)
    text = " ".join(sub.choices[command].formatter_class("x")._expand_help(action).split())
    assert text.endswith("(default: auto)") and text.count("default") == 1, text
    assert action.metavar == "N|auto"


def test_a_config_file_takes_auto_too(tmp_path):
    (tmp_path / "c.toml").write_text('[data]\nworkers = "auto"\n')
    assert load_toml(tmp_path / "c.toml").data.workers == -1
    (tmp_path / "c.toml").write_text('[data]\nworkers = "many"\n')
    with pytest.raises(Exception, match=r"data\.workers \(--workers\) = 'many': expected a whole number >= 0 or"):
        load_toml(tmp_path / "c.toml")


@pytest.mark.parametrize("typed, held", [("auto", -1), ("Auto", -1), ("-1", -1), ("0", 0), ("3", 3)])
def test_the_ddp_scaling_benchmark_takes_auto_as_every_command_does(typed, held):
    from cnnpar.bench.ddp_scaling import parse_args

    assert parse_args(["--workers", typed]).workers == held
    assert parse_args([]).workers == -1


@pytest.mark.parametrize("typed", ["many", "-2"])
def test_the_ddp_scaling_benchmark_refuses_a_count_that_means_nothing_in_the_same_words(typed, capsys):
    from cnnpar.bench.ddp_scaling import parse_args

    with pytest.raises(SystemExit) as e:
        parse_args(["--workers", typed])
    assert e.value.code == 2
    shown = repr(typed) if typed == "many" else typed
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == f"ddp_scaling: error: {REFUSAL.format(shown)}", last


@pytest.mark.parametrize("typed, pools", [("0", []), ("1", []), ("auto", [2]), (None, [2])])
def test_prepare_workers_0_decodes_in_its_own_process_as_trains_0_and_auto_one_per_core(
    typed, pools, tmp_path, monkeypatch
):
    """`cnnpar prepare --workers 0` started one decoding process per core, where `cnnpar train --workers 0` starts
    none: 0 is no pool in both now, and auto (the default) the one per usable core."""
    from cnnpar.data import store_write
    from tests.datafiles import write_image_folder

    write_image_folder(tmp_path / "photos", per_class=3, side=16)
    monkeypatch.setattr(store_write, "usable_cores", lambda: 2)
    started = []
    real_pool = store_write.ProcessPoolExecutor

    def pool(n, **kw):
        started.append(n)
        return real_pool(n, **kw)

    monkeypatch.setattr(store_write, "ProcessPoolExecutor", pool)
    out = tmp_path / "p.cnnpar"
    words = ["prepare", str(tmp_path / "photos"), "--out", str(out), "--no-progress"]
    assert cli.main(words + (["--workers", typed] if typed else [])) == 0
    assert started == pools and out.is_file()
