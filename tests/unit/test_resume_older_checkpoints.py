"""Checkpoints written by older cnnpar revisions, resumed or predicted from by this one: their stored config and
meta are this revision's, edited to the older form (the keys an older cnnpar did not write, the values it wrote)."""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from cnnpar.config import Config, DataConfig, RunConfig, SpeedConfig
from cnnpar.dist import DistInfo
from cnnpar.engine.checkpoint import load_checkpoint, save_checkpoint
from cnnpar.engine.predict import predict
from cnnpar.engine.trainer import Trainer
from cnnpar.errors import UserError
from tests.datafiles import CLASSES, bar_images, write_image_folder

pytestmark = pytest.mark.usefixtures("one_thread")

CPU_INFO = DistInfo(0, 0, 1, torch.device("cpu"))
NAMES = ["zero", "one", "two", "three"]


def _cfg(tmp_path: Path, source: Path, epochs: int, resume: str = "", **data) -> Config:
    return Config(
        data=DataConfig(source=str(source), workers=0, **data),
        speed=SpeedConfig(device="cpu", precision="fp32"),
        run=RunConfig(
            epochs=epochs, batch_size=8, max_steps=1, out_dir=str(tmp_path), name="old", resume=resume, progress=False
        ),
    )


def _made_older(run: Path, edit) -> None:
    """The run's checkpoint with `edit(state)` applied, as an older cnnpar would have written it."""
    path = run / "ckpt" / "last.pt"
    state = load_checkpoint(path)
    edit(state)
    save_checkpoint(path, state)


def _resumed(cfg: Config) -> tuple[list[str], list[tuple[str, ...]]]:
    """The resume's `resume:`, `record:` and `classes: the checkpoint ...` lines, and resumes.csv's rows."""
    lines: list[str] = []
    trainer = Trainer(cfg, CPU_INFO, log=lambda s, **k: lines.append(s))
    trainer.fit()
    said = [s for s in lines if s.startswith(("resume:", "record:", "classes: the checkpoint"))]
    record = trainer.run_dir / "resumes.csv"
    rows = []
    if record.exists():
        with record.open(newline="") as f:
            rows = [tuple(row) for row in csv.reader(f)][1:]
    return said, rows


def _before_loader_crops(state: dict) -> None:
    """A checkpoint from before cnnpar's photo loaders drew random-resized crops (before 2026-11-30's 2e778d5):
    no data.cpu_share, crop_min_scale or rng scheme, gpu_resize at its default of then."""
    data = state["config"]["data"]
    del data["cpu_share"], data["crop_min_scale"], state["rng"]
    data["gpu_resize"] = "loop"


@pytest.mark.parametrize("loader", ["fast", "textbook"])
def test_an_older_photo_runs_auto_augmentation_is_named_as_changed_on_resuming(tmp_path, loader):
    """A checkpoint's stored augment "auto" meant pad-4 crops + flips of centre crops before the loaders drew
    random-resized crops; resolved with today's rule it read as "flip" on both sides, so the resume switched to
    random-resized crops without a word in the resume line or resumes.csv."""
    folder = write_image_folder(tmp_path / "imgs", per_class=8, side=20)
    Trainer(_cfg(tmp_path, folder, 1, image_size=16, loader=loader), CPU_INFO, log=lambda *a, **k: None).fit()
    _made_older(tmp_path / "old", _before_loader_crops)
    said, rows = _resumed(_cfg(tmp_path, folder, 2, str(tmp_path / "old"), image_size=16, loader=loader))
    before, after = "auto (crop+flip of centre crops)", "auto (flip of random-resized crops of 25-100 % of the area)"
    why = "before: as the older cnnpar that wrote the checkpoint drew it"
    assert said[0] == f"resume: changed since the checkpoint, from epoch 2 on: --augment {before} -> {after} ({why})"
    assert ("2", "data.augment", before, after, why) in rows


def test_an_older_textbook_run_that_read_centre_crops_is_named_and_a_current_one_is_not(tmp_path):
    """Until 425af3f the textbook loader trained on the photos' centre crops (its configs lack crop_min_scale)."""
    folder = write_image_folder(tmp_path / "imgs", per_class=8, side=20)
    cfg = _cfg(tmp_path, folder, 1, image_size=16, loader="textbook")
    Trainer(cfg, CPU_INFO, log=lambda *a, **k: None).fit()
    said, _ = _resumed(replace(cfg, run=replace(cfg.run, epochs=2, resume=str(tmp_path / "old"))))
    assert not [s for s in said if s.startswith("resume:")]  # today's checkpoint: the same augmentation
    _made_older(tmp_path / "old", lambda state: state["config"]["data"].pop("crop_min_scale"))
    said, _ = _resumed(replace(cfg, run=replace(cfg.run, epochs=3, resume=str(tmp_path / "old"))))
    assert said[0].startswith(
        "resume: changed since the checkpoint, from epoch 3 on: --augment auto (flip of centre crops) -> auto (flip "
        "of random-resized crops"
    ), said


