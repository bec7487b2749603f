"""Resuming in process: a finished one-cycle run extended rebuilds its schedule (and says so);
a checkpoint for another model shape is refused in one line."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from cnnpar.config import Config, DataConfig, RunConfig, SpeedConfig
from cnnpar.dist import DistInfo
from cnnpar.engine.optim import schedule_factor
from cnnpar.engine.trainer import Trainer
from cnnpar.errors import UserError

pytestmark = pytest.mark.usefixtures("one_thread")

CPU_INFO = DistInfo(0, 0, 1, torch.device("cpu"))


def _cfg(tmp_path, epochs: int, resume: str = "") -> Config:
    return Config(
        data=DataConfig(source="synthetic", synthetic_samples=128, image_shape="1x16x16", workers=0),
        speed=SpeedConfig(device="cpu", precision="fp32"),
        run=RunConfig(
            epochs=epochs, batch_size=32, max_steps=2, out_dir=str(tmp_path), name="oc", resume=resume, progress=False
        ),
    )


def test_one_more_epoch_after_a_finished_onecycle_trains_at_a_nonzero_lr(tmp_path):
    Trainer(_cfg(tmp_path, 2), CPU_INFO, log=lambda *a, **k: None).fit()
    lines: list[str] = []
    more = Trainer(_cfg(tmp_path, 3, resume=str(tmp_path / "oc")), CPU_INFO, log=lambda s, **k: lines.append(s))
    # step 4 of a 6-step one-cycle (the first 2 of its linear descent done): 1/3 of the peak, not 0
    assert more.optimizer.param_groups[0]["lr"] == pytest.approx(more.lr / 3, rel=0.05)
    assert any("onecycle rebuilt for 3 epochs (the run planned 2)" in s for s in lines), lines
    same = Trainer(_cfg(tmp_path, 2, resume=str(tmp_path / "oc")), CPU_INFO, log=lambda s, **k: lines.append(s))
    assert same.optimizer.param_groups[0]["lr"] == 0.0  # nothing extended: the finished run stays finished


def test_a_constant_schedule_extended_back_into_its_rebuilt_warmup_says_so(tmp_path):
    """A constant schedule rebuilt for more epochs moves only where its warm-up, a share of the new total, reaches
    past the finished steps: the lr dropped below the peak the run had trained at, without a word."""
    first = _cfg(tmp_path, 1)
    first = replace(first, optim=replace(first.optim, schedule="constant"))
    Trainer(first, CPU_INFO, log=lambda *a, **k: None).fit()  # 2 steps, the second at the peak
    lines: list[str] = []
    more = replace(first, run=replace(first.run, epochs=10, resume=str(tmp_path / "oc")))
    trainer = Trainer(more, CPU_INFO, log=lambda s, **k: lines.append(s))
    # step 2 of 20, whose warm-up is int(20 * 0.15) = 3 steps: (2 + 1) / 3 of the peak -- the peak again here
    expected = trainer.lr * schedule_factor(2, 20, 0.15, "constant")
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(expected)
    assert not [s for s in lines if s.startswith("schedule:")], lines  # at the peak: nothing changed to say
    lines.clear()
    longer = replace(first, run=replace(first.run, epochs=20, resume=str(tmp_path / "oc")))
    trainer = Trainer(longer, CPU_INFO, log=lambda s, **k: lines.append(s))
    # step 2 of 40, whose warm-up is 6 steps: (2 + 1) / 6, half the peak the finished step trained at
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(trainer.lr / 2)
    said = [s for s in lines if s.startswith("schedule:")]
    assert said == [
        f"schedule: constant rebuilt for 20 epochs (the run planned 1): epoch 2 starts at lr {trainer.lr / 2:.3g} "
        f"(peak {trainer.lr:g}), inside the warm-up (--warmup 0.15 of 40 steps: the first 6)"
    ], lines


def test_resuming_with_another_class_count_is_one_line_not_a_state_dict_traceback(tmp_path):
    Trainer(_cfg(tmp_path, 1), CPU_INFO, log=lambda *a, **k: None).fit()
    cfg = _cfg(tmp_path, 2, resume=str(tmp_path / "oc"))
    cfg = Config(data=replace(cfg.data, num_classes=5), speed=cfg.speed, run=cfg.run)
    with pytest.raises(UserError, match="holds a cnn3 for 10 classes of 1x16x16 images; this run has cnn3 for 5"):
        Trainer(cfg, CPU_INFO, log=lambda *a, **k: None)


def test_resuming_with_fewer_steps_an_epoch_puts_the_schedule_at_the_finished_epochs_and_this_runs_peak(tmp_path):
    """Another world size, batch or --grad-accum changes the optimizer steps an epoch takes (torchrun's elastic
    restart with fewer processes): the schedule resumes at finished epochs x this run's steps an epoch, from this
    run's peak lr, not at the old run's step count from the old peak."""
    first = _cfg(tmp_path, 2)
    first = replace(first, run=replace(first.run, max_steps=0))
    Trainer(first, CPU_INFO, log=lambda *a, **k: None).fit()  # 3 steps an epoch (batch 32)
    cfg = _cfg(tmp_path, 4, resume=str(tmp_path / "oc"))
    cfg = replace(cfg, run=replace(cfg.run, max_steps=0), optim=replace(cfg.optim, grad_accum=2, lr=2 * cfg.optim.lr))
    lines: list[str] = []
    more = Trainer(cfg, CPU_INFO, log=lambda s, **k: lines.append(s))
    assert more.steps_per_epoch == 2
    assert more.scheduler.last_epoch == 4  # 2 finished epochs x 2 steps, not the checkpoint's 6
    assert more.scheduler.base_lrs[0] == pytest.approx(more.lr)  # this run's peak, not the checkpoint's
    expected = more.lr * schedule_factor(4, 8, cfg.optim.warmup, cfg.optim.schedule)
    assert more.optimizer.param_groups[0]["lr"] == pytest.approx(expected)
    assert any(
        "took 3 optimizer steps an epoch, this one takes 2" in s and "starts at step 4 of 8" in s for s in lines
    ), lines


@pytest.mark.parametrize(
    "change, message",
    [
        ({"run": {"seed": 7}}, "started with --seed 0, this resume asks for 7: the seed draws the run's shuffle"),
        ({"data": {"val_fraction": 0.5}}, "started with --val-fraction 0.2, this resume asks for 0.5"),
        ({"data": {"val_fraction": 0.0}}, "started with --val-fraction 0.2, this resume asks for 0.0"),
        ({"optim": {"optimizer": "sgd"}}, "started with --optimizer adamw, this resume asks for sgd"),
    ],
)
def test_resuming_with_another_hold_out_or_optimizer_is_refused_before_the_run_folder_changes(
    tmp_path, change, message
):
    Trainer(_cfg(tmp_path, 1), CPU_INFO, log=lambda *a, **k: None).fit()
    stored = (tmp_path / "oc" / "config.toml").read_text()
    cfg = _cfg(tmp_path, 2, resume=str(tmp_path / "oc"))
    cfg = replace(cfg, **{section: replace(getattr(cfg, section), **fields) for section, fields in change.items()})
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        Trainer(cfg, CPU_INFO, log=lambda *a, **k: None).fit()
    assert (tmp_path / "oc" / "config.toml").read_text() == stored


@pytest.mark.parametrize("data", ["own split", "synthetic, --val-fraction 0"])
def test_resuming_with_another_seed_is_refused_where_nothing_is_held_out_too(tmp_path, data):
    """The seed also draws the shuffles, crops and dropout, and synthetic data's images and labels: another one on
    an npz with its own x_test, or on synthetic data with no hold-out, continued the run on other draws (synthetic:
    another data set) and rewrote config.toml with the new seed, without a word."""
    from tests.datafiles import write_npz

    cfg = _cfg(tmp_path, 1)
    if data == "own split":
        cfg = replace(cfg, data=DataConfig(source=str(write_npz(tmp_path / "d.npz", n_train=96, n_test=32)), workers=0))
    else:
        cfg = replace(cfg, data=replace(cfg.data, val_fraction=0.0))
    cfg = replace(cfg, run=replace(cfg.run, seed=5))
    Trainer(cfg, CPU_INFO, log=lambda *a, **k: None).fit()
    stored = (tmp_path / "oc" / "config.toml").read_text()
    more = replace(cfg, run=replace(cfg.run, epochs=2, seed=9, resume=str(tmp_path / "oc")))
    with pytest.raises(
        UserError, match=r"started with --seed 5, this resume asks for 9: .*expected --seed 5 \(or none\)"
    ):
        Trainer(more, CPU_INFO, log=lambda *a, **k: None).fit()
    assert (tmp_path / "oc" / "config.toml").read_text() == stored  # still seed = 5
    same = replace(more, run=replace(more.run, seed=5))
    assert Trainer(same, CPU_INFO, log=lambda *a, **k: None).start_epoch == 2


def test_a_resume_trains_with_this_runs_weight_decay_not_the_checkpoints(tmp_path):
    Trainer(_cfg(tmp_path, 1), CPU_INFO, log=lambda *a, **k: None).fit()
    cfg = _cfg(tmp_path, 2, resume=str(tmp_path / "oc"))
    cfg = replace(cfg, optim=replace(cfg.optim, weight_decay=0.123))
    more = Trainer(cfg, CPU_INFO, log=lambda *a, **k: None)
    assert more.optimizer.param_groups[0]["weight_decay"] == pytest.approx(0.123)
    assert more.optimizer.state  # the checkpoint's moments were loaded all the same


def test_resuming_a_finished_run_leaves_its_summary_as_it_was(tmp_path):
    Trainer(_cfg(tmp_path, 1), CPU_INFO, log=lambda *a, **k: None).fit()
    before = (tmp_path / "oc" / "summary.json").read_text()
    lines: list[str] = []
    Trainer(_cfg(tmp_path, 1, resume=str(tmp_path / "oc")), CPU_INFO, log=lambda s, **k: lines.append(s)).fit()
    assert any("nothing to do" in s for s in lines), lines
    assert (tmp_path / "oc" / "summary.json").read_text() == before  # not rewritten with this call's zeros
    (tmp_path / "oc" / "summary.json").unlink()  # an attempt that died after its last checkpoint, before this file
    Trainer(_cfg(tmp_path, 1, resume=str(tmp_path / "oc")), CPU_INFO, log=lambda *a, **k: None).fit()
    assert json.loads((tmp_path / "oc" / "summary.json").read_text())["epochs"] == 1


def test_nothing_to_do_after_one_epoch_says_1_epoch(tmp_path):
    """It said "holds 1 epochs"."""
    Trainer(_cfg(tmp_path, 1), CPU_INFO, log=lambda *a, **k: None).fit()
    lines: list[str] = []
    Trainer(_cfg(tmp_path, 1, resume=str(tmp_path / "oc")), CPU_INFO, log=lambda s, **k: lines.append(s)).fit()
    assert lines == [
        f"nothing to do: {tmp_path / 'oc' / 'ckpt' / 'last.pt'} holds 1 epoch and --epochs 1 asks for no more "
        "(--epochs 2 or more trains on)"
    ]


@pytest.mark.parametrize("epochs", [1, 2])
def test_resuming_with_no_more_epochs_than_done_says_so_once_and_leaves_the_run_folder_as_it_was(tmp_path, epochs):
    Trainer(_cfg(tmp_path, 2), CPU_INFO, log=lambda *a, **k: None).fit()
    run = tmp_path / "oc"
    before = {p.relative_to(run): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}
    lines: list[str] = []
    Trainer(_cfg(tmp_path, epochs, resume=str(run)), CPU_INFO, log=lambda s, **k: lines.append(s)).fit()
    assert lines == [
        f"nothing to do: {run / 'ckpt' / 'last.pt'} holds 2 epochs and --epochs {epochs} asks for no more "
        "(--epochs 3 or more trains on)"
    ]  # no "schedule: onecycle rebuilt for 1 epochs ... starts at lr 0", no "resumed from"
    after = {p.relative_to(run): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}
    assert after == before  # config.toml keeps epochs = 2 and resume = "", summary.json and the rest unchanged


def test_data_with_its_own_validation_split_resumes_with_another_val_fraction(tmp_path):
    """An npz's x_test validates: --val-fraction holds nothing out there, so another value leaks nothing."""
    from tests.datafiles import write_npz

    data = write_npz(tmp_path / "d.npz", n_train=96, n_test=32)
    cfg = _cfg(tmp_path, 1)
    cfg = replace(cfg, data=DataConfig(source=str(data), workers=0))
    Trainer(cfg, CPU_INFO, log=lambda *a, **k: None).fit()
    more = replace(
        cfg, data=replace(cfg.data, val_fraction=0.5), run=replace(cfg.run, epochs=2, resume=str(tmp_path / "oc"))
    )
    assert Trainer(more, CPU_INFO, log=lambda *a, **k: None).start_epoch == 2


