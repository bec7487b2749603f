"""The shared spec: weight layouts, the CSV format, and compare's table when frameworks are missing."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from cnnpar.errors import ConfigError
from cnnpar.frameworks import compare
from cnnpar.frameworks.spec import (
    CSV_COLUMNS,
    FRAMEWORKS,
    RunSpec,
    csv_name,
    epoch_row,
    first_dense_for_nhwc,
    initial_weights,
    load_bundle,
    parse_frameworks,
    read_result_csv,
    write_result_csv,
)


def test_first_dense_reordered_for_nhwc_computes_the_same_output():
    rng = np.random.default_rng(1)
    c, side, out = 4, 3, 5
    feat_nchw = rng.standard_normal((2, c, side, side)).astype(np.float32)
    w = rng.standard_normal((out, c * side * side)).astype(np.float32)  # PyTorch (out, in), C,H,W flatten
    expected = feat_nchw.reshape(2, -1) @ w.T
    feat_nhwc = feat_nchw.transpose(0, 2, 3, 1).reshape(2, -1)
    np.testing.assert_allclose(feat_nhwc @ first_dense_for_nhwc(w, c, side), expected, rtol=1e-5, atol=1e-5)


def test_initial_weights_are_he_normal_and_seeded():
    a = initial_weights((1, 28, 28), 10, seed=3)
    b = initial_weights((1, 28, 28), 10, seed=3)
    assert all(np.array_equal(x, y) for x, y in zip(a["conv"], b["conv"]))
    assert [k.shape for k in a["conv"]] == [(32, 1, 3, 3), (64, 32, 3, 3), (128, 64, 3, 3)]
    assert [w.shape for w, _ in a["dense"]] == [(256, 128 * 3 * 3), (128, 256), (10, 128)]
    big = a["conv"][2]
    he_std = np.sqrt(2.0 / (64 * 9))
    assert abs(big.std() - he_std) < 0.03 * he_std
    assert all(not b.any() for _, b in a["dense"])


def test_result_csv_round_trip(tmp_path):
    path = tmp_path / "x.csv"
    rows = [epoch_row(1, 0.5, 0.8, 0.6, 0.75, 2.0, 1000)]
    write_result_csv(path, {"framework": "keras", "device": "cpu: x"}, rows)
    header, back = read_result_csv(path)
    assert header == {"framework": "keras", "device": "cpu: x"}
    assert list(back[0]) == CSV_COLUMNS
    assert float(back[0]["images_per_s"]) == 500.0


def test_spec_rejects_a_batch_that_does_not_split_over_devices():
    with pytest.raises(ConfigError, match="split evenly"):
        RunSpec(batch_size=65, devices=2)
    with pytest.raises(ConfigError, match="unknown lasagne"):
        parse_frameworks("torch,lasagne")


def test_compare_marks_missing_frameworks_skipped(tmp_path, monkeypatch, capsys):
    # one framework installed (its runner stubbed: not what this test is about), so the others are skipped, not
    # refused together
    monkeypatch.setattr(compare, "missing_package", lambda fw: None if fw.name == "torch" else fw.needs[-1])
    monkeypatch.setattr(compare, "run_framework", lambda fw, spec, timeout: ("failed", "stubbed"))
    asked = parse_frameworks("keras-jax,tensorflow,pytensor,torch")
    rows = compare.run_compare(asked, RunSpec(out=str(tmp_path)))
    assert [r["framework"] for r in rows] == ["keras-jax", "tensorflow", "pytensor", "torch"]
    assert [r["status"] for r in rows] == ["skipped"] * 3 + ["failed"]
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("compare: skipping")]
    assert lines[0] == 'compare: skipping keras-jax: jax is not installed (pip install "cnnpar[jax]")'
    assert len(lines) == 3
    table = (tmp_path / "cnn2d_3layer_fullconnected_3layer_summary.md").read_text()
    for name in ("keras-jax", "tensorflow", "pytensor"):
        assert f"| {name} | skipped |" in table
    assert (tmp_path / "cnn2d_3layer_fullconnected_3layer_summary.png").stat().st_size > 1000
    assert not any((tmp_path / csv_name(FRAMEWORKS[n])).exists() for n in ("keras-jax", "tensorflow"))


def test_a_one_epoch_run_gives_no_steady_rate_and_says_why(tmp_path):
    """Epoch 1 holds tracing and compile: a one-epoch compare used to report it as the "median, later epochs"
    rate, ranking a framework's compile as its speed."""
    fw = FRAMEWORKS["torch"]
    rows = [epoch_row(1, 0.5, 0.8, 0.6, 0.75, 20.0, 1000)]
    write_result_csv(tmp_path / csv_name(fw), {"framework": fw.name}, rows)
    one = compare.summary_row(fw, "ok", "", tmp_path)
    assert one["steady_images_per_s"] == "" and one["steady_epoch_s"] == ""
    assert "one epoch: no steady rate" in one["note"]
    write_result_csv(
        tmp_path / csv_name(fw), {"framework": fw.name}, [*rows, epoch_row(2, 0.4, 0.9, 0.5, 0.8, 2.0, 1000)]
    )
    two = compare.summary_row(fw, "ok", "", tmp_path)
    assert float(two["steady_images_per_s"]) == 500.0 and two["note"] == ""


