"""benchmarks/*.py run with an input that is not there, or a malformed flag: one line naming it, exit 2, as the
`cnnpar` commands say a user error; each ended in a FileNotFoundError, DataError or ValueError traceback (exit 1),
or worse ran on without a word (exit 0: a results file of failed rows, of nothing, or of other data). Each is
refused before any work, and nothing is written."""

from __future__ import annotations

import runpy
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from cnnpar.errors import main_saying_user_errors

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def cudnn_switches() -> tuple[bool, int]:
    return torch.backends.cudnn.benchmark, torch.backends.cudnn.benchmark_limit


def _run_script(script: str, argv: list[str], monkeypatch, capsys) -> SimpleNamespace:
    """`python benchmarks/SCRIPT ARGV` run in this process (its whole file, `__main__` block and all, as a fresh
    interpreter runs it; each refusal comes before any work, so no process of its own is needed, and a subprocess
    paid ~2 s of imports per case): its exit status and what it printed. An exception that escaped the script is
    raised here, failing the test as its traceback on stderr did. What the script sets in the process on import
    (sys.path) or on the way to its refusal (torch's threads, cuDNN's benchmark switches, warning filters) is put
    back."""
    capsys.readouterr()
    threads, cudnn = torch.get_num_threads(), cudnn_switches()
    with monkeypatch.context() as m, warnings.catch_warnings():
        m.setattr(sys, "path", list(sys.path))
        m.setattr(sys, "argv", [str(BENCHMARKS / script), *argv])
        try:
            runpy.run_path(str(BENCHMARKS / script), run_name="__main__")
            code = 0  # it ran to its end without sys.exit
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        finally:
            torch.set_num_threads(threads)
            # step_vs_plain sets cudnn.benchmark before its flag checks: later tests in this worker (a GPU run's) had it
            torch.backends.cudnn.benchmark, torch.backends.cudnn.benchmark_limit = cudnn
    said = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=said.out, stderr=said.err)


