"""Options that each work alone, together: a run stopped in epoch 2 and resumed ends bit-identical to one that ran
straight, with the optimizer steps, images and evaluated samples the documented rules give. The cases are the pairs
a pairwise sweep of `cnnpar train` on the CPU ran that no other test holds (accumulation, clipping, bf16,
channels_last off, Muon, the weight average, --eval-every, the textbook loader, a partial or capped last batch and
--max-steps, each beside a resume); tests/integration/test_resume_rng.py holds the defaults."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from cnnpar.config import Config, DataConfig, OptimConfig, RunConfig, SpeedConfig
from cnnpar.dist import DistInfo
from cnnpar.engine import fault
from cnnpar.engine.trainer import Trainer
from cnnpar.report.files import read_csv

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = DistInfo(0, 0, 1, torch.device("cpu"))
TRAIN, VAL = 96, 24  # synthetic 120: a seeded 20% hold-out
SAME = ["epoch", "train_loss", "train_acc", "val_loss", "val_acc", "lr"]  # not the timings

CASES = {
    "accum+clip+partial batch dropped+sgd smoothing": dict(
        batch=20, optim=dict(grad_accum=3, grad_clip=0.5, optimizer="sgd", label_smoothing=0.1)
    ),
    "bf16+channels_last off+muon+ema+eval every 2": dict(
        batch=16, speed=dict(precision="bf16", channels_last="off"), optim=dict(optimizer="muon", ema=0.9), every=2
    ),
    "one partial batch+accum capped+textbook": dict(batch=256, optim=dict(grad_accum=3), data=dict(loader="textbook")),
    "max steps+accum+ema": dict(batch=8, optim=dict(grad_accum=3, ema=0.9), max_steps=2),
}


def _cfg(tmp_path: Path, name: str, case: dict, resume: str = "") -> Config:
    return Config(
        data=DataConfig(
            source="synthetic", synthetic_samples=TRAIN + VAL, image_shape="1x16x16", workers=0, **case.get("data", {})
        ),
        optim=OptimConfig(**case.get("optim", {})),
        speed=SpeedConfig(device="cpu", compile="off", **{"precision": "fp32", **case.get("speed", {})}),
        run=RunConfig(
            epochs=2,
            batch_size=case["batch"],
            max_steps=case.get("max_steps", 0),
            eval_every=case.get("every", 1),
            out_dir=str(tmp_path),
            name=name,
            resume=resume,
            progress=False,
            tensorboard=False,
        ),
    )


def _expected(case: dict) -> tuple[int, int]:
    """(optimizer steps, images) an epoch: a partial last batch is dropped unless it is the only one, and a step
    takes --grad-accum micro-batches (capped to the epoch's), the last step of an epoch fewer."""
    b, k = case["batch"], case.get("optim", {}).get("grad_accum", 1)
    micro = TRAIN // b if TRAIN >= b else 1
    steps, images = math.ceil(micro / min(k, micro)), min(TRAIN, micro * b)
    if case.get("max_steps"):
        steps, images = min(steps, case["max_steps"]), min(images, case["max_steps"] * k * b)
    return steps, images


def _fit(cfg: Config) -> None:
    Trainer(cfg, CPU, log=lambda *a, **k: None).fit()


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_run_stopped_in_epoch_2_and_resumed_is_bit_identical_to_one_run_straight(tmp_path, monkeypatch, case):
    _fit(_cfg(tmp_path, "straight", case))
    with monkeypatch.context() as m, pytest.raises(RuntimeError, match="injected fault"):
        m.setattr(fault, "_plan", lambda: (0, 2))  # as CNNPAR_FAULT_RAISE_AT_EPOCH=2: raise half-way through epoch 2
        _fit(_cfg(tmp_path, "stopped", case))
    _fit(_cfg(tmp_path, "stopped", case, resume=str(tmp_path / "stopped")))

    runs = [
        torch.load(tmp_path / n / "ckpt" / "last.pt", map_location="cpu", weights_only=True)
        for n in ("straight", "stopped")
    ]
    rows = [[{k: r[k] for k in SAME} for r in read_csv(tmp_path / n / "metrics.csv")] for n in ("straight", "stopped")]
    assert rows[0] == rows[1]
    assert [k for k in runs[0]["model"] if not torch.equal(runs[0]["model"][k], runs[1]["model"][k])] == []
    steps, images = _expected(case)
    for state in runs:
        assert state["scheduler"]["last_epoch"] == 2 * steps
        assert [h["images"] for h in state["history"]] == [images, images]
        evaluated = [h["epoch"] for h in state["history"] if h.get("val_count")]
        assert evaluated == [e for e in (1, 2) if e % case.get("every", 1) == 0 or e == 2]
        assert all(
            h["val_count"] == VAL and math.isfinite(h["val_loss"]) for h in state["history"] if h.get("val_count")
        )