def test_a_runner_silent_past_its_timeout_is_stopped_with_its_children_and_leaves_no_csv(tmp_path, monkeypatch):
    """The deadline was checked only when the runner printed: a silent one ran on; and a killed torchrun's workers
    finished and wrote a CSV beside the failed row."""
    import subprocess
    import sys
    import time

    import psutil

    fw = FRAMEWORKS["torch"]
    marker = f"compare-silent-{tmp_path.name}"
    script = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', '{marker}'])\n"
        f"open({str(tmp_path / csv_name(fw))!r}, 'w').write('half')\n"
        "time.sleep(120)\n"
    )
    spec = RunSpec(out=str(tmp_path))  # first: it imports torch, which starts processes of its own
    real = subprocess.Popen
    monkeypatch.setattr(compare.subprocess, "Popen", lambda cmd, **kw: real([sys.executable, "-c", script], **kw))
    t0 = time.monotonic()
    status, note = compare.run_framework(fw, spec, timeout=3)
    assert time.monotonic() - t0 < 30
    assert status == "failed" and note.startswith("timed out after 3 s: stopped with its processes")
    assert not (tmp_path / csv_name(fw)).exists()
    time.sleep(0.5)
    assert not [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]


def test_a_timed_out_runners_workers_in_sessions_of_their_own_are_stopped_too(tmp_path, monkeypatch):
    """torch elastic starts each worker in a session of its own: a `killpg` of the runner's left two workers of a
    timed-out `compare --devices 2` running for 25 s more, beside the next framework's timed run, free to write
    a full CSV beside the failed row (and `compare` waited 10 s on their open pipe). The fake runner's child
    stands for such a worker: in a session of its own, it would write its CSV 30 s on."""
    import subprocess
    import sys
    import time

    from tests.unit.test_process_tree import gone_soon, running_with

    fw = FRAMEWORKS["torch"]
    marker = f"compare-worker-{tmp_path.name}"
    late_csv = f"import time; time.sleep(30); open({str(tmp_path / csv_name(fw))!r}, 'w').write('late')"
    script = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {late_csv!r}, {marker!r}], start_new_session=True)\n"
        "time.sleep(120)\n"
    )
    spec = RunSpec(out=str(tmp_path))  # first: it imports torch, which starts processes of its own
    real = subprocess.Popen
    monkeypatch.setattr(compare.subprocess, "Popen", lambda cmd, **kw: real([sys.executable, "-c", script], **kw))
    try:
        t0 = time.monotonic()
        status, note = compare.run_framework(fw, spec, timeout=2)
        assert status == "failed" and note.startswith("timed out after 2 s: stopped with its processes")
        assert gone_soon(marker), "the runner's worker in a session of its own outlived the timeout"
        assert time.monotonic() - t0 < 10
        assert not (tmp_path / csv_name(fw)).exists()
    finally:
        for p in running_with(marker):
            p.kill()


def test_a_run_whose_loss_turned_nan_is_failed_diverged_not_ok_with_a_rate(tmp_path):
    """Keras, TensorFlow and PyTensor train on in NaN and write the rows: the summary said "ok" with a rate and a
    val acc of 10 % (argmax of NaN logits), where the torch runner, whose engine stops, said "failed"."""
    fw = FRAMEWORKS["tensorflow"]
    rows = [epoch_row(1, 0.5, 0.8, 0.6, 0.75, 2.0, 1000), epoch_row(2, float("nan"), 0.1, float("nan"), 0.1, 1.0, 1000)]
    header = {"framework": fw.framework, "device": "cpu x", "device_type": "cpu", "spec_lr": "0.001"}
    write_result_csv(tmp_path / csv_name(fw), header, [*rows, epoch_row(3, float("nan"), 0.1, 0.7, 0.1, 1.0, 1000)])
    row = compare.summary_row(fw, "ok", "", tmp_path)
    assert row["status"] == "failed"
    assert row["note"] == "diverged: epoch 2 train loss nan is not finite: try a lower --lr 0.0005"
    assert row["steady_images_per_s"] == row["final_val_acc"] == row["epochs"] == ""
    assert row["device"] == "cpu x (cpu)" and row["csv"] == csv_name(fw)  # which run it was stays said
    write_result_csv(tmp_path / csv_name(fw), header, [rows[0], epoch_row(2, 0.4, 0.9, float("inf"), 0.1, 1.0, 1000)])
    assert compare.summary_row(fw, "ok", "", tmp_path)["note"].startswith("diverged: epoch 2 val loss inf is not")


