"""The shared spec: weight layouts, the CSV format, and compare's table when frameworks are missing."""

from __future__ import annotations

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
    monkeypatch.setattr(compare, "missing_package", lambda fw: fw.needs[-1])
    asked = parse_frameworks("keras-jax,tensorflow,pytensor")
    rows = compare.run_compare(asked, RunSpec(out=str(tmp_path)))
    assert [r["framework"] for r in rows] == ["keras-jax", "tensorflow", "pytensor"]
    assert all(r["status"] == "skipped" for r in rows)
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
        "Keras's BN running variance is the biased one; one epoch: no steady rate (epoch 1 holds tracing and compile)"
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
    arrays = write_npz(tmp_path / "d.npz", n_train=8, n_test=None)
    assert RunSpec(data=str(arrays)).data == str(arrays)
