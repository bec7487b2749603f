"""The textbook loader (--loader textbook) on photos: random-resized crops in training, as the run's data line says
and as the fast loader's decoders draw them; the centre crop in evaluation. And the per-sample generators' seeds."""

from __future__ import annotations

import copy

import pytest
import torch

from cnnpar.config import Config, DataConfig, RunConfig, resolve_for_device
from cnnpar.data import load_data
from cnnpar.data.folder import PathTable
from cnnpar.data.store_write import prepare_store
from cnnpar.data.transforms import TextbookDataset, keyed_generator, mix_seed
from cnnpar.dist import DistInfo
from cnnpar.engine.rng import epoch_seed, init_epoch_rng
from tests.datafiles import write_noise_jpegs

CPU = DistInfo(0, 0, 1, torch.device("cpu"))


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("textbook")
    photos = write_noise_jpegs(root / "photos", n=12, first_height=48, width=64)
    prepare_store(photos, root / "photos.cnnpar", workers=1, progress=False)
    return {"folder": str(photos), "store": str(root / "photos.cnnpar")}


def _epoch(source: str, epoch: int, train: bool = True, **data) -> tuple[TextbookDataset, torch.Tensor]:
    """Every sample of the textbook loader's data set in one epoch, in index order (workers=0: the main process's
    seed is the epoch's, as the trainer sets it)."""
    from cnnpar.data.loader import build_loader

    bundle = load_data(DataConfig(source=source, image_size=32, val_fraction=0.25))
    cfg = Config(
        data=DataConfig(source=source, image_size=32, loader="textbook", workers=0, **data),
        run=RunConfig(batch_size=4, seed=0),
    )
    feeder = build_loader(bundle, resolve_for_device(cfg, "cpu", False), CPU, train=train)
    ds = feeder.loader.dataset
    seed = epoch_seed(0, 0, epoch)
    init_epoch_rng(seed)
    feeder.set_epoch(epoch, seed)
    return ds, torch.stack([ds[i][0] for i in range(len(ds))])


def _normalised(ds: TextbookDataset, x: torch.Tensor) -> torch.Tensor:
    return (x.float() / 255.0 - ds.mean) / ds.std


@pytest.mark.parametrize("kind", ["folder", "store"])
def test_textbook_training_samples_are_random_resized_crops(sources, kind):
    """They were the evaluation's centre crop, or its mirror, every epoch, while the log said "random-resized
    crop + flip" (--augment auto adds only the flip where the loader is taken to crop)."""
    ds, first = _epoch(sources[kind], 1)
    assert isinstance(ds, TextbookDataset) and ds.train
    centre = torch.stack([_normalised(ds, ds.base[i][0]) for i in range(len(ds))])
    # distance of each sample to its centre crop or that crop mirrored, whichever is nearer
    far = torch.minimum((first - centre).abs().amax((1, 2, 3)), (first - centre.flip(-1)).abs().amax((1, 2, 3)))
    assert (far > 0.5).float().mean() > 0.8, far  # noise photos: another crop differs by whole levels
    _, second = _epoch(sources[kind], 2)
    assert not torch.equal(first, second)  # each epoch draws anew
    _, again = _epoch(sources[kind], 1)
    assert torch.equal(first, again)  # a function of the epoch's seed and the sample


@pytest.mark.parametrize("kind", ["folder", "store"])
def test_textbook_crops_follow_crop_min_scale_and_evaluation_stays_centre(sources, kind):
    _, largest = _epoch(sources[kind], 1, augment="none", crop_min_scale=1.0)
    _, default = _epoch(sources[kind], 1, augment="none")
    assert not torch.equal(largest, default)  # the setting reaches the textbook path (the same draws, other areas)
    eval_ds, evaluated = _epoch(sources[kind], 1, train=False)
    assert not eval_ds.train
    centre = torch.stack([_normalised(eval_ds, eval_ds.base[i][0]) for i in range(len(eval_ds))])
    assert torch.equal(evaluated, centre)


@pytest.mark.parametrize("train", [True, False])
def test_the_textbook_loaders_folder_is_a_path_table_and_reads_as_its_list_did(sources, train):
    """The textbook loader hands its workers the folder's data set as it is: its list of Paths was copied page by
    page into every forked worker that read it (reference counts; ~275 MB a worker at 1.28 million files), where
    the fast readers' workers share a PathTable. Its samples stay those of the same data set holding a list."""
    ds, samples = _epoch(sources["folder"], 1, train=train)
    files = ds.base.files
    assert isinstance(files, PathTable)
    assert len(set(files)) == len(files) > 0 and all(f.is_file() for f in files)
    listed = copy.copy(ds.base)
    listed.files = list(files)  # the data set as it was: a list of Paths
    as_list = copy.copy(ds)
    as_list.base = listed
    assert torch.equal(torch.stack([as_list[i][0] for i in range(len(ds))]), samples)
    assert [int(as_list[i][1]) for i in range(len(ds))] == [int(ds[i][1]) for i in range(len(ds))]


def test_keyed_generators_of_neighbouring_ranks_do_not_repeat_each_other():
    """base * 1,000,003 + key gave rank r's sample k + 1,000,003 the seed (and crops) of rank r + 1's sample k."""
    for base, key in ((5, 17), (123456789, 0), (2**62, 99)):
        assert mix_seed(base, key + 1_000_003) != mix_seed(base + 1, key)
        a = torch.rand(4, generator=keyed_generator(base, key + 1_000_003))
        b = torch.rand(4, generator=keyed_generator(base + 1, key))
        assert not torch.equal(a, b)
    seeds = {mix_seed(b, k) for b in range(40) for k in range(200)}
    assert len(seeds) == 40 * 200 and all(0 <= s < 2**63 for s in seeds)
    # integer arithmetic only: the same in every process and Python (a str hash() would not be)
    assert mix_seed(0, 0) == 6017775124710473527 and mix_seed(8, 7) == 7468528629190015469


@pytest.mark.parametrize(
    ("kind", "decode", "share"),
    [("folder", "cpu", 0.0), ("folder", "gpu", 0.0), ("folder", "gpu", 0.5), ("store", "auto", 0.0)],
)
def test_crop_min_scale_reaches_every_fast_loader_reader(sources, kind, decode, share):
    """The fast loader's readers (the CPU decoder, the GPU decoder, the hybrid's CPU share, the store's cropper) each
    hold the run's --crop-min-scale: a mutation audit dropped it from each in turn and no test noticed."""
    from cnnpar.data.loader import build_loader

    source = sources[kind]
    bundle = load_data(DataConfig(source=source, image_size=32, val_fraction=0.25))
    data = DataConfig(source=source, image_size=32, decode=decode, cpu_share=share, workers=0, crop_min_scale=0.5)
    cfg = resolve_for_device(Config(data=data, run=RunConfig(batch_size=4, seed=0)), "cpu", False)
    feeder = build_loader(bundle, cfg, CPU, train=True)
    try:
        ds = feeder.loader.dataset
        readers = [r for r in (feeder.decoder, getattr(ds, "cpu", None), ds) if hasattr(r, "min_scale")]
        assert readers and all(r.min_scale == 0.5 for r in readers), [(type(r).__name__, r.min_scale) for r in readers]
    finally:
        feeder.close()
