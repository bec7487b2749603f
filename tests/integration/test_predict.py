"""`cnnpar predict`: a Kaggle submission.csv for CSV input, a predictions CSV for the other formats."""

from __future__ import annotations

import csv

import pytest
import torch

from cnnpar.cli import main
from cnnpar.config import Config, DataConfig, RunConfig, SpeedConfig
from cnnpar.dist import DistInfo
from cnnpar.engine.predict import predict
from cnnpar.engine.trainer import Trainer
from tests.datafiles import CLASSES, bar_images, write_npz, write_train_test_csv

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, one_thread):
    """A cnn3 trained in this process on a generated train.csv (4 bar classes, 16x16 grey)."""
    folder = tmp_path_factory.mktemp("predict")
    train, test, truth = write_train_test_csv(folder, n_train=512, n_test=64)
    cfg = Config(
        data=DataConfig(source=str(train), num_classes=CLASSES),
        speed=SpeedConfig(device="cpu"),
        run=RunConfig(epochs=2, batch_size=32, out_dir=str(folder / "runs"), name="csv", progress=False),
    )
    result = Trainer(cfg, DistInfo(0, 0, 1, torch.device("cpu")), log=lambda *a, **k: None).fit()
    assert result.summary["best_val_acc"] >= 0.9
    return folder, result.run_dir, test, truth


def _rows(path):
    with path.open(newline="") as f:
        return list(csv.reader(f))


def test_predict_csv_writes_a_kaggle_submission(cli, trained):
    folder, run_dir, test, truth = trained
    p = cli("predict", "--checkpoint", str(run_dir), "--data", str(test))
    assert p.returncode == 0, p.stderr
    rows = _rows(cli.cwd / "submission.csv")
    assert rows[0] == ["ImageId", "Label"]
    assert [int(r[0]) for r in rows[1:]] == list(range(1, len(truth) + 1))
    labels = [int(r[1]) for r in rows[1:]]
    assert sum(int(a == b) for a, b in zip(labels, truth)) / len(truth) >= 0.9


def test_predict_npz_writes_predictions_with_confidence(tmp_path, trained):
    _, run_dir, _, _ = trained
    data = write_npz(tmp_path / "d.npz", n_train=40, n_test=None)  # no x_test: x_train is predicted
    out = predict(str(run_dir / "ckpt"), str(data), out=str(tmp_path / "p.csv"))
    rows = list(csv.DictReader(out.open()))
    _, y = bar_images(40)
    assert [int(r["id"]) for r in rows] == list(range(40))
    assert all(0 < float(r["confidence"]) <= 1 for r in rows)
    assert sum(int(int(r["label"]) == t) for r, t in zip(rows, y)) / 40 >= 0.9


def test_predict_refuses_bad_input_and_writes_nothing(tmp_path, capsys, monkeypatch, trained):
    _, run_dir, test, _ = trained
    lines = test.read_text().splitlines()
    lines[3] = lines[3].replace(",230,", ",oops,", 1)
    bad = tmp_path / "test.csv"
    bad.write_text("\n".join(lines) + "\n")
    monkeypatch.chdir(tmp_path)
    assert main(["predict", "--checkpoint", str(run_dir), "--data", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}, line 4 (data row 3)" in err and "'oops' is not an integer" in err
    assert main(["predict", "--checkpoint", str(tmp_path / "nothing"), "--data", str(test)]) == 2
    assert "no checkpoint found" in capsys.readouterr().err
    assert not (tmp_path / "submission.csv").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["test.csv"]  # no temp files either