def test_each_epochs_lr_column_is_the_lr_its_last_step_trained_at(tmp_path):
    """metrics.csv's lr was read after the schedule had moved on: the next epoch's first lr, 0 in a one-cycle
    run's last row though its last step trained above 0."""
    trainer = Trainer(_cfg(tmp_path, 2), CPU_INFO, log=lambda *a, **k: None)
    history = trainer.fit().history
    sched = trainer.scheduler
    per_epoch = sched.last_epoch // 2
    at = [sched.base_lrs[0] * sched.lr_lambdas[0](per_epoch * e - 1) for e in (1, 2)]  # each epoch's last step
    assert [row["lr"] for row in history] == pytest.approx(at) and at[1] > 0
    assert trainer.optimizer.param_groups[0]["lr"] == 0.0  # what the column held before: the next step's lr


def _strip_meta(ckpt, *fields: str) -> None:
    """A checkpoint as cnnpar wrote it before its meta held `fields`."""
    state = torch.load(ckpt, weights_only=True)
    for name in fields:
        del state["meta"][name]
    torch.save(state, ckpt)


def test_resuming_after_rows_were_added_to_the_data_is_refused_and_an_older_checkpoint_still_resumes(tmp_path):
    """Rows appended to a CSV re-draw the seeded hold-out over more rows: validation would score images the
    finished epoch trained on. The resume is refused, naming the counts, before the schedule says anything."""
    from tests.datafiles import bar_images, write_pixel_csv

    x, y = bar_images(128)
    data = write_pixel_csv(tmp_path / "grow.csv", x[:96], y[:96])
    cfg = _cfg(tmp_path, 1)
    cfg = replace(cfg, data=DataConfig(source=str(data), workers=0))
    Trainer(cfg, CPU_INFO, log=lambda *a, **k: None).fit()
    write_pixel_csv(data, x, y)  # 32 rows more under the same path
    more = replace(cfg, run=replace(cfg.run, epochs=2, resume=str(tmp_path / "oc")))
    lines: list[str] = []
    with pytest.raises(UserError, match=f"the data changed since the checkpoint: 96 -> 128 examples in {data}: "):
        Trainer(more, CPU_INFO, log=lambda s, **k: lines.append(s))
    assert not any("schedule:" in s for s in lines), lines
    # nothing to compare with (a checkpoint from before either was stored): resumed as before
    _strip_meta(tmp_path / "oc" / "ckpt" / "last.pt", "examples", "data_checksum")
    assert Trainer(more, CPU_INFO, log=lambda *a, **k: None).start_epoch == 2


