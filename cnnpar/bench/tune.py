"""`cnnpar tune`: measure the speed switches on the user's model, data and device; keep the fastest.

A greedy coordinate search in order of expected gain: the batch size (doubled while it pays),
then compile and CUDA graphs, then the data path (resident data, workers, decoder), then memory
layout and precision; the long compiles (inductor's tiling and tuning, max-autotune) come last whatever they may
gain, because a trial that cannot finish its compile within its limit takes that limit from every trial
after it (an H200 tuning ResNet-18 spent 180 s on max-autotune, cut off, and three trials were then
skipped for time: call ZZF). A change is kept only when it is faster than the best so far by more than
the noise margin. Each trial is the real Trainer in a child process (bench/trial.py says why):
a warm-up epoch (compile and cuDNN autotuning happen there), then timed epochs of `steps` steps;
the median images/s counts. Last, the best config is measured once more (`Tuner.check`), and, where a trial was
kept, the start's config too; every trial before them leaves them the start trial's time each: a host whose speed
changed during the run is said, not hidden in the comparisons.

Time: the start trial may use the whole budget; every later trial gets at most `trial_s` (by
default the larger of a third of the budget and 1.5x the start trial's wall time) and never more
than what is left, and is killed at that limit and reported as cut off. No trial starts with
less than MIN_TRIAL_S left, nor, after the start, with a limit shorter than the start trial took:
every trial starts a process, builds, compiles, warms up and measures its own Trainer, so it would
most likely be cut off before it measured (on an H200 a trial was started with 8 s of 200 left after a
start trial of 42 s: call ZZB). So the run ends within the budget plus the seconds a kill and the
files take. `tuned.toml` (and the trials' CSV) is rewritten atomically after the start trial and
after every trial that beats the best so far, so the best config measured is on disk whenever
the run ends.

This module imports no torch in the parent: the children measure, the parent plans and writes.
"""

from __future__ import annotations

import contextlib
import math
import shlex
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, replace
from pathlib import Path

from cnnpar.config import (
    LONG_COMPILES,
    MACHINE_FIELDS,
    SECTIONS,
    Config,
    auto_number,
    cli_option,
    dumps_toml,
    from_dict,
    to_dict,
)
from cnnpar.console import say_stop_line
from cnnpar.errors import UserError, raise_pending_stop
from cnnpar.parallel.stem import has_stem_to_rewrite
from cnnpar.report.files import (
    check_out_file,
    check_out_folder,
    output_folder,
    refuse_earlier_results,
    refuse_unnameable_out_file,
    write_csv_atomic,
    write_errors_explained,
    write_text_atomic,
)

from .timing import START_FACTOR, TRIAL_SHARE, TRIAL_SHARE_WORDS
from .trial import CUT_OFF, FAILED, OK, ChildResult, run_child, say

KEEP_MARGIN = 1.03  # a change must be 3 % faster to be kept: smaller gains are within run-to-run noise
# ... and its slowest repeat faster than the best's fastest: on a busy host the repeats of one config spread over
# more than 3 % (a median 3.30x "faster" overlapped the start's range on a loaded 2-core CPU, and measured 0.18x
# when run again), and a gain inside that spread is no measurement of the change
MIN_TRIAL_S = 5.0  # less than a child needs to import torch and build a model: no trial starts with less
END_RESERVE = 0.03  # share of the budget held back for the last kill and the files
# the budget suggested at least when the start trial could not even start: the default config's start trial took
# 26 s on a 2-core CPU host, begun 4 s after the command was; a minute lets a start of that size finish
START_BUDGET_S = 60.0
GROUPS = ("batch size", "compile and CUDA graphs", "data", "layout and precision", "long compiles")
START, KEPT, SKIPPED = "start", "kept", "skipped"
# the last trial: the best config measured once more. The trials run one after another, and a host whose speed
# changed between them (other work started or ended: a shared CPU machine, a GPU whose host decodes photos) makes
# their comparisons meaningless without anything in their own repeats showing it; the best config measured again
# shows it. Its status: AGREES, or CHANGED when the two measurements' repeats do not overlap and the medians differ
# by more than KEEP_MARGIN, the gain a trial needs to be kept (a 2-core CPU host running other work measured one
# config 1.1x apart within a minute)
CHECK_GROUP, CHECK_SWITCH, CHECK_VALUE = "check", "best config", "measured again"
# ... and where a trial was kept, the start's config measured again after it: the best config measured again
# cannot show a start trial measured while the host was slow, which makes every later trial read as a gain (a
# stand-in start at half speed let a change that gained nothing be kept as 2x, its check agreeing); the two measured
# back to back are the gain tuned.toml reports
CHECK_START = "start config"
AGREES, CHANGED = "agrees", "unsteady"
# measured, but the trial ran without the change: the Trainer turns a switch off where it cannot apply (CUDA graphs
# beside --grad-accum or DDP, resident data that does not fit), so its rate is the config's before it again
NOT_APPLIED = "not applied"
# a trial whose training loss was not finite in its timed epochs: tune times speed, but a config that does not train
# (fp16 overflowing where bf16 trains) was kept as the faster one
DIVERGED = "its training loss was not finite (diverged): not kept, whatever its speed"
TUNED_MARK = "# written by `cnnpar tune`"  # heads tuned.toml's last comment line: how --config knows a tune result

TRIAL_COLUMNS = [
    "group",
    "switch",
    "value",
    "status",
    "images_per_s",
    "images_per_s_min",
    "images_per_s_max",
    "vs_start",
    "warmup_s",
    "wall_s",
    "limit_s",
    "note",
]


class BudgetTooSmall(UserError):
    """The start trial got too little of --budget-s: not started (start-up left less than MIN_TRIAL_S), or cut off at
    the budget's end. Nothing was measured and nothing is written, as for bad data at the start: the budget is the
    user's input, and a larger one (`budget_s`, suggested) is the remedy; the CLI adds the command to rerun."""

    def __init__(self, message: str, budget_s: float) -> None:
        super().__init__(message)
        self.budget_s = budget_s


