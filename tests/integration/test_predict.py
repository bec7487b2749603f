"""`cnnpar predict`: a Kaggle submission.csv for CSV input, a predictions CSV for the other formats."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch

from cnnpar.cli import main
from cnnpar.config import Config, DataConfig, RunConfig, SpeedConfig
from cnnpar.dist import DistInfo
from cnnpar.engine.predict import predict
from cnnpar.engine.trainer import Trainer
from tests.datafiles import CLASSES, bar_images, write_npz, write_pixel_csv, write_train_test_csv

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


def test_predict_csv_writes_class_indices_where_the_model_has_class_names(tmp_path, monkeypatch, trained):
    """A model with class names wrote them into Kaggle's Label column, where a submission (and the file's own
    'label' column, which the accuracy line scores) holds the class index; other formats keep both."""
    _, run_dir, test, truth = trained
    state = torch.load(run_dir / "ckpt" / "last.pt", weights_only=True)
    named = ["north", "east", "south", "west"]
    torch.save({**state, "meta": {**state["meta"], "class_names": named}}, tmp_path / "named.pt")
    monkeypatch.chdir(tmp_path)
    assert main(["predict", "--checkpoint", "named.pt", "--data", str(test), "--out", "sub.csv"]) == 0
    rows = _rows(tmp_path / "sub.csv")
    assert rows[0] == ["ImageId", "Label"] and all(r[1] in {"0", "1", "2", "3"} for r in rows[1:])
    assert sum(int(int(r[1]) == t) for r, t in zip(rows[1:], truth)) / len(truth) >= 0.9
    data = write_npz(tmp_path / "d.npz", n_train=8, n_test=None)
    assert main(["predict", "--checkpoint", "named.pt", "--data", str(data), "--out", "p.csv"]) == 0
    by_row = list(csv.DictReader((tmp_path / "p.csv").open()))
    assert all(r["class_name"] == named[int(r["label"])] for r in by_row)


def test_predict_npz_writes_predictions_with_confidence(tmp_path, trained):
    _, run_dir, _, _ = trained
    data = write_npz(tmp_path / "d.npz", n_train=40, n_test=None)  # no x_test: x_train is predicted
    out = predict(str(run_dir / "ckpt"), str(data), out=str(tmp_path / "p.csv"))
    rows = list(csv.DictReader(out.open()))
    _, y = bar_images(40)
    assert [int(r["id"]) for r in rows] == list(range(40))
    assert all(0 < float(r["confidence"]) <= 1 for r in rows)
    assert sum(int(int(r["label"]) == t) for r, t in zip(rows, y)) / 40 >= 0.9


def _data_lines(lines: list[str]):
    """A log that keeps predict's lines on its data, without its first line naming the checkpoint it read (tested
    in test_best_checkpoint.py)."""
    return lambda line: None if line.startswith("checkpoint: ") else lines.append(line)


def test_predict_scores_an_npz_s_labels_by_its_class_names(tmp_path, trained):
    """The labels of an archive with class_names index its own names: the same names in reverse order scored
    0 % against the model's indices, without a word."""
    _, run_dir, _, _ = trained
    x, y = bar_images(64)
    names = np.array([str(k) for k in range(CLASSES)])  # the CSV-trained model's names: "0".."3"
    lines = []
    np.savez(tmp_path / "rev.npz", x_test=x, y_test=CLASSES - 1 - y, class_names=names[::-1])
    predict(str(run_dir), str(tmp_path / "rev.npz"), out=str(tmp_path / "p.csv"), log=_data_lines(lines))
    mapped = "labels mapped to the model's classes by the archive's class_names"
    assert lines[0] == f"{tmp_path / 'rev.npz'}[y_test]: {mapped}"
    assert float(lines[1].split("accuracy ")[1].split("%")[0]) >= 90, lines
    lines.clear()  # byte strings (np.array([b"3", ...])) are the same names: str() made them "b'3'"
    np.savez(tmp_path / "bytes.npz", x_test=x, y_test=CLASSES - 1 - y, class_names=names[::-1].astype("S"))
    predict(str(run_dir), str(tmp_path / "bytes.npz"), out=str(tmp_path / "b.csv"), log=_data_lines(lines))
    assert lines[0] == f"{tmp_path / 'bytes.npz'}[y_test]: {mapped}"
    assert float(lines[1].split("accuracy ")[1].split("%")[0]) >= 90, lines
    np.savez(tmp_path / "other.npz", x_test=x, y_test=y, class_names=np.array(["a", "b", "c", "d"]))
    lines.clear()
    predict(str(run_dir), str(tmp_path / "other.npz"), out=str(tmp_path / "q.csv"), log=_data_lines(lines))
    assert lines == [
        f"{tmp_path / 'other.npz'}[y_test]: ignored as labels: its class_names 'a', 'b', 'c', 'd' are not among the "
        "model's classes ('0', '1', '2', '3')"
    ]
    assert len(_rows(tmp_path / "q.csv")) == 65  # the predictions are still written


def test_predict_says_bare_index_labels_are_scored_against_a_named_model_s_classes_in_its_order(tmp_path, trained):
    """A model whose classes have names (class folders: 'north', 'east', ...) scored an archive without class_names,
    or a CSV's label column, by index without a word: labelled in another order (a folder exported with its classes
    in another order), the accuracy was against the wrong classes, and nothing said the names were never compared."""
    _, run_dir, _, _ = trained
    state = torch.load(run_dir / "ckpt" / "last.pt", weights_only=True)
    state["meta"]["class_names"] = ["north", "east", "south", "west"]
    torch.save(state, tmp_path / "named.pt")
    x, y = bar_images(64)
    np.savez(tmp_path / "bare.npz", x_test=x, y_test=y)
    labelled = write_pixel_csv(tmp_path / "labelled.csv", x, y)
    said = "its labels name no classes, so label k is scored as the model's class k (0: 'north', 1: 'east', 2: "
    for data in (tmp_path / "bare.npz", labelled):
        lines: list[str] = []
        predict(str(tmp_path / "named.pt"), str(data), out=str(tmp_path / "p.csv"), log=_data_lines(lines))
        assert lines[0].startswith(f"{data}: {said}"), lines
        assert lines[1].startswith("accuracy "), lines
        (tmp_path / "p.csv").unlink()
    lines.clear()  # the model's own classes '0'..'3': its labels were these indices, nothing to say
    predict(str(run_dir), str(tmp_path / "bare.npz"), out=str(tmp_path / "p.csv"), log=_data_lines(lines))
    assert [line for line in lines if not line.startswith("accuracy ")] == []