def test_resuming_after_a_class_folder_was_renamed_is_refused_naming_the_moved_classes(tmp_path):
    """class2 renamed aaa sorts first: every index would mean another class, and the weights still fit. Said as
    the name that came and the one that went: by index ("0: 'class0' -> 'aaa', 1: 'class1' -> 'class0', ...") it
    read as every class changed."""
    from tests.datafiles import write_image_folder

    data = write_image_folder(tmp_path / "imgs", per_class=6, classes=3, side=16)
    cfg = _cfg(tmp_path, 1)
    cfg = replace(cfg, data=DataConfig(source=str(data), image_size=16, workers=0))
    Trainer(cfg, CPU_INFO, log=lambda *a, **k: None).fit()
    (data / "class2").rename(data / "aaa")
    more = replace(cfg, run=replace(cfg.run, epochs=2, resume=str(tmp_path / "oc")))
    renamed = r"the data changed since the checkpoint: class names \(added 'aaa'; removed 'class2'\): a checkpoint "
    with pytest.raises(UserError, match=renamed):
        Trainer(more, CPU_INFO, log=lambda *a, **k: None)
    _strip_meta(tmp_path / "oc" / "ckpt" / "last.pt", "class_names", "data_checksum")
    assert Trainer(more, CPU_INFO, log=lambda *a, **k: None).start_epoch == 2


