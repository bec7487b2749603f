"""`cnnpar compare` end to end: every installed framework trains cnn3 for one short epoch.

Tiny data (the built-in digits, 128 training and 32 validation images, batch 16) keeps the whole
file near a minute on 2 cores, most of it framework imports and compilation. Eight steps, not two: `compare` exits 1
for a run that ends at chance accuracy, and two steps left some frameworks at 17 %, near the 15 % line (eight of 16
left keras-jax and PyTensor at 72 %). Batch 16, not 32: PyTensor's Python linker spends its time per image, and at
256 and 64 images its epoch was a third of the file's CPU. PyTensor runs in
FAST_COMPILE mode here, with no C compiler: FAST_RUN's first C compilation takes minutes on a fresh machine.
`compare` itself runs by `main` in this process (it starts every runner as a subprocess of its own anyway), with
the environment the CLI subprocesses get (conftest.cli_env), which its runners inherit.
"""

from __future__ import annotations

import csv
import importlib.util
import os

import pytest

from cnnpar.frameworks.spec import CSV_COLUMNS, FRAMEWORKS, csv_name, read_result_csv
from tests.conftest import cli_env, main_in

TINY = ["--max-train", "128", "--max-val", "32", "--batch-size", "16", "--epochs", "1"]
HEADER_KEYS = {"framework", "backend", "device", "devices_used", "parallelism", "git_rev", "train_samples", "timed"}
HEADER_KEYS |= {"intra_op_threads", "load_avg_before_1_5_15", "load_avg_1_5_15"}


def installed(name: str) -> bool:
    return all(importlib.util.find_spec(p) is not None for p in FRAMEWORKS[name].needs)


# seconds each runner may take before `compare` stops it and fails its row: a guard against a hang (no timeout
# bounds a call of `main`, and compare's own default is an hour a runner), not a timing; the subprocess this
# replaced had 600 s for every framework together
RUNNER_TIMEOUT_S = "300"


@pytest.fixture
def compare(tmp_path, monkeypatch, capsys):
    """`cnnpar compare ARGS` by `main` in this process, from tmp_path: (exit code, out, err). Its runners get the
    environment a CLI subprocess of the tests has (conftest.cli_env: one OpenMP thread, none of the suite's CNNPAR_*
    or torchrun variables), with `env` added."""

    def _run(*args: str, **env: str) -> tuple[int, str, str]:
        for name in set(os.environ) - set(cli_env()):  # what cli_env leaves out: a fault injection, a git_rev
            monkeypatch.delenv(name)
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        done = main_in(tmp_path, monkeypatch, capsys, ["compare", "--timeout", RUNNER_TIMEOUT_S, *args])
        return done.returncode, done.stdout, done.stderr

    _run.cwd = tmp_path
    return _run


@pytest.mark.slow  # over 20 s on 2 CPU cores (CI durations): `-m 'not slow'` leaves it out
def test_compare_every_framework_one_epoch(compare):
    names = list(FRAMEWORKS)
    args = ["--frameworks", ",".join(names), *TINY, "--out", "res"]
    rc, stdout, stderr = compare(*args, PYTENSOR_MODE="FAST_COMPILE", PYTENSOR_FLAGS="cxx=")  # no C compiler at all
    assert rc == 0, stdout[-3000:] + stderr[-3000:]
    out = compare.cwd / "res"
    table = (out / "cnn2d_3layer_fullconnected_3layer_summary.md").read_text()
    losses = {}
    for name in names:
        fw = FRAMEWORKS[name]
        if not installed(name):
            assert f"| {name} | skipped |" in table
            assert f"compare: skipping {name}:" in stdout
            continue
        assert f"| {name} | ok |" in table
        header, rows = read_result_csv(out / csv_name(fw))
        assert HEADER_KEYS <= set(header), (name, header)
        assert header["train_samples"] == "128" and header["val_samples"] == "32"
        assert header["device_type"] == "cpu", header  # no GPU here: whatever the strategy, the record says CPU
        assert len(rows) == 1 and list(rows[0]) == CSV_COLUMNS
        row = rows[0]
        assert float(row["epoch_s"]) > 0 and float(row["images_per_s"]) > 0
        assert 0.0 <= float(row["val_acc"]) <= 1.0
        losses[name] = float(row["train_loss"])
    # Same initial weights, batch order and optimizer: the non-engine runners agree to rounding.
    same_order = ("keras-tensorflow", "keras-jax", "keras-torch", "tensorflow", "pytensor")
    shared = [losses[n] for n in same_order if n in losses]
    assert len(shared) >= 2, f"too few runners installed to compare: {sorted(losses)}"
    assert max(shared) - min(shared) < 1e-2, losses
    assert (out / "cnn2d_3layer_fullconnected_3layer_summary.png").stat().st_size > 1000
    summary_csv = out / "cnn2d_3layer_fullconnected_3layer_summary.csv"
    summary = {r["framework"]: r for r in csv.DictReader(summary_csv.open())}
    for name in losses:  # every row names its own device, revision and what its timed epochs hold
        assert summary[name]["device"] and summary[name]["git_rev"] and summary[name]["timed"], summary[name]
    if "pytensor" in losses:
        assert summary["pytensor"]["timed"].startswith("compiled before epoch 1")
        assert "use_cloop=False" in read_result_csv(out / csv_name(FRAMEWORKS["pytensor"]))[0]["pytensor_linker"]


@pytest.mark.slow  # over 20 s on 2 CPU cores (CI durations): `-m 'not slow'` leaves it out
@pytest.mark.skipif(
    not installed("keras-jax"), reason="keras and jax are not installed (pip install 'cnnpar[keras,jax]')"
)
def test_keras_jax_data_parallel_on_two_virtual_devices(compare):
    rc, stdout, stderr = compare("--frameworks", "keras-jax", *TINY, "--devices", "2", "--out", "res")
    assert rc == 0, stdout[-3000:] + stderr[-3000:]
    header, rows = read_result_csv(compare.cwd / "res" / csv_name(FRAMEWORKS["keras-jax"]))
    assert header["devices_used"] == "2"
    assert header["parallelism"].startswith("keras.distribution.DataParallel over ")
    assert f"{'keras-jax':<18} {'-':>16}   2 dev  val acc " in stdout  # the console says the devices it ran on
    assert header["parallelism"].count("CpuDevice") == 2 or header["parallelism"].count(",") == 1
    assert len(rows) == 1 and float(rows[0]["images_per_s"]) > 0


def test_the_runners_get_none_of_the_suite_s_own_cnnpar_variables(compare, monkeypatch):
    """A suite run with a CNNPAR_* variable exported (here the git revision results record; a fault injection does
    the same): `compare` run in this process handed it to its runners, which the CLI subprocesses that ran it before
    (conftest.cli_env) never got."""
    monkeypatch.setenv("CNNPAR_GIT_REV", "the-suite-s-own")
    rc, stdout, stderr = compare("--frameworks", "torch", *TINY, "--out", "res")
    assert rc == 0, stdout[-3000:] + stderr[-3000:]
    header, _ = read_result_csv(compare.cwd / "res" / csv_name(FRAMEWORKS["torch"]))
    assert header["git_rev"] and header["git_rev"] != "the-suite-s-own"


def test_compare_rejects_unknown_framework(compare):
    rc, _, stderr = compare("--frameworks", "torch,lasagne", "--out", "res")
    assert rc == 2
    assert "unknown lasagne" in stderr and "Traceback" not in stderr
