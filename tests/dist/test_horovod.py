"""`--strategy horovod` under horovodrun matches the same run under torchrun DDP, step for step.

Horovod is not on PyPI in a form that builds against current torch: scripts/install_horovod.sh
builds it into .venv-horovod (or point CNNPAR_HOROVOD_PYTHON at a python that has it). CI (.ci/run)
builds it and sets CNNPAR_REQUIRE_HOROVOD=1, which turns the skip below into a failure.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from cnnpar.parallel.horovod import ContiguousGradients, strategy_record
from tests.conftest import REPO, cli_env, torchrun_cmd

REQUIRE_ENV = "CNNPAR_REQUIRE_HOROVOD"
# Default flags (channels_last on, the CPU's default precision), 2 ranks, 2 steps in each of 2 epochs.
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
REQUIRED = os.environ.get(REQUIRE_ENV, "") not in ("", "0")


def user_env() -> dict[str, str]:
    """The test environment without OMP_NUM_THREADS, as in a user's shell: torchrun sets it to 1 for
    its workers, and `--strategy horovod` must do the same under horovodrun, which does not."""
    env = cli_env()
    env.pop("OMP_NUM_THREADS", None)
    return env


def run_job(cmd: list[str], cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    """Run a launcher; on a timeout kill its whole process group, ranks included: Horovod has no
    collective timeout, and a rank stuck in a mismatched collective spins a core until killed
    (its stall check did not end a mismatched broadcast_object here)."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=user_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd[:4])} ... did not finish in {timeout} s:\n{out[-3000:]}\n{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def metrics(run_dir: Path) -> list[tuple[float, float]]:
    with (run_dir / "metrics.csv").open() as f:
        return [(float(r["train_loss"]), float(r["val_loss"])) for r in csv.DictReader(f)]


@pytest.mark.slow  # over 20 s on 2 CPU cores (CI durations): `-m 'not slow'` leaves it out
@pytest.mark.skipif(
    HVD_PY is None and not REQUIRED,
    reason="horovod.torch is not importable: build it with scripts/install_horovod.sh (3-6 minutes), "
    f"or set CNNPAR_HOROVOD_PYTHON; {REQUIRE_ENV}=1 makes this a failure",
)
@pytest.mark.parametrize(
    "extra", [[], ["--precision", "fp16", "--optimizer", "sgd", "--lr", "0.05"]], ids=["default", "fp16-sgd"]
)
def test_horovod_strategy_matches_ddp(tmp_path, extra):
    """fp16: the GradScaler read each rank's own gradients while Horovod's all-reduce was still pending, and the
    second rank's zero_grad raised; SGD, unlike Adam, would also show gradients left at the scaler's scale."""
    if HVD_PY is None:
        pytest.fail(
            f"{REQUIRE_ENV} is set but horovod.torch is importable neither from CNNPAR_HOROVOD_PYTHON, "
            f"{REPO / '.venv-horovod'} nor this python: run scripts/install_horovod.sh"
        )
    hvd_dir, ddp_dir = tmp_path / "hvd", tmp_path / "ddp"
    hvd_dir.mkdir()
    ddp_dir.mkdir()
    horovodrun = str(Path(HVD_PY).with_name("horovodrun"))
    hvd_cmd = [horovodrun, "-np", "2", "-H", "localhost:2", HVD_PY, "-m", "cnnpar", *ARGS, *extra]
    hvd_cmd += ["--strategy", "horovod"]
    hvd = run_job(hvd_cmd, hvd_dir)
    assert hvd.returncode == 0, hvd.stdout[-3000:] + hvd.stderr[-3000:]
    assert "2 process(es)" in hvd.stdout, hvd.stdout[-3000:]
    ddp = run_job([*torchrun_cmd(2, "--standalone"), "-m", "cnnpar", *ARGS, *extra], ddp_dir)
    assert ddp.returncode == 0, ddp.stdout[-3000:] + ddp.stderr[-3000:]
    run = hvd_dir / "runs" / "run"
    resolved = tomllib.loads((run / "config.toml").read_text())
    # The contiguity fix is what this covers: if the CPU default ever changes, pass --channels-last on.
    assert resolved["speed"]["channels_last"] == "on", resolved["speed"]
    # the record tells a Horovod run from a DDP one, and names Horovod's version
    hvd_summary = json.loads((run / "summary.json").read_text())
    ddp_summary = json.loads((ddp_dir / "runs" / "run" / "summary.json").read_text())
    assert hvd_summary["strategy"] == "horovod" and hvd_summary["horovod"].startswith("0."), hvd_summary
    assert ddp_summary["strategy"] == "ddp" and "horovod" not in ddp_summary
    assert f"# horovod = {hvd_summary['horovod']}\n" in (run / "config.toml").read_text()
    got, want = metrics(run), metrics(ddp_dir / "runs" / "run")
    assert len(got) == len(want) == 2
    for (tl, vl), (tl_ref, vl_ref) in zip(got, want):
        assert abs(tl - tl_ref) < 1e-4 and abs(vl - vl_ref) < 1e-4, (got, want)


