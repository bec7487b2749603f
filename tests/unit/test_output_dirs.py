"""Item 12.10: every tool's default output lands under run.out_dir (runs/, git-ignored), not in
the current folder."""

from __future__ import annotations

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
    assert bench.parent == tmp_path / "bench" and bench.name.endswith("-resnet18")
    cmp = default_compare_path(cfg.run.out_dir, tmp_path / "a" / "ladder.csv", tmp_path / "b" / "ladder.csv")
    assert cmp == tmp_path / "bench" / "compare-a-vs-b.md"


def test_the_default_root_is_runs_and_git_ignores_it():
    assert Config().run.out_dir == "runs"
    assert default_report_dir(Config()).parts[:2] == ("runs", "doctor")
    assert RunSpec().out == "runs/compare"
    paths = ["runs/doctor/x/report.md", "runs/profile/x/trace_rank0.json", "runs/bench/x/ladder.csv", "runs/compare/x"]
    r = subprocess.run(["git", "check-ignore", *paths], cwd=REPO, capture_output=True, text=True)
    assert r.stdout.split() == paths
