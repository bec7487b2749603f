"""`--strategy horovod` under horovodrun matches the same run under torchrun DDP, step for step.

Horovod is not on PyPI in a form that builds against current torch: scripts/install_horovod.sh
builds it into .venv-horovod (or point CNNPAR_HOROVOD_PYTHON at a python that has it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cmd, torchrun_cmd

ARGS = ["train", "--epochs", "2", "--max-steps", "2", "--batch-size", "16", "--no-progress", "--name", "run"]


def horovod_python() -> str | None:
    candidates = [os.environ.get("CNNPAR_HOROVOD_PYTHON", ""), str(REPO / ".venv-horovod" / "bin" / "python")]
    for py in filter(None, candidates):
        if Path(py).is_file():
            ok = subprocess.run([py, "-c", "import horovod.torch"], capture_output=True, timeout=120)
            if ok.returncode == 0:
                return py
    try:
        import horovod.torch  # noqa: F401

        return sys.executable
    except ImportError:
        return None


HVD_PY = horovod_python()


def metrics(run_dir: Path) -> list[tuple[float, float]]:
    import csv

    with (run_dir / "metrics.csv").open() as f:
        return [(float(r["train_loss"]), float(r["val_loss"])) for r in csv.DictReader(f)]


@pytest.mark.skipif(
    HVD_PY is None,
    reason="horovod.torch is not importable: build it with scripts/install_horovod.sh (5-12 minutes), "
    "or set CNNPAR_HOROVOD_PYTHON",
)
def test_horovod_strategy_matches_ddp(tmp_path):
    hvd_dir, ddp_dir = tmp_path / "hvd", tmp_path / "ddp"
    hvd_dir.mkdir()
    ddp_dir.mkdir()
    horovodrun = str(Path(HVD_PY).with_name("horovodrun"))
    hvd_cmd = [horovodrun, "-np", "2", "-H", "localhost:2", HVD_PY, "-m", "cnnpar", *ARGS, "--strategy", "horovod"]
    hvd = run_cmd(hvd_cmd, hvd_dir, timeout=300)
    assert hvd.returncode == 0, hvd.stdout[-3000:] + hvd.stderr[-3000:]
    ddp = run_cmd([*torchrun_cmd(2, "--standalone"), "-m", "cnnpar", *ARGS], ddp_dir, timeout=300)
    assert ddp.returncode == 0, ddp.stdout[-3000:] + ddp.stderr[-3000:]
    got, want = metrics(hvd_dir / "runs" / "run"), metrics(ddp_dir / "runs" / "run")
    assert len(got) == len(want) == 2
    for (tl, vl), (tl_ref, vl_ref) in zip(got, want):
        assert abs(tl - tl_ref) < 1e-4 and abs(vl - vl_ref) < 1e-4, (got, want)