@pytest.mark.parametrize("extra", [[], ["--nproc", "2"]], ids=["plain", "nproc"])
def test_horovod_strategy_outside_horovodrun_is_refused(cli, extra):
    r = cli("train", "--strategy", "horovod", "--epochs", "1", "--max-steps", "1", *extra, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    # the docs' command (scripts/install_horovod.sh's venv; bare python has no Horovod), the user's flags kept
    venv = REPO / ".venv-horovod" / "bin"
    pasteable = f"{venv}/horovodrun -np 2 -H localhost:2 {venv}/python -m cnnpar train --epochs 1 --max-steps 1 "
    assert len(lines) == 1 and pasteable + "--strategy horovod`" in lines[0], r.stderr
    why = "launches torchrun" if extra else "not started by horovodrun"
    assert why in lines[0], r.stderr
    assert not (cli.cwd / "runs").exists()


def test_contiguous_gradients_round_trip():
    """What DistributedOptimizer does with a channels_last gradient: compress, all-reduce in place
    (here: doubled), decompress, set_; the gradient ends up reduced and still channels_last."""
    grad = torch.randn(4, 3, 5, 5).contiguous(memory_format=torch.channels_last)
    before = grad.clone()
    sent, ctx = ContiguousGradients.compress(grad)
    assert sent.is_contiguous() and torch.equal(sent, before)
    sent.mul_(2)
    grad.set_(ContiguousGradients.decompress(sent, ctx))
    assert torch.equal(grad, 2 * before)
    assert grad.is_contiguous(memory_format=torch.channels_last) and not grad.is_contiguous()
    flat = torch.randn(7)
    assert ContiguousGradients.compress(flat) == (flat, None)
    assert ContiguousGradients.decompress(flat, None) is flat


def test_the_run_record_names_the_strategy_and_horovods_version(monkeypatch):
    """summary.json had neither: a Horovod run's read as a DDP one's."""
    import types

    assert strategy_record("ddp") == {"strategy": "ddp"}
    monkeypatch.setitem(sys.modules, "horovod", types.SimpleNamespace(__version__="0.28.1"))
    assert strategy_record("horovod") == {"strategy": "horovod", "horovod": "0.28.1"}


def test_gradient_clipping_under_horovod_is_refused_before_anything_starts(cli):
    r = cli("train", "--strategy", "horovod", "--grad-clip", "1", "--epochs", "1", timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip() == (
        "cnnpar: error: optim.grad_clip (--grad-clip) = 1.0 is not supported with dist.strategy (--strategy) = "
        "'horovod': expected --strategy ddp, or --grad-clip 0"
    )
    assert not (cli.cwd / "runs").exists()
