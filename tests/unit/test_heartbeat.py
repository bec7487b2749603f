"""Long loops say what they do where no progress bar is drawn (a log file, nohup, CI): the epoch, the evaluation,
prepare and predict print a line every heartbeat.EVERY_S, and a big .npz is named before it is read. Short runs
print nothing new, and --no-progress keeps the bar's lines off. Under pytest stderr is not a terminal, as in a log."""

from __future__ import annotations

import io

import pytest

import cnnpar.data.sources as sources
import cnnpar.report.heartbeat as heartbeat
from cnnpar.config import Config
from cnnpar.dist import init_distributed
from cnnpar.presets import with_overrides
from tests.datafiles import write_image_folder, write_npz

pytestmark = pytest.mark.usefixtures("one_thread")  # one intra-op thread for the in-process runs (conftest)


def _train(tmp_path, name: str, progress: bool = True, source: str = "synthetic") -> list[str]:
    from cnnpar.engine.trainer import Trainer

    cfg = with_overrides(
        Config(),
        data={"source": source, "image_shape": "" if source != "synthetic" else "3x8x8", "synthetic_samples": 256},
        model={"name": "cnn3"},
        speed={"device": "cpu"},
        run={"epochs": 1, "batch_size": 64, "out_dir": str(tmp_path), "name": name, "progress": progress},
    )
    lines: list[str] = []
    Trainer(cfg, init_distributed("cpu", debug_single=True), log=lambda *a, **k: lines.append(str(a[0]))).fit()
    return lines


def _beats(lines: list[str]) -> list[str]:
    return [ln for ln in lines if ln.startswith(("epoch 1/1: ", "evaluating: "))]


def test_a_log_gets_the_epoch_and_the_evaluation_every_interval(tmp_path, monkeypatch):
    assert _beats(_train(tmp_path, "short")) == []  # the default interval: a run shorter than it says nothing new
    monkeypatch.setattr(heartbeat, "EVERY_S", 0.0)  # every batch is "30 s later"
    assert _beats(_train(tmp_path, "quiet", progress=False)) == []  # --no-progress: no bar, and no lines for it
    beats = _beats(_train(tmp_path, "beat"))
    train = [ln for ln in beats if ln.startswith("epoch 1/1: ")]
    evals = [ln for ln in beats if ln.startswith("evaluating: ")]
    # 256 synthetic images, a fifth held out: 3 full training batches of 64, and one evaluation batch
    assert [ln.split(",")[0] for ln in train] == [f"epoch 1/1: {k}/3 batches" for k in (1, 2, 3)]
    assert evals and evals[-1].startswith("evaluating: 1/1 batches, ") and evals[-1].endswith(" s")


