"""The cifar10-speed recipe's new switches, measured on a CPU on a slice of the real CIFAR-10.

A 2-core CPU trains fastnet at roughly 50-60 images/s, so this is a small experiment: the first
--train images of the JPEG-q75 CIFAR-10 training set, the first --test test images, a few epochs,
one seed per variant. It shows whether each switch runs and which way it moves accuracy at this
scale, not what it does in a full 10-epoch GPU run (the lead measures that).

Variants (each starts from the cifar10-speed preset and changes only what it names):
- old: the preset as it was (crop+flip, lr 0.2, wd 5e-4, no averaging, flip TTA)
- old+avg: old plus lookahead weight averaging
- old+altflip: old with translate+altflip instead of crop+flip, flip+translate TTA
- new: the preset as it is now (airbench94's hyper-parameters and every switch)

Learning rates are scaled linearly from the preset's batch of 1024 to --batch-size.

    python benchmarks/prepare_cifar10.py            # once: .devdata/cifar10.npz
    python benchmarks/speedrun_cpu.py --train 3000 --test 1000 --epochs 3 --batch-size 256
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from cnnpar.config import to_dict
from cnnpar.dist import DistInfo
from cnnpar.engine.trainer import Trainer
from cnnpar.errors import UserError, main_saying_user_errors
from cnnpar.presets import get_preset, with_overrides
from cnnpar.report.environment import environment
from cnnpar.report.files import write_csv_atomic, write_json_atomic

OLD = dict(
    data={"augment": "crop+flip"},
    optim={
        "lr": 0.2,
        "weight_decay": 5e-4,
        "bias_lr_scale": 1.0,
        "warmup": 0.1,
        "ema": 0.0,
        "lookahead": False,
        "whiten_bias_epochs": 0,
        "whiten_frozen": False,
    },
    run={"tta_level": "flip"},
)
AVG = {"ema": 0.95, "ema_every": 5, "ema_start": 0.3, "ema_warmup": 3.0, "lookahead": True}


def variants() -> dict[str, dict]:
    return {
        "old": OLD,
        "old+avg": {**OLD, "optim": {**OLD["optim"], **AVG}},
        "old+altflip": {**OLD, "data": {"augment": "translate+altflip"}, "run": {"tta_level": "flip+translate"}},
        "new": {},
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=".devdata/cifar10.npz")
    ap.add_argument("--train", type=int, default=3000)
    ap.add_argument("--test", type=int, default=1000)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--only", default="", help="comma-separated variant names")
    ap.add_argument("--out", default="benchmarks/results/speedrun_cpu")
    args = ap.parse_args()
    if not Path(args.data).is_file():  # before --out is made; np.load ended in a FileNotFoundError traceback
        raise UserError(f"--data {args.data}: file not found (expected a CIFAR-10 npz: benchmarks/prepare_cifar10.py)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    src = np.load(args.data)
    subset = Path(".devdata/speedrun_subset.npz")  # regenerated from --data, never committed
    np.savez(
        subset,
        x_train=src["x_train"][: args.train],
        y_train=src["y_train"][: args.train],
        x_test=src["x_test"][: args.test],
        y_test=src["y_test"][: args.test],
    )
    info = DistInfo(0, 0, 1, torch.device("cpu"))
    rows = []
    names = [n for n in variants() if not args.only or n in args.only.split(",")]
    for name in names:
        base = get_preset("cifar10-speed")
        change = variants()[name]
        lr = change.get("optim", {}).get("lr", base.optim.lr) * args.batch_size / 1024
        cfg = with_overrides(base, **change)
        cfg = with_overrides(
            cfg,
            data={"source": str(subset), "resident": "off"},
            optim={"lr": lr},
            speed={"precision": "fp32", "compile": "off"},  # emulated bf16 is slower on this CPU
            run={
                "epochs": args.epochs,
                "batch_size": args.batch_size,
                "eval_every": args.epochs,
                "out_dir": ".devdata/speedrun_runs",  # checkpoints: git-ignored, not results
                "name": name,
                "progress": False,
            },
        )
        t0 = time.perf_counter()
        result = Trainer(cfg, info).fit()
        wall = time.perf_counter() - t0
        last = result.history[-1]
        row = {
            "variant": name,
            "val_acc": round(last["val_acc"], 4),
            "val_loss": round(last["val_loss"], 4),
            "train_acc": round(last["train_acc"], 4),
            "train_images": args.train,
            "test_images": args.test,
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "lr": lr,
            "augment": cfg.data.augment,
            "ema": cfg.optim.ema,
            "lookahead": cfg.optim.lookahead,
            "tta": cfg.run.tta_in_effect,
            "wall_s": round(wall, 1),
            **environment(info.device, 1),
        }
        print(row)
        rows.append(row)
        write_json_atomic(out / f"{name}.json", {"row": row, "config": to_dict(cfg), "history": result.history})
    suffix = "" if not args.only else "_" + args.only.replace(",", "_")
    write_csv_atomic(out / f"speedrun_cpu{suffix}.csv", rows, list(rows[0]))
    subset.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main_saying_user_errors(main, "speedrun_cpu"))