def test_a_bool_a_switch_was_stored_as_and_a_default_that_changed_are_not_recorded_as_the_users_change(tmp_path):
    """An older cnnpar stored speed.compile_tuning as False (now "off": the same setting) and data.gpu_resize at
    its default of then, "loop" (now "auto"): both were recorded as changes made on resuming. gpu_resize acts on a
    GPU decoder's crops only, so with none it is left out; one the user asks for is still recorded."""
    from cnnpar.data.sources import detect_format

    source = tmp_path / "d.npz"
    x, y = bar_images(64)
    np.savez(source, x_train=x, y_train=y)
    assert detect_format(str(source), "auto") == "npz"
    Trainer(_cfg(tmp_path, source, 1), CPU_INFO, log=lambda *a, **k: None).fit()

    def older(state: dict) -> None:
        state["config"]["speed"]["compile_tuning"] = False
        state["config"]["data"]["gpu_resize"] = "loop"

    _made_older(tmp_path / "old", older)
    said, rows = _resumed(_cfg(tmp_path, source, 2, str(tmp_path / "old")))
    assert rows == [("2", "run.epochs", "1", "2", "")]
    assert [s for s in said if s.startswith("record:")][0].endswith(": run.epochs 1 -> 2")
    _made_older(tmp_path / "old", older)
    _, rows = _resumed(_cfg(tmp_path, source, 3, str(tmp_path / "old"), gpu_resize="batched"))
    assert ("3", "data.gpu_resize", "loop", "batched", "") in rows  # asked for: the user's change


def test_a_gpu_decoders_resize_default_that_changed_is_recorded_as_such(tmp_path, monkeypatch):
    """Where the run has a GPU decoder, the new default resizes its crops otherwise: recorded, as a changed
    default (the decoder itself needs CUDA: the resume's record is told it has one)."""
    import cnnpar.engine.resume_checks as resume_checks

    source = tmp_path / "d.npz"
    x, y = bar_images(64)
    np.savez(source, x_train=x, y_train=y)
    Trainer(_cfg(tmp_path, source, 1), CPU_INFO, log=lambda *a, **k: None).fit()
    _made_older(tmp_path / "old", lambda state: state["config"]["data"].update(gpu_resize="batched"))
    monkeypatch.setattr(resume_checks, "decodes_on_gpu", lambda cfg, bundle: True)
    said, rows = _resumed(_cfg(tmp_path, source, 2, str(tmp_path / "old")))
    assert ("2", "data.gpu_resize", "batched", "auto", "default changed in this cnnpar") in rows
    assert "data.gpu_resize batched -> auto (default changed in this cnnpar)" in said[-1]


def _npz_with_names(path: Path) -> Path:
    x, y = bar_images(80)
    np.savez(path, x_train=x[:64], y_train=y[:64], x_test=x[64:], y_test=y[64:], class_names=np.array(NAMES))
    return path


def _named_by_index(state: dict) -> None:
    """Before 2026-12-03 cnnpar ignored an archive's class_names: it named the classes by their indices."""
    state["meta"]["class_names"] = [str(i) for i in range(CLASSES)]


def test_an_npz_run_from_before_class_names_resumes_where_the_checksum_confirms_its_data(tmp_path):
    """The same archive, byte for byte, was refused as "the data changed: class names 0: '0' -> 'zero' ...": the
    old run's index order is the archive's. With the data's checksum to confirm it, the resume goes on (said in a
    note) and the checkpoint it writes holds the archive's names."""
    source = _npz_with_names(tmp_path / "cn.npz")
    Trainer(_cfg(tmp_path, source, 1), CPU_INFO, log=lambda *a, **k: None).fit()
    _made_older(tmp_path / "old", _named_by_index)
    said, _ = _resumed(_cfg(tmp_path, source, 2, str(tmp_path / "old")))
    assert said[0] == (
        f"classes: the checkpoint predates {source}'s class_names: its cnnpar named the classes by index (0, 1, 2, "
        "3); its checksum of its images and labels matches, so they are 'zero', 'one', 'two', 'three', in the "
        "archive's order"
    )
    assert load_checkpoint(tmp_path / "old" / "ckpt" / "last.pt")["meta"]["class_names"] == NAMES


def test_an_npz_run_from_before_class_names_without_a_checksum_is_refused_naming_that_cause(tmp_path):
    source = _npz_with_names(tmp_path / "cn.npz")
    Trainer(_cfg(tmp_path, source, 1), CPU_INFO, log=lambda *a, **k: None).fit()

    def older(state: dict) -> None:
        _named_by_index(state)
        del state["meta"]["data_checksum"]

    _made_older(tmp_path / "old", older)
    with pytest.raises(UserError) as refused:
        Trainer(_cfg(tmp_path, source, 2, str(tmp_path / "old")), CPU_INFO, log=lambda *a, **k: None)
    assert str(refused.value) == (
        f"{tmp_path / 'old' / 'ckpt' / 'last.pt'}: written by an older cnnpar that named the classes by index (0, 1, "
        f"2, 3) where {source}'s class_names now name them ('zero', 'one', 'two', 'three'); it stores no checksum "
        f"of its data to confirm {source} is what it trained on: expected a new run (another --name, no --resume)"
    )