def test_predict_of_a_npy_names_the_labels_file_in_its_bare_index_note(tmp_path, trained):
    """`cnnpar predict --data x.npy --labels y.npy` said "x.npy: its labels name no classes": x.npy holds images
    only; the labels scored by index are the --labels file's, which the note now names."""
    _, run_dir, _, _ = trained
    state = torch.load(run_dir / "ckpt" / "last.pt", weights_only=True)
    state["meta"]["class_names"] = ["north", "east", "south", "west"]
    torch.save(state, tmp_path / "named.pt")
    x, y = bar_images(64)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    lines: list[str] = []
    predict(
        str(tmp_path / "named.pt"),
        str(tmp_path / "x.npy"),
        out=str(tmp_path / "p.csv"),
        log=_data_lines(lines),
        labels=str(tmp_path / "y.npy"),
    )
    said = "its labels name no classes, so label k is scored as the model's class k (0: 'north', 1: 'east', 2: "
    assert lines[0].startswith(f"--labels {tmp_path / 'y.npy'}: {said}"), lines
    assert lines[1].startswith("accuracy "), lines


def test_predict_says_nothing_of_bare_index_labels_it_does_not_score(tmp_path, trained):
    """Labels the named model has no class for are ignored ("ignoring y_test as labels"): the note before that line
    said they were scored as the model's classes, in its order, the line after it that they were not scored."""
    _, run_dir, _, _ = trained
    state = torch.load(run_dir / "ckpt" / "last.pt", weights_only=True)
    state["meta"]["class_names"] = ["north", "east", "south", "west"]
    torch.save(state, tmp_path / "named.pt")
    x, y = bar_images(64)
    np.savez(tmp_path / "beyond.npz", x_test=x, y_test=y + 4)
    lines: list[str] = []
    predict(
        str(tmp_path / "named.pt"), str(tmp_path / "beyond.npz"), out=str(tmp_path / "p.csv"), log=_data_lines(lines)
    )
    assert lines == [
        f"{tmp_path / 'beyond.npz'}: ignoring y_test as labels: values 4..7, but the model knows classes 0..3"
    ]


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


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--batch-size", "-1"], "--batch-size -1: expected a whole number > 0"),
        (["--batch-size", "0"], "--batch-size 0: expected a whole number > 0"),
        (["--device", "foo"], "--device 'foo': expected auto, cpu, cuda or cuda:N"),
        (["--device", "cuda"], "--device 'cuda' but no CUDA device is visible: expected --device cpu here"),
        (
            ["--out", "folder"],
            "--out folder: is a folder: expected the path of the CSV file to write (folder/ writes submission.csv "
            "in it)",
        ),
    ],
)
def test_predict_refuses_bad_arguments_in_one_line_and_writes_nothing(
    tmp_path, capsys, monkeypatch, trained, flags, expected
):
    """-1 wrote a header-only submission and exit 0; the others ended in tracebacks."""
    _, run_dir, test, _ = trained
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)  # a CPU-only machine, even on a GPU one
    (tmp_path / "folder").mkdir()
    assert main(["predict", "--checkpoint", str(run_dir), "--data", str(test), *flags]) == 2
    out, err = capsys.readouterr()
    assert err == f"cnnpar: error: {expected}\n" and "wrote" not in out
    assert [p.name for p in tmp_path.iterdir()] == ["folder"] and not any((tmp_path / "folder").iterdir())


@pytest.mark.parametrize("poison", ["nan", "huge"])
def test_predict_refuses_a_diverged_checkpoint_and_writes_nothing(tmp_path, capsys, monkeypatch, trained, poison):
    """NaN weights, or finite ones so large that the outputs overflow (what --lr 1e30 leaves): argmax
    said class 0 for every image, 'wrote', exit 0, and labelled data got an accuracy with nan confidences."""
    _, run_dir, test, _ = trained
    state = torch.load(run_dir / "ckpt" / "last.pt", weights_only=True)
    weight = state["model"]["classifier.5.weight"]
    if poison == "nan":
        weight.fill_(float("nan"))
    else:
        weight.fill_(3e38)  # the largest float32 is 3.4e38
        assert torch.isfinite(weight).all()  # finite weights, outputs that overflow
    bad = tmp_path / "diverged.pt"
    torch.save(state, bad)
    x, y = bar_images(16, seed=5)
    labelled = write_pixel_csv(tmp_path / "labelled.csv", x, y)
    monkeypatch.chdir(tmp_path)
    for data in (test, labelled):
        assert main(["predict", "--checkpoint", str(bad), "--data", str(data)]) == 2
        out, err = capsys.readouterr()
        # NaN weights, which cnnpar train never saves (its epoch stops first), are named before any image: they were
        # blamed on a diverged run and its --lr
        assert err == (
            f"cnnpar: error: {bad}: its model's classifier.5.weight holds values that are not finite (NaN or inf), "
            "which cnnpar train never saves: expected an intact checkpoint (an earlier copy of it, or train again)\n"
            if poison == "nan"
            else f"cnnpar: error: {bad}: the model's outputs on {data} are not finite (NaN or inf): its weights "
            "come from a run that diverged; expected a checkpoint of a run that trained (try a lower --lr)\n"
        )
        assert out == f"checkpoint: {bad} (epoch 2)\n"  # which file it read, and no accuracy line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["diverged.pt", "labelled.csv"]


