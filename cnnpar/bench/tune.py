"""`cnnpar tune`: measure the speed switches on the user's model, data and device; keep the fastest.

A greedy coordinate search: start from the user's config resolved for the device, try each
alternative of one switch at a time (precision, channels_last, compile mode, CUDA graphs, data
mode, workers, batch size), keep a change only when it is faster by more than the measured
noise margin, move on to the next switch. Each trial runs the real Trainer for a warm-up epoch
(compile and cuDNN autotuning happen there) and then timed epochs of `steps` steps; the median
images/s counts. The winner is written as a TOML file that `cnnpar train --config` takes.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from cnnpar.config import Config, dumps_toml
from cnnpar.data import DataBundle, load_data
from cnnpar.dist import DistInfo
from cnnpar.engine.harness import build_trainer, free_device_memory, reset_compiler
from cnnpar.errors import first_line
from cnnpar.parallel import resolve_for
from cnnpar.report.environment import environment
from cnnpar.report.files import write_csv_atomic, write_text_atomic

KEEP_MARGIN = 1.03  # a change must be 3 % faster to be kept: smaller gains are within run-to-run noise


@dataclass
class Trial:
    switch: str
    value: str
    images_per_s: float | None
    warmup_s: float
    status: str
    error: str = ""


def with_switch(cfg: Config, section: str, name: str, value) -> Config:
    return replace(cfg, **{section: replace(getattr(cfg, section), **{name: value})})


def measure(cfg: Config, info: DistInfo, bundle: DataBundle, steps: int, repeats: int) -> tuple[float, float]:
    """Median train images/s over `repeats` epochs of `steps` steps, after one warm-up epoch."""
    cfg = replace(cfg, run=replace(cfg.run, max_steps=steps, epochs=repeats + 1, eval_every=10**6))
    t0 = time.perf_counter()
    trainer = build_trainer(cfg, info, bundle)
    try:
        trainer.warm_up_compile()
        trainer.train_epoch(1)
        warm = time.perf_counter() - t0
        rates = [trainer.train_epoch(e)["images_per_s"] for e in range(2, repeats + 2)]
    finally:  # a failed trial (out of memory, say) must not leave its memory or graphs to the next
        del trainer
        free_device_memory(info.device)
        reset_compiler()  # each trial compiles afresh; stale graphs would mix trials
    return statistics.median(rates), warm


def candidates(cfg: Config, bundle: DataBundle, cuda: bool) -> list[tuple[str, str, str, list]]:
    """(label, section, field, values to try) in the order they are tried."""
    out = [("precision", "speed", "precision", ["bf16", "fp32"] + (["fp16"] if cuda else []))]
    out.append(("channels_last", "speed", "channels_last", ["on", "off"]))
    out.append(("compile", "speed", "compile", ["off", "default"] + (["max-autotune-no-cudagraphs"] if cuda else [])))
    if cuda:
        out.append(("cuda_graphs", "speed", "cuda_graphs", ["off", "on"]))
    if bundle.in_memory and cuda:
        out.append(("resident", "data", "resident", ["on", "off"]))
    if not bundle.in_memory:
        w = max(1, cfg.data.workers)
        out.append(("workers", "data", "workers", sorted({w, 2 * w, 4 * w})))
        if cuda:
            out.append(("decode", "data", "decode", ["gpu", "cpu"]))
    b = cfg.run.batch_size
    out.append(("batch_size", "run", "batch_size", [b, 2 * b]))
    return out


def tune(
    cfg: Config, info: DistInfo, budget_s: float, steps: int = 20, repeats: int = 3, log=print
) -> tuple[Config, list[Trial]]:
    bundle = load_data(cfg.data, cfg.run.seed)
    cuda = info.device.type == "cuda"
    best_cfg = resolve_for(cfg, info.device)
    started = time.perf_counter()
    best, warm = measure(best_cfg, info, bundle, steps, repeats)
    trials = [Trial("start", "resolved defaults", best, warm, "ok")]
    log(f"start: {best:,.0f} img/s")
    for label, section, name, values in candidates(best_cfg, bundle, cuda):
        current = getattr(getattr(best_cfg, section), name)
        for value in values:
            if value == current:
                continue
            if time.perf_counter() - started > budget_s:
                trials.append(Trial(label, str(value), None, 0.0, "skipped", "time budget spent"))
                continue
            trial_cfg = with_switch(best_cfg, section, name, value)
            try:
                rate, warm = measure(trial_cfg, info, bundle, steps, repeats)
            except Exception as e:  # OOM, an unsupported mode: recorded, the search goes on
                trials.append(Trial(label, str(value), None, 0.0, "failed", first_line(e)[:200]))
                log(f"{label}={value}: failed ({trials[-1].error})")
                continue
            kept = rate > best * KEEP_MARGIN
            trials.append(Trial(label, str(value), rate, warm, "kept" if kept else "ok"))
            log(f"{label}={value}: {rate:,.0f} img/s ({rate / best:.2f}x){'  kept' if kept else ''}")
            if kept:
                best, best_cfg = rate, trial_cfg
    return best_cfg, trials


def write_tuned(cfg: Config, trials: list[Trial], out: Path, device: torch.device) -> None:
    env = environment(device)
    header = "".join(f"# {k} = {v}\n" for k, v in env.items())
    header += "# written by `cnnpar tune`; train with: cnnpar train --config " + str(out) + "\n"
    write_text_atomic(out, header + dumps_toml(cfg))
    rows = [{**t.__dict__, **{k: env[k] for k in ("device", "torch", "git_rev", "date")}} for t in trials]
    write_csv_atomic(out.with_suffix(".csv"), rows)


def format_table(trials: list[Trial]) -> str:
    base = trials[0].images_per_s or 1.0
    lines = [f"{'switch':<14} {'value':<28} {'img/s':>10} {'vs start':>9}  status"]
    for t in trials:
        rate = f"{t.images_per_s:,.0f}" if t.images_per_s else "-"
        ratio = f"{t.images_per_s / base:.2f}x" if t.images_per_s else "-"
        lines.append(f"{t.switch:<14} {t.value:<28} {rate:>10} {ratio:>9}  {t.status} {t.error}")
    return "\n".join(lines)
