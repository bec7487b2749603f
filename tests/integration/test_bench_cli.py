"""`cnnpar bench` end to end on the CPU, tiny sizes: ladder files, --compare, the claims preset."""

from __future__ import annotations

import contextlib
import csv
import io
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from cnnpar.bench.claims import CLAIM_IDS
from cnnpar.bench.output import CLAIM_COLUMNS, LADDER_COLUMNS
from cnnpar.cli import main
from cnnpar.parallel.precision import bf16_on
from tests.conftest import REPO

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["--device", "cpu", "--image-size", "8", "--batch-size", "32", "--warmup-steps", "1", "--timed-steps", "2",
        "--repeats", "2"]  # fmt: skip
RUNGS = ["baseline", "workers", "pin_memory", "uint8_device", "bf16", "channels_last"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def documented_ladder_columns() -> list[str]:
    text = (REPO / "docs" / "bench.md").read_text()
    section = text.split("## Ladder CSV columns", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([a-z0-9_]+)` \|", section, flags=re.M)


def run_bench(args: list[str], cwd: Path) -> SimpleNamespace:
    """`cnnpar ARGS` run in this process in folder `cwd` (a one-process CPU bench needs no process of its own; a
    subprocess paid ~3-4 s of imports each): its exit code and what it printed, as a finished subprocess gives them.
    Its own redirection, not capsys, so that the module-scoped ladder fixture can use it too."""
    out, err, here = io.StringIO(), io.StringIO(), os.getcwd()
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(args)
    finally:
        os.chdir(here)
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def read_rows(path) -> tuple[list[str], list[dict]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames), list(reader)


@pytest.fixture(scope="module")
def ladder(tmp_path_factory):
    out = tmp_path_factory.mktemp("ladder")
    r = run_bench(["bench", *TINY, "--only", ",".join(RUNGS), "--out", str(out)], out)
    assert r.returncode == 0, r.stderr[-3000:]
    return out, r


def test_ladder_csv_has_documented_columns_and_one_row_per_rung(ladder):
    out, _ = ladder
    header, rows = read_rows(out / "ladder.csv")
    assert header == documented_ladder_columns() == LADDER_COLUMNS
    assert [r["name"] for r in rows] == RUNGS
    by = {r["name"]: r for r in rows}
    assert by["pin_memory"]["status"] == "skipped" and "CUDA" in by["pin_memory"]["error"]
    for name in ("baseline", "workers", "uint8_device", "bf16", "channels_last"):
        r = by[name]
        assert r["status"] == "ok", r
        assert float(r["images_per_s"]) > 0 and float(r["step_ms"]) > 0
        assert 0 <= float(r["data_wait_share"]) <= 1 and 0 < float(r["mfu"]) < 1
        assert float(r["images_per_s_min"]) <= float(r["images_per_s"]) <= float(r["images_per_s_max"])
        assert r["device_type"] == "cpu" and r["model"] == "cnn3" and r["image_shape"] == "1x8x8"
        assert r["batch_size"] == "32" and r["world_size"] == "1" and r["git_rev"] and r["torch"]
        assert float(r["peak_mem_mb"]) > 0 and r["peak_mem_kind"] == "process_rss"  # CPU: resident memory
    assert float(by["baseline"]["speedup_vs_baseline"]) == 1.0
    # the switches are cumulative: each rung keeps what the ones before it added
    assert (by["baseline"]["loader"], by["baseline"]["workers"], by["baseline"]["precision"]) == (
        "textbook",
        "0",
        "fp32",
    )
    assert by["uint8_device"]["loader"] == "fast" and by["uint8_device"]["workers"] != "0"
    # on a CPU that emulates bf16, --precision auto trains fp32 and the bf16 rung is a branch (docs/bench.md)
    carried = "bf16" if bf16_on(torch.device("cpu")) else "uint8_device"
    precision = "bf16" if carried == "bf16" else "fp32"
    assert (by["channels_last"]["precision"], by["channels_last"]["channels_last"]) == (precision, "on")
    assert by["channels_last"]["prev_rung"] == by["channels_last"]["builds_on"] == carried
    assert ("later rungs build on fp32" in by["bf16"]["technique"]) is (carried != "bf16")
    ratio = float(by["channels_last"]["images_per_s"]) / float(by[carried]["images_per_s"])
    assert float(by["channels_last"]["speedup_vs_prev"]) == pytest.approx(ratio, rel=1e-3)
    md = (out / "ladder.md").read_text()
    assert "x baseline" in md and "x previous" in md and "skipped: needs CUDA" in md
    assert "| peak RSS MB |" in md


def test_ladder_plots_are_valid_pngs(ladder):
    from matplotlib.image import imread

    out, _ = ladder
    for name in ("throughput.png", "step_time.png"):
        data = (out / name).read_bytes()
        assert data[:8] == PNG_SIGNATURE
        img = imread(out / name)
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100


def test_compare_shows_two_runs_side_by_side(ladder, tmp_path):
    out, _ = ladder
    header, rows = read_rows(out / "ladder.csv")
    # the measured repeats' range is this host's noise (958-2,201 img/s on a loaded CI machine, whose doubled range
    # overlapped it: "inside the noise"): both runs get repeats that agreed, the second twice as fast
    a, b = tmp_path / "a" / "ladder.csv", tmp_path / "b" / "ladder.csv"
    for path, factor in ((a, 1), (b, 2)):
        for r in rows:
            if r["status"] == "ok":
                median = float(r["images_per_s"])  # the first pass keeps it
                for key in ("images_per_s", "images_per_s_min", "images_per_s_max"):
                    r[key] = str(factor * median)
        path.parent.mkdir()
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=header)
            w.writeheader()
            w.writerows(rows)
    r = run_bench(["bench", "--compare", str(a), str(b), "--out", str(tmp_path / "cmp")], tmp_path)
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert md in r.stdout
    line = next(ln for ln in md.splitlines() if ln.startswith("| bf16 |"))
    assert line.rstrip().endswith("| 2.00x |")
    assert re.search(r"^\| pin_memory \| skipped \| skipped \|", md, flags=re.M)
    # without --out the Markdown goes under --out-dir's bench/, not the current folder
    here = tmp_path / "here"
    here.mkdir()
    r = run_bench(["bench", "--compare", str(a), str(b), "--out-dir", str(tmp_path / "o")], here)
    assert r.returncode == 0, r.stderr
    assert list(here.iterdir()) == []
    assert (tmp_path / "o" / "bench" / "compare-a-vs-b.md").read_text() == md


def test_compare_names_a_csv_that_is_not_a_ladder(tmp_path):
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    r = run_bench(["bench", "--compare", str(bad), str(bad)], tmp_path)
    assert r.returncode == 2
    assert "x.csv: missing column(s) name, status, images_per_s, step_ms" in r.stderr
    assert "Traceback" not in r.stderr


def test_claims_preset_gives_every_claim_a_verdict(tmp_path):
    out = tmp_path / "claims"
    r = run_bench(["bench", "--preset", "claims", *TINY, "--only", "collate_speed", "--out", str(out)], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    header, rows = read_rows(out / "claims.csv")
    assert header == CLAIM_COLUMNS
    assert [row["claim"] for row in rows] == list(CLAIM_IDS)
    verdicts = {row["claim"]: row["verdict"] for row in rows}
    assert verdicts.pop("collate_speed") != "not measured"
    assert set(verdicts.values()) == {"not measurable here", "not measured"}
    for cuda_only in ("pin_memory", "two_streams", "amp_batch", "cudnn_benchmark"):
        assert verdicts[cuda_only] == "not measurable here"
    collate = next(row for row in rows if row["claim"] == "collate_speed")
    assert collate["verdict"].split(" (")[0] in ("confirmed", "inside the noise", "not reproduced")
    ratio = float(collate["variant_value"]) / float(collate["baseline_value"])
    assert float(collate["measured_ratio"]) == pytest.approx(ratio, rel=1e-3)
    # the repeats' range: the worst and best pairing of the two sides, around the median ratio
    low = float(collate["variant_min"]) / float(collate["baseline_max"])
    assert float(collate["ratio_low"]) == pytest.approx(low, rel=1e-3)
    assert float(collate["ratio_low"]) <= float(collate["measured_ratio"]) <= float(collate["ratio_high"])
    assert collate["model"] == "resnet50" and collate["image_shape"] == "3x224x224"  # its workload, not --image-size
    assert float(collate["seconds"]) > 0
    md = (out / "claims.md").read_text()
    assert md.count("\n| ") == len(CLAIM_IDS) + 1
    assert "CPU stand-in for ResNet-18 at 32 px" in md  # dynamic_compile's row names its stand-in


def test_a_ladder_whose_budget_ran_no_rung_runs_no_ddp_rows_and_is_refused(tmp_path):
    """No rung measured means no batch the ladder ran (auto stays 0 on a GPU): the DDP rows are not started, and
    the budget that measured nothing is refused in one line (exit 2) with nothing written; it ended 0."""
    out = tmp_path / "b"
    r = run_bench(["bench", *TINY, "--only", "baseline", "--budget-s", "0.001", "--ddp", "1", "--out", str(out)],
                  tmp_path)  # fmt: skip
    assert r.returncode == 2, r.stderr[-3000:]
    assert r.stderr.splitlines()[-1].startswith(
        "cnnpar: error: bench --budget-s 0.001: spent before the first rung could start (1 of 1 rung(s) not started "
    )
    assert not out.exists()
