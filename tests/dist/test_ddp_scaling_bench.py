"""benchmarks/ddp_scaling.py on the CPU: it launches torchrun per world size and writes its rows."""

from __future__ import annotations

import json
import sys

import pytest

from cnnpar.report.files import read_csv
from tests.conftest import REPO
from tests.dist.test_torchrun_cli import environment_of_a_subprocess

# the ladder of `cnnpar bench` trains in this process
pytestmark = pytest.mark.usefixtures("one_thread")


def test_cpu_path_runs_world_sizes_1_and_2_and_writes_csv_and_json(tmp_path, monkeypatch, capfd):
    """The script runs in this process (runpy, as `python benchmarks/ddp_scaling.py` runs it): only its torchrun
    launches, one per world size, need processes of their own."""
    import runpy

    out = tmp_path / "scaling"
    script = str(REPO / "benchmarks" / "ddp_scaling.py")
    argv = [script, "--device", "cpu", "--model", "cnn3"]
    argv += ["--image-size", "16", "--num-classes", "10", "--batch-size", "8", "--steps", "2", "--repeats", "1"]
    argv += ["--real-samples", "32", "--out", str(out)]
    argv += ["--ddp-bucket-mb", "0.5", "--ddp-static-graph", "on", "--ddp-broadcast-buffers", "off"]  # issue 13's
    environment_of_a_subprocess(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", argv)
    monkeypatch.setattr("sys.path", list(sys.path))  # the script puts its checkout first
    with pytest.raises(SystemExit) as ended:
        runpy.run_path(script, run_name="__main__")
    said = capfd.readouterr()
    assert ended.value.code == 0, said.out[-3000:] + said.err[-3000:]

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
    assert report["ended_at"] is None  # every world size asked for was measured


def test_bench_ddp_flag_adds_rows_beside_the_ladder(tmp_path, monkeypatch, capfd):
    """`cnnpar bench` runs in this process; its --ddp rows come from torchrun launches of their own."""
    from cnnpar.cli import main

    out = tmp_path / "bench"
    args = ["bench", "--device", "cpu", "--image-size", "8", "--batch-size", "8", "--warmup-steps", "1"]
    args += ["--data", "synthetic", "--image-shape", "1x8x8", "--num-classes", "4", "--optimizer", "adamw"]
    args += ["--timed-steps", "2", "--repeats", "1", "--only", "baseline", "--ddp", "1,2", "--out", str(out)]
    environment_of_a_subprocess(monkeypatch)
    monkeypatch.chdir(tmp_path)
    code = main(args)
    said = capfd.readouterr()
    assert code == 0, said.out[-3000:] + said.err[-3000:]
    assert (out / "ladder.csv").is_file()
    rows = read_csv(out / "ddp.csv")
    assert [int(r["world_size"]) for r in rows] == [1, 2]
    assert all(r["model"] == "cnn3" and int(r["batch_per_process"]) == 8 for r in rows)
    # the ladder's workload, not 3-channel images of 1,000 classes under SGD (the rows ran those, unsaid)
    [rung] = read_csv(out / "ladder.csv")
    assert {(r["image_shape"], r["num_classes"], r["optimizer"]) for r in rows} == {(rung["image_shape"], "4", "adamw")}


def test_a_later_world_size_that_fails_keeps_the_rows_measured_before_it(tmp_path, monkeypatch, capsys):
    """World size 1 measured (a real gloo launch), then world size 2's launch failed: the minutes of rows before it
    were thrown away, no CSV or JSON written. Now world size 1's row is written, the failure named on stderr and in
    the JSON, exit 1 as any failed launch."""
    import subprocess

    from cnnpar.bench import ddp_scaling

    real = subprocess.Popen
    failing = "import sys; sys.stderr.write('rank 1: out of memory\\n'); sys.exit(1)"

    def second_size_fails(cmd, **kw):  # world size 2's torchrun swapped for one that fails as a worker's error ends
        return real([sys.executable, "-c", failing] if "--nproc_per_node=2" in cmd else cmd, **kw)

    monkeypatch.setattr(ddp_scaling.subprocess, "Popen", second_size_fails)
    out = tmp_path / "scaling"
    argv = ["ddp_scaling", "--device", "cpu", "--model", "cnn3", "--image-size", "16", "--num-classes", "10"]
    argv += ["--batch-size", "8", "--steps", "2", "--repeats", "1", "--real-samples", "32", "--out", str(out)]
    monkeypatch.setattr("sys.argv", argv)
    with pytest.raises(SystemExit) as stopped:
        ddp_scaling.entry()
    csv, js = out.with_suffix(".csv"), out.with_suffix(".json")
    assert stopped.value.code == (
        f"ddp_scaling: world size 2 failed: torchrun exited 1; the rows of world size 1, measured before it, are kept "
        f"in {csv} and {js}"
    )
    assert capsys.readouterr().err.endswith("rank 1: out of memory\n")  # the failing rank's own line, as before

    [one] = read_csv(csv)
    assert int(one["world_size"]) == 1 and float(one["images_per_s"]) > 0
    assert float(one["speedup"]) == 1.0 and float(one["scaling_efficiency"]) == 1.0
    report = json.loads(js.read_text())
    assert [r["world_size"] for r in report["rows"]] == [1]
    assert report["ended_at"] == {"world_size": 2, "why": "world size 2 failed: torchrun exited 1"}
    assert set(report["rows"][0]) == set(one)  # the same columns in both files (the JSON's keys sorted)