def test_predict_refuses_another_image_size_unless_asked_to_resize(tmp_path, capsys, monkeypatch, trained):
    """A 16x16 model runs on 28x28 rows without any error and gets most of them wrong: refused."""
    _, run_dir, _, _ = trained
    x, _ = bar_images(32, side=28)
    big = write_pixel_csv(tmp_path / "big.csv", x, None)
    monkeypatch.chdir(tmp_path)
    assert main(["predict", "--checkpoint", str(run_dir), "--data", str(big)]) == 2
    err = capsys.readouterr().err
    assert f"{big}: images are 28x28: expected 16x16" in err and "--resize" in err
    assert not (tmp_path / "submission.csv").exists()
    assert main(["predict", "--checkpoint", str(run_dir), "--data", str(big), "--resize"]) == 0


def test_predict_reports_accuracy_and_warns_on_a_foreign_pixel_range(tmp_path, capsys, monkeypatch, trained):
    _, run_dir, _, _ = trained
    monkeypatch.chdir(tmp_path)
    x, y = bar_images(64, seed=3)
    labelled = write_pixel_csv(tmp_path / "labelled.csv", x, y)
    assert main(["predict", "--checkpoint", str(run_dir), "--data", str(labelled)]) == 0
    out, err = capsys.readouterr()
    assert "against its 'label' column" in out and "warning" not in err
    assert float(out.split("accuracy ")[1].split("%")[0]) >= 90

    np.savez(tmp_path / "t.npz", x_train=x, y_train=y, x_test=x // 16, y_test=y)  # 0..14: sklearn's 0..16 scale
    assert main(["predict", "--checkpoint", str(run_dir), "--data", str(tmp_path / "t.npz")]) == 0
    out, err = capsys.readouterr()
    assert f"warning: {tmp_path / 't.npz'}: pixels unlike the training data's" in err
    assert "against y_test" in out


def test_predict_digits_runs_and_says_why_it_ignores_impossible_labels(capsys, monkeypatch, tmp_path, trained):
    _, run_dir, _, _ = trained
    monkeypatch.chdir(tmp_path)
    assert main(["predict", "--checkpoint", str(run_dir), "--data", "digits"]) == 0
    captured = capsys.readouterr()
    assert (
        "ignoring scikit-learn's digit labels as labels: values 0..9, but the model knows classes 0..3" in captured.out
    )
    # the CSV-trained model reads 16x16: the digits' own 8x8 enlarged, which a model of other data is told
    assert "the built-in digits are 8x8 images, resized to the model's 16x16 (it was trained on" in captured.err
    assert main(["predict", "--checkpoint", str(run_dir), "--data", "synthetic"]) == 2
    assert "predict reads a .csv, an .npz, a .npy, an image folder or 'digits'" in capsys.readouterr().err


def test_predict_uses_the_runs_test_time_views_unless_told_and_says_a_digits_score_is_not_held_out(
    tmp_path, capsys, monkeypatch
):
    """A run evaluated with --tta-level flip+translate scored its val_acc on those views: predict's default
    (auto) predicts with them too and says so, --tta-level none gives the image alone. On the built-in digits
    the run trained on, the accuracy line says it counts training images."""
    from cnnpar.engine.step import tta_logits

    monkeypatch.chdir(tmp_path)
    cfg = Config(
        data=DataConfig(source="digits"),
        speed=SpeedConfig(device="cpu", precision="fp32"),
        run=RunConfig(epochs=1, batch_size=64, max_steps=3, out_dir="runs", name="t", progress=False,
                      tensorboard=False, tta_level="flip+translate"),
    )  # fmt: skip
    run_dir = Trainer(cfg, DistInfo(0, 0, 1, torch.device("cpu")), log=lambda *a, **k: None).fit().run_dir
    seen = []
    real = tta_logits

    def spy(model, x, flip, translate):
        seen.append((flip, translate))
        return real(model, x, flip, translate)

    monkeypatch.setattr("cnnpar.engine.predict.tta_logits", spy)
    assert main(["predict", "--checkpoint", str(run_dir), "--data", "digits", "--out", "a.csv"]) == 0
    out, err = capsys.readouterr()
    assert "the built-in digits are 8x8" not in err  # a digits run reads them as it trained: no word
    assert set(seen) == {(True, True)} and "test-time augmentation: flip+translate, as the run evaluated" in out
    assert "the run's training images among them, so not a held-out score" in out
    seen.clear()
    alone = ["predict", "--checkpoint", str(run_dir), "--data", "digits", "--tta-level", "none", "--out", "b.csv"]
    assert main(alone) == 0
    assert set(seen) == {(False, False)} and "test-time augmentation" not in capsys.readouterr().out


def test_predict_never_writes_over_its_input_and_says_why_a_folder_cannot_feed_a_grey_model(tmp_path, capsys, trained):
    """`--out` naming the --data file replaced it with the predictions (exit 0); a grey model given a folder was
    told its images "have 3 channel(s)" whatever the files held."""
    _, run_dir, test, _ = trained
    data = write_npz(tmp_path / "d.npz", n_train=40, n_test=None)
    kept = data.read_bytes()
    assert main(["predict", "--checkpoint", str(run_dir), "--data", str(data), "--out", str(data)]) == 2
    assert f"--out {data}: is the --data file: expected another path" in capsys.readouterr().err
    assert data.read_bytes() == kept
    pics = tmp_path / "pics" / "a"
    pics.mkdir(parents=True)
    from PIL import Image

    Image.new("L", (16, 16)).save(pics / "0.png")
    assert main(["predict", "--checkpoint", str(run_dir), "--data", str(tmp_path / "pics")]) == 2
    err = capsys.readouterr().err
    assert "an image folder decodes to RGB (3 channels), and the model was trained on grey images" in err, err


def test_predict_names_rows_by_the_csv_s_id_column(tmp_path, monkeypatch, trained):
    """Kannada MNIST's test.csv is `id,pixel0,...` and its submission `id,label`: the id column was read as a
    pixel and the file refused ('257 pixel columns is not a square grey image'). Its values are kept as written."""
    _, run_dir, test, truth = trained
    lines = test.read_text().splitlines()
    monkeypatch.chdir(tmp_path)
    for name, label in (("id", "label"), ("ImageId", "Label")):
        data = tmp_path / f"{name}.csv"
        data.write_text("\n".join([f"{name},{lines[0]}"] + [f"{k:03d},{r}" for k, r in enumerate(lines[1:], 7)]))
        assert main(["predict", "--checkpoint", str(run_dir), "--data", str(data), "--out", f"{name}_out.csv"]) == 0
        rows = _rows(tmp_path / f"{name}_out.csv")
        assert rows[0] == [name, label]
        assert [r[0] for r in rows[1:]] == [f"{k:03d}" for k in range(7, 7 + len(truth))]
        assert sum(int(int(r[1]) == t) for r, t in zip(rows[1:], truth)) / len(truth) >= 0.9


def test_predict_reads_pixel_columns_sorted_as_text_by_their_numbers_and_says_so(tmp_path, capsys, trained):
    """test.csv with its columns sorted as text (pixel0, pixel1, pixel10, ...) scored 0 % read by position."""
    _, run_dir, test, truth = trained
    rows = [line.split(",") for line in test.read_text().splitlines()]
    by_text = sorted(range(len(rows[0])), key=lambda j: rows[0][j])
    data = tmp_path / "sorted.csv"
    data.write_text("\n".join(",".join(row[j] for j in by_text) for row in rows) + "\n")
    assert main(["predict", "--checkpoint", str(run_dir), "--data", str(data), "--out", str(tmp_path / "o.csv")]) == 0
    assert f"note: {data}: pixel columns read in the order of their numbers" in capsys.readouterr().err
    labels = [int(r[1]) for r in _rows(tmp_path / "o.csv")[1:]]
    assert sum(int(a == b) for a, b in zip(labels, truth)) / len(truth) >= 0.9


def test_predict_says_a_pixel_count_against_the_models_input(tmp_path, capsys, monkeypatch, trained):
    """255 pixel columns for a 16x16 model: it said '255 pixel columns is not a square grey image: give the
    shape, for example --image-shape 3x32x32', naming neither the model's shape nor the count it needs."""
    _, run_dir, test, _ = trained
    short = tmp_path / "short.csv"
    short.write_text("\n".join(r.rsplit(",", 1)[0] for r in test.read_text().splitlines()) + "\n")
    monkeypatch.chdir(tmp_path)
    assert main(["predict", "--checkpoint", str(run_dir), "--data", str(short)]) == 2
    assert capsys.readouterr().err == (
        f"cnnpar: error: {short}: 255 pixel columns: expected 256, one per value of the 1x16x16 images the model "
        "was trained on\n"
    )
    assert main(["predict", "--checkpoint", str(run_dir), "--data", str(short), "--image-shape", "1x16x16"]) == 2
    assert capsys.readouterr().err == (
        f"cnnpar: error: {short}: 255 pixel columns do not fit --image-shape 1x16x16 (256 values); the model was "
        "trained on 1x16x16 images (256 values)\n"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["short.csv"]


def test_predict_runs_on_the_gpu_by_default_where_one_is_visible(monkeypatch):
    """--device was cpu by default: a user with a GPU predicted on the CPU unless told otherwise."""
    from cnnpar.engine.predict import _device

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert _device("auto") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert _device("auto") == torch.device("cuda", 0)
    assert _device("cpu") == torch.device("cpu")  # typed, it stays


def test_predicts_default_device_is_auto():
    from cnnpar.cli import build_parser

    assert build_parser().parse_args(["predict", "--checkpoint", "c", "--data", "d"]).device == "auto"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_predict_by_default_on_the_gpu_gives_the_cpus_labels(tmp_path, trained):
    _, run_dir, _, _ = trained
    data = write_npz(tmp_path / "d.npz", n_train=40, n_test=None)
    rows = {}
    for device in ("auto", "cpu"):
        out = predict(str(run_dir / "ckpt"), str(data), out=str(tmp_path / f"{device}.csv"), device=device)
        rows[device] = list(csv.DictReader(out.open()))
    pairs = list(zip(rows["auto"], rows["cpu"], strict=True))
    # the run's precision both ways (bf16 where this CPU has it natively, else fp32, whose cuDNN convolutions may use
    # TF32): rounding, not another model (passed on an H200 host, call ZZZZK)
    assert max(abs(float(a["confidence"]) - float(b["confidence"])) for a, b in pairs) < 1e-2
    assert all(a["label"] == b["label"] for a, b in pairs if float(b["confidence"]) > 0.6)  # no near-ties


def _confidences(path) -> list[float]:
    return [float(r["confidence"]) for r in csv.DictReader(path.open())]


def test_predict_runs_in_the_precision_the_run_evaluated_in(tmp_path, trained):
    """Validation scores under the run's autocast (bf16 here); predict ran in fp32, and its accuracy on the run's own
    held-out images differed from val_acc in borderline images."""
    from cnnpar.data.arrays import to_nchw_uint8
    from cnnpar.engine.checkpoint import load_checkpoint
    from cnnpar.models import build_model

    _, run_dir, _, _ = trained
    state = load_checkpoint(run_dir / "ckpt" / "last.pt", map_location="cpu")
    state["config"]["speed"]["precision"] = "bf16"
    torch.save(state, tmp_path / "bf16.pt")
    # noise: confidences well below 1, where the two precisions' differences show in five decimals
    noise = np.random.default_rng(0).integers(0, 256, (64, 16, 16), dtype=np.uint8)
    np.savez(data := tmp_path / "d.npz", x_train=noise)
    out = predict(str(tmp_path / "bf16.pt"), str(data), out=str(tmp_path / "p.csv"))

    meta = state["meta"]
    model = build_model(meta["model"], *meta["image_shape"][:1], meta["num_classes"], *meta["image_shape"][1:])
    model.load_state_dict(state["model"])
    model.eval()
    x = to_nchw_uint8(np.load(data)["x_train"], "x_train")
    x = (x.float().div(255) - torch.tensor(meta["mean"]).view(1, -1, 1, 1)) / torch.tensor(meta["std"]).view(
        1, -1, 1, 1
    )
    with torch.no_grad():
        fp32 = model(x).softmax(1).max(1).values
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = model(x).float().softmax(1).max(1).values
    got = torch.tensor(_confidences(out))
    assert torch.allclose(got, bf16, atol=2e-5)
    assert (got - fp32).abs().max() > 1e-4  # the test tells the two apart


def test_predict_reads_a_folder_as_validation_did(tmp_path, capsys):
    """Validation reads a folder's photos as the centre square resized (CpuDecodedFolder, and the GPU decoders'
    same boxes); predict resized the shorter side, then cropped: other pixels, over 20 levels apart on these
    noise photos. Predict now scores the pixels validation scored."""
    from cnnpar.data.cpu_decode import CpuDecodedFolder
    from cnnpar.data.folder import ImageFolderDataset, image_files
    from cnnpar.data.transforms import DeviceTransform
    from cnnpar.engine.checkpoint import load_checkpoint
    from cnnpar.models import build_model
    from tests.datafiles import write_noise_jpegs

    root = write_noise_jpegs(tmp_path / "photos", n=12, first_height=37, width=61)
    cfg = Config(
        data=DataConfig(source=str(root), image_size=16, workers=0, decode="cpu"),
        speed=SpeedConfig(device="cpu", precision="fp32"),
        run=RunConfig(epochs=1, batch_size=4, out_dir=str(tmp_path / "runs"), name="f", progress=False,
                      tensorboard=False),
    )  # fmt: skip
    run_dir = Trainer(cfg, DistInfo(0, 0, 1, torch.device("cpu")), log=lambda *a, **k: None).fit().run_dir
    out = predict(str(run_dir), str(root), out=str(tmp_path / "p.csv"))

    state = load_checkpoint(run_dir / "ckpt" / "last.pt", map_location="cpu")
    meta = state["meta"]
    model = build_model(meta["model"], 3, meta["num_classes"], 16, 16)
    model.load_state_dict(state["model"])
    model.eval()
    files = image_files(root)
    transform = DeviceTransform(meta["mean"], meta["std"], "none", False, torch.device("cpu"))
    validation_way = CpuDecodedFolder(files, [0] * len(files), 16, train=False)[list(range(len(files)))][0]
    per_image = torch.stack([ImageFolderDataset(files, [0] * len(files), 16)[i][0] for i in range(len(files))])
    assert (validation_way.int() - per_image.int()).abs().max() > 20  # the two ways differ on these photos
    with torch.no_grad():
        expected = model(transform(validation_way, train=False)).softmax(1).max(1).values
    assert torch.allclose(torch.tensor(_confidences(out)), expected, atol=2e-5)
    capsys.readouterr()
    again = predict(str(run_dir), str(root), out=str(tmp_path / "q.csv"), image_shape="3x16x16", resize=True)
    assert capsys.readouterr().err == (  # they were silently ignored
        f"cnnpar: note: --image-shape 3x16x16 not used: it shapes CSV rows, and {root} is an image folder, whose "
        "photos are resized to the model's 16x16 as the run's validation read them\n"
        f"cnnpar: note: --resize not used: it resizes CSV, .npz and .npy images, and {root} is an image folder, whose "
        "photos are resized to the model's 16x16 as the run's validation read them\n"
    )
    assert again.read_bytes() == out.read_bytes()


def test_predict_on_the_folder_of_a_store_run_reads_it_as_the_store_was_prepared(tmp_path, capsys):
    """A run from a store keeps how `cnnpar prepare` resized the photos (the checkpoint's `prepared_sides`), and
    predict on their folder resizes them so: its predictions are those of the pixels the run validated on."""
    from cnnpar.data.sources import load_predict_data
    from cnnpar.data.store_write import prepare_store
    from cnnpar.data.transforms import DeviceTransform
    from cnnpar.engine.checkpoint import load_checkpoint
    from cnnpar.models import build_model
    from tests.datafiles import write_noise_jpegs

    root = write_noise_jpegs(tmp_path / "photos", n=12, first_height=48, width=64)
    store = tmp_path / "photos.cnnpar"
    prepare_store(root, store, workers=1, progress=False, short_side=24)
    cfg = Config(
        data=DataConfig(source=str(store), image_size=16, workers=0),
        speed=SpeedConfig(device="cpu", precision="fp32"),
        run=RunConfig(epochs=1, batch_size=4, out_dir=str(tmp_path / "runs"), name="s", progress=False,
                      tensorboard=False),
    )  # fmt: skip
    run_dir = Trainer(cfg, DistInfo(0, 0, 1, torch.device("cpu")), log=lambda *a, **k: None).fit().run_dir
    lines: list[str] = []
    out = predict(str(run_dir), str(root), out=str(tmp_path / "p.csv"), log=lines.append)
    assert any("resized as the run's store was prepared (shorter side <= 24)" in line for line in lines), lines

    state = load_checkpoint(run_dir / "ckpt" / "last.pt", map_location="cpu")
    meta = state["meta"]
    assert meta["prepared_sides"] == {"max_side": 0, "short_side": 24}
    model = build_model(meta["model"], 3, meta["num_classes"], 16, 16)
    model.load_state_dict(state["model"])
    model.eval()
    ds, _, _ = load_predict_data(str(root), "folder", image_size=16, prepared=meta["prepared_sides"])
    transform = DeviceTransform(meta["mean"], meta["std"], "none", False, torch.device("cpu"))
    with torch.no_grad():
        expected = model(transform(ds[list(range(len(ds)))][0], train=False)).softmax(1).max(1).values
    assert torch.allclose(torch.tensor(_confidences(out)), expected, atol=2e-5)

    # a checkpoint from before prepared_sides was recorded: the folder is read another way, said rather than silent
    del state["meta"]["prepared_sides"]
    torch.save(state, old := tmp_path / "old.pt")
    capsys.readouterr()
    lines.clear()
    predict(str(old), str(root), out=str(tmp_path / "old.csv"), log=lines.append)
    assert capsys.readouterr().err == (
        f"warning: {old}: its run trained from the store {store}, and the checkpoint predates recording how the store "
        f"was prepared (prepared_sides): {root} is read as a folder run's validation reads it, not as the store was "
        "prepared, so some predictions may differ from the run's\n"
    )
    assert not any("resized as the run's store was prepared" in line for line in lines), lines


def _copy_run(run_dir, to):
    import shutil

    return shutil.copytree(run_dir, to)


def test_predict_never_writes_into_the_checkpoint_folder_it_reads(tmp_path, capsys, monkeypatch, trained):
    """`--checkpoint RUN --out RUN/ckpt/last.pt` replaced the run's checkpoint with the submission (exit 0): only the
    path as typed was compared with --out, never the file a run folder leads to, nor its best.pt."""
    _, run_dir, test, _ = trained
    run = _copy_run(run_dir, tmp_path / "run")
    kept = {p.name: p.read_bytes() for p in (run / "ckpt").iterdir()}
    monkeypatch.chdir(tmp_path)
    cases = [
        ("run", "run/ckpt/last.pt", "--out run/ckpt/last.pt: is the --checkpoint file: expected another path"),
        ("run", "run/ckpt/best.pt", "--out run/ckpt/best.pt: lies in the run's checkpoint folder run/ckpt: expected"),
        ("run", "run/ckpt/p.csv", "--out run/ckpt/p.csv: lies in the run's checkpoint folder run/ckpt: expected"),
        ("run/ckpt/best.pt", "run/ckpt/last.pt", "--out run/ckpt/last.pt: lies in the run's checkpoint folder"),
    ]
    for checkpoint, out, expected in cases:
        assert main(["predict", "--checkpoint", checkpoint, "--data", str(test), "--out", out]) == 2
        printed, err = capsys.readouterr()
        assert err.startswith(f"cnnpar: error: {expected}") and err.count("\n") == 1, err
        assert printed == ""  # refused before the checkpoint was read
    assert {p.name: p.read_bytes() for p in (run / "ckpt").iterdir()} == kept
    loose = tmp_path / "loose"  # a checkpoint outside a run folder: its neighbour best.pt is a checkpoint too
    loose.mkdir()
    (loose / "last.pt").write_bytes(kept["last.pt"])
    assert main(["predict", "--checkpoint", "loose/last.pt", "--data", str(test), "--out", "loose/best.pt"]) == 2
    assert capsys.readouterr().err == (
        "cnnpar: error: --out loose/best.pt: is the run's best.pt: expected another path for the predictions\n"
    )


def test_predict_never_writes_over_the_runs_own_records(tmp_path, capsys, monkeypatch, trained):
    """`--out RUN/config.toml` wrote predictions over it (exit 0), and the run could no longer be resumed."""
    _, run_dir, test, _ = trained
    run = _copy_run(run_dir, tmp_path / "run")
    monkeypatch.chdir(tmp_path)
    for name in ("config.toml", "metrics.csv", "summary.json", "resumes.csv"):
        kept = (run / name).read_bytes() if (run / name).exists() else None
        assert main(["predict", "--checkpoint", "run", "--data", str(test), "--out", f"run/{name}"]) == 2
        assert capsys.readouterr().err == (
            f"cnnpar: error: --out run/{name}: is the run's own {name}: expected another path for the predictions "
            "(the run could no longer be resumed or reported)\n"
        )
        assert ((run / name).read_bytes() if (run / name).exists() else None) == kept
    assert main(["predict", "--checkpoint", "run", "--data", str(test), "--out", "run/submission.csv"]) == 0


def test_predict_refuses_an_unwritable_out_before_predicting_and_a_failed_write_in_one_line(
    tmp_path, capsys, monkeypatch, trained
):
    """An --out under a file, or where no file can be made, ended in a traceback after every image was predicted;
    a full disk at the write ended in one too."""
    import errno

    _, run_dir, test, _ = trained
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("a file")
    base = ["predict", "--checkpoint", str(run_dir), "--data", str(test)]
    assert main([*base, "--out", "file/sub.csv"]) == 2
    printed, err = capsys.readouterr()
    assert err == "cnnpar: error: --out file/sub.csv: lies under file, a file: expected a path in a folder\n"
    assert printed == ""  # nothing was predicted
    if Path("/proc/self").is_dir():  # no file can be made in /proc, root or not
        assert main([*base, "--out", "/proc/p.csv"]) == 2
        printed, err = capsys.readouterr()
        assert err.startswith("cnnpar: error: --out /proc/p.csv: cannot be written (") and printed == ""
        assert err.endswith("): expected a path in a folder where files can be made\n")

    def full_disk(self, rows):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(csv.DictWriter, "writerows", full_disk)
    assert main([*base, "--out", "p.csv"]) == 2
    assert capsys.readouterr().err == (
        "cnnpar: error: --out p.csv: cannot be written (No space left on device): expected room for it (free disk "
        "space, a higher file size limit)\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # no submission, no temporary file


def test_predict_writes_inside_an_out_ending_in_a_slash_and_never_over_a_pipe(tmp_path, capsys, monkeypatch, trained):
    """`--out results/` wrote a file named results; `--out` naming a pipe or a device (/dev/null) renamed the
    predictions over it."""
    import os

    _, run_dir, test, _ = trained
    monkeypatch.chdir(tmp_path)
    assert main(["predict", "--checkpoint", str(run_dir), "--data", str(test), "--out", "results/"]) == 0
    assert _rows(tmp_path / "results" / "submission.csv")[0] == ["ImageId", "Label"]
    os.mkfifo(tmp_path / "pipe")
    capsys.readouterr()
    assert main(["predict", "--checkpoint", str(run_dir), "--data", str(test), "--out", "pipe"]) == 2
    assert capsys.readouterr() == (
        "",
        "cnnpar: error: --out pipe: is not a regular file (a device or a pipe): expected the path of a CSV file\n",
    )
    assert (tmp_path / "pipe").is_fifo()


def test_predict_refuses_a_checkpoint_whose_meta_does_not_fit_its_weights_in_one_line(
    tmp_path, capsys, monkeypatch, trained
):
    """A meta that disagrees with the weights, a meta without a key predict reads, or no weights: tracebacks."""
    _, run_dir, test, _ = trained
    state = torch.load(run_dir / "ckpt" / "last.pt", weights_only=True)
    monkeypatch.chdir(tmp_path)
    edits = {
        "classes.pt": lambda s: s["meta"].update(num_classes=5, class_names=list("01234")),
        "nomean.pt": lambda s: s["meta"].pop("mean"),
        "noweights.pt": lambda s: s.pop("model"),
    }
    expected = {
        "classes.pt": "classes.pt: its weights do not fit the cnn3 its meta describes, for 5 classes of 1x16x16 "
        "images (classifier.5.weight is [4, 128], the model's [5, 128]): expected a checkpoint written by this "
        "cnnpar's train for that model",
        "nomean.pt": "nomean.pt: not a checkpoint predict can read (its meta has no 'mean'): expected a checkpoint of "
        "cnnpar train",
        "noweights.pt": "noweights.pt: not a checkpoint predict can read (no 'model' weights): expected a checkpoint "
        "of cnnpar train",
    }
    for name, edit in edits.items():
        edited = {**state, "meta": dict(state["meta"])}
        edit(edited)
        torch.save(edited, tmp_path / name)
        assert main(["predict", "--checkpoint", name, "--data", str(test)]) == 2
        assert capsys.readouterr().err == f"cnnpar: error: {expected[name]}\n"
    assert not (tmp_path / "submission.csv").exists()


def test_predict_says_an_unreadable_best_pt_cannot_be_read(tmp_path, trained):
    """A cut-short best.pt was recommended as holding "the best validation epoch, 0"."""
    from cnnpar.engine.checkpoint import load_checkpoint
    from cnnpar.engine.predict import checkpoint_line

    _, run_dir, _, _ = trained
    run = _copy_run(run_dir, tmp_path / "run")
    best = run / "ckpt" / "best.pt"
    best.write_bytes(best.read_bytes()[: best.stat().st_size // 2])
    last = run / "ckpt" / "last.pt"
    assert checkpoint_line(last, load_checkpoint(last)) == (
        f"checkpoint: {last} (epoch 2); {best}, meant to hold the best validation epoch, cannot be read (cut short "
        "or damaged?)"
    )


def test_predict_names_best_pt_where_a_run_folder_holds_only_it(tmp_path, capsys, trained):
    _, run_dir, test, _ = trained
    run = _copy_run(run_dir, tmp_path / "run")
    (run / "ckpt" / "last.pt").unlink()
    assert main(["predict", "--checkpoint", str(run), "--data", str(test), "--out", str(tmp_path / "p.csv")]) == 2
    best = run / "ckpt" / "best.pt"
    assert capsys.readouterr().err == (
        f"cnnpar: error: {run}: no checkpoint of its last epoch ({run / 'ckpt' / 'last.pt'}), but {best} holds the "
        f"best epoch's weights: expected --checkpoint {best} to predict with them\n"
    )


def test_predict_reads_a_csv_under_another_name_with_format(tmp_path, capsys, monkeypatch, trained):
    """The message advised `--format`, which predict did not have, and named a store, which it refuses."""
    _, run_dir, test, truth = trained
    monkeypatch.chdir(tmp_path)
    txt = tmp_path / "test.txt"
    txt.write_bytes(test.read_bytes())
    assert main(["predict", "--checkpoint", str(run_dir), "--data", str(txt)]) == 2
    assert capsys.readouterr().err == (
        f"cnnpar: error: {txt}: cannot tell its format from the name: expected a .csv (or .csv.gz), an .npz, a .npy, "
        "an image folder or 'digits' (or give --format csv, npz, npy or folder)\n"
    )
    assert main(["predict", "--checkpoint", str(run_dir), "--data", str(txt), "--format", "csv"]) == 0
    assert len(_rows(tmp_path / "submission.csv")) == 1 + len(truth)


@pytest.mark.parametrize("unknown", [-1, 1_000_000])
def test_predict_ignores_labels_the_model_has_no_class_for_as_the_readme_says(
    tmp_path, capsys, monkeypatch, trained, unknown
):
    """A label column of -1 (a usual 'unknown') was refused by training's range check: no submission."""
    _, run_dir, _, _ = trained
    monkeypatch.chdir(tmp_path)
    x, _ = bar_images(16, seed=4)
    data = write_pixel_csv(tmp_path / "unknown.csv", x, np.full(16, unknown))
    assert main(["predict", "--checkpoint", str(run_dir), "--data", str(data)]) == 0
    assert (
        f"{data}: ignoring its 'label' column as labels: values {unknown}..{unknown}, but the model knows classes 0..3"
        in capsys.readouterr().out
    )
    assert len(_rows(tmp_path / "submission.csv")) == 17


def test_predict_warns_of_an_id_column_that_repeats_an_id(tmp_path, capsys, monkeypatch, trained):
    _, run_dir, test, _ = trained
    lines = test.read_text().splitlines()
    data = tmp_path / "ids.csv"
    data.write_text("\n".join([f"ImageId,{lines[0]}"] + [f"{k},{r}" for k, r in zip((1, 2, 3, 2, 3), lines[1:6])]))
    monkeypatch.chdir(tmp_path)
    assert main(["predict", "--checkpoint", str(run_dir), "--data", str(data)]) == 0
    assert (
        f"warning: {data}, line 5 (data row 4), column 'ImageId': id '2' repeats that of line 3 (data row 2): each "
        "row is predicted, but a submission expects each id once\n"
    ) in capsys.readouterr().err
    assert [r[0] for r in _rows(tmp_path / "submission.csv")[1:]] == ["1", "2", "3", "2", "3"]


def test_predict_notes_image_shape_and_resize_where_they_do_nothing(tmp_path, capsys, monkeypatch, trained):
    """They were silently ignored for an .npz, a folder and the built-in digits."""
    _, run_dir, _, _ = trained
    monkeypatch.chdir(tmp_path)
    data = write_npz(tmp_path / "d.npz", n_train=16, n_test=None)
    assert main(["predict", "--checkpoint", str(run_dir), "--data", str(data), "--image-shape", "3x8x8"]) == 0
    assert capsys.readouterr().err == (
        f"cnnpar: note: --image-shape 3x8x8 not used: it shapes CSV rows, and {data} is an .npz, whose arrays keep "
        "their own shape\n"
    )
    assert main(["predict", "--checkpoint", str(run_dir), "--data", str(data), "--resize"]) == 0
    assert capsys.readouterr().err == ""  # --resize resizes an .npz's arrays
    assert main(["predict", "--checkpoint", str(run_dir), "--data", "digits", "--resize"]) == 0
    assert capsys.readouterr().err.splitlines()[0] == (
        "cnnpar: note: --resize not used: it resizes CSV, .npz and .npy images, and digits is the built-in digits, "
        "resized to the model's 16x16"
    )


def test_the_digits_note_is_said_only_where_they_are_resized():
    """A model of 8x8 images was told the digits were "resized to the model's 8x8" (session 33 review)."""
    from cnnpar.engine.predict import digits_resize_note

    assert digits_resize_note("kag.csv", 8, 8) == "" and digits_resize_note("digits", 16, 16) == ""
    assert digits_resize_note("kag.csv", 28, 28).endswith("resized to the model's 28x28 (it was trained on kag.csv)")


def _renamed(run_dir, to: Path, names: list[str]) -> Path:
    """The trained run's last.pt under other class names (what numbered or odd class folders would give)."""
    state = torch.load(run_dir / "ckpt" / "last.pt", weights_only=True)
    torch.save({**state, "meta": {**state["meta"], "class_names": names}}, to)
    return to


def test_predict_writes_and_scores_the_numbers_of_classes_named_by_numbers(tmp_path, capsys, monkeypatch, trained):
    """Folders 0, 1, 10, 11 sort as text, so folder 10 is class 2: Label 2 was written for it, and a labels file
    holding the folders' numbers scored ~50 % with no word. The number is written and scored, and said."""
    _, run_dir, _, _ = trained
    monkeypatch.chdir(tmp_path)
    names = ["0", "1", "10", "11"]
    ckpt = _renamed(run_dir, tmp_path / "numbered.pt", names)
    x, y = bar_images(64, seed=3)
    numbers = np.array([int(names[t]) for t in y])
    data = write_pixel_csv(tmp_path / "labelled.csv", x, numbers)
    assert main(["predict", "--checkpoint", str(ckpt), "--data", str(data), "--out", "sub.csv"]) == 0
    out, err = capsys.readouterr()
    assert "note: the model's classes are named by numbers (0, 1, 10, 11" in err
    assert float(out.split("accuracy ")[1].split("%")[0]) >= 90
    labels = [int(r[1]) for r in _rows(tmp_path / "sub.csv")[1:]]
    assert set(labels) <= {0, 1, 10, 11}
    assert sum(int(a == b) for a, b in zip(labels, numbers)) / len(labels) >= 0.9

    np.savez(tmp_path / "t.npz", x_test=x, y_test=numbers)  # no class_names: its labels are the numbers too
    assert main(["predict", "--checkpoint", str(ckpt), "--data", str(tmp_path / "t.npz"), "--out", "p.csv"]) == 0
    assert float(capsys.readouterr().out.split("accuracy ")[1].split("%")[0]) >= 90
    rows = list(csv.DictReader((tmp_path / "p.csv").open()))
    assert all(r["label"] == r["class_name"] for r in rows)

    write_pixel_csv(tmp_path / "indices.csv", x, y)  # 2 and 3 are no class's number: not scored as anything
    assert main(["predict", "--checkpoint", str(ckpt), "--data", "indices.csv", "--out", "s2.csv"]) == 0
    assert "values 2, 3 are not among the class numbers 0, 1, 10, 11" in capsys.readouterr().out


def test_predict_keeps_indices_where_numbered_classes_are_their_indices(tmp_path, capsys, monkeypatch, trained):
    _, run_dir, _, truth = trained
    monkeypatch.chdir(tmp_path)
    ckpt = _renamed(run_dir, tmp_path / "digits.pt", ["0", "1", "2", "3"])
    x, y = bar_images(64, seed=3)
    data = write_pixel_csv(tmp_path / "labelled.csv", x, y)
    assert main(["predict", "--checkpoint", str(ckpt), "--data", str(data), "--out", "sub.csv"]) == 0
    out, err = capsys.readouterr()
    assert "named by numbers" not in err and float(out.split("accuracy ")[1].split("%")[0]) >= 90


def test_predict_escapes_a_class_name_that_is_not_utf8(tmp_path, trained):
    """A Latin-1 class folder (caf\\xe9, a lone surrogate once read) stopped the write with a traceback."""
    _, run_dir, _, _ = trained
    ckpt = _renamed(run_dir, tmp_path / "latin.pt", ["caf\udce9", "b", "c", "d"])
    data = write_npz(tmp_path / "d.npz", n_train=16, n_test=None)
    out = predict(str(ckpt), str(data), out=str(tmp_path / "p.csv"), log=lambda *a: None)
    names = {r["class_name"] for r in csv.DictReader(out.open(encoding="utf-8"))}
    assert "caf\\xe9" in names and names <= {"caf\\xe9", "b", "c", "d"}


def test_predict_batch_size_is_the_images_of_each_forward_pass_and_changes_no_prediction(
    tmp_path, monkeypatch, trained
):
    """--batch-size 24 on 64 rows: forward passes of 24, 24 and 16 images, the predictions those of one pass."""
    from cnnpar.engine import predict as predict_mod

    _, run_dir, test, _ = trained
    monkeypatch.chdir(tmp_path)
    sizes: list[int] = []

    def counted(ds, *args):
        for x in batches(ds, *args):
            sizes.append(len(x))
            yield x

    batches = predict_mod._inputs
    monkeypatch.setattr(predict_mod, "_inputs", counted)
    assert main(["predict", "--checkpoint", str(run_dir), "--data", str(test), "--out", "one.csv"]) == 0
    assert sizes == [64]  # the default 256: one pass
    sizes.clear()
    words = ["predict", "--checkpoint", str(run_dir), "--data", str(test), "--batch-size", "24", "--out", "three.csv"]
    assert main(words) == 0
    assert sizes == [24, 24, 16]
    assert _rows(tmp_path / "three.csv") == _rows(tmp_path / "one.csv")
