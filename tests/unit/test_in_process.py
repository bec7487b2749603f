"""`cli.main` called from Python (a notebook, a script): what a command sets for itself is put back when it returns,
so the caller's Ctrl-C, random streams and torch settings are its own again, and a second call trains as the first."""

from __future__ import annotations

import csv
import os
import random
import signal
import sys

import numpy as np
import pytest
import torch

from cnnpar import errors
from cnnpar.cli import main
from cnnpar.engine.trainer import Trainer

# every Ctrl-C here is Python's KeyboardInterrupt as in a terminal, in a suite started with SIGINT ignored too
pytestmark = pytest.mark.usefixtures("one_thread", "stops_reach_children")

TRAIN = ["train", "--epochs", "1", "--max-steps", "4", "--no-progress", "--no-tensorboard", "--device", "cpu"]


def _process_state() -> dict:
    return {
        "sigint": signal.getsignal(signal.SIGINT),
        "sigterm": signal.getsignal(signal.SIGTERM),
        "sighup": signal.getsignal(signal.SIGHUP),
        "unraisablehook": sys.unraisablehook,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "matmul_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_tf32": torch.backends.cudnn.allow_tf32,
        "csv_field_limit": csv.field_size_limit(),
    }


def _first_loss(run: str) -> str:
    return open(os.path.join(run, "metrics.csv")).read().splitlines()[1].split(",")[1]


def test_two_trains_in_one_process_leave_its_handlers_settings_and_random_streams_as_they_were(tmp_path):
    before = _process_state()
    torch.manual_seed(1234), np.random.seed(1234), random.seed(1234)
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(1234), np.random.seed(1234), random.seed(1234)
    for name in ("a", "b"):
        assert main([*TRAIN, "--out-dir", str(tmp_path), "--name", name]) == 0
        assert _process_state() == before
        assert errors.pending_stop() is None
    # the caller's streams go on as if no run had drawn from them or seeded them
    drawn = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(drawn[0], expected[0]) and np.array_equal(drawn[1], expected[1]) and drawn[2] == expected[2]
    assert _first_loss(tmp_path / "a") == _first_loss(tmp_path / "b")


def test_a_train_on_a_pixel_csv_leaves_the_csv_modules_field_limit_as_it_was(tmp_path):
    """data/csv_source.py raises csv's field limit for a pixel CSV's long rows: that limit stayed raised in the
    caller's process, where its own csv reading then took fields it had refused before."""
    data = tmp_path / "d.csv"
    pixels = np.random.default_rng(0).integers(0, 256, (40, 64))
    header = "label," + ",".join(f"pixel{i}" for i in range(64))
    data.write_text("\n".join([header, *(f"{i % 2}," + ",".join(map(str, p)) for i, p in enumerate(pixels))]) + "\n")
    before = _process_state()
    assert main([*TRAIN, "--data", str(data), "--out-dir", str(tmp_path), "--name", "csv"]) == 0
    assert _process_state() == before


def test_a_damaged_photo_is_named_once_in_each_of_two_trains_in_one_process(tmp_path, capsys):
    """The warning naming a damaged JPEG was said once per process: a second train from the same notebook on the
    same photos said nothing, and its run looked clean. Once per file in each call; not per batch or epoch."""
    from cnnpar.data.cpu_decode import simplejpeg_module
    from tests.datafiles import damaged_jpeg, write_image_folder

    if simplejpeg_module() is None:
        pytest.skip("simplejpeg is not installed: nothing tells the damage before torchvision decodes")
    data = write_image_folder(tmp_path / "photos", per_class=8, side=32)
    damaged = data / "class0" / "damaged.jpg"
    damaged.write_bytes(damaged_jpeg(side=32))
    # no workers: every decode in this process; three epochs, each reading the photo again
    flags = ["--data", str(data), "--epochs", "3", "--max-steps", "0", "--workers", "0", "--batch-size", "4"]
    for name in ("a", "b"):
        assert main([*TRAIN, *flags, "--image-size", "32", "--out-dir", str(tmp_path), "--name", name]) == 0
        said = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("warning:")]
        assert len(said) == 1 and said[0].startswith(f"warning: {damaged}: damaged JPEG data (libjpeg: "), (name, said)


def test_a_stop_inside_a_call_leaves_the_process_as_it_was_and_the_next_call_trains(tmp_path, monkeypatch):
    before = _process_state()
    fit = Trainer.fit

    def stopped_fit(self):
        os.kill(os.getpid(), signal.SIGINT)  # a Ctrl-C (a notebook's interrupt) as the run starts: cnnpar's handler
        return fit(self)

    monkeypatch.setattr(Trainer, "fit", stopped_fit)
    assert main([*TRAIN, "--out-dir", str(tmp_path), "--name", "stopped"]) == 130
    monkeypatch.setattr(Trainer, "fit", fit)
    assert _process_state() == before  # the caller's next Ctrl-C is Python's KeyboardInterrupt again
    assert errors.pending_stop() is None  # nor are the caller's own dropped errors kept quiet as a stop's
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
    assert errors.pending_stop() is None
    assert main([*TRAIN, "--out-dir", str(tmp_path), "--name", "after"]) == 0


