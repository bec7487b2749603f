"""cnnpar's Trainer against a textbook PyTorch loop, side by side on this CPU.

Both train the same `cnn3` on the same MNIST-shaped samples (../shared/data/mnist.npz when
present, else synthetic 1x28x28) with the same batch size, optimizer and learning rate:

- textbook: what tutorials write. A TensorDataset-like data set of uint8 images whose
  `__getitem__` turns one sample into floats (ToTensor-style /255) and normalises it
  (torchvision's Normalize); the default DataLoader (shuffle=True, default collate, no workers);
  fp32, NCHW, no compile; `loss.item()` read every step for a running loss.
- cnnpar: `Trainer` built from `Config()` defaults (only data source, batch size, out_dir and
  "no validation split" set), resolved for the CPU as `cnnpar train` would.

Epochs alternate (textbook, cnnpar, ...; the order flips every round) so that other load on a
shared machine hits both alike; round 0 warms both up and is not counted. cnnpar's epochs run
through `Trainer.train_epoch`, the timed part of `Trainer.fit`. Each configuration's images/s is
the median over the counted rounds (the best round is kept too: on a shared machine it is the
least disturbed one); rows are appended to benchmarks/results/cpu_vs_textbook.csv
with environment facts. Target (issue 2): cnnpar >= 1.5x the textbook loop.

    python benchmarks/cpu_vs_textbook.py [--samples 3200] [--batch-size 64] [--rounds 7] [--variant fp32:off]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout, not whichever cnnpar is installed

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from cnnpar.config import Config, DataConfig, RunConfig, SpeedConfig, asked_lr  # noqa: E402
from cnnpar.dist import DistInfo  # noqa: E402
from cnnpar.engine.trainer import Trainer  # noqa: E402
from cnnpar.errors import UserError, main_saying_user_errors, refuse_counts_under_one  # noqa: E402
from cnnpar.models import build_model  # noqa: E402
from cnnpar.report.environment import environment  # noqa: E402
from cnnpar.report.files import read_csv, write_csv_atomic  # noqa: E402
from cnnpar.report.host import cpu_name  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "cpu_vs_textbook.csv"
MNIST = REPO.parent.parent / "shared" / "data" / "mnist.npz"
MNIST_FALLBACKS = (MNIST, Path("/work/shared/data/mnist.npz"))
TARGET = 1.5


def load_images(samples: int) -> tuple[np.ndarray, np.ndarray, str]:
    for path in MNIST_FALLBACKS:
        if path.is_file():
            with np.load(path) as d:
                return d["x_train"][:samples], d["y_train"][:samples].astype(np.int64), f"mnist.npz[:{samples}]"
    g = np.random.default_rng(0)
    return (
        g.integers(0, 256, (samples, 28, 28), dtype=np.uint8),
        g.integers(0, 10, samples).astype(np.int64),
        f"synthetic 1x28x28 x {samples}",
    )


# ---- (a) the textbook loop, written out plainly -----------------------------------------------


class TextbookMNIST(Dataset):
    """uint8 images held like a TensorDataset; each sample converted and normalised on its own."""

    def __init__(self, x: np.ndarray, y: np.ndarray, mean: float, std: float) -> None:
        from torchvision import transforms

        self.x = torch.from_numpy(x)
        self.y = torch.from_numpy(y)
        self.normalize = transforms.Normalize((mean,), (std,))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        img = self.x[i].unsqueeze(0).float().div(255.0)  # ToTensor: HxW uint8 -> 1xHxW float in [0, 1]
        return self.normalize(img), self.y[i]


class TextbookLoop:
    def __init__(self, x, y, mean: float, std: float, batch_size: int, cfg: Config) -> None:
        torch.manual_seed(cfg.run.seed)
        self.model = build_model("cnn3", 1, 10, 28)
        opt = cfg.optim
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=asked_lr(opt), weight_decay=opt.weight_decay)
        self.loader = DataLoader(TextbookMNIST(x, y, mean, std), batch_size=batch_size, shuffle=True)

    def epoch(self) -> dict:
        self.model.train()
        running, images = 0.0, 0
        t0 = time.perf_counter()
        for data, target in self.loader:
            self.optimizer.zero_grad()
            output = self.model(data)
            loss = F.cross_entropy(output, target)
            loss.backward()
            self.optimizer.step()
            running += loss.item()
            images += len(target)
        seconds = time.perf_counter() - t0
        return {"images_per_s": images / seconds, "epoch_s": seconds, "train_loss": running / len(self.loader)}


# ---- (b) cnnpar ------------------------------------------------------------------------------------


def build_cnnpar(npz: Path, batch_size: int, out_dir: Path, name: str, speed: SpeedConfig) -> Trainer:
    cfg = Config(
        data=DataConfig(source=str(npz), val_fraction=0.0),
        speed=speed,
        run=RunConfig(batch_size=batch_size, out_dir=str(out_dir), name=name, progress=False),
    )
    return Trainer(cfg, DistInfo(0, 0, 1, torch.device("cpu")), log=lambda *a, **k: None)


class CnnparEpochs:
    def __init__(self, trainer: Trainer) -> None:
        self.trainer, self.n = trainer, 0

    def epoch(self) -> dict:
        self.n += 1
        return self.trainer.train_epoch(self.n)


def parse_variants(texts: list[str]) -> list[tuple[str, SpeedConfig]]:
    """Each --variant PRECISION:CHANNELS_LAST as (its runner's name, its speed settings), all checked before the
    first epoch: a malformed one ended in a ValueError traceback, an unknown precision in a ConfigError's."""
    out = []
    for text in texts:
        precision, sep, channels_last = text.partition(":")
        if not sep or ":" in channels_last:
            raise UserError(f"--variant {text}: expected PRECISION:CHANNELS_LAST, e.g. fp32:off")
        try:
            speed = SpeedConfig(precision=precision, channels_last=channels_last, compile="off")
        except UserError as e:
            raise UserError(f"--variant {text}: {e}") from None
        out.append((f"cnnpar-{precision}-{'nhwc' if channels_last == 'on' else 'nchw'}", speed))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=3200)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=7, help="counted rounds, after one warm-up round")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="PRECISION:CHANNELS_LAST",
        help="also run cnnpar with these speed settings, e.g. fp32:off (its data path alone); repeatable",
    )
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads for both (0: torch's default)")
    args = ap.parse_args()
    # each 0 or less ended in a traceback (--rounds 0: no median to take, after the warm-up round had run)
    refuse_counts_under_one(("--samples", args.samples), ("--batch-size", args.batch_size), ("--rounds", args.rounds))
    variants = parse_variants(args.variant)
    if args.threads:
        torch.set_num_threads(args.threads)

    x, y, origin = load_images(args.samples)
    mean, std = float(x.mean() / 255.0), float(x.std() / 255.0)
    print(f"data: {origin}; batch {args.batch_size}; torch threads {torch.get_num_threads()}; load {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        npz = Path(tmp) / "train.npz"
        np.savez(npz, x_train=x, y_train=y)
        runners = {"textbook": TextbookLoop(x, y, mean, std, args.batch_size, Config())}
        cnnpar = build_cnnpar(npz, args.batch_size, Path(tmp) / "runs", "defaults", SpeedConfig())
        runners["cnnpar"] = CnnparEpochs(cnnpar)
        for name, speed in variants:
            runners[name] = CnnparEpochs(build_cnnpar(npz, args.batch_size, Path(tmp) / "runs", name, speed))
        results: dict[str, list[dict]] = {k: [] for k in runners}
        for r in range(args.rounds + 1):
            order = list(runners) if r % 2 == 0 else list(reversed(runners))
            for key in order:
                row = runners[key].epoch()
                label = "warm-up" if r == 0 else f"round {r}"
                print(f"{label:8s} {key:18s} {row['images_per_s']:8.0f} img/s  loss {row['train_loss']:.4f}")
                if r > 0:
                    results[key].append(row)

    resolved = cnnpar.cfg.speed
    env = {**environment(torch.device("cpu"), 1), "cpu_model": cpu_name()}
    base = statistics.median(row["images_per_s"] for row in results["textbook"])
    base_best = max(row["images_per_s"] for row in results["textbook"])
    rows = []
    for key, runs in results.items():
        speed = statistics.median(row["images_per_s"] for row in runs)
        best = max(row["images_per_s"] for row in runs)
        if key == "textbook":
            setting = "fp32, NCHW, no compile, per-sample float transforms, default DataLoader"
        elif key == "cnnpar":
            setting = (
                f"Config() defaults: {resolved.precision}, channels_last {resolved.channels_last}, "
                f"compile {resolved.compile}, loader {cnnpar.cfg.data.loader}"
            )
        else:
            setting = f"cnnpar with {key.removeprefix('cnnpar-')}, no compile"
        rows.append(
            {
                "benchmark": "cpu_vs_textbook",
                "configuration": key,
                "setting": setting,
                "model": "cnn3",
                "data": origin,
                "samples": args.samples,
                "batch_size": args.batch_size,
                "rounds": args.rounds,
                "images_per_s": round(speed, 1),
                "images_per_s_rounds": " ".join(f"{row['images_per_s']:.0f}" for row in runs),
                "ratio_vs_textbook": round(speed / base, 3),
                "best_images_per_s": round(best, 1),
                "best_ratio_vs_textbook": round(best / base_best, 3),
                "target_ratio": TARGET if key == "cnnpar" else "",
                "torch_threads": torch.get_num_threads(),
                "load_avg_1m": round(os.getloadavg()[0], 2),
                **env,
            }
        )
        print(f"{key:18s} median {speed:6.0f} img/s x{speed / base:.2f}, best {best:6.0f} x{best / base_best:.2f}")
    previous = read_csv(RESULTS) if RESULTS.is_file() else []
    columns = list(dict.fromkeys([*(previous[0].keys() if previous else []), *rows[0].keys()]))
    write_csv_atomic(RESULTS, previous + rows, columns)
    ratio = rows[1]["ratio_vs_textbook"]
    verdict = "meets" if ratio >= TARGET else "MISSES"
    print(f"cnnpar / textbook = {ratio:.2f} ({verdict} the {TARGET}x target) -> {RESULTS.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main_saying_user_errors(main, "cpu_vs_textbook"))
