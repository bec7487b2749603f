"""What cnnpar prints and writes whatever the locale and console encoding: a class or folder named café or 日本, or
one whose name is not UTF-8 (a Latin-1 caf\\xe9, which Python reads as a lone surrogate)."""

from __future__ import annotations

import io
import os
import sys

import pytest
import torch

from cnnpar.config import Config, DataConfig, RunConfig
from cnnpar.console import printable_stdio
from cnnpar.dist import DistInfo
from cnnpar.engine.rundir import resolve_run
from cnnpar.errors import UserError
from tests.conftest import run_cli, run_cmd

# Python's stdio and open() follow a locale that is not UTF-8 only with its UTF-8 mode and locale coercion off
ASCII_LOCALE = {"LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}

# ASCII itself: the command line is decoded by the locale too
WRITES = """
import sys
from cnnpar.report.files import read_csv, write_csv_atomic, write_text_atomic
folder = sys.argv[1]
rows = [{"class_name": "caf\\u00e9"}, {"class_name": "\\u65e5\\u672c"}, {"class_name": "caf\\udce9"}]
write_csv_atomic(folder + "/p.csv", rows)
write_text_atomic(folder + "/t.txt", "classes: caf\\u00e9 \\u65e5\\u672c\\n")
assert read_csv(folder + "/p.csv") == rows
"""


def test_files_are_written_and_read_as_utf8_under_an_ascii_locale(tmp_path):
    """open() took the locale's encoding: under LC_ALL=C (ASCII) predict's CSV stopped on a class café."""
    p = run_cmd([sys.executable, "-c", WRITES, str(tmp_path)], tmp_path, **ASCII_LOCALE)
    assert p.returncode == 0, p.stderr
    # the name that is not UTF-8 keeps its byte on disk, as its folder has it
    assert (tmp_path / "p.csv").read_bytes() == "class_name\r\ncafé\r\n日本\r\n".encode() + b"caf\xe9\r\n"
    assert (tmp_path / "t.txt").read_bytes() == "classes: café 日本\n".encode()


def test_printable_stdio_escapes_what_the_console_cannot_encode_and_gives_its_handler_back(monkeypatch):
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="ascii", errors="strict", write_through=True)
    monkeypatch.setattr(sys, "stdout", out)
    with printable_stdio():
        print("café 日本 caf\udce9")
    assert raw.getvalue() == b"caf\\xe9 \\u65e5\\u672c caf\xe9\n"  # a name's own byte comes out as it is on disk
    assert out.errors == "strict"


