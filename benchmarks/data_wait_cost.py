"""What measuring the data wait costs the host per step (`cnnpar.report.meters.DataWait`), and its parts.

On CUDA every counted `next(loader)` records two timing events, and finished pairs are read as they go.
This times `--calls` empty waits under each variant below, in turn for `--repeats` rounds, and prints
microseconds per call against the same loop with nothing around it, so the cost can be set against a step
(ResNet-18 at 32 px, batch 512, is ~6 ms on an H200). The device is kept busy by a queued sleep kernel
so that, as in training, the events are recorded behind queued work.

    python benchmarks/data_wait_cost.py --out benchmarks/results/data_wait_cost_h200.csv
    python benchmarks/data_wait_cost.py --device cpu --calls 2000   # host time only: the CPU meter
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cnnpar.errors import main_saying_user_errors, refuse_counts_under_one  # noqa: E402
from cnnpar.report.environment import environment  # noqa: E402
from cnnpar.report.files import write_csv_atomic  # noqa: E402
from cnnpar.report.meters import DataWait, sync  # noqa: E402
from cnnpar.report.ranges import DATA_WAIT, span  # noqa: E402


class UnpooledDataWait(DataWait):
    """DataWait as it was before its pairs were reused: two new events a call, dropped once read."""

    def _read(self, only_finished: bool) -> None:
        super()._read(only_finished)
        self._spare.clear()


@contextlib.contextmanager
def generator_only():
    yield


def new_event_pair():
    for _ in range(2):
        torch.cuda.Event(enable_timing=True).record()
    return contextlib.nullcontext()


def variants(device: torch.device) -> dict:
    """name -> a function returning a fresh context for one call (the meters: one per round)."""
    out = {
        "nothing": lambda: contextlib.nullcontext,
        "generator context": lambda: generator_only,
        "span (NVTX range)": lambda: lambda: span(DATA_WAIT),
    }
    if device.type == "cuda":
        kept = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))

        def record_kept():
            kept[0].record()
            kept[1].record()
            return contextlib.nullcontext()

        out["two new events recorded"] = lambda: new_event_pair
        out["two kept events recorded"] = lambda: record_kept
    out["DataWait, new events a call"] = lambda: UnpooledDataWait(device).waiting
    out["DataWait (cnnpar's)"] = lambda: DataWait(device).waiting
    return out


def time_calls(device: torch.device, calls: int, make) -> float:
    """Seconds per call of an empty `next` wrapped in the context `make()` returns."""
    if device.type == "cuda":
        torch.cuda._sleep(int(calls * 20_000))  # queued device work the events land behind (~ cycles, not timed)
    context = make()
    meter = getattr(context, "__self__", None)
    t0 = time.perf_counter()
    for _ in range(calls):
        with context():
            pass
    host = time.perf_counter() - t0
    sync(device)
    if isinstance(meter, DataWait):
        meter.seconds()  # reads what is left, outside the timed loop as at an epoch's end
    return host / calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="CSV to write (with the environment's columns)")
    args = parser.parse_args(argv)
    # --calls -5 timed no call and printed a cost per call of 0; --repeats 0 had no median to take
    refuse_counts_under_one(("--calls", args.calls), ("--repeats", args.repeats))
    device = torch.device(args.device)
    cases = variants(device)
    for make in cases.values():  # warm-up: CUDA context, allocator, NVTX
        time_calls(device, 100, make)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for r in range(args.repeats):
        for name, make in cases.items():
            times[name].append(time_calls(device, args.calls, make))
        print(f"round {r + 1}: " + ", ".join(f"{n} {t[-1] * 1e6:.2f}" for n, t in times.items()) + " us a call")
    base = statistics.median(times["nothing"])
    rows = []
    for name, t in times.items():
        us = statistics.median(t) * 1e6
        print(f"{name:30s} {us:8.2f} us a call, {us - base * 1e6:8.2f} over nothing (median of {args.repeats})")
        rows.append({"variant": name, "us_a_call": round(us, 3), "us_over_nothing": round(us - base * 1e6, 3)})
    if args.out is not None:
        env = environment(device)
        write_csv_atomic(args.out, [{**env, "calls": args.calls, "repeats": args.repeats, **r} for r in rows])
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main_saying_user_errors(main, "data_wait_cost"))
