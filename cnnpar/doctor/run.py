"""`cnnpar doctor`: measure the user's own model and data, name the bottleneck, advise, optionally try.

One process, no run folder: a `Trainer` is built for its parts only (its constructor creates
nothing on disk), and the report goes to its own folder.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from cnnpar.config import LONG_COMPILES, Config, asked_lr, batch_lr_factor, command_line, lr_reference
from cnnpar.data import load_data
from cnnpar.data.loader import decodes_on_gpu
from cnnpar.data.sources import detect_format
from cnnpar.data.store import prepare_then_train
from cnnpar.data.worker_crash import worker_crash, worker_signal
from cnnpar.dist import init_distributed
from cnnpar.doctor.advise import (
    MIN_GAIN,
    Diagnosis,
    Facts,
    Recommendation,
    diagnose,
    few_batches,
    measured_gain,
    no_warm_up,
    rank_after_tries,
    recommend,
    wants_batch_search,
)
from cnnpar.doctor.measure import (
    Phase,
    first_batch,
    fixed_cost,
    gpu_idle_share,
    measure_end_to_end,
    measure_pipeline,
    measure_step,
    measure_step_scaling,
    textbook_cost_ratio,
)
from cnnpar.doctor.options import DoctorOptions
from cnnpar.engine.batch_size import batch_cap, choose_batch_size, device_probe, memory_budget, search_start
from cnnpar.engine.harness import build_trainer
from cnnpar.engine.memory_full import TRAINING_WAYS, memory_full_said
from cnnpar.engine.resolved import data_resolved, long_compiles_resolved
from cnnpar.engine.stops import raise_if_the_stop, the_stop
from cnnpar.engine.trainer import Trainer
from cnnpar.errors import DataError, DeviceMemoryFull, Terminated
from cnnpar.host_facts import quota_note, usable_cores
from cnnpar.parallel.precision import bf16_on
from cnnpar.presets import with_overrides
from cnnpar.report.environment import environment
from cnnpar.report.files import check_output_folder, output_folder
from cnnpar.report.meters import free_device_memory
from cnnpar.report.telemetry import TelemetrySampler, plot_unless_failed


@dataclass
class DoctorReport:
    cfg: Config
    env: dict
    origin: str
    facts: Facts
    diagnosis: Diagnosis
    recommendations: list[Recommendation]
    phases: list[Phase]
    tries: list[tuple[str, dict, Phase]] = field(default_factory=list)  # (label, change, measured end to end)
    not_faster: list[Recommendation] = field(default_factory=list)  # tried here below MIN_GAIN: not advised
    # the tries that ran out of device memory: (label, change, the line that says so); their recommendations are not
    # advised. The baseline fitted, so the change is what did not: a result, and the other tries still run
    did_not_fit: list[tuple[str, dict, str]] = field(default_factory=list)
    marks: list[tuple[str, float, float]] = field(default_factory=list)
    report_dir: Path = Path(".")
    telemetry: Path | None = None
    telemetry_png: Path | None = None  # this run's timeline, None when it drew none
    # the one line said where the disk refused telemetry.csv ("" where it was whole): the files say it too, since a
    # reader of report.md or doctor.json later would take the CSV cut short for the whole run's
    telemetry_failed: str = ""
    warmup_steps: int = 3  # untimed batches before each measured phase (--warmup-steps)
    # a Ctrl-C or SIGTERM during the tries: the report holds what was measured before it, and says what it cut
    # short; the command ends with the stop after writing it (cli.cmd_doctor)
    stopped: str = ""  # "SIGTERM during the try of torch.compile"; "" where the doctor ran to its end
    # what the command ends with once the report is written: the stop, or a worker crash's one line
    stop: KeyboardInterrupt | DataError | None = None

    @property
    def end_to_end(self) -> Phase:
        return next(p for p in self.phases if p.name == "end to end")


# The files of a report (render.write_report's, and the telemetry's): an earlier doctor's results in a --report-dir
REPORT_FILES = (
    "report.md", "doctor.json", "phases.csv", "recommendations.csv", "doctor.png", "telemetry.csv", "telemetry.png",
)  # fmt: skip


def report_parent(cfg: Config) -> Path:
    """Where each doctor's new report folder goes without --report-dir: <model>-YYYYMMDD-HHMMSS in here, under
    run.out_dir (runs/ by default, git-ignored) like every other output, not the current folder."""
    return Path(cfg.run.out_dir) / "doctor"


def _merge(changes: list[dict]) -> dict:
    """Several config changes as one; the first to set a field keeps it (they come best first)."""
    merged: dict[str, dict] = {}
    for change in changes:
        for sec, values in change.items():
            for k, v in values.items():
                merged.setdefault(sec, {}).setdefault(k, v)
    return merged


def run_doctor(cfg: Config, opts: DoctorOptions, log: Callable[[str], None] = print) -> DoctorReport:
    """Measure, advise and write the report into its folder (the report's `report_dir`); the one owner of that
    folder, which a failure before the report is whole removes (or, a --report-dir that was there before, the report
    files this doctor wrote in it)."""
    check_output_folder("doctor", "--report-dir", opts.report_dir, cfg.run.out_dir, REPORT_FILES)  # before it measures
    info = init_distributed(cfg.speed.device, debug_single=True)  # the doctor measures one process
    bundle = load_data(cfg.data, cfg.run.seed)
    # data that fails at its first batch leaves no empty folder, and a report cut short (a full disk) no partial one
    # that a re-run into the same --report-dir would refuse as an earlier doctor's
    with output_folder(opts.report_dir, report_parent(cfg), cfg.model.name, results=REPORT_FILES) as report_dir:
        try:
            report = _examine(cfg, opts, log, info, bundle, report_dir)
        except Exception as e:
            raise_if_the_stop(e)  # a stop before the tries (the workers it killed): no report, the stop's exit
            # a worker killed otherwise: train's one line
            crash = worker_crash(e, cfg.data.source, bundle, cfg.data.labels)
            if crash is not None:
                raise crash from None
            raise
        from cnnpar.doctor.render import write_report  # (render reads this module's DoctorReport)

        write_report(report)
        return report


def _examine(cfg: Config, opts: DoctorOptions, log, info, bundle, report_dir: Path) -> DoctorReport:
    # a telemetry CSV the disk refuses is said in one line, and the measuring and the report go on without it
    sampler = (
        TelemetrySampler(report_dir / "telemetry.csv", opts.telemetry_interval_s, log=log, goes_on="the doctor goes on")
        if cfg.run.monitor
        else None
    )
    marks: list[tuple[str, float, float]] = []

    def phase(label: str, fn):
        t0 = sampler.elapsed() if sampler else 0.0
        log(f"doctor: measuring {label} ...")
        out = fn()
        if sampler:
            marks.append((label, t0, sampler.elapsed()))
        return out

    with sampler if sampler else contextlib.nullcontext():
        rcfg, phases, facts, resolved = _measure_baseline(cfg, info, bundle, opts, phase)
        free_device_memory(info.device)  # the baseline's trainer is gone; the tries build their own
        note = long_compiles_note(cfg, rcfg, len(bundle.train))
        if note:
            log(note)
        e2e = phases[-1]
        diagnosis = no_warm_up(few_batches(diagnose(facts), phases), opts.warmup)
        recos = recommend(facts)
        for r in recos:
            r.change = advised_change(cfg, facts, r)  # the batch's lr too: the try and doctor.json's change
            r.command = advice_command(cfg, facts, r)
            if r.key == "pre-decode":  # the table's "do" shows the same command as the line to paste
                r.action = r.command
        report = DoctorReport(
            resolved,  # the report's "Resolved config": what ran, its autos resolved (workers -1 read as asked)
            environment(info.device, 1),
            bundle.origin,
            facts,
            diagnosis,
            recos,
            phases,
            report_dir=report_dir,
            warmup_steps=opts.warmup,
        )
        tryable = [r for r in recos if r.change][: opts.try_top]
        trying = ""
        try:  # a stop here keeps the measurements above: the report is written, saying which try it cut short
            for r in tryable:
                trying = f"try of {r.title}"
                if cost := compile_cost_note(r, info.device.type):
                    log(cost)
                tried = phase(f"try: {r.title}", lambda r=r: _try(rcfg, r.change, info, bundle, opts, r.title))
                if isinstance(tried, str):
                    r.tried_failed = _did_not_fit(report, r.title, r.change, tried, log)
                    continue
                r.tried_images_per_s = tried.images_per_s
                r.tried_gain = measured_gain(tried.images_per_s, e2e.images_per_s)
                report.tries.append((r.title, r.change, tried))
            report.recommendations, report.not_faster = rank_after_tries(recos)
            winners = sorted((r for r in tryable if (r.tried_gain or 0) >= MIN_GAIN), key=lambda r: -r.tried_gain)
            if len(winners) >= 2:
                change = _merge([r.change for r in winners])
                label = "combined: " + " + ".join(r.title for r in winners)
                trying = f"combined try of {' + '.join(r.title for r in winners)}"
                tried = phase(label, lambda: _try(rcfg, change, info, bundle, opts, label))
                if isinstance(tried, str):
                    _did_not_fit(report, label, change, tried, log)
                else:
                    report.tries.append((label, change, tried))
        except BaseException as e:  # Ctrl-C, SIGTERM, or what they broke under the try (engine/stops.the_stop)
            stop = the_stop(e)
            # or a worker killed otherwise (the out-of-memory killer, a decoder's crash): ends the doctor as a stop
            # does, with train's one line in place of the stop's
            crash = worker_crash(e, cfg.data.source, bundle, cfg.data.labels) if stop is None else None
            if stop is None and crash is None:
                raise
            report.recommendations, report.not_faster = rank_after_tries(recos)
            report.stop = stop or crash
            if crash is not None:
                report.stopped = f"{worker_signal(e).name} killed a data loader worker during the {trying}"
            else:
                report.stopped = f"{stop.signal_name if isinstance(stop, Terminated) else 'Ctrl-C'} during the {trying}"
            log(f"doctor: stopped during the {trying}: writing the report of what was measured before it")
    report.marks = marks
    if sampler:
        report.telemetry = report_dir / "telemetry.csv"
        # no timeline of a CSV cut short (the disk refused it); a picture that fails is said, not a failure
        report.telemetry_png = plot_unless_failed(sampler, log, marks)
        report.telemetry_failed = sampler.failed
    return report


def compile_cost_note(r: Recommendation, device_type: str) -> str:
    """A line before a try that compiles on the CPU: it compiles first, which there can take minutes with no other
    line (ResNet-50 on 2 cores: over 2.5 minutes); "" for any other try."""
    if device_type == "cuda" or (r.change or {}).get("speed", {}).get("compile", "off") == "off":
        return ""
    return (
        f"doctor: the try of {r.title} compiles first, untimed: on the CPU that takes tens of seconds for a small "
        "model and minutes for a large one (a stop keeps the report of what was measured)"
    )


def long_compiles_note(asked: Config, measured: Config, train_samples: int) -> str:
    """A line where `cnnpar train` would compile this config with a long compile that the doctor, timing a few
    steps, left off (`harness.as_measured`): its figures are then those of the default compile; "" otherwise."""
    wanted = {name: getattr(asked.speed, name) for name in LONG_COMPILES}
    # the processes `cnnpar train --nproc N` would start (one unless asked; a torchrun started by hand is not known)
    processes = max(1, asked.dist.nproc)
    as_trained = replace(measured, speed=replace(measured.speed, **wanted))
    trained, line = long_compiles_resolved(as_trained, train_samples, processes)
    if not line or not any(getattr(trained.speed, n) == "on" != getattr(measured.speed, n) for n in LONG_COMPILES):
        return ""
    return (
        "doctor: the figures below are the default compile's; `cnnpar train` with this config would compile "
        f"longer, for a faster step: {line.removeprefix('long compiles: ')}"
    )


def advice_command(cfg: Config, f: Facts, r: Recommendation) -> str:
    """The user's own command line with the recommendation applied, ready to paste."""
    if r.key == "pre-decode":
        return prepare_then_train(cfg, f.input_size)
    if not r.change:
        return r.action
    # a new run with the change: the user's --name (a folder that holds a run: refused) and --resume (a finished
    # run: "nothing to do"; an unfinished one continued with the change) left out, as prepare_then_train does
    change = advised_change(cfg, f, r)
    change = {**change, "run": {**change.get("run", {}), "name": "", "resume": ""}}
    return command_line(cfg, change)


def advised_change(cfg: Config, f: Facts, r: Recommendation) -> dict:
    """The settings a recommendation changes, a larger batch's lr with it (batch_advice_lr): the command to paste,
    its try and doctor.json's `change` must agree, or a tool applying the JSON's change trains at the old lr."""
    if r.key != "batch":
        return r.change
    return {**r.change, "optim": batch_advice_lr(cfg, f, r.change["run"]["batch_size"])}


def batch_advice_lr(cfg: Config, f: Facts, batch: int) -> dict:
    """The lr (and the batch it is for) of an advised `batch`: the lr the measured batch trained at, scaled by the rule
    --batch-size auto uses (config.batch_lr_factor). A fixed --batch-size trains at --lr as it is, so the command
    with only the batch changed trained 4x the batch at the smaller batch's lr (an --lr auto at batch 64, 0.002 at
    256 too: 1/4 of the optimizer steps at the same step size), though the advice called the change a speed-up."""
    optim = cfg.optim
    now = asked_lr(optim)
    if not cfg.run.batch_size:  # auto: the lr was scaled from --lr-batch to the batch measured
        now *= batch_lr_factor(optim.optimizer, f.batch_size, lr_reference(cfg))
    # 4 significant digits: a line to paste; the rule's own rounding is no finer
    return {"lr": float(f"{now * batch_lr_factor(optim.optimizer, batch, f.batch_size):.4g}"), "lr_batch": batch}


def _measure_baseline(
    cfg: Config, info, bundle, opts: DoctorOptions, phase
) -> tuple[Config, list[Phase], Facts, Config]:
    """Pipeline alone, step alone (full and half batch), GPU idle share, end to end; then the facts, and the config
    as it ran (workers, format, augment and the other autos resolved, as a run's config.toml holds them)."""
    trainer = build_trainer(cfg, info, bundle)
    batch = trainer.cfg.run.batch_size
    try:
        with memory_full_said("the training step", batch, bundle.shape, info.device, TRAINING_WAYS):
            return _baseline_of(trainer, info, bundle, opts, phase)
    finally:
        trainer.close()  # its workers and decoders go now, not in the interpreter's exit hooks


def _baseline_of(trainer, info, bundle, opts: DoctorOptions, phase) -> tuple[Config, list[Phase], Facts, Config]:
    warm, steps, max_s = opts.warmup, opts.steps, opts.max_s
    rcfg = trainer.cfg
    # the batch that runs, as the Trainer resolved it: one larger than the training split is capped to the split
    batch = rcfg.run.batch_size
    capped = batch < trainer.batch_asked
    pipe = phase("input pipeline", lambda: measure_pipeline(trainer, warm, steps, max_s))
    x, y = first_batch(trainer)
    # (a capped batch always has the Trainer's line, which says the size asked for and the cap)
    batch_from = trainer.batch_line or (
        "--batch-size" if trainer.requested_cfg.run.batch_size else "auto: the CPU's fixed default"
    )
    if info.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(info.device)
    if y.shape[0] >= 2 and rcfg.speed.compile == "off":  # (a new batch shape would recompile)
        step, half = phase("train step", lambda: measure_step_scaling(trainer, x, y, warm, steps, max_s))
        phases = [pipe, step, half]
        fixed = fixed_cost(step, half)
    else:
        step = phase("train step", lambda: measure_step(trainer, x, y, warm, steps, max_s))
        phases, fixed = [pipe, step], None
    idle = None
    if info.device.type == "cuda":
        idle = phase("GPU idle share", lambda: gpu_idle_share(trainer, x, y, step.s_per_batch))
    peak_share = used = total = None
    if info.device.type == "cuda":
        total = torch.cuda.get_device_properties(info.device).total_memory
        used = torch.cuda.max_memory_allocated(info.device)
        peak_share = used / total
    e2e = phase("end to end", lambda: measure_end_to_end(trainer, warm, steps, max_s))
    phases.append(e2e)
    cores = usable_cores()
    resolved = data_resolved(rcfg, bundle, trainer.train_loader, trainer.train_step.cuda_graphs)
    ran = resolved.data
    facts = Facts(
        device_type=info.device.type,
        batch_size=batch,
        workers=ran.workers,
        loader=rcfg.data.loader,
        in_memory=bundle.in_memory,
        # (a store's pixel area on the device counts as resident: its cropper reads batches in place)
        resident=ran.resident == "on",
        precision=rcfg.speed.precision,
        channels_last=rcfg.speed.channels_last,
        compile=rcfg.speed.compile,
        cores=cores,
        cores_note=quota_note(cores),
        data_s=pipe.s_per_image,
        step_s=step.s_per_image,
        e2e_s=e2e.s_per_image,
        data_wait_share=e2e.data_wait_share,
        fixed_step_s=fixed,
        gpu_idle_share=idle,
        textbook_ratio=textbook_cost_ratio(trainer),
        bf16_supported=bf16_on(info.device),  # as train's --precision auto decides it: native bf16 on a CPU too
        peak_mem_share=peak_share,
        data_source=rcfg.data.source,
        data_labels=rcfg.data.labels,
        data_format=detect_format(rcfg.data.source, rcfg.data.format),
        input_size=bundle.shape[-1],
        model=rcfg.model.name,
        image_shape="x".join(map(str, bundle.shape)),
        mem_used_bytes=used,
        mem_total_bytes=total,
        batch_from=batch_from,
        data_under_one_batch=capped,
        batch_limit=trainer.batch_limit,
        cuda_graphs=graphs_fact(trainer),
        load_avg_1m=_load_avg(),
        omp_wait_policy=os.environ.get("OMP_WAIT_POLICY", ""),
    )
    if wants_batch_search(facts) and not trainer.batch_line:  # (a searched batch needs no second search)
        facts.searched_batch, facts.searched_gain = phase("batch sizes", lambda: _search_batch(trainer, bundle))
    return rcfg, phases, facts, resolved


def _load_avg() -> float | None:
    """The 1-minute load average, for the report: a busy host explains figures that do not add up."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # not on every platform
        return None


def graphs_fact(trainer: Trainer) -> str:
    """The CUDA-graph fact: on, off (they could run: the advice may suggest them) or n/a, by the Trainer's
    own rule (a GPU decoder with too few device queues included), so the advice never suggests what the
    run refused."""
    if trainer.use_graphs:
        return "on"
    return "n/a" if trainer.graphs_blocked_reason() else "off"


def _search_batch(trainer: Trainer, bundle) -> tuple[int | None, float | None]:
    """The batch the search picks, and its step speed per image over the current batch's, both timed
    with the same probe (the run's TrainStep on random inputs)."""
    cfg, info = trainer.cfg, trainer.info
    measure = device_probe(
        trainer.raw_model, cfg, info, bundle.shape, bundle.num_classes, trainer.train_step.cuda_graphs
    )
    cap = batch_cap(len(bundle.train), 1)
    start, _ = search_start(decodes_on_gpu(cfg, bundle), cap, min(bundle.shape[1:]))
    choice = choose_batch_size(measure, memory_budget(info.device), cap, start=start)
    probes = {p.batch: p for p in choice.probes if not p.failed}
    current = probes.get(cfg.run.batch_size) or measure(cfg.run.batch_size)
    best = probes.get(choice.batch)
    if best is None or current.failed or not current.images_per_s:
        return None, None
    return choice.batch, best.images_per_s / current.images_per_s


# a try that runs out of memory: the baseline fitted and was measured, so the report is written without this change
TRY_WAYS = "the measured baseline's (this change is not advised)"


def _try(cfg: Config, change: dict, info, bundle, opts: DoctorOptions, label: str) -> Phase | str:
    """The try of `change` measured end to end; or, where it runs out of device memory, the line that says so."""
    trainer = build_trainer(with_overrides(cfg, **change), info, bundle)
    said = memory_full_said(f"the try of {label}", trainer.cfg.run.batch_size, bundle.shape, info.device, TRY_WAYS)
    try:
        with said:
            return measure_end_to_end(trainer, opts.warmup, opts.steps, opts.max_s, name=f"tried: {label}")
    except DeviceMemoryFull as e:
        return str(e)
    finally:
        trainer.close()
        del trainer
        free_device_memory(info.device)  # (an out-of-memory error's tensors too, before the next try)


def _did_not_fit(report: DoctorReport, label: str, change: dict, line: str, log) -> str:
    report.did_not_fit.append((label, change, line))
    log(f"doctor: {line}")
    return line
