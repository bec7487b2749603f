"""A real `Trainer.fit` under DDP, observed from inside; tests/dist/test_ddp_metrics_power.py asserts on it.

Run as `torchrun --nproc_per_node=2 tests/dist/power_checks.py OUT_DIR`. Each rank writes OUT_DIR/rank<R>.json
with raw observations and judges nothing. The training data's labels are the sample indices, so the batches a
rank trains on name its samples; the train count is odd (201), so the ranks' shares must be cut to 100 each, and
the batch (128) is larger than a share, so a padded share (101, one sample twice) would reach the step whole.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch

import cnnpar.engine.trainer as trainer_mod
from cnnpar.config import Config, DataConfig, OptimConfig, RunConfig, SpeedConfig
from cnnpar.data.bundle import ArrayDataset, DataBundle
from cnnpar.dist import DistInfo, destroy_distributed, init_distributed
from cnnpar.report.files import write_json_atomic

N_TRAIN, BATCH, EPOCHS = 201, 128, 2
WRITERS = ("save_checkpoint", "write_csv_atomic", "write_json_atomic")


def index_bundle(n: int) -> DataBundle:
    """`n` random 1x8x8 images whose labels are their indices (n classes), no validation split."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (n, 1, 8, 8), dtype=torch.uint8, generator=g)
    return DataBundle(ArrayDataset(x, torch.arange(n)), None, (1, 8, 8), n, (0.5,), (0.25,), "ids")


def spy_writers(calls: list[str]) -> None:
    """Record each call of the Trainer's file writers (by the name the trainer module calls them), then write."""
    for name in WRITERS:
        real = getattr(trainer_mod, name)

        def spy(path, *a, _real=real, _name=name, **k):
            calls.append(f"{_name}:{Path(path).name}")
            return _real(path, *a, **k)

        setattr(trainer_mod, name, spy)


def check_fit(info: DistInfo, work: Path) -> dict:
    """Two epochs of fit(): each step's own (loss sum, correct, labels) before any reduction, the epochs' rows
    the Trainer reports, the sampler's own shard, and which file writers this rank called."""
    cfg = Config(
        data=DataConfig(augment="none", resident="off", workers=0),
        optim=OptimConfig(optimizer="sgd", lr=0.05),
        speed=SpeedConfig(precision="fp32", channels_last="off", compile="off"),
        run=RunConfig(
            epochs=EPOCHS,
            batch_size=BATCH,
            seed=7,
            out_dir=str(work),
            name="fit",
            progress=False,
            tensorboard=False,
        ),
    )
    calls: list[str] = []
    spy_writers(calls)
    trainer = trainer_mod.Trainer(cfg, info, bundle=index_bundle(N_TRAIN), log=lambda *a, **k: None)
    steps: list[dict] = []
    real_step = trainer.train_step

    def step(group):
        loss, right = real_step(group)
        labels = [i for _, y in group for i in y.tolist()]
        steps.append({"epoch": len(trainer.history) + 1, "loss_sum": float(loss), "correct": int(right), "ids": labels})
        return loss, right

    trainer.train_step = step
    shards = {}  # each epoch's shard by the sampler's own rule, from a copy: the Trainer's sampler is left alone
    for epoch in range(1, EPOCHS + 1):
        sampler = copy.copy(trainer.train_loader.sampler)
        sampler.set_epoch(epoch)
        shards[f"epoch{epoch}"] = list(sampler)
    trainer.fit()
    rows = [{k: r[k] for k in ("epoch", "images", "train_loss", "train_acc")} for r in trainer.history]
    return {"steps": steps, "rows": rows, "sampler": shards, "writer_calls": calls}


def main() -> None:
    work = Path(sys.argv[1])
    info = init_distributed("cpu", timeout_s=120)
    try:
        results = {"world_size": info.world_size, "fit": check_fit(info, work)}
    finally:
        destroy_distributed()
    write_json_atomic(work / f"rank{info.rank}.json", results)


if __name__ == "__main__":
    main()