@dataclass
class Trial:
    group: str
    switch: str
    value: str
    status: str  # start, kept, ok (measured, not kept), not applied (measured without it), failed, cut off, skipped
    images_per_s: float | None = None
    images_per_s_min: float | None = None
    images_per_s_max: float | None = None
    warmup_s: float | None = None
    wall_s: float = 0.0
    limit_s: float = 0.0
    note: str = ""  # the lr rule of a batch trial, the error, the limit, or why it was skipped

    def take(self, value: dict) -> None:
        """The rates a child measured (its median, slowest and fastest repeats) and its warm-up."""
        self.images_per_s, self.images_per_s_min = value["images_per_s"], value["images_per_s_min"]
        self.images_per_s_max, self.warmup_s = value["images_per_s_max"], value["warmup_s"]


def with_switch(cfg: Config, section: str, name: str, value) -> Config:
    return replace(cfg, **{section: replace(getattr(cfg, section), **{name: value})})


# ---- the child's side ---------------------------------------------------------------------------
def measure(cfg: Config, info, bundle, steps: int, repeats: int, log: Callable[[str], None] = print) -> dict:
    """Median train images/s over `repeats` epochs of `steps` steps, after one warm-up epoch.

    The one place the tuner drives the Trainer's step (build, compile warm-up, epochs)."""
    from cnnpar.engine.harness import build_trainer

    cfg = replace(cfg, run=replace(cfg.run, max_steps=steps, epochs=repeats + 1, eval_every=10**6))
    t0 = time.perf_counter()
    trainer = build_trainer(cfg, info, bundle)
    try:
        log(f"built in {time.perf_counter() - t0:.1f} s; warming up (compile {trainer.cfg.speed.compile}) ...")
        trainer.warm_up_compile()
        trainer.train_epoch(1)
        warm = time.perf_counter() - t0
        # the steps an epoch really takes: fewer than asked where the data holds fewer batches
        timed = trainer.steps_per_epoch
        log(f"warm-up done in {warm:.1f} s (compile {trainer.compile_s:.1f} s); timing {repeats} x {timed} steps")
        rates, losses = [], []
        for e in range(2, repeats + 2):
            epoch = trainer.train_epoch(e)
            rates.append(epoch["images_per_s"])
            losses.append(epoch["train_loss"])
            log(f"repeat {e - 1}/{repeats}: {rates[-1]:,.0f} img/s")
    finally:
        trainer.close()
    return {
        "images_per_s": statistics.median(rates),
        "images_per_s_min": min(rates),
        "images_per_s_max": max(rates),
        "warmup_s": warm,
        "compile_s": trainer.compile_s,
        "resolved": resolved_switches(trainer),
        "stem_fits": has_stem_to_rewrite(trainer.raw_model),
        # a fast config that does not train (fp16 overflowing) is no speed-up: the parent keeps no trial without it
        "loss_finite": all(math.isfinite(loss) for loss in losses),
    }


def resolved_switches(trainer) -> dict[str, dict]:
    """What the trial really ran with ("auto" resolved, as the run's config.toml stores it), for
    tuned.toml and the next trials."""
    from cnnpar.engine.resolved import data_resolved

    ran = data_resolved(trainer.cfg, trainer.bundle, trainer.train_loader, trainer.use_graphs)
    cfg = to_dict(ran)
    out = {sec: {name: cfg[sec][name] for name in names} for sec, names in MACHINE_FIELDS.items()}
    out["run"] = {"batch_size": trainer.cfg.run.batch_size}
    out["optim"] = {"lr": trainer.cfg.optim.lr}  # --batch-size auto scales it with the batch it found
    return out


def measure_in_child(spec: dict) -> dict:
    import torch

    from cnnpar.data import load_data
    from cnnpar.data.folder import ImageFolderDataset
    from cnnpar.dist import init_distributed
    from cnnpar.report.environment import environment

    cfg = from_dict(spec["config"], origin="tune trial")
    info = init_distributed(cfg.speed.device, debug_single=True)
    bundle = load_data(cfg.data, cfg.run.seed)
    say(f"data: {bundle.origin}, {len(bundle.train)} training samples")
    result = measure(cfg, info, bundle, spec["steps"], spec["repeats"], log=say)
    cuda = info.device.type == "cuda"
    result["facts"] = {
        "device_type": info.device.type,
        "bf16_ok": bool(torch.cuda.is_bf16_supported()) if cuda else True,
        "in_memory": bundle.in_memory,
        "folder": isinstance(bundle.train, ImageFolderDataset),
        "train_samples": len(bundle.train),
        "stem_fits": result["stem_fits"],
        "env": environment(info.device),
    }
    return result


# ---- the parent's side --------------------------------------------------------------------------
def child_trial(steps: int, repeats: int, log: Callable[[str], None]) -> Callable[[Config, float], ChildResult]:
    def run(cfg: Config, limit_s: float) -> ChildResult:
        spec = {"kind": "train", "config": to_dict(cfg), "steps": steps, "repeats": repeats}
        return run_child(spec, limit_s, log)

    return run


