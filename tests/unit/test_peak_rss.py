"""The CPU's `peak_mem_mb` (report/meters.peak_rss_mb) in MB on each system: ru_maxrss counts KiB on Linux and bytes
on macOS, and Windows has no `resource` module."""

from __future__ import annotations

import resource
import sys

import psutil

from cnnpar.report import meters


def test_peak_rss_reads_ru_maxrss_as_kib_on_linux_and_as_bytes_on_macos(monkeypatch):
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    monkeypatch.setattr(meters.sys, "platform", "linux")
    linux_mb = meters.peak_rss_mb()
    assert peak / 1024 <= linux_mb < peak / 1024 * 1.5  # may grow meanwhile, never shrinks
    monkeypatch.setattr(meters.sys, "platform", "darwin")
    # macOS's 1024x larger unit: the same count read as bytes, where KiB made a 100 MB process 100 GB
    assert meters.peak_rss_mb() < linux_mb / 1000


def test_peak_rss_without_the_resource_module_is_psutils(monkeypatch):
    monkeypatch.setitem(sys.modules, "resource", None)  # Windows: `import resource` raises ImportError
    rss_mb = psutil.Process().memory_info().rss / 2**20
    assert 0.5 * rss_mb < meters.peak_rss_mb() < 2 * rss_mb
