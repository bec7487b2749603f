"""`--batch-size auto` against a fixed batch, as a user runs them: images/s and time to an accuracy.

Each case is the same `cnnpar train` command in a process of its own (issue 15's example:
ResNet-18 on CIFAR-10), differing only in the batch flag. From each run's metrics.csv: the median
images/s of epochs 2 and later, and the training time (sum of epoch_s, evaluation not counted) up
to the first epoch whose validation accuracy reaches --target; the chosen batch and lr come from
the run's config.toml. Rows go to --out with the GPU, torch version and git revision.

    python benchmarks/batch_auto.py --data .devdata/cifar10.npz --model resnet18 --epochs 10 \
        --cases 64,auto --target 0.80 --out benchmarks/results/batch_auto.csv
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cnnpar.checkout import env_importing_this_checkout  # noqa: E402
from cnnpar.config import load_toml  # noqa: E402
from cnnpar.data.sources import BUILT_IN  # noqa: E402
from cnnpar.errors import UserError, main_saying_user_errors  # noqa: E402
from cnnpar.report.environment import environment  # noqa: E402
from cnnpar.report.files import read_csv, write_csv_atomic  # noqa: E402

COLUMNS = [
    "case", "batch_size", "lr", "images_per_s", "data_wait_share", "epochs", "best_val_acc", "target",
    "epoch_reached", "train_s_to_target", "train_s", "process_s", "search_line", "command",
    "device", "torch", "git_rev", "date", "world_size",
]  # fmt: skip


def run_case(case: str, args, work: Path) -> dict:
    name = f"batch-{case}"
    cmd = [sys.executable, "-m", "cnnpar", "train", "--data", args.data, "--model", args.model]
    cmd += ["--epochs", str(args.epochs), "--out-dir", str(work), "--name", name, "--no-progress"]
    cmd += [] if case == "auto" else ["--batch-size", case]
    print("===", " ".join(cmd[2:]), flush=True)
    t0 = time.perf_counter()
    # this script's checkout, as the parent's own imports: from outside the repository root the child had trained
    # an installed cnnpar while the row recorded this checkout's git revision
    p = subprocess.run(cmd, capture_output=True, text=True, env=env_importing_this_checkout())
    process_s = time.perf_counter() - t0
    print(p.stdout[-3000:], p.stderr[-2000:] if p.returncode else "", flush=True)
    if p.returncode == 2:  # cnnpar train refused its input (printed above): the user's to fix, as ours would be
        said = (p.stderr.strip().splitlines() or [""])[-1]
        raise UserError(f"{name}: cnnpar train exited 2: {said}")
    if p.returncode:
        raise SystemExit(f"{name}: exit {p.returncode}")
    rows = read_csv(work / name / "metrics.csv")
    cfg = load_toml(work / name / "config.toml")
    rates = [float(r["images_per_s"]) for r in rows[1:]] or [float(rows[0]["images_per_s"])]
    waits = [float(r["data_wait_share"]) for r in rows[1:]] or [float(rows[0]["data_wait_share"])]
    reached, elapsed = "", 0.0
    for r in rows:
        elapsed += float(r["epoch_s"])
        if r.get("val_acc") not in (None, "") and float(r["val_acc"]) >= args.target:
            reached = int(r["epoch"])
            break
    search = next((ln for ln in p.stdout.splitlines() if ln.startswith("batch size auto:")), "")
    return {
        "case": case,
        "batch_size": cfg.run.batch_size,
        "lr": cfg.optim.lr,
        "images_per_s": round(statistics.median(rates), 1),
        "data_wait_share": round(statistics.median(waits), 3),
        "epochs": len(rows),
        "best_val_acc": max(float(r["val_acc"]) for r in rows if r.get("val_acc") not in (None, "")),
        "target": args.target,
        "epoch_reached": reached,
        "train_s_to_target": round(elapsed, 2) if reached else "",
        "train_s": round(sum(float(r["epoch_s"]) for r in rows), 2),
        "process_s": round(process_s, 1),
        "search_line": search,
        "command": " ".join(cmd[2:]),
    }


def check_inputs(data: str, cases: str) -> list[str]:
    """The cases, each a batch size or auto; --data there. Refused before the first case trains: a missing
    --data ended only in the first child's failure, a bad case after the cases before it had trained."""
    if data not in BUILT_IN and not Path(data).exists():
        raise UserError(f"--data {data}: no such file or folder (or use 'digits' or 'synthetic')")
    out = [c.strip() for c in cases.split(",")]
    for case in out:
        if case != "auto" and not (case.isdigit() and int(case) > 0):
            raise UserError(f"--cases {cases}: {case!r}: expected a batch size of 1 or more, or auto")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--cases", default="64,auto", help="comma-separated: batch sizes and/or auto")
    ap.add_argument("--target", type=float, default=0.80, help="validation accuracy to time")
    ap.add_argument("--out", default="benchmarks/results/batch_auto.csv")
    args = ap.parse_args()
    cases = check_inputs(args.data, args.cases)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    env = environment(device, world_size=1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            row = {**run_case(case, args, Path(tmp)), **{k: env[k] for k in ("device", "torch", "git_rev")}}
            row.update(date=env["date"], world_size=1)
            rows.append(row)
            print(
                f"{row['case']}: batch {row['batch_size']}, lr {row['lr']:.3g}, {row['images_per_s']:,.0f} img/s, "
                f"wait {100 * row['data_wait_share']:.0f}%, best val {100 * row['best_val_acc']:.2f}%, "
                f"{100 * args.target:.0f}% at epoch {row['epoch_reached'] or '-'} "
                f"after {row['train_s_to_target'] or '-'} s of training",
                flush=True,
            )
            write_csv_atomic(Path(args.out), rows, COLUMNS)  # after each case: a cut-off run keeps what finished
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main_saying_user_errors(main, "batch_auto"))  # a missing --data: one line, exit 2
