"""`cnnpar predict` on a folder of photos reads it with the run's evaluation loader (engine/predict_loader): worker
processes (--workers, train's default and caps), decoding overlapped with the model, the GPU decoder on CUDA, and
the same pixels, so the same predictions, row for row, as the main process's one-batch-at-a-time read before."""

from __future__ import annotations

import csv
import multiprocessing
import os
from pathlib import Path

import pytest
import torch

from cnnpar.cli import main
from cnnpar.config import Config, DataConfig, RunConfig, SpeedConfig
from cnnpar.dist import DistInfo
from cnnpar.engine.predict import predict
from cnnpar.engine.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")

BATCH = 4  # several batches over the folder: their order is the rows' order


def _write_photos(root: Path) -> Path:
    """root/c<i % 2>/: JPEGs of seeded noise in odd sizes, a grey JPEG and a PNG."""
    from PIL import Image

    g = torch.Generator().manual_seed(0)
    for i in range(10):
        (root / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        pixels = torch.randint(0, 256, (23 + 5 * i, 41 - 2 * i, 3), generator=g, dtype=torch.uint8).numpy()
        Image.fromarray(pixels).save(root / f"c{i % 2}" / f"{i}.jpg", quality=90)
    grey = torch.randint(0, 256, (29, 35), generator=g, dtype=torch.uint8).numpy()
    Image.fromarray(grey, mode="L").save(root / "c0" / "grey.jpg", quality=85)
    png = torch.randint(0, 256, (31, 19, 3), generator=g, dtype=torch.uint8).numpy()
    Image.fromarray(png).save(root / "c1" / "odd.png")
    return root


def _record_loader_configs(mp: pytest.MonkeyPatch) -> list[Config]:
    """The config of every loader predict builds (engine/predict_loader.build_loader), in order, built as before."""
    from cnnpar.engine import predict_loader

    seen: list[Config] = []
    build = predict_loader.build_loader

    def recorded(bundle, cfg, info, train):
        seen.append(cfg)
        return build(bundle, cfg, info, train)

    mp.setattr(predict_loader, "build_loader", recorded)
    return seen


@pytest.fixture(scope="module")
def photo_run(tmp_path_factory, one_thread):
    """A cnn3 trained on 12 photos at 16x16, decoded on the CPU (the evaluation's centre square resized)."""
    folder = tmp_path_factory.mktemp("photos")
    root = _write_photos(folder / "photos")
    return root, _fit_photo_run(root, folder / "runs", "p", decode="cpu")


def _fit_photo_run(root, runs, name: str, **data) -> Path:
    """The run folder of a cnn3 trained for one epoch on the photos under `root` at 16x16, on the CPU in fp32;
    `data`: the DataConfig fields that choose the loader (decode=..., loader=...)."""
    cfg = Config(
        data=DataConfig(source=str(root), image_size=16, workers=0, **data),
        speed=SpeedConfig(device="cpu", precision="fp32"),
        run=RunConfig(epochs=1, batch_size=4, out_dir=str(runs), name=name, progress=False, tensorboard=False),
    )
    return Trainer(cfg, DistInfo(0, 0, 1, torch.device("cpu")), log=lambda *a, **k: None).fit().run_dir


def _rows(path: Path) -> list[list[str]]:
    with path.open(newline="") as f:
        return list(csv.reader(f))


def _main_process_rows(run_dir: Path, root: Path) -> list[list[str]]:
    """predictions.csv's rows as the old path made them: the folder decoded in the main process, one whole batch of
    the evaluation's centre squares at a time (CpuDecodedFolder), normalised, the model run on each."""
    from cnnpar.data.sources import load_predict_data
    from cnnpar.data.transforms import DeviceTransform
    from cnnpar.engine.checkpoint import load_checkpoint
    from cnnpar.models import build_model

    state = load_checkpoint(run_dir / "ckpt" / "last.pt", map_location="cpu")
    meta = state["meta"]
    model = build_model(meta["model"], 3, meta["num_classes"], 16, 16)
    model.load_state_dict(state["model"])
    model.eval()
    ds, ids, _ = load_predict_data(str(root), "folder", image_size=16)
    transform = DeviceTransform(meta["mean"], meta["std"], "none", False, torch.device("cpu"))
    rows = [["id", "label", "class_name", "confidence"]]
    with torch.no_grad():
        for i in range(0, len(ds), BATCH):
            x = ds[list(range(i, min(i + BATCH, len(ds))))][0]
            conf, label = model(transform(x, train=False)).float().softmax(1).max(1)
            for k, (p, q) in enumerate(zip(label.tolist(), conf.tolist())):
                rows.append([ids[i + k], str(p), meta["class_names"][p], f"{q:.5f}"])
    return rows


@pytest.mark.parametrize("workers", [0, 2])
def test_predict_reads_photos_by_the_evaluation_loader_with_the_same_predictions(tmp_path, photo_run, workers):
    """Row for row the predictions of the main process's read (odd sizes, a grey JPEG, a PNG), and with --workers 2
    every batch decoded in a worker process while the main process runs the model."""
    from cnnpar.data.cpu_decode import CpuDecodedFolder

    root, run_dir = photo_run
    pids = tmp_path / "pids"
    pids.mkdir()
    decode = CpuDecodedFolder.__getitems__

    def noted(self, indices):  # forked workers inherit the patch: each batch says which process decoded it
        (pids / f"{os.getpid()}-{indices[0]}").touch()
        return decode(self, indices)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(CpuDecodedFolder, "__getitems__", noted)
        out = predict(str(run_dir), str(root), out=str(tmp_path / "p.csv"), batch_size=BATCH, workers=workers)
    assert _rows(out) == _main_process_rows(run_dir, root)
    by = {int(name.split("-")[0]) for name in os.listdir(pids)}
    assert len(os.listdir(pids)) == 3  # 12 photos, batches of 4
    assert by == {os.getpid()} if workers == 0 else os.getpid() not in by


@pytest.mark.parametrize("workers", ["0", "2"])
def test_predict_names_a_damaged_photo_in_one_line_from_a_worker_too(tmp_path, capsys, photo_run, workers):
    import shutil

    root, run_dir = photo_run
    copy = shutil.copytree(root, tmp_path / "photos")
    bad = copy / "c1" / "3.jpg"
    bad.write_bytes(bad.read_bytes()[:40])  # cut inside its header
    words = ["predict", "--checkpoint", str(run_dir), "--data", str(copy), "--workers", workers]
    code = main([*words, "--batch-size", str(BATCH), "--out", str(tmp_path / "p.csv")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("cnnpar: error: ") and err.count("\n") == 1, err
    assert str(bad) in err
    assert not (tmp_path / "p.csv").exists()
    # the error's loader workers are gone when predict returns: they stayed until the collector found the loader,
    # whose torch clean-up then held up whatever the caller (a notebook's next cell) ran for ~20 s
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize("decode", ["cpu", "gpu"])
def test_a_damaged_photo_s_error_held_by_the_caller_keeps_no_loader_worker(tmp_path, photo_run, decode):
    """`predict` called from Python (a notebook cell) on a damaged photo, the error kept, as a notebook keeps its
    last one: the pass's workers are gone all the same. With `--decode gpu` off CUDA the photo is decoded in the main
    process by the feeder's own batch preparation, after the workers read its bytes; that error's traceback held the
    pass, and its two workers lived on for as long as the error was kept."""
    import shutil

    from cnnpar.errors import DataError

    root, run_dir = photo_run
    copy = shutil.copytree(root, tmp_path / "photos")
    bad = copy / "c1" / "3.jpg"
    whole = bad.read_bytes()
    bad.write_bytes(whole[: len(whole) // 2])  # its header whole, its pixels cut short
    with pytest.raises(DataError, match="3.jpg") as caught:
        predict(str(run_dir), str(copy), out=str(tmp_path / "p.csv"), batch_size=BATCH, workers=2, decode=decode)
    assert caught.value.__traceback__ is not None  # still held here, frames and all
    assert multiprocessing.active_children() == []
    assert not (tmp_path / "p.csv").exists()


def test_predict_workers_flag_takes_train_s_default_and_caps(tmp_path, capsys, monkeypatch, photo_run):
    """auto (-1, the default) as train's; N capped to 4 a usable core, said in train's line; others refused."""
    root, run_dir = photo_run
    built = _record_loader_configs(monkeypatch)
    monkeypatch.setattr("cnnpar.data.loader.usable_cores", lambda: 1)
    words = ["predict", "--checkpoint", str(run_dir), "--data", str(root), "--batch-size", str(BATCH)]
    assert main([*words, "--out", str(tmp_path / "a.csv")]) == 0
    assert main([*words, "--workers", "auto", "--out", str(tmp_path / "b.csv")]) == 0
    assert [c.data.workers for c in built] == [-1, -1]
    capsys.readouterr()
    assert main([*words, "--workers", "9", "--out", str(tmp_path / "c.csv")]) == 0
    assert "--workers 9 capped to 4: 4 per usable core (1 core" in capsys.readouterr().out
    assert _rows(tmp_path / "c.csv") == _rows(tmp_path / "a.csv")
    for wrong in ("-2", "many"):
        with pytest.raises(SystemExit) as e:
            main([*words, "--workers", wrong])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert "--workers" in err and "expected a whole number >= 0 or auto" in err, err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_predict_on_cuda_decodes_photos_on_the_gpu_as_the_cpu_path_predicts(tmp_path, photo_run):
    """--decode auto on CUDA: the GPU decoder the evaluation picks (its centre-square boxes are the CPU path's; its
    IDCT and resize kernels differ by a few levels), so labels agree but for borderline images, confidences close."""
    root, run_dir = photo_run
    cpu = predict(str(run_dir), str(root), out=str(tmp_path / "cpu.csv"), device="cpu", batch_size=BATCH)
    with pytest.MonkeyPatch.context() as mp:
        built = _record_loader_configs(mp)
        gpu = predict(str(run_dir), str(root), out=str(tmp_path / "gpu.csv"), device="cuda", batch_size=BATCH)
    picked = [c.data.decode for c in built]
    assert picked[-1] in ("gpu", "hardware"), picked
    _agree(_rows(cpu)[1:], _rows(gpu)[1:])


def _agree(a: list[list[str]], b: list[list[str]]) -> None:
    """Two decoders' predictions: the same ids in the same order, labels equal but for at most a few borderline
    images (IDCT and resize kernels a few levels apart), confidences close."""
    assert [r[0] for r in a] == [r[0] for r in b]
    assert sum(x[1] != y[1] for x, y in zip(a, b)) <= 2
    assert max(abs(float(x[3]) - float(y[3])) for x, y in zip(a, b)) < 0.05


def test_predict_decode_flag_reaches_the_evaluation_loader(tmp_path, capsys, monkeypatch, photo_run):
    """--decode gpu on the CPU: the nvJPEG path's CPU stand-in (torchvision decodes, the crop resized by the
    decoder's loop), as train takes it; its predictions agree with the CPU decoder's."""
    root, run_dir = photo_run
    built = _record_loader_configs(monkeypatch)
    words = ["predict", "--checkpoint", str(run_dir), "--data", str(root), "--device", "cpu", "--workers", "0"]
    assert main([*words, "--out", str(tmp_path / "auto.csv")]) == 0
    assert main([*words, "--decode", "gpu", "--out", str(tmp_path / "gpu.csv")]) == 0
    assert [c.data.decode for c in built] == ["cpu", "gpu"]  # auto on the CPU: the CPU decoder, as the evaluation's
    _agree(_rows(tmp_path / "auto.csv")[1:], _rows(tmp_path / "gpu.csv")[1:])
    with pytest.raises(SystemExit) as e:
        main([*words, "--decode", "gpus"])
    assert e.value.code == 2 and "--decode: invalid choice: 'gpus'" in capsys.readouterr().err


def test_predict_reads_a_textbook_runs_photos_as_its_evaluation_with_the_same_predictions(tmp_path):
    """A run of the textbook loader evaluated each photo's shorter side resized, then its centre (TextbookDataset
    over ImageFolderDataset); predict reads them through that loader now, by workers, and predicts as before."""
    from cnnpar.data.sources import load_predict_data
    from cnnpar.data.transforms import DeviceTransform
    from cnnpar.engine.checkpoint import load_checkpoint
    from cnnpar.models import build_model

    root = _write_photos(tmp_path / "photos")
    run_dir = _fit_photo_run(root, tmp_path / "runs", "t", loader="textbook")
    state = load_checkpoint(run_dir / "ckpt" / "last.pt", map_location="cpu")
    meta = state["meta"]
    model = build_model(meta["model"], 3, meta["num_classes"], 16, 16)
    model.load_state_dict(state["model"])
    model.eval()
    ds, ids, _ = load_predict_data(str(root), "folder", image_size=16, per_image=True)
    transform = DeviceTransform(meta["mean"], meta["std"], "none", False, torch.device("cpu"))
    rows = [["id", "label", "class_name", "confidence"]]
    with torch.no_grad():  # the old path: a DataLoader of the main process, normalised on the device
        for x, _ in torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=False):
            conf, label = model(transform(x, train=False)).float().softmax(1).max(1)
            for p, q in zip(label.tolist(), conf.tolist()):
                rows.append([ids[len(rows) - 1], str(p), meta["class_names"][p], f"{q:.5f}"])
    for workers in (0, 2):
        out = predict(str(run_dir), str(root), out=str(tmp_path / f"w{workers}.csv"), batch_size=BATCH, workers=workers)
        assert _rows(out) == rows
