"""What measuring the data wait costs the host per step (`cnnpar.report.meters.DataWait`).

On CUDA every counted `next(loader)` creates and records two timing events, and finished pairs are
read and dropped as they go. This times `--calls` empty waits with the meter against the same loop
without it, in turn for `--repeats` rounds, and prints microseconds per call, so the cost can be set
against a step (ResNet-18 at 32 px, batch 512, is ~6 ms on an H200). The device is kept busy by a
queued sleep kernel so that, as in training, the events are recorded behind queued work.

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

from cnnpar.report.environment import environment  # noqa: E402
from cnnpar.report.files import write_csv_atomic  # noqa: E402
from cnnpar.report.meters import DataWait, sync  # noqa: E402


def time_calls(device: torch.device, calls: int, meter: DataWait | None) -> float:
    """Seconds per call of an empty `next` wrapped (or not) in the meter's `waiting`."""
    if device.type == "cuda":
        torch.cuda._sleep(int(calls * 20_000))  # queued device work the events land behind (~ cycles, not timed)
    t0 = time.perf_counter()
    for _ in range(calls):
        with meter.waiting() if meter is not None else contextlib.nullcontext():
            pass
    host = time.perf_counter() - t0
    sync(device)
    if meter is not None:
        meter.seconds()  # reads (and drops) what is left, outside the timed loop as in an epoch's end
    return host / calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="CSV to write (with the environment's columns)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    time_calls(device, 100, DataWait(device))  # warm-up: CUDA context, event pool
    bare, metered = [], []
    for _ in range(args.repeats):
        bare.append(time_calls(device, args.calls, None))
        metered.append(time_calls(device, args.calls, DataWait(device)))
        print(f"round: bare {bare[-1] * 1e6:.2f} us, with DataWait {metered[-1] * 1e6:.2f} us a call", flush=True)
    cost_us = (statistics.median(metered) - statistics.median(bare)) * 1e6
    print(f"DataWait costs {cost_us:.2f} us of host time per counted call on {device} (median of {args.repeats})")
    if args.out is not None:
        row = {
            **environment(device),
            "calls": args.calls,
            "repeats": args.repeats,
            "bare_us": round(statistics.median(bare) * 1e6, 3),
            "with_data_wait_us": round(statistics.median(metered) * 1e6, 3),
            "cost_us": round(cost_us, 3),
        }
        write_csv_atomic(args.out, [row])
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