def batch_lr(cfg: Config, factor: int) -> tuple[float, str]:
    """The lr for a batch `factor` times larger: by the rule `--batch-size auto` uses (config.batch_lr_factor: linear
    for SGD and Muon's SGD groups, square root for AdamW), so a tuned batch carries the lr a searched one would have.
    --lr-scaling is not applied here: `cnnpar train` scales by it with the processes x accumulation only, never with
    the per-process batch, and does so on top of this lr when it trains tuned.toml (a trial scaling the batch by it
    had AdamW's kept batch at a linear lr where --batch-size auto gives the square root). A config whose --lr is still
    auto (no trial resolved it) starts from the optimizer's own (config.asked_lr)."""
    from cnnpar.config import asked_lr, batch_lr_factor, lr_rule

    o = cfg.optim
    lr = asked_lr(o) * batch_lr_factor(o.optimizer, factor, reference=1)
    note = f"lr {asked_lr(o):g} -> {lr:.3g} ({lr_rule(o.optimizer)} of the batch ratio, as --batch-size auto)"
    if o.lr_scaling != "none":  # a user who set it may expect it here: say where it acts instead
        note += f"; --lr-scaling {o.lr_scaling} scales it with the processes x accumulation, as in cnnpar train"
    return lr, note


def batch_steps_note(batch: int, factor: int) -> str:
    """What a batch trial changes in training, beside its speed: an epoch's optimizer steps."""
    return f"batch {batch} -> {batch * factor}: 1/{factor} of the optimizer steps an epoch"


def ema_note(ema: float, factor: int) -> str:
    """What a batch trial changes in an --ema average, or "" without one: its decay is per step, so the same
    ~1/(1 - decay) steps it spans hold `factor` x the images."""
    return f"; --ema {ema:g} averages over the same ~{1 / (1 - ema):.0f} steps, so {factor}x the images" if ema else ""


def precision_note(before: str, after: str) -> str:
    """What a precision trial changes in training, beside its speed: the arithmetic each step rounds to."""
    scaler = "; fp16's GradScaler skips the steps whose gradients overflow" if after == "fp16" else ""
    return f"{before} -> {after}: the step's arithmetic rounded differently{scaler}"


# the switches whose kept trial changes what the model learns, not only how fast it trains (their trials' notes say
# how): the others (compile, CUDA graphs, layout, the data path, the stem) run the same maths to rounding
TRAINING_SWITCHES = ("batch_size", "precision")


def accuracy_line(trials: list[Trial]) -> str:
    """What tune did not measure, and the kept changes that need it: tune times images/s alone, so a kept batch size
    (fewer optimizer steps an epoch, another lr) or precision went into tuned.toml as a speed-up, its accuracy never
    looked at, without a word."""
    kept = {t.switch: t for t in trials if t.status == KEPT and t.switch in TRAINING_SWITCHES}  # the last of each
    if not kept:
        return "speed only: tune measured images/s, not accuracy; the switches kept here train the same maths"
    named = "; ".join(f"{t.switch}={t.value} ({t.note})" for t in kept.values())
    return (
        f"speed only: tune measured images/s, not accuracy, and kept changes of training: {named}; train with this "
        "config and with the start's, and compare their validation accuracy before relying on it"
    )


def held_note(section: str, name: str) -> str:
    field = next(f for f in fields(getattr(Config(), section)) if f.name == name)
    return f"held: you typed {cli_option(field)} (leave it out to let tune try other values)"


def typed_settings(given: dict) -> frozenset[str]:
    """The settings typed on the command line ("speed.precision"), from argparse's namespace of dotted keys, that
    name a value rather than auto: tune holds them. A number is auto only in its own field's terms: --workers 0 (no
    worker process, as a read-only /dev/shm needs) was taken for auto, and tune tried 1 and 2 workers."""
    known = {f"{sec}.{f.name}": f for sec in SECTIONS for f in fields(getattr(Config(), sec))}

    def auto(key: str, value: object) -> bool:
        number = auto_number(known[key]) if key in known else None
        return value == "auto" or (number is not None and not isinstance(value, bool) and value == number)

    return frozenset(k for k, v in given.items() if "." in k and not auto(k, v))


def not_applicable(best: Config, name: str) -> str:
    """Why a trial of `switch_groups` would measure nothing on top of the best config so far ("" if it would)."""
    if name == "compile_tuning" and best.speed.compile not in ("default", "reduce-overhead"):
        return f"tunes a compile in default or reduce-overhead mode; the best so far has {best.speed.compile}"
    if name == "compile_tiling" and best.speed.compile == "off":
        return "changes the compiled kernels; the best so far runs uncompiled"
    return ""