@pytest.mark.usefixtures("one_thread")
def test_the_torch_runners_divergence_reads_as_the_others_and_names_no_flag_compare_lacks(tmp_path, monkeypatch):
    """The engine's hint suggested --precision fp32 or --compile off, which `compare` does not take."""
    import torch

    from cnnpar.engine import trainer as trainer_mod
    from cnnpar.errors import UserError
    from cnnpar.frameworks import torch_runner

    def begin_epoch_with_nan_weights(self, epoch):  # what a diverged step leaves behind
        with torch.no_grad():
            next(self.raw_model.parameters()).fill_(float("nan"))
        begin(self, epoch)

    begin = trainer_mod.Trainer.begin_epoch
    monkeypatch.setattr(trainer_mod.Trainer, "begin_epoch", begin_epoch_with_nan_weights)
    spec = RunSpec(max_train=64, max_val=32, batch_size=32, epochs=1, lr=0.01, out=str(tmp_path))
    with pytest.raises(UserError) as e:
        torch_runner.train(FRAMEWORKS["torch"], spec)
    assert str(e.value) == "diverged: epoch 1 train loss nan is not finite: try a lower --lr 0.005"


def test_a_one_epoch_run_keeps_the_runners_own_note(tmp_path):
    fw = FRAMEWORKS["keras-jax"]
    header = {"framework": fw.framework, "note": "Keras's BN running variance is the biased one"}
    write_result_csv(tmp_path / csv_name(fw), header, [epoch_row(1, 0.5, 0.8, 0.6, 0.75, 20.0, 1000)])
    assert compare.summary_row(fw, "ok", "", tmp_path)["note"] == (
        "Keras's BN running variance is the biased one; " + compare.ONE_EPOCH_NOTE
    )


def test_compare_refuses_data_that_only_cnnpars_engine_reads_up_front(tmp_path):
    """An image folder reached every runner, and each but torch failed with an AttributeError of its own."""
    from tests.datafiles import write_image_folder, write_npz

    photos = write_image_folder(tmp_path / "photos")
    with pytest.raises(ConfigError) as e:
        RunSpec(data=str(photos))
    assert str(e.value) == (
        f"--data {photos}: an image folder: expected the built-in digits, an .npz or a .csv, which every framework "
        "reads as the same in-memory arrays"
    )
    with pytest.raises(ConfigError, match=r"--format folder: expected one of auto, digits, npz, csv"):
        RunSpec(format="folder")
    with pytest.raises(ConfigError, match=r"--data .*gone\.npz: no such file: expected an existing \.npz file"):
        RunSpec(data=str(tmp_path / "gone.npz"))
    np.save(tmp_path / "x.npy", np.zeros((4, 8, 8), np.uint8))
    with pytest.raises(ConfigError) as e:  # it was "npy data": a .npy pair is read by cnnpar train --labels alone
        RunSpec(data=str(tmp_path / "x.npy"))
    assert str(e.value).startswith(
        f"--data {tmp_path / 'x.npy'}: a .npy of images, with no --labels here (np.savez(F, x_train=x, y_train=y) "
        "makes an .npz): expected the built-in digits, an .npz or a .csv"
    )
    arrays = write_npz(tmp_path / "d.npz", n_train=8, n_test=None)
    assert RunSpec(data=str(arrays)).data == str(arrays)


# ---- runs that did not learn (audit F1) ------------------------------------------------------------------------
LR10 = {  # `compare --epochs 2 --lr 10` on the digits: finite losses, chance accuracy, reported "ok" with a rate
    "tensorflow": [(420080858.10, 0.1278, 31742293325.7, 0.0836), (1737149.185014, 0.1705, 78511319.353760, 0.0501)],
    "torch": [(567169505.16, 0.1179, 11675778609.9, 0.0864), (28185.421723, 0.0952, 13.637638, 0.1059)],
}
HEALTHY = {  # what the default lr gives, at both ends of what the tests and the docs run
    "digits, 1 epoch": [(1.171253, 0.6385, 0.404593, 0.869081)],
    "digits, 2 epochs": [(1.319786, 0.6151, 0.555021, 0.830084), (0.207122, 0.9446, 0.209205, 0.944290)],
    "a bad first epoch, recovered": [(900.0, 0.11, 4000.0, 0.10), (0.5, 0.85, 0.6, 0.82)],
}


def write_epochs(tmp_path, fw, epochs, classes=10, **header):
    rows = [epoch_row(i, tl, ta, vl, va, 1.0, 1000) for i, (tl, ta, vl, va) in enumerate(epochs, 1)]
    head = {"framework": fw.framework, "num_classes": str(classes), "spec_lr": "10.0", "devices_used": "1", **header}
    write_result_csv(tmp_path / csv_name(fw), head, rows)


@pytest.mark.parametrize("name", list(LR10))
def test_a_finite_but_exploded_run_is_failed_diverged_as_a_nan_one_is(tmp_path, name):
    fw = FRAMEWORKS[name]
    write_epochs(tmp_path, fw, LR10[name])
    row = compare.summary_row(fw, "ok", "", tmp_path)
    assert row["status"] == "failed"
    assert row["steady_images_per_s"] == row["final_val_acc"] == ""
    loss = {"tensorflow": "val loss 78511319.353760", "torch": "train loss 28185.421723"}[name]
    assert row["note"] == f"diverged: epoch 2 {loss} is above 10 x ln(10 classes) = 23.0: try a lower --lr 5"
    assert compare.exit_status([row]) == (1, f"compare: failed: {name}")


