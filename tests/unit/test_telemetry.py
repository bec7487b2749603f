"""The telemetry sampler without NVML: says so once, writes host rows, and always stops its thread."""

from __future__ import annotations

import threading
import time

import pytest

from cnnpar.report import telemetry
from cnnpar.report.files import read_csv


def _no_nvml():
    raise RuntimeError("NVML Shared Library Not Found")


def _sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "cnnpar-telemetry"]


def test_sampler_without_nvml_writes_host_rows_and_stops(tmp_path, monkeypatch):
    monkeypatch.setattr(telemetry, "_nvml_handles", _no_nvml)
    lines: list[str] = []
    path = tmp_path / "telemetry.csv"
    with telemetry.TelemetrySampler(path, interval_s=0.05, log=lines.append) as sampler:
        time.sleep(0.4)
        assert sampler.alive
    assert not sampler.alive and not _sampler_threads()
    assert len(lines) == 1 and "NVML" in lines[0] and "host CPU and memory only" in lines[0]
    rows = read_csv(path)
    assert len(rows) >= 4 and len(rows) == sampler.rows
    assert all(r["gpu"] == "" and r["gpu_util_pct"] == "" for r in rows)
    times = [float(r["time_s"]) for r in rows]
    assert times == sorted(times) and times[-1] >= 0.3
    assert rows[0]["host_cpu_pct"] == ""  # read a few ms after the prime: too short a while to mean anything
    assert all(0.0 <= float(r["host_cpu_pct"]) <= 100.0 for r in rows[1:-1])
    assert all(float(r["host_mem_used_mb"]) > 0 for r in rows)
    png = telemetry.plot_telemetry(path, tmp_path / "telemetry.png", [("phase", 0.1, 0.2)])
    assert png.stat().st_size > 1000


def test_sampler_stops_when_the_block_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(telemetry, "_nvml_handles", _no_nvml)
    sampler = telemetry.TelemetrySampler(tmp_path / "t.csv", interval_s=0.05, log=lambda s: None)
    with pytest.raises(ZeroDivisionError), sampler:
        time.sleep(0.1)
        1 / 0  # noqa: B018
    assert not sampler.alive and not _sampler_threads()
    assert sampler.rows >= 2 and len(read_csv(tmp_path / "t.csv")) == sampler.rows


def test_visible_devices_follow_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,GPU-abc")
    assert telemetry._visible_nvml_indices(4) == [2, "GPU-abc"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert telemetry._visible_nvml_indices(3) == [0, 1, 2]


def test_a_resumed_runs_monitor_keeps_the_earlier_attempts_samples_and_continues_their_time(tmp_path, monkeypatch):
    """`--monitor` on a resumed run opened telemetry.csv with "w": the earlier attempt's samples were gone."""
    import torch

    from cnnpar.dist import DistInfo

    monkeypatch.setattr(telemetry, "_nvml_handles", _no_nvml)
    monkeypatch.setattr(telemetry, "plot_telemetry", lambda *a: None)  # the CSV is what is checked
    info, lines = DistInfo(0, 0, 1, torch.device("cpu")), []
    with telemetry.monitor_run(True, info, tmp_path, log=lines.append):
        pass
    path = tmp_path / "telemetry.csv"
    first = read_csv(path)
    with path.open("a") as f:
        f.write("12.5,,3")  # a row the kill of the first attempt cut short
    with telemetry.monitor_run(True, info, tmp_path, log=lines.append):
        pass
    rows = read_csv(path)
    assert rows[: len(first)] == first and len(rows) > len(first)
    times = [float(r["time_s"]) for r in rows]
    assert times == sorted(times) and times[len(first)] >= times[len(first) - 1] + telemetry.DEFAULT_INTERVAL_S
    assert path.read_text().count("time_s,") == 1
    assert lines[-1].startswith(f"telemetry: continuing {path} after an earlier attempt's samples (up to ")


def test_no_host_cpu_reading_covers_only_the_moments_since_the_one_before(tmp_path, monkeypatch):
    """The first sample came a few ms after the counter was primed: psutil's share over so short a while is 0 or
    100 at random, and telemetry.csv and TensorBoard showed a false 0.0 at the start of every attempt. A reading
    over too short a while is left empty; every figure written covers at least MIN_CPU_WINDOW_S."""
    import psutil

    from cnnpar.report.tensorboard import telemetry_scalars

    monkeypatch.setattr(telemetry, "_nvml_handles", _no_nvml)
    read_at: list[float] = []
    real = psutil.cpu_percent

    def recorded(*args, **kwargs):
        read_at.append(time.monotonic())
        return real(*args, **kwargs)

    monkeypatch.setattr(psutil, "cpu_percent", recorded)
    seen: list[list[dict]] = []
    path = tmp_path / "telemetry.csv"
    with telemetry.TelemetrySampler(path, interval_s=0.2, log=lambda s: None, on_sample=seen.append):
        time.sleep(0.5)
    rows = read_csv(path)
    assert len(rows) >= 3 and rows[0]["host_cpu_pct"] == "" and float(rows[0]["host_mem_used_mb"]) > 0
    assert "host/cpu_pct" not in telemetry_scalars(seen[0]) and "host/mem_used_mb" in telemetry_scalars(seen[0])
    figures = [float(r["host_cpu_pct"]) for r in rows if r["host_cpu_pct"] != ""]
    assert figures and all(0.0 <= f <= 100.0 for f in figures)
    # the prime, then one read per figure written, each over at least the window since the read before
    assert len(read_at) == 1 + len(figures)
    assert min(b - a for a, b in zip(read_at, read_at[1:])) >= telemetry.MIN_CPU_WINDOW_S


def test_the_first_host_cpu_figure_covers_the_time_since_sampling_began(tmp_path, monkeypatch):
    """psutil keeps cpu_percent's last reading per thread: the counter primed on the thread that started sampling
    left the sampler thread's first figure without one, and psutil gave 0.0 for it, on a host kept busy meanwhile."""
    import psutil

    monkeypatch.setattr(telemetry, "_nvml_handles", _no_nvml)
    # psutil's per-thread readings, keyed by thread id: an earlier test's sampler thread, whose id a new thread
    # may reuse, must not leave this one a reading
    monkeypatch.setattr(psutil, "_last_cpu_times", {})
    real = psutil.cpu_percent
    threads: set[int] = set()

    def recorded(*args, **kwargs):
        threads.add(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(psutil, "cpu_percent", recorded)
    path = tmp_path / "telemetry.csv"
    with telemetry.TelemetrySampler(path, interval_s=0.3, log=lambda s: None):
        end = time.monotonic() + 0.45
        while time.monotonic() < end:  # one core busy: the host's share is well above 0 over the first figure
            pass
    assert threading.get_ident() not in threads and len(threads) == 1  # every reading on the sampler's thread
    figures = [r["host_cpu_pct"] for r in read_csv(path) if r["host_cpu_pct"] != ""]
    assert figures and float(figures[0]) > 0.0