def switch_groups(cfg: Config, facts: dict) -> list[tuple[str, list[tuple[str, str, str, object]]]]:
    """The trials after the batch size: (group, [(label, section, field, value), ...]) in order."""
    cuda = facts["device_type"] == "cuda"
    s, d = cfg.speed, cfg.data
    comp = [("compile", "speed", "compile", "default" if s.compile == "off" else "off")]
    long = []  # tried after every other group (the module's docstring says why)
    if cuda:
        comp.append(("cuda_graphs", "speed", "cuda_graphs", "off" if s.cuda_graphs == "on" else "on"))
        # the start trial resolved their "auto" as its own short run does (off): each is tried on here
        if s.compile_tiling != "on":  # ResNet-50 224 on an H200: 1.057x, for a compile 2-2.5 min longer
            long.append(("compile_tiling", "speed", "compile_tiling", "on"))
        if s.compile_tuning != "on":  # ResNet-18 32 px on an H200: 1.022-1.044x, for a compile minutes longer
            long.append(("compile_tuning", "speed", "compile_tuning", "on"))
        if s.compile != "max-autotune-no-cudagraphs":  # the longest compile of all: the very last trial
            long.append(("compile", "speed", "compile", "max-autotune-no-cudagraphs"))
    data = []
    if facts["in_memory"] and cuda:
        data.append(("resident", "data", "resident", "off" if d.resident == "on" else "on"))
    if not facts["in_memory"]:
        w = max(1, d.workers)
        data += [("workers", "data", "workers", v) for v in sorted({max(1, w // 2), 2 * w} - {d.workers})]
        if facts["folder"] and cuda:
            data.append(("decode", "data", "decode", "cpu" if d.decode != "cpu" else "gpu"))
    last = [("channels_last", "speed", "channels_last", "off" if s.channels_last == "on" else "on")]
    if cuda and facts.get("stem_fits"):
        # on by default with CUDA from ResNet-50 on an H200 (+4.4-4.8 %); another GPU's cuDNN may differ
        last.append(
            ("stem_space_to_depth", "speed", "stem_space_to_depth", "off" if s.stem_space_to_depth == "on" else "on")
        )
    if cuda:
        # bf16 where the GPU has it and fp16 with a GradScaler; never fp32: ResNet-50 on an H200 ran
        # 1,008 img/s in fp32 against 5,388 in bf16 (tune at 5bfa0df, shared/measurements/h200-2026-11-30)
        kinds = (["bf16"] if facts["bf16_ok"] else []) + ["fp16"]
        last += [("precision", "speed", "precision", k) for k in kinds if k != s.precision]
    else:
        last.append(("precision", "speed", "precision", "fp32" if s.precision == "bf16" else "bf16"))
    return [(GROUPS[1], comp), (GROUPS[2], data), (GROUPS[3], last), (GROUPS[4], long)]


class Tuner:
    def __init__(
        self,
        budget_s: float,
        out: Path,
        trial_s: float,
        run_trial: Callable[[Config, float], ChildResult],
        clock: Callable[[], float],
        started: float,
        log: Callable[[str], None],
    ) -> None:
        self.budget_s, self.out, self.trial_s = budget_s, Path(out), trial_s
        self.run_trial, self.clock, self.t0, self.log = run_trial, clock, started, log
        self.deadline = started + budget_s * (1 - END_RESERVE)
        self.trials: list[Trial] = []
        self.best_cfg: Config | None = None
        self.best = self.start_rate = self.start_wall_s = 0.0
        self.start_cfg: Config | None = None
        self.start_max = self.start_min = 0.0  # the start trial's fastest and slowest repeats
        self.best_max = self.best_min = 0.0  # the best config's fastest and slowest repeats
        self.cap = trial_s
        self.env: dict = {}
        self.facts: dict = {}  # what the start trial found out about the device and the data
        self.warning = ""  # the check's finding when the host's speed changed during the run ("" if it did not)

    def left(self) -> float:
        return self.deadline - self.clock()

    def limit(self, start: bool = False, check: bool = False) -> tuple[float, str]:
        """The next trial's time limit, and why it may not start ("" when it may): the module's docstring says why.
        A trial other than the start and the checks leaves each check the start trial's time: the long compiles
        took all that was left, and the check was skipped in both GPU runs of session 29 (calls ZZZZF, ZZZZG)."""
        left = self.left()
        checks = 2 if any(t.status == KEPT for t in self.trials) else 1  # the start is measured again too then
        keep = 0.0 if start or check else checks * self.start_wall_s
        limit = left if start else min(self.cap, left - keep)
        if left < MIN_TRIAL_S:
            # whole seconds down: 4.6 s rounded read "5 s left, under the 5 s a trial needs at least"
            return limit, f"time budget spent ({math.floor(max(0.0, left))} s left)"
        if not start and limit < self.start_wall_s:
            kept = f", {keep:.0f} s kept for the check" if keep else ""
            return max(0.0, limit), (
                f"a limit of {max(0.0, limit):.0f} s{kept}, shorter than the start trial's {self.start_wall_s:.0f} s"
            )
        return limit, ""

    def say(self, text: str) -> None:
        self.log(f"tune [{self.clock() - self.t0:4.0f} s] {text}")

    def attempt(self, group: str, label: str, value, cfg: Config, note: str = "") -> Trial:
        """Measure `cfg` in a child within the time left; record the trial, keep it if it wins."""
        raise_pending_stop()  # a stop whose raise was dropped (in a finaliser of the last trial's): no trial after it
        name = f"{label}={value}" if label != START else "start (your config, resolved here)"
        limit, why = self.limit(start=label == START)
        if why:
            t = Trial(group, label, str(value), SKIPPED, note=why)
            self.trials.append(t)
            return t
        self.say(f"{name}{' (' + note + ')' if note else ''}, limit {limit:.0f} s ...")
        r = self.run_trial(cfg, limit)
        t = Trial(group, label, str(value), r.status, wall_s=r.wall_s, limit_s=limit, note=note)
        if r.status != OK:
            if label == START and r.value.get("user_error"):
                # bad input, not a speed that failed: every trial would fail on it, and a trials file of one
                # failed row would measure nothing; the same one-line error as `cnnpar train` on this data
                raise UserError(r.value["user_error"])
            t.note = "; ".join(x for x in (note, r.error) if x)
            self.trials.append(t)
            self.say(f"{name}: {r.status} ({r.error})")
            return t
        v = r.value
        t.take(v)
        spread = f"{t.images_per_s_min:,.0f}-{t.images_per_s_max:,.0f}"
        if label == START:
            t.status = START
            self.start_rate, self.start_wall_s = t.images_per_s, t.wall_s
            self.best_cfg = self.start_cfg = merge_resolved(cfg, v["resolved"])
            self.best, self.facts = t.images_per_s, v.get("facts", {})
            self.best_max, self.best_min = t.images_per_s_max, t.images_per_s_min
            self.start_max, self.start_min = t.images_per_s_max, t.images_per_s_min
            self.env = self.facts.get("env", {})
            self.trials.append(t)
            self.say(f"start: {t.images_per_s:,.0f} img/s ({spread}), warm-up {t.warmup_s:.1f} s")
            self.write()
            return t
        if not v.get("loss_finite", True):  # measured, but it diverged: never kept, whatever its speed
            t.status = FAILED
            t.note = "; ".join(x for x in (t.note, DIVERGED) if x)
            self.trials.append(t)
            self.say(f"{name}: {t.images_per_s:,.0f} img/s ({spread}), but {DIVERGED}")
            return t
        ran = next((str(vals[label]) for vals in v["resolved"].values() if label in vals), str(value))
        if ran != str(value):
            t.status = NOT_APPLIED
            t.note = "; ".join(x for x in (t.note, f"ran with {label}={ran} here: measures no change; not kept") if x)
            self.trials.append(t)
            self.say(f"{name}: {t.images_per_s:,.0f} img/s ({spread}), but {t.note}")
            return t
        faster = t.images_per_s > self.best * KEEP_MARGIN
        kept = faster and t.images_per_s_min > self.best_max
        slower = ""
        if faster and not kept:
            noise = (
                f"inside the noise: its slowest repeat {t.images_per_s_min:,.0f} img/s is not above the best's "
                f"fastest {self.best_max:,.0f}"
            )
            t.note = "; ".join(x for x in (t.note, noise) if x)
        elif not faster and t.images_per_s > self.best:
            # faster, but by less than the margin: the repeats' wording for a slowdown read oddly here
            slower = f"{t.images_per_s / self.best - 1:.1%} faster, under the {KEEP_MARGIN - 1:.0%} a trial must gain"
            t.note = "; ".join(x for x in (t.note, slower) if x)
        elif not faster and t.images_per_s_max >= self.best_min:
            # a slower median whose repeats reach into the best's is no measured slowdown either: a loaded host
            # spread one config's repeats over 191-284 img/s, and a trial's 127-251 read as 0.74x
            slower = (
                f"inside the noise: its fastest repeat {t.images_per_s_max:,.0f} img/s is not below the best's "
                f"slowest {self.best_min:,.0f}"
            )
            t.note = "; ".join(x for x in (t.note, slower) if x)
        ratio = t.images_per_s / self.best
        self.trials.append(t)
        if kept:
            t.status = KEPT
            self.best, self.best_cfg = t.images_per_s, merge_resolved(cfg, v["resolved"])
            self.best_max, self.best_min = t.images_per_s_max, t.images_per_s_min
            self.write()
        self.say(
            f"{name}: {t.images_per_s:,.0f} img/s ({spread}), {ratio:.2f}x the best so far"
            + (f"; kept, wrote {self.out}" if kept else f"; not kept: {noise}" if faster else "")
            + (f"; {slower}" if slower else "")
        )
        return t

    def start(self, cfg: Config) -> dict | None:
        """The reference trial: the user's config as `cnnpar train` would resolve it here."""
        t = self.attempt("start", START, "resolved defaults", cfg)
        if t.status != START:
            return None
        if not self.cap:
            self.cap = max(self.budget_s * TRIAL_SHARE, START_FACTOR * t.wall_s)
        return self.facts

    def check(self) -> None:
        """The best config measured once more after every other trial, and the start's config too where a trial was
        kept (CHECK_GROUP and CHECK_START say why); sets `warning` when a second measurement is not the first's."""
        if not any(t.images_per_s for t in self.trials if t.status != START):
            return  # nothing was compared with the start: no comparison to check
        best = self.measure_again(CHECK_SWITCH, self.best_cfg, self.best, self.best_min, self.best_max)
        if not any(t.status == KEPT for t in self.trials):
            return  # the best config is the start's: measured again already
        start = self.measure_again(CHECK_START, self.start_cfg, self.start_rate, self.start_min, self.start_max)
        if best.images_per_s and start.images_per_s:
            gain = best.images_per_s / start.images_per_s
            start.note += f"; measured back to back, the best config ran {gain:.2f}x the start's"
            self.say(f"check: measured back to back, the best config ran {gain:.2f}x the start's")

    def measure_again(self, switch: str, cfg: Config, rate: float, slowest: float, fastest: float) -> Trial:
        """One check row: `cfg`, first measured at `rate` (repeats `slowest`-`fastest`), measured once more."""
        what = "the best config" if switch == CHECK_SWITCH else "the start's config"
        limit, why = self.limit(check=True)
        if why:
            unchecked = "the comparisons are unchecked" if switch == CHECK_SWITCH else "the gain over it is unchecked"
            t = Trial(
                CHECK_GROUP, switch, CHECK_VALUE, SKIPPED, note=f"{why}: {what} was not measured again, so {unchecked}"
            )
            self.trials.append(t)
            return t
        self.say(f"{what} once more, to check the host ran every trial at one speed, limit {limit:.0f} s ...")
        r = self.run_trial(cfg, limit)
        t = Trial(CHECK_GROUP, switch, CHECK_VALUE, r.status, wall_s=r.wall_s, limit_s=limit)
        self.trials.append(t)
        if r.status != OK:
            t.note = f"{what} did not measure again ({r.error}): the comparisons are unchecked"
            self.say(t.note)
            return t
        t.take(r.value)
        ratio = t.images_per_s / rate
        overlap = t.images_per_s_min <= fastest and t.images_per_s_max >= slowest
        same = f"{t.images_per_s:,.0f} img/s now against {rate:,.0f} when it was measured ({ratio:.2f}x)"
        if 1 / KEEP_MARGIN <= ratio <= KEEP_MARGIN:
            t.status, t.note = AGREES, same
            self.say(f"check: {what} ran {same}: the host kept its speed")
            return t
        if overlap:  # far apart, but the repeats spread as far: no change shown, and "kept its speed" said 0.46x
            t.status = AGREES
            t.note = (
                f"{same}, within the repeats ({t.images_per_s_min:,.0f}-{t.images_per_s_max:,.0f} img/s now, "
                f"{slowest:,.0f}-{fastest:,.0f} then): the repeats spread too widely to show whether the host kept "
                "its speed; more --repeats or an otherwise idle machine narrow them"
            )
            self.say(f"check: {what} ran {t.note}")
            return t
        t.status = CHANGED
        t.note = (
            f"{what} ran {same}, apart by more than the {KEEP_MARGIN - 1:.0%} a trial must gain to be "
            "kept and outside both measurements' repeats: this machine's speed varied while the trials ran (other "
            "work on it, or more noise than the repeats showed), so the trials' comparisons may not hold; run "
            "cnnpar tune again while the machine is otherwise idle, or with more --repeats"
        )
        self.warning = "; ".join(x for x in (self.warning, t.note) if x)
        self.say(f"check: {t.note}")
        return t

    def batch_trials(self, facts: dict) -> None:
        """Double the batch while it pays: stop at no clear gain, a failure (out of memory), a cut-off,
        or when an epoch would hold fewer than two batches."""
        base = self.best_cfg
        b, factor = base.run.batch_size, 2
        while b * factor <= facts["train_samples"] // 2:
            lr, note = batch_lr(base, factor)
            # a change of training: tuned.toml's header names it
            note = f"{batch_steps_note(b, factor)}, {note}{ema_note(base.optim.ema, factor)}"
            cfg = replace(base, run=replace(base.run, batch_size=b * factor), optim=replace(base.optim, lr=lr))
            t = self.attempt(GROUPS[0], "batch_size", b * factor, cfg, note)
            if t.status != KEPT:
                return
            factor *= 2

    def write(self) -> None:
        write_tuned(self.best_cfg, self.trials, self.out, self.env, self.warning)


def merge_resolved(cfg: Config, resolved: dict[str, dict]) -> Config:
    """`cfg` with what its trial resolved, except the long compiles' "auto": a trial is a short run, where it is
    off, and tuned.toml must not pin that off for the long run it is meant for (`tune` pins "off" only where a
    trial measured "on" and did not keep it).

    Its lr is the one the trial trained at its batch (--batch-size auto scaled from the preset's --lr-batch, a batch
    trial's `batch_lr`), so `optim.lr_batch` is set to that batch: a file keeping the preset's lr_batch (or 0, read
    as 64) made `cnnpar train --config tuned.toml --batch-size auto` scale the already scaled lr a second time."""
    raw = to_dict(cfg)
    for sec, values in resolved.items():
        raw[sec].update(values)
    if raw["run"]["batch_size"]:  # still auto (0) only where the trial reported no batch: its lr is still the asked one
        raw["optim"]["lr_batch"] = raw["run"]["batch_size"]
    for name in LONG_COMPILES:
        if getattr(cfg.speed, name) == "auto":
            raw["speed"][name] = "auto"
    return from_dict(raw, origin="tune trial")


def tune(
    cfg: Config,
    budget_s: float,
    out: str | Path,
    trial_s: float = 0.0,
    steps: int = 20,
    repeats: int = 3,
    run_trial: Callable[[Config, float], ChildResult] | None = None,
    clock: Callable[[], float] = time.monotonic,
    started: float | None = None,
    log: Callable[[str], None] = print,
    config_read: str | Path | None = None,
    held: frozenset[str] = frozenset(),
) -> tuple[Config | None, list[Trial]]:
    """Search; returns the best config measured (None when not even the start finished) and the trials.
    Raises UserError, writing no file, when the start fails on bad input (data that does not load or decode).
    `config_read`: the --config the start came from; never removed, even where it is `out`. `held`: the settings
    ("speed.precision") the user typed: their trials are skipped, saying so (a typed --precision fp32 was tuned to
    bf16, and --batch-size 32 to 512, without a word). `out` is made by the caller (`tuned_file`), and left to it:
    a start that fails or is stopped writes nothing, and the caller removes the folder it made for it."""
    check_out(Path(out), config_read)
    run_trial = run_trial or child_trial(steps, repeats, log)
    tuner = Tuner(budget_s, Path(out), trial_s, run_trial, clock, clock() if started is None else started, log)
    _, why = tuner.limit(start=True)
    if why:  # known before any work: start-up left no time to start a trial in
        skipped = Trial("start", START, "resolved defaults", SKIPPED, note=why)
        raise BudgetTooSmall(too_small_line(skipped, budget_s), retry_budget_s(skipped, budget_s))
    unlimited = budget_s == float("inf")  # --budget-s inf: "budget inf s" read like a figure
    limit = (
        f"each trial at most {trial_s:.0f} s"
        if trial_s
        else "each trial without a time limit"
        if unlimited
        else f"each trial at most {TRIAL_SHARE_WORDS} of it or {START_FACTOR:g}x the start trial's time, whichever is "
        "longer"
    )
    budget = "no time limit (--budget-s inf)" if unlimited else f"{budget_s:.0f} s"
    log(
        f"tune: budget {budget}, {limit}; in this order: {', '.join(GROUPS)}. "
        f"{tuner.out} is rewritten after every trial that beats the best so far."
    )
    from cnnpar.dist import apple_gpu_note

    if note := apple_gpu_note(cfg.speed.device):  # said here: the trials' children say it into logs nobody is shown
        log(note)
    # once the start is measured, tuned.toml stays whatever happens after (a stopped run keeps the best config it
    # measured)
    facts = tuner.start(cfg)
    if facts is None and (budget := retry_budget_s(tuner.trials[0], budget_s)):
        # the budget, not the config, kept the start from measuring: refused in one line (exit 2) with no trials file,
        # as bad data at the start is; it ended 1 after a CSV of one unmeasured row, as a failure of the tool
        raise BudgetTooSmall(too_small_line(tuner.trials[0], budget_s), budget)
    if facts is None:  # the start did not measure this machine: its columns from here (not the child's)
        from cnnpar.dist import pick_device
        from cnnpar.report.environment import environment

        env = environment(pick_device(cfg.speed.device, 0))
        csv = tuner.out.with_suffix(".csv")
        with write_errors_explained(csv, f"{ROOM}; {as_before([csv])}"):
            write_csv_atomic(csv, trial_rows(tuner.trials, env), CSV_COLUMNS)
        # (an --out holding any other file was refused before the start: check_out)
        if tuner.out.is_file() and _same_file(tuner.out, config_read):
            log(f"tune: kept {tuner.out}: it is the --config this run started from, not a result of it")
        return None, tuner.trials
    try:
        _search(tuner, facts, held)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the best config measured stays, and the last line says where
        csv = tuner.out.with_suffix(".csv")
        measured = sum(t.images_per_s is not None for t in tuner.trials)
        trials = f"{len(tuner.trials)} trial(s), {measured} measured"
        try:
            tuner.write()  # the trials since the last improvement too
        except UserError as failed:
            # said, and the stop raised on: the write's error alone (exit 2) hid that the signal had ended the tune,
            # and the stop's exit status (130 or 143) is what a script or scheduler checks
            say_stop_line(f"tune: stopped; its last results could not be written: {failed}", log)
        else:
            say_stop_line(
                f"tune: stopped; the best config so far ({trials}) is in {tuner.out} (the trials in {csv})", log
            )
        raise
    return tuner.best_cfg, tuner.trials


def _search(tuner: Tuner, facts: dict, held: frozenset[str]) -> None:
    """Every trial after the start, then the check."""
    if "run.batch_size" in held:
        tuner.trials.append(Trial(GROUPS[0], "batch_size", "doubled", SKIPPED, note=held_note("run", "batch_size")))
    else:
        tuner.batch_trials(facts)
    for group, changes in switch_groups(tuner.best_cfg, facts):
        for label, section, name, value in changes:
            if getattr(getattr(tuner.best_cfg, section), name) == value:
                continue  # a kept trial may have made this the current value already
            why = held_note(section, name) if f"{section}.{name}" in held else not_applicable(tuner.best_cfg, name)
            if why:  # recorded, not measured
                tuner.trials.append(Trial(group, label, str(value), SKIPPED, note=why))
                continue
            note = precision_note(tuner.best_cfg.speed.precision, value) if name == "precision" else ""
            t = tuner.attempt(group, label, value, with_switch(tuner.best_cfg, section, name, value), note)
            if name in LONG_COMPILES and t.status == OK:  # measured, not faster enough to keep: off, not auto
                tuner.best_cfg = with_switch(tuner.best_cfg, section, name, "off")
                tuner.write()  # on disk now: the next trial (max-autotune, the longest) may be interrupted
    tuner.check()
    tuner.write()  # the trials after the last improvement (skipped, cut off) go into the CSV too


def _same_file(a: Path, b: str | Path | None) -> bool:
    return b is not None and Path(b).exists() and a.resolve() == Path(b).resolve()


TUNED_NAME = "tuned.toml"  # the config's name in the default folder


def tune_results(out: Path) -> list[Path]:
    """What a tune writes for --out `out`: the config, and its trials beside it with the suffix .csv."""
    return [out, out.with_suffix(".csv")]


@contextlib.contextmanager
def tuned_file(given: str, out_root: str | Path, model: str, config_read: str | Path | None = None) -> Iterator[Path]:
    """The --out a tune writes, checked (`check_out`) before the folder for it is made: `given`, or else tuned.toml in
    a new OUT_ROOT/tune/<model>-YYYYMMDD-HHMMSS/ (`stamped_folder`), as bench, doctor and profile name theirs: the
    default was tuned.toml in the current folder, and a second tune there wrote over the first's without a word. A
    tune that fails or is stopped before it wrote its trials (bad data at the start) leaves no folder it made;
    once they are written the folder stays (a stopped tune keeps the best config it measured)."""
    if given:
        check_out(Path(given), config_read)
    else:
        check_out_folder(out_root, "--out-dir")
    name = Path(given).name if given else TUNED_NAME
    written = lambda folder: any(path.exists() for path in tune_results(folder / name))  # noqa: E731
    # a claim of --out's own: two tunes may write two configs into one folder, not one config
    claim = f".{name}.lock"
    with output_folder(
        str(Path(given).parent) if given else "",
        Path(out_root) / "tune",
        model,
        written,
        claim=claim,
        said=f"tune --out {given}",
    ) as folder:
        yield folder / name


def check_out(out: Path, config_read: str | Path | None = None) -> None:
    """--out is the config file, and its trials go beside it with the suffix .csv: checked before any trial (a
    folder, or one where no file can be made, failed at the first write, after the start trial, and `x.csv` made the
    two files one). Either already there is an earlier tune's result (or another file), refused as bench refuses an
    --out holding results, unless --out is the --config this run starts from (`config_read`): re-tuning a tuned
    config in place rewrites both, as asked."""
    refuse_unnameable_out_file(out, "tune --out")
    trials = out.with_suffix(".csv")
    blocked = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
    if blocked is not None:  # else a FileExistsError from making the folder
        raise UserError(f"tune --out {out}: {blocked} is a file: expected a folder there, or another --out")
    if out.is_dir():
        raise UserError(f"tune --out {out}: is a folder: expected a file name, such as {out / TUNED_NAME}")
    if trials == out:
        raise UserError(
            f"tune --out {out}: the trials go to the same name with .csv: expected a config file name not ending "
            f"in .csv, such as {out.with_suffix('.toml')}"
        )
    if trials.is_dir():
        raise UserError(
            f"tune --out {out}: its trials would go to {trials}, a folder: expected a name whose .csv is free"
        )
    if not _same_file(out, config_read):
        again = f" or --config {out} (to re-tune that config in place)" if out.is_file() else ""
        refuse_earlier_results("tune", "--out", out, tune_results(out), instead=f"another --out{again}")
    # a folder where no file can be made (read-only): the start trial ran, then a traceback at the first write
    check_out_file(out, "tune --out")


def retry_budget_s(start: Trial, budget_s: float) -> float | None:
    """The --budget-s to suggest when the start trial had too little time (cut off, or never started); None when
    it failed for another reason, which more time does not mend."""
    if start.status == CUT_OFF:
        return 2 * budget_s
    if start.status == SKIPPED:
        return max(2 * budget_s, START_BUDGET_S)
    return None


def too_small_line(start: Trial, budget_s: float) -> str:
    """Why --budget-s `budget_s` measured nothing: the start trial (`retry_budget_s` says it had too little time)."""
    first = "the first trial ('start', the config as given)"
    if start.status == CUT_OFF:
        return f"tune --budget-s {budget_s:g}: {first} needs more than that here ({start.note})"
    # what start-up left is known before any trial: a budget can start one only with MIN_TRIAL_S left after it
    return (
        f"tune --budget-s {budget_s:g}: {first} could not start: {start.note}, under the {MIN_TRIAL_S:g} s a trial "
        "needs at least"
    )


ENV_COLUMNS = ["device", "torch", "world_size", "git_rev", "date"]
CSV_COLUMNS = TRIAL_COLUMNS + ENV_COLUMNS


def trial_rows(trials: list[Trial], env: dict) -> list[dict]:
    start = next((t.images_per_s for t in trials if t.status == START), None)
    rows = []
    for t in trials:
        row = {**t.__dict__, **{k: env.get(k, "") for k in ENV_COLUMNS}}
        row["vs_start"] = round(t.images_per_s / start, 4) if t.images_per_s and start else ""
        rows.append(row)
    return rows


def write_tuned(cfg: Config, trials: list[Trial], out: Path, env: dict, warning: str = "") -> None:
    """tuned.toml (the best config so far, resolved) and tuned.csv (every trial), each atomically; `warning`, the
    check's finding, heads tuned.toml where the host's speed changed during the run."""
    from cnnpar.report.environment import comment_lines

    best = max((t for t in trials if t.status in (START, KEPT)), key=lambda t: t.images_per_s)
    start = next(t for t in trials if t.status == START)
    header = comment_lines(env)
    header += (
        f"# best so far: {best.switch}={best.value}, {best.images_per_s:,.0f} img/s "
        f"({best.images_per_s / start.images_per_s:.2f}x the start's {start.images_per_s:,.0f}), "
        f"after {len(trials)} trial(s), {sum(t.images_per_s is not None for t in trials)} of them measured\n"
    )
    again = back_to_back(trials)
    header += f"# measured again at the end, back to back: {again}\n" if again else ""
    header += f"# warning: {warning}\n" if warning else ""
    header += f"# {accuracy_line(trials)}\n"
    header += "".join(f"# {line}\n" for line in unmeasured_lines(trials))
    # quoted: a folder name with a space made the command break where it was pasted
    header += f"{TUNED_MARK}; train with: {shlex.join(['cnnpar', 'train', '--config', str(out)])}\n"
    csv = out.with_suffix(".csv")
    # a write that fails (a full disk) replaces nothing: each file is replaced whole or not at all (atomic_write)
    with write_errors_explained(out, f"{ROOM}; {as_before([out, csv])}"):
        write_text_atomic(out, header + dumps_toml(cfg))
    with write_errors_explained(csv, f"{ROOM}; {out} holds the best config so far, whole; {as_before([csv])}"):
        write_csv_atomic(csv, trial_rows(trials, env), CSV_COLUMNS)


# the end of a line for a result of tune's that cannot be written (`write_errors_explained`): it ended in a traceback
# mid-search, and nothing said that the files written before it were whole
ROOM = "expected room for tune's results (free disk space, a higher file size limit)"


def as_before(paths: list[Path]) -> str:
    """What a failed write left of `paths`: those there before, whole, or that none was written."""
    there = [str(p) for p in paths if p.is_file()]
    if not there:
        return f"{' and '.join(str(p) for p in paths)}: not written"
    return f"{' and '.join(there)} {'stays' if len(there) == 1 else 'stay'} as before, whole"


def back_to_back(trials: list[Trial]) -> str:
    """The best and the start's config as the check measured them one after the other ("" unless it measured both):
    the gain least touched by a host whose speed changed during the search."""
    again = {t.switch: t.images_per_s for t in trials if t.group == CHECK_GROUP and t.images_per_s}
    best, start = again.get(CHECK_SWITCH), again.get(CHECK_START)
    if not (best and start):
        return ""
    return f"the best config {best:,.0f} img/s, the start's {start:,.0f} ({best / start:.2f}x)"


def unmeasured_lines(trials: list[Trial]) -> list[str]:
    """What tuned.toml's figures leave out: trials skipped, failed or cut off (their switches stand as started),
    and a check that did not run. The file said only "best so far", exit 0, where every trial after the start had
    been skipped or the comparisons were unchecked."""
    lines = []
    for status in (SKIPPED, CUT_OFF, FAILED):
        missed = [t for t in trials if t.status == status and t.group != CHECK_GROUP]
        if missed:
            named = ", ".join(f"{t.switch}={t.value}" for t in missed)
            lines.append(f"not measured ({status}): {named}; these switches stand as the start ran them")
    for check in (t for t in trials if t.group == CHECK_GROUP and t.status not in (AGREES, CHANGED)):
        lines.append(f"unchecked: {check.note}")
    return lines


def format_table(trials: list[Trial]) -> str:
    start = next((t.images_per_s for t in trials if t.status == START), None)
    lines = [f"{'group':<24} {'switch':<14} {'value':<28} {'img/s':>10} {'vs start':>9}  status"]
    for t in trials:
        rate = f"{t.images_per_s:,.0f}" if t.images_per_s else "-"
        ratio = f"{t.images_per_s / start:.2f}x" if t.images_per_s and start else "-"
        note = f"  ({t.note})" if t.note else ""
        lines.append(f"{t.group:<24} {t.switch:<14} {t.value:<28} {rate:>10} {ratio:>9}  {t.status}{note}")
    return "\n".join(lines)
