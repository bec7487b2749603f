"""The doctor's verdict and ranking rules on hand-made measurements, its units on a fake clock, and its report
(the measuring itself is tested end to end in tests/integration/test_doctor.py)."""

from __future__ import annotations

import re

import pytest

from cnnpar.doctor.advise import COMPUTE_BOUND, DATA_BOUND, HOST_BOUND, Facts, diagnose, recommend

pytestmark = pytest.mark.usefixtures("one_thread")  # the doctor runs below train in this process


def tiny_synthetic(samples: int, workers: int = -1, compile: str = "auto"):
    """cnn3 on the CPU over `samples` synthetic 1x8x8 images, batch 16: a doctor run of a few seconds."""
    from cnnpar.config import Config
    from cnnpar.presets import with_overrides

    data = {"source": "synthetic", "image_shape": "1x8x8", "synthetic_samples": samples, "workers": workers}
    return with_overrides(
        Config(), data=data, model={"name": "cnn3"}, speed={"device": "cpu", "compile": compile}, run={"batch_size": 16}
    )


def facts(**kw) -> Facts:
    base = dict(
        device_type="cpu",
        batch_size=64,
        workers=0,
        loader="fast",
        in_memory=True,
        resident=False,
        precision="fp32",
        channels_last="off",
        compile="off",
        cores=8,
        data_s=1e-4,
        step_s=1e-3,
        e2e_s=1.1e-3,
        data_wait_share=0.05,
        fixed_step_s=0.1 * 64e-3,
    )
    return Facts(**{**base, **kw})


def slow_folder(**kw) -> Facts:
    base = dict(in_memory=False, workers=2, data_s=4e-3, step_s=1e-3, e2e_s=4e-3, data_wait_share=0.7)
    return facts(**{**base, "data_source": "photos", "data_format": "folder", "input_size": 224, **kw})


def test_slow_folder_with_workers_is_data_bound_and_workers_rank_first():
    f = slow_folder()
    assert diagnose(f).verdict == DATA_BOUND
    recos = recommend(f)
    assert recos[0].key in ("pre-decode", "workers")
    workers = next(r for r in recos if r.key == "workers")
    assert workers.change == {"data": {"workers": 7}}
    assert abs(workers.est_gain - 4e-3 / (4e-3 * 2 / 7)) < 1e-9  # pipeline time x 2/7, still above the step


def test_pre_decode_names_the_prepare_and_train_commands():
    (pre,) = [r for r in recommend(slow_folder(model="resnet50")) if r.key == "pre-decode"]
    assert pre.action == (
        "cnnpar prepare photos --out photos.cnnpar --short-side 256 && "
        "cnnpar train --data photos.cnnpar --model resnet50 --image-size 224"
    )
    assert pre.change is None  # a new data file: the doctor cannot try it in place
    (odd,) = [r for r in recommend(slow_folder(data_source="my photos/", input_size=32)) if r.key == "pre-decode"]
    assert odd.action == (
        "cnnpar prepare 'my photos/' --out 'my photos.cnnpar' --short-side 40 && "
        "cnnpar train --data 'my photos.cnnpar' --image-size 32"
    )


def test_pre_decode_of_a_labelled_flat_folder_keeps_its_labels():
    # without --labels the pasted prepare of a flat folder stopped at "no class folders"
    (pre,) = [r for r in recommend(slow_folder(data_labels="labels.csv")) if r.key == "pre-decode"]
    assert pre.action == (
        "cnnpar prepare photos --labels labels.csv --out photos.cnnpar --short-side 256 && "
        "cnnpar train --data photos.cnnpar --image-size 224"
    )


def test_a_slow_store_gets_workers_not_pre_decode():
    keys = [r.key for r in recommend(slow_folder(data_source="photos.cnnpar", data_format="store"))]
    assert "workers" in keys and "pre-decode" not in keys
    cuda = slow_folder(data_source="photos.cnnpar", data_format="store", device_type="cuda")
    assert "resident" in [r.key for r in recommend(cuda)]


def test_serial_loading_share_decides_without_workers():
    assert diagnose(facts(data_s=5e-4, step_s=1e-3)).verdict == DATA_BOUND  # a third of each step
    assert diagnose(facts(data_s=1e-4, step_s=1e-3)).verdict == COMPUTE_BOUND


def test_fixed_overhead_or_idle_gpu_is_host_bound():
    tiny = facts(fixed_step_s=0.7 * 64e-3)  # 70% of the step does not grow with the batch
    assert diagnose(tiny).verdict == HOST_BOUND
    batch = next(r for r in recommend(tiny) if r.key == "batch")
    assert batch.change == {"run": {"batch_size": 128}}
    # step(128) = 0.7 + 2 * 0.3 (in units of step(64)) for twice the images; serial data cost unchanged
    assert abs(batch.est_gain - (1e-4 + 1e-3) / (1e-4 + 1e-3 * (0.7 + 0.6) / 2)) < 1e-9
    gpu = facts(device_type="cuda", gpu_idle_share=0.5, bf16_supported=True, cuda_graphs="off")
    assert diagnose(gpu).verdict == HOST_BOUND
    keys = [r.key for r in recommend(gpu)]
    assert "cuda-graphs" in keys and "bf16" in keys and "resident" in keys


