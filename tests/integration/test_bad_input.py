"""Bad input stops with one line naming the file and the row or key, exit code 2, and nothing left behind.

The whole matrix runs through `cnnpar.cli.main` in this process (the same code the console script
runs, minus a 3 s interpreter start per case), as do the corrupt images that only a DataLoader worker
(forked from this process) discovers. Real subprocesses: one representative refusal (the exit code and
stderr a shell user sees), a decoder that crashes or is killed (a signal ends a process: the test's own
must not be it), and a damaged PNG decoded with no worker between it and the command's process.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest

from cnnpar.cli import main
from tests.conftest import main_in, run_cli, run_cmd
from tests.datafiles import bar_images, damaged_png, short_png, write_image_folder, write_pixel_csv

pytestmark = pytest.mark.usefixtures("one_thread")


def _csv_lines(tmp_path: Path) -> list[str]:
    x, y = bar_images(20)
    return write_pixel_csv(tmp_path / "good.csv", x, y).read_text().splitlines()


def _write_csv(tmp_path: Path, name: str, edit) -> Path:
    lines = _csv_lines(tmp_path)
    edit(lines)
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def _replace_first_bright(line: str, value: str) -> str:
    return line.replace(",230,", f",{value},", 1)


def _set(lines: list[str], i: int, text: str) -> None:
    lines[i] = text


# Line numbers in messages count the header as line 1, as an editor does: lines[5] is line 6, data row 5.
CSV_CASES = {
    "non_numeric_pixel": (
        lambda ls: _set(ls, 5, _replace_first_bright(ls[5], "abc")),
        ["line 6 (data row 5)", "column 'pixel32'", "'abc' is not an integer", "expected a pixel value 0..255"],
    ),
    "pixel_out_of_range": (
        lambda ls: _set(ls, 4, _replace_first_bright(ls[4], "300")),
        ["line 5 (data row 4)", "300: expected a pixel value 0..255"],
    ),
    "negative_pixel": (lambda ls: _set(ls, 4, _replace_first_bright(ls[4], "-3")), ["line 5 (data row 4)", "-3"]),
    "empty_cell": (
        lambda ls: _set(ls, 3, _replace_first_bright(ls[3], "")),
        ["line 4 (data row 3)", "empty or missing value (blank, NA, nan, null, ...): expected a number"],
    ),
    "extra_column": (lambda ls: _set(ls, 7, ls[7] + ",5"), ["line 8 (data row 7)", "258 values: expected 257"]),
    "missing_column": (
        lambda ls: _set(ls, 7, ls[7].rsplit(",", 1)[0]),
        ["line 8 (data row 7)", "256 values: expected 257"],
    ),
    "missing_label_column": (
        lambda ls: _set(ls, 0, ls[0].replace("label", "digit")),
        ["no 'label' column", "expected label,pixel0,pixel1"],
    ),
    "label_out_of_range": (
        lambda ls: _set(ls, 9, "12" + ls[9][1:]),
        ["line 10 (data row 9)", "label 12: expected a label in 0..9 (--num-classes 10)"],
    ),
    "non_numeric_label": (
        lambda ls: _set(ls, 2, "x" + ls[2][1:]),
        ["line 3 (data row 2)", "column 'label'", "expected a class label"],
    ),
    # blank lines (skipped, as pyarrow skips them) after the header and after data row 2: the real lines are named
    "blank_lines_then_bad_label": (
        lambda ls: (ls.insert(1, ""), ls.insert(4, ""), _set(ls, 11, "12" + ls[11][1:])),
        ["line 12 (data row 9)", "label 12: expected a label in 0..9 (--num-classes 10)"],
    ),
    "blank_lines_then_bad_pixel": (
        lambda ls: (ls.insert(1, ""), ls.insert(4, ""), _set(ls, 7, _replace_first_bright(ls[7], "300"))),
        ["line 8 (data row 5)", "300: expected a pixel value 0..255"],
    ),
    "blank_lines_then_empty_cell": (
        lambda ls: (ls.insert(1, ""), ls.insert(4, ""), _set(ls, 5, _replace_first_bright(ls[5], ""))),
        ["line 6 (data row 3)", "empty or missing value (blank, NA, nan, null, ...): expected a number"],
    ),
    "nan_cell": (
        lambda ls: _set(ls, 3, _replace_first_bright(ls[3], "nan")),
        ["line 4 (data row 3)", "empty or missing value (blank, NA, nan, null, ...)"],
    ),
    "plus_signed_pixel": (
        lambda ls: _set(ls, 5, _replace_first_bright(ls[5], "+5")),
        ["line 6 (data row 5)", "'+5' is not an integer: expected a pixel value 0..255"],
    ),
    "full_width_digit_label": (
        lambda ls: _set(ls, 2, "\uff15" + ls[2][1:]),
        ["line 3 (data row 2)", "column 'label'", "is not an integer: expected a class label"],
    ),
    "label_beyond_int64": (
        lambda ls: _set(ls, 2, "99999999999999999999" + ls[2][1:]),
        ["line 3 (data row 2)", "column 'label'", "99999999999999999999: expected a class label"],
    ),
    "repeated_column": (
        lambda ls: _set(ls, 0, ls[0].replace("pixel1,", "pixel0,", 1)),
        ["column name 'pixel0' is repeated in the header (columns 2, 3): expected each column name once"],
    ),
    # pandas' to_csv with its index: an unnamed first column of row numbers, once counted as a pixel (257: no square)
    "pandas_index_column": (
        lambda ls: ls.__setitem__(slice(None), [f"{i - 1 if i else ''},{line}" for i, line in enumerate(ls)]),
        ["column '' (number 1 in the header) is not a pixel column", "expected a label column, an optional id or"],
    ),
    "empty_file": (lambda ls: ls.clear(), ["the file is empty"]),
    # a blank line before the header was called "the file is empty"
    "blank_first_line": (lambda ls: ls.insert(0, ""), ["line 1 is blank: expected the header line of column names"]),
    # `Label` beside `label` was read as a pixel column (the refusal of two ran only without an exact `label`)
    "label_in_two_cases": (
        lambda ls: ls.__setitem__(slice(None), [ls[0] + ",Label"] + [line + ",0" for line in ls[1:]]),
        ["2 label columns ('label', 'Label'): expected one label column"],
    ),
    "header_only": (
        lambda ls: ls.__delitem__(slice(1, None)),
        ["has a header but no data rows: expected one row of values per image below it"],
    ),
}


def _npz(tmp_path: Path, name: str, **arrays) -> Path:
    np.savez(tmp_path / name, **arrays)
    return tmp_path / name


def _npz_cases(tmp_path: Path) -> dict[str, tuple[Path, list[str]]]:
    x, y = bar_images(20)
    not_zip = tmp_path / "not_zip.npz"
    not_zip.write_text("hello")
    return {
        "wrong_keys": (
            _npz(tmp_path, "keys.npz", images=x, labels=y),
            ["missing key(s) x_train, y_train", "found images, labels", "expected x_train, y_train"],
        ),
        "flat_images": (
            _npz(tmp_path, "flat.npz", x_train=x.reshape(20, -1), y_train=y),
            ["[x_train]", "shape (20, 256)", "expected (N,H,W)"],
        ),
        "label_count": (
            _npz(tmp_path, "count.npz", x_train=x, y_train=y[:5]),
            ["[y_train]", "shape (5,): expected (20,)"],
        ),
        "label_out_of_range": (
            _npz(tmp_path, "range.npz", x_train=x, y_train=np.where(np.arange(20) == 6, 10, y)),
            ["[y_train], index 6", "label 10: expected a label in 0..9 (--num-classes 10)"],
        ),
        "test_shape": (
            _npz(tmp_path, "tshape.npz", x_train=x, y_train=y, x_test=x[:, :8, :8], y_test=y),
            ["[x_test]", "image shape (1, 8, 8): expected (1, 16, 16)"],
        ),
        "x_test_without_y_test": (
            _npz(tmp_path, "half.npz", x_train=x, y_train=y, x_test=x),
            ["only one of x_test / y_test"],
        ),
        "no_images": (
            _npz(tmp_path, "empty.npz", x_train=x[:0], y_train=y[:0]),
            ["[x_train]: holds no images (its first axis, N, is 0): expected at least one image"],
        ),
        "not_a_zip": (not_zip, ["not an .npz archive"]),
    }


def _train_in_process(tmp_path: Path, capsys, monkeypatch, data: Path) -> tuple[int, str]:
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    # --num-classes states the class range (without it the count is inferred from the labels)
    rc = main(["train", "--data", str(data), "--epochs", "1", "--no-progress", "--num-classes", "10"])
    return rc, capsys.readouterr().err


def _assert_refused(rc: int, err: str, data: Path, fragments: list[str], cwd: Path) -> None:
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cnnpar: error: "), err
    assert "Traceback" not in err
    assert data.name in err, err
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} not in {err!r}"
    assert not (cwd / "runs").exists(), "a run folder was left behind"


@pytest.mark.parametrize("case", sorted(CSV_CASES))
def test_bad_csv_is_refused(tmp_path, capsys, monkeypatch, case):
    edit, fragments = CSV_CASES[case]
    data = _write_csv(tmp_path, f"{case}.csv", edit)
    rc, err = _train_in_process(tmp_path, capsys, monkeypatch, data)
    _assert_refused(rc, err, data, fragments, tmp_path)


NPZ_CASES = ["wrong_keys", "flat_images", "label_count", "label_out_of_range", "test_shape", "x_test_without_y_test"]


@pytest.mark.parametrize("case", [*NPZ_CASES, "no_images", "not_a_zip"])
def test_bad_npz_is_refused(tmp_path, capsys, monkeypatch, case):
    data, fragments = _npz_cases(tmp_path)[case]
    rc, err = _train_in_process(tmp_path, capsys, monkeypatch, data)
    _assert_refused(rc, err, data, fragments, tmp_path)


def test_folder_without_images_is_refused(tmp_path, capsys, monkeypatch):
    (tmp_path / "photos" / "cats").mkdir(parents=True)
    (tmp_path / "photos" / "cats" / "notes.txt").write_text("no images here")
    rc, err = _train_in_process(tmp_path, capsys, monkeypatch, tmp_path / "photos")
    _assert_refused(rc, err, tmp_path / "photos", ["no .jpg, .jpeg or .png files"], tmp_path)


def test_bad_config_value_names_the_field(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--epochs", "0"]) == 2
    err = capsys.readouterr().err
    assert "run.epochs (--epochs) = 0: expected a number > 0" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_non_finite_config_values_are_refused_from_flags_and_toml(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--lr", "inf"]) == 2
    assert capsys.readouterr().err == "cnnpar: error: optim.lr (--lr) = inf: expected a finite number, not nan or inf\n"
    (tmp_path / "c.toml").write_text("[optim]\nmomentum = nan\n")  # TOML has nan and inf literals
    assert main(["train", "--config", "c.toml"]) == 2
    assert (
        capsys.readouterr().err
        == "cnnpar: error: c.toml: optim.momentum (--momentum) = nan: expected a finite number, not nan or inf\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml"]  # no run folder


def _wide_semicolon_csv(path: Path) -> None:
    # Excel in a comma-decimal locale: one header field of 190,000 characters, past the csv module's limit
    names = ["label"] + [f"pixel{i}" for i in range(30_000)]
    path.write_text(";".join(names) + "\n" + ";".join(["0"] * len(names)) + "\n")


def _npz_named_csv(path: Path) -> None:
    with path.open("wb") as f:
        np.savez(f, x_train=np.zeros((2, 8, 8), np.uint8), y_train=np.arange(2))


BINARY_AS_CSV = {  # each printed its bytes as column names, or stopped in a _csv.Error traceback
    "npz_renamed": (_npz_named_csv, "a zip archive (an .npz, or a zipped CSV), not CSV text"),
    "utf16": (lambda p: p.write_bytes("label,pixel0\n1,2\n".encode("utf-16")), "UTF-16 text"),
    "store_renamed": (lambda p: p.write_bytes(b"CNNPSTOR" + bytes(64)), "a .cnnpar store, not CSV text"),
    "wide_semicolon": (_wide_semicolon_csv, "looks semicolon-separated"),
}


@pytest.mark.parametrize("case", sorted(BINARY_AS_CSV))
def test_a_file_that_is_not_comma_separated_text_is_refused_in_one_line(tmp_path, capsys, monkeypatch, case):
    write, fragment = BINARY_AS_CSV[case]
    data = tmp_path / f"{case}.csv"
    write(data)
    rc, err = _train_in_process(tmp_path, capsys, monkeypatch, data)
    _assert_refused(rc, err, data, [fragment], tmp_path)


@pytest.mark.parametrize(
    "case,fragment",
    [
        ("latin1", "not UTF-8 text (byte 0xe9 at offset 22): expected a TOML config file"),
        ("folder", "a folder: expected a TOML config file"),
    ],
)
def test_a_config_file_that_cannot_be_read_is_refused_in_one_line(tmp_path, capsys, monkeypatch, case, fragment):
    """Each stopped in a traceback (UnicodeDecodeError, IsADirectoryError). (num_classes = 2**63 - 1, which the
    OOM killer stopped with no message, is test_config's: here a regression would take the host's memory.)"""
    config = tmp_path / f"{case}.toml"
    if case == "folder":
        config.mkdir()
    else:
        config.write_bytes(b"[run]\nepochs = 1\n# caf\xe9\n")
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["train", "--config", str(config), "--epochs", "1", "--no-progress"]) == 2
    _assert_refused(2, capsys.readouterr().err, config, [f"{config}: {fragment}"], tmp_path)


# ---- the exit code and stderr a shell user sees -------------------------------------------------


# a real subprocess, the representative of the matrix above: `python -m cnnpar`'s exit status is the code main returns
def test_cli_refuses_bad_csv_row(cli):
    data = _write_csv(cli.cwd, "train.csv", CSV_CASES["non_numeric_pixel"][0])
    p = cli("train", "--data", "train.csv", "--no-progress")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith(f"cnnpar: error: {data.name}, line 6 (data row 5)")
    assert not (cli.cwd / "runs").exists()


def test_wrong_npz_key_is_refused_naming_the_keys_found(tmp_path, monkeypatch, capsys):
    x, y = bar_images(8)
    np.savez(tmp_path / "d.npz", X=x, y_train=y)
    done = main_in(tmp_path, monkeypatch, capsys, ["train", "--data", "d.npz", "--no-progress"])
    rc, err = done.returncode, done.stderr
    assert rc == 2 and "Traceback" not in err
    assert "d.npz: missing key(s) x_train (found X, y_train)" in err
    assert not (tmp_path / "runs").exists()


def test_corrupt_image_found_by_a_worker_is_refused(tmp_path, monkeypatch, capfd):
    """Decoding happens in DataLoader workers after the run folder exists; it must still vanish. (The worker is
    forked from this process: a decode error, not a crash, so nothing here ends the test's own process.)"""
    root = write_image_folder(tmp_path / "photos", per_class=6, classes=2, side=16)
    jpg = sorted((root / "class0").glob("*.jpg"))[0]
    jpg.write_bytes(b"this is not a jpeg")
    png = sorted((root / "class1").glob("*.png"))[0]
    png.write_bytes(png.read_bytes()[:60])  # truncated: the header survives, the pixels do not
    args = ["train", "--data", "photos", "--image-size", "16", "--epochs", "1", "--workers", "1", "--no-progress"]
    done = main_in(tmp_path, monkeypatch, capfd, args)  # the worker's stderr too
    rc, err = done.returncode, done.stderr
    assert rc == 2, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("cnnpar: error: photos/class") and "cannot decode as an image" in last, last
    assert f"{jpg.parent.name}/{jpg.name}" in last or f"{png.parent.name}/{png.name}" in last, last
    assert not (tmp_path / "runs").exists()


def dies_decoding(name: str, sig: str) -> str:
    """A script that runs `cnnpar ARGS` with the process that decodes the file `name` killed by `sig`, whichever
    reader decodes it (the textbook loader's per-image path, or the CPU workers' batches)."""
    return f"""
import os, signal, sys
from cnnpar import cli
from cnnpar.data import cpu_decode, folder
decode_rgb = folder.decode_rgb
def dies(data, path):
    if os.path.basename(str(path)) == {name!r}:
        os.kill(os.getpid(), signal.{sig})
    return decode_rgb(data, path)
cpu_decode.decode_rgb = folder.decode_rgb = dies
sys.exit(cli.main(sys.argv[1:]))
"""


# Decoding `short.png` kills the DataLoader worker with SIGSEGV, as torchvision 0.29's PNG decoder did on a PNG whose
# data stops short by less than png_header's bound sees (Pillow decodes PNGs now: sent here, as any decoder's crash)
CRASHES_ON_SHORT_PNG = dies_decoding("short.png", "SIGSEGV")


def test_a_worker_that_crashes_decoding_ends_the_run_in_one_line_whose_advice_names_the_file(
    tmp_path, monkeypatch, capsys
):
    """torch's "RuntimeError: DataLoader worker (pid N) is killed by signal: Segmentation fault" traceback named no
    file (exit 1, the run folder left); the line names the signal and a command that finds the file."""
    root = write_image_folder(tmp_path / "photos", per_class=6, classes=2, side=16)
    short = root / "class1" / "short.png"
    short.write_bytes(short_png(100, 100, 20_000))  # past the bound: only the crash tells it
    args = ["train", "--data", "photos", "--image-size", "16", "--epochs", "1", "--workers", "1", "--no-progress"]
    p = run_cmd([sys.executable, "-c", CRASHES_ON_SHORT_PNG, *args], tmp_path)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    last = p.stderr.strip().splitlines()[-1].lstrip("\0")  # torch's worker writes a NUL after its own line
    assert last.startswith(
        "cnnpar: error: a data loader worker crashed (SIGSEGV: Segmentation fault) while reading photos: a damaged "
        "image file can crash torchvision's decoders"
    ), last
    assert not (tmp_path / "runs").exists()  # no epoch was saved: nothing left behind
    prepare = re.search(r"to find it: (cnnpar prepare .*?) decodes every photo", last).group(1)
    # the advice, as a user pastes it, run by `main` here: prepare decodes the file and refuses it, crashing nothing
    words = shlex.split(prepare)
    assert words[0] == "cnnpar", prepare
    done = main_in(tmp_path, monkeypatch, capsys, words[1:])
    rc, err = done.returncode, done.stderr
    assert rc == 2 and err.strip().startswith(
        "cnnpar: error: photos/class1/short.png: cannot decode as an image (image file is truncated"
    ), err
    assert [f.name for f in tmp_path.iterdir()] == ["photos"]  # no store, nor a part of one


def test_a_worker_crash_reading_a_labelled_flat_folder_advises_a_prepare_with_its_labels(tmp_path, monkeypatch, capsys):
    """A flat folder labelled by --labels: the advice's prepare without --labels stopped at "no class folders",
    never reaching the damaged file."""
    from PIL import Image

    flat = tmp_path / "flat"
    flat.mkdir()
    x, _ = bar_images(12, classes=2, side=16, channels=3)
    for i, img in enumerate(x):
        Image.fromarray(img).save(flat / f"p{i}.png")
    (flat / "short.png").write_bytes(short_png(100, 100, 20_000))
    labels = tmp_path / "labels.csv"
    labels.write_text("id,label\n" + "".join(f"p{i},{'ab'[i % 2]}\n" for i in range(12)) + "short,a\n")
    args = ["train", "--data", "flat", "--labels", "labels.csv", "--image-size", "16", "--epochs", "1"]
    p = run_cmd([sys.executable, "-c", CRASHES_ON_SHORT_PNG, *args, "--workers", "1", "--no-progress"], tmp_path)
    assert p.returncode == 2, p.stderr
    last = p.stderr.strip().splitlines()[-1].lstrip("\0")
    prepare = re.search(r"to find it: (cnnpar prepare .*?) decodes every photo", last).group(1)
    assert prepare == "cnnpar prepare flat --labels labels.csv --out flat.cnnpar --short-side 24", last
    words = shlex.split(prepare)  # the advice, as a user pastes it, run by `main` here (it crashes nothing)
    done = main_in(tmp_path, monkeypatch, capsys, words[1:])
    rc, err = done.returncode, done.stderr
    assert rc == 2 and err.strip().startswith("cnnpar: error: flat/short.png: cannot decode as an image"), err


@pytest.fixture(scope="module")
def damaged_png_photos(tmp_path_factory, one_thread):
    """photos/ (2 classes, 16x16) with class1/bad.png, whose zlib stream alone is damaged (datafiles.damaged_png), and
    the run folder of a cnn3 trained on the photos before the damage, for predict."""
    import torch

    from cnnpar.config import Config, DataConfig, RunConfig, SpeedConfig
    from cnnpar.dist import DistInfo
    from cnnpar.engine.trainer import Trainer

    cwd = tmp_path_factory.mktemp("damaged_png")
    root = write_image_folder(cwd / "photos", per_class=6, classes=2, side=16)
    cfg = Config(
        data=DataConfig(source=str(root), image_size=16, workers=0),
        speed=SpeedConfig(device="cpu"),
        run=RunConfig(epochs=1, batch_size=4, out_dir=str(cwd / "trained"), name="clean", progress=False),
    )
    run_dir = Trainer(cfg, DistInfo(0, 0, 1, torch.device("cpu")), log=lambda *a, **k: None).fit().run_dir
    (root / "class1" / "bad.png").write_bytes(damaged_png())
    return cwd, run_dir


DAMAGED_PNG_LINE = (
    "photos/class1/bad.png: cannot decode as an image (broken data stream when reading image file): expected a "
    "readable JPEG or PNG file"
)
ON_THE_FOLDER = ["--data", "photos", "--image-size", "16", "--device", "cpu"]
# every command that decodes a folder, with and without workers: torchvision's PNG decoder killed the process (exit
# -11) wherever no worker stood between, and left a worker's crash unnamed in doctor (a traceback) where one did
DAMAGED_PNG_COMMANDS = {
    "train_workers_0": ["train", *ON_THE_FOLDER, "--epochs", "1", "--workers", "0", "--no-progress"],
    "train_workers_1": ["train", *ON_THE_FOLDER, "--epochs", "1", "--workers", "1", "--no-progress"],
    "predict": ["predict", "--checkpoint", "RUN", "--data", "photos", "--device", "cpu"],
    "doctor_workers_1": ["doctor", *ON_THE_FOLDER, "--workers", "1", "--warmup-steps", "1", "--measure-steps", "2"],
    "bench_workers_0": [
        "bench",
        *ON_THE_FOLDER,
        "--workers",
        "0",
        "--only",
        "baseline",
        "--warmup-steps",
        "1",
        "--timed-steps",
        "2",
        "--repeats",
        "1",
        "--out",
        "bench_out",
    ],
}


# Where a worker decodes, a decoder's crash kills that worker alone (a fork of this process): those commands run here,
# by `main`. Where none stands between (workers 0, predict), such a crash kills the command's own process, as
# torchvision's did (-11): those stay subprocesses, so that a crash fails the test and not the test run.
DECODED_IN_A_WORKER = {"train_workers_1", "doctor_workers_1"}


@pytest.mark.parametrize("command", DAMAGED_PNG_COMMANDS)
def test_a_png_with_a_damaged_zlib_stream_ends_every_command_in_one_line_naming_it(
    damaged_png_photos, monkeypatch, capfd, command
):
    cwd, run_dir = damaged_png_photos
    args = [str(run_dir) if a == "RUN" else a for a in DAMAGED_PNG_COMMANDS[command]]
    if command in DECODED_IN_A_WORKER:
        done = main_in(cwd, monkeypatch, capfd, args)  # capfd: the worker's stderr too
        rc, stderr = done.returncode, done.stderr
    else:
        p = run_cli(args, cwd)
        rc, stderr = p.returncode, p.stderr
    last = stderr.strip().splitlines()[-1]
    assert "Traceback" not in stderr, stderr
    if command.startswith("bench"):  # a rung that fails is a row of its own: the bench ends 1, naming the first
        assert rc == 1, stderr
        assert last.startswith(
            f"bench: every rung run failed (1 of 1, the rest skipped); first, baseline: DataError: "
            f"{DAMAGED_PNG_LINE}; rows in bench_out/ladder.csv"
        ), last
        return
    assert (rc, last) == (2, f"cnnpar: error: {DAMAGED_PNG_LINE}"), stderr
    assert not (cwd / "runs").exists() and not (cwd / "predictions.csv").exists()


# The worker that decodes `killed.png` is killed by SIGKILL, as the kernel's out-of-memory killer ends one
KILLED_ON_A_PHOTO = dies_decoding("killed.png", "SIGKILL")
OOM_LINE = (
    "a data loader worker crashed (SIGKILL: Killed) while reading photos: SIGKILL is most often the kernel's "
    "out-of-memory killer (dmesg names it): fewer --workers or a smaller --batch-size need less memory"
)
KILLED_WORKER_COMMANDS = {
    "doctor": ["doctor", *ON_THE_FOLDER, "--workers", "1", "--warmup-steps", "1", "--measure-steps", "2"],
    # the workers rung: the baseline reads without workers, where the kill would end the bench itself
    "bench": ["bench", *ON_THE_FOLDER, *"--workers 1 --only workers --warmup-steps 1 --timed-steps 2".split()]
    + ["--repeats", "1", "--out", "bench_out"],
}


@pytest.mark.parametrize("command", KILLED_WORKER_COMMANDS)
def test_a_worker_killed_in_doctor_or_bench_is_trains_one_line(tmp_path, command):
    """train said a killed worker in one line (data/worker_crash.py); doctor ended in torch's traceback ("DataLoader
    worker (pid(s) N) exited unexpectedly", exit 1) and bench's row failed with that line, naming neither the
    signal nor what to do."""
    root = write_image_folder(tmp_path / "photos", per_class=6, classes=2, side=16)
    (root / "class1" / "killed.png").write_bytes(next((root / "class1").glob("*.png")).read_bytes())
    p = run_cmd([sys.executable, "-c", KILLED_ON_A_PHOTO, *KILLED_WORKER_COMMANDS[command]], tmp_path)
    assert "Traceback" not in p.stderr, p.stderr
    last = p.stderr.strip().splitlines()[-1].lstrip("\0")
    if command == "bench":  # the rung's row fails with the line, and the summary names it, as for a bad file
        assert p.returncode == 1, p.stderr
        assert f"bench: rung 1 workers: failed (DataError: {OOM_LINE})" in p.stdout
        assert last == (
            f"bench: every rung run failed (1 of 1, the rest skipped); first, workers: DataError: {OOM_LINE}; rows in "
            "bench_out/ladder.csv"
        )
        return
    assert (p.returncode, last) == (2, f"cnnpar: error: {OOM_LINE}"), p.stderr
    assert [f.name for f in tmp_path.iterdir()] == ["photos"]  # nothing measured: no report folder