def test_predict_scores_an_archives_labels_by_index_for_a_model_from_before_class_names(tmp_path):
    """Predict dropped the labels ("not among the model's classes ('0', ...)") and printed no accuracy, though the
    old run's class i is the archive's class i."""
    source = _npz_with_names(tmp_path / "cn.npz")
    Trainer(_cfg(tmp_path, source, 1), CPU_INFO, log=lambda *a, **k: None).fit()

    def older(state: dict) -> None:
        _named_by_index(state)
        del state["meta"]["data_path"], state["meta"]["data_checksum"]  # stored since 2026-12-03 16:58 and 12-04

    _made_older(tmp_path / "old", older)
    lines: list[str] = []
    predict(str(tmp_path / "old"), str(source), out=str(tmp_path / "p.csv"), log=lines.append)
    assert f"{source}[y_test]: scored by index: the checkpoint predates the archive's class_names ('zero', 'one', " \
        "'two', 'three'); the cnnpar that wrote it named the classes by index (0, 1, 2, 3), in the archive's " \
        "order" in lines  # fmt: skip
    assert any(s.startswith("accuracy ") and s.endswith(f"against y_test of {source}") for s in lines), lines


@pytest.mark.parametrize(
    ("scheme", "drew", "draw"),
    [
        ("per-epoch seeds, hashed sample keys", "their sample order", "other sample orders than an uninterrupted"),
        ("per-epoch seeds", "their augmentation", "other crops, flips and sample orders than an uninterrupted"),
    ],
)
def test_an_earlier_rng_schemes_note_names_what_the_resumed_epochs_draw_otherwise(tmp_path, scheme, drew, draw):
    """The scheme before the sampler's seed was hashed (data/loader.shuffle_seed) drew the same crops and flips as
    today's: only the sample orders differ, where the note said its epochs drew their augmentation otherwise."""
    source = tmp_path / "d.npz"
    x, y = bar_images(64)
    np.savez(source, x_train=x, y_train=y)
    Trainer(_cfg(tmp_path, source, 1), CPU_INFO, log=lambda *a, **k: None).fit()
    _made_older(tmp_path / "old", lambda state: state.update(rng=scheme))
    lines: list[str] = []
    Trainer(_cfg(tmp_path, source, 2, str(tmp_path / "old")), CPU_INFO, log=lambda s, **k: lines.append(s)).fit()
    (note,) = [s for s in lines if "earlier scheme" in s]
    assert note.startswith(f"note: this checkpoint's epochs drew {drew} by an earlier scheme ({scheme}; now ")
    assert f"the resumed epochs draw {draw}" in note


def test_a_run_on_a_store_older_than_its_grey_field_resumes_with_the_flips_it_trained_with_unnamed(tmp_path):
    """A store of grey photos prepared before session 34 lacks the header's grey and is read as grey from its
    pixels now (auto: no flip); its older cnnpar read it as colour, so the checkpoint's auto was flip, which its
    record's resolved --augment keeps. That was named as a change (auto (none) -> flip) and put in resumes.csv,
    though the resumed epochs draw what the first did. A checkpoint of this cnnpar's reading (auto: none) still is."""
    from PIL import Image

    from cnnpar.data.store_write import prepare_store
    from tests.unit.test_store import rewritten

    rng = np.random.default_rng(0)
    for k in range(16):
        (tmp_path / "grey" / f"c{k % 2}").mkdir(parents=True, exist_ok=True)
        pixels = (60 + 120 * (k % 2) + rng.integers(0, 40, (20, 20))).astype(np.uint8)
        Image.fromarray(pixels, "L").save(tmp_path / "grey" / f"c{k % 2}" / f"{k}.png")
    prepare_store(tmp_path / "grey", tmp_path / "now.cnnpar", 32, workers=1, progress=False)
    store = rewritten(tmp_path / "now.cnnpar", tmp_path / "old.cnnpar", drop=("grey",))
    Trainer(_cfg(tmp_path, store, 1, val_fraction=0.25), CPU_INFO, log=lambda *a, **k: None).fit()
    _made_older(tmp_path / "old", lambda state: state["meta"].pop("grey_from_pixels"))
    said, rows = _resumed(_cfg(tmp_path, store, 2, str(tmp_path / "old"), val_fraction=0.25, augment="flip"))
    assert not [s for s in said if s.startswith("resume:")], said
    assert rows == [("2", "run.epochs", "1", "2", "")]

    def of_this_cnnpar(state: dict) -> None:  # auto resolved on the store read as grey: no flip
        state["meta"]["grey_from_pixels"], state["config"]["data"]["augment"] = True, "auto"

    _made_older(tmp_path / "old", of_this_cnnpar)
    said, rows = _resumed(_cfg(tmp_path, store, 3, str(tmp_path / "old"), val_fraction=0.25, augment="flip"))
    assert said[0] == "resume: changed since the checkpoint, from epoch 3 on: --augment auto (none) -> flip", said