def test_a_train_loss_that_grew_far_above_its_first_epochs_is_diverged(tmp_path):
    fw = FRAMEWORKS["keras-jax"]
    write_epochs(tmp_path, fw, [(0.3, 0.9, 0.2, 0.95), (0.6, 0.8, 0.5, 0.9), (4.0, 0.3, 3.0, 0.4)])
    row = compare.summary_row(fw, "ok", "", tmp_path)
    assert row["status"] == "failed"
    assert row["note"] == (
        "diverged: epoch 3 train loss 4.000000 grew above 10 x epoch 1's 0.3 and above ln(10 classes) = 2.30: "
        "try a lower --lr 5"
    )
    # 10x its first epoch's but no worse than a uniform guess: an easy data set's wobble, not a divergence
    write_epochs(tmp_path, fw, [(0.05, 0.99, 0.05, 0.99), (0.6, 0.85, 0.5, 0.86)])
    assert compare.summary_row(fw, "ok", "", tmp_path)["status"] == "ok"


@pytest.mark.parametrize("name", list(HEALTHY))
def test_a_healthy_run_is_ok_with_no_verdict(tmp_path, name):
    fw = FRAMEWORKS["tensorflow"]
    write_epochs(tmp_path, fw, HEALTHY[name])
    row = compare.summary_row(fw, "ok", "", tmp_path)
    assert row["status"] == "ok" and compare.learned(row), row["note"]
    assert compare.exit_status([row]) == (0, "")


def test_a_run_at_chance_with_sane_losses_did_not_learn_and_says_so_everywhere(tmp_path):
    fw = FRAMEWORKS["keras-torch"]
    write_epochs(tmp_path, fw, [(2.31, 0.11, 2.30, 0.11), (2.30, 0.12, 2.30, 0.15)])
    row = compare.summary_row(fw, "ok", "", tmp_path)
    assert row["status"] == "ok" and row["final_val_acc"] == "0.1500"  # 1.5 / 10 classes: at chance
    assert row["note"].startswith("did not learn (val acc at chance)")
    assert compare.exit_status([row]) == (1, "compare: did not learn (val acc at chance): keras-torch")
    assert compare.bar_label(row) == "1,000 on 1 dev, did not learn"
    assert compare.bar_colour(row) == "tab:orange"
    assert compare.console_line(row).endswith("val acc 15.00% did not learn (val acc at chance)")
    compare.write_markdown(tmp_path / "t.md", [row], RunSpec(out=str(tmp_path)))
    assert "| keras-torch | ok, did not learn (val acc at chance) |" in (tmp_path / "t.md").read_text()
    # just above chance learned something
    write_epochs(tmp_path, fw, [(2.31, 0.11, 2.30, 0.11), (2.2, 0.14, 2.2, 0.1504)])
    assert compare.learned(compare.summary_row(fw, "ok", "", tmp_path))


def test_compare_of_frameworks_none_of_which_is_installed_is_refused_in_one_line(tmp_path, monkeypatch):
    """Every framework asked for not installed is settings this machine cannot run, as a mistyped --frameworks is:
    it wrote a summary of skipped rows, removed the frameworks' earlier CSVs from --out and exited 1, a tool's
    failure. Now one line naming each with its install command, exit 2, and --out as it was."""
    import argparse

    from cnnpar.cli import main

    monkeypatch.setattr(compare, "missing_package", lambda fw: fw.needs[-1])
    monkeypatch.setattr(compare, "load_bundle", lambda spec: pytest.fail("the data loaded: not refused first"))
    earlier = tmp_path / compare.csv_name(compare.FRAMEWORKS["pytensor"])
    earlier.write_text("an earlier run's rows\n")
    p = argparse.ArgumentParser()
    compare.add_compare_args(p)
    args = p.parse_args(["--frameworks", "keras-jax,pytensor", "--out", str(tmp_path)])
    with pytest.raises(ConfigError) as e:
        compare.main_from_args(args)
    assert str(e.value) == (
        "compare --frameworks keras-jax,pytensor: none of them is installed here (keras-jax needs jax: pip install "
        '"cnnpar[jax]"; pytensor needs pytensor: pip install "cnnpar[pytensor]"): expected a framework that is '
        "installed (torch always is), or install one"
    )
    assert main(["compare", "--frameworks", "pytensor", "--out", str(tmp_path)]) == 2
    assert [f.name for f in tmp_path.iterdir()] == [earlier.name] and earlier.read_text() == "an earlier run's rows\n"
    ok = {"framework": "torch", "status": "ok", "note": ""}
    assert compare.exit_status([ok, {"framework": "pytensor", "status": "skipped", "note": "x"}]) == (0, "")


