"""A device that runs out of memory in `cnnpar train`'s training step or evaluation, or in `cnnpar predict`, ends in
one line, exit status 2: the phase, the batch per process and the image shape, the device and its memory, torch's
allocation in one clause and the flags that make it fit; a run that saved epochs keeps them and says the command that
continues with half the batch. torch's error came as a traceback of a dozen lines that named none of cnnpar's flags.
On the CPU the error is raised by a patched step (torch.cuda.OutOfMemoryError is made on any build); the `gpu` test
runs out of the device's real memory through the same path."""

from __future__ import annotations

import json
import re

import pytest
import torch

from cnnpar.cli import main
from cnnpar.engine import predict, trainer
from cnnpar.engine.checkpoint import checkpoint_epoch
from cnnpar.engine.memory_full import TRAINING_WAYS, memory_full_line, out_of_memory
from cnnpar.report.files import read_csv
from tests.datafiles import write_npz

pytestmark = pytest.mark.usefixtures("one_thread")

# torch's own message, as c10's caching allocator words it (torch 2.14)
TORCH_OOM = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is "
    "free. Including non-PyTorch memory, this process has 78.11 GiB memory in use. Of the allocated memory 75.50 GiB "
    "is allocated by PyTorch, and {spare} is reserved by PyTorch but unallocated. If reserved but unallocated memory "
    "is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
    "documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html)"
)
OOM = TORCH_OOM.format(spare="1.20 GiB")

SMALL = ["train", "--device", "cpu", "--max-steps", "2", "--no-progress", "--no-tensorboard", "--workers", "0"]
SMALL += ["--data", "synthetic", "--synthetic-samples", "64", "--image-shape", "1x8x8", "--batch-size", "16"]


def error_line(err: str) -> str:
    assert "Traceback" not in err and "OutOfMemoryError" not in err
    (line,) = err.splitlines()
    return line


def out_of_memory_in_epoch(monkeypatch, epoch: int) -> None:
    """The training step of `epoch` runs out of memory (its first micro-batch, inside the step loop)."""
    real = trainer.maybe_inject_fault

    def fault(e, done, micro_steps, info):
        if e == epoch:
            raise torch.cuda.OutOfMemoryError(OOM)
        return real(e, done, micro_steps, info)

    monkeypatch.setattr(trainer, "maybe_inject_fault", fault)


