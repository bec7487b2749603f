"""benchmarks/*.py run with an input that is not there, or a malformed flag: one line naming it, exit 2, as the
`cnnpar` commands say a user error; each ended in a FileNotFoundError, DataError or ValueError traceback (exit 1).
Each is refused before any work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cnnpar.checkout import env_importing_this_checkout

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.parametrize(
    "script, flags, said",
    [
        ("prepare_cifar10.py", ["--src", "{missing}", "--out", "{out}"], "prepare_cifar10: error: --src {missing}: "),
        ("speedrun_cpu.py", ["--data", "{missing}", "--out", "{out}"], "speedrun_cpu: error: --data {missing}: "),
        ("trace_summary.py", ["{missing}"], "trace_summary: error: trace {missing}: "),
        # its rows file is written on every way out, an empty one too: kept out of {out}
        (
            "cifar10_record.py",
            ["--data", "{missing}", "--skip-airbench", "--device", "cpu", "--out", "{missing}.csv"],
            "cifar10_record: error: {missing}: ",
        ),
        (
            "step_vs_plain.py",
            ["--device", "cpu", "--cases", "resnet18:32", "--out", "{out}/r.csv"],
            "step_vs_plain: error: --cases resnet18:32: 'resnet18:32': expected model:size:batch",
        ),
        (
            "one_step.py",
            ["--device", "cpu", "--data", "{missing}", "--out", "{out}/r.csv"],
            "one_step: error: {missing}: ",
        ),
    ],
)
def test_a_bad_input_is_one_line_and_exit_2(script, flags, said, tmp_path):
    missing, out = tmp_path / "absent.npz", tmp_path / "out"
    argv = [f.format(missing=missing, out=out) for f in flags]
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *argv],
        capture_output=True,
        text=True,
        env=env_importing_this_checkout(),
        timeout=120,
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(said.format(missing=missing)), done.stderr
    assert "file not found" in lines[0] or "expected model:size:batch" in lines[0]
    assert not out.exists()  # refused before the output folder was made