# ---- refused once, before any runner (F2, F5, F6, F7) ----------------------------------------------------------
def test_non_square_images_are_refused_naming_compares_own_flags(tmp_path):
    from tests.datafiles import bar_images

    with pytest.raises(ConfigError) as e:
        RunSpec(image_shape="1x8x16")
    assert str(e.value) == (
        "--image-shape 1x8x16: 8x16 (HxW) images: cnn3 needs square images, and compare does not resize them"
    )
    x, y = bar_images(64)
    np.savez(tmp_path / "wide.npz", x_train=x[:, :8, :], y_train=y)  # 8x16, which no flag of compare's shapes
    spec = RunSpec(data=str(tmp_path / "wide.npz"), batch_size=16)
    with pytest.raises(ConfigError, match=r"wide\.npz: 8x16 \(HxW\) images: cnn3 needs square images"):
        load_bundle(spec)


def test_compares_flag_refusals_name_the_flag_its_value_and_what_is_expected():
    """The shape's line named no flag ("image shape '3x32x'"), --max-train -5 did not say which of two flags, and an
    uneven --batch-size did not say what would split."""
    cases = {
        "--image-shape 3x32x: expected CxHxW such as 3x32x32 (or HxW for grey)": dict(image_shape="3x32x"),
        "--max-train -5: expected 0 (all) or a count > 0": dict(max_train=-5),
        "--max-val -1: expected 0 (all) or a count > 0": dict(max_val=-1),
        "--batch-size 65 with --devices 2: the global batch must split evenly: expected a multiple of 2": dict(
            batch_size=65, devices=2
        ),
    }
    for line, flags in cases.items():
        with pytest.raises(ConfigError) as e:
            RunSpec(**flags)
        assert str(e.value) == line


def no_runner(monkeypatch):
    started = []
    monkeypatch.setattr(compare, "run_framework", lambda fw, spec, timeout: (started.append(fw.name), "failed", "")[1:])
    return started


def test_data_dependent_errors_come_once_before_any_runner(tmp_path, monkeypatch):
    """`--batch-size 5000` took 47 s and printed its error six times, once per runner after its imports."""
    started = no_runner(monkeypatch)
    asked = parse_frameworks("torch,tensorflow")
    with pytest.raises(ConfigError) as e:
        compare.run_compare(asked, RunSpec(batch_size=5000, out=str(tmp_path)))
    assert str(e.value) == (
        "--batch-size 5000 exceeds the 1438 training samples of scikit-learn digits (built in): expected at most 1438"
    )
    from tests.datafiles import bar_images

    x, y = bar_images(64)
    np.savez(tmp_path / "wide.npz", x_train=x[:, :8, :], y_train=y)
    with pytest.raises(ConfigError, match="cnn3 needs square images"):
        compare.run_compare(asked, RunSpec(data=str(tmp_path / "wide.npz"), batch_size=16, out=str(tmp_path)))
    assert started == []
    for bad in (1.5, 1.0, -0.1):
        with pytest.raises(ConfigError, match=rf"--val-fraction {bad}: expected 0 <= value < 1"):
            RunSpec(val_fraction=bad)


@pytest.mark.parametrize("text", ["", ",,", " , "])
def test_an_empty_framework_list_is_refused_only_all_means_all(text):
    with pytest.raises(ConfigError, match=r"--frameworks .*: expected all or some of torch, keras-tensorflow"):
        parse_frameworks(text)
    assert parse_frameworks("all") == list(FRAMEWORKS.values())