def test_a_second_ctrl_c_while_a_stopped_call_gives_the_handlers_back_gives_them_all_back(tmp_path, monkeypatch):
    """Jupyter's interrupt pressed twice: the second one came while the stopped call put the caller's handlers back
    (seen in a kernel 20 ms after the first), and cnnpar's handler still in place raised there, leaving its SIGTERM
    and SIGHUP handlers and its unraisable hook in the kernel for good."""
    from cnnpar import process_state

    before = _process_state()
    fit, collect = Trainer.fit, process_state.gc.collect

    def stopped_fit(self):
        os.kill(os.getpid(), signal.SIGINT)  # the first Ctrl-C, as the run starts
        return fit(self)

    def collect_then_ctrl_c():
        collect()
        if errors.pending_stop() is not None:  # the stopped run's iterators finalised, then the second Ctrl-C
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(Trainer, "fit", stopped_fit)
    monkeypatch.setattr(process_state.gc, "collect", collect_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):  # the second Ctrl-C is the caller's, as one a moment later would be
        main([*TRAIN, "--out-dir", str(tmp_path), "--name", "twice"])
    monkeypatch.setattr(Trainer, "fit", fit)
    monkeypatch.setattr(process_state.gc, "collect", collect)
    assert _process_state() == before
    assert errors.pending_stop() is None
    assert main([*TRAIN, "--out-dir", str(tmp_path), "--name", "after"]) == 0


def test_a_train_in_a_thread_of_its_own_runs(tmp_path):
    """A notebook's background run: Python sets signal handlers only in the main thread (ValueError elsewhere)."""
    import threading

    ended = []
    thread = threading.Thread(target=lambda: ended.append(main([*TRAIN, "--out-dir", str(tmp_path), "--name", "t"])))
    thread.start()
    thread.join()
    assert ended == [0]
    assert (tmp_path / "t" / "summary.json").is_file()


def test_a_refused_flag_raises_its_system_exit_without_argparses_error_chained_to_it(capsys):
    """Its line already said why; the ArgumentError chained to the SystemExit added a second traceback above it
    wherever a caller shows the exception."""
    import traceback

    with pytest.raises(SystemExit) as e:
        main(["train", "--epochs", "x"])
    assert e.value.code == 2 and "argument --epochs: invalid int value: 'x'" in capsys.readouterr().err
    assert "During handling of the above exception" not in "".join(traceback.format_exception(e.value))


