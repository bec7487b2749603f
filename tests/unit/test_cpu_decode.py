"""The batch-level CPU decoder for image folders (`CpuDecodedFolder`): the GPU path's crop boxes,
its reference resize, JPEG DCT scaling, per-process seeding, and its place in `build_loader`;
each with both JPEG backends (simplejpeg where installed, Pillow + torchvision)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import cnnpar.data.cpu_decode as cpu_decode
from cnnpar.config import Config, DataConfig, RunConfig, resolve_for_device
from cnnpar.data import load_data
from cnnpar.data.cpu_decode import CpuDecodedFolder, reduction, scaled_box
from cnnpar.data.crop_resize import draw_crop_boxes, resized_crops_loop
from cnnpar.data.loader import build_loader
from cnnpar.data.png_header import png_size
from cnnpar.data.tv_codecs import TV_CODEC_DEPRECATION
from cnnpar.dist import DistInfo
from cnnpar.engine.rng import epoch_seed, init_epoch_rng
from tests.datafiles import write_image_folder

# the tests' own torchvision.io calls (references, encoders): only its codec notice is known
pytestmark = pytest.mark.filterwarnings(f"ignore:{TV_CODEC_DEPRECATION}:DeprecationWarning")

SIZES = [(375, 500), (500, 333), (120, 90), (64, 300), (224, 224), (31, 29)]
BACKENDS = [
    "pillow",
    pytest.param(
        "simplejpeg",
        marks=pytest.mark.skipif(cpu_decode.simplejpeg_module() is None, reason="simplejpeg not installed"),
    ),
]


def smooth(h: int, w: int, phase: float = 0.0) -> np.ndarray:
    """A smooth (h, w, 3) uint8 picture (as test_gpu_decode's): JPEG keeps it, resizing is well posed."""
    y, x = np.linspace(0, 1, h)[:, None], np.linspace(0, 1, w)[None]
    rgb = [127 + 100 * np.sin(6 * x + 3 * y + phase), 127 + 100 * np.cos(5 * x * y + phase), 60 + 150 * x * y]
    return np.stack([np.broadcast_to(c, (h, w)) for c in rgb], -1).round().astype(np.uint8)


def write_jpegs(folder: Path, sizes, quality: int = 90) -> list[Path]:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for i, (h, w) in enumerate(sizes):
        files.append(folder / f"{i}.jpg")
        Image.fromarray(smooth(h, w, phase=i)).save(files[-1], quality=quality)
    return files


def reference(files: list[Path], train: bool, generator: torch.Generator, size: int) -> torch.Tensor:
    """The GPU path on the same files: full decode, `draw_crop_boxes` from the decoder's generator for the
    batch, `resized_crops_loop` (float antialiased bilinear)."""
    from torchvision.io import ImageReadMode, decode_image

    images = [decode_image(str(f), mode=ImageReadMode.RGB) for f in files]
    boxes = draw_crop_boxes(torch.tensor([img.shape[1:] for img in images]), train, generator)
    return resized_crops_loop(images, boxes, size)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("train", [True, False])
def test_batch_uses_the_gpu_paths_boxes_and_matches_its_resize_at_full_scale(tmp_path, train, backend):
    files = write_jpegs(tmp_path, SIZES)
    labels = [3, 1, 4, 1, 5, 9]
    ds = CpuDecodedFolder(files, labels, 48, train=train, draft=False, backend=backend)
    torch.manual_seed(11)
    order = [5, 0, 2, 1, 4, 3]
    x, y, index = ds[order]  # what the DataLoader passes with batch_size=None
    assert x.shape == (6, 3, 48, 48) and x.dtype == torch.uint8 and x.is_contiguous()
    assert y.tolist() == [labels[i] for i in order] and index.tolist() == order
    ref = reference([files[i] for i in order], train, ds.generator(order), 48)
    diff = (x.int() - ref.int()).abs()
    # The same libjpeg-turbo decode (simplejpeg's or torchvision's), the same filter in integers
    # (torch's uint8 kernel) and floats: a rounding flip at most.
    assert diff.max() <= 1 and diff.float().mean() < 0.2
    assert torch.equal(ds.__getitems__(order)[0], x)  # a batch's crops are a function of the seed and the batch
    torch.manual_seed(12)  # another epoch's seed
    assert torch.equal(ds.__getitems__(order)[0], x) != train  # evaluation repeats; training draws anew


@pytest.mark.parametrize("backend", BACKENDS)
def test_evaluation_decodes_at_full_size(tmp_path, monkeypatch, backend):
    """Validation (and predict, which reads folders through this class) must see the pixels the GPU decoders'
    validation sees: a reduced (DCT-scaled) decode of a centre square >= 2x the input differed by levels."""
    files = write_jpegs(tmp_path, [(1200, 1600), (900, 700), (2000, 1500)])
    used = []
    real_reduced, real_turbo = cpu_decode.decode_reduced, cpu_decode.TurboDecoder.__call__
    monkeypatch.setattr(cpu_decode, "decode_reduced", lambda *a: used.append(a[2]) or real_reduced(*a))
    monkeypatch.setattr(
        cpu_decode.TurboDecoder, "__call__", lambda self, data, k, *a: used.append(k) or real_turbo(self, data, k, *a)
    )
    x, _, _ = CpuDecodedFolder(files, [0] * 3, 64, train=False, backend=backend)[[0, 1, 2]]
    assert all(k == 1 for k in used), used  # every decode whole, draft on as the loaders build it
    full, _, _ = CpuDecodedFolder(files, [0] * 3, 64, train=False, draft=False, backend=backend)[[0, 1, 2]]
    assert torch.equal(x, full)
    diff = (x.int() - reference(files, False, torch.Generator(), 64).int()).abs()
    assert diff.max() <= 1  # the integer kernel's rounding against the GPU path's float reference, no more


@pytest.mark.parametrize("backend", BACKENDS)
def test_large_jpegs_decode_reduced_close_to_the_full_size_reference(tmp_path, monkeypatch, backend):
    files = write_jpegs(tmp_path, [(1200, 1600), (900, 700), (600, 800), (2000, 1500)])
    used = []
    if backend == "pillow":
        real = cpu_decode.decode_reduced
        monkeypatch.setattr(cpu_decode, "decode_reduced", lambda *a: used.append(a[2]) or real(*a))
    else:
        real = cpu_decode.TurboDecoder.__call__

        def spy(self, data, k, h, w, box):
            crop = real(self, data, k, h, w, box)
            used.append(k if crop is not None else "declined")
            # the decode really was reduced: the crop is 1/k of the box, to the rounding of a pixel
            assert crop is None or (abs(crop.shape[1] - box[2] / k) <= 1 and abs(crop.shape[2] - box[3] / k) <= 1)
            return crop

        monkeypatch.setattr(cpu_decode.TurboDecoder, "__call__", spy)
    # seeds whose random-resized crops are all at most half the photo's side, so that every file
    # takes the reduced decode (a larger crop decodes at full size, rightly: k = 1)
    # (training only: evaluation decodes at full size, test_evaluation_decodes_at_full_size)
    for size, train, seed in ((64, True, 64), (112, True, 112), (224, True, 225)):
        used.clear()
        torch.manual_seed(seed)
        ds = CpuDecodedFolder(files, [0] * 4, size, train=train, backend=backend)
        x, _, _ = ds[[0, 1, 2, 3]]
        assert len(used) == 4 and all(k != "declined" and k > 1 for k in used), used
        diff = (x.int() - reference(files, train, ds.generator([0, 1, 2, 3]), size).int()).abs()
        # libjpeg-turbo's scaled IDCT is a filter of its own: measured 0.2-1.0 mean, 5 max on
        # these pictures at 1/2, 1/4 and 1/8 scale.
        assert diff.float().mean() < 1.5 and diff.max() <= 8, (size, diff.float().mean(), diff.max())


def test_reduction_leaves_the_crop_at_least_the_output_size():
    assert [reduction(s, 2000, 224) for s in (223, 447, 448, 895, 896, 1791, 1792, 5000)] == [1, 1, 2, 2, 4, 4, 8, 8]
    assert reduction(2000, 500, 224) == 2  # the shorter side decides
    for box, scale, hw in [((10, 21, 500, 700), 2.0, (600, 800)), ((1190, 3, 9, 16), 8.0, (150, 200))]:
        top, left, ch, cw = scaled_box(box, scale, *hw)
        assert 0 <= top and top + ch <= hw[0] and 0 <= left and left + cw <= hw[1] and ch >= 1 and cw >= 1
        assert abs(ch - box[2] / scale) <= 0.5 and abs(top - box[0] / scale) <= 1
    assert png_size(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x01\x00\x00\x00\x00\x80") == (128, 256)
    assert png_size(b"\xff\xd8\xff") is None


def test_boxes_come_from_the_epochs_seed_and_the_batch_not_the_process(tmp_path):
    """Seeded from the epoch's seed (`epoch_seed`, set in each worker by the loader, else torch.initial_seed(),
    which engine/rng.py sets to it in the main process) and the batch's first index: the same seed and batch
    repeat, another batch or seed differs, and a worker with the epoch's seed draws what the main process does
    (a batch's boxes were the draws of whichever worker it went to, so --workers changed the crops)."""
    files = write_jpegs(tmp_path, SIZES)
    ds = CpuDecodedFolder(files, [0] * 6, 32, train=True)

    def draw(seed: int, batch: list[int]) -> torch.Tensor:
        torch.manual_seed(seed)
        return ds[batch][0]

    first = draw(0, [0, 1, 2])
    assert torch.equal(draw(0, [0, 1, 2]), first)
    assert not torch.equal(draw(1, [0, 1, 2]), first)
    assert not torch.equal(draw(0, [3, 1, 2])[1:], first[1:])  # another batch: other boxes for the same images
    torch.manual_seed(12345)  # a worker's own seed, unlike the main process's
    ds.epoch_seed = 0  # the epoch's, handed to the worker with its indices
    assert torch.equal(ds[[0, 1, 2]][0], first)


def test_workers_hand_over_whole_batches_reproducibly(tmp_path):
    from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

    files = write_jpegs(tmp_path, SIZES * 2)
    ds = CpuDecodedFolder(files, list(range(12)), 24, train=True)

    def epoch() -> list:
        sampler = BatchSampler(SequentialSampler(ds), 4, drop_last=False)
        return list(DataLoader(ds, batch_size=None, sampler=sampler, num_workers=2))

    torch.manual_seed(5)
    a, b = epoch(), epoch()
    torch.manual_seed(5)
    again = epoch()
    assert [len(batch) for batch in a] == [3, 3, 3]  # (x, labels, index) per batch
    assert [batch[2].tolist() for batch in a] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert all(x.shape == (4, 3, 24, 24) and x.dtype == torch.uint8 for x, _, _ in a)
    assert all(torch.equal(p[0], q[0]) for p, q in zip(a, again, strict=True))  # same seed, same crops
    assert not all(torch.equal(p[0], q[0]) for p, q in zip(a, b))  # the next epoch draws anew


@pytest.mark.parametrize("augment", ["flip", "altflip"])
def test_build_loader_decodes_folders_a_batch_at_a_time_on_the_cpu(tmp_path, augment):
    root = write_image_folder(tmp_path / "photos", per_class=6, classes=2, side=20)
    bundle = load_data(DataConfig(source=str(root), image_size=16, val_fraction=0.25))
    cfg = Config(data=DataConfig(augment=augment, decode="cpu", workers=0), run=RunConfig(batch_size=4, seed=3))
    info = DistInfo(0, 0, 1, torch.device("cpu"))
    for train in (True, False):
        feeder = build_loader(bundle, resolve_for_device(cfg, "cpu", False), info, train=train)
        assert isinstance(feeder.loader.dataset, CpuDecodedFolder) and feeder.loader.dataset.train is train
        assert feeder.loader.batch_size is None
        feeder.set_epoch(1)
        batches = list(feeder)
        assert batches and all(x.shape[1:] == (3, 16, 16) and x.dtype == torch.float32 for x, _ in batches)
        assert sum(len(y) for _, y in batches) == (8 if train else len(bundle.val))


def test_the_crops_of_an_epoch_do_not_depend_on_the_number_of_workers(tmp_path):
    """--workers is a speed switch: 0, 1 and 2 workers decode an epoch to the same pixels."""
    root = write_image_folder(tmp_path / "photos", per_class=6, classes=2, side=20)
    bundle = load_data(DataConfig(source=str(root), image_size=16, val_fraction=0.25))
    info = DistInfo(0, 0, 1, torch.device("cpu"))

    def epoch(workers: int) -> list[torch.Tensor]:
        data = DataConfig(augment="flip", decode="cpu", workers=workers, persistent_workers=False)
        feeder = build_loader(bundle, resolve_for_device(Config(data=data, run=RunConfig(batch_size=2, seed=3)), "cpu",
                                                         False), info, train=True)  # fmt: skip
        seed = epoch_seed(3, 0, 2)
        init_epoch_rng(seed)  # what the trainer does at an epoch's start (engine/rng.py)
        feeder.set_epoch(2, seed)
        return [x for x, _ in feeder]

    alone = epoch(0)
    assert len(alone) == 4
    for workers in (1, 2):
        assert all(torch.equal(a, b) for a, b in zip(alone, epoch(workers), strict=True)), workers


def test_persistent_workers_draw_an_epoch_from_its_seed_alone(tmp_path):
    """A resumed run's fresh workers start at epoch 3 where the uninterrupted run's kept
    workers had decoded epochs 1 and 2 first: the epoch's seed travels with each index and
    each worker reseeds on it, so both draw the same crops (engine/rng.py)."""
    root = write_image_folder(tmp_path / "photos", per_class=6, classes=2, side=20)
    bundle = load_data(DataConfig(source=str(root), image_size=16, val_fraction=0.25))
    data = DataConfig(augment="flip", decode="cpu", workers=2, persistent_workers=True)
    cfg = resolve_for_device(Config(data=data, run=RunConfig(batch_size=4, seed=3)), "cpu", False)
    info = DistInfo(0, 0, 1, torch.device("cpu"))

    def epochs(feeder, numbers) -> list[list[torch.Tensor]]:
        out = []
        for e in numbers:
            feeder.set_epoch(e, epoch_seed(3, 0, e))
            out.append([x for x, _ in feeder])
        return out

    kept = build_loader(bundle, cfg, info, train=True)
    assert kept.loader.persistent_workers and kept.loader.num_workers == 2
    first, second = epochs(kept, [1, 2])
    (fresh,) = epochs(build_loader(bundle, cfg, info, train=True), [2])
    assert all(torch.equal(a, b) for a, b in zip(second, fresh, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, second))


def test_the_backend_is_simplejpeg_where_installed_else_pillow(tmp_path, monkeypatch):
    files = write_jpegs(tmp_path, SIZES[:2])
    installed = cpu_decode.simplejpeg_module() is not None
    assert CpuDecodedFolder(files, [0, 0], 32, train=True).backend == ("simplejpeg" if installed else "pillow")
    assert cpu_decode.cpu_jpeg_line().startswith("simplejpeg (libjpeg-turbo") is installed
    monkeypatch.setattr(cpu_decode, "simplejpeg_module", lambda: None)
    ds = CpuDecodedFolder(files, [0, 0], 32, train=True)
    assert ds.backend == "pillow" and "is not installed: pip install simplejpeg)" in cpu_decode.cpu_jpeg_line()
    assert ds[[0, 1]][0].shape == (2, 3, 32, 32)
    with pytest.raises(ValueError, match=r'backend "simplejpeg": not installed'):
        CpuDecodedFolder(files, [0, 0], 32, train=True, backend="simplejpeg")
    with pytest.raises(ValueError, match=r"backend 'pil': expected 'simplejpeg' or 'pillow'"):
        CpuDecodedFolder(files, [0, 0], 32, train=True, backend="pil")


@pytest.mark.skipif(cpu_decode.simplejpeg_module() is None, reason="simplejpeg not installed")
def test_a_jpeg_simplejpeg_declines_is_decoded_the_checked_way(tmp_path, monkeypatch):
    """simplejpeg refuses what libjpeg only warns about (strict); those files, and files whose
    header our reader and libjpeg read differently, go through Pillow / torchvision as on the
    other paths. One reused buffer serves photos of every size in turn."""
    files = write_jpegs(tmp_path, [(40, 30), (300, 400), (50, 60)])
    torch.manual_seed(0)
    whole = CpuDecodedFolder(files, [0] * 3, 32, train=False, backend="simplejpeg")[[0, 1, 2]][0]
    pillow = CpuDecodedFolder(files, [0] * 3, 32, train=False, backend="pillow")[[0, 1, 2]][0]
    assert (whole.int() - pillow.int()).abs().max() <= 1  # the same libjpeg-turbo decode (measured: equal)
    checked = []
    real = CpuDecodedFolder._crop_checked
    monkeypatch.setattr(CpuDecodedFolder, "_crop_checked", staticmethod(lambda *a: checked.append(a[2]) or real(*a)))
    sj = cpu_decode.simplejpeg_module()
    declines = {"decode_jpeg": sj.decode_jpeg}

    def refuse_the_second(data, **kw):
        if len(data) == files[1].stat().st_size:
            raise ValueError("Corrupt JPEG data: 1 extraneous bytes before marker 0xd9")
        return declines["decode_jpeg"](data, **kw)

    monkeypatch.setattr(sj, "decode_jpeg", refuse_the_second)
    monkeypatch.setattr(cpu_decode, "KEEP_BUFFER_BYTES", 3 * 60 * 50)  # the 50x60 photo's fits, 300x400's not
    again = CpuDecodedFolder(files, [0] * 3, 32, train=False, backend="simplejpeg")[[0, 1, 2]][0]
    assert checked == [files[1]] and torch.equal(again[[0, 2]], whole[[0, 2]])
    assert torch.equal(again[1], pillow[1])
    monkeypatch.setattr(sj, "decode_jpeg", declines["decode_jpeg"])
    ds = CpuDecodedFolder(files, [0] * 3, 32, train=False, draft=False, backend="simplejpeg")
    whole = CpuDecodedFolder(files, [0] * 3, 32, train=False, draft=False, backend="pillow")[[2, 1]][0]
    assert torch.equal(ds[[2, 1]][0], whole)  # the whole 300x400 photo's buffer is too large to keep
    assert ds._turbo.buffer.numel() == 0
    assert torch.equal(ds[[2]][0], whole[[0]]) and ds._turbo.buffer.numel() == 3 * 60 * 50


@pytest.mark.skipif(cpu_decode.simplejpeg_module() is None, reason="simplejpeg not installed")
def test_simplejpeg_and_pillow_paths_agree_on_odd_sized_photos_decoded_reduced(tmp_path):
    """Both decode with libjpeg-turbo's 1/k IDCT, so on the same boxes their batches agree: the
    box maps to the reduced grid by k itself, not by width over reduced width (which differ by the
    partly covered last pixel of an odd side, and on a detailed picture a pixel's shift shows)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    files = []
    for i, (h, w) in enumerate([(921, 613), (563, 845), (1001, 1203), (455, 999)]):
        files.append(tmp_path / f"{i}.jpg")
        pixels = smooth(h, w, phase=i).astype(np.int16) + rng.integers(-40, 40, (h, w, 3))
        Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(files[-1], quality=90)
    for train in (True, False):
        for seed in range(3):
            out = {}
            for backend in ("simplejpeg", "pillow"):
                torch.manual_seed(seed)
                out[backend] = CpuDecodedFolder(files, [0] * 4, 56, train=train, backend=backend)[[0, 1, 2, 3]][0]
            diff = (out["simplejpeg"].int() - out["pillow"].int()).abs()
            assert diff.max() <= 1, (train, seed, diff.flatten(1).float().mean(1))


def test_the_textbook_loaders_augmentation_does_not_depend_on_the_number_of_workers():
    """The per-sample baseline's crops and flips drew from each worker's global generator: 0, 1 and 2 workers gave
    three different epochs of the same seed. They now follow the epoch's seed and the sample."""
    from cnnpar.data.bundle import ArrayDataset, DataBundle

    x = torch.randint(0, 256, (12, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    train = ArrayDataset(x, torch.arange(12) % 2)
    bundle = DataBundle(train, None, (3, 8, 8), 2, (0.5,) * 3, (0.25,) * 3, "arrays")
    info = DistInfo(0, 0, 1, torch.device("cpu"))

    def epoch(workers: int, number: int = 2) -> list[torch.Tensor]:
        data = DataConfig(augment="crop+flip", loader="textbook", workers=workers, persistent_workers=False)
        feeder = build_loader(bundle, resolve_for_device(Config(data=data, run=RunConfig(batch_size=3, seed=3)), "cpu",
                                                         False), info, train=True)  # fmt: skip
        seed = epoch_seed(3, 0, number)
        init_epoch_rng(seed)
        feeder.set_epoch(number, seed)
        return [b for b, _ in feeder]

    alone = epoch(0)
    assert len(alone) == 4
    for workers in (1, 2):
        assert all(torch.equal(a, b) for a, b in zip(alone, epoch(workers), strict=True)), workers
    assert not all(torch.equal(a, b) for a, b in zip(alone, epoch(0, 3)))  # another epoch, other draws


def test_ranks_never_train_a_sample_twice_in_an_epoch():
    """DistributedSampler's default pads the ranks' shares with repeats: with 11 samples on 2 ranks one sample was
    trained twice an epoch and counted twice in its metrics. The shares are cut to equal length instead."""
    from cnnpar.data.bundle import ArrayDataset, DataBundle

    x = torch.zeros(11, 1, 4, 4, dtype=torch.uint8)
    bundle = DataBundle(ArrayDataset(x, torch.arange(11)), None, (1, 4, 4), 11, (0.5,), (0.25,), "arrays")
    cfg = resolve_for_device(Config(data=DataConfig(workers=0), run=RunConfig(batch_size=1, seed=3)), "cpu", False)
    for epoch in (1, 2):
        seen = []
        for rank in (0, 1):
            feeder = build_loader(bundle, cfg, DistInfo(rank, rank, 2, torch.device("cpu")), train=True)
            feeder.set_epoch(epoch, epoch_seed(3, rank, epoch))
            seen += [int(label) for _, y in feeder for label in y]
        assert len(seen) == len(set(seen)) == 10, (epoch, sorted(seen))
