"""summary.json's fields against the run's own metrics.csv, --grad-clip through the CLI to the step, and the order
the Trainer trains the samples in each epoch: real in-process CPU runs of a few steps. The validation accuracies
are scripted (Trainer.evaluate, as tests/integration/test_best_checkpoint.py does), so which epoch is best does
not hang on how a tiny model happens to train."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from cnnpar.engine.checkpoint import BEST, LAST
from cnnpar.report.files import read_csv
from tests.integration.test_best_checkpoint import ARGS, data

pytestmark = pytest.mark.usefixtures("one_thread")

ACCURACIES = {1: 0.6, 2: 0.3, 3: 0.45}  # the first epoch is best, the last is neither best nor worst


def train(tmp_path: Path, name: str, *more: str) -> Path:
    from cnnpar.cli import main

    assert main(["train", *ARGS, "--data", str(data(tmp_path)), "--out-dir", str(tmp_path), "--name", name, *more]) == 0
    return tmp_path / name


@pytest.fixture(scope="module")
def three_epochs(tmp_path_factory) -> Path:
    """A 3-epoch run whose validation accuracies are ACCURACIES."""
    from cnnpar.engine.trainer import Trainer

    tmp_path = tmp_path_factory.mktemp("summary")
    real = Trainer.evaluate

    def evaluate(self):
        return {**real(self), "val_acc": ACCURACIES[len(self.history) + 1]}

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Trainer, "evaluate", evaluate)
        return train(tmp_path, "r", "--epochs", "3")


def test_the_best_epoch_is_the_one_with_the_highest_validation_accuracy_not_the_last(three_epochs):
    summary = json.loads((three_epochs / "summary.json").read_text())
    assert (summary["best_epoch"], summary["best_val_acc"]) == (1, 0.6)
    assert summary["final_val_acc"] == 0.45
    assert summary["strategy"] == "ddp" and "horovod" not in summary  # tells it from a Horovod run
    assert "# strategy = ddp\n" in (three_epochs / "config.toml").read_text()
    assert summary["best_ckpt_epoch"] == 1
    best = torch.load(three_epochs / "ckpt" / BEST, map_location="cpu", weights_only=True)
    assert best["epoch"] == 1


def test_the_summary_rate_is_the_mean_of_the_epochs_after_the_warm_up(three_epochs):
    summary = json.loads((three_epochs / "summary.json").read_text())
    rows = read_csv(three_epochs / "metrics.csv")
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3]
    rates = [float(r["images_per_s"]) for r in rows]
    assert summary["images_per_s_epochs"] == [2, 3]  # the first epoch (compile, workers starting) left out
    assert summary["images_per_s"] == pytest.approx((rates[1] + rates[2]) / 2, rel=1e-12)
    assert summary["attempt_epochs"] == [1, 3]


def params(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "ckpt" / LAST, map_location="cpu", weights_only=True)["model"]


def test_grad_clip_reaches_the_trainers_step_and_changes_the_weights(tmp_path, monkeypatch):
    """--grad-clip 1e-3, far below a fresh model's gradient norm, clips every step to that norm and trains other
    weights than no clip; a limit far above the norm trains the very weights of no clip (so the runs are
    deterministic, and the difference is the clip's)."""
    real_clip = torch.nn.utils.clip_grad_norm_
    clips: list[tuple[float, float, float]] = []  # (max_norm, norm before, norm after)

    def clip(parameters, max_norm, *a, **k):
        parameters = list(parameters)
        norm = real_clip(parameters, max_norm, *a, **k)
        after = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in parameters if p.grad is not None]))
        clips.append((max_norm, float(norm), float(after)))
        return norm

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    short = ["--epochs", "1", "--max-steps", "3", "--optimizer", "sgd", "--lr", "0.1", "--seed", "1"]
    plain = params(train(tmp_path, "plain", *short))
    assert clips == []  # no clip asked: none made
    clipped = params(train(tmp_path, "clipped", *short, "--grad-clip", "1e-3"))
    assert len(clips) == 3 and all(m == 1e-3 for m, _, _ in clips)
    assert all(before > 1e-2 and after == pytest.approx(1e-3, rel=1e-3) for _, before, after in clips)
    clips.clear()
    loose = params(train(tmp_path, "loose", *short, "--grad-clip", "1e6"))
    assert len(clips) == 3 and all(before < 1e6 for _, before, _ in clips)
    assert all(torch.equal(plain[k], loose[k]) for k in plain)
    changed = [k for k in plain if plain[k].is_floating_point() and not torch.equal(plain[k], clipped[k])]
    assert changed


def test_one_process_trains_every_sample_once_an_epoch_in_a_new_order_each_epoch(tmp_path):
    """Labels are the sample indices, so the batches the Trainer's step receives name the samples it trains."""
    from cnnpar.config import Config, DataConfig, OptimConfig, RunConfig, SpeedConfig
    from cnnpar.data.bundle import ArrayDataset, DataBundle
    from cnnpar.dist import DistInfo
    from cnnpar.engine.trainer import Trainer

    n = 60
    x = torch.randint(0, 256, (n, 1, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    bundle = DataBundle(ArrayDataset(x, torch.arange(n)), None, (1, 8, 8), n, (0.5,), (0.25,), "ids")
    cfg = Config(
        data=DataConfig(augment="none", workers=0),
        optim=OptimConfig(optimizer="sgd"),
        speed=SpeedConfig(device="cpu", precision="fp32", channels_last="off", compile="off"),
        run=RunConfig(epochs=2, batch_size=20, seed=4, out_dir=str(tmp_path), name="ids", progress=False),
    )
    trainer = Trainer(cfg, DistInfo(0, 0, 1, torch.device("cpu")), bundle=bundle, log=lambda *a, **k: None)
    seen: list[int] = []
    real = trainer.train_step

    def step(group):
        seen.extend(i for _, y in group for i in y.tolist())
        return real(group)

    trainer.train_step = step
    expected = []  # each epoch's order by the sampler's own rule (seed + epoch), from a copy of it
    for epoch in (1, 2):
        sampler = copy.copy(trainer.train_loader.sampler)
        sampler.set_epoch(epoch)
        expected.append(list(sampler))
    orders = []
    for epoch in (1, 2):
        seen.clear()
        trainer.train_epoch(epoch)
        orders.append(list(seen))
    first, second = orders
    assert sorted(first) == sorted(second) == list(range(n))  # every sample once an epoch
    assert first != second  # reshuffled: a new permutation each epoch
    assert first != list(range(n))  # shuffled at all
    assert orders == expected  # the epoch's own permutation, the first epoch's too


def test_a_cpu_run_says_and_records_its_torch_threads(tmp_path, capsys):
    """CPU figures hang on torch's intra-op threads (OMP_NUM_THREADS; 1 against 2 moved a run 25-45 % on 2 cores), and
    neither the run's first line nor its config.toml or summary.json said how many there were."""
    threads = torch.get_num_threads()  # 1 here (the module's one_thread fixture)
    run = train(tmp_path, "threads", "--epochs", "1")
    first = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("cnnpar: "))
    assert f"| 1 process(es) on cpu ({threads} thread{'s' * (threads != 1)} each) |" in first, first
    assert f"# torch_threads = {threads}\n" in (run / "config.toml").read_text()
    assert json.loads((run / "summary.json").read_text())["torch_threads"] == threads