def test_a_refused_flag_in_an_ipython_cell_shows_the_system_exit_not_an_error_of_ipythons_own(tmp_path):
    """IPython 8.x (a notebook's kernel) could not show a SystemExit with a context: its own AttributeError traceback
    ("'tuple' object has no attribute 'tb_frame'") followed cnnpar's line, as if the kernel had broken."""
    import subprocess

    pytest.importorskip("IPython")
    cell = 'from cnnpar.cli import main\\nmain(["train", "--epochs", "x"])'
    code = (
        "from IPython.core.interactiveshell import InteractiveShell\n"
        f"InteractiveShell.instance().run_cell('{cell}')\n"
        "print('after the cell')\n"
    )
    env = {**os.environ, "IPYTHONDIR": str(tmp_path), "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    shown = done.stdout + done.stderr
    assert "argument --epochs: invalid int value: 'x'" in shown and "SystemExit" in shown, shown
    assert "AttributeError" not in shown and "after the cell" in shown, shown


def test_a_ctrl_c_while_the_first_call_imports_torch_returns_130_and_leaves_torch_whole(tmp_path):
    """A notebook's first call imports torch (seconds): its interrupt raised inside that import, which left torch
    half imported in the kernel, and every later call (and `import torch`) failed with a SystemError until a
    restart. A fresh process whose Ctrl-C comes half-way through torch's import, as a kernel's did."""
    import subprocess

    code = (
        "import os, signal, sys\n"
        "class CtrlC:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch.functional':\n"
        "            sys.meta_path.remove(self)\n"
        "            os.kill(os.getpid(), signal.SIGINT)\n"
        "sys.meta_path.insert(0, CtrlC())\n"
        "from cnnpar.cli import main\n"
        "assert 'torch' not in sys.modules\n"
        "print('rc', main(['models']))\n"
        "import torch\n"
        "print('torch', int(torch.ones(2).sum()), 'next rc', main(['models']) )\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "rc 130" in done.stdout and "cnnpar: interrupted" in done.stderr, done.stdout + done.stderr
    assert "torch 2 next rc 0" in done.stdout


def test_a_ctrl_c_during_an_import_inside_a_call_lets_the_module_finish_and_stops_the_call(tmp_path, monkeypatch):
    """cnnpar's handler raised a kernel's interrupt inside whatever module the run was importing for the first time
    (sympy, under torch): the module stayed half made, and every later call in the kernel failed on it."""
    (tmp_path / "imported_during_the_run.py").write_text(
        "import os, signal\nos.kill(os.getpid(), signal.SIGINT)\nafter_the_ctrl_c = True\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    fit = Trainer.fit

    def fit_importing(self):
        import imported_during_the_run  # noqa: F401

        return fit(self)

    monkeypatch.setattr(Trainer, "fit", fit_importing)
    try:
        assert main([*TRAIN, "--out-dir", str(tmp_path), "--name", "stopped"]) == 130
        assert sys.modules["imported_during_the_run"].after_the_ctrl_c
    finally:
        sys.modules.pop("imported_during_the_run", None)
    assert errors.pending_stop() is None


@pytest.fixture
def ctrl_c_on_import(tmp_path, monkeypatch):
    """A module whose first import gets a Ctrl-C half-way, as a command's first imports of a module can: cnnpar's
    handler notes that stop and lets the import finish (errors.stop_on_signals)."""
    (tmp_path / "ctrl_c_on_import.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGINT)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield lambda: __import__("ctrl_c_on_import")
    sys.modules.pop("ctrl_c_on_import", None)


def test_a_ctrl_c_noted_in_an_import_before_nproc_launches_starts_no_launcher(tmp_path, monkeypatch, ctrl_c_on_import):
    """`train --nproc N`: a Ctrl-C that came while the command imported its modules was only noted, and the
    launcher started and trained the whole run while this process waited on it, stopping only after it."""
    from cnnpar import cli

    launched = tmp_path / "launched"
    check_model = cli.check_model

    def check_model_importing(cfg):
        ctrl_c_on_import()
        check_model(cfg)

    monkeypatch.setattr(cli, "check_model", check_model_importing)
    monkeypatch.setattr(cli, "torchrun_command", lambda n, a: [sys.executable, "-c", f"open({str(launched)!r}, 'w')"])
    assert main([*TRAIN, "--nproc", "1", "--out-dir", str(tmp_path), "--name", "n"]) == 130
    assert not launched.exists()
    assert errors.pending_stop() is None


def test_a_ctrl_c_noted_in_an_import_stops_predict_before_it_writes(tmp_path, monkeypatch, capsys, ctrl_c_on_import):
    """predict's loop had no safe point: a Ctrl-C noted in an import as it started ran the prediction over every
    image, wrote its file, and only then ended as stopped."""
    from cnnpar.engine import predict

    assert main([*TRAIN, "--out-dir", str(tmp_path), "--name", "p"]) == 0
    precision = predict._precision

    def precision_importing(*a):
        ctrl_c_on_import()
        return precision(*a)

    monkeypatch.setattr(predict, "_precision", precision_importing)
    out = tmp_path / "preds.csv"
    argv = ["predict", "--checkpoint", str(tmp_path / "p"), "--data", "digits", "--device", "cpu", "--out", str(out)]
    assert main(argv) == 130
    assert not out.exists()
    assert "cnnpar: interrupted" in capsys.readouterr().err


def test_the_callers_current_gpu_is_put_back(monkeypatch):
    """A notebook working on cuda:1 called `predict --device cuda:0` (or train, whose rank takes cuda:0): the
    command made cuda:0 current (dist.start_cuda), and the notebook's later `.cuda()` tensors went there."""
    from cnnpar import process_state

    current = [1]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [])
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    # an int as it is: torch 2.5's torch.device(1) asks for an accelerator (RuntimeError without one)
    index = lambda device: device if isinstance(device, int) else torch.device(device).index  # noqa: E731
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: current.__setitem__(0, index(device)))
    with process_state.torch_settings_kept():
        torch.cuda.set_device("cuda:0")  # as the command's start does
        assert current == [0]
    assert current == [1]


def test_a_call_puts_back_a_matmul_precision_the_legacy_flag_cannot_say(tmp_path):
    """ "medium" reads back as `cuda.matmul.allow_tf32 = True`, which sets "high": the caller's "medium" came back
    "high" after a command that chose its own TF32 (every run on a GPU)."""
    from cnnpar.parallel.precision import Precision
    from cnnpar.process_state import torch_settings_kept

    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")
        with torch_settings_kept():
            Precision("bf16", torch.device("cuda"))  # sets TF32 for CUDA; no CUDA call is made
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision(before)


NEW_API = hasattr(torch.backends.cuda.matmul, "fp32_precision")


@pytest.mark.skipif(not NEW_API, reason="this torch has no fp32_precision API")
def test_a_caller_that_set_torchs_newer_fp32_precision_api_can_call_a_command(tmp_path):
    """PyTorch's documented way to ask for TF32 in newer releases (`torch.backends.cuda.matmul.fp32_precision`)
    leaves the legacy reads refused (RuntimeError "... mix of the legacy and new APIs ..."): `cli.main` read them
    first and ended in that error before doing anything. It runs, and the caller's settings come back."""
    names = ("", "cuda.matmul", "cudnn.conv", "cudnn.rnn", "mkldnn.matmul", "mkldnn.conv", "mkldnn.rnn")

    def module(name: str):
        found = torch.backends
        for part in filter(None, name.split(".")):
            found = getattr(found, part)
        return found

    def new_api() -> dict:
        return {name: module(name).fp32_precision for name in names}

    start = (new_api(), torch.get_float32_matmul_precision())
    try:
        module("cuda.matmul").fp32_precision = "tf32"
        module("mkldnn.matmul").fp32_precision = "ieee"
        with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
            torch.get_float32_matmul_precision()  # what the command met
        caller = new_api()
        assert main([*TRAIN, "--out-dir", str(tmp_path), "--name", "a"]) == 0
        assert new_api() == caller
    finally:
        torch.set_float32_matmul_precision(start[1])
        for name in names:
            module(name).fp32_precision = start[0][name]


@pytest.fixture
def an_hour_old_process(monkeypatch):
    """The process started an hour ago, as a notebook kernel that has been open that long."""
    import time

    import psutil

    started = time.time() - 3600
    monkeypatch.setattr(psutil.Process, "create_time", lambda self: started)


def test_tune_in_a_process_older_than_its_budget_gives_the_start_trial_the_budget(
    tmp_path, monkeypatch, an_hour_old_process
):
    """--budget-s counted from the process's start: in a kernel older than the budget, every `tune` was refused at
    once ("could not start: time budget spent (0 s left)"). Called from Python, it counts from the call."""
    import cnnpar.bench.tune as tune_mod
    from cnnpar.bench.trial import FAILED, ChildResult

    limits = []

    def failed(cfg, limit):  # the start fails at once: nothing is measured, and tuned.csv says so
        limits.append(limit)
        return ChildResult(FAILED, error="no device here", wall_s=0.1)

    monkeypatch.setattr(tune_mod, "child_trial", lambda steps, repeats, log: failed)
    out = tmp_path / "t" / "tuned.toml"
    assert main(["tune", "--device", "cpu", "--budget-s", "60", "--out", str(out)]) == 1
    assert len(limits) == 1 and limits[0] > 50  # the budget less its end reserve and this call's own start


def test_bench_claims_in_a_process_older_than_its_budget_count_it_from_the_call(
    tmp_path, monkeypatch, an_hour_old_process
):
    """`bench --claims --budget-s N` skipped every claim as past the budget in a kernel open longer than N."""
    import time

    import cnnpar.bench.run as run_mod

    seen = []
    monkeypatch.setattr(run_mod, "run_bench", lambda cfg, opts: seen.append(time.monotonic() - opts.started) or 0)
    assert main(["bench", "--claims", "--device", "cpu", "--budget-s", "60", "--out-dir", str(tmp_path)]) == 0
    assert len(seen) == 1 and 0 <= seen[0] < 60


@pytest.mark.skipif(not NEW_API, reason="this torch has no fp32_precision API")
@pytest.mark.parametrize("onednn", ["bf16", "tf32"])
def test_a_callers_cuda_tf32_flag_stays_readable_after_a_command_that_set_tf32(onednn):
    """A caller's oneDNN matmul precision set through the newer API (bf16 for a CPU's matmuls) leaves
    `get_float32_matmul_precision()` unreadable and `cuda.matmul.allow_tf32` readable (False): the command's "high"
    was not put back with the former, so the latter raised after the call ("... mix of the legacy and new APIs ...":
    torch.compile reads it)."""
    from cnnpar.parallel.precision import Precision
    from cnnpar.process_state import torch_settings_kept

    before = torch.get_float32_matmul_precision(), torch.backends.mkldnn.matmul.fp32_precision
    try:
        torch.backends.mkldnn.matmul.fp32_precision = onednn
        assert torch.backends.cuda.matmul.allow_tf32 is False
        with torch_settings_kept():
            Precision("tf32", torch.device("cuda"))  # no CUDA call is made
        assert torch.backends.cuda.matmul.allow_tf32 is False
        assert torch.backends.mkldnn.matmul.fp32_precision == onednn
    finally:
        torch.set_float32_matmul_precision(before[0])
        torch.backends.mkldnn.matmul.fp32_precision = before[1]