def test_resuming_after_the_same_class_names_were_reordered_names_the_indices_that_moved(tmp_path):
    """An archive's class_names rewritten in another order: no name came or went, each index means another class."""
    from tests.datafiles import bar_images

    x, y = bar_images(96, classes=3)
    npz = tmp_path / "a.npz"
    np.savez(npz, x_train=x, y_train=y, class_names=np.array(["cat", "dog", "gnu"]))
    cfg = replace(_cfg(tmp_path, 1), data=DataConfig(source=str(npz), workers=0))
    Trainer(cfg, CPU_INFO, log=lambda *a, **k: None).fit()
    np.savez(npz, x_train=x, y_train=y, class_names=np.array(["dog", "cat", "gnu"]))
    more = replace(cfg, run=replace(cfg.run, epochs=2, resume=str(tmp_path / "oc")))
    moved = r"class names \(index: then -> now\) 0: 'cat' -> 'dog', 1: 'dog' -> 'cat': a checkpoint "
    with pytest.raises(UserError, match=f"the data changed since the checkpoint: {moved}"):
        Trainer(more, CPU_INFO, log=lambda *a, **k: None)


def test_resuming_after_a_class_folder_was_added_or_removed_is_refused_naming_the_class(tmp_path):
    """A class folder made from images moved out of others keeps the count: the refusal said only that the folder's
    checksum differs (and with images added, only the counts), leaving the user to find which of many folders
    changed."""
    import shutil

    from tests.datafiles import write_image_folder

    data = write_image_folder(tmp_path / "imgs", per_class=6, classes=3, side=16)
    cfg = _cfg(tmp_path, 1)
    cfg = replace(cfg, data=DataConfig(source=str(data), image_size=16, workers=0))
    Trainer(cfg, CPU_INFO, log=lambda *a, **k: None).fit()
    more = replace(cfg, run=replace(cfg.run, epochs=2, resume=str(tmp_path / "oc")))
    (data / "zebra").mkdir()
    for image in sorted((data / "class0").iterdir())[:2]:
        image.rename(data / "zebra" / image.name)
    with pytest.raises(UserError, match=r"the data changed since the checkpoint: classes 3 -> 4 \(added 'zebra'\): "):
        Trainer(more, CPU_INFO, log=lambda *a, **k: None)
    shutil.rmtree(data / "zebra")
    shutil.rmtree(data / "class2")
    removed = r"18 -> 10 examples in .*; classes 3 -> 2 \(removed 'class2'\): "
    with pytest.raises(UserError, match=removed):
        Trainer(more, CPU_INFO, log=lambda *a, **k: None)


def test_resuming_after_rows_were_reordered_or_files_renamed_under_the_same_count_is_refused(tmp_path):
    """The same count and class names, other rows in other places: the seeded hold-out drew most of its validation
    rows from rows the finished epoch trained on, and the resume went on without a word."""
    from tests.datafiles import bar_images, write_image_folder, write_pixel_csv

    x, y = bar_images(96)
    data = write_pixel_csv(tmp_path / "rows.csv", x, y)
    cfg = replace(_cfg(tmp_path, 1), data=DataConfig(source=str(data), workers=0))
    Trainer(cfg, CPU_INFO, log=lambda *a, **k: None).fit()
    order = np.random.default_rng(1).permutation(96)
    write_pixel_csv(data, x[order], y[order])
    more = replace(cfg, run=replace(cfg.run, epochs=2, resume=str(tmp_path / "oc")))
    changed = f"the data changed since the checkpoint: {data}'s content changed \\(its checksum of its images"
    with pytest.raises(UserError, match=changed + " and labels differs"):
        Trainer(more, CPU_INFO, log=lambda *a, **k: None)
    write_pixel_csv(data, x, y)  # the rows as they were: resumed
    assert Trainer(more, CPU_INFO, log=lambda *a, **k: None).start_epoch == 2

    npz = tmp_path / "a.npz"
    np.savez(npz, x_train=x, y_train=y)
    cfg = replace(_cfg(tmp_path, 1), data=DataConfig(source=str(npz), workers=0))
    cfg = replace(cfg, run=replace(cfg.run, out_dir=str(tmp_path / "n"), name="n"))
    Trainer(cfg, CPU_INFO, log=lambda *a, **k: None).fit()
    np.savez(npz, x_train=x, y_train=(y + 1) % 4)  # relabelled
    more = replace(cfg, run=replace(cfg.run, epochs=2, resume=str(tmp_path / "n" / "n")))
    with pytest.raises(UserError, match=f"{npz}'s content changed"):
        Trainer(more, CPU_INFO, log=lambda *a, **k: None)

    imgs = write_image_folder(tmp_path / "imgs", per_class=6, classes=2, side=16)
    cfg = replace(_cfg(tmp_path, 1), data=DataConfig(source=str(imgs), image_size=16, workers=0))
    cfg = replace(cfg, run=replace(cfg.run, out_dir=str(tmp_path / "f"), name="f"))
    Trainer(cfg, CPU_INFO, log=lambda *a, **k: None).fit()
    first = sorted((imgs / "class0").iterdir())[0]
    first.rename(first.with_name("z" + first.name))  # sorts last: the hold-out draws another file
    more = replace(cfg, run=replace(cfg.run, epochs=2, resume=str(tmp_path / "f" / "f")))
    with pytest.raises(UserError, match=f"{imgs}'s content changed \\(its checksum of its image files' names"):
        Trainer(more, CPU_INFO, log=lambda *a, **k: None)