@pytest.mark.parametrize(
    "script, flags, said",
    [
        (
            "prepare_cifar10.py",
            ["--src", "{missing}", "--out", "{out}"],
            "prepare_cifar10: error: --src {missing}: file not found",
        ),
        (
            "speedrun_cpu.py",
            ["--data", "{missing}", "--out", "{out}"],
            "speedrun_cpu: error: --data {missing}: file not found",
        ),
        ("trace_summary.py", ["{missing}"], "trace_summary: error: trace {missing}: file not found"),
        # it wrote an empty rows CSV and .md on every way out, this refusal too
        (
            "cifar10_record.py",
            ["--data", "{missing}", "--skip-airbench", "--device", "cpu", "--out", "{out}/r.csv"],
            "cifar10_record: error: {missing}: file not found",
        ),
        (
            "step_vs_plain.py",
            ["--device", "cpu", "--cases", "resnet18:32", "--out", "{out}/r.csv"],
            "step_vs_plain: error: --cases resnet18:32: 'resnet18:32': expected model:size:batch",
        ),
        (
            "one_step.py",
            ["--device", "cpu", "--data", "{missing}", "--out", "{out}/r.csv"],
            "one_step: error: {missing}: file not found",
        ),
        # each variant failed on the missing folder in turn: rows of "failed", exit 0
        (
            "jpeg_pipeline.py",
            ["--folder", "{missing}", "--device", "cpu", "--variants", "cpu:0:0", "--out", "{out}/r.csv"],
            "jpeg_pipeline: error: --folder {missing}: no such folder",
        ),
        # --calls -5 timed nothing and printed a cost per call; --repeats 0 had no median (a traceback)
        (
            "data_wait_cost.py",
            ["--device", "cpu", "--calls", "-5", "--out", "{out}/r.csv"],
            "data_wait_cost: error: --calls -5: expected a whole number of 1 or more",
        ),
        (
            "data_wait_cost.py",
            ["--device", "cpu", "--repeats", "0", "--out", "{out}/r.csv"],
            "data_wait_cost: error: --repeats 0: expected a whole number of 1 or more",
        ),
        # a --data that was not there was swapped for the shared mnist.npz, which then trained under its name
        (
            "frameworks_mnist.py",
            ["--data", "{missing}", "--frameworks", "torch", "--out", "{out}"],
            "frameworks_mnist: error: --data {missing}: no such file",
        ),
        # below: one line already, but exit 1 (SystemExit), not a user error's 2
        (
            "png_decode.py",
            ["--pngs", "{missing}", "--out", "{out}/r.csv"],
            "png_decode: error: --pngs {missing}: no .png",
        ),
        (
            "jpeg_decode.py",
            ["--folder", "{missing}", "--device", "cpu", "--stages", "cpu", "--out", "{out}/r.csv"],
            "jpeg_decode: error: {missing}: no .jpg/.jpeg/.png files found",
        ),
        (
            "jpeg_decode.py",
            ["--folder", "{tmp}", "--stages", "gpu,disk", "--out", "{out}/r.csv"],
            "jpeg_decode: error: --stages gpu,disk: expected a comma list of gpu, engines",
        ),
        (
            "summarize_h200.py",
            ["--shared", "{missing}"],
            "summarize_h200: error: {missing}/jpeg_folder_end_to_end.csv is missing: ",
        ),
        # its first child failed on the missing --data, and it said "batch-64: exit 2", exit 1
        (
            "batch_auto.py",
            ["--data", "{missing}", "--out", "{out}/r.csv"],
            "batch_auto: error: --data {missing}: no such file or folder",
        ),
        (
            "batch_auto.py",
            ["--data", "digits", "--cases", "64,big", "--out", "{out}/r.csv"],
            "batch_auto: error: --cases 64,big: 'big': expected a batch size of 1 or more, or auto",
        ),
        (
            "step_vs_plain.py",
            ["--device", "cpu", "--plain", "fp32,fp8", "--out", "{out}/r.csv"],
            "step_vs_plain: error: --plain: ['fp8'] are not among",
        ),
        (
            "step_vs_plain.py",
            ["--device", "cpu", "--cudnn-benchmark-limit", "-1", "--out", "{out}/r.csv"],
            "step_vs_plain: error: --cudnn-benchmark-limit: -1, expected 0 or more",
        ),
        (
            "step_vs_plain.py",
            ["--device", "cpu", "--variants", "compile", "--out", "{out}/r.csv"],
            "step_vs_plain: error: --variants: 'compile' in 'compile' is not key=value",
        ),
        (
            "jpeg_pipeline.py",
            ["--folder", "{tmp}", "--device", "cpu", "--variants", "cpu:0", "--out", "{out}/r.csv"],
            "jpeg_pipeline: error: --variants cpu:0: expected decode:workers:cpu_share",
        ),
        # below: each a traceback, or a bad input taken without a word (speed_records' parts caught every failure)
        (
            "png_decode.py",
            ["--pngs", "{pngs}", "--rounds", "0", "--out", "{out}/r.csv"],
            "png_decode: error: --rounds 0: expected a whole number of 1 or more",
        ),
        (
            "png_decode.py",
            ["--from-jpegs", "{missing}", "--pngs", "{out}/pngs", "--out", "{out}/r.csv"],
            "png_decode: error: --from-jpegs {missing}: no such folder",
        ),
        (
            "jpeg_decode.py",
            ["--make-photos", "{out}/photos", "--photo-size", "big", "--device", "cpu", "--out", "{out}/r.csv"],
            "jpeg_decode: error: --photo-size big: expected WIDTHxHEIGHT",
        ),
        (
            "csv_load.py",
            ["--rows", "100", "--repeats", "0", "--out", "{out}/csv_load"],
            "csv_load: error: --repeats 0: expected a whole number of 1 or more",
        ),
        (
            "csv_load.py",
            ["--rows", "0", "--repeats", "1", "--out", "{out}/csv_load"],
            "csv_load: error: --rows 0: expected a whole number of 1 or more",
        ),
        # its rows go to the stored results (it has no --out): each refused before any epoch
        (
            "cpu_vs_textbook.py",
            ["--samples", "64", "--rounds", "0"],
            "cpu_vs_textbook: error: --rounds 0: expected a whole number of 1 or more",
        ),
        (
            "cpu_vs_textbook.py",
            ["--samples", "64", "--variant", "fp32"],
            "cpu_vs_textbook: error: --variant fp32: expected PRECISION:CHANNELS_LAST",
        ),
        (
            "cpu_vs_textbook.py",
            ["--samples", "64", "--variant", "fp99:off"],
            "cpu_vs_textbook: error: --variant fp99:off: speed.precision (--precision) = 'fp99': expected one of",
        ),
        (
            "speed_records.py",
            ["--parts", "jpeg", "--folder", "{missing}", "--out", "{out}/r.csv"],
            "speed_records: error: --folder {missing}: no such file or folder",
        ),
        (
            "speed_records.py",
            ["--parts", "jpeg", "--folder", "{tmp}", "--store", "{missing}", "--out", "{out}/r.csv"],
            "speed_records: error: --store {missing}: no such file or folder",
        ),
        (
            "speed_records.py",
            ["--parts", "cifar,imagenet", "--cifar", "{missing}", "--out", "{out}/r.csv"],
            "speed_records: error: --parts cifar,imagenet: 'imagenet' is not one of jpeg, cifar, speedrun",
        ),
        (
            "speed_records.py",
            ["--parts", "cifar", "--cifar", "{missing}", "--out", "{out}/r.csv"],
            "speed_records: error: --cifar {missing}: no such file or folder",
        ),
    ],
)
def test_a_bad_input_is_one_line_and_exit_2(script, flags, said, tmp_path, monkeypatch, capsys):
    missing, out, pngs = tmp_path / "absent.npz", tmp_path / "out", tmp_path / "pngs"
    if "{pngs}" in flags:  # a folder holding one PNG, for a check that comes after the files are found
        from PIL import Image

        pngs.mkdir()
        Image.new("RGB", (8, 8)).save(pngs / "a.png")
    argv = [f.format(missing=missing, out=out, tmp=tmp_path, pngs=pngs) for f in flags]
    before = cudnn_switches()
    done = _run_script(script, argv, monkeypatch, capsys)
    assert cudnn_switches() == before  # the process's settings as the script found them
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(said.format(missing=missing)), done.stderr
    assert not out.exists()  # refused before the output folder (or any results file in it) was made


def test_ladder_time_model_takes_no_flags_and_needs_its_stored_files(tmp_path, monkeypatch, capsys):
    """A flag given (it has none) was ignored without a word; a checkout without the stored run's files ended in a
    FileNotFoundError traceback."""
    sys.path.insert(0, str(BENCHMARKS))
    import ladder_time_model

    with pytest.raises(SystemExit) as e:
        ladder_time_model.main(["--out", str(tmp_path / "x")])
    assert e.value.code == 2 and "unrecognized arguments: --out" in capsys.readouterr().err
    monkeypatch.setattr(ladder_time_model, "CALL", tmp_path)
    assert main_saying_user_errors(lambda: ladder_time_model.main([]), "ladder_time_model") == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert said == [
        f"ladder_time_model: error: {tmp_path}/ladder_resnet50_synthetic/ladder.csv: file not found"
        " (the 2026-12-01 run's stored results, read from the checkout)"
    ]
