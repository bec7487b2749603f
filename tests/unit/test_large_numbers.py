"""Absurdly large numbers end in a cap or one line, not a wait or a traceback: an explicit --workers is capped to what
the machine's cores can run (--workers 2000 on 2 cores forked for minutes, each start slower than the last, and a
SIGTERM then came to nothing), a prefetch factor to the epoch's batches, synthetic samples to the memory."""

from __future__ import annotations

import warnings

import pytest
import torch

from cnnpar.config import Config, DataConfig, RunConfig, resolve_for_device
from cnnpar.data import load_data, loader
from cnnpar.data.loader import build_loader, workers_cap_line
from cnnpar.dist import DistInfo
from cnnpar.errors import DataError
from cnnpar.host_facts import usable_cores

pytestmark = pytest.mark.usefixtures("one_thread")  # one intra-op thread for the in-process runs (conftest)

CPU = DistInfo(0, 0, 1, torch.device("cpu"))


def _cfg(workers: int) -> Config:
    cfg = Config(data=DataConfig(source="digits", resident="off", workers=workers), run=RunConfig(batch_size=64))
    return resolve_for_device(cfg, "cpu", True)


def test_workers_beyond_four_per_core_are_capped_to_them_and_the_cap_is_said(monkeypatch):
    monkeypatch.setattr(loader, "usable_cores", lambda: 2)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    cfg = _cfg(100_000)
    feeder = build_loader(load_data(cfg.data, cfg.run.seed), cfg, CPU, True)  # no worker starts before iter()
    assert feeder.loader.num_workers == 8
    assert workers_cap_line(cfg, CPU).startswith("--workers 100000 capped to 8: 4 per usable core (2 cores)")


def test_the_cap_is_shared_by_the_local_processes_and_a_count_within_it_is_kept(monkeypatch):
    monkeypatch.setattr(loader, "usable_cores", lambda: 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    line = workers_cap_line(_cfg(5), CPU)
    assert line.startswith("--workers 5 capped to 4:") and "shared by 2 local processes" in line
    assert loader.loader_workers(_cfg(4), None, CPU) == 4
    assert workers_cap_line(_cfg(4), CPU) == ""


def test_workers_within_the_cap_but_beyond_the_cores_start_without_torchs_warning():
    """--workers 2 on one usable core (taskset, a cpuset) is within the cap, yet torch printed its three-line advice
    to use fewer at the loader's start and again at each pass's."""
    cfg = _cfg(usable_cores() + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        feeder = build_loader(load_data(cfg.data, cfg.run.seed), cfg, CPU, True)
        assert feeder.loader.num_workers == usable_cores() + 1
        iter(feeder.loader)._shutdown_workers()


def test_a_prefetch_factor_beyond_the_epochs_batches_is_cut_to_them():
    """audit bounds: --prefetch-factor 10**9 spun in torch's priming loop (prefetch x workers tries) for minutes."""
    cfg = Config(
        data=DataConfig(source="digits", resident="off", workers=2, prefetch_factor=10**9), run=RunConfig(batch_size=64)
    )
    cfg = resolve_for_device(cfg, "cpu", True)
    feeder = build_loader(load_data(cfg.data, cfg.run.seed), cfg, CPU, True)
    batches = len(feeder.loader.batch_sampler or feeder.loader.sampler)
    assert feeder.loader.prefetch_factor == -(-batches // 2)  # both workers' shares of the epoch in flight, no more
    assert loader.loader_prefetch(4, batches, 2) == 4  # a factor within them is kept


def test_synthetic_samples_beyond_the_memory_are_refused_in_one_line_before_any_allocation():
    """audit bounds: --synthetic-samples 10**12 stopped in torch's allocator traceback (8 TB asked for)."""
    with pytest.raises(DataError, match=r"--synthetic-samples 1,000,000,000,000 of 3x32x32 take 6,152,000\.0 GB"):
        load_data(DataConfig(source="synthetic", synthetic_samples=10**12), 0)


def test_cpu_processes_beyond_four_per_core_are_refused_in_one_line(monkeypatch):
    """audit bounds: --nproc 1000 without a GPU was handed to torchrun, a thousand ranks on 2 cores."""
    from cnnpar.dist import pick_device
    from cnnpar.errors import ConfigError

    monkeypatch.setattr("cnnpar.dist.usable_cores", lambda: 2)
    with pytest.raises(
        ConfigError, match=r"1000 processes on this node's CPU but 2 usable core\(s\): expected --nproc"
    ):
        pick_device("cpu", 0, 1000)
    assert pick_device("cpu", 7, 8) == torch.device("cpu")  # within 4 per core: a gloo test of 8 ranks still runs


def test_prepare_caps_its_decoding_processes_to_four_per_core_and_says_so(tmp_path, monkeypatch, capsys):
    """--workers 100000 made prepare's process pool fork 100,000 decoders at once (a fork storm on 2 cores)."""
    import numpy as np
    from PIL import Image

    from cnnpar.data import store_write

    for c in ("a", "b"):
        (tmp_path / "photos" / c).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(np.full((12, 16, 3), 40 * i, np.uint8)).save(tmp_path / "photos" / c / f"{i}.png")
    monkeypatch.setattr(store_write, "usable_cores", lambda: 1)
    started = []
    real_pool = store_write.ProcessPoolExecutor

    def pool(n, **kw):  # none forked past 2, whatever was asked
        started.append(n)
        return real_pool(min(n, 2), **kw)

    monkeypatch.setattr(store_write, "ProcessPoolExecutor", pool)
    header = store_write.prepare_store(tmp_path / "photos", tmp_path / "p.cnnpar", workers=100_000, progress=False)
    assert header["count"] == 6 and started == [4]
    assert "--workers 100000 capped to 4: 4 per usable core (1 core)" in capsys.readouterr().out
    assert store_write.decode_workers(-1, 6) == 1 and store_write.decode_workers(3, 2) == 2  # the default; the files
    # fewer images than the cap: the line names the number started (it said "capped to 4" and started 2)
    monkeypatch.setattr(store_write, "usable_cores", lambda: 4)
    assert store_write.decode_workers(100_000, 2) == 2
    assert capsys.readouterr().out == "--workers 100000 capped to 2: one per image (2 images)\n"


def test_prepare_refuses_a_negative_workers_count(capsys):
    from cnnpar.cli import main

    with pytest.raises(SystemExit) as ended:
        main(["prepare", "photos", "--workers", "-2"])
    assert ended.value.code == 2 and "--workers" in capsys.readouterr().err