@pytest.mark.parametrize("model, size", [("fastnet", 17), ("cnn3", 32)])  # weights that fit, weights that do not
def test_resuming_at_another_image_size_is_refused_in_one_line_whether_or_not_the_weights_fit(tmp_path, model, size):
    cfg = _cfg(tmp_path, 1)
    cfg = replace(cfg, data=replace(cfg.data, image_shape="3x16x16"), model=replace(cfg.model, name=model))
    Trainer(cfg, CPU_INFO, log=lambda *a, **k: None).fit()
    stored = (tmp_path / "oc" / "config.toml").read_text()
    more = replace(
        cfg, data=replace(cfg.data, image_size=size), run=replace(cfg.run, epochs=2, resume=str(tmp_path / "oc"))
    )
    with pytest.raises(
        UserError, match=f"trained on 3x16x16 images, this resume makes 3x{size}x{size}: .*expected --image-size 16 "
    ):
        Trainer(more, CPU_INFO, log=lambda *a, **k: None).fit()
    assert (tmp_path / "oc" / "config.toml").read_text() == stored  # its image_size not rewritten


def test_a_weight_average_started_before_a_resume_with_more_epochs_keeps_averaging(tmp_path):
    """--ema-start is a share of the run's steps: 6 epochs put the start past the 2 epochs the average already
    covered, and it stayed frozen (epoch 3 evaluated the same averaged weights as epoch 2)."""
    cfg = _cfg(tmp_path, 2)
    cfg = replace(cfg, optim=replace(cfg.optim, ema=0.9, ema_start=0.5))  # 4 steps: steps 3 and 4 average
    Trainer(cfg, CPU_INFO, log=lambda *a, **k: None).fit()
    more = replace(cfg, run=replace(cfg.run, epochs=6, resume=str(tmp_path / "oc")))  # 12 steps: the start is 6
    trainer = Trainer(more, CPU_INFO, log=lambda *a, **k: None)
    assert int(trainer.average.averaged.n_averaged) == 2
    history = trainer.fit().history
    assert int(trainer.average.averaged.n_averaged) == 2 + 8  # every step after the checkpoint's
    assert history[2]["val_loss"] != history[1]["val_loss"]


def _csv_run(tmp_path, folder, seed: int):
    """A run on `train.csv` typed relative, in `folder` (the current folder), 96 rows drawn with `seed`."""
    from tests.datafiles import bar_images, write_pixel_csv

    x, y = bar_images(96, seed=seed)
    write_pixel_csv(folder / "train.csv", x, y)
    cfg = _cfg(tmp_path, 1)
    return replace(cfg, data=DataConfig(source="train.csv", workers=0))


def test_the_same_relative_data_typed_in_another_folder_is_refused_when_it_holds_other_data(tmp_path, monkeypatch):
    """`--data train.csv` in a/ trained; `--resume` of that run from b/, whose own train.csv has as many rows, read
    b's rows while every stored check (typed path, count, class names) agreed."""
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    cfg = _csv_run(tmp_path, tmp_path / "a", seed=0)
    Trainer(cfg, CPU_INFO, log=lambda *a, **k: None).fit()
    monkeypatch.chdir(tmp_path / "b")
    _csv_run(tmp_path, tmp_path / "b", seed=1)
    more = replace(cfg, run=replace(cfg.run, epochs=2, resume=str(tmp_path / "oc")))
    was, now = tmp_path / "a" / "train.csv", tmp_path / "b" / "train.csv"
    with pytest.raises(UserError, match=f"trained on {was}; --data train.csv here is {now}, other data .*--data {was}"):
        Trainer(more, CPU_INFO, log=lambda *a, **k: None)
    # a copy of the same bytes resumes, and says where it reads
    (tmp_path / "b" / "train.csv").write_bytes(was.read_bytes())
    lines: list[str] = []
    assert Trainer(more, CPU_INFO, log=lambda s, **k: lines.append(s)).start_epoch == 2
    assert any(f"this resume reads {now}, a copy with the same files" in s for s in lines), lines
    # the data moved (its old place gone): resumed on the count and class names, and said
    was.unlink()
    lines.clear()
    assert Trainer(more, CPU_INFO, log=lambda s, **k: lines.append(s)).start_epoch == 2
    assert any(f"read {was}, which is gone" in s for s in lines), lines


