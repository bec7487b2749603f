"""Item 12.10: every tool's default output lands under run.out_dir (runs/, git-ignored), not in
the current folder, and in a folder of its own for each run, even for runs started within the same second."""

from __future__ import annotations

import datetime
import re
import subprocess
from types import SimpleNamespace

import pytest
import torch

import cnnpar.report.files as files
from cnnpar.bench.compare import default_compare_path
from cnnpar.cli import main
from cnnpar.config import Config
from cnnpar.dist import DistInfo
from cnnpar.doctor.options import DoctorOptions, ProfileOptions
from cnnpar.frameworks.spec import RunSpec
from cnnpar.presets import with_overrides
from tests.conftest import REPO


def test_defaults_are_under_the_out_dir(tmp_path):
    from cnnpar.bench.meta import default_out_place
    from cnnpar.doctor.run import report_parent

    cfg = with_overrides(Config(), run={"out_dir": str(tmp_path)})
    assert report_parent(cfg) == tmp_path / "doctor"
    parent, prefix = default_out_place(cfg.run.out_dir, torch.device("cpu"), "resnet18")
    assert parent == tmp_path / "bench" and prefix.startswith("resnet18-")
    cmp = default_compare_path(cfg.run.out_dir, tmp_path / "a" / "ladder.csv", tmp_path / "b" / "ladder.csv")
    assert cmp == tmp_path / "bench" / "compare-a-vs-b.md"


def test_the_default_root_is_runs_and_git_ignores_it():
    from cnnpar.doctor.run import report_parent

    assert Config().run.out_dir == "runs"
    assert report_parent(Config()).parts == ("runs", "doctor")
    assert RunSpec().out == "runs/compare"
    paths = [
        "runs/doctor/x/report.md", "runs/profile/x/trace_rank0.json", "runs/bench/x/ladder.csv", "runs/compare/x",
        "runs/tune/x/tuned.toml",
    ]  # fmt: skip
    r = subprocess.run(["git", "check-ignore", *paths], cwd=REPO, capture_output=True, text=True)
    assert r.stdout.split() == paths


NOON = datetime.datetime(2026, 12, 4, 12, 0, 0)


@pytest.fixture
def one_second(monkeypatch):
    """Every clock reading that names a folder is the same second."""
    monkeypatch.setattr(files, "_dt", SimpleNamespace(datetime=SimpleNamespace(now=lambda: NOON)))


def test_stamped_folders_made_within_one_second_are_each_new_and_made(tmp_path, one_second):
    """stamped_folder named the first free folder and made nothing: two commands that asked within the same second,
    before either made its folder, got the same one. It makes the folder it names, so the second gets -2."""
    first = files.stamped_folder(tmp_path / "runs" / "bench", "cnn3-cpu")
    second = files.stamped_folder(tmp_path / "runs" / "bench", "cnn3-cpu")
    third = files.stamped_folder(tmp_path / "runs" / "bench", "cnn3-cpu")
    assert [first.name, second.name, third.name] == ["cnn3-cpu-20261204-120000", *(f"cnn3-cpu-20261204-120000-{n}"
                                                                                    for n in (2, 3))]  # fmt: skip
    assert first.is_dir() and second.is_dir() and third.is_dir()


def _started_inside(monkeypatch, module, name: str, second) -> None:
    """`module.name`'s first call runs `second()` (another command, started within the same second) first."""
    real, started = getattr(module, name), []

    def with_another_inside(*args, **kwargs):
        if not started:
            started.append(True)
            second()
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, with_another_inside)


def _wrote(folder, name: str, text: str):
    (folder / name).write_text(text)
    return folder


def test_two_doctors_started_within_one_second_get_a_folder_each(tmp_path, monkeypatch, one_second):
    """The first named its folder, loaded its data, then made the folder: a second doctor started meanwhile took the
    same name, and their reports went into one folder."""
    import cnnpar.doctor.render as render
    import cnnpar.doctor.run as doctor_run

    cfg = with_overrides(Config(), run={"out_dir": str(tmp_path)}, speed={"device": "cpu"})
    runs = iter(("second", "first"))
    monkeypatch.setattr(doctor_run, "load_data", lambda *a: None)
    monkeypatch.setattr(render, "write_report", lambda report: None)  # _examine's stand-in wrote the report
    monkeypatch.setattr(doctor_run, "_examine", lambda *a: _wrote(a[-1], "report.md", next(runs)))
    _started_inside(monkeypatch, doctor_run, "load_data", lambda: doctor_run.run_doctor(cfg, DoctorOptions()))
    first = doctor_run.run_doctor(cfg, DoctorOptions())
    folders = sorted((tmp_path / "doctor").iterdir())
    assert [f.name for f in folders] == ["cnn3-20261204-120000", "cnn3-20261204-120000-2"]
    assert first == folders[1] and [(f / "report.md").read_text() for f in folders] == ["second", "first"]


