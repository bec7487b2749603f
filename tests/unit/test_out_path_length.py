"""An output path the system cannot name (a name over NAME_MAX, or a path over PATH_MAX: the limits of the file
system it is on, Linux's 255 and 4096 where the system cannot say) is refused in one line before any work: bench,
doctor, tune, profile, prepare, compare and predict ended in an OSError traceback ("File name too long") at their
first look at it. train's --out-dir check is the same rule (config.path_length_problem)."""

from __future__ import annotations

import pytest

from cnnpar.cli import main
from tests.unit.test_out_folders import TINY, _nothing_trained_or_benched

pytestmark = pytest.mark.usefixtures("one_thread")  # one intra-op thread for the in-process runs (conftest)

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


def _system_limits(monkeypatch, **limits: int) -> None:
    """A file system with other limits than Linux's 255 and 4096 (a FAT or network mount, macOS's 1024)."""
    import os

    real = os.pathconf
    monkeypatch.setattr(os, "pathconf", lambda path, key: limits.get(key) or real(path, key))


def test_train_out_dir_is_held_to_the_limit_of_the_system_it_is_on(tmp_path, monkeypatch, capsys):
    """A 150-byte folder name on a file system taking names of 100 bytes at most: the hard-coded 255 let train
    start, to end in an OSError traceback at the run folder's mkdir."""
    _system_limits(monkeypatch, PC_NAME_MAX=100)
    monkeypatch.chdir(tmp_path)
    _nothing_trained_or_benched(monkeypatch)
    words = ["--device", "cpu", "--data", "synthetic", "--image-shape", "1x8x8", "--workers", "0", "--no-progress"]
    assert main(["train", "--out-dir", "n" * 150, "--name", "r", *words]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cnnpar: error: run.out_dir (--out-dir) = '") and err.count("\n") == 1
    assert "a name in it is 150 bytes long: expected names of at most 100 bytes (the system's limit)" in err
    assert not list(tmp_path.iterdir())


def test_train_name_is_held_to_the_limit_of_the_file_system_under_out_dir(tmp_path, monkeypatch, capsys):
    """A 120-byte --name on a file system taking names of 100 bytes at most (eCryptfs takes 143): the line named
    --out-dir, which was short, for the name the user gave."""
    _system_limits(monkeypatch, PC_NAME_MAX=100)
    monkeypatch.chdir(tmp_path)
    _nothing_trained_or_benched(monkeypatch)
    words = ["--device", "cpu", "--data", "synthetic", "--image-shape", "1x8x8", "--workers", "0", "--no-progress"]
    assert main(["train", "--name", "n" * 120, *words]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"cnnpar: error: run.name (--name) = '{'n' * 40}...{'n' * 40}': 120 bytes long: expected a folder "
        "name of at most 100 bytes (the limit of the file system under runs)\n"
    )
    assert not list(tmp_path.iterdir())


def test_bench_out_dir_is_held_to_the_path_limit_of_the_system_it_is_on(tmp_path, monkeypatch, capsys):
    """A path of over 1,024 bytes on a system whose paths end there (macOS): the hard-coded 4,096 let it through."""
    _system_limits(monkeypatch, PC_PATH_MAX=1024)
    monkeypatch.chdir(tmp_path)
    _nothing_trained_or_benched(monkeypatch)
    deep = "/".join(["d" * 200] * 6)
    assert main(["bench", "--out-dir", deep, "--only", "baseline", *TINY, "--data", "synthetic"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cnnpar: error: --out-dir {deep}: the path is ") and err.count("\n") == 1
    assert "(the system's path limit is 1024, with room left for the files made in it)" in err
    assert not list(tmp_path.iterdir())


def test_without_pathconf_the_limits_are_linux_s(tmp_path, monkeypatch, capsys):
    """Windows has no os.pathconf: 255 and 4,096 stand in for the system's word."""
    import os

    monkeypatch.delattr(os, "pathconf")
    monkeypatch.chdir(tmp_path)
    _nothing_trained_or_benched(monkeypatch)
    assert main(["tune", "--out-dir", LONG, "--device", "cpu", "--data", "synthetic", "--image-shape", "1x8x8"]) == 2
    assert capsys.readouterr().err == f"cnnpar: error: --out-dir {LONG}: {NAME_SAID}\n"


@pytest.mark.parametrize("out", [LONG, DEEP], ids=["name", "path"])
def test_a_compare_out_the_system_cannot_take_is_one_line_before_any_framework_runs(tmp_path, monkeypatch, capsys, out):
    """compare --out ended in an OSError traceback ("File name too long") at its mkdir."""
    import cnnpar.frameworks.compare as compare

    monkeypatch.setattr(compare, "run_framework", lambda *a, **k: pytest.fail("a framework ran before refusing"))
    monkeypatch.chdir(tmp_path)
    words = ["--frameworks", "torch", "--data", "synthetic", "--image-shape", "1x8x8", "--batch-size", "16"]
    assert main(["compare", *words, "--out", out]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cnnpar: error: compare --out {out}: ") and err.count("\n") == 1
    assert ("expected names of at most 255 bytes" if out == LONG else "the system's path limit is 4096") in err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("out", [f"{LONG}.csv", f"{LONG}/", f"{DEEP}/p.csv"], ids=["name", "folder", "path"])
def test_a_predict_out_the_system_cannot_take_is_one_line_before_the_checkpoint_is_read(tmp_path, monkeypatch, out):
    """predict --out ended in an OSError traceback ("File name too long") at its first look at the path."""
    from cnnpar.engine.predict import out_target
    from cnnpar.errors import UserError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"^--out .*: too long with the temporary name .*(255 bytes|limit is 4096)"):
        out_target(out, "csv", "test.csv", tmp_path / "last.pt")
    assert not list(tmp_path.iterdir())
