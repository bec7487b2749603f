"""torch.profiler over a bounded number of steps: a Chrome/Perfetto trace and top-operator tables.

The schedule skips `wait` steps (start-up, compilation), runs `warmup` steps with the profiler on
but discarding (its own start-up cost), then records `active` steps. The trace opens in
https://ui.perfetto.dev or chrome://tracing; the tables rank operators by self time on the
device (CUDA) or the host (CPU) and list the memory they allocated.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from cnnpar.report.files import write_errors_explained, write_text_atomic
from cnnpar.report.ranges import ABSENT_BECAUSE, STEP_RANGES, span
from cnnpar.report.trace_reading import load_events, report, summarize

# Each rank's files, in ProfileFiles' order
RANK_FILES = (
    "trace_rank{rank}.json",
    "top_ops_rank{rank}.txt",
    "top_ops_rank{rank}.md",
    "where_time_went_rank{rank}.txt",
)


# a profile's file that cannot be written (a full disk): `cnnpar profile` removes what it wrote (doctor/profile.py's
# output_folder), so the same command can run again into the same --report-dir
NOT_WRITTEN = (
    "expected room for the profile's files (free disk space, a higher file size limit); none of them are kept, so "
    "the same command can run again"
)


@dataclass
class ProfileFiles:
    trace: Path
    table_txt: Path
    table_md: Path
    reading: Path  # where the recorded steps' time went (trace_reading)


def all_threads_options() -> dict:
    """torch.profiler.profile keyword arguments that record every thread's operators and ranges, not
    only the calling thread's (a GPU decoder's feeder threads, the autograd thread), where this torch
    can (`profile_all_threads`); {} where it cannot. CUDA runtime calls and kernels are recorded from
    every thread either way."""
    try:
        return {"experimental_config": torch._C._profiler._ExperimentalConfig(profile_all_threads=True)}
    except (TypeError, AttributeError):
        return {}


def one_cycle_options() -> dict:
    """torch.profiler.profile keyword arguments for a capture of one cycle (cnnpar's are: no schedule, or one
    `repeat=1`): `acc_events=True`, which keeps events across cycles and so changes nothing here, where this torch
    has it. Without it torch 2.11 warned "Profiler clears events at the end of each cycle..." in the middle of
    `cnnpar doctor`'s output on a GPU (the GPU idle share's capture)."""
    from torch.profiler import profile

    return {"acc_events": True} if "acc_events" in inspect.signature(profile).parameters else {}


@contextlib.contextmanager
def every_thread(enabled: bool = True):
    """Yields the torch.profiler.profile keyword arguments for recording every thread (`all_threads_options`,
    {} when not `enabled` or not possible), with cnnpar's own ranges (`span`) recorded on every thread
    meanwhile; `with every_thread() as extra: with profile(..., **extra): ...`."""
    extra = all_threads_options() if enabled else {}
    span.all_threads = bool(extra)  # the ranges of the other threads too
    try:
        yield extra
    finally:
        span.all_threads = False


def _attr(evt, *names: str) -> float:
    """Event fields were renamed cuda -> device across torch versions; read whichever exists."""
    for n in names:
        if hasattr(evt, n):
            return float(getattr(evt, n) or 0.0)
    return 0.0


def _self_device_us(e) -> float:
    return _attr(e, "self_device_time_total", "self_cuda_time_total")


def _device_us(e) -> float:
    return _attr(e, "device_time_total", "cuda_time_total")


def _self_device_mem(e) -> float:
    return _attr(e, "self_device_memory_usage", "self_cuda_memory_usage")


def top_ops_markdown(averages, on_device: bool, active_steps: int, row_limit: int = 25) -> str:
    """Top operators as a Markdown table, plus the step-phase ranges (times per step, in ms)."""
    key = _self_device_us if on_device else (lambda e: e.self_cpu_time_total)
    # ProfilerStep* is torch.profiler's range around a whole step, not an operator: ranked, it tops the table
    ops = (e for e in averages if e.key not in STEP_RANGES and not e.key.startswith("ProfilerStep"))
    rows = sorted(ops, key=key, reverse=True)[:row_limit]
    per = 1e-3 / max(1, active_steps)
    head = (
        "| operator | calls | self CPU ms | CPU total ms | self CUDA ms | CUDA total ms | self CPU MB | self CUDA MB |"
    )
    lines = [
        f"Top {len(rows)} operators by self {'CUDA' if on_device else 'CPU'} time, per step "
        f"(averaged over {active_steps} recorded steps).",
        "",
        head,
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for e in rows:
        lines.append(
            f"| `{e.key[:80]}` | {e.count / max(1, active_steps):g} | {e.self_cpu_time_total * per:.3f} | "
            f"{e.cpu_time_total * per:.3f} | {_self_device_us(e) * per:.3f} | {_device_us(e) * per:.3f} | "
            f"{e.self_cpu_memory_usage / 2**20 / max(1, active_steps):.1f} | "
            f"{_self_device_mem(e) / 2**20 / max(1, active_steps):.1f} |"
        )
    phases = {e.key: e for e in averages if e.key in STEP_RANGES}
    if phases:
        lines += ["", "Step phases (cnnpar ranges), per step:", "", "| range | calls | CPU ms | CUDA ms |"]
        lines.append("| --- | ---: | ---: | ---: |")
        for name in STEP_RANGES:
            if name in phases:
                e = phases[name]
                lines.append(
                    f"| {name} | {e.count / max(1, active_steps):g} | {e.cpu_time_total * per:.3f} | "
                    f"{_device_us(e) * per:.3f} |"
                )
        absent = [name for name in STEP_RANGES if name not in phases]
        if absent:
            lines += ["", "Not recorded:", ""]
            lines += [f"- {name}: {ABSENT_BECAUSE.get(name, 'not run in these steps')}" for name in absent]
    return "\n".join(lines) + "\n"


def profile_steps(
    step: Callable[[int], None],
    out_dir: str | Path,
    rank: int,
    on_cuda: bool,
    wait: int = 1,
    warmup: int = 2,
    active: int = 5,
    row_limit: int = 25,
    all_threads: bool = False,
) -> ProfileFiles:
    """Run `step(i)` wait + warmup + active times under torch.profiler and write this rank's files.
    `all_threads`: record the operators of every thread, not only this one's (`all_threads_options`)."""
    from torch.profiler import ProfilerActivity, profile, schedule

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = ProfileFiles(*(out / name.format(rank=rank) for name in RANK_FILES))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    sort_key = "self_device_time_total" if on_cuda else "self_cpu_time_total"

    def on_ready(prof) -> None:
        with write_errors_explained(files.trace, NOT_WRITTEN):
            prof.export_chrome_trace(str(files.trace))
        averages = prof.key_averages()
        try:
            text = averages.table(sort_by=sort_key, row_limit=row_limit)
        except (AttributeError, KeyError):  # older torch names the column self_cuda_time_total
            text = averages.table(sort_by="self_cuda_time_total", row_limit=row_limit)
        with write_errors_explained(files.table_txt, NOT_WRITTEN):
            write_text_atomic(files.table_txt, text + "\n")
        with write_errors_explained(files.table_md, NOT_WRITTEN):
            write_text_atomic(files.table_md, top_ops_markdown(averages, on_cuda, active, row_limit))
        names = {t.native_id: t.name for t in threading.enumerate()}
        reading = report(summarize(load_events(files.trace), names))
        with write_errors_explained(files.reading, NOT_WRITTEN):
            write_text_atomic(files.reading, f"{active} recorded steps; times are totals over them\n{reading}\n")

    with every_thread(all_threads) as extra:
        with profile(
            activities=activities,
            schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
            on_trace_ready=on_ready,
            profile_memory=True,
            **one_cycle_options(),
            **extra,
        ) as prof:
            for i in range(wait + warmup + active):
                step(i)
                prof.step()
    return files
