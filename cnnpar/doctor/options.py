"""The doctor's and the profiler's own options, apart from the modules that run them: the command-line parser
takes its defaults from these fields and stays free of torch (cnnpar --help imports no engine)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ProfileOptions:
    wait: int = 1  # steps before the profiler starts (start-up, compile)
    warmup: int = 2  # profiled steps discarded (profiler start-up)
    active: int = 5  # profiled steps recorded
    row_limit: int = 25  # operators in the tables
    report_dir: str = ""
    all_threads: bool = False


@dataclass
class DoctorOptions:
    warmup: int = 3  # unmeasured steps before each measurement
    steps: int = 20  # measured batches per phase
    max_s: float = 30.0  # a phase stops after this long (min 2 batches)
    try_top: int = 0  # recommendations re-measured with the config changed
    report_dir: str = ""
    telemetry_interval_s: float = 0.5
