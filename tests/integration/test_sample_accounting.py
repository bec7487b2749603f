"""Which training images reach the train step, and how often, under every loader: an .npz (workers 0 and 2, resident
on), an image folder (decoded on the CPU, workers 0 and 2) and a `cnnpar prepare` store (workers 0 and 2, resident
on). Each image is one solid grey level that names it, so the ids are read back from the pixels the step receives
(TrainStep.__call__ recorded), after every loader's decode, crop, resize and normalisation. Real in-process CPU runs
through the CLI; the expected order is torch's own DistributedSampler's, built here."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler

from cnnpar.engine.checkpoint import LAST

pytestmark = pytest.mark.usefixtures("one_thread")

N, VAL, SIDE = 30, 10, 12  # training images, validation images, pixels a side
FIRST, SPACING = 20, 5  # image i is grey level FIRST + SPACING * i: far enough apart to survive a resize's rounding
SEED = 5
ARGS = ["--device", "cpu", "--model", "cnn3", "--augment", "none", "--no-progress", "--no-tensorboard"]


def level(i: int) -> int:
    return FIRST + SPACING * i


def write_folder(root: Path) -> Path:
    """root/train|val/<class>/<id>.png: ids 0-14 in class a, 15-29 in class b, so a split's sorted files are in id
    order; PNG, lossless."""
    from PIL import Image

    for split, count in (("train", N), ("val", VAL)):
        for i in range(count):
            folder = root / split / ("a" if i < count // 2 else "b")
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.full((SIDE, SIDE, 3), level(i), np.uint8)).save(folder / f"{i:03d}.png")
    return root


def write_jpegs(root: Path) -> Path:
    """The folder's layout as JPEGs (quality 100: a solid grey comes back within a level), for the GPU decoders."""
    from PIL import Image

    for split, count in (("train", N), ("val", VAL)):
        for i in range(count):
            folder = root / split / ("a" if i < count // 2 else "b")
            folder.mkdir(parents=True, exist_ok=True)
            img = Image.fromarray(np.full((SIDE * 2, SIDE * 2, 3), level(i), np.uint8))
            img.save(folder / f"{i:03d}.jpg", quality=100)
    return root


def write_flat(root: Path) -> Path:
    """N + VAL images flat in root/images/ and root/labels.csv naming them (the --labels layout): no validation split
    of its own, --val-fraction holds one out."""
    from PIL import Image

    (root / "images").mkdir(parents=True)
    rows = ["id,label"]
    for i in range(N + VAL):
        Image.fromarray(np.full((SIDE, SIDE, 3), level(i), np.uint8)).save(root / "images" / f"{i:03d}.png")
        rows.append(f"{i:03d},{'ab'[i % 2]}")
    (root / "labels.csv").write_text("\n".join(rows) + "\n")
    return root


def write_npz(path: Path) -> Path:
    x = np.stack([np.full((SIDE, SIDE), level(i), np.uint8) for i in range(N)])
    y = np.arange(N) % 2
    np.savez(path, x_train=x, y_train=y, x_test=x[:VAL], y_test=y[:VAL])
    return path


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    from cnnpar.cli import main

    root = tmp_path_factory.mktemp("accounting")
    folder = write_folder(root / "photos")
    store = root / "photos.cnnpar"
    assert main(["prepare", str(folder), "--out", str(store), "--workers", "0", "--no-progress"]) == 0
    return {
        "npz": write_npz(root / "d.npz"),
        "folder": folder,
        "store": store,
        "flat": write_flat(root / "flat"),
        "jpegs": write_jpegs(root / "jpegs"),
    }


def image_means(x: torch.Tensor) -> torch.Tensor:
    """(N, C): each image's mean per channel, of the normalised floats a step receives."""
    return x.detach().float().mean(dim=(2, 3)).cpu()


def ids_of(means: torch.Tensor, mean, std) -> list[int]:
    """The image ids: each image's grey level, normalisation undone with the run's mean/std."""
    grey = (means * torch.tensor(std) + torch.tensor(mean)) * 255
    ids = (grey.mean(dim=1) - FIRST) / SPACING  # the channels hold one level
    assert (ids - ids.round()).abs().max() < 0.3, ids  # a level the data holds, not a blend of two
    return ids.round().int().tolist()


class Recorder:
    """What the train step (TrainStep.__call__: per group, per micro-batch) and the evaluation (eval_batch: per batch)
    receive, as each image's normalised mean per channel."""

    def __init__(self, monkeypatch) -> None:
        import cnnpar.engine.trainer as trainer
        from cnnpar.engine.train_step import TrainStep

        self.groups: list[list[torch.Tensor]] = []
        self.evaluated: list[torch.Tensor] = []
        real_step, real_eval = TrainStep.__call__, trainer.eval_batch

        def call(step, group):
            self.groups.append([image_means(x) for x, _ in group])
            return real_step(step, group)

        def evaluate(model, x, *args):
            self.evaluated.append(image_means(x))
            return real_eval(model, x, *args)

        monkeypatch.setattr(TrainStep, "__call__", call)
        monkeypatch.setattr(trainer, "eval_batch", evaluate)

    @staticmethod
    def _meta(run: Path) -> tuple[list, list]:
        meta = torch.load(run / "ckpt" / LAST, map_location="cpu", weights_only=True)["meta"]
        return meta["mean"], meta["std"]

    def ids(self, run: Path) -> list[list[int]]:
        """Per micro-batch trained, the image ids."""
        return [ids_of(x, *self._meta(run)) for group in self.groups for x in group]

    def evaluated_ids(self, run: Path) -> list[list[int]]:
        """Per batch evaluated, the image ids."""
        return [ids_of(x, *self._meta(run)) for x in self.evaluated]


def train(tmp_path: Path, source: Path, name: str, *more: str) -> Path:
    from cnnpar.cli import main

    args = ["train", *ARGS, "--data", str(source), "--out-dir", str(tmp_path), "--name", name, "--seed", str(SEED)]
    assert main([*args, *more]) == 0
    return tmp_path / name


def sampler_order(epoch: int, batch: int, steps: int | None = None) -> list[int]:
    """Epoch `epoch`'s training ids by torch's own sampler, seeded as cnnpar seeds it, cut to whole batches."""
    from cnnpar.data.loader import shuffle_seed

    sampler = DistributedSampler(range(N), 1, 0, shuffle=True, seed=shuffle_seed(SEED), drop_last=True)
    sampler.set_epoch(epoch)
    order = list(sampler)[: N // batch * batch]
    return order[: steps * batch] if steps is not None else order


def metrics(run: Path) -> list[dict]:
    with open(run / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


LOADERS = {
    "npz-workers0": ("npz", ["--workers", "0", "--resident", "off"]),
    "npz-workers2": ("npz", ["--workers", "2", "--resident", "off"]),
    "npz-resident": ("npz", ["--workers", "0", "--resident", "on"]),
    "folder-workers0": ("folder", ["--workers", "0", "--decode", "cpu"]),
    "folder-workers2": ("folder", ["--workers", "2", "--decode", "cpu"]),
    "store-workers0": ("store", ["--workers", "0", "--resident", "off"]),
    "store-workers2": ("store", ["--workers", "2", "--resident", "off"]),
    "store-resident": ("store", ["--workers", "0", "--resident", "on"]),
    "npz-textbook": ("npz", ["--workers", "2", "--loader", "textbook"]),
    "folder-textbook": ("folder", ["--workers", "2", "--loader", "textbook"]),
}


CUDA = ["--device", "cuda", "--precision", "fp32", "--compile", "off", "--cuda-graphs", "off"]
CUDA_LOADERS = {
    "cuda-npz-resident": ("npz", [*CUDA, "--workers", "0", "--resident", "on"]),
    "cuda-npz-workers2": ("npz", [*CUDA, "--workers", "2", "--resident", "off"]),
    "cuda-store-workers2": ("store", [*CUDA, "--workers", "2", "--resident", "off"]),
    "cuda-store-resident": ("store", [*CUDA, "--workers", "0", "--resident", "on"]),
    "cuda-jpegs-gpu": ("jpegs", [*CUDA, "--workers", "2", "--decode", "gpu"]),
    "cuda-jpegs-hardware": ("jpegs", [*CUDA, "--workers", "2", "--decode", "hardware"]),
    "cuda-jpegs-nvimgcodec": ("jpegs", [*CUDA, "--workers", "2", "--decode", "nvimgcodec"]),
    "cuda-jpegs-workers": ("jpegs", [*CUDA, "--workers", "2", "--decode", "nvimgcodec-workers"]),
    "cuda-jpegs-hybrid": ("jpegs", [*CUDA, "--workers", "2", "--decode", "gpu", "--cpu-share", "0.5"]),
}
# marked gpu too: benchmarks/gpu_session.sh runs `pytest -m gpu tests` on the device
CUDA_ONLY = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def loaders(*names: str) -> list:
    """`names` as parameters, the CUDA ones skipped without a GPU."""
    return [pytest.param(n, marks=CUDA_ONLY) if n in CUDA_LOADERS else n for n in names]


def spec(loader: str) -> tuple[str, list[str]]:
    return {**LOADERS, **CUDA_LOADERS}[loader]


@pytest.mark.parametrize("loader", loaders(*LOADERS, *CUDA_LOADERS))
def test_every_loader_trains_each_image_at_most_once_an_epoch_and_evaluates_each_once(
    sources, tmp_path, monkeypatch, loader
):
    """30 images at batch 8: 3 full batches an epoch in the sampler's order, the last partial batch (6 images)
    dropped, as docs/distributed.md says; summary.json's images_trained and each epoch's images/s count the 24
    trained, not the 30. Every evaluation scores each of the 10 validation images once."""
    kind, flags = spec(loader)
    if any(f.startswith("nvimgcodec") for f in flags):
        pytest.importorskip("nvidia.nvimgcodec", reason="the nvimgcodec extra is part of the test extra")
    recorder = Recorder(monkeypatch)
    run = train(tmp_path, sources[kind], "r", "--epochs", "2", "--batch-size", "8", *flags)
    batches = recorder.ids(run)
    assert [len(b) for b in batches] == [8] * 6  # 3 full batches an epoch, no partial one
    epochs = [sum(batches[3 * e : 3 * e + 3], []) for e in range(2)]
    for e, ids in enumerate(epochs, start=1):
        assert len(set(ids)) == 24 and set(ids) <= set(range(N)), (e, ids)  # each image at most once
        assert ids == sampler_order(e, 8), e  # the sampler's order, whatever the loader
    assert epochs[0] != epochs[1]  # a new order each epoch
    summary = json.loads((run / "summary.json").read_text())
    assert summary["images_trained"] == 2 * 24
    evaluated = recorder.evaluated_ids(run)  # two evaluations of 10 at batch 8: the partial batch kept
    assert evaluated == [list(range(8)), [8, 9]] * 2
    for row in metrics(run):  # the rate of the images trained, over the epoch's seconds
        assert float(row["images_per_s"]) * float(row["epoch_s"]) == pytest.approx(24, rel=1e-3)


def test_an_accumulation_of_3_trains_the_short_last_group_over_its_own_micro_batches(sources, tmp_path, monkeypatch):
    """30 images at batch 4: 7 micro-batches an epoch (2 images dropped), so --grad-accum 3 steps 3 + 3 + 1."""
    recorder = Recorder(monkeypatch)
    run = train(tmp_path, sources["npz"], "r", "--epochs", "1", "--batch-size", "4", "--grad-accum", "3")
    assert [len(g) for g in recorder.groups] == [3, 3, 1]
    ids = sum(recorder.ids(run), [])
    assert ids == sampler_order(1, 4)  # 28 images, each once, in the sampler's order
    assert json.loads((run / "summary.json").read_text())["images_trained"] == 28


@pytest.mark.parametrize("loader", loaders("npz-workers2", "cuda-jpegs-gpu", "cuda-store-workers2"))
def test_max_steps_trains_the_first_steps_of_each_epochs_order_and_counts_only_them(
    sources, tmp_path, monkeypatch, loader
):
    kind, flags = spec(loader)
    recorder = Recorder(monkeypatch)
    more = ["--epochs", "2", "--batch-size", "4", "--grad-accum", "3", "--max-steps", "1", *flags]
    run = train(tmp_path, sources[kind], "r", *more)
    assert [len(g) for g in recorder.groups] == [3, 3]  # one step of 3 micro-batches an epoch
    assert sorted(sum(recorder.evaluated_ids(run), [])) == sorted(list(range(VAL)) * 2)  # evaluations score all 10
    batches = recorder.ids(run)
    for e in (1, 2):
        assert sum(batches[3 * (e - 1) : 3 * e], []) == sampler_order(e, 4, steps=3), e
    assert json.loads((run / "summary.json").read_text())["images_trained"] == 2 * 12
    assert [float(r["images_per_s"]) * float(r["epoch_s"]) for r in metrics(run)] == pytest.approx([12, 12], rel=1e-3)


@pytest.mark.parametrize(
    "loader", loaders("npz-workers2", "npz-resident", "store-workers2", "cuda-jpegs-gpu", "cuda-store-resident")
)
def test_a_resumed_run_trains_the_next_epochs_in_the_uninterrupted_runs_order(sources, tmp_path, monkeypatch, loader):
    kind, flags = spec(loader)
    source, more = sources[kind], ["--batch-size", "8", *flags]
    whole = Recorder(monkeypatch)
    run = train(tmp_path, source, "whole", "--epochs", "3", *more)
    uninterrupted = whole.ids(run)
    assert len(uninterrupted) == 9
    first = Recorder(monkeypatch)
    run = train(tmp_path, source, "parts", "--epochs", "1", *more)
    assert first.ids(run) == uninterrupted[:3]
    rest = Recorder(monkeypatch)
    train(tmp_path, source, "parts", "--epochs", "3", *more, "--resume", str(run))
    assert rest.ids(run) == uninterrupted[3:]  # epochs 2 and 3 drawn as the uninterrupted run drew them
    again = Recorder(monkeypatch)
    run = train(tmp_path, source, "again", "--epochs", "3", "--batch-size", "8", "--workers", "0")
    assert again.ids(run) == uninterrupted  # the same --seed, the same orders, with or without workers


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("kind", ["npz", "folder", "store"])
def test_ranks_train_disjoint_shares_and_evaluate_each_validation_image_once(sources, kind, world):
    """The loaders the ranks build (build_loader with each rank of `world`): training shares of 30 // world
    that do not meet, cut to whole batches of 4; evaluation shards that hold each of the 10 validation images once
    (over 3 ranks DistributedSampler's padding would count two twice)."""
    from cnnpar.config import Config, DataConfig, RunConfig, resolve_for_device
    from cnnpar.data import load_data
    from cnnpar.data.loader import build_loader
    from cnnpar.dist import DistInfo

    data = DataConfig(source=str(sources[kind]), augment="none", workers=0, resident="off", decode="cpu")
    cfg = resolve_for_device(Config(data=data, run=RunConfig(batch_size=4, seed=SEED)), "cpu", False)
    bundle = load_data(cfg.data, SEED)
    trained, evaluated = [], []
    for rank in range(world):
        info = DistInfo(rank, rank, world, torch.device("cpu"))
        for train, out in ((True, trained), (False, evaluated)):
            feeder = build_loader(bundle, cfg, info, train)
            feeder.set_epoch(1)
            out.append([i for x, _ in feeder for i in ids_of(image_means(x), bundle.mean, bundle.std)])
            feeder.close()
    assert [len(t) for t in trained] == [N // world // 4 * 4] * world
    assert len(set(sum(trained, []))) == sum(len(t) for t in trained)  # no image on two ranks
    assert sorted(sum(evaluated, [])) == list(range(VAL))


def test_a_flat_folder_with_labels_trains_and_evaluates_each_image_once_on_either_side_of_its_hold_out(
    sources, tmp_path, monkeypatch
):
    """40 images named by a labels CSV, a quarter held out: 30 train (24 an epoch at batch 8), 10 validate."""
    flat = sources["flat"]
    recorder = Recorder(monkeypatch)
    more = ["--labels", str(flat / "labels.csv"), "--val-fraction", "0.25", "--workers", "2", "--decode", "cpu"]
    run = train(tmp_path, flat / "images", "r", "--epochs", "2", "--batch-size", "8", *more)
    batches = recorder.ids(run)
    assert [len(b) for b in batches] == [8] * 6
    epochs = [sum(batches[3 * e : 3 * e + 3], []) for e in range(2)]
    assert all(len(set(ids)) == 24 for ids in epochs) and epochs[0] != epochs[1]
    evaluated = recorder.evaluated_ids(run)
    first, second = (sum(evaluated[2 * e : 2 * e + 2], []) for e in range(2))
    assert len(evaluated) == 4 and first == second and len(set(first)) == VAL  # each validation image once
    assert not set(first) & set(epochs[0] + epochs[1])  # the hold-out never trains
    assert json.loads((run / "summary.json").read_text())["images_trained"] == 2 * 24