def test_an_image_folder_with_another_file_under_the_same_name_elsewhere_is_refused_naming_it(tmp_path, monkeypatch):
    from PIL import Image

    from tests.datafiles import write_image_folder

    for side in ("a", "b"):
        write_image_folder(tmp_path / side / "imgs", per_class=6, classes=2, side=16)
    other = tmp_path / "b" / "imgs" / "class1" / "5.png"
    Image.new("RGB", (16, 16), (200, 0, 0)).save(other)  # another picture, as many files: its size differs
    monkeypatch.chdir(tmp_path / "a")
    cfg = replace(_cfg(tmp_path, 1), data=DataConfig(source="imgs", image_size=16, workers=0))
    Trainer(cfg, CPU_INFO, log=lambda *a, **k: None).fit()
    monkeypatch.chdir(tmp_path / "b")
    more = replace(cfg, run=replace(cfg.run, epochs=2, resume=str(tmp_path / "oc")))
    differs = f"other data \\(class1.5.png has [0-9]+ bytes in .*, {other.stat().st_size} in "
    with pytest.raises(UserError, match=differs):
        Trainer(more, CPU_INFO, log=lambda *a, **k: None)
    # the same pictures, and a file no reader takes: a copy
    other.write_bytes((tmp_path / "a" / "imgs" / "class1" / "5.png").read_bytes())
    (tmp_path / "b" / "imgs" / "README.txt").write_text("where these came from")
    lines: list[str] = []
    assert Trainer(more, CPU_INFO, log=lambda s, **k: lines.append(s)).start_epoch == 2
    assert any("a copy with the same files" in s for s in lines), lines


def test_a_store_prepared_again_with_as_many_images_is_refused(tmp_path):
    """The same count and class names, other pixels (another --max-side): the checksum tells them apart."""
    from cnnpar.data.store_write import prepare_store
    from tests.datafiles import write_image_folder

    photos = write_image_folder(tmp_path / "photos", per_class=6, classes=2, side=32)
    store = tmp_path / "photos.cnnpar"
    prepare_store(photos, store, 0, workers=0, progress=False)
    cfg = replace(_cfg(tmp_path, 1), data=DataConfig(source=str(store), image_size=16, workers=0))
    Trainer(cfg, CPU_INFO, log=lambda *a, **k: None).fit()
    more = replace(cfg, run=replace(cfg.run, epochs=2, resume=str(tmp_path / "oc")))
    prepare_store(photos, tmp_path / "again.cnnpar", 0, workers=0, progress=False)  # the same photos, bounds
    (tmp_path / "again.cnnpar").replace(store)
    assert Trainer(more, CPU_INFO, log=lambda *a, **k: None).start_epoch == 2  # the same pixels: resumes
    store.unlink()
    prepare_store(photos, store, 20, workers=0, progress=False)
    with pytest.raises(UserError, match=f"the data changed since the checkpoint: {store} was prepared again"):
        Trainer(more, CPU_INFO, log=lambda *a, **k: None)


