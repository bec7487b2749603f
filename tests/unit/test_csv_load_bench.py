"""benchmarks/csv_load.py's verdict: only the target's workload (42,000 rows) meets or misses it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def csv_load():
    spec = importlib.util.spec_from_file_location("csv_load", REPO / "benchmarks" / "csv_load.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_run_of_fewer_rows_says_nothing_of_the_target():
    """A 2,000-row run had stored "meets_target": true over the 42,000-row result, from its peak memory alone."""
    got = csv_load().verdict(2000, 0.3, 610.0)
    assert got["meets_target"] is None and got["target_note"].startswith("not measured: 2,000 rows")


def test_the_targets_workload_must_meet_both_its_time_and_its_memory():
    bench = csv_load()
    assert bench.verdict(42000, 1.4, 760.0)["meets_target"] is True
    assert bench.verdict(42000, bench.LOAD_TARGET_S + 1, 760.0)["meets_target"] is False
    assert bench.verdict(42000, 1.4, bench.PEAK_LIMIT_MB + 1)["meets_target"] is False