def test_graph_advice_is_cnnpars_own_switch_and_only_where_it_would_take_effect():
    """`--compile reduce-overhead` makes the trainer turn its own graphs off, so the doctor never
    advises it; it advises `--cuda-graphs on` only when the graphs are off and could be on."""
    idle = dict(device_type="cuda", gpu_idle_share=0.5, bf16_supported=True)
    graphs = next(r for r in recommend(facts(**idle, cuda_graphs="off")) if r.key == "cuda-graphs")
    assert graphs.action == "--cuda-graphs on" and graphs.change == {"speed": {"cuda_graphs": "on"}}
    for state in ("on", "n/a"):  # already replayed, or blocked (accumulation, compile's own graphs)
        assert "cuda-graphs" not in [r.key for r in recommend(facts(**idle, cuda_graphs=state))]
    for state in ("on", "off", "n/a"):
        for r in recommend(facts(**idle, cuda_graphs=state)):
            assert "reduce-overhead" not in r.action and "reduce-overhead" not in str(r.change)


def test_compute_bound_gpu_gets_no_data_advice():
    f = facts(device_type="cuda", resident=True, gpu_idle_share=0.05, bf16_supported=True, fixed_step_s=0.02 * 64e-3)
    assert diagnose(f).verdict == COMPUTE_BOUND
    recos = recommend(f)
    assert {r.key for r in recos} <= {"bf16", "channels-last", "compile"}
    assert recos[0].key == "bf16"
    assert [r.est_gain for r in recos] == sorted((r.est_gain for r in recos), reverse=True)


def test_an_idle_gpu_with_free_memory_gets_the_searched_batch():
    from cnnpar.doctor.advise import wants_batch_search

    idle = facts(device_type="cuda", precision="bf16", channels_last="on", gpu_idle_share=0.67, peak_mem_share=0.02)
    assert wants_batch_search(idle)
    assert not wants_batch_search(facts(device_type="cuda", gpu_idle_share=0.67, peak_mem_share=0.6))  # memory
    # a busy GPU with memory free still searches: small batches underfill it (measured on an H200)
    assert wants_batch_search(facts(device_type="cuda", gpu_idle_share=0.02, peak_mem_share=0.02, fixed_step_s=0))
    assert not wants_batch_search(facts(gpu_idle_share=0.67, peak_mem_share=0.02))  # the CPU keeps its 64
    assert not [r for r in recommend(idle) if r.key == "batch"]  # without a search, 10 % fixed cost: no advice
    searched = facts(**{**idle.__dict__, "searched_batch": 256, "searched_gain": 2.5})
    (batch,) = [r for r in recommend(searched) if r.key == "batch"]
    assert batch.change == {"run": {"batch_size": 256}} and batch.action == "--batch-size 256"
    assert "2.50x the step speed per image" in batch.why and "idle 67% of the step" in batch.why
    assert batch.est_gain > 1.5  # the step is most of the loop here, and 2.5x faster per image


def test_the_graphs_fact_follows_the_trainers_rule_beside_a_gpu_decoder(monkeypatch):
    """With too few device queues the run keeps graphs off beside a GPU JPEG decoder (4,932 img/s with them
    against 6,063 without on an H200): the fact is then "n/a", so the advice never suggests them."""
    from pathlib import Path
    from types import SimpleNamespace

    import torch

    from cnnpar.config import Config
    from cnnpar.data.gpu_decode import GpuDecoder
    from cnnpar.doctor.run import graphs_fact
    from cnnpar.engine.trainer import Trainer

    def trainer(decoder, use_graphs: bool = False) -> SimpleNamespace:
        """A stand-in carrying what the Trainer's own rule reads (graphs need CUDA)."""
        t = SimpleNamespace(
            cfg=Config(),
            info=SimpleNamespace(distributed=False),
            graphs_requested="auto",
            use_graphs=use_graphs,
            train_loader=SimpleNamespace(decoder=decoder),
        )
        t.graphs_blocked_reason = lambda: Trainer.graphs_blocked_reason(t)
        return t

    photos = GpuDecoder([Path("a.jpg")], 32, torch.device("cpu"), train=True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)  # the variable counts (dist.queues_setting)
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "8")
    assert graphs_fact(trainer(photos)) == "n/a"
    assert graphs_fact(trainer(None)) == "off"  # no decoder: graphs could run, the advice may say so
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32")
    assert graphs_fact(trainer(photos)) == "off"
    assert graphs_fact(trainer(photos, use_graphs=True)) == "on"


