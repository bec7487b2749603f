"""`cnnpar profile` writes a loadable trace with the step ranges; `cnnpar train --monitor` samples
telemetry into the run folder and stops the sampler when the run ends or fails."""

from __future__ import annotations

import json
import threading

import pytest

from cnnpar.cli import main
from cnnpar.report.files import read_csv
from cnnpar.report.ranges import GRAPH_REPLAY, STEP_RANGES
from tests.datafiles import write_first_batch_failures

pytestmark = pytest.mark.usefixtures("one_thread")  # one intra-op thread for the in-process runs (conftest)

SMALL = ["--epochs", "1", "--batch-size", "32", "--device", "cpu", "--no-progress"]


def _sampler_alive() -> bool:
    return any(t.name == "cnnpar-telemetry" for t in threading.enumerate())


def test_profile_trace_has_the_step_ranges(tmp_path):
    out = tmp_path / "prof"
    rc = main(
        ["profile", *SMALL, "--prof-wait", "1", "--prof-warmup", "1", "--prof-active", "2", "--report-dir", str(out)]
    )
    assert rc == 0
    trace = json.loads((out / "trace_rank0.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    for name in STEP_RANGES:  # data_wait, h2d_copy, forward, backward, optimizer_step; no graph on a CPU
        assert (name in names) is (name != GRAPH_REPLAY), name
    assert "aten::convolution" in names
    md = (out / "top_ops_rank0.md").read_text()
    assert md.count("\n- ") == 1  # the one absent range, and why
    assert f"- {GRAPH_REPLAY}: the step is not replayed from a CUDA graph" in md
    assert "| forward | 1 |" in md and "| operator | calls |" in md
    assert (out / "top_ops_rank0.txt").stat().st_size > 0
    reading = (out / "where_time_went_rank0.txt").read_text()
    assert "no GPU activity in the trace" in reading  # a CPU run
    assert "thread MainThread" in reading and "range forward:" in reading
    record = (out / "config.toml").read_text()  # what was profiled, on what: the tables carry no such record
    assert "# device_type = cpu" in record and "# world_size = 1" in record and "# git_rev = " in record
    assert 'name = "cnn3"' in record


def test_profile_with_every_thread_still_reads_its_trace_and_its_row_limit(tmp_path):
    out = tmp_path / "prof"
    args = ["--prof-wait", "1", "--prof-warmup", "1", "--prof-active", "1", "--report-dir", str(out)]
    assert main(["profile", *SMALL, *args, "--all-threads", "--row-limit", "3"]) == 0
    reading = (out / "where_time_went_rank0.txt").read_text()
    assert reading.startswith("1 recorded steps") and "range forward:" in reading
    md = (out / "top_ops_rank0.md").read_text()
    operators = md.split("| --- |", 1)[1].split("\n\n", 1)[0]  # the first table's rows
    # torch's own ranges rank beside the aten ops (Optimizer.step#AdamW.step was third on a loaded core)
    assert md.startswith("Top 3 operators") and operators.count("\n| `") == 3


def test_train_monitor_writes_telemetry_beside_metrics(tmp_path):
    rc = main(["train", *SMALL, "--max-steps", "3", "--monitor", "--out-dir", str(tmp_path), "--name", "mon"])
    assert rc == 0
    run = tmp_path / "mon"
    rows = read_csv(run / "telemetry.csv")
    assert rows and all(float(r["host_mem_used_mb"]) > 0 for r in rows)
    assert (run / "telemetry.png").stat().st_size > 1000 and (run / "metrics.csv").exists()
    assert not _sampler_alive()


def test_monitor_stops_when_the_run_fails(tmp_path, monkeypatch):
    from cnnpar.engine.trainer import Trainer

    def broken(self, epoch):
        raise RuntimeError("boom in epoch")

    monkeypatch.setattr(Trainer, "train_epoch", broken)
    with pytest.raises(RuntimeError, match="boom"):
        main(["train", *SMALL, "--monitor", "--out-dir", str(tmp_path), "--name", "bad"])
    assert not _sampler_alive()
    assert read_csv(tmp_path / "bad" / "telemetry.csv")  # what was sampled before the failure is kept


def test_profile_defaults_to_the_out_dir_not_the_current_folder(tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    rc = main(["profile", *SMALL, "--prof-wait", "0", "--prof-warmup", "1", "--prof-active", "1",
               "--out-dir", str(tmp_path / "out")])  # fmt: skip
    assert rc == 0
    assert list(cwd.iterdir()) == []
    (folder,) = (tmp_path / "out" / "profile").iterdir()
    assert folder.name.startswith("cnn3-") and (folder / "trace_rank0.json").is_file()


@pytest.mark.parametrize("case", ["one_image", "corrupt_images"])
def test_a_profile_that_fails_at_the_first_batch_leaves_no_report_folder(tmp_path, capsys, case):
    data, error = write_first_batch_failures(tmp_path / "in")[case]
    args = ["profile", "--data", str(data), "--device", "cpu", "--workers", "0", "--no-progress"]
    assert main([*args, "--out-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"cnnpar: error: {error}"), err
    assert not (tmp_path / "out").exists()  # neither the report folder nor the out/profile/ made for it
    kept = tmp_path / "kept"  # a --report-dir that was there before stays, as it was
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    assert main([*args, "--report-dir", str(kept)]) == 2
    assert [p.name for p in kept.iterdir()] == ["notes.txt"]
