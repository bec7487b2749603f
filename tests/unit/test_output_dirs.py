"""Item 12.10: every tool's default output lands under run.out_dir (runs/, git-ignored), not in
the current folder."""

from __future__ import annotations

import re
import subprocess

import torch

from cnnpar.bench.compare import default_compare_path
from cnnpar.bench.meta import default_out_dir
from cnnpar.config import Config
from cnnpar.doctor.run import default_report_dir
from cnnpar.frameworks.spec import RunSpec
from cnnpar.presets import with_overrides
from tests.conftest import REPO


def test_defaults_are_under_the_out_dir(tmp_path):
    cfg = with_overrides(Config(), run={"out_dir": str(tmp_path)})
    doctor = default_report_dir(cfg)
    assert doctor.parent == tmp_path / "doctor" and doctor.name.startswith(f"{cfg.model.name}-")
    bench = default_out_dir(cfg.run.out_dir, torch.device("cpu"), "resnet18")
    assert bench.parent == tmp_path / "bench" and bench.name.startswith("resnet18-")
    cmp = default_compare_path(cfg.run.out_dir, tmp_path / "a" / "ladder.csv", tmp_path / "b" / "ladder.csv")
    assert cmp == tmp_path / "bench" / "compare-a-vs-b.md"


def test_the_default_root_is_runs_and_git_ignores_it():
    assert Config().run.out_dir == "runs"
    assert default_report_dir(Config()).parts[:2] == ("runs", "doctor")
    assert RunSpec().out == "runs/compare"
    paths = ["runs/doctor/x/report.md", "runs/profile/x/trace_rank0.json", "runs/bench/x/ladder.csv", "runs/compare/x"]
    r = subprocess.run(["git", "check-ignore", *paths], cwd=REPO, capture_output=True, text=True)
    assert r.stdout.split() == paths


def test_each_run_of_a_command_gets_a_folder_of_its_own(tmp_path):
    """bench's default folder had the date alone (<date>-<device>-<model>): a second bench the same day wrote into
    the first one's. Every tool's default folder is now named as train names its run folders: with the time of day,
    and a number where a run started within the same second already holds that name."""
    cfg = with_overrides(Config(), run={"out_dir": str(tmp_path)})
    cpu = torch.device("cpu")
    first = default_out_dir(cfg.run.out_dir, cpu, "cnn3")
    assert re.fullmatch(r"cnn3-[a-z0-9-]+-\d{8}-\d{6}", first.name), first.name
    first.mkdir(parents=True)
    second = default_out_dir(cfg.run.out_dir, cpu, "cnn3")
    assert second != first and second.name.startswith(first.name[: -len("-HHMMSS")])
    doctor = default_report_dir(cfg)
    assert re.fullmatch(rf"{cfg.model.name}-\d{{8}}-\d{{6}}", doctor.name), doctor.name
    doctor.mkdir(parents=True)
    assert default_report_dir(cfg) != doctor
