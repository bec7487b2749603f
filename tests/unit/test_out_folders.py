"""An output folder that is a file, or lies under one, is refused before any measuring: bench, doctor and profile
measured and then ended in a FileExistsError or NotADirectoryError traceback."""

from __future__ import annotations

import pytest

from cnnpar.cli import main

TINY = ["--device", "cpu", "--timed-steps", "2", "--repeats", "1"]


@pytest.mark.parametrize(
    "words, said",
    [
        (["bench", "--out", "afile", "--only", "baseline", *TINY], "bench --out afile: is a file"),
        (["bench", "--out-dir", "afile", "--only", "baseline", *TINY], "--out-dir afile: is a file"),
        (["bench", "--compare", "a.csv", "b.csv", "--out", "afile"], "bench --out afile: is a file"),
        (
            ["doctor", "--device", "cpu", "--report-dir", "afile/sub"],
            "--report-dir afile/sub: lies under afile, a file",
        ),
        (["profile", "--device", "cpu", "--report-dir", "afile"], "--report-dir afile: is a file"),
    ],
    ids=["bench-out", "bench-out-dir", "compare-out", "doctor", "profile"],
)
def test_an_output_folder_that_is_a_file_is_refused_before_measuring(tmp_path, monkeypatch, capsys, words, said):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("not a folder")
    assert main(words) == 2
    out, err = capsys.readouterr()
    assert err.strip().endswith(f"{said}: expected a folder (or a path where one can be made)"), err
    assert "img/s" not in out  # nothing was measured
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


@pytest.mark.parametrize(
    "words, said",
    [
        (["--target", "0.9", "--only", "baseline"], "bench --target: read only with --time-to-accuracy: expected no "
         "--target with a ladder"),
        (["--time-to-accuracy", "--target", "0.9", "--budget-s", "1"], "bench --budget-s: read only with --claims or "
         "a ladder: expected no --budget-s with --time-to-accuracy"),
        (["--compare", "a.csv", "b.csv", "--only", "baseline"], "bench --only: read only with --claims or a ladder: "
         "expected no --only with --compare"),
    ],
    ids=["target", "budget", "only"],
)  # fmt: skip
def test_a_bench_flag_its_mode_does_not_read_is_refused(tmp_path, monkeypatch, capsys, words, said):
    """--target beside a ladder ran the ladder; --only and --budget-s beside --time-to-accuracy were dropped."""
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--device", "cpu", *words]) == 2
    assert capsys.readouterr().err.strip() == f"cnnpar: error: {said}"
    assert not list(tmp_path.iterdir())