def test_a_terminal_keeps_its_bar_and_gets_no_epoch_lines(tmp_path, monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(heartbeat, "EVERY_S", 0.0)
    monkeypatch.setattr("sys.stderr", Terminal())  # tqdm draws its bar there
    beats = _beats(_train(tmp_path, "tty"))
    assert beats and all(ln.startswith("evaluating: ") for ln in beats)  # evaluation has no bar, even there


def test_a_big_npz_is_named_before_it_is_read(tmp_path, monkeypatch):
    data = write_npz(tmp_path / "big.npz", n_train=128, n_test=32)
    assert not any(ln.startswith("data: reading") for ln in _train(tmp_path, "small", source=str(data)))
    monkeypatch.setattr(sources, "READ_LINE_BYTES", data.stat().st_size)
    lines = _train(tmp_path, "big", source=str(data))
    assert lines[0] == f"data: reading {data} ({data.stat().st_size / 2**30:.1f} GiB) into memory"


def test_a_folder_s_scan_says_how_far_it_is_where_it_takes_long(tmp_path, monkeypatch):
    """A folder's listing and its sampled headers said nothing however long they took (long_read_line names only
    big .npz and CSV files before their read, and said a folder's scan spoke for itself)."""
    root = write_image_folder(tmp_path / "photos", per_class=3, classes=2)

    def scan_lines(name: str, progress: bool = True) -> list[str]:
        said = _train(tmp_path, name, progress, str(root))
        return [ln for ln in said if ln.startswith(("data: scanning ", "data: reading image headers "))]

    assert scan_lines("short") == []  # the default interval: a short scan says nothing new
    monkeypatch.setattr(heartbeat, "EVERY_S", 0.0)  # every class folder and header is "30 s later"
    assert scan_lines("quiet", progress=False) == []  # --no-progress
    lines = scan_lines("beat")
    listed = [ln.rsplit(",", 1)[0] for ln in lines if ln.startswith(f"data: scanning {root}: ")]
    assert listed == [f"data: scanning {root}: {k} images found" for k in (3, 6)], lines  # after each class folder
    headers = [ln.rsplit(",", 1)[0] for ln in lines if ln.startswith(f"data: reading image headers in {root}: ")]
    assert headers == [f"data: reading image headers in {root}: {k}/6 files" for k in range(1, 7)], lines


def test_prepare_and_verify_say_how_far_they_are_where_their_bar_is_not_drawn(tmp_path, monkeypatch, capsys):
    from cnnpar.data import store
    from cnnpar.data.store import verify_store
    from cnnpar.data.store_write import prepare_store

    root = write_image_folder(tmp_path / "photos", per_class=3, classes=2)
    prepare_store(root, tmp_path / "a.cnnpar", workers=1)
    assert "prepare photos:" not in capsys.readouterr().out  # the default interval: a short prepare says nothing new
    monkeypatch.setattr(heartbeat, "EVERY_S", 0.0)
    prepare_store(root, tmp_path / "b.cnnpar", workers=1, progress=False)
    assert "prepare photos:" not in capsys.readouterr().out  # --no-progress
    prepare_store(root, tmp_path / "c.cnnpar", workers=1)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("prepare photos: ")]
    assert lines[0].startswith("prepare photos: 1/6 images, ") and lines[-1].startswith("prepare photos: 6/6 images")
    verify_store(tmp_path / "c.cnnpar", progress=False)
    assert "verify c.cnnpar:" not in capsys.readouterr().out
    monkeypatch.setattr(store, "CHUNK_BYTES", 2**20)  # 1 MiB chunks for a few MiB of pixels
    big = prepare_store(write_image_folder(tmp_path / "big", per_class=4, side=512), tmp_path / "d.cnnpar", 512, 1)
    verify_store(tmp_path / "d.cnnpar")
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("verify d.cnnpar: ")]
    mib = big["pixel_bytes"] >> 20
    assert lines[0].startswith(f"verify d.cnnpar: 1/{mib} MiB, ") and lines[-1].startswith(f"verify d.cnnpar: {mib}/")


def test_predict_says_how_far_it_is(tmp_path, monkeypatch):
    from cnnpar.engine.predict import predict

    data = write_npz(tmp_path / "d.npz", n_train=128, n_test=64)  # predict reads x_test
    _train(tmp_path, "run", source=str(data))
    said: list[str] = []
    predict(str(tmp_path / "run"), str(data), str(tmp_path / "p.csv"), 16, log=said.append)
    assert not any(s.startswith("predicting: ") for s in said)
    monkeypatch.setattr(heartbeat, "EVERY_S", 0.0)
    predict(str(tmp_path / "run"), str(data), str(tmp_path / "q.csv"), 16, log=said.append)
    beats = [s for s in said if s.startswith("predicting: ")]
    assert beats[0].startswith("predicting: 16/64 images, ") and beats[-1].startswith("predicting: 64/64 images")


@pytest.mark.parametrize("on", [True, False])
def test_a_heartbeat_counts_from_its_start_on_its_clock(on):
    now = [100.0]
    said: list[str] = []
    beat = heartbeat.Heartbeat("evaluating", 10, "batches", said.append, on, clock=lambda: now[0])
    now[0] = 100.0 + heartbeat.EVERY_S - 1
    beat.update(3)
    now[0] = 100.0 + heartbeat.EVERY_S
    beat.update(4)
    now[0] += heartbeat.EVERY_S / 2
    beat.update(6)  # half an interval after the last line: none
    assert said == ([f"evaluating: 4/10 batches, {heartbeat.EVERY_S:.0f} s"] if on else [])