def test_two_profiles_started_within_one_second_get_a_folder_each(tmp_path, monkeypatch, one_second):
    """The first named its folder, built its trainer, then made the folder: a second profile started meanwhile took
    the same name."""
    import cnnpar.doctor.profile as profile

    cfg = with_overrides(Config(), run={"out_dir": str(tmp_path)}, speed={"device": "cpu"})
    info, runs = DistInfo(0, 0, 1, torch.device("cpu")), iter(("second", "first"))
    monkeypatch.setattr(profile, "build_trainer", lambda *a: None)
    monkeypatch.setattr(profile, "_profile", lambda trainer, info, opts, out: _wrote(out, "config.toml", next(runs)))
    _started_inside(monkeypatch, profile, "build_trainer", lambda: profile.run_profile(cfg, info, ProfileOptions()))
    first = profile.run_profile(cfg, info, ProfileOptions())
    folders = sorted((tmp_path / "profile").iterdir())
    assert [f.name for f in folders] == ["cnn3-20261204-120000", "cnn3-20261204-120000-2"]
    assert first == folders[1] and [(f / "config.toml").read_text() for f in folders] == ["second", "first"]


@pytest.mark.usefixtures("one_thread")
def test_two_benches_started_within_one_second_get_a_folder_each(tmp_path, monkeypatch, capsys, one_second):
    """A bench named its folder before measuring and made it only at its writes, minutes later: a second bench
    started meanwhile took the same name, and the first's ladder.csv replaced the second's."""
    import cnnpar.bench.ladder as ladder
    from tests.unit.test_bench import BENCH, _ladder_rows

    root = str(tmp_path / "runs")

    def second_bench() -> None:
        assert main([*BENCH, "--only", "channels_last", "--out-dir", root]) == 0

    _started_inside(monkeypatch, ladder, "run_ladder", second_bench)
    assert main([*BENCH, "--only", "baseline", "--out-dir", root]) == 0
    capsys.readouterr()
    folders = sorted((tmp_path / "runs" / "bench").iterdir())
    assert len(folders) == 2 and re.fullmatch(r"cnn3-[a-z0-9-]+-20261204-120000-2", folders[1].name), folders
    # the first made its folder before it measured: the second, started then, gets -2
    assert [[r["name"] for r in _ladder_rows(f / "ladder.csv")] for f in folders] == [["baseline"], ["channels_last"]]


def test_each_tune_writes_into_a_new_folder_of_its_own(tmp_path, monkeypatch, capsys, one_second):
    """tune's default --out was tuned.toml in the current folder: a second tune there wrote over the first's
    tuned.toml and tuned.csv without a word. (Each start trial fails at once, and tuned.csv says so.)"""
    import cnnpar.bench.tune as tune_mod
    from cnnpar.bench.trial import FAILED, ChildResult

    failed = lambda cfg, limit: ChildResult(FAILED, error="no device here", wall_s=0.1)  # noqa: E731
    monkeypatch.setattr(tune_mod, "child_trial", lambda steps, repeats, log: failed)
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        assert main(["tune", "--device", "cpu", "--budget-s", "60", "--out-dir", "runs"]) == 1
    err = capsys.readouterr().err
    folders = sorted((tmp_path / "runs" / "tune").iterdir())
    assert [f.name for f in folders] == ["cnn3-20261204-120000", "cnn3-20261204-120000-2"]
    assert all((f / "tuned.csv").is_file() for f in folders) and sorted(p.name for p in tmp_path.iterdir()) == ["runs"]
    assert (
        f"tune: no {folders[1].relative_to(tmp_path) / 'tuned.toml'} written "
        "(the first trial ('start', the config as given) failed: no device here" in err
    )


@pytest.mark.usefixtures("one_thread")
def test_a_bench_stopped_before_its_first_row_leaves_no_folder_it_made(tmp_path, monkeypatch, capsys):
    """Its folder is made when it starts measuring now: a stop before a row is written removes it (and the runs/ and
    bench/ made for it); a stop after one keeps the rows (test_bench.py)."""
    import cnnpar.bench.ladder as ladder
    from tests.unit.test_bench import BENCH, _stopped_on_call

    monkeypatch.setattr(ladder, "measure_steps", _stopped_on_call(1, ladder.measure_steps))
    assert main([*BENCH, "--only", "baseline", "--out-dir", str(tmp_path / "runs")]) == 130
    assert list(tmp_path.iterdir()) == []


def test_a_tune_whose_start_fails_on_its_input_leaves_no_folder_it_made(tmp_path, monkeypatch, capsys):
    import cnnpar.bench.tune as tune
    from cnnpar.errors import DataError

    def bad_data(*a):
        raise DataError("photos/x.jpg: not a JPEG")

    monkeypatch.setattr(tune.Tuner, "start", bad_data)
    assert main(["tune", "--device", "cpu", "--out-dir", str(tmp_path / "runs")]) == 2
    assert capsys.readouterr().err == "cnnpar: error: photos/x.jpg: not a JPEG\n"
    assert list(tmp_path.iterdir()) == []