def test_a_resumed_folder_run_does_not_say_its_image_size_was_typed(tmp_path, capsys):
    """The size a first run picked from its photos is stored in its config.toml and read back on resume; the start
    line said "(--image-size)" there, though nobody typed one."""
    from cnnpar.cli import main
    from tests.datafiles import write_image_folder

    data = write_image_folder(tmp_path / "imgs", per_class=6, classes=2, side=24)
    common = ["--device", "cpu", "--workers", "0", "--no-progress", "--no-tensorboard", "--out-dir", str(tmp_path)]
    assert main(["train", "--data", str(data), *common, "--epochs", "1", "--name", "r"]) == 0
    assert "image size: 24 (the source size" in capsys.readouterr().out
    assert main(["train", *common, "--epochs", "2", "--resume", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "image size: 24 (the resumed run's, from its config.toml)" in out and "(--image-size)" not in out


def test_a_resume_of_an_older_record_says_its_image_size_came_from_its_checkpoint(tmp_path, capsys):
    """A record written before the `# requested:` lines stores an automatic size as 0, and the resume takes the
    checkpoint's (cliargs._trained_side): the line still said "from its config.toml", which holds 0."""
    import re

    from cnnpar.cli import main
    from tests.datafiles import write_image_folder

    data = write_image_folder(tmp_path / "imgs", per_class=6, classes=2, side=24)
    common = ["--device", "cpu", "--workers", "0", "--no-progress", "--no-tensorboard", "--out-dir", str(tmp_path)]
    assert main(["train", "--data", str(data), *common, "--epochs", "1", "--name", "r"]) == 0
    record = tmp_path / "r" / "config.toml"
    old = [line for line in record.read_text().splitlines() if not line.startswith("# requested: ")]
    record.write_text(re.sub(r"(?m)^image_size = 24$", "image_size = 0", "\n".join(old) + "\n"))
    capsys.readouterr()
    assert main(["train", *common, "--epochs", "2", "--resume", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert f"image size: 24 (the resumed run's, from its checkpoint {tmp_path / 'r' / 'ckpt'}" in out, out
    assert "from its config.toml" not in out


def test_settings_changed_on_resuming_are_named_in_one_line_and_an_unchanged_resume_names_none(tmp_path):
    """--ema 0, --schedule constant and --label-smoothing given on resuming changed the scored weights, the lr and
    the loss column part way through the run, and the log said only "resumed from ..."."""
    cfg = _cfg(tmp_path, 1)
    cfg = replace(cfg, optim=replace(cfg.optim, ema=0.9))
    Trainer(cfg, CPU_INFO, log=lambda *a, **k: None).fit()
    more = replace(cfg, run=replace(cfg.run, epochs=2, resume=str(tmp_path / "oc")))
    lines: list[str] = []
    Trainer(more, CPU_INFO, log=lambda s, **k: lines.append(s))
    assert not [s for s in lines if s.startswith("resume:")], lines
    other = replace(more, optim=replace(more.optim, ema=0.0, schedule="constant", label_smoothing=0.1))
    lines.clear()
    Trainer(other, CPU_INFO, log=lambda s, **k: lines.append(s))
    assert [s for s in lines if s.startswith("resume:")] == [
        "resume: changed since the checkpoint, from epoch 2 on: --schedule onecycle -> constant, --label-smoothing "
        "0.0 -> 0.1 (the train loss column measures another loss from here), --ema 0.9 -> 0.0 (the checkpoint's "
        "weight average is dropped: validation scores the trained weights)"
    ]


def test_another_model_on_resuming_is_refused_naming_the_model(tmp_path):
    Trainer(_cfg(tmp_path, 1), CPU_INFO, log=lambda *a, **k: None).fit()
    more = _cfg(tmp_path, 2, resume=str(tmp_path / "oc"))
    more = replace(more, model=replace(more.model, name="resnet18"))
    with pytest.raises(
        UserError,
        match=r"holds a cnn3 for 10 classes of 1x16x16 images; this run has resnet18 .*"
        r"expected --model cnn3 \(or none\)$",
    ):
        Trainer(more, CPU_INFO, log=lambda *a, **k: None)


def test_resume_auto_that_finds_no_checkpoint_says_a_new_run_starts(tmp_path):
    """--resume auto --name <a typo> trained from scratch without a word."""
    lines: list[str] = []
    trainer = Trainer(_cfg(tmp_path, 1, resume="auto"), CPU_INFO, log=lambda s, **k: lines.append(s))
    assert f"resume auto: no checkpoint in {tmp_path / 'oc'}: a new run starts there" in lines
    trainer.fit()
    lines.clear()
    Trainer(_cfg(tmp_path, 2, resume="auto"), CPU_INFO, log=lambda s, **k: lines.append(s))
    assert not [s for s in lines if s.startswith("resume auto:")] and any(s.startswith("resumed from") for s in lines)


def test_a_resume_under_another_process_count_or_global_batch_names_it_and_the_lr(tmp_path):
    """`--resume --nproc 1` of a 2-process run halved the global batch, said only as "processes, batch, --grad-accum
    or --max-steps differ" in the schedule's line; the lr (not rescaled under --lr-scaling none) was not said."""
    cfg = _cfg(tmp_path, 1)
    cfg = replace(cfg, optim=replace(cfg.optim, lr_scaling="linear"))
    Trainer(cfg, CPU_INFO, log=lambda *a, **k: None).fit()

    def changed(batch: int) -> str:
        more = replace(cfg, run=replace(cfg.run, epochs=2, batch_size=batch, resume=str(tmp_path / "oc")))
        lines: list[str] = []
        Trainer(more, CPU_INFO, log=lambda s, **k: lines.append(s))
        said = [s.split(" on: ", 1)[1] for s in lines if s.startswith("resume: changed since the checkpoint")]
        return said[0].split(", --")[0] if said else ""  # the first change named: this one

    assert changed(32) == ""
    # one process before and after: --lr-scaling (which follows the process count) is not why (session 33 review)
    assert changed(16) == (
        "global batch 32 -> 16 per step (lr not rescaled: the per-process batch or accumulation changed, not the "
        "processes)"
    )
    # the checkpoint as a 2-process run writes it: its world size, and its peak lr scaled for 2 processes
    ckpt = tmp_path / "oc" / "ckpt" / "last.pt"
    state = torch.load(ckpt, weights_only=True)
    state["world_size"] = 2
    state["scheduler"]["base_lrs"] = [2 * lr for lr in state["scheduler"]["base_lrs"]]
    torch.save(state, ckpt)
    assert (
        changed(32) == "processes 2 -> 1 (global batch 64 -> 32 per step; peak lr 0.004 -> 0.002: --lr-scaling linear)"
    )
    assert (
        changed(64)
        == "processes 2 -> 1 (global batch 64 per step as before; peak lr 0.004 -> 0.002: --lr-scaling linear)"
    )


def test_an_augment_change_to_or_from_auto_on_resuming_is_named_by_what_auto_resolved_to(tmp_path):
    """The checkpoint keeps --augment as asked (auto): a resume that changed it, where either side was auto, was left
    out of the line (crop over auto, or auto, which is none on grey images, over crop), and epoch 2 trained otherwise
    without a word. auto that resolves to the same augmentation as before is no change."""
    cfg = _cfg(tmp_path, 1)  # augment auto: none on these grey images
    Trainer(cfg, CPU_INFO, log=lambda *a, **k: None).fit()

    def said(augment: str) -> list[str]:
        more = replace(
            cfg, data=replace(cfg.data, augment=augment), run=replace(cfg.run, epochs=2, resume=str(tmp_path / "oc"))
        )
        lines: list[str] = []
        Trainer(more, CPU_INFO, log=lambda s, **k: lines.append(s))
        return [s for s in lines if s.startswith("resume:")]

    assert said("translate") == [
        "resume: changed since the checkpoint, from epoch 2 on: --augment auto (none) -> translate"
    ]
    assert said("none") == []  # what auto resolved to: the same augmentation
    assert said("auto") == []
    crop = _cfg(tmp_path / "crop", 1)
    crop = replace(crop, data=replace(crop.data, augment="crop"))
    Trainer(crop, CPU_INFO, log=lambda *a, **k: None).fit()
    back = replace(
        crop,
        data=replace(crop.data, augment="auto"),
        run=replace(crop.run, epochs=2, resume=str(tmp_path / "crop" / "oc")),
    )
    lines: list[str] = []
    Trainer(back, CPU_INFO, log=lambda s, **k: lines.append(s))
    assert [s for s in lines if s.startswith("resume:")] == [
        "resume: changed since the checkpoint, from epoch 2 on: --augment crop -> auto (none)"
    ]


def test_a_resume_that_changes_settings_records_what_the_finished_epochs_trained_with(tmp_path, capsys):
    """config.toml holds a resumed run's new values only: a run resumed with --epochs 2 --lr 0.01 read as if its
    first epoch had trained for 2 epochs at 0.01. resumes.csv keeps each change and its first epoch, config.toml
    points to it (and still loads), and a later resume of that run keeps the earlier rows."""
    import csv

    from cnnpar.cli import main
    from cnnpar.config import load_toml

    run = tmp_path / "r"
    common = ["--device", "cpu", "--workers", "0", "--no-progress", "--no-tensorboard", "--max-steps", "1"]
    data = ["--data", "synthetic", "--synthetic-samples", "128", "--image-shape", "1x16x16", "--batch-size", "32"]
    assert main(["train", *data, *common, "--epochs", "1", "--out-dir", str(tmp_path), "--name", "r"]) == 0
    assert not (run / "resumes.csv").exists()  # nothing resumed: nothing to record
    capsys.readouterr()
    assert main(["train", *common, "--resume", str(run), "--epochs", "2", "--lr", "0.01"]) == 0
    said = [s for s in capsys.readouterr().out.splitlines() if s.startswith("record:")]
    assert said == [
        f"record: changed from epoch 2 on, kept in {run / 'resumes.csv'} (config.toml holds the new values): "
        "optim.lr 0.002 -> 0.01, run.epochs 1 -> 2"
    ]
    assert main(["train", *common, "--resume", str(run), "--epochs", "3"]) == 0  # the lr stays 0.01: no change
    with (run / "resumes.csv").open(newline="") as f:
        rows = [tuple(row.values()) for row in csv.DictReader(f)]
    assert rows == [  # no note: each one asked for on resuming
        ("2", "optim.lr", "0.002", "0.01", ""),
        ("2", "run.epochs", "1", "2", ""),
        ("3", "run.epochs", "2", "3", ""),
    ]
    record = (run / "config.toml").read_text()
    assert "# resumed with other settings: resumes.csv names each one changed, and from which epoch\n" in record
    stored = load_toml(run / "config.toml")
    assert (stored.run.epochs, stored.optim.lr) == (3, 0.01)  # the run's config: the newest values, as before


def test_resume_rows_for_epochs_the_checkpoint_does_not_hold_are_dropped(tmp_path):
    """A row from an attempt that stopped before saving an epoch (or from epochs past the checkpoint resumed
    from) named a change for epochs that are trained again now: only the rows of kept epochs stay."""
    Trainer(_cfg(tmp_path, 1), CPU_INFO, log=lambda *a, **k: None).fit()
    record = tmp_path / "oc" / "resumes.csv"
    record.write_text("from_epoch,setting,before,after\n1,optim.lr,0.1,0.002\n2,optim.lr,0.002,0.5\n")
    Trainer(_cfg(tmp_path, 2, resume=str(tmp_path / "oc")), CPU_INFO, log=lambda *a, **k: None).fit()
    assert record.read_text().splitlines() == [  # an earlier cnnpar's row without the note column is kept
        "from_epoch,setting,before,after,note",
        "1,optim.lr,0.1,0.002,",
        "2,run.epochs,1,2,",
    ]


def test_another_loader_on_resuming_is_named_and_recorded(tmp_path):
    """--loader textbook on resuming a fast-loader run drew the resumed epochs' crops and flips another way
    (altflip is a plain flip there) without a word: named as the other allowed changes are."""
    cfg = _cfg(tmp_path, 1)
    Trainer(cfg, CPU_INFO, log=lambda *a, **k: None).fit()
    more = replace(
        cfg, data=replace(cfg.data, loader="textbook"), run=replace(cfg.run, epochs=2, resume=str(tmp_path / "oc"))
    )
    lines: list[str] = []
    trainer = Trainer(more, CPU_INFO, log=lambda s, **k: lines.append(s))
    assert [s for s in lines if s.startswith("resume:")] == [
        "resume: changed since the checkpoint, from epoch 2 on: --loader fast -> textbook (the resumed epochs draw "
        "their crops and flips as the other loader does)"
    ]
    trainer.fit()
    assert "2,data.loader,fast,textbook," in (tmp_path / "oc" / "resumes.csv").read_text().splitlines()