def test_a_training_step_out_of_memory_says_one_line_keeps_the_epochs_and_continues_with_half_the_batch(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    with monkeypatch.context() as full:
        out_of_memory_in_epoch(full, 2)
        assert main([*SMALL, "--epochs", "3", "--name", "o"]) == 2
    line = error_line(capsys.readouterr().err)
    assert line == (
        "cnnpar: error: the training step ran out of memory: batch 16/process of 1x8x8 images on GPU 0 (79.19 GiB "
        "in all); torch tried to allocate 2.00 GiB; expected settings that fit: a smaller --batch-size, "
        "--batch-size auto (measures what fits), --grad-accum N with a batch N times smaller (the same batch per "
        "step), or a smaller --image-size; the checkpoint in runs/o holds epoch 1; continue with: "
        "cnnpar train --resume runs/o --batch-size 8 --grad-accum 2"
    )
    run = tmp_path / "runs" / "o"
    assert checkpoint_epoch(run) == 1
    # the command the line gives, pasted, runs the epochs left
    assert main([*SMALL[:-2], "--resume", "runs/o", "--batch-size", "8", "--grad-accum", "2"]) == 0
    assert [r["epoch"] for r in read_csv(run / "metrics.csv")] == ["1", "2", "3"]


def test_an_odd_batch_that_runs_out_of_memory_continues_with_its_half_rounded_up(tmp_path, monkeypatch, capsys):
    """Batch 15 has no half: the line's command was a plain `--resume`, which ran out of memory again. It continues
    with 8 and twice the accumulation (16 per step, one more, which the resume names)."""
    monkeypatch.chdir(tmp_path)
    odd = [*SMALL[:-1], "15"]
    with monkeypatch.context() as full:
        out_of_memory_in_epoch(full, 2)
        assert main([*odd, "--epochs", "2", "--name", "odd"]) == 2
    line = error_line(capsys.readouterr().err)
    assert line.endswith(
        "the checkpoint in runs/odd holds epoch 1; continue with: cnnpar train --resume runs/odd --batch-size 8 "
        "--grad-accum 2"
    ), line
    assert main([*SMALL[:-2], "--resume", "runs/odd", "--batch-size", "8", "--grad-accum", "2"]) == 0
    assert "global batch 15 -> 16 per step" in capsys.readouterr().out
    assert [r["epoch"] for r in read_csv(tmp_path / "runs" / "odd" / "metrics.csv")] == ["1", "2"]


def test_an_evaluation_out_of_memory_before_any_epoch_is_saved_says_its_batch_and_leaves_no_folder(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)

    def eval_batch(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError(OOM)

    monkeypatch.setattr(trainer, "eval_batch", eval_batch)
    assert main([*SMALL, "--epochs", "2", "--name", "e"]) == 2
    line = error_line(capsys.readouterr().err)
    assert line.startswith("cnnpar: error: the evaluation ran out of memory: batch 16/process of 1x8x8 images on ")
    assert line.endswith(
        "; torch tried to allocate 2.00 GiB; expected settings that fit: a smaller --batch-size (the evaluation's "
        "batch is the training's), or a smaller --image-size"
    )
    assert not (tmp_path / "runs").exists()  # nothing saved: the folder this run made is gone, as for bad input


def test_a_prediction_out_of_memory_says_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    data = write_npz(tmp_path / "d.npz", n_train=64, n_test=16)
    args = ["--device", "cpu", "--no-progress", "--no-tensorboard", "--workers", "0", "--max-steps", "2"]
    assert main(["train", "--data", str(data), "--epochs", "1", "--name", "p", *args]) == 0
    capsys.readouterr()

    def tta_logits(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError(OOM)

    monkeypatch.setattr(predict, "tta_logits", tta_logits)
    out = tmp_path / "preds.csv"
    code = main(["predict", "--checkpoint", "runs/p", "--data", str(data), "--device", "cpu", "--out", str(out)])
    assert code == 2
    line = error_line(capsys.readouterr().err)
    assert line.startswith("cnnpar: error: the prediction ran out of memory: batch 256/process of 1x16x16 images on ")
    assert line.endswith("torch tried to allocate 2.00 GiB; expected settings that fit: a smaller --batch-size")
    assert not out.exists()


def raise_out_of_memory(*args, **kwargs):
    raise torch.cuda.OutOfMemoryError(OOM)


TOOL_ARGS = ["--data", "synthetic", "--image-shape", "1x8x8", "--synthetic-samples", "30", "--workers", "0",
             "--device", "cpu", "--batch-size", "16"]  # fmt: skip


@pytest.mark.parametrize("tool", ["doctor", "profile"])
def test_the_doctor_and_the_profiler_out_of_memory_say_one_line_and_leave_no_report_folder(
    tmp_path, monkeypatch, capsys, tool
):
    from cnnpar.doctor import measure, profile

    monkeypatch.setattr(measure if tool == "doctor" else profile, "run_step", raise_out_of_memory)
    assert main([tool, *TOOL_ARGS, "--no-progress", "--out-dir", str(tmp_path / "out")]) == 2
    line = error_line(capsys.readouterr().err)
    assert line.startswith("cnnpar: error: the training step ran out of memory: batch 16/process of 1x8x8 images on ")
    assert (
        "torch tried to allocate 2.00 GiB; expected settings that fit: a smaller --batch-size, --batch-size auto"
        in line
    )
    assert not (tmp_path / "out").exists()  # the report folder it made, with nothing whole in it, is gone


def test_a_doctor_try_out_of_memory_is_that_tries_result_and_the_baselines_report_is_written(
    tmp_path, monkeypatch, capsys
):
    from cnnpar.doctor import run as doctor_run

    monkeypatch.setattr(doctor_run, "fixed_cost", lambda full, half: 0.9 * full.s_per_batch)  # a batch to try
    real = doctor_run.measure_end_to_end

    def end_to_end(trainer, *args, name: str = "end to end", **kwargs):
        if name.startswith("tried:"):
            raise torch.cuda.OutOfMemoryError(OOM)
        return real(trainer, *args, name=name, **kwargs)

    monkeypatch.setattr(doctor_run, "measure_end_to_end", end_to_end)
    rep = tmp_path / "rep"
    args = ["--warmup-steps", "1", "--measure-steps", "3", "--try", "1", "--report-dir", str(rep)]
    assert main(["doctor", *TOOL_ARGS, "--model", "cnn3", *args]) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "OutOfMemoryError" not in out + err
    result = json.loads((rep / "doctor.json").read_text())
    assert [p["name"] for p in result["phases"]][-1] == "end to end"  # the baseline's measurements are kept
    (failed,) = result["did_not_fit"]
    batch = failed["change"]["run"]["batch_size"]
    assert failed["label"] == "larger batch" and batch > 16
    said = (
        f"the try of larger batch ran out of memory: batch {batch}/process of 1x8x8 images on GPU 0 (79.19 GiB in "
        "all); torch tried to allocate 2.00 GiB; expected settings that fit: the measured baseline's (this change is "
        "not advised)"
    )
    assert failed["error"] == said
    assert f"- {said}" in out  # the console's report says it, under its heading
    assert result["tries"] == [] and result["stopped"] == ""
    # the batch that did not fit is not advised, in the JSON, the CSV or the report
    assert "batch" not in [r["key"] for r in result["recommendations"] + result["tried_not_faster"]]
    assert "batch" not in [r["key"] for r in read_csv(rep / "recommendations.csv")]
    assert f"- {said}" in (rep / "report.md").read_text()


@pytest.mark.parametrize(("spare", "hint"), [("1.20 GiB", False), ("3.50 GiB", True)])
def test_torchs_fragmentation_hint_is_kept_only_where_the_unallocated_memory_would_hold_the_allocation(spare, hint):
    line = memory_full_line(
        torch.cuda.OutOfMemoryError(TORCH_OOM.format(spare=spare)), "the training step", 64, (3, 32, 32), None, "x"
    )
    assert ("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in line) is hint
    assert "tried to allocate 2.00 GiB" in line and "GPU 0 (79.19 GiB in all)" in line


# a GPU another job holds most of: torch's per-process lines (NVML) name it, and this process has little in use
SHARED_OOM = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is "
    "free. Process 4242 has 60.00 GiB memory in use. Process 777 has 18.11 GiB memory in use. Including non-PyTorch "
    "memory, this process has 18.11 GiB memory in use. Of the allocated memory 15.50 GiB is allocated by PyTorch, "
    "and 1.20 GiB is reserved by PyTorch but unallocated."
)


def test_memory_other_processes_hold_is_said_where_torchs_message_shows_it(tmp_path, monkeypatch, capsys):
    """The line's ways out shrink this run; where another job holds the GPU (torch's message said so, naming each
    process), the line says how much it holds: it had only "a smaller --batch-size"."""
    monkeypatch.chdir(tmp_path)

    def fault(e, done, micro_steps, info):
        raise torch.cuda.OutOfMemoryError(SHARED_OOM)

    monkeypatch.setattr(trainer, "maybe_inject_fault", fault)
    assert main([*SMALL, "--epochs", "1", "--name", "s"]) == 2
    line = error_line(capsys.readouterr().err)
    assert (
        "; torch tried to allocate 2.00 GiB; other processes held 60.02 GiB of the device (nvidia-smi names them); "
        in line
    )
    assert line.endswith(TRAINING_WAYS), line
    # this process's own use (OOM: 78.11 of 79.19 GiB, 1.06 free) names no other process
    assert "other processes" not in memory_full_line(torch.cuda.OutOfMemoryError(OOM), "x", 1, (1,), None, "y")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_real_cuda_out_of_memory_in_train_says_one_line(tmp_path, monkeypatch, capsys):
    """The step loop asks the device for far more than it holds (2**40 floats, 4 TiB): torch's real error, its
    message as this torch words it, through `cnnpar train`'s path."""
    monkeypatch.chdir(tmp_path)

    def fault(e, done, micro_steps, info):
        torch.empty(2**40, device=info.device)

    monkeypatch.setattr(trainer, "maybe_inject_fault", fault)
    args = [a for a in SMALL if a not in ("--device", "cpu")]
    assert main([*args, "--device", "cuda", "--compile", "off", "--epochs", "1", "--name", "g"]) == 2
    line = error_line(capsys.readouterr().err)
    assert line.startswith("cnnpar: error: the training step ran out of memory: batch 16/process of 1x8x8 images on ")
    assert f"cuda:0 ({torch.cuda.get_device_name(0)}, " in line
    # c10's format_size says GiB past 1 GiB: 4096.00 GiB (a later torch may word it otherwise)
    assert re.search(r" GiB in all\); torch tried to allocate [\d.]+ [KMGT]iB; expected settings that fit: ", line)
    assert not (tmp_path / "runs").exists()


# device memory that ran out outside the caching allocator: torch raises a plain RuntimeError, worded as this torch
# (2.14, cuDNN 9) and its libraries word them
ALLOCATION_FAILED = {
    "cuda": "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other API call, "
    "so the stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1",
    "cublas": "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "cudnn 8": "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
    "cudnn 9": "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",
    "mps": "MPS backend out of memory (MPS allocated: 17.00 GiB, other allocations: 1.20 GiB, max allowed: 18.13 GiB). "
    "Tried to allocate 256.00 MiB on private pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper limit "
    "for memory allocations (may cause system failure).",
}


@pytest.mark.parametrize("library", sorted(ALLOCATION_FAILED))
def test_a_device_allocation_that_fails_outside_torchs_allocator_says_the_same_one_line(
    tmp_path, monkeypatch, capsys, library
):
    monkeypatch.chdir(tmp_path)
    real = trainer.maybe_inject_fault

    def fault(e, done, micro_steps, info):
        if e == 1:
            raise RuntimeError(ALLOCATION_FAILED[library])
        return real(e, done, micro_steps, info)

    monkeypatch.setattr(trainer, "maybe_inject_fault", fault)
    assert main([*SMALL, "--epochs", "1", "--name", "a"]) == 2
    line = error_line(capsys.readouterr().err)
    assert line.startswith("cnnpar: error: the training step ran out of memory: batch 16/process of 1x8x8 images on ")
    assert line.endswith("expected settings that fit: " + TRAINING_WAYS)
    assert ("torch tried to allocate 256.00 MiB" in line) is (library == "mps")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "text",
    [
        "CUDA error: device-side assert triggered",  # a bug, not memory: torch's own error stays
        "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",  # the host's memory, not the device's
        "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, opa, opb, m, n, k)`",
    ],
)
def test_other_device_errors_are_not_called_out_of_memory(text):
    assert out_of_memory(RuntimeError(text)) is None
    assert out_of_memory(ValueError(ALLOCATION_FAILED["cuda"])) is None  # only torch's RuntimeErrors


# CUDA's reason where the context of a new process does not fit on a GPU whose memory another process holds: raised by
# torch.cuda.set_device, before any of cnnpar's phases (an H100 in session 49)
CONTEXT_OOM = (
    "CUDA error: out of memory\nSearch for `cudaErrorMemoryAllocation' in https://docs.nvidia.com/cuda/"
    "cuda-runtime-api/group__CUDART__TYPES.html for more information.\nCUDA kernel errors might be asynchronously "
    "reported at some other API call, so the stacktrace below might be incorrect."
)


@pytest.mark.parametrize(
    ("reason", "held"),
    [
        (CONTEXT_OOM, "other processes hold its memory"),
        ("CUDA error: CUDA-capable device(s) is/are busy or unavailable", "nvidia-smi shows what holds it"),
    ],
)
@pytest.mark.parametrize("command", ["train", "predict"])
def test_a_gpu_whose_context_cannot_start_says_one_line(tmp_path, monkeypatch, capsys, command, reason, held):
    monkeypatch.chdir(tmp_path)
    data = write_npz(tmp_path / "d.npz", n_train=64, n_test=16)
    args = ["--no-progress", "--no-tensorboard", "--workers", "0", "--max-steps", "2", "--data", str(data)]
    if command == "predict":  # a run to predict with, trained on the CPU before the GPU is faked
        assert main(["train", "--device", "cpu", "--epochs", "1", "--name", "p", *args]) == 0
        capsys.readouterr()

    def set_device(device):
        raise RuntimeError(reason)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)  # predict's bare "cuda" is the current device
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    out = tmp_path / "preds.csv"
    if command == "train":
        argv = ["train", "--device", "cuda", "--epochs", "1", "--name", "t", *args]
    else:
        argv = ["predict", "--checkpoint", "runs/p", "--data", str(data), "--device", "cuda", "--out", str(out)]
    assert main(argv) == 2
    line = error_line(capsys.readouterr().err)
    assert line.startswith(f"cnnpar: error: cuda:0 could not be started: {reason.splitlines()[0]}; {held}")
    assert line.endswith("expected a GPU this process can use, another one (CUDA_VISIBLE_DEVICES), or --device cpu")
    assert not (tmp_path / "runs" / "t").exists() and not out.exists()


def test_predict_on_a_bare_cuda_starts_the_current_device_and_names_it(tmp_path, monkeypatch, capsys):
    """`predict --device cuda` (no index): torch's own set_device, faked only below it, refuses a device without an
    index (ValueError, a traceback); the current device is the one its tensors go to, cuda:1 where a notebook made
    it current before the call."""
    monkeypatch.chdir(tmp_path)
    data = write_npz(tmp_path / "d.npz", n_train=64, n_test=16)
    args = ["--no-progress", "--no-tensorboard", "--workers", "0", "--max-steps", "2", "--data", str(data)]
    assert main(["train", "--device", "cpu", "--epochs", "1", "--name", "p", *args]) == 0
    capsys.readouterr()
    started = []

    def cuda_set_device(index):  # below torch.cuda.set_device: what CUDA is asked to make current
        started.append(index)
        raise RuntimeError(CONTEXT_OOM)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch._C, "_cuda_setDevice", cuda_set_device)
    out = tmp_path / "preds.csv"
    argv = ["predict", "--checkpoint", "runs/p", "--data", str(data), "--device", "cuda", "--out", str(out)]
    assert main(argv) == 2
    assert started == [1]
    assert error_line(capsys.readouterr().err).startswith("cnnpar: error: cuda:1 could not be started: CUDA error")
    assert not out.exists()
