"""An output path the system cannot name (a name over 255 bytes, or a path over PATH_MAX) is refused in one line
before any work: bench, doctor, tune, profile and prepare ended in an OSError traceback ("File name too long") at
their first look at it. train's --out-dir had its own check (rundir.refuse_too_long_path)."""

from __future__ import annotations

import pytest

from cnnpar.cli import main
from tests.unit.test_out_folders import TINY, _nothing_trained_or_benched

LONG = "x" * 300  # one name over NAME_MAX (255 bytes)
DEEP = "/".join(["d" * 200] * 21)  # 21 names of 200 bytes: a path over PATH_MAX (4,096 bytes)
NAME_SAID = "a name in it is 300 bytes long: expected names of at most 255 bytes (the system's limit)"


@pytest.mark.parametrize(
    "words, flag",
    [
        (["doctor", "--report-dir", LONG], "doctor --report-dir"),
        (["doctor", "--out-dir", LONG], "--out-dir"),
        (["bench", "--out", LONG, "--only", "baseline", *TINY], "bench --out"),
        (["bench", "--out-dir", LONG, "--only", "baseline", *TINY], "--out-dir"),
        (["tune", "--out-dir", LONG], "--out-dir"),
        (["profile", "--report-dir", LONG], "profile --report-dir"),
        (["profile", "--out-dir", LONG], "--out-dir"),
    ],
    ids=["doctor-report-dir", "doctor-out-dir", "bench-out", "bench-out-dir", "tune-out-dir", "profile-report-dir",
         "profile-out-dir"],
)  # fmt: skip
def test_an_output_folder_name_over_the_limit_is_one_line_before_any_work(tmp_path, monkeypatch, capsys, words, flag):
    monkeypatch.chdir(tmp_path)
    _nothing_trained_or_benched(monkeypatch)
    assert main([*words, "--device", "cpu", "--data", "synthetic", "--image-shape", "1x8x8"]) == 2
    assert capsys.readouterr().err == f"cnnpar: error: {flag} {LONG}: {NAME_SAID}\n"
    assert not list(tmp_path.iterdir())  # nothing made


def test_an_output_folder_path_over_the_limit_is_one_line_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _nothing_trained_or_benched(monkeypatch)
    assert main(["bench", "--out-dir", DEEP, "--only", "baseline", *TINY, "--data", "synthetic"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(f"cnnpar: error: --out-dir {DEEP}: the path is ") and "(the system's path limit is 4096" in err
    )
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("name", [LONG, "m" * 240], ids=["over-the-limit", "over-it-with-the-partial-suffix"])
def test_a_store_name_the_system_cannot_take_is_one_line_before_any_decoding(tmp_path, monkeypatch, capsys, name):
    from tests.datafiles import write_image_folder

    write_image_folder(tmp_path / "photos", per_class=2, classes=2)
    monkeypatch.chdir(tmp_path)
    assert main(["prepare", "photos", "--out", f"{name}.cnnpar", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cnnpar: error: --out {name}.cnnpar: ") and "expected names of at most 255 bytes" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["photos"]


@pytest.mark.parametrize("out", [f"{LONG}/tuned.toml", f"{'t' * 250}.toml"], ids=["folder-name", "with-temp-name"])
def test_a_tune_out_file_the_system_cannot_name_is_one_line_before_the_start_trial(tmp_path, monkeypatch, capsys, out):
    """A 250-byte name fits, but not the temporary name it is written under first (15 bytes more)."""
    monkeypatch.chdir(tmp_path)
    _nothing_trained_or_benched(monkeypatch)
    assert main(["tune", "--out", out, "--device", "cpu", "--data", "synthetic", "--image-shape", "1x8x8"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cnnpar: error: tune --out {out}: too long with the temporary name it is written under")
    assert "expected names of at most 255 bytes" in err and "\n" not in err.strip()
    assert not list(tmp_path.iterdir())
