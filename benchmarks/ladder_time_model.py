"""The ResNet-50 ladder's wall time on one H200: what the 2026-12-01 run spent, rung by rung, and what
today's rules (cnnpar/bench/timing.py, the in-place rungs of cnnpar/bench/ladder.py) predict for it.

Every figure comes from the stored files of that run (no figure typed in):

- call-b/ladder_resnet50_synthetic/ladder.csv: per rung step_ms, warmup_s, steps_per_repeat, repeats;
- call-b/ladder50.log: the seconds since the command's start at which each rung ended ("[119 s]");
- call-b/tuned_resnet50.csv: the tuner's batch-256 trial, the compile rung's config with CUDA graphs,
  in a new process: its warm-up (cold compile, cuDNN autotuning, capture: an upper bound for the
  compile rung, whose autotuning the channels_last rung did already) and its step.

The old run measured rungs 0-7 only. The model: a rung's first warm-up step = warmup_s - 2 x step
(its two later warm-up steps ran at the steady step time); its set-up (Trainer, loaders, logging)
= its wall time - warm-up - the extra sizing step - repeats x steps x step. The baseline's set-up
also holds the command's start-up (imports, data, peak and FLOP count) and its slow repeats' excess
over the median (the host was loaded: 26-243 img/s), so the start-up printed is an upper bound.
Rungs the old run did not reach: channels_last as bf16 (a new layout autotunes again; its step taken
as bf16's, NHWC being no slower), compile as the tuner's cold start, cuda_graphs and resident on the
compile rung's Trainer (the capture's 3 warm-up iterations + 1 captured step, then the timed steps).

    python benchmarks/ladder_time_model.py
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cnnpar.bench.timing import Timing  # noqa: E402
from cnnpar.errors import UserError, main_saying_user_errors  # noqa: E402

CALL = ROOT / "benchmarks" / "results" / "2026-12-01-h200" / "call-b"
BUDGET_S = 170.0  # the command's --budget-s: nothing starts after it
CAPTURE_STEPS = 4  # graphs.WARMUP_ITERS forward+backwards and the captured one


def ladder_rows() -> list[dict]:
    with (CALL / "ladder_resnet50_synthetic" / "ladder.csv").open() as f:
        return [r for r in csv.DictReader(f) if r["status"] == "ok"]


def rung_ends() -> dict[str, float]:
    ends = {}
    for line in (CALL / "ladder50.log").read_text().splitlines():
        m = re.match(r"bench: rung \d+ (\w+): .*\[(\d+) s\]$", line)
        if m and "..." not in line.split(":", 2)[2][:5]:
            ends[m.group(1)] = float(m.group(2))
    return ends


def tuner_figures() -> tuple[float, float]:
    """(cold warm-up s, step s) of the tuner's batch-256 trial: ResNet-50 at 224, compile default, bf16,
    channels_last, CUDA graphs, in a new process (the rung's own config, cuDNN autotuning included)."""
    with (CALL / "tuned_resnet50.csv").open() as f:
        row = next(r for r in csv.DictReader(f) if (r["switch"], r["value"]) == ("batch_size", "256"))
    return float(row["warmup_s"]), 256 / float(row["images_per_s"])


def repeat_walls(r: dict) -> tuple[float, float, float]:
    """Wall seconds of the fastest, the median and the slowest repeat of a row."""
    images = int(r["steps_per_repeat"]) * int(r["batch_size"])
    return tuple(images / float(r[k]) for k in ("images_per_s_max", "images_per_s", "images_per_s_min"))


def check_stored_files() -> None:
    """The run's three files, there before any is read: a checkout without them ended in a FileNotFoundError
    traceback."""
    for name in ("ladder_resnet50_synthetic/ladder.csv", "ladder50.log", "tuned_resnet50.csv"):
        if not (CALL / name).is_file():
            raise UserError(
                f"{CALL / name}: file not found (the 2026-12-01 run's stored results, read from the checkout)"
            )


def main(argv: list[str] | None = None) -> int:
    # it takes no flags: one given (a --out, say) was ignored without a word; argparse refuses it, exit 2
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    check_stored_files()
    rows, ends = ladder_rows(), rung_ends()
    old_timing = Timing(warmup=int(rows[0]["warmup_steps"]), repeats=int(rows[0]["repeats"]), seconds=1.5)
    new_timing = Timing(seconds=1.5)
    tuned_warm_s, graphed_step_s = tuner_figures()

    measured, previous_end = [], 0.0
    for r in rows:
        step = float(r["step_ms"]) / 1000
        warm = float(r["warmup_s"])
        timed = old_timing.repeats * repeat_walls(r)[1]  # as if every repeat took the median's time
        wall = ends[r["name"]] - previous_end
        previous_end = ends[r["name"]]
        first = warm - (old_timing.warmup - 1) * step
        measured.append({"name": r["name"], "step": step, "first": first, "wall": wall,
                         "setup": wall - warm - step - timed})  # fmt: skip
    build_s = statistics.median(m["setup"] for m in measured[1:])
    # Of 5 repeats, the 2nd lies between the fastest and the median, the 4th between the median and
    # the slowest: the baseline's timed seconds lie between these two sums, its start-up accordingly.
    fast, mid, slow = repeat_walls(rows[0])
    base = measured[0]
    startup_hi = base["setup"] + old_timing.repeats * mid - (2 * fast + 2 * mid + slow) - build_s
    startup_lo = base["setup"] + old_timing.repeats * mid - (fast + 2 * mid + 2 * slow) - build_s
    base["setup"] = build_s
    by = {m["name"]: m for m in measured}
    bf16 = by["bf16"]
    unreached = [
        {"name": "channels_last", "step": bf16["step"], "first": bf16["first"], "setup": build_s},
        # the tuner's trial autotuned cuDNN for bf16 NHWC, which channels_last has done in this process
        {"name": "compile", "step": graphed_step_s, "warm": tuned_warm_s - bf16["first"], "setup": build_s},
        {"name": "cuda_graphs", "step": graphed_step_s, "first": CAPTURE_STEPS * graphed_step_s, "setup": 0.0},
        {"name": "resident", "step": graphed_step_s, "first": graphed_step_s, "setup": build_s},  # new loaders
    ]

    print(
        f"start-up: {startup_lo:.1f}-{startup_hi:.1f} s (the baseline's unknown 2nd and 4th repeats); "
        f"Trainer set-up per rung: {build_s:.1f} s (median)"
    )
    print(f"{'rung':20} {'old s':>7} {'step s':>7} {'warm-up':>9} {'repeats x steps':>16} {'new s':>7} {'ends at':>8}")
    clock = startup_hi
    for m in measured + unreached:
        step = m["step"]
        if "warm" in m:  # the compile rung: the tuner's cold warm-up, less the autotuning done already
            warm_n, warm_s = new_timing.warmup, m["warm"]
        else:
            warm_n, warm_s, last = 0, 0.0, 0.0
            while True:
                last = m["first"] if warm_n == 0 else step
                warm_s += last
                warm_n += 1
                if new_timing.warm(warm_n, last):
                    break
        steps, repeats = new_timing.plan(step)
        new_s = m["setup"] + warm_s + steps * repeats * step
        clock += new_s
        old = f"{m['wall']:.1f}" if "wall" in m else "-"
        late = "" if clock - new_s <= BUDGET_S else "  (starts after the budget)"
        print(
            f"{m['name']:20} {old:>7} {step:7.3f} {warm_n:>3} {warm_s:5.1f}s {repeats:>9} x {steps:<4} "
            f"{new_s:7.1f} {clock:7.0f}s{late}"
        )
    print(
        f"predicted wall time: {clock:.0f} s with the start-up at its upper bound, "
        f"{clock - startup_hi + startup_lo:.0f} s at its lower bound (the old run: "
        f"{ends[rows[-1]['name']]:.0f} s for rungs 0-7, four rungs skipped)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main_saying_user_errors(main, "ladder_time_model"))