def tried(recos, **gains):
    """The recommendations with `--try` measurements set: key (dashes as underscores) = measured gain."""
    for r in recos:
        gain = gains.get(r.key.replace("-", "_"))
        if gain is not None:
            r.tried_gain, r.tried_images_per_s = gain, 1000.0 * gain
    return recos


def textbook_serial() -> Facts:
    """The audit's case: textbook loader, no workers, serial loading on a CPU."""
    return facts(loader="textbook", textbook_ratio=0.3, data_s=5e-4, step_s=1e-3, cores=8)


def test_tries_below_the_minimum_gain_are_no_longer_advised_and_measured_gains_rank_first():
    from cnnpar.doctor.advise import rank_after_tries

    recos = recommend(textbook_serial())
    assert [r.key for r in recos] == ["workers", "fast-loader", "compile"]  # by estimate, before any try
    advised, not_faster = rank_after_tries(tried(recos, workers=0.94, fast_loader=1.26, compile=0.89))
    assert [r.key for r in advised] == ["fast-loader"]
    assert [(r.key, r.tried_gain) for r in not_faster] == [("workers", 0.94), ("compile", 0.89)]
    # a measured gain replaces the estimate in the ranking: workers, estimated 1.50x and first before the tries,
    # measured 1.05x, falls behind compile's untried 1.06x estimate
    advised, not_faster = rank_after_tries(tried(recommend(textbook_serial()), workers=1.05, fast_loader=1.26))
    assert [r.key for r in advised] == ["fast-loader", "compile", "workers"] and not not_faster


def doctor_report(recos: list, not_faster: list):
    from cnnpar.config import Config
    from cnnpar.doctor.advise import diagnose
    from cnnpar.doctor.measure import Phase
    from cnnpar.doctor.run import DoctorReport

    f = textbook_serial()
    env = {"device": "cpu", "device_type": "cpu", "torch": "2", "git_rev": "abc", "date": "today"}
    phases = [Phase("end to end", batches=10, seconds=1.0, images=640)]
    return DoctorReport(Config(), env, "synthetic", f, diagnose(f), recos, phases, not_faster=not_faster)