@pytest.mark.parametrize("timeout", ["0", "-5", "nan"])
def test_a_timeout_that_is_not_positive_is_refused(tmp_path, monkeypatch, capsys, timeout):
    from cnnpar.cli import main

    started = no_runner(monkeypatch)
    assert main(["compare", "--frameworks", "torch", "--timeout", timeout, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"--timeout {timeout}: expected a number of seconds > 0") and "\n" not in err, err
    assert started == []


@pytest.mark.parametrize(
    ("typed", "why"),
    [
        (["--lr", "nan"], "--lr = nan: expected a finite number > 0"),
        (["--lr", "inf"], "--lr = inf: expected a finite number > 0"),
        (["--lr", "0"], "--lr = 0.0: expected a finite number > 0"),
        (["--seed", "-1"], "--seed = -1: expected 0 <= value < 2**63"),
    ],
)
def test_a_bad_lr_or_seed_is_refused_in_one_line_before_any_runner_starts(tmp_path, monkeypatch, capsys, typed, why):
    """--lr nan or inf and --seed -1 started every runner, each failing on its own (torch: "optim.lr (--lr) = nan",
    exit 1, a failed row per framework)."""
    from cnnpar.cli import main

    started = no_runner(monkeypatch)
    assert main(["compare", "--frameworks", "torch", *typed, "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"cnnpar: error: {why}\n"
    assert started == []


def test_a_seed_keras_cannot_take_is_refused_before_any_runner_only_where_keras_runs(tmp_path, monkeypatch, capsys):
    """--seed 2**32 passed RunSpec's check (< 2**63), then each Keras runner failed on its own in
    keras.utils.set_random_seed (numpy's "Seed must be between 0 and 2**32 - 1"), exit 1; the other runners take it."""
    from cnnpar.cli import main

    monkeypatch.setattr(compare, "missing_package", lambda fw: None)  # as where Keras is installed
    started = no_runner(monkeypatch)
    out = ["--out", str(tmp_path)]
    assert main(["compare", "--frameworks", "torch,keras-jax", "--seed", str(2**32), *out]) == 2
    assert capsys.readouterr().err == (
        f"cnnpar: error: --seed = {2**32}: keras-jax seed numpy's generator, which takes 0 <= value < 2**32: "
        "expected a smaller --seed, or --frameworks without Keras\n"
    )
    assert started == []
    main(["compare", "--frameworks", "torch,keras-jax", "--seed", str(2**32 - 1), *out])
    main(["compare", "--frameworks", "torch", "--seed", str(2**62), *out])
    assert started == ["torch", "keras-jax", "torch"]


# ---- what a failed runner's note says (F8, F12) ----------------------------------------------------------------
def test_a_runner_killed_by_a_signal_says_so_not_its_last_progress_line(tmp_path):
    log = tmp_path / "torch.log"
    lines = ["keras-torch: epoch 1/2 train loss 1.1712 acc 63.71% val loss 0.4052 acc 86.91% 2.2 s 627 img/s"]
    assert compare.failure_note(-9, lines, log) == f"killed by SIGKILL (signal 9; out of memory?) (log: {log})"
    assert compare.failure_note(-11, lines, log) == f"killed by SIGSEGV (signal 11) (log: {log})"
    assert (
        compare.failure_note(1, [*lines, "RuntimeError: boom", ""], log)
        == f"exit code 1: RuntimeError: boom (log: {log})"
    )


def test_a_runner_killed_mid_run_is_reported_killed(tmp_path, monkeypatch):
    import subprocess
    import sys

    fw = FRAMEWORKS["keras-torch"]
    script = "import os, sys\nprint('keras-torch: epoch 1/2 train loss 1.17', flush=True)\nos.kill(os.getpid(), 9)\n"
    spec = RunSpec(out=str(tmp_path))
    real = subprocess.Popen
    monkeypatch.setattr(compare.subprocess, "Popen", lambda cmd, **kw: real([sys.executable, "-c", script], **kw))
    status, note = compare.run_framework(fw, spec, timeout=60)
    assert status == "failed" and note.startswith("killed by SIGKILL (signal 9; out of memory?) (log: "), note


def test_the_torch_runners_divergence_note_carries_no_exit_code_or_runner_name(tmp_path):
    said = "diverged: epoch 1 train loss nan is not finite: try a lower --lr 5e+11"
    lines = ["torch: DDP, launching", f"torch_runner: error: {said}"]
    assert compare.failure_note(2, lines, tmp_path / "torch.log") == said
    other = ["torch_runner: error: --batch-size 5000 exceeds the 1438 training samples of digits"]
    assert compare.failure_note(2, other, tmp_path / "t.log").startswith("exit code 2: torch_runner: error: --batch")


# ---- what the summary says of each run (F9, F10, F11, F15) -----------------------------------------------------
def test_bars_console_lines_and_title_give_the_devices(tmp_path):
    fw = FRAMEWORKS["keras-tensorflow"]
    write_epochs(tmp_path, fw, HEALTHY["digits, 2 epochs"], devices_used="2")
    row = compare.summary_row(fw, "ok", "", tmp_path)
    assert compare.bar_label(row) == "1,000 on 2 dev"
    assert compare.console_line(row) == f"{'keras-tensorflow':<18} {'1,000':>10} img/s   2 dev  val acc 94.43%"
    spec = RunSpec(devices=2, max_train=512, out=str(tmp_path))
    assert compare.chart_title(spec, [row]).startswith(
        "cnn3 on digits, 3 epochs, batch 128, --devices 2, --max-train 512, "
    )
    assert ", --devices" not in compare.chart_title(RunSpec(out=str(tmp_path)), [row])


def test_the_pytensor_mode_and_linker_that_ran_are_in_the_note(tmp_path):
    fw = FRAMEWORKS["pytensor"]
    linker = "VMLinker use_cloop=False c_thunks=False"
    write_epochs(tmp_path, fw, HEALTHY["digits, 2 epochs"], pytensor_mode="FAST_COMPILE", pytensor_linker=linker)
    assert compare.summary_row(fw, "ok", "", tmp_path)["note"] == f"PyTensor mode FAST_COMPILE, linker {linker}"


def test_keras_on_torch_without_jit_compile_says_it_ran_eagerly():
    from cnnpar.frameworks.keras_runner import timed_line

    assert timed_line("torch", False).startswith("eager (no tracing/compilation); each epoch model.fit")
    assert timed_line("torch", True).startswith("epoch 1 includes tracing/compilation")
    assert timed_line("jax", True).startswith("epoch 1 includes tracing/compilation")
    assert "gathered before the clock starts" in timed_line("tensorflow", False)


def test_the_settings_keep_seed_0_and_leave_out_max_train_0():
    header = {"spec_data": "digits", "spec_image_shape": "", "spec_max_train": "0", "spec_seed": "0", "spec_lr": "0.1"}
    assert compare.described(header)["settings"] == "data digits, seed 0, lr 0.1"


def test_the_help_names_synthetic_data():
    from cnnpar.frameworks.spec import SPEC_HELP

    assert "synthetic" in SPEC_HELP["data"]


def test_each_csv_records_the_load_average_before_the_run_and_the_thread_counts(tmp_path, monkeypatch):
    import os
    import sys

    from cnnpar.frameworks import spec as spec_mod

    readings = iter(["0.10 0.20 0.30", "1.50 1.00 0.50"])
    monkeypatch.setattr(spec_mod, "load_average", lambda: next(readings))

    def train(fw, spec):
        return spec_mod.base_header(fw, spec), [epoch_row(1, 0.5, 0.8, 0.6, 0.75, 2.0, 1000)]

    monkeypatch.setattr(sys, "argv", ["x", "--framework", "torch", "--out", str(tmp_path)])
    assert spec_mod.runner_main("torch_runner", train) == 0
    header, _ = read_result_csv(tmp_path / csv_name(FRAMEWORKS["torch"]))
    assert header["load_avg_before_1_5_15"] == "0.10 0.20 0.30" and header["load_avg_1_5_15"] == "1.50 1.00 0.50"
    import torch

    assert spec_mod.torch_threads() == f"{torch.get_num_threads()} (torch.get_num_threads)"
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2 --xla_cpu_multi_thread_eigen=false")
    assert spec_mod.xla_threads() == "--xla_cpu_multi_thread_eigen=false"
    monkeypatch.delenv("XLA_FLAGS")
    assert spec_mod.xla_threads() == f"XLA's CPU default, one per core ({os.cpu_count()})"
    assert "openblas" in spec_mod.blas_threads() or "mkl" in spec_mod.blas_threads()


# ---- the device a TensorFlow run records (F4) ------------------------------------------------------------------
class FakeTf:
    """What tf_device asks of TensorFlow: its physical GPUs."""

    def __init__(self, gpus: int) -> None:
        from types import SimpleNamespace

        found = [SimpleNamespace(name=f"/physical_device:GPU:{i}") for i in range(gpus)]
        self.config = SimpleNamespace(list_physical_devices=lambda kind: found if kind == "GPU" else [])


def test_a_tensorflow_run_on_logical_cpu_devices_records_the_cpu_not_the_gpu():
    """One GPU and --devices 2: the strategy trained on /cpu:0,/cpu:1, and the record said GPU."""
    from cnnpar.frameworks.spec import cpu_name, tf_device

    cpu = {"device": cpu_name(), "device_type": "cpu"}
    gpu = {"device": "/physical_device:GPU:0", "device_type": "gpu"}
    assert tf_device(FakeTf(1), ["/cpu:0", "/cpu:1"]) == cpu
    assert tf_device(FakeTf(2), ["/gpu:0", "/gpu:1"]) == gpu
    assert tf_device(FakeTf(1), []) == gpu  # the default strategy takes the GPU
    assert tf_device(FakeTf(0), []) == cpu


@pytest.mark.usefixtures("one_thread")
def test_the_torch_runner_reads_the_data_with_the_format_and_shape_it_was_given(tmp_path):
    """A CSV not named .csv, with --format csv: every runner read it but torch, whose engine guessed the format
    from the name again and failed asking for --format."""
    from cnnpar.frameworks import torch_runner
    from tests.datafiles import bar_images, write_pixel_csv

    x, y = bar_images(96, side=8, channels=3)
    data = write_pixel_csv(tmp_path / "rgb.txt", x.transpose(0, 3, 1, 2), y)  # rows in C,H,W order
    spec = RunSpec(data=str(data), format="csv", image_shape="3x8x8", batch_size=32, epochs=1, out=str(tmp_path))
    header, rows = torch_runner.train(FRAMEWORKS["torch"], spec)
    assert header["image_shape"] == "3x8x8" and header["train_samples"] == "77"
    assert len(rows) == 1


def test_chance_for_few_classes_is_one_over_classes_plus_a_margin():
    """1.5 / classes is 75 % for two classes: a binary run at 64.9 % that learned was failed as "did not learn"
    (the session 33 review)."""
    assert not compare.at_chance([{"val_acc": "0.649"}], 2)
    assert compare.at_chance([{"val_acc": "0.54"}], 2)
    assert not compare.at_chance([{"val_acc": "0.49"}], 3)
    assert compare.at_chance([{"val_acc": "0.15"}], 10) and not compare.at_chance([{"val_acc": "0.16"}], 10)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux: prctl's parent-death signal")
def test_a_runner_ends_with_a_compare_killed_outright_and_removes_its_temporary_folder(tmp_path):
    """A SIGKILLed `cnnpar compare` left its runner, in a session of its own, training to its end (reparented to
    init), and a runner stopped by a SIGTERM ran no clean-up: the torch runner's temporary folder stayed. Here
    compare's own run_framework starts a runner whose training waits inside a temporary folder."""
    import subprocess
    import time

    import psutil

    from tests.conftest import cli_env

    pid_file, folder_file = tmp_path / "runner.pid", tmp_path / "folder"
    runner = (
        "import os, sys, tempfile, time\n"
        "from cnnpar.frameworks.spec import runner_main\n"
        "def train(fw, spec):\n"
        f"    with tempfile.TemporaryDirectory(dir={str(tmp_path)!r}) as folder:\n"
        f"        open({str(folder_file)!r}, 'w').write(folder)\n"
        f"        open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        "        time.sleep(120)\n"
        f"sys.argv[1:] = ['--framework', 'torch', '--out', {str(tmp_path)!r}]\n"
        "sys.exit(runner_main('fake_runner', train))\n"
    )
    compare_run = (
        "import subprocess, sys\n"
        "from cnnpar.frameworks import compare\n"
        "from cnnpar.frameworks.spec import FRAMEWORKS, RunSpec\n"
        "real = subprocess.Popen\n"
        "def popen(cmd, **kw):  # the runner's command only (ctypes.util runs ldconfig through Popen too)\n"
        f"    fake = [sys.executable, '-c', {runner!r}]\n"
        "    return real(fake if 'cnnpar.frameworks.torch_runner' in cmd else cmd, **kw)\n"
        "compare.subprocess.Popen = popen\n"
        f"compare.run_framework(FRAMEWORKS['torch'], RunSpec(out={str(tmp_path)!r}), 120.0)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", compare_run], env=cli_env(), stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and proc.poll() is None, "the runner never started"
        time.sleep(0.05)
    pid = int(pid_file.read_text())  # written after runner_main asked for its parent-death signal
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 5
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        if time.monotonic() > deadline:
            psutil.Process(pid).kill()
            pytest.fail("the runner outlived the compare that started it")
        time.sleep(0.05)
    assert not Path(folder_file.read_text()).exists(), "the runner left its temporary folder"


def test_consecutive_seeds_shuffle_the_frameworks_in_orders_of_their_own():
    """The runners' order was seeded by seed + epoch: seed 1's epoch e was seed 0's epoch e + 1."""
    from cnnpar.frameworks.spec import epoch_order

    assert (epoch_order(100, 0, 7) == epoch_order(100, 0, 7)).all()  # one seed and epoch: one order, every run
    for epoch in range(3):
        assert not (epoch_order(100, epoch, 1) == epoch_order(100, epoch + 1, 0)).all()
        assert sorted(epoch_order(100, epoch, 1).tolist()) == list(range(100))


def _torch_compare_run(out, *words: str) -> tuple[dict, list[dict]]:
    """`cnnpar compare --frameworks torch` on 48 + 24 digits, its runner in this process: the header and rows of
    its CSV."""
    from cnnpar.cli import build_parser
    from cnnpar.frameworks import torch_runner
    from cnnpar.frameworks.spec import spec_from_args

    tiny = ["--max-train", "48", "--max-val", "24", "--batch-size", "16", "--epochs", "1", "--out", str(out)]
    args = build_parser().parse_args(["compare", "--frameworks", "torch", *tiny, *words])
    return torch_runner.train(FRAMEWORKS["torch"], spec_from_args(args))


def test_compares_data_epoch_lr_and_seed_flags_are_what_the_torch_run_trained(tmp_path):
    """--max-train and --max-val cut the split, --val-fraction draws it, --epochs is the CSV's rows, and --lr and
    --seed change what it trains (the same flags twice train alike)."""
    header, rows = _torch_compare_run(tmp_path, "--epochs", "2")
    assert (header["train_samples"], header["val_samples"], len(rows)) == ("48", "24", 2)
    assert (header["spec_epochs"], header["spec_lr"], header["spec_seed"]) == ("2", "0.001", "0")

    def loss(*words: str) -> str:
        return _torch_compare_run(tmp_path, *words)[1][-1]["train_loss"]

    plain = loss()
    assert loss() == plain
    assert loss("--lr", "0.02") != plain and loss("--seed", "1") != plain
    header, _ = _torch_compare_run(tmp_path, "--max-train", "0", "--val-fraction", "0.9")
    assert abs(int(header["train_samples"]) - 0.1 * 1797) <= 1  # the digits' 1797 images, 90 % held out


def test_a_stop_noted_before_a_runner_starts_no_runner(tmp_path, monkeypatch):
    """A Ctrl-C noted, not raised, inside an import (errors.stop_on_signals) as `cnnpar compare` began: each runner
    started and trained in full before the command stopped."""
    import signal
    import subprocess

    from cnnpar import errors

    started = tmp_path / "started"
    real = subprocess.Popen
    script = f"open({str(started)!r}, 'w')"
    monkeypatch.setattr(compare.subprocess, "Popen", lambda cmd, **kw: real([sys.executable, "-c", script], **kw))
    errors.note_stop(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        compare.run_framework(FRAMEWORKS["torch"], RunSpec(out=str(tmp_path)), 60.0)
    assert not started.exists()
