"""`cnnpar doctor` on the CPU: a slow image folder is data-bound, a heavy model on in-memory data is
compute-bound, and the report files are written."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from cnnpar.cli import main
from cnnpar.config import Config
from cnnpar.host_facts import usable_cores
from cnnpar.presets import with_overrides
from tests.datafiles import write_first_batch_failures

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def slow_folder(tmp_path_factory):
    """24 1024x1024 noise PNGs (noise barely compresses: ~3 MB each, slow to decode) in 2 classes.

    Four are encoded and the rest copied: decoding cost is per file, encoding them all would only
    slow the test down.
    """
    from torchvision.io import write_png

    from cnnpar.data.tv_codecs import tv_codecs

    root = tmp_path_factory.mktemp("noise")
    g = torch.Generator().manual_seed(0)
    sources = []
    for i in range(4):
        path = root / f"src{i}.png"
        with tv_codecs():  # torchvision 0.29's codec notice, known: docs/decoding.md
            write_png(torch.randint(0, 256, (3, 1024, 1024), dtype=torch.uint8, generator=g), str(path), 1)
        sources.append(path)
    for cls in ("a", "b"):
        (root / "data" / cls).mkdir(parents=True)
        for i in range(12):
            shutil.copy(sources[i % 4], root / "data" / cls / f"{i}.png")
    return root / "data"


# its first try is the workers advice, which one usable core does not get (test_advise covers that rule)
@pytest.mark.skipif(usable_cores() < 2, reason="one usable core: the doctor advises no loader workers")
def test_slow_png_folder_is_data_bound(tmp_path, monkeypatch, capsys, slow_folder):
    monkeypatch.chdir(tmp_path)  # by `main` in this process, from tmp_path as a shell there
    # four batches a phase on a shared 2-core host: a stall in the end-to-end phase makes the doctor call its own
    # measurements disagreeing (seen once in CI beside another test file), so that reading is measured again
    for attempt in range(3):
        capsys.readouterr()
        rc = main([
            "doctor", "--data", str(slow_folder), "--image-size", "32", "--workers", "0", "--batch-size", "4",
            "--val-fraction", "0", "--model", "cnn3", "--device", "cpu",
            "--warmup-steps", "1", "--measure-steps", "4", "--try", "1", "--report-dir", f"rep{attempt}",
        ])  # fmt: skip
        stdout, stderr = capsys.readouterr()
        assert rc == 0, stderr
        out = tmp_path / f"rep{attempt}"
        result = json.loads((out / "doctor.json").read_text())
        if result["verdict"] != "measurements disagree":
            break
    assert result["verdict"] == "data-bound", result["reasons"]
    assert "verdict: data-bound" in stdout
    pipe, step = result["phases"][0], result["phases"][1]
    assert pipe["name"] == "input pipeline alone" and step["name"] == "train step alone"
    assert pipe["ms_per_batch"] > 2 * step["ms_per_batch"]
    # workers, the first change that can be tried, was tried: measured faster it ranks by its measured gain;
    # not faster, it is no longer advised. Pre-decode (estimated, never tried) heads the list either way.
    recos, not_faster = result["recommendations"], result["tried_not_faster"]
    keys = [r["key"] for r in recos]
    assert keys[0] == "pre-decode"
    assert ("workers" in keys) != ("workers" in [r["key"] for r in not_faster])
    assert all(r["tried_gain"] < 1.03 for r in not_faster) and all((r["tried_gain"] or 9) >= 1.03 for r in recos)
    store = f"{slow_folder}.cnnpar"  # the advice is a command to paste: prepare the folder, train from the store
    (pre,) = [r for r in recos if r["key"] == "pre-decode"]
    assert pre["action"] == pre["command"]  # the table shows the line to paste, the user's flags in it
    assert pre["command"].startswith(
        f"cnnpar prepare {slow_folder} --out {store} --short-side 40 && cnnpar train --data {store} "
    )
    user = ["--data", str(slow_folder), "--image-size", "32", "--workers", "0", "--batch-size", "4"]
    user += ["--val-fraction", "0", "--model", "cnn3", "--device", "cpu"]
    assert_commands_run_the_change(recos + not_faster, user, slow_folder)
    tried = [r for r in recos + not_faster if r["tried_gain"] is not None]
    assert [r["key"] for r in tried] == ["workers"] and tried[0]["tried_images_per_s"] > 0
    assert result["tries"][0]["change"] == tried[0]["change"] and tried[0]["change"]["data"]["workers"] >= 1
    for name in ("report.md", "doctor.png", "phases.csv", "recommendations.csv"):
        assert (out / name).stat().st_size > 0
    assert "# cnnpar doctor: data-bound" in (out / "report.md").read_text()
    assert not (tmp_path / "runs").exists()  # the doctor makes no run folder


def assert_commands_run_the_change(recommendations: list[dict], user_args: list[str], folder) -> None:
    """Each recommendation's command is the user's own train command with its change applied: parsed
    back by cnnpar's CLI it gives exactly the user's config plus the change."""
    import shlex

    from cnnpar.cli import build_parser
    from cnnpar.cliargs import config_from_args

    def parsed(words: list[str]):
        assert words[:2] == ["cnnpar", "train"], words
        return config_from_args(build_parser().parse_args(words[1:]))

    user = parsed(["cnnpar", "train", *user_args])
    for r in recommendations:
        if r["key"] == "pre-decode":
            prepare, train = r["command"].split(" && ")
            assert shlex.split(prepare)[:3] == ["cnnpar", "prepare", str(folder)]
            assert parsed(shlex.split(train)) == with_overrides(user, data={"source": f"{folder}.cnnpar"})
        else:
            assert r["change"], r
            assert parsed(shlex.split(r["command"])) == with_overrides(user, **r["change"]), r["command"]


def test_heavy_model_on_memory_is_compute_bound(tmp_path):
    from cnnpar.doctor.run import DoctorOptions, run_doctor

    cfg = with_overrides(
        Config(),
        data={"source": "synthetic", "image_shape": "3x128x128", "synthetic_samples": 32, "workers": 0},
        model={"name": "cnn3"},
        speed={"device": "cpu"},
        run={"batch_size": 16},
    )
    # cnn3 at 128 px and batch 16 spends ~15-20% of its CPU step on per-step costs (measured here);
    # ResNet-18 at batch 8 spent 30-45%, too near the 50% host-bound line for a loaded CI machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a shared 2-core host, OpenMP threads waiting on each other blur the split
    try:
        # two timings (batch 8 and 16) on a shared 2-core host: one stall between them reads as per-step overhead
        # (1 run in 4 here, before this session's changes too), so a host-bound reading is measured again (twice:
        # one more failed once beside a second test suite on the same 2 cores)
        for attempt in range(3):
            options = DoctorOptions(warmup=1, steps=8, report_dir=str(tmp_path / f"rep{attempt}"))
            report = run_doctor(cfg, options, log=print)
            if report.diagnosis.verdict == "compute-bound":
                break
    finally:
        torch.set_num_threads(threads)
    assert report.diagnosis.verdict == "compute-bound", report.diagnosis.reasons
    f = report.facts
    assert f.in_memory and f.data_s < 0.2 * f.step_s
    assert f.fixed_share is not None and f.fixed_share < 0.5
    assert [p.name for p in report.phases] == [
        "input pipeline alone", "train step alone", "train step, half batch", "end to end",
    ]  # fmt: skip
    assert all(p.batches >= 1 and p.seconds > 0 for p in report.phases)
    assert not any(r.key in ("workers", "pre-decode", "resident") for r in report.recommendations)


@pytest.mark.parametrize("case", ["one_image", "corrupt_images"])
def test_a_doctor_that_fails_at_the_first_batch_leaves_no_report_folder(tmp_path, capsys, case):
    """The report folder (here with telemetry in it) was made before measuring and stayed, empty."""
    data, error = write_first_batch_failures(tmp_path / "in")[case]
    out = tmp_path / "out"
    args = ["--data", str(data), "--device", "cpu", "--workers", "0", "--out-dir", str(out), "--monitor"]
    assert main(["doctor", *args, "--warmup-steps", "1", "--measure-steps", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"cnnpar: error: {error}"), err
    assert not out.exists()


def test_a_tried_larger_batch_is_the_one_the_trainer_runs_and_the_advice_says_it(tmp_path, monkeypatch):
    """The audit's photos (90 training images, batch 64, `--try 1`): the doctor advised and tried `--batch-size
    128`, its Trainer capped that to the 90 and ran 90 (450 images in 5 batches), and the advice still said 128.
    Here 24 training images at batch 16; the step's fixed share is set high so the batch advice is made."""
    from cnnpar.doctor import run as doctor_run
    from cnnpar.doctor.run import DoctorOptions, run_doctor

    monkeypatch.setattr(doctor_run, "fixed_cost", lambda full, half: 0.9 * full.s_per_batch)
    cfg = with_overrides(
        Config(),
        data={"source": "synthetic", "image_shape": "1x8x8", "synthetic_samples": 30, "workers": 0},
        model={"name": "cnn3"},
        speed={"device": "cpu"},
        run={"batch_size": 16},
    )
    options = DoctorOptions(warmup=1, steps=3, try_top=1, report_dir=str(tmp_path / "rep"))
    report = run_doctor(cfg, options, log=lambda *a: None)
    f = report.facts
    assert f.batch_size == 16 and f.batch_limit == 24 and not f.whole_split  # the 24 of 30 that train
    batch = next(r for r in report.recommendations + report.not_faster if r.key == "batch")
    assert batch.change["run"] == {"batch_size": 24} and "--batch-size 24" in batch.command
    # its lr goes with it, in the command and in the change a tool reads from doctor.json
    assert (
        batch.change["optim"]["lr_batch"] == 24
        and f"--lr {batch.change['optim']['lr']:g} --lr-batch 24" in batch.command
    )
    ((label, change, tried),) = report.tries
    assert label == "larger batch" and change == batch.change
    assert tried.images == 24 * tried.batches  # the batch advised is the batch that ran


def test_a_stopped_try_keeps_the_report_of_the_phases_measured_before_it(tmp_path, monkeypatch, capsys):
    """The audit's `timeout 300 cnnpar doctor ... --try 1` on a CPU: the SIGTERM came during the try (a compile of
    ResNet-50), and nothing was written although the three measured phases had finished."""
    from cnnpar.doctor import run as doctor_run
    from cnnpar.errors import Terminated

    def stopped(*args, **kwargs):
        raise Terminated

    monkeypatch.setattr(doctor_run, "fixed_cost", lambda full, half: 0.9 * full.s_per_batch)  # a batch to try
    monkeypatch.setattr(doctor_run, "_try", stopped)
    rep = tmp_path / "rep"
    args = ["--data", "synthetic", "--image-shape", "1x8x8", "--synthetic-samples", "30", "--workers", "0"]
    args += ["--model", "cnn3", "--device", "cpu", "--batch-size", "16", "--report-dir", str(rep)]
    assert main(["doctor", *args, "--warmup-steps", "1", "--measure-steps", "3", "--try", "1"]) == 128 + 15
    out, err = capsys.readouterr()
    assert err.strip().splitlines()[-1] == "cnnpar: stopped (SIGTERM)"
    result = json.loads((rep / "doctor.json").read_text())
    assert result["stopped"] == "SIGTERM during the try of larger batch"
    assert [p["name"] for p in result["phases"]][-1] == "end to end" and not result["tries"]
    assert "larger batch" in [r["title"] for r in result["recommendations"]]  # untried: its estimate stands
    report = (rep / "report.md").read_text()
    assert "Stopped (SIGTERM during the try of larger batch): the phases measured before it" in report
    assert "Stopped (SIGTERM during the try of larger batch)" in out and (rep / "doctor.png").is_file()


def _a_worker_killed_by_the_stop(*args, **kwargs):
    """As `timeout` ended the doctor: the group's SIGTERM killed the loader's workers, and torch raised their death
    where the main process was, under dynamo's own error in a try that compiles."""
    try:
        raise RuntimeError("DataLoader worker (pid 9277) is killed by signal: Terminated. ")
    except RuntimeError as e:
        raise RuntimeError("RuntimeError when making fake tensor call") from e


DOCTOR_SMALL = ["doctor", "--data", "synthetic", "--image-shape", "1x8x8", "--synthetic-samples", "30", "--workers",
                "0", "--model", "cnn3", "--device", "cpu", "--batch-size", "16", "--warmup-steps", "1",
                "--measure-steps", "3"]  # fmt: skip


def test_a_try_whose_workers_the_stop_killed_keeps_the_report_and_ends_as_the_stop(tmp_path, monkeypatch, capsys):
    """`timeout 8 cnnpar doctor --try 2` ended in a 246-line traceback, exit 1, and no report, where its line had
    promised "a stop keeps the report of what was measured"."""
    from cnnpar.doctor import run as doctor_run

    monkeypatch.setattr(doctor_run, "fixed_cost", lambda full, half: 0.9 * full.s_per_batch)  # a batch to try
    monkeypatch.setattr(doctor_run, "_try", _a_worker_killed_by_the_stop)
    rep = tmp_path / "rep"
    assert main([*DOCTOR_SMALL, "--report-dir", str(rep), "--try", "1"]) == 128 + 15
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == "cnnpar: stopped (SIGTERM)" and "Traceback" not in err
    assert json.loads((rep / "doctor.json").read_text())["stopped"] == "SIGTERM during the try of larger batch"


def test_a_baseline_whose_workers_the_stop_killed_ends_as_the_stop_without_a_report(tmp_path, monkeypatch, capsys):
    """The same SIGTERM during the baseline's end to end: a traceback through doctor/measure.py, exit 1."""
    from cnnpar.doctor import run as doctor_run

    monkeypatch.setattr(doctor_run, "measure_end_to_end", _a_worker_killed_by_the_stop)
    rep = tmp_path / "rep"
    assert main([*DOCTOR_SMALL, "--report-dir", str(rep)]) == 128 + 15
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == "cnnpar: stopped (SIGTERM)" and "Traceback" not in err
    assert not rep.exists()  # nothing measured to the end: no report, as for any stop before the tries


def _a_worker_killed_by_the_oom_killer(*args, **kwargs):
    """torch's errors for a worker the out-of-memory killer ended (SIGKILL): "exited unexpectedly" from "is killed by
    signal: Killed"."""
    try:
        raise RuntimeError("DataLoader worker (pid 9277) is killed by signal: Killed. ")
    except RuntimeError as e:
        raise RuntimeError("DataLoader worker (pid(s) 9277) exited unexpectedly") from e


OOM_LINE = (
    "a data loader worker crashed (SIGKILL: Killed) while reading synthetic: SIGKILL is most often the kernel's "
    "out-of-memory killer (dmesg names it): fewer --workers or a smaller --batch-size need less memory"
)


def test_a_try_whose_worker_was_killed_keeps_the_report_and_ends_in_trains_one_line(tmp_path, monkeypatch, capsys):
    """A try with more workers than memory allows: the out-of-memory killer's SIGKILL ended the doctor in torch's
    traceback, exit 1, without the report of the phases it had measured (tests/integration/test_bad_input.py kills
    a real worker in the baseline)."""
    from cnnpar.doctor import run as doctor_run

    monkeypatch.setattr(doctor_run, "fixed_cost", lambda full, half: 0.9 * full.s_per_batch)  # a batch to try
    monkeypatch.setattr(doctor_run, "_try", _a_worker_killed_by_the_oom_killer)
    rep = tmp_path / "rep"
    assert main([*DOCTOR_SMALL, "--report-dir", str(rep), "--try", "1"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == f"cnnpar: error: {OOM_LINE}" and "Traceback" not in err
    said = "SIGKILL killed a data loader worker during the try of larger batch"
    assert json.loads((rep / "doctor.json").read_text())["stopped"] == said
    assert f"Stopped ({said}): the phases measured before it are in this report" in (rep / "report.md").read_text()


@pytest.mark.parametrize("native", [True, False], ids=["native-bf16", "emulated-bf16"])
def test_the_doctors_bf16_fact_is_what_train_resolves_for_the_device(tmp_path, monkeypatch, native):
    """doctor.json said `bf16_supported: false` on a CPU that computes bf16 natively, where `--precision auto`
    trains in bf16 and the doctor's own header said bf16: the fact asked CUDA alone."""
    from cnnpar.doctor.render import write_report
    from cnnpar.doctor.run import DoctorOptions, run_doctor
    from cnnpar.parallel import resolve_for

    for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        monkeypatch.setattr(torch.cpu, probe, lambda: native, raising=False)
    cfg = with_overrides(
        Config(),
        data={"source": "synthetic", "image_shape": "1x8x8", "synthetic_samples": 30, "workers": 0},
        model={"name": "cnn3"},
        speed={"device": "cpu"},  # --precision auto
        run={"batch_size": 16},
    )
    trains = resolve_for(cfg, torch.device("cpu")).speed.precision
    assert trains == ("bf16" if native else "fp32")
    report = run_doctor(cfg, DoctorOptions(warmup=1, steps=2, report_dir=str(tmp_path / "rep")), log=lambda *a: None)
    assert report.facts.precision == trains
    assert report.facts.bf16_supported is native
    written = json.loads(write_report(report).with_name("doctor.json").read_text())
    assert written["facts"]["bf16_supported"] is native


def _phase_batches(report_dir) -> dict[str, int]:
    import csv

    with open(report_dir / "phases.csv", newline="") as f:
        return {row["name"]: int(row["batches"]) for row in csv.DictReader(f)}


def test_measure_steps_and_max_seconds_end_each_phase_and_warmup_steps_is_recorded(tmp_path):
    """--measure-steps batches a phase, or fewer where --max-seconds runs out first; the report records
    --warmup-steps. --try 0 re-measures nothing."""
    rep = tmp_path / "rep"
    assert main([*DOCTOR_SMALL, "--report-dir", str(rep), "--try", "0"]) == 0
    batches = _phase_batches(rep)
    assert batches["input pipeline alone"] == batches["end to end"] == 3
    result = json.loads((rep / "doctor.json").read_text())
    assert result["warmup_steps"] == 1 and result["tries"] == []
    cut = tmp_path / "cut"
    # a train step of this cnn3 takes milliseconds: 0.1 s (the least --max-seconds takes) ends the phase first
    assert main([*DOCTOR_SMALL, "--measure-steps", "100000", "--max-seconds", "0.1", "--report-dir", str(cut)]) == 0
    assert all(2 <= n < 100000 for n in _phase_batches(cut).values())