def test_the_report_and_terminal_show_tries_that_were_not_faster_apart_from_the_advice(capsys):
    from cnnpar.doctor.advise import rank_after_tries
    from cnnpar.doctor.render import markdown, print_report

    advised, not_faster = rank_after_tries(tried(recommend(textbook_serial()), workers=0.94, fast_loader=1.26))
    report = doctor_report(advised, not_faster)
    md = markdown(report, [])
    table = [line for line in md.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")]
    assert "uint8 batches" in table[0] and "torch.compile" in table[1] and "workers" not in "".join(table)
    assert "- more loader workers (`--workers 7`): estimated 1.50x, tried: 0.94x, not advised" in md
    print_report(report)
    out = capsys.readouterr().out
    pasted = [line for line in out.splitlines() if line[:3] in ("1. ", "2. ", "3. ")]
    assert len(pasted) == 2 and "--loader fast" in pasted[0] and not any("--workers 7" in p for p in pasted)
    assert "- more loader workers (--workers 7): estimated 1.50x, tried: 0.94x, not advised" in out


def test_when_every_try_was_slower_the_summary_says_so():
    from cnnpar.doctor.advise import rank_after_tries
    from cnnpar.doctor.render import markdown

    f = facts(compile="off")  # the audit's other run: compile, the only advice, tried at 0.17x
    advised, not_faster = rank_after_tries(tried(recommend(f), compile=0.17))
    assert not advised and [r.key for r in not_faster] == ["compile"]
    md = markdown(doctor_report(advised, not_faster), [])
    assert "No change is advised: those tried were not measurably faster" in md
    assert "- torch.compile (`--compile default`): estimated 1.08x, tried: 0.17x, not advised" in md
    assert "| 1 |" not in md


def test_an_end_to_end_far_slower_than_its_parts_gives_no_confident_verdict():
    """The audit's loaded host: pipeline 16.1 ms and step 23.9 ms per batch, overlapped by workers, model
    ~24 ms; end to end measured 245.9 ms with 5 % data wait, and the verdict was compute-bound."""
    from dataclasses import replace

    from cnnpar.doctor.advise import DISAGREE
    from cnnpar.doctor.render import markdown

    per_image = dict(data_s=16.1e-3 / 64, step_s=23.9e-3 / 64, data_wait_share=0.05, workers=1, loader="textbook")
    loaded = facts(**per_image, e2e_s=245.9e-3 / 64, load_avg_1m=5.5, cores=2)
    d = diagnose(loaded)
    assert d.verdict == DISAGREE and not d.reliable
    assert "end to end took 245.9 ms per batch, but the parts measured alone model 23.9 ms" in d.reasons[2]
    assert "the host's load may have changed during the measurement" in d.reasons[2]
    assert "unreliable (the parts alone would say compute-bound)" in d.reasons[3]
    md = markdown(replace(doctor_report([], []), facts=loaded, diagnosis=d), [])
    # the heading is marked as the console's panel title is, and the line pointing at "the last reason above"
    # comes after the reasons (it stood before them)
    assert md.startswith("# cnnpar doctor: measurements disagree (unreliable)\n")
    verdict = md.split("## Verdict", 1)[1].split("## Measurements", 1)[0]
    unreliable = verdict.index("**Unreliable verdict:** the measurements do not settle it (the last reason above")
    assert 0 < verdict.index(f"- {d.reasons[-1]}") < unreliable
    assert "load average (1 min) 5.50 on 2 usable core(s)" in md
    # end to end above the model, as on a quiet host (1.21-1.31x for cnn3 on the CPU): the usual case, agreeing
    agreeing = facts(**per_image, e2e_s=1.4 * 23.9e-3 / 64)
    assert diagnose(agreeing).reasons[2:] == diagnose(facts(**per_image, e2e_s=23.9e-3 / 64)).reasons[2:]
    assert diagnose(agreeing).verdict == COMPUTE_BOUND and diagnose(agreeing).reliable


def test_a_cpu_run_slowed_by_a_busy_host_names_the_spinning_threads_and_their_switch():
    """On 2 cores beside a busy process, the README's run fell to 80 img/s a median epoch (1,087 with
    OMP_WAIT_POLICY=PASSIVE): the doctor said only that the host's load may have changed."""
    per_image = dict(data_s=16.1e-3 / 64, step_s=23.9e-3 / 64, data_wait_share=0.05, e2e_s=245.9e-3 / 64)
    switch = "OMP_WAIT_POLICY=PASSIVE set before the command steadies them"
    assert switch in diagnose(facts(**per_image)).reasons[2]
    assert switch not in diagnose(facts(**per_image, omp_wait_policy="PASSIVE")).reasons[2]  # set already
    assert switch not in diagnose(facts(**per_image, device_type="cuda")).reasons[2]  # the step is the GPU's


def test_an_end_to_end_faster_than_its_slowest_part_alone_gives_no_confident_verdict():
    """The audit's `--measure-steps 0`: end to end 0.002 ms an image against a step of 0.554 ms alone was read as
    host-bound with a batch-size advice; it runs the step too, so it cannot be faster than the step alone."""
    from cnnpar.doctor.advise import DISAGREE

    per_image = dict(data_s=0.1e-3, step_s=0.554e-3, data_wait_share=0.0, workers=0)
    d = diagnose(facts(**per_image, e2e_s=0.002e-3))
    assert d.verdict == DISAGREE and not d.reliable
    assert "less than half of its slowest part alone" in d.reasons[2]
    assert diagnose(facts(**per_image, e2e_s=0.6e-3)).reliable  # a little above the parts: agreeing


def test_with_grad_accum_a_row_is_one_micro_batch_and_the_fixed_share_is_a_micro_batchs(monkeypatch, capsys):
    """The step alone timed a whole accumulation group per "batch", the fixed-share divided that by one
    micro-batch's time: --grad-accum 4 made the share 4x too large (a false host-bound verdict, batch advice)."""
    from dataclasses import replace
    from types import SimpleNamespace

    import pytest
    import torch

    from cnnpar.config import Config
    from cnnpar.dist import DistInfo
    from cnnpar.doctor import measure
    from cnnpar.doctor.render import markdown, print_report
    from cnnpar.presets import with_overrides

    now = [0.0]

    def run_step(trainer, group):  # a micro-batch costs 1 ms + 0.1 ms an image; the optimizer step 2 ms more
        now[0] += sum(1e-3 + 1e-4 * y.shape[0] for _, y in group) + 2e-3
        return sum(y.shape[0] for _, y in group)

    monkeypatch.setattr(measure, "run_step", run_step)
    monkeypatch.setattr(measure, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    cfg = SimpleNamespace(optim=SimpleNamespace(grad_accum=4))
    trainer = SimpleNamespace(info=DistInfo(0, 0, 1, torch.device("cpu")), model=torch.nn.Linear(1, 1), cfg=cfg)
    full, half = measure.measure_step_scaling(trainer, torch.zeros(8, 1), torch.zeros(8), 1, 6, 60.0)
    assert full.images == 8 * full.batches and half.images == 4 * half.batches  # a row's batch: --batch-size images
    # a micro-batch: 1 + 8 x 0.1 ms and a quarter of the optimizer's 2 ms, of which 1 + 0.5 ms do not grow with it
    assert full.s_per_batch == pytest.approx(2.3e-3) and half.s_per_batch == pytest.approx(1.9e-3)
    fixed = measure.fixed_cost(full, half)
    assert fixed == pytest.approx(1.5e-3)
    f = facts(batch_size=8, step_s=full.s_per_image, fixed_step_s=fixed)
    assert f.fixed_share == pytest.approx(1.5 / 2.3)
    report = replace(doctor_report([], []), cfg=with_overrides(Config(), optim={"grad_accum": 4}), facts=f)
    said = "ms/batch: one batch of the row's batch column's images (as measured), one micro-batch of the 4 an"
    assert said in markdown(report, [])
    print_report(report)
    assert said in capsys.readouterr().out


def test_the_report_shows_this_runs_telemetry_not_a_picture_an_earlier_run_left(tmp_path):
    from dataclasses import replace

    from cnnpar.doctor.render import write_report

    (tmp_path / "telemetry.png").write_bytes(b"an earlier run's timeline")
    write_report(replace(doctor_report([], []), report_dir=tmp_path))  # this run drew none (--no-monitor, say)
    assert "telemetry.png" not in (tmp_path / "report.md").read_text()
    write_report(replace(doctor_report([], []), report_dir=tmp_path, telemetry_png=tmp_path / "telemetry.png"))
    assert "![telemetry](telemetry.png)" in (tmp_path / "report.md").read_text()


def test_a_training_split_smaller_than_one_batch_gets_no_larger_batch_advice_nor_search():
    """40 synthetic images (32 to train) at batch 64: every batch held the 32, the table said "a batch of 64",
    and the doctor advised --batch-size 128, which no batch of this data can reach."""
    from cnnpar.doctor.advise import wants_batch_search

    tiny = facts(fixed_step_s=0.7 * 64e-3, data_under_one_batch=True)
    assert not [r for r in recommend(tiny) if r.key == "batch"]
    assert [r for r in recommend(facts(fixed_step_s=0.7 * 64e-3)) if r.key == "batch"]  # the same facts otherwise
    idle = facts(device_type="cuda", gpu_idle_share=0.67, peak_mem_share=0.02)
    assert wants_batch_search(idle) and not wants_batch_search(facts(**{**idle.__dict__, "data_under_one_batch": True}))


def test_the_doctor_reports_the_batch_it_measured_when_the_data_holds_less_than_one(tmp_path):
    from cnnpar.config import Config
    from cnnpar.doctor.run import DoctorOptions, run_doctor
    from cnnpar.presets import with_overrides

    cfg = with_overrides(
        Config(),
        data={"source": "synthetic", "image_shape": "1x8x8", "synthetic_samples": 40, "workers": 0},
        model={"name": "cnn3"},
        speed={"device": "cpu"},
        run={"batch_size": 64},
    )
    report = run_doctor(cfg, DoctorOptions(warmup=1, steps=2, report_dir=str(tmp_path / "rep")), log=lambda *a: None)
    f = report.facts
    assert f.data_under_one_batch and f.batch_size == 32  # the 32 of 40 that train (a seeded 20 % hold-out)
    assert f.batch_limit == 32 and f.whole_split  # the Trainer's own cap and its line, not a second rule here
    assert f.batch_from == "batch size 64 capped to 32: all 32 training samples, one step per epoch"
    assert not [r for r in report.recommendations if r.key == "batch"]


def test_a_verdict_from_too_few_batches_is_marked_unreliable_naming_them():
    """`--measure-steps 2` gave "compute-bound" from one cold step and two end-to-end batches, marked reliable."""
    from cnnpar.doctor.advise import FEW_BATCHES, few_batches
    from cnnpar.doctor.measure import Phase

    d = diagnose(facts())
    assert d.reliable and d.verdict == COMPUTE_BOUND
    enough = [Phase("train step alone", FEW_BATCHES, 1.0, 64 * FEW_BATCHES), Phase("end to end", 10, 1.0, 640)]
    assert few_batches(d, enough) is d
    few = few_batches(d, [Phase("train step alone", 1, 0.1, 64), Phase("end to end", 2, 0.2, 128)])
    assert not few.reliable and few.verdict == COMPUTE_BOUND
    assert few.reasons[-1].startswith(
        f"too few batches measured to settle it (train step alone: 1, end to end: 2; at least {FEW_BATCHES} each)"
    )


def test_a_doctor_run_with_no_warm_up_says_so_and_marks_its_verdict_unreliable(tmp_path):
    """`--warmup-steps 0` timed each phase's cold first batch, under a report that said "Warm-up excluded"."""
    from cnnpar.doctor.render import markdown
    from cnnpar.doctor.run import DoctorOptions, run_doctor

    cfg = tiny_synthetic(400, workers=0)
    reports = {
        warmup: run_doctor(
            cfg, DoctorOptions(warmup=warmup, steps=6, report_dir=str(tmp_path / f"w{warmup}")), log=lambda *a: None
        )
        for warmup in (0, 1)
    }
    cold, warm = markdown(reports[0], []), markdown(reports[1], [])
    assert "Warm-up excluded (1 untimed batch(es) before each phase)" in warm
    assert "Warm-up excluded" not in cold and "No warm-up: each phase's first batch, cold, is timed" in cold
    assert not reports[0].diagnosis.reliable
    assert reports[0].diagnosis.reasons[-1].startswith("no warm-up step ran (--warmup-steps 0)")
    assert not any("no warm-up" in r for r in reports[1].diagnosis.reasons)


def test_the_doctors_default_steps_settle_the_step_alone_measured_in_rounds(tmp_path):
    """With the default 20 steps and compile off, the step alone is the best of 10 rounds of 2 batches: the verdict
    was marked unreliable for "train step alone: 2" on every such run, whatever was measured."""
    from cnnpar.doctor.run import DoctorOptions, run_doctor

    cfg = tiny_synthetic(800, workers=0, compile="off")
    report = run_doctor(cfg, DoctorOptions(warmup=1, steps=20, report_dir=str(tmp_path / "r")), log=lambda *a: None)
    step = next(p for p in report.phases if p.name == "train step alone")
    assert step.batches == 2 and step.measured_batches == 20
    assert not any(r.startswith("too few batches") for r in report.diagnosis.reasons), report.diagnosis.reasons


def test_the_advised_command_is_a_new_run_without_the_users_name_or_resume():
    """`doctor --name tr_s0` advised `cnnpar train ... --name tr_s0`, refused as that folder holds a run; with
    `--resume runs/r1` the pasted command said "nothing to do" (or continued that run with the change)."""
    from cnnpar.config import Config
    from cnnpar.doctor.advise import Recommendation
    from cnnpar.doctor.run import advice_command
    from cnnpar.presets import with_overrides

    cfg = with_overrides(Config(), model={"name": "cnn3"}, run={"name": "tr_s0", "resume": "runs/r1", "epochs": 4})
    r = Recommendation("compile", "torch.compile", "", "", 1.5, "", change={"speed": {"compile": "default"}})
    command = advice_command(cfg, facts(), r)
    assert "--compile default" in command and "--epochs 4" in command, command
    assert "--name" not in command and "--resume" not in command, command


def test_the_report_says_how_the_step_alone_was_timed():
    """report.md said "the best of 3 to 10 short rounds, alternating full and half batch" where a compiled step was
    timed in one window, with no half batch."""
    from types import SimpleNamespace

    from cnnpar.config import Config
    from cnnpar.doctor.measure import Phase
    from cnnpar.doctor.render import step_text
    from cnnpar.presets import with_overrides

    rounds = [Phase("train step alone", 2, 0.1, 128), Phase("train step, half batch", 2, 0.06, 64)]
    eager = SimpleNamespace(phases=rounds, cfg=Config())
    compiled = SimpleNamespace(phases=rounds[:1], cfg=with_overrides(Config(), speed={"compile": "default"}))
    assert step_text(eager).startswith("The step alone is the best of 3 to 10 short rounds")
    assert step_text(compiled) == (
        "The step alone is one window of repeated steps on one batch (no half batch: the step is compiled)"
    )


def test_compile_advice_on_the_cpu_names_the_compiles_own_cost_as_cnnpar_train_does():
    """The doctor ranked `--compile default` on a CPU by a rule of thumb while `cnnpar train` there said "compile
    off: its compile is rarely repaid": the advice now says what the compile costs there, and that it is a guess."""
    from cnnpar.doctor.advise import CPU_COMPILE_COST

    (cpu,) = [r for r in recommend(facts(compile="off")) if r.key == "compile"]
    assert cpu.basis.endswith(CPU_COMPILE_COST) and "minutes" in cpu.basis and "rarely repaid" in cpu.basis
    assert "not measured on CPUs" in cpu.basis and "H200" not in cpu.basis
    gpu = facts(device_type="cuda", precision="bf16", channels_last="on", compile="off", resident=True)
    (cuda,) = [r for r in recommend(gpu) if r.key == "compile"]
    assert CPU_COMPILE_COST not in cuda.basis and "H200 measured 1.44x" in cuda.basis


def test_a_stopped_try_is_said_in_the_report_and_on_the_console(capsys):
    from dataclasses import replace

    from cnnpar.doctor.render import markdown, print_report

    stopped = replace(
        doctor_report(recommend(textbook_serial()), []), stopped="SIGTERM during the try of torch.compile"
    )
    md = markdown(stopped, [])
    line = (
        "Stopped (SIGTERM during the try of torch.compile): the phases measured before it are in this report; that "
        "try and any after it were not measured, and their recommendations keep their estimates."
    )
    assert f"**{line}**" in md and md.index(line) < md.index("## Verdict")
    print_report(stopped)
    assert line in capsys.readouterr().out
    assert "Stopped" not in markdown(doctor_report([], []), [])


def test_tried_gains_beside_an_unreliable_verdict_are_marked_unsettled():
    """A loaded host made end to end much slower than its parts: the verdict said unreliable, yet the ranking showed
    "tried 31.01x" against that end to end, unmarked."""
    from types import SimpleNamespace

    from cnnpar.doctor.advise import Diagnosis, Recommendation
    from cnnpar.doctor.render import unsettled_tries

    tried = Recommendation("compile", "torch.compile", "", "", 1.5, "", tried_gain=31.01, tried_images_per_s=9e3)
    untried = Recommendation("workers", "more workers", "", "", 1.2, "")
    shaky, sound = Diagnosis(COMPUTE_BOUND, ["disagree"], reliable=False), Diagnosis(COMPUTE_BOUND, [])
    assert unsettled_tries(SimpleNamespace(diagnosis=shaky, recommendations=[tried]))
    assert not unsettled_tries(SimpleNamespace(diagnosis=sound, recommendations=[tried]))
    assert not unsettled_tries(SimpleNamespace(diagnosis=shaky, recommendations=[untried]))


def test_the_doctors_resolved_config_holds_what_ran_not_auto():
    """The report's "Resolved config" and doctor.json said workers = -1 and format = "auto" while the setup line
    said "1 worker(s)": the config as asked, not as it ran."""
    import tempfile

    from cnnpar.doctor.run import DoctorOptions, run_doctor

    cfg = tiny_synthetic(400)
    assert cfg.data.workers == -1 and cfg.data.format == "auto"
    with tempfile.TemporaryDirectory() as rep:
        report = run_doctor(cfg, DoctorOptions(warmup=1, steps=5, report_dir=rep), log=lambda *a: None)
    assert report.cfg.data.workers == report.facts.workers >= 0
    assert report.cfg.data.format == "synthetic"


def test_the_larger_batch_advice_stays_within_the_batch_the_trainer_runs():
    """The audit's photos: 90 training images at batch 64 got `--batch-size 128`, which the Trainer capped to 90, so
    the try ran 90 and the command said 128. A batch that is already the whole split gets no such advice."""
    from cnnpar.doctor.advise import wants_batch_search

    overhead = dict(fixed_step_s=0.7 * 64e-3)
    assert recommend(facts(**overhead))[0].change == {"run": {"batch_size": 128}}  # nothing known: double it
    (batch,) = [r for r in recommend(facts(**overhead, batch_limit=90)) if r.key == "batch"]
    assert batch.change == {"run": {"batch_size": 90}} and batch.action == "--batch-size 90 (retune --lr)"
    assert "90 is the whole training split, the largest batch that runs" in batch.why
    assert batch.basis.endswith("extrapolated linearly to 90")
    # a step of 0.7 x 64 ms fixed + 0.3 ms an image: 44.8 + 27 = 71.8 ms for 90 images, against 64 ms for 64; the
    # data's 0.1 ms an image, read serially, beside it
    assert batch.est_gain == pytest.approx((0.1e-3 + 64e-3 / 64) / (0.1e-3 + 71.8e-3 / 90))
    whole = facts(**overhead, batch_limit=64)
    assert not [r for r in recommend(whole) if r.key == "batch"]
    assert "no larger batch can spread it: batch 64 is already the whole training split" in diagnose(whole).reasons[2]
    idle = dict(device_type="cuda", gpu_idle_share=0.67, peak_mem_share=0.02)
    assert wants_batch_search(facts(**idle, batch_limit=90)) and not wants_batch_search(facts(**idle, batch_limit=64))


def test_each_measurement_row_says_the_batch_it_measured(capsys):
    """A try of a larger batch ran the Trainer's capped 90 (450 images in 5 batches) under a note that said "a
    batch of 64 images" for every row."""
    from dataclasses import replace

    from cnnpar.doctor.measure import Phase
    from cnnpar.doctor.render import PHASE_COLUMNS, markdown, phase_rows, print_report

    tried = Phase("tried: larger batch", batches=5, seconds=5.9, images=450)
    report = replace(doctor_report([], []), tries=[("larger batch", {"run": {"batch_size": 90}}, tried)])
    assert [r["images_per_batch"] for r in phase_rows(report)] == [64, 90] and "images_per_batch" in PHASE_COLUMNS
    md = markdown(report, [])
    assert "| end to end | 64 | 10 |" in md and "| tried: larger batch | 90 | 5 |" in md
    assert "a batch of 64 images" not in md
    print_report(report)
    out = capsys.readouterr().out
    rows = [[cell.strip() for cell in line.split("│")] for line in out.splitlines() if line.count("│") > 4]
    assert [row[1:3] for row in rows] == [["end to end", "64"], ["tried: larger batch", "90"]]


def test_a_pipe_in_a_data_path_stays_inside_its_table_cell():
    """`d/my da|ta`: GitHub's tables split a row at every `|`, inside a code span too, and the columns shifted."""
    from cnnpar.doctor.advise import Recommendation
    from cnnpar.doctor.render import markdown

    command = "cnnpar train --data 'd/my da|ta' --workers 1"
    reco = Recommendation("workers", "more workers", "--workers 1", "a | b", 1.5, "measured", command=command)
    row = next(line for line in markdown(doctor_report([reco], []), []).splitlines() if line.startswith("| 1 |"))
    assert "`cnnpar train --data 'd/my da\\|ta' --workers 1`" in row and "a \\| b" in row
    assert len(re.split(r"(?<!\\)\|", row)) == 8  # six cells between the row's outer bars


def test_one_usable_core_gets_no_worker_advice_and_its_worker_does_not_overlap():
    # on one core (taskset -c 0) the doctor advised --workers 1 at 1.41x over 0; train ran it at 0.91x: the worker
    # takes turns with the step on that core
    one = slow_folder(workers=0, cores=1, data_s=3.3e-3, step_s=1.4e-3)
    assert "workers" not in [r.key for r in recommend(one)]
    assert "pre-decode" in [r.key for r in recommend(one)]  # decoding once still removes the pipeline's cost
    assert "workers" in [r.key for r in recommend(slow_folder(workers=0, cores=2, data_s=3.3e-3, step_s=1.4e-3))]
    # a worker already there on one core: loading and the step add up, as without workers
    shared = slow_folder(workers=1, cores=1, data_s=1e-3, step_s=1e-3)
    assert shared.modelled() == pytest.approx(2e-3)
    assert diagnose(shared).verdict == DATA_BOUND  # half of each step reads data, though the pipeline is not slower


def test_the_larger_batch_advice_says_it_changes_training_and_its_command_scales_the_lr():
    """The advised command changed only --batch-size: a fixed batch trains at --lr as it is, so batch 256 trained at
    batch 64's lr (1/4 of the optimizer steps at the same step size), the advice calling it a speed-up."""
    from cnnpar.config import Config
    from cnnpar.doctor.run import advice_command
    from cnnpar.presets import with_overrides

    idle = facts(device_type="cuda", precision="bf16", channels_last="on", gpu_idle_share=0.67, peak_mem_share=0.02)
    (batch,) = [
        r
        for r in recommend(facts(**{**idle.__dict__, "searched_batch": 256, "searched_gain": 2.5}))
        if r.key == "batch"
    ]
    assert "a change of training, not only of speed: fewer optimizer steps an epoch" in batch.why
    adamw = advice_command(with_overrides(Config(), run={"batch_size": 64}), idle, batch)  # --lr auto: 0.002
    assert "--batch-size 256" in adamw and "--lr 0.004 --lr-batch 256" in adamw, adamw  # x sqrt(4)
    sgd = with_overrides(Config(), optim={"optimizer": "sgd", "lr": 0.1}, run={"batch_size": 64})
    assert "--lr 0.4 --lr-batch 256" in advice_command(sgd, idle, batch)  # x 4
    # the CPU's automatic 64 trained at the lr scaled from a preset's batch 512 (0.2 x 64/512): 0.05 at 128
    overhead = facts(fixed_step_s=0.7 * 64e-3)
    (cpu,) = [r for r in recommend(overhead) if r.key == "batch"]
    assert "fewer optimizer steps an epoch" in cpu.why
    preset = with_overrides(Config(), optim={"optimizer": "sgd", "lr": 0.2, "lr_batch": 512})
    command = advice_command(preset, overhead, cpu)
    assert "--lr 0.05 --lr-batch 128 --batch-size 128" in command, command


def test_a_tried_gain_is_ranked_at_the_precision_the_report_states_it():
    """A try at 1.0296x the end-to-end rate was listed as "tried and not faster (measured here under 1.03x)" while
    the report printed it as 1.03x (and doctor.json held 1.03): the flaky CI failure of test_doctor's data-bound case.
    The gain is kept as stated, so what is ranked, written and printed agree."""
    from cnnpar.doctor.advise import MIN_GAIN, measured_gain, rank_after_tries
    from cnnpar.doctor.render import _gain

    recos = recommend(textbook_serial())
    for r, images_per_s in zip(recos, (1029.6, 1024.9, 1200.0)):
        r.tried_images_per_s, r.tried_gain = images_per_s, measured_gain(images_per_s, 1000.0)
    advised, not_faster = rank_after_tries(recos)
    assert all(float(_gain(r.tried_gain)[:-1]) >= MIN_GAIN for r in advised)
    assert all(float(_gain(r.tried_gain)[:-1]) < MIN_GAIN for r in not_faster)
    assert [r.key for r in not_faster] == [recos[1].key]
