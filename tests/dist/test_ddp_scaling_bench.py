"""benchmarks/ddp_scaling.py on the CPU: it launches torchrun per world size and writes its rows."""

from __future__ import annotations

import json
import sys

import pytest

from cnnpar.report.files import read_csv
from tests.conftest import REPO, run_cmd


def test_cpu_path_runs_world_sizes_1_and_2_and_writes_csv_and_json(tmp_path):
    out = tmp_path / "scaling"
    cmd = [sys.executable, str(REPO / "benchmarks" / "ddp_scaling.py"), "--device", "cpu", "--model", "cnn3"]
    cmd += ["--image-size", "16", "--num-classes", "10", "--batch-size", "8", "--steps", "2", "--repeats", "1"]
    cmd += ["--real-samples", "32", "--out", str(out)]
    cmd += ["--ddp-bucket-mb", "0.5", "--ddp-static-graph", "on", "--ddp-broadcast-buffers", "off"]  # issue 13's
    proc = run_cmd(cmd, tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    rows = read_csv(out.with_suffix(".csv"))
    assert [int(r["world_size"]) for r in rows] == [1, 2]
    one, two = rows
    assert float(one["speedup"]) == 1.0 and float(one["scaling_efficiency"]) == 1.0
    ips1, ips2 = float(one["images_per_s"]), float(two["images_per_s"])
    assert ips1 > 0 and ips2 > 0
    assert float(two["speedup"]) == pytest.approx(ips2 / ips1, rel=1e-3)
    assert float(two["scaling_efficiency"]) == pytest.approx(ips2 / (2 * ips1), rel=1e-3)
    assert float(two["images_per_s_per_device"]) == pytest.approx(ips2 / 2, rel=1e-3)
    for r in rows:  # the real host pipeline, not a resident data set; the facts every result carries
        assert r["resident"] == "False"
        assert r["step"] == "eager"  # the same kind of step at world size 1 as under DDP
        assert r["torch"] and r["device"] and r["git_rev"] and r["model"] == "cnn3"

    # DDP's switches, as read off the module the two ranks ran through (one process has none)
    assert (one["ddp_bucket_mb"], one["ddp_static_graph"], one["ddp_broadcast_buffers"]) == ("", "", "")
    assert (two["ddp_bucket_mb"], two["ddp_static_graph"], two["ddp_broadcast_buffers"]) == ("0.5", "True", "False")

    report = json.loads(out.with_suffix(".json").read_text())
    assert report["config"]["device"] == "cpu" and report["config"]["batch_size"] == 8
    assert [w["environment"]["world_size"] for w in report["workers"]] == [1, 2]


def test_bench_ddp_flag_adds_rows_beside_the_ladder(tmp_path):
    from tests.conftest import run_cli

    out = tmp_path / "bench"
    args = ["bench", "--device", "cpu", "--image-size", "8", "--batch-size", "8", "--warmup-steps", "1"]
    args += ["--data", "synthetic", "--image-shape", "1x8x8", "--num-classes", "4", "--optimizer", "adamw"]
    args += ["--timed-steps", "2", "--repeats", "1", "--only", "baseline", "--ddp", "1,2", "--out", str(out)]
    proc = run_cli(args, tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (out / "ladder.csv").is_file()
    rows = read_csv(out / "ddp.csv")
    assert [int(r["world_size"]) for r in rows] == [1, 2]
    assert all(r["model"] == "cnn3" and int(r["batch_per_process"]) == 8 for r in rows)
    # the ladder's workload, not 3-channel images of 1,000 classes under SGD (the rows ran those, unsaid)
    [rung] = read_csv(out / "ladder.csv")
    assert {(r["image_shape"], r["num_classes"], r["optimizer"]) for r in rows} == {(rung["image_shape"], "4", "adamw")}