def test_a_run_named_cafe_trains_on_an_ascii_console(tmp_path):
    """The run folder's line stopped the run with a UnicodeEncodeError traceback after its folder was made."""
    # a subprocess: the console's encoding (PYTHONIOENCODING) is fixed when the interpreter starts; --max-steps 2:
    # the run folder's line comes at the end of any run, however short
    p = run_cli(
        ["train", "--epochs", "1", "--max-steps", "2", "--out-dir", "runs", "--name", "café", "--no-tensorboard"],
        tmp_path,
        PYTHONIOENCODING="ascii",
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert "run folder runs/caf\\xe9" in p.stdout
    assert (tmp_path / "runs" / "café" / "summary.json").is_file()


# donnees with its e-acute as Python reads the two UTF-8 bytes of its name under an ASCII locale: lone surrogates
READ_AS_ASCII = "donn\udcc3\udca9es"


@pytest.mark.skipif(sys.platform != "linux", reason="file names as bytes: Linux takes any")
def test_a_utf8_path_read_under_an_ascii_locale_is_refused_naming_the_locale_not_as_not_utf8(tmp_path):
    """It was refused as "not UTF-8 ... rename it": the name is UTF-8; Python read it as ASCII."""
    (tmp_path / READ_AS_ASCII).mkdir()
    cfg = Config(data=DataConfig(source=str(tmp_path / READ_AS_ASCII)), run=RunConfig(out_dir=str(tmp_path / "runs")))
    with pytest.raises(UserError) as e:
        resolve_run(cfg, DistInfo(0, 0, 1, torch.device("cpu")))
    assert "données': cannot be written into the run's config.toml" in str(e.value)
    assert "Python reads file names as" in str(e.value) and "PYTHONUTF8=1" in str(e.value)
    assert not (tmp_path / "runs").exists()


PREDICT_NOTES = """
import sys
from cnnpar.data.sources import load_predict_data
notes = []
_, ids, _ = load_predict_data(sys.argv[1], notes=notes)
print(ascii(sorted(ids)))
print(ascii(notes))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="file names as bytes: Linux takes any")
def test_predict_says_only_names_that_are_not_utf8_are_escaped(tmp_path):
    """Every name Python read under an ASCII locale was said to be "not UTF-8", their ids escaped: they were not."""
    from PIL import Image

    for name in ("données".encode(), b"caf\xe9"):  # UTF-8; Latin-1, not UTF-8
        (tmp_path / os.fsdecode(name)).mkdir()
        Image.new("RGB", (8, 8)).save(tmp_path / os.fsdecode(name) / "0.png")
    p = run_cmd([sys.executable, "-c", PREDICT_NOTES, str(tmp_path)], tmp_path, **ASCII_LOCALE)
    assert p.returncode == 0, p.stderr
    ids, notes = p.stdout.splitlines()
    assert ids == ascii(["caf\\xe9/0.png", "données/0.png"])
    assert "1 file name(s)" in notes and "(first: caf\\\\xe9/0.png)" in notes, notes


def test_a_tune_trial_prints_a_folder_cafe_on_an_ascii_console(tmp_path, monkeypatch):
    """tune's child (bench.trial) printed without the CLI's printable stdio: its start trial failed on a --data
    données with a UnicodeEncodeError, and tune wrote no tuned.toml."""
    import json

    from cnnpar.bench import trial

    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="ascii", errors="strict", write_through=True))
    monkeypatch.setattr(trial, "_run", lambda spec: (trial.say(f"data {spec['data']}"), {"images_per_s": 1.0})[1])
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"kind": "train", "data": "données"}))
    assert trial.main([str(spec), str(tmp_path / "result.json")]) == 0
    assert json.loads((tmp_path / "result.json").read_text()) == {"status": trial.OK, "images_per_s": 1.0}
    assert raw.getvalue() == b"trial: data donn\\xe9es\n"


def test_a_modules_own_main_and_a_compare_runner_print_a_folder_cafe_on_an_ascii_console(tmp_path, monkeypatch):
    """`python -m cnnpar.bench.ddp_scaling --out runs/café` and compare's runners printed without the CLI's printable
    stdio: their `wrote` line ended in a UnicodeEncodeError traceback (exit 1) after the whole measurement."""
    from cnnpar import errors
    from cnnpar.frameworks.spec import runner_main

    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="ascii", errors="strict", write_through=True))
    assert errors.main_saying_user_errors(lambda: print("wrote runs/café/ddp.csv") or 0, "ddp_scaling") == 0
    monkeypatch.setattr(errors, "stop_on_signals", lambda: None)  # the test process keeps its own handlers
    monkeypatch.setattr(sys, "argv", ["torch_runner", "--framework", "torch", "--out", "runs/café"])
    assert runner_main("torch_runner", lambda fw, spec: print(f"{fw.name}: out {spec.out}")) == 0
    assert raw.getvalue() == b"wrote runs/caf\\xe9/ddp.csv\ntorch: out runs/caf\\xe9\n"
    assert sys.stdout.errors == "strict"


@pytest.mark.skipif(sys.platform != "linux", reason="file names as bytes: Linux takes any")
@pytest.mark.parametrize("mode", ["ladder", "claims", "time_to_accuracy"])
def test_bench_refuses_a_utf8_data_path_read_under_an_ascii_locale_once_before_measuring(tmp_path, mode):
    """Every rung's Trainer refused it: the bench measured the peak, failed each rung on the same line and ended
    with exit 1, where train and doctor refuse it at once (exit 2)."""
    from cnnpar.bench.run import BenchOptions, run_bench

    (tmp_path / READ_AS_ASCII).mkdir()
    cfg = Config(data=DataConfig(source=str(tmp_path / READ_AS_ASCII)), run=RunConfig(out_dir=str(tmp_path / "runs")))
    opts = BenchOptions(mode, out=str(tmp_path / "out"), target=0.5 if mode == "time_to_accuracy" else None)
    with pytest.raises(UserError, match=r"^data.source \(--data\) = '.*données': cannot be written .*PYTHONUTF8=1"):
        run_bench(cfg, opts)
    assert not (tmp_path / "out").exists() and not (tmp_path / "runs").exists()


ASCII_NOTE = (
    "Python reads file names as ascii here, the encoding of a locale that is not UTF-8 (such as LC_ALL=C with "
    "PYTHONUTF8=0, or a Latin-1 one): run with PYTHONUTF8=1 (or a UTF-8 locale, LC_ALL=C.UTF-8)"
)


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        # it ended in a UnicodeEncodeError traceback (os.fsencode), as a resume of a run named café did
        ('[run]\nname = "caf\\u00e9"', "run.name (--name) = 'caf\\xe9'"),
        # "données: no such file or folder": it is there
        ('[data]\nsource = "donn\\u00e9es"', "data.source (--data) = 'donn\\xe9es'"),
    ],
)
def test_a_config_files_non_ascii_path_under_an_ascii_locale_names_the_locale(tmp_path, setting, named):
    """A config file's text is UTF-8 whatever the locale; where Python reads file names as ASCII its café can name no
    file: said in one line naming the file, the setting and PYTHONUTF8=1."""
    (tmp_path / "données").mkdir()
    (tmp_path / "c.toml").write_text(setting + "\n", encoding="utf-8")
    p = run_cli(["train", "--config", "c.toml", "--epochs", "1", "--no-tensorboard"], tmp_path, **ASCII_LOCALE)
    assert p.returncode == 2, p.stderr[-2000:]
    assert p.stderr.splitlines() == [f"cnnpar: error: c.toml: {named}: cannot name a file here: {ASCII_NOTE}"]
    assert not (tmp_path / "runs").exists()


STORED_EPOCH = """
import sys
from cnnpar.engine.checkpoint import stored_epoch
print(stored_epoch(sys.argv[1]))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="file names as bytes: Linux takes any")
def test_a_checkpoint_in_a_utf8_folder_is_read_under_an_ascii_locale(tmp_path):
    """torch's mmap encodes the name as strict UTF-8: under LC_ALL=C (PYTHONUTF8=0) the epoch of runs/café's
    checkpoint read as None, and predict called its intact best.pt "cut short or damaged"."""
    (tmp_path / "café").mkdir()
    torch.save({"epoch": 3, "model": {"w": torch.zeros(2)}}, tmp_path / "café" / "best.pt")
    p = run_cmd([sys.executable, "-c", STORED_EPOCH, str(tmp_path / "café" / "best.pt")], tmp_path, **ASCII_LOCALE)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["3"]
