"""The technique ladder: a textbook baseline, then one technique added per rung.

Each rung is the user's base config with the baseline's switches, plus every earlier rung's
change, plus its own. A rung marked `branch` (fp16 + GradScaler) is measured but later rungs do
not build on it; so is bf16 where --precision auto would not train in it (a CPU that emulates bf16).
Rungs that need CUDA are recorded as skipped (with the reason) on the CPU and contribute nothing to
later rungs, so a CPU ladder has fewer measured rows but the same columns.

A rung marked `in_place` (CUDA graphs, resident data) is measured on the Trainer of the rung just
measured before it, when that is the rung it builds on, with its one switch applied in place
(`engine.harness.continue_as`): the same step a new Trainer would run, without a second cold
torch.compile of the model (44 s for ResNet-50 on an H200), which is what lets the ResNet-50 ladder
measure every rung within 3 minutes. Measured alone (`--only cuda_graphs`) such a rung builds its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from cnnpar.config import Config
from cnnpar.data import DataBundle
from cnnpar.data.worker_crash import worker_crash
from cnnpar.dist import DistInfo
from cnnpar.engine.harness import continue_as
from cnnpar.engine.resolved import as_measured
from cnnpar.engine.stops import raise_if_the_stop
from cnnpar.engine.train_step import graphs_blocked_by
from cnnpar.errors import UserError
from cnnpar.host_facts import usable_cores
from cnnpar.models import build_model
from cnnpar.parallel import resolve_for
from cnnpar.parallel.precision import bf16_on
from cnnpar.parallel.stem import has_stem_to_rewrite
from cnnpar.presets import with_overrides
from cnnpar.report.meters import free_device_memory

from .measure import error_text, fresh_trainer, measure_steps
from .timing import Timing

BASELINE = {
    "data": {
        "loader": "textbook",
        "workers": 0,
        "pin_memory": "off",
        "persistent_workers": False,
        "prefetch_stream": "off",
        "resident": "off",
    },
    "speed": {
        "precision": "fp32",
        "channels_last": "off",
        "compile": "off",
        "cuda_graphs": "off",
        "stem_space_to_depth": "off",  # on by default with CUDA since session 13: a rung of its own below
    },
}
GRAPHS = (
    "cnnpar's CUDA graph of the compiled forward+backward, replayed each step (what `cnnpar train` runs on one GPU)"
)


def ladder_workers(base: Config) -> int:
    """The user's --workers when given (0 too: the rung then runs the baseline's 0 workers, as asked), else the
    cores left after the main process (at most 8). -1, the default, is "not given"."""
    if base.data.workers >= 0:
        return base.data.workers
    cores = usable_cores()
    return max(1, min(8, cores - 1))


@dataclass(frozen=True)
class Rung:
    name: str
    technique: str
    changes: Callable[[Config], dict]  # base config -> {section: {field: value}}
    needs_cuda: bool = False
    branch: bool = False  # measured, but later rungs do not build on it
    in_place: bool = False  # measured on the Trainer of the rung it builds on, when that was just measured


RUNGS: tuple[Rung, ...] = (
    Rung(
        "baseline",
        "textbook loader (per-sample float transforms, default collate), no workers, fp32, NCHW, eager",
        lambda b: BASELINE,
    ),
    Rung("workers", "DataLoader worker processes", lambda b: {"data": {"workers": ladder_workers(b)}}),
    Rung("pin_memory", "page-locked host batches", lambda b: {"data": {"pin_memory": "on"}}, needs_cuda=True),
    Rung("persistent_workers", "workers kept alive between epochs", lambda b: {"data": {"persistent_workers": True}}),
    Rung(
        "uint8_device",
        "uint8 batches, one index per batch, normalise/augment on the device",
        lambda b: {"data": {"loader": "fast"}},
    ),
    Rung(
        "prefetch_stream",
        "next batch copied on a side CUDA stream",
        lambda b: {"data": {"prefetch_stream": "on"}},
        needs_cuda=True,
    ),
    Rung("bf16", "bf16 autocast", lambda b: {"speed": {"precision": "bf16"}}),
    Rung(
        "fp16_scaler",
        "fp16 autocast + GradScaler (instead of bf16)",
        lambda b: {"speed": {"precision": "fp16"}},
        branch=True,
    ),
    Rung("channels_last", "NHWC memory format", lambda b: {"speed": {"channels_last": "on"}}),
    Rung(
        "stem_space_to_depth",
        "the stride-2 stem convolution on 2x2 blocks of its input (parallel/stem.py)",
        lambda b: {"speed": {"stem_space_to_depth": "on"}},
        needs_cuda=True,  # its default is on with CUDA only (not measured on a CPU)
    ),
    Rung("compile", "torch.compile (default mode)", lambda b: {"speed": {"compile": "default"}}),
    Rung("cuda_graphs", GRAPHS, lambda b: {"speed": {"cuda_graphs": "on"}}, needs_cuda=True, in_place=True),
    Rung(
        "resident",
        "whole uint8 data set in device memory",
        lambda b: {"data": {"resident": "on"}},
        needs_cuda=True,
        in_place=True,
    ),
)
RUNG_NAMES = tuple(r.name for r in RUNGS)


@dataclass(frozen=True)
class PlannedRung:
    index: int
    rung: Rung
    cfg: Config  # resolved for the device
    builds_on: str  # the rung whose config this one extends ("" for the baseline)
    skip_reason: str  # "" when the rung is to be measured
    branch_note: str = ""  # why a rung that later rungs build on elsewhere is a branch here ("" where it is not)


BUDGET_SPENT = "time budget spent"  # a skipped rung's error where --budget-s left it no time (bench/run reads it)


def parse_only(only: str | None, known: tuple[str, ...], what: str) -> set[str] | None:
    """The names --only picks, each one of `known`; None (every one) where --only was not given."""
    if only is None:
        return None
    names = [n.strip() for n in only.split(",") if n.strip()]
    if not names:  # `--only ""` (an unset shell variable) measured every one, as if --only was left out
        raise UserError(
            f"bench --only {only!r}: names no {what}: expected one or more of {', '.join(known)}, comma-separated "
            f"(leave --only out for every {what})"
        )
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UserError(
            f"bench --only {only}: unknown {what}(s) {', '.join(unknown)}; expected any of {', '.join(known)}"
        )
    return set(names)


def _skip_reason(rung: Rung, cfg: Config, device: torch.device, bundle: DataBundle) -> str:
    if rung.needs_cuda and device.type != "cuda":
        return "needs CUDA"
    if rung.name == "stem_space_to_depth":
        c, h, w = bundle.shape
        if not has_stem_to_rewrite(build_model(cfg.model.name, c, bundle.num_classes, h, w)):
            return "the model has no stride-2 stem convolution of 5x5 or more on at most 4 channels"
    if rung.name == "resident" and not bundle.in_memory:
        return "data is not held in memory (image folder): nothing to make resident"
    if rung.name == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return "this GPU has no bf16"
    if rung.name == "cuda_graphs" and graphs_blocked_by(cfg, distributed=False):
        return f"cnnpar's CUDA graphs do not apply: {graphs_blocked_by(cfg, distributed=False)}"
    return ""


def _branch_note(rung: Rung, device: torch.device) -> str:
    """Where --precision auto trains in fp32 (a CPU that emulates bf16, many times slower), the bf16 rung is measured
    but later rungs do not build on it: built on it, every later rung read as a loss (channels_last and compile at
    0.17x and 0.14x the baseline on a 2-core EPYC: benchmarks/results/ladder_cpu_emulated_bf16/) that `cnnpar train`
    never pays there."""
    if rung.name == "bf16" and not bf16_on(device):
        return "a branch here: --precision auto trains fp32 on this device, so later rungs build on fp32"
    return ""


def plan_ladder(base: Config, device: torch.device, bundle: DataBundle) -> list[PlannedRung]:
    current, parent, plan = base, "", []
    for i, rung in enumerate(RUNGS):
        cfg = with_overrides(current, **rung.changes(base))
        reason = _skip_reason(rung, cfg, device, bundle)
        if reason:
            cfg = current
        # as_measured: the long compiles' "auto" as the rung's Trainer (build_trainer) settles it, so that the row
        # says what ran
        note = "" if reason else _branch_note(rung, device)
        plan.append(PlannedRung(i, rung, as_measured(resolve_for(cfg, device)), parent, reason, note))
        if not reason and not rung.branch and not note:
            current, parent = cfg, rung.name
    return plan


def switches(cfg: Config) -> dict:
    d, s = cfg.data, cfg.speed
    return {
        "loader": d.loader,
        "workers": d.workers,
        "pin_memory": d.pin_memory,
        "persistent_workers": d.persistent_workers,
        "prefetch_stream": d.prefetch_stream,
        "resident": d.resident,
        "precision": s.precision,
        "channels_last": s.channels_last,
        "compile": s.compile,
        "compile_tuning": s.compile_tuning,
        "compile_tiling": s.compile_tiling,
        "stem_space_to_depth": s.stem_space_to_depth,
        "cuda_graphs": s.cuda_graphs,
        "cudnn_benchmark": s.cudnn_benchmark,
    }


def _speedups(row: dict, done: dict[str, dict], plan: dict[str, PlannedRung]) -> None:
    """Speed-up over the baseline and over the nearest measured rung this one builds on."""
    base = done.get("baseline")
    if row["status"] != "ok":
        return
    if base is not None and base["status"] == "ok":
        row["speedup_vs_baseline"] = row["images_per_s"] / base["images_per_s"]
    prev = plan[row["name"]].builds_on
    while prev and (prev not in done or done[prev]["status"] != "ok"):
        prev = plan[prev].builds_on
    if prev:
        row["prev_rung"] = prev
        row["speedup_vs_prev"] = row["images_per_s"] / done[prev]["images_per_s"]


def run_ladder(
    base: Config,
    bundle: DataBundle,
    info: DistInfo,
    timing: Timing,
    meta: dict,
    only: set[str] | None = None,
    log: Callable[[str], None] = print,
    budget_s: float = 0.0,
    started: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    on_row: Callable[[list[dict]], None] = lambda rows: None,
) -> list[dict]:
    """Measure every planned rung in order; a failing rung becomes a failed row and the ladder goes on.
    With `budget_s`, a rung that would start after the budget is spent is skipped, saying so. `on_row` gets the
    rows so far after each one (what a stopped bench still writes)."""
    t0 = clock() if started is None else started
    plan = plan_ladder(base, info.device, bundle)
    by_name = {p.rung.name: p for p in plan}
    done: dict[str, dict] = {}
    rows = []
    selected = [p for p in plan if only is None or p.rung.name in only]
    kept = None  # (rung name, Trainer): the rung just measured, while the next may continue its Trainer
    for p in selected:
        row = {
            **meta,
            "rung": p.index,
            "name": p.rung.name,
            "technique": p.rung.technique + (f" ({p.branch_note})" if p.branch_note else ""),
            "builds_on": p.builds_on,
            "needs": "cuda" if p.rung.needs_cuda else "",
            **switches(p.cfg),
            "status": "skipped" if p.skip_reason else "ok",
            "error": p.skip_reason,
            "continues": "",
        }
        if not p.skip_reason and budget_s and clock() - t0 > budget_s:
            row.update(status="skipped", error=f"{BUDGET_SPENT} ({budget_s:.0f} s, --budget-s)")
        carried = None
        if kept is not None and row["status"] == "ok" and p.rung.in_place and kept[0] == p.builds_on:
            carried = kept[1]
        elif kept is not None:
            kept[1].close()  # its loaders' workers and decoders go now, not at the interpreter's exit
            kept = None
            free_device_memory(info.device)  # what the kept Trainer held: this rung does not continue it
        kept = None
        if row["status"] == "ok":
            log(f"bench: rung {p.index} {p.rung.name}: {p.rung.technique} ...")
            try:
                kept = (p.rung.name, _measure(p, carried, row, bundle, info, timing))
            except Exception as e:  # any failure (out of memory included) is a result, not the end
                raise_if_the_stop(e)  # but a stop's doing (the workers it killed) is the stop: the bench ends
                # a worker killed otherwise (the out-of-memory killer, a decoder's crash): train's one line, not
                # torch's "exited unexpectedly", which said neither the signal nor what to do
                row.update(
                    status="failed",
                    error=error_text(worker_crash(e, p.cfg.data.source, bundle, p.cfg.data.labels) or e),
                )
            carried = None
            if kept is None:
                free_device_memory(info.device)  # after the traceback (and the tensors it holds) is gone
        gflops = float(meta.get("gflops_per_image") or 0.0)
        peak = float(meta.get("peak_tflops") or 0.0)
        if row["status"] == "ok" and gflops and peak:
            row["mfu"] = gflops * 1e9 * row["images_per_s"] / (peak * 1e12)
        done[p.rung.name] = row
        _speedups(row, done, by_name)
        log(f"bench: rung {p.index} {p.rung.name}: {summary_line(row)}  [{clock() - t0:.0f} s]")
        rows.append(row)
        on_row(rows)
    if kept is not None:
        kept[1].close()
    kept = None
    free_device_memory(info.device)  # the last Trainer's memory, before --ddp's processes want the GPU
    return rows


def _measure(p: PlannedRung, carried, row: dict, bundle: DataBundle, info: DistInfo, timing: Timing):
    """Time one rung, on the Trainer it continues (`carried`) or a new one; returns the Trainer."""
    if carried is not None:
        if info.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(info.device)
        continue_as(carried, p.cfg)
        row["continues"] = p.builds_on
        trainer = carried
    else:
        trainer = fresh_trainer(p.cfg, bundle, info)
    try:
        row.update(measure_steps(trainer, timing))
        row["batch_size"] = trainer.cfg.run.batch_size  # the batch this rung ran: its own search's with auto on a GPU
        # a step is one optimizer step of grad_accum batches: step_ms and the rate read with it
        row["grad_accum"] = trainer.cfg.optim.grad_accum
    except BaseException:
        trainer.close()  # a failed rung's Trainer is not kept: its workers and decoders go now
        raise
    return trainer


def summary_line(row: dict) -> str:
    if row["status"] != "ok":
        return f"{row['status']} ({row['error']})"
    speed = f"  x{row['speedup_vs_baseline']:.2f} vs baseline" if "speedup_vs_baseline" in row else ""
    kept = f"  (on {row['continues']}'s trainer)" if row.get("continues") else ""
    return (
        f"{row['images_per_s']:,.0f} img/s ({row['images_per_s_min']:,.0f}-{row['images_per_s_max']:,.0f} "
        f"over {row.get('repeats_run', '')} x {row.get('steps_per_repeat', '')} steps)  {row['step_ms']:.1f} ms/step  "
        f"data wait {100 * row['data_wait_share']:.0f}%  warm-up {row['warmup_s']:.1f} s{speed}{kept}"
    )
