"""Run metadata shared by every row of a bench run, and the default results folder."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from cnnpar.config import Config
from cnnpar.data import DataBundle
from cnnpar.report.environment import device_name, environment

META_COLUMNS = [
    "date",
    "git_rev",
    "device",
    "device_type",
    "driver",
    "torch",
    "cuda",
    "python",
    "host_cpus",
    "torch_threads",
    "world_size",
    "model",
    "data",
    "image_shape",
    "batch_size",
    "warmup_steps",
    "timed_steps",
    "repeats",
    "timed_s",
    "peak_tflops",
    "peak_kind",
    "gflops_per_image",
]


def device_metadata(device: torch.device, timing) -> dict:
    """The facts about where and how a bench measured, whatever the model and data."""
    env = environment(device, world_size=1)
    return {
        "date": env["date"],
        "git_rev": env["git_rev"],
        "device": env["device"],
        "device_type": device.type,
        "driver": env["driver"],
        "torch": env["torch"],
        "cuda": env["cuda"],
        "python": env["python"],
        "host_cpus": env["host_cpus"],
        "torch_threads": torch.get_num_threads(),  # CPU figures depend on it (OMP_NUM_THREADS)
        "world_size": 1,
        "warmup_steps": timing.warmup,
        "timed_steps": timing.steps,
        "repeats": timing.repeats,
        "timed_s": timing.seconds,
    }


def run_metadata(
    cfg: Config, bundle: DataBundle, device: torch.device, timing, peak: tuple[float, str], flops_per_image: float
) -> dict:
    """Facts every row repeats, so one CSV row read alone still says where and how it was measured."""
    c, h, w = bundle.shape
    meta = {
        **device_metadata(device, timing),
        "model": cfg.model.name,
        "data": bundle.origin,
        "image_shape": f"{c}x{h}x{w}",
        "batch_size": cfg.run.batch_size,
        "peak_tflops": round(peak[0] / 1e12, 4),
        "peak_kind": peak[1],
        "gflops_per_image": round(flops_per_image / 1e9, 6),
    }
    return {k: meta[k] for k in META_COLUMNS}


def slug(text: str, limit: int = 40) -> str:
    text = re.sub(r"\((r|tm)\)", "", text.lower())
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")[:limit].strip("-") or "device"


def default_out_place(out_root: str | Path, device: torch.device, model: str) -> tuple[Path, str]:
    """(OUT_ROOT/bench, <model>-<device>): each bench's new folder is <model>-<device>-YYYYMMDD-HHMMSS in there, made
    when it starts measuring (run.results_folder, by `stamped_folder`, as doctor, profile and tune make theirs): under
    run.out_dir (runs/ by default, git-ignored), not `benchmarks/results/` of whatever folder the command runs in.
    Results worth keeping are copied into the repository's benchmarks/results/ by hand, with their README."""
    return Path(out_root) / "bench", f"{slug(model)}-{slug(device_name(device))}"
