"""`cnnpar` subcommands: parse, build, run; nothing else. Clean-up happens in `finally`."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
import tempfile
import time
import warnings
from pathlib import Path

from cnnpar.console import rate_text
from cnnpar.errors import (
    SIGPIPE,
    ConfigError,
    DeviceMemoryFull,
    EveryRankRefused,
    Terminated,
    UserError,
    ctrl_c_noted,
    raise_pending_stop,
    say_user_error,
    stop_for,
    user_error_text,
)
from cnnpar.report.files import TEXT
from cnnpar.torchrun import (  # (imports no torch)
    RUN_DIR_NOTE_ENV,
    failure_note,
    memory_full_note,
    reader_gone_note,
    refusal_note,
)


def _rank() -> int:
    value = os.environ.get("RANK", "0")
    return int(value) if value.strip().isdigit() else 0  # a RANK that is no number is refused (dist.check_launch_env)


def _of_a_job() -> bool:
    """A rank of a job of several processes, by the launcher's variables (whole numbers: others are refused)."""
    rank, world = os.environ.get("RANK", ""), os.environ.get("WORLD_SIZE", "1")
    return rank.strip().isdigit() and world.strip().isdigit() and world.strip() != "1"


def _run_folder_kept(note: str) -> bool:
    """Whether the run folder this launch's rank 0 noted (RUN_DIR_NOTE_ENV) is there: none noted yet, or one removed
    as a run that failed before its first epoch's is, keeps nothing for the launcher's line to tell."""
    try:
        run_dir = Path(note).read_text(**TEXT)
    except OSError:  # not noted yet
        return False
    return bool(run_dir) and Path(run_dir).is_dir()  # ("" would be Path("."), a folder)


def tell_the_job_this_rank_ended(error: BaseException | None = None) -> None:
    """Under torchrun, a rank that ends before its start is exchanged (argparse's refusal, a bad config) writes so
    where the other ranks wait for it (dist.say_this_rank_ended_before_joining), and one that ends after it, before
    the process group formed, its `error`; a no-op, importing nothing, in any other process."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        from cnnpar.dist import say_this_rank_ended_before_joining

        say_this_rank_ended_before_joining(error)


def torchrun_command(nproc: int, train_args: list[str]) -> list[str]:
    """torchrun on this machine (cnnpar.torchrun: torch's, its end said in one line) running `cnnpar train
    train_args` in each of nproc processes. The `--` ends torchrun's own options: its parser reads every argument
    as a possible abbreviation of one of them, so without it `--monitor` is refused as an ambiguous
    `--monitor-interval`."""
    head = [sys.executable, "-m", "cnnpar.torchrun", "--standalone", f"--nproc_per_node={nproc}", "-m", "--"]
    return [*head, "cnnpar", "train", *train_args]


def stop_said_marker(note: Path) -> Path:
    """Beside the run-folder note: rank 0 has printed the stop line itself (a Ctrl-C reaches every process of the
    group), or a worker crash's line that says what was kept, and the launcher's own would say it a second time."""
    return note.with_name(note.name + ".said")


def launch_continue_command(note: Path, run_dir: str, nproc: int) -> str:
    """The command that continues the launch's run folder `run_dir`: its --resume with as many processes, and the
    half batch of a rank that ran out of memory (a plain --resume runs out of memory again)."""
    return shlex.join(["cnnpar", "train", "--resume", run_dir, "--nproc", str(nproc)]) + fitting_flags(note)


def fitting_flags(note: Path) -> str:
    """The half batch and doubled accumulation (" --batch-size 16 --grad-accum 2") a rank that ran out of memory noted
    (memory_full_note, written in main); "" where none did."""
    fitting = memory_full_note(note)
    return fitting.read_text(**TEXT) if fitting.is_file() else ""


def noted_failure(note: Path) -> dict:
    """A rank's own error as it wrote it for this launcher (torchrun.failure_note): its line, and whether the
    launcher adds what is kept."""
    import json

    return json.loads(failure_note(note).read_text(**TEXT))


def launch_note() -> str | None:
    """This rank's launcher's run-folder note (RUN_DIR_NOTE_ENV), None outside a rank of `--nproc`'s launch."""
    return os.environ.get(RUN_DIR_NOTE_ENV) if "RANK" in os.environ else None


def launch_end_line(note: Path, nproc: int) -> str:
    """The launcher's line when its workers failed or were stopped: what the run folder's checkpoint keeps and
    the command that continues it ("" where rank 0 has said it)."""
    from cnnpar.engine.checkpoint import checkpoint_epoch
    from cnnpar.engine.rundir import RunFolderInUse, refuse_a_live_run, stopped_line

    if stop_said_marker(note).is_file():
        return ""
    if not note.is_file():
        return "stopped before training began: this launch saved no epoch (the same command starts it again)"
    run_dir = note.read_text(**TEXT)
    try:
        refuse_a_live_run(Path(run_dir))  # this launch's workers are gone: a claim still held is another run's
    except RunFolderInUse:
        return f"stopped before training began: {run_dir} belongs to a run still in progress"
    # a rank ran out of memory: starting it again as it was would, again
    return stopped_line(
        run_dir, checkpoint_epoch(run_dir), launch_continue_command(note, run_dir, nproc), fitting_flags(note)
    )


def launch_failure_lines(note: Path, nproc: int) -> tuple[str, str]:
    """The launcher's lines when a rank ended on an error of its own (torchrun.failure_note): that error, said once
    with its rank and, where the checkpoint holds an epoch, what it keeps and the command that continues, on the same
    line, as one process says it (for stderr); and the end line on what is kept where no epoch is (for stdout, "" for
    none)."""
    from cnnpar.engine.checkpoint import checkpoint_epoch
    from cnnpar.engine.rundir import kept_line

    said = noted_failure(note)
    error = f"cnnpar: error: {said['line']}"
    if not said["add_kept"]:  # the line says what is kept itself (rank 0's, a divergence's)
        return error, ""
    # rank 0's marker that it said what is kept: where its own error's line did, that line was left to this note too
    # (run_command), which another rank's came before (every rank out of memory at one step)
    stop_said_marker(note).unlink(missing_ok=True)
    end = launch_end_line(note, nproc)
    run_dir = note.read_text(**TEXT) if end and note.is_file() else ""
    saved = checkpoint_epoch(run_dir) if run_dir else 0  # read now: every worker has ended
    if saved:
        return f"{error}; {kept_line(run_dir, saved, launch_continue_command(note, run_dir, nproc))}", ""
    return error, end


def horovod_train_args(argv: list[str], nproc: int) -> list[str]:
    """The user's `cnnpar train` arguments for a horovodrun launch: without --nproc (horovodrun starts the
    processes) and --strategy (dist.horovod_command adds its own), with `--nproc 0` where a config file or
    preset set nproc (it would start torchrun again)."""
    from cnnpar.cliargs import passthrough_args

    args = passthrough_args(argv, "--nproc")
    typed = len(args) < len(argv)
    args = passthrough_args(args, "--strategy")
    return args + ["--nproc", "0"] if nproc > 0 and not typed else args


def nproc_not_launched(nproc: int) -> str:
    """The note of rank 0 of a torchrun started by hand whose --nproc (typed, or from a config file) asks for
    another count of processes on this node than torchrun started: --nproc launches torchrun itself, so under one
    it does nothing, and only the record's `# requested:` line said so. "" for another rank, the workers of
    `--nproc`'s own launcher, or where the counts agree."""
    from cnnpar.dist import LAUNCHED_NPROC_ENV, launcher_rank, launcher_world_size

    here = os.environ.get("LOCAL_WORLD_SIZE", "").strip()
    here = int(here) if here.isdigit() else launcher_world_size()
    if launcher_rank() != 0 or LAUNCHED_NPROC_ENV in os.environ or nproc == here:
        return ""
    return (
        f"cnnpar: note: --nproc {nproc} not launched: torchrun started the processes ({here} on this node, "
        f"{launcher_world_size()} in the job); --nproc starts torchrun itself, on one machine"
    )


def check_model(cfg) -> None:
    """A misspelt --model refused at once: before the data loads, and before --nproc starts torchrun's workers
    (each of which would load the data and then fail alike)."""
    from cnnpar.models.registry import check_model_name

    check_model_name(cfg.model.name, "model.name (--model) =")


def cmd_train(args: argparse.Namespace, argv: list[str]) -> int:
    from cnnpar.cliargs import config_and_set_aside_lr
    from cnnpar.dist import (
        LAUNCHED_NPROC_ENV,
        check_horovod_launch,
        check_launch_env,
        debug_single_requested,
        destroy_distributed,
        exchange_starts,
        init_distributed,
        launched_by_torchrun,
        launcher_env,
        pick_device,
        run_launcher,
        surplus_debug_worker,
    )

    cfg, set_aside_lr = config_and_set_aside_lr(args)
    check_model(cfg)
    from cnnpar.engine.rundir import refuse_unwritable_run_place

    # before the data loads (each rank its own, before the ranks meet). Every rank, not rank 0 alone: under --monitor
    # the first process of each other machine writes telemetry_rank<N>.csv into the run folder too, and under
    # horovodrun no start exchange (exchange_starts) tells the other ranks that rank 0 refused, so they would go on
    # without it; the probe is one file made and removed
    refuse_unwritable_run_place(cfg)
    check_launch_env(cfg.dist.debug_single)  # before anything waits for another rank
    if cfg.dist.nproc > 0 and launched_by_torchrun() and not debug_single_requested(cfg.dist.debug_single):
        if line := nproc_not_launched(cfg.dist.nproc):
            print(line, file=sys.stderr, flush=True)
    # every rank's start, exchanged before anything else waits for another rank: one refused on its own node
    # (a mistyped flag, a bad config) ended before it, and has said so (main: tell_the_job_this_rank_ended); the
    # debug switch on some ranks only is refused here
    exchange_starts(cfg.dist.debug_single, cfg.dist.timeout_s)
    if surplus_debug_worker(cfg.dist.debug_single):
        return 0  # the debug switch runs one process: global rank 0 alone
    if cfg.dist.strategy == "horovod" and debug_single_requested(cfg.dist.debug_single):
        # under horovodrun the switch was ignored (every rank trained); outside it, refused with a horovodrun command
        raise ConfigError("--debug-single runs one process on DDP's path: expected it without --strategy horovod")
    if cfg.dist.strategy == "horovod":
        check_horovod_launch(cfg.dist.nproc, horovod_train_args(argv, cfg.dist.nproc))
    if cfg.dist.nproc > 0 and not launched_by_torchrun() and not debug_single_requested(cfg.dist.debug_single):
        # The convenience launcher: hand the same command to torchrun for this one machine.
        # Refuse too many processes, or --sync-bn off GPUs, here, once, rather than in each of the N workers.
        try:
            device = pick_device(cfg.speed.device, 0, cfg.dist.nproc)
        except ConfigError as e:
            if "dist.nproc" in vars(args):
                raise
            # not typed: it came from a run's record (--config, --resume) or a preset, which the user may not know
            raise ConfigError(
                f"{e} (--nproc {cfg.dist.nproc} comes from the stored config: pass --nproc to change it)"
            ) from None
        if cfg.dist.sync_bn and cfg.dist.nproc > 1:  # one process has nothing to synchronise: a no-op there
            from cnnpar.parallel.apply import refuse_sync_bn_on

            refuse_sync_bn_on(device)
        if cfg.run.resume == "auto" and not cfg.run.name:  # --standalone's job id is new at every launch
            from cnnpar.engine.rundir import NO_NAME_TO_RESUME

            raise UserError(NO_NAME_TO_RESUME)
        # --nproc stays in the workers' arguments (torchrun sets RANK and WORLD_SIZE there: none launches again); the
        # run's record holds the launch (LAUNCHED_NPROC_ENV), so `--config` of that record starts as many again
        cmd = torchrun_command(cfg.dist.nproc, argv)
        # NCCL's flight-recorder dumps land beside the runs, not in /tmp where nobody looks. A file
        # prefix, not a folder: files appear only on a timeout, and run-folder scans see no new folder.
        out_root = Path(cfg.run.out_dir)
        out_root.mkdir(parents=True, exist_ok=True)
        print("cnnpar: launching", " ".join(cmd), flush=True)
        env = launcher_env(dict(os.environ), str(out_root / "nccl_trace_rank_"))
        from cnnpar.process_tree import owned_temp_folder

        # the next launch removes this folder where this process is killed outright (SIGKILL: no clean-up runs)
        with owned_temp_folder("cnnpar-launch-") as notes:
            note = Path(notes) / "run_dir"
            env.update({LAUNCHED_NPROC_ENV: str(cfg.dist.nproc), RUN_DIR_NOTE_ENV: str(note)})
            try:
                rc = run_launcher(cmd, env)
            except KeyboardInterrupt:
                if failure_note(note).is_file():  # a rank's error the stop overtook: its rank left it to this line
                    print(f"cnnpar: error: {noted_failure(note)['line']}", file=sys.stderr, flush=True)
                if line := launch_end_line(note, cfg.dist.nproc):
                    print(line, flush=True)
                raise
            if rc != 0 and refusal_note(note).is_file():  # every rank refused alike: said once, as one process does
                print(f"cnnpar: error: {refusal_note(note).read_text(**TEXT)}", file=sys.stderr, flush=True)
                return 2
            if rc != 0 and failure_note(note).is_file():  # a rank's own error: said once, as one process does
                error, end = launch_failure_lines(note, cfg.dist.nproc)
                print(error, file=sys.stderr, flush=True)
                if end:
                    print(end, flush=True)
                return 2
            if rc != 0 and note.is_file() and (line := launch_end_line(note, cfg.dist.nproc)):
                print(line, flush=True)  # a rank that failed before it chose a folder said why itself
            return rc
    teardown = destroy_distributed
    try:
        if cfg.dist.strategy == "horovod":
            from cnnpar.parallel.horovod import init_horovod, shutdown_horovod

            info, teardown = init_horovod(cfg.speed.device), shutdown_horovod
        else:
            info = init_distributed(cfg.speed.device, cfg.dist.debug_single, cfg.dist.timeout_s)
        if not info.is_main:
            warnings.filterwarnings("ignore")  # rank 0 speaks for the job; others speak only on failure
        from cnnpar.engine.trainer import Trainer

        settings_from = Path(args.config).read_text(**TEXT) if getattr(args, "config", None) else ""
        trainer = Trainer(cfg, info, settings_from=settings_from, set_aside_lr=set_aside_lr)
        note = os.environ.get(RUN_DIR_NOTE_ENV) if info.is_main else None
        if note:  # for the launcher's last line (launch_end_line)
            Path(note).write_text(str(trainer.run_dir), **TEXT)
        try:
            result = trainer.fit()
        except (KeyboardInterrupt, UserError) as e:  # a stop, or an error after a saved epoch: what is kept was said
            if note and trainer.stop_said:
                stop_said_marker(Path(note)).touch()
            if isinstance(e, UserError):
                say_the_failure_to_the_launcher(e, args, trainer.stop_said)
            raise
        if info.is_main:
            best = result.summary.get("best_val_acc")
            # an accuracy on validation files that are training files must not travel alone
            caveat = (
                " (validation holds training files: see the warning above)" if result.summary.get("val_overlap") else ""
            )
            best_text = f"best val acc {100 * best:.2f}%{caveat} | " if best is not None else ""
            last, best_epoch = result.summary.get("final_val_acc"), result.summary.get("best_epoch")
            if best is not None and best_epoch != result.summary.get("epochs") and last is not None:
                # the best figure alone read as ckpt/last.pt's, which resume and predict read by default
                kept = (
                    "its weights in ckpt/best.pt"
                    if result.summary.get("best_ckpt_epoch") == best_epoch
                    else "its weights not kept (ckpt/best.pt holds "
                    + (
                        f"epoch {result.summary['best_ckpt_epoch']})"
                        if result.summary.get("best_ckpt_epoch")
                        else "none)"
                    )
                )
                best_text = (
                    f"best val acc {100 * best:.2f}%{caveat} at epoch {best_epoch}, {kept}; ckpt/last.pt holds the "
                    f"last epoch's weights, val acc {100 * last:.2f}% | "
                )
            if result.summary.get("average_started") is False:  # the start-up note said why
                best_text += "the weight average never started: the results are the trained weights' | "
            overall = result.summary.get("images_per_s_with_eval")
            if overall:  # the epochs' lines leave out the evaluations and checkpoints between them
                s = result.summary
                # disjoint intervals inside train_s, so `rest` is >= 0 but for rounding
                rest = s["train_s"] - s["epochs_s"] - s["eval_s"] - s["checkpoint_s"]
                first, last = s["attempt_epochs"]
                # one epoch resumed is "epoch 2", not "epochs 2-2"
                span = f"epoch {first}" if first == last else f"epochs {first}-{last}"
                scope = f" ({span}, resumed)" if first > 1 else ""
                best_text += (
                    f"{s['images_trained']:,} images trained{scope} in {s['train_s']:.1f} s with the evaluations and "
                    f"checkpoints: {rate_text(overall)} img/s (epochs {s['epochs_s']:.1f} s, evaluations "
                    f"{s['eval_s']:.1f} s, checkpoints {s['checkpoint_s']:.1f} s, the rest {max(rest, 0.0):.1f} s) | "
                )
            print(f"done: {best_text}run folder {result.run_dir}")
        return 0
    except KeyboardInterrupt as stop:
        say_the_reader_gone_to_the_job(stop)  # before the teardown: the other ranks learn of it as the sockets close
        raise
    finally:
        teardown()


def say_the_failure_to_the_launcher(e: UserError, args: argparse.Namespace, kept_said: bool) -> None:
    """A rank of `--nproc` whose training ended on an error of its own writes it for its launcher (torchrun.
    failure_note), which says it once: before this rank leaves the process group, so that the other ranks, whose
    collectives then find it gone, already see it (run_command) and end quietly. The first rank's error is said;
    a refusal every rank raised alike has its own note. `kept_said`: the line names what the checkpoint keeps
    (rank 0's, which reads it). A no-op outside `--nproc`'s launcher."""
    import json

    from cnnpar.engine.trainer import SAID_WITH_WHAT_IS_KEPT
    from cnnpar.report.files import write_text_first

    note = launch_note()
    if not note or isinstance(e, EveryRankRefused) or failure_note(note).is_file():
        return
    prefix = f"[rank {_rank()}] " if _of_a_job() else ""
    said = {
        "line": f"{prefix}{user_error_text(e)}{_preset_data_note(args, e)}",
        "add_kept": isinstance(e, SAID_WITH_WHAT_IS_KEPT) and not kept_said,
    }
    with contextlib.suppress(OSError):  # the rank says it itself (run_command), as before
        write_text_first(failure_note(note), json.dumps(said))  # two ranks failing at once: the first one's stays


def a_rank_failure_noted() -> bool:
    """A rank of this `--nproc` launch ended on an error of its own, which its launcher says
    (say_the_failure_to_the_launcher)."""
    note = launch_note()
    return bool(note) and failure_note(note).is_file()


def say_the_reader_gone_to_the_job(stop: KeyboardInterrupt) -> None:
    """A rank of `--nproc` stopped as its output's reader went away (console.StopWhenGone) notes it beside the
    launcher's run-folder note (torchrun.reader_gone_note): that stop is the job's, as a Ctrl-C is, and the other
    ranks and torchrun say nothing of its end. A no-op for any other stop, or outside `--nproc`'s launcher."""
    note = os.environ.get(RUN_DIR_NOTE_ENV)
    if note and isinstance(stop, Terminated) and stop.signum == SIGPIPE:
        with contextlib.suppress(OSError):  # the stop goes on without it, as before
            reader_gone_note(note).touch()


def reader_gone_in_the_job() -> bool:
    """A rank of this `--nproc` launch stopped as the output's reader went away (say_the_reader_gone_to_the_job)."""
    note = os.environ.get(RUN_DIR_NOTE_ENV)
    return bool(note) and reader_gone_note(note).is_file()


def cmd_profile(args: argparse.Namespace, argv: list[str]) -> int:
    from cnnpar.cliargs import config_from_args
    from cnnpar.dist import destroy_distributed, init_distributed
    from cnnpar.doctor.profile import run_profile

    cfg = config_from_args(args)
    check_model(cfg)
    if cfg.dist.nproc > 0 and "RANK" not in os.environ:  # it would profile one process and say nothing
        raise ConfigError(
            f"profile runs in this process: --nproc {cfg.dist.nproc} (typed or from the config) is not launched; "
            "expected --nproc 0, or torchrun --nproc_per_node N -m cnnpar profile ... for a trace per rank"
        )
    opts = profile_options(args)
    info = init_distributed(cfg.speed.device, cfg.dist.debug_single, cfg.dist.timeout_s)
    try:
        files = run_profile(cfg, info, opts)
        if info.is_main:
            print(files.table_md.read_text(**TEXT))
            print("Where the recorded steps' time went:\n" + files.reading.read_text(**TEXT))
            print(
                f"trace: {files.trace} (open in https://ui.perfetto.dev); tables: {files.table_txt}, {files.table_md}; "
                f"reading: {files.reading}"
            )
        return 0
    finally:
        destroy_distributed()


def profile_options(args: argparse.Namespace):
    from cnnpar.doctor.options import ProfileOptions

    return ProfileOptions(
        args.prof_wait, args.prof_warmup, args.prof_active, args.row_limit, args.report_dir, args.all_threads
    )


def doctor_options(args: argparse.Namespace):
    from cnnpar.doctor.options import DoctorOptions

    return DoctorOptions(args.warmup_steps, args.measure_steps, args.max_seconds, args.try_top, args.report_dir)


def one_process_only(command: str, cfg, then: str = "then train with --nproc {n}", reads_nproc: bool = True) -> bool:
    """doctor, tune and bench measure one process, with no launcher of their own: with --nproc N > 1, or under
    torchrun, their figures would stand for N processes (in the doctor's advice, in tune's config) and nothing would
    say so; each of torchrun's ranks ran a whole bench on the first device, the figures of N at once. Refused, except
    with the debug switch, which runs one process as it does for train; True for a surplus worker of that switch (it
    exits at once, as train's do). `then` (its {n}: the processes asked for) is what to run for them instead;
    without `reads_nproc` a --nproc is left to the note naming it unread (flag_effects), and only a launch refused."""
    from cnnpar.dist import debug_single_requested, launched_by_torchrun, surplus_debug_worker

    if surplus_debug_worker(cfg.dist.debug_single):
        return True
    if debug_single_requested(cfg.dist.debug_single):
        return False
    nproc = cfg.dist.nproc
    if nproc > 1 and reads_nproc:
        raise ConfigError(
            f"{command} measures one process: --nproc {nproc} (typed or from the config) is not measured here; "
            f"expected --nproc 0 or 1 ({then.format(n=nproc)})"
        )
    world = os.environ.get("WORLD_SIZE", "1").strip()
    if launched_by_torchrun() and world != "1":  # each rank would run the whole command alone
        raise ConfigError(
            f"{command} measures one process: started by a launcher with WORLD_SIZE={world}; expected a plain "
            f"`cnnpar {command} ...` ({then.format(n=world)}), or the debug switch (--debug-single)"
        )
    return False


def cmd_doctor(args: argparse.Namespace, argv: list[str]) -> int:
    from cnnpar.cliargs import config_from_args
    from cnnpar.doctor.render import print_report
    from cnnpar.doctor.run import run_doctor

    cfg = config_from_args(args)
    check_model(cfg)
    if one_process_only("doctor", cfg):
        return 0
    opts = doctor_options(args)
    report = run_doctor(cfg, opts)  # the report written
    print_report(report)
    if report.stop is not None:
        raise report.stop  # a try was stopped (or its worker crashed): its report is written, then the stop or the line
    return 0


def cmd_predict(args: argparse.Namespace, argv: list[str]) -> int:
    from cnnpar.engine.predict import predict

    a = args
    out = predict(
        a.checkpoint,
        a.data,
        a.out,
        a.batch_size,
        a.image_shape,
        a.device,
        a.resize,
        a.tta_level,
        a.format,
        labels=a.labels,
        workers=a.workers,
        decode=a.decode,
    )
    print(f"wrote {out}")
    return 0


def cmd_tune(args: argparse.Namespace, argv: list[str]) -> int:
    import shlex

    # the whole run ends within the budget plus 10 %
    started = budget_start(args)
    from cnnpar.bench.tune import (
        CHANGED,
        BudgetTooSmall,
        accuracy_line,
        format_table,
        tune,
        tuned_file,
        typed_settings,
    )
    from cnnpar.cliargs import config_from_args, passthrough_args

    cfg = config_from_args(args)
    check_model(cfg)
    if one_process_only("tune", cfg):
        return 0
    held = typed_settings(vars(args))  # a typed --precision fp32 or --batch-size 32 is the user's, not a trial's
    # --out is checked (refused where it holds an earlier tune's results) before the note and any trial
    with tuned_file(args.out, cfg.run.out_dir, cfg.model.name, args.config) as out:
        if args.repeats == 1:  # the keep rule's "slowest repeat above the best's fastest" compares single figures
            print(
                "cnnpar: note: --repeats 1: each trial is one measurement, with no noise measured: a trial more than "
                "3 % faster on that one figure is kept (--repeats 3, the default, keeps only gains outside the "
                "repeats' range)",
                file=sys.stderr,
            )
        try:
            best, trials = tune(
                cfg,
                args.budget_s,
                out,
                args.trial_s,
                args.steps,
                args.repeats,
                started=started,
                config_read=args.config,
                held=held,
            )
        except BudgetTooSmall as e:  # raised in the block: the folder made for the results goes, none being there
            more = shlex.join(
                ["cnnpar", "tune", *passthrough_args(argv, "--budget-s"), "--budget-s", f"{e.budget_s:g}"]
            )
            raise UserError(f"{e}: expected a larger --budget-s, such as: {more}") from None
    print(format_table(trials))
    if best is None:  # the start failed, with time to run: a failure of the tool or the device, not of the budget
        start = trials[0]
        # the trials' CSV names it 'start'; it runs the config typed (a --config, a preset), not only the defaults
        why = f"the first trial ('start', the config as given) {start.status}: {start.note}"
        print(f"tune: no {out} written ({why}); trials in {out.with_suffix('.csv')}", file=sys.stderr)
        return 1
    again = shlex.join(["cnnpar", "train", "--config", str(out)])  # quoted: pasted as it stands
    for changed in (t for t in trials if t.status == CHANGED):  # also at the head of tuned.toml
        print(f"tune: warning: {changed.note}", file=sys.stderr)
    print(f"tune: {accuracy_line(trials)}")  # also in tuned.toml's header
    print(f"wrote {out} (and {out.with_suffix('.csv')}); train with: {again}")
    return 0


def cmd_prepare(args: argparse.Namespace, argv: list[str]) -> int:
    if args.verify:
        from cnnpar.data.store import default_store_path, verify_store

        if os.path.isdir(args.src):  # else "no such file: make it with ... --out SRC", which prepare refuses
            raise UserError(
                f"--verify {args.src}: a folder: --verify checks a store prepare wrote: expected the .cnnpar file, "
                f"such as {default_store_path(args.src)}"
            )
        if args.out:
            raise UserError(f"--out {args.out} with --verify: --verify writes nothing: expected one or the other")
        if args.labels:
            raise UserError(f"--labels {args.labels} with --verify: a store holds its labels: expected no --labels")
        header = verify_store(args.src, progress=not args.no_progress)
        print(f"{args.src}: ok ({header['count']} images, {header['pixel_bytes']:,} pixel bytes, checksums match)")
        return 0
    from cnnpar.data.folder import (
        loose_images_note,
        skipped_class_folders_note,
        skipped_note,
        split_like_subfolders_note,
        unread_splits_note,
    )
    from cnnpar.data.store import default_store_path
    from cnnpar.data.store_write import Sides, prepare_store

    out = args.out or str(default_store_path(args.src))
    # --max-side alone bounds the longer side as it always did, not also the shorter at 256
    short = args.short_side if args.short_side is not None else (0 if args.max_side else PREPARE_SHORT_SIDE)
    skipped: list[Path] = []
    labelled: list[str] = []  # the labels CSV's warning on images it does not name
    # a re-run (new photos, another --max-side) replaces the store whole: said, as hours of decoding may be behind it
    # (a link to nothing: no store was there, and the store takes the link's name)
    replacing = " (it replaces the store that was there)" if os.path.isfile(out) else ""
    header = prepare_store(
        args.src,
        out,
        args.max_side,
        args.workers,
        progress=not args.no_progress,
        short_side=short,
        skipped=skipped,
        labels=args.labels,
        notes=labelled,
    )
    splits = header["splits"]
    print(
        f"wrote {out}{replacing}: {header['count']} images ({splits['train']} train, {splits['val']} val), "
        f"{len(header['class_names'])} classes, {Sides(args.max_side, short).describe()}, "
        f"{header['pixel_bytes']:,} pixel bytes; train with: {shlex.join(['cnnpar', 'train', '--data', str(out)])}"
    )
    linked = header["same_file_groups"]
    if linked:  # said now; a run warns again if its validation side gets one of them
        print(
            f"note: {sum(map(len, linked)):,} of the images are {len(linked):,} files under several names ("
            "hard or symbolic links): a hold-out from this store that puts one name on each side is warned "
            "about when it trains"
        )
    if skipped:
        print(skipped_note(skipped))
    class_folder_notes = (
        unread_splits_note(args.src),
        loose_images_note(args.src),
        split_like_subfolders_note(args.src),
        skipped_class_folders_note(args.src),
    )
    for note in labelled if args.labels else class_folder_notes:
        if note:
            print(note)
    return 0


PREPARE_SHORT_SIDE = 256  # prepare's --short-side when neither it nor --max-side is given


def add_prepare_parser(sub) -> None:
    from cnnpar.cliargs import DefaultsHelpFormatter, workers_or_auto

    prep = sub.add_parser(
        "prepare",
        help="decode an image folder once into a .cnnpar store (raw pixels, memory-mapped by training)",
        description="Decode every photo of an image folder once (one process per core), cap its sides "
        "(--short-side, --max-side) and write the raw pixels into one .cnnpar store that cnnpar train --data "
        "STORE memory-maps and crops on the device; --verify checks a store against its pixel checksum.",
        formatter_class=DefaultsHelpFormatter,
    )
    prep.add_argument(
        "src",
        help="image folder (FOLDER/<class>/*.jpg|png, or FOLDER/train|training + "
        "FOLDER/val|valid|validation|test|testing, any case); with --verify, the store to check",
    )
    prep.add_argument(
        "--labels",
        default="",
        metavar="CSV",
        help="a CSV that labels SRC, a flat folder of images, as cnnpar train --labels reads it (a header; the "
        "image's name, with or without its extension, first; the label in the column named 'label', else the "
        "second of exactly two); the store holds its labels, so train from it without --labels",
    )
    prep.add_argument(
        "--out",
        default="",
        help="the store to write (default: SRC.cnnpar beside SRC, in the current folder where SRC's cannot be written)",
    )
    prep.add_argument(
        "--short-side",
        type=int,
        default=None,
        help="shorter side in pixels at most (never enlarged; 0: no bound): ~1.15x the model's input size, as "
        "ImageNet's 256 for 224, so every square crop comes from the photo's own pixels (default: "
        f"{PREPARE_SHORT_SIDE}, or none when a max side is given)",
    )
    prep.add_argument(
        "--max-side",
        type=int,
        default=0,
        help="longer side in pixels at most as well (0: no bound), to bound the store's size; a 4:3 photo at "
        "--max-side 256 keeps a shorter side of 192, which crops of 224 enlarge",
    )
    prep.add_argument(
        "--workers",
        type=workers_or_auto,
        default=-1,
        metavar="N|auto",
        help="decoding processes (at most 4 per usable core, as train's); 0 (as train's) or 1: decode in this "
        "process, no pool; auto (or -1): one per usable core (default: auto)",
    )
    prep.add_argument("--verify", action="store_true", help="check SRC, a store, against its pixel checksum")
    prep.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (nor the line every 30 s in its place in a log file)",
    )
    prep.set_defaults(func=cmd_prepare)


def cmd_models(args: argparse.Namespace, argv: list[str]) -> int:
    from cnnpar.models import describe_models

    rows = describe_models()
    width = max(len(n) for n, _ in rows)
    for name, desc in rows:
        print(f"{name:<{width}}  {desc}")
    return 0


def cmd_bench(args: argparse.Namespace, argv: list[str]) -> int:
    import shlex

    started = budget_start(args)  # so `--budget-s 170` ends the command within 3 minutes
    from cnnpar.bench.run import BenchOptions, BudgetTooSmall, pick_mode, run_bench
    from cnnpar.bench.timing import Timing
    from cnnpar.cliargs import config_from_args, passthrough_args

    if args.tta:
        renamed = ["--time-to-accuracy" if a == "--tta" else a for a in argv]
        raise UserError(
            "bench --tta is now --time-to-accuracy (--tta-flip and --tta-level are test-time augmentation): "
            + shlex.join(["cnnpar", "bench", *renamed])
        )
    claims = args.claims or args.preset == "claims"
    if args.preset == "claims":
        args.preset = None  # a bench mode, not a config preset
    mode = pick_mode(claims, args.time_to_accuracy, bool(args.compare))
    repeats = args.repeats or (1 if mode == "time_to_accuracy" else Timing.repeats)
    timing = Timing(args.warmup_steps, args.timed_steps, repeats, args.timed_s)
    compare = tuple(args.compare or ("", ""))
    opts = BenchOptions(mode, args.out, timing, args.only, args.target, compare, args.ddp, args.budget_s, started)
    # the settings it reads (flag_effects.UNREAD): time to accuracy evaluates, compare trains none
    args.bench_mode = mode
    cfg = config_from_args(args)
    check_model(cfg)  # before the data loads and before --ddp's rows start processes
    # --nproc was dropped without a word; under torchrun every rank ran the whole bench on the first device at once.
    # (compare measures nothing: it reads two tables; the claims' note names --nproc unread.) DDP's figures: --ddp
    then = "DDP rows beside the ladder: --ddp 1,{n}" if mode == "ladder" else "then train with --nproc {n}"
    if mode != "compare" and one_process_only("bench", cfg, then, reads_nproc=mode != "claims"):
        return 0
    try:
        return run_bench(cfg, opts)
    except BudgetTooSmall as e:  # nothing measured and nothing written: the command that gives it more time
        more = shlex.join(["cnnpar", "bench", *passthrough_args(argv, "--budget-s"), "--budget-s", f"{e.budget_s:g}"])
        raise UserError(f"{e}: expected a larger --budget-s, such as: {more}") from None


def add_bench_parser(sub) -> None:
    from cnnpar.bench.claims import CPU_BUDGET_S, CUDA_BUDGET_S  # (imports no torch)
    from cnnpar.bench.timing import MIN_REPEATS, MIN_STEPS, SLOW_STEP_S, Timing
    from cnnpar.cliargs import INF_NO_LIMIT, DefaultsHelpFormatter, add_config_flags, at_least, budget_seconds

    bench = sub.add_parser(
        "bench",
        help="measure each speed technique (a ladder), check the founding claims, or time to accuracy",
        description="Measure, in one process, what each speed technique is worth on this machine: the ladder "
        "(each rung adds one technique; ladder.csv/.md and PNGs in --out), --claims (the founding document's "
        "claims, each on the workload it names, within --budget-s), --time-to-accuracy (seconds to --target "
        "validation accuracy) or --compare (two ladder CSVs side by side); --ddp adds DDP rows. Warm-up and "
        "compile stay outside the timed steps; figures are medians of repeats with their range (docs/bench.md). "
        "The bench's own options come first, then the train flags that set the config it measures.",
        formatter_class=DefaultsHelpFormatter,
    )
    g = bench.add_argument_group("bench")  # before the config flags: --help lists them first
    g.add_argument(
        "--out",
        default="",
        help="results folder, refused where it holds a bench's results already (default: a new "
        "<--out-dir>/bench/<model>-<device>-YYYYMMDD-HHMMSS/)",
    )
    g.add_argument(
        "--warmup-steps",
        type=int,
        default=Timing.warmup,
        help=f"untimed steps first (compile happens here); when sized by time, 2 where the second takes "
        f"{SLOW_STEP_S:g} s or more",
    )
    g.add_argument(
        "--timed-steps", type=int, default=Timing.steps, help="timed steps per repeat (the most, when sized by time)"
    )
    g.add_argument(
        "--timed-s",
        type=at_least(0, float),
        default=Timing.seconds,
        help="timed seconds per measurement (all repeats): the steps per repeat are sized from the last warm-up "
        f"step's time, at least {MIN_STEPS} (1 for a step of {SLOW_STEP_S:g} s or more), then, where that still "
        f"takes longer, the repeats (at least {MIN_REPEATS}); 0: fixed counts (the timed steps and repeats given)",
    )
    g.add_argument(
        "--repeats",
        type=int,
        default=0,
        help=f"repeats (medians are reported); 0: {Timing.repeats}, or for --time-to-accuracy (seeds) 1",
    )
    g.add_argument("--only", default=None, help="comma-separated rung (or, with --claims, claim) names to measure")
    g.add_argument("--claims", action="store_true", help="measure the founding document's claims (= --preset claims)")
    g.add_argument(
        "--time-to-accuracy", action="store_true", help="train until --target validation accuracy; report the time"
    )
    g.add_argument("--tta", action="store_true", help=argparse.SUPPRESS)  # renamed: says so and stops
    g.add_argument(
        "--target",
        type=float,
        default=None,
        help="--time-to-accuracy: validation accuracy to reach, e.g. 0.99 (no default: --time-to-accuracy needs it)",
    )
    g.add_argument(
        "--budget-s",
        type=budget_seconds,
        default=0,  # not typeable (budget_seconds refuses 0): the mode's default
        help=f"claims and ladder: start nothing after this many seconds, above 0 ({INF_NO_LIMIT}; default: claims "
        f"{CUDA_BUDGET_S:g} with CUDA, so the table ends within 3 minutes, {CPU_BUDGET_S:g} on a CPU; the ladder "
        "none)",
    )
    g.add_argument(
        "--ddp", default="", help="ladder: also DDP rows at these world sizes, e.g. 1,2 (ddp.csv and ddp.json in --out)"
    )
    g.add_argument("--compare", nargs=2, metavar=("A.csv", "B.csv"), help="print two ladder CSVs side by side")
    add_config_flags(bench, extra_presets={"claims": "not a config: the claims mode, as --claims"})
    bench.set_defaults(func=cmd_bench)


def cmd_compare(args: argparse.Namespace, argv: list[str]) -> int:
    from cnnpar.frameworks.compare import main_from_args

    return main_from_args(args)


def build_parser() -> argparse.ArgumentParser:
    from cnnpar.bench.timing import START_FACTOR, TRIAL_SHARE_WORDS
    from cnnpar.checkout import cnnpar_version
    from cnnpar.cliargs import (
        INF_NO_LIMIT,
        DefaultsHelpFormatter,
        add_config_flags,
        at_least,
        budget_seconds,
        workers_or_auto,
    )
    from cnnpar.config import DECODERS, TTA_LEVELS
    from cnnpar.doctor.options import DoctorOptions, ProfileOptions

    p = argparse.ArgumentParser(prog="cnnpar", description="Fast CNN training, measured.")
    p.add_argument("--version", action="version", version=f"cnnpar {cnnpar_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    train = sub.add_parser(
        "train",
        help="train a model (defaults: cnn3 on the built-in digits)",
        description="Train a model (defaults: cnn3 on the built-in scikit-learn digits). Every flag is a field of "
        "the config (cnnpar/config.py); 'auto' is resolved for this machine and the run prints what it chose and "
        "why. The run folder (runs/<model>-<date>/) holds config.toml, metrics.csv, summary.json and "
        "ckpt/last.pt and best.pt; --resume continues a stopped run, --nproc N starts N processes (DDP).",
        formatter_class=DefaultsHelpFormatter,
    )
    add_config_flags(train)
    train.set_defaults(func=cmd_train)

    prof = sub.add_parser(
        "profile",
        help="a few train steps under torch.profiler: trace per rank, top operators",
        description="Run a few train steps of the config under torch.profiler: skip --prof-wait steps, discard "
        "--prof-warmup, record --prof-active. Writes trace_rank<N>.json (for ui.perfetto.dev), top-operator tables "
        "and where_time_went_rank<N>.txt (how busy the GPU was, what it waited for) to --report-dir. The profiler's "
        "own options come first, then the train flags that set the config it profiles.",
        formatter_class=DefaultsHelpFormatter,
    )
    extra = prof.add_argument_group("profile")  # before the config flags: --help lists them first
    extra.add_argument(
        "--prof-wait",
        type=at_least(0),
        default=ProfileOptions.wait,
        help="steps before the profiler starts (start-up, compile)",
    )
    extra.add_argument(
        "--prof-warmup",
        type=at_least(0),
        default=ProfileOptions.warmup,
        help="profiled steps discarded (profiler start-up)",
    )
    extra.add_argument("--prof-active", type=at_least(1), default=ProfileOptions.active, help="profiled steps recorded")
    extra.add_argument(
        "--row-limit", type=at_least(1), default=ProfileOptions.row_limit, help="operators in the tables"
    )
    extra.add_argument(
        "--report-dir",
        default="",
        help="output folder, refused where it holds an earlier profile's files already (default: a new "
        "<--out-dir>/profile/<model>-YYYYMMDD-HHMMSS/)",
    )
    extra.add_argument(
        "--all-threads",
        action="store_true",
        help="record every thread's operators (a GPU decoder's threads, autograd's), where torch can; off by "
        "default: torch's global profiler callbacks have crashed with the DataLoader's pin-memory thread "
        "(pytorch/pytorch#185741)",
    )
    add_config_flags(prof)
    prof.set_defaults(func=cmd_profile)

    doc = sub.add_parser(
        "doctor",
        help="measure data vs step vs end to end, name the bottleneck, advise",
        description="Measure your model on your data in one process: the input pipeline alone, the train step "
        "alone (at the batch and at half of it) and both end to end. The verdict: data-bound (the step waits for "
        "batches), host-bound (per-step overhead, or a GPU idle waiting for launches) or compute-bound (the "
        "arithmetic sets the pace); then changes ranked by estimated gain, each a command to paste. --try N "
        "measures the top N with the change applied. Each phase runs --warmup-steps untimed steps, then stops "
        "after --measure-steps batches or --max-seconds (at least 2 batches; the step's phase times two batch "
        "sizes): a few minutes at the defaults, longer where one step takes seconds; each try measures end to end "
        "once more, and one that compiles on a CPU spends tens of seconds to minutes compiling first. Writes "
        "report.md, doctor.json, CSVs and PNGs to --report-dir; a Ctrl-C or SIGTERM during the tries still writes "
        "the report of what was measured. The doctor's own options come first, then the train flags that set the "
        "config it measures.",
        formatter_class=DefaultsHelpFormatter,
    )
    extra = doc.add_argument_group("doctor")  # before the config flags: --help lists them first
    extra.add_argument(
        "--warmup-steps",
        type=at_least(0),
        default=DoctorOptions.warmup,
        help="unmeasured steps before each measurement",
    )
    extra.add_argument(
        "--measure-steps",
        type=at_least(2),
        default=DoctorOptions.steps,
        help="measured batches per phase (optimizer steps where it trains, each of --grad-accum batches)",
    )
    extra.add_argument(
        "--max-seconds",
        type=at_least(0.1, float),
        default=DoctorOptions.max_s,
        help="stop a phase after this long (min 2 batches)",
    )
    extra.add_argument(
        "--try",
        dest="try_top",
        type=at_least(0),
        nargs="?",
        const=3,
        default=DoctorOptions.try_top,
        metavar="N",
        help="re-measure the top N recommendations with the config changed (default: none; --try alone: 3)",
    )
    extra.add_argument(
        "--report-dir",
        default="",
        help="output folder, refused where it holds an earlier doctor's report already (default: a new "
        "<--out-dir>/doctor/<model>-YYYYMMDD-HHMMSS/)",
    )
    add_config_flags(doc)
    doc.set_defaults(func=cmd_doctor)

    pred = sub.add_parser(
        "predict",
        help="predict with a checkpoint; CSV input gives a Kaggle submission.csv",
        description="Predict a class for every image of --data with a run's checkpoint (a run folder reads "
        "ckpt/last.pt), with the test-time views and precision the run evaluated with. Writes submission.csv "
        "(ImageId,Label: the class index) for CSV input, else predictions.csv (id,label,class_name,confidence), and "
        "prints the accuracy where the data has labels.",
        formatter_class=DefaultsHelpFormatter,
    )
    pred.add_argument("--checkpoint", required=True, help="a run folder, its ckpt/ folder, or a .pt file")
    pred.add_argument(
        "--data",
        required=True,
        help="test.csv (pixel columns, an optional id or ImageId: the submission's ids), an .npz, a .npy of images "
        "(np.save), an image folder (one of class folders, a split's val/<class>/ say, is scored against their names "
        "where they are the run's classes), or digits (built in)",
    )
    pred.add_argument(
        "--labels",
        default="",
        metavar="CSV|NPY",
        help="a CSV labelling a flat --data folder, read as `cnnpar train --labels` reads it: only the images it "
        "names are predicted, and the accuracy against its labels (classes matched to the run's by name) is printed; "
        "or, beside --data IMAGES.npy, a LABELS.npy of their class indices, whose accuracy is printed",
    )
    pred.add_argument(
        "--out",
        default="",
        help="output CSV (default: submission.csv for CSV input, else predictions.csv); a path ending in / is a "
        "folder to write that file in",
    )
    pred.add_argument(
        "--format",
        default="auto",
        choices=["auto", "csv", "npz", "npy", "folder"],
        help="how to read --data: auto (from its name: .csv, .npz, .npy, a folder, digits), csv, npz, npy or folder",
    )
    pred.add_argument("--batch-size", type=int, default=256, help="images per forward pass")
    pred.add_argument("--image-shape", default="", help="CxHxW of CSV rows when not square grey")
    pred.add_argument(
        "--device",
        default="auto",
        help="device to predict on: auto (the first CUDA device where one is visible, else cpu), cpu, cuda or cuda:N",
    )
    pred.add_argument(
        "--resize",
        action="store_true",
        help="resize CSV/npz/npy images to the model's size (else another size is refused)",
    )
    pred.add_argument(
        "--tta-level",
        default="auto",
        choices=["auto", *TTA_LEVELS],
        help="test-time views averaged per image: none, flip or flip+translate, as cnnpar train --tta-level takes "
        "them; auto: those the run evaluated with (its --tta-level)",
    )
    pred.add_argument(
        "--workers",
        type=workers_or_auto,
        default=-1,
        metavar="N|auto",
        help="DataLoader worker processes decoding a folder's photos while the model runs, as cnnpar train --workers "
        "(0: in the main process; at most 4 per usable core); auto (or -1): sized to the machine, the usable cores "
        "less one, at most 16 (default: auto)",
    )
    pred.add_argument(
        "--decode",
        default="auto",
        choices=DECODERS,
        help="where a folder's JPEGs are decoded, as cnnpar train --decode: cpu (worker processes), gpu, hardware, "
        "nvimgcodec or nvimgcodec-workers; auto: as the run's evaluation picks it on this device (the GPU's JPEG "
        "engines where it has them, else nvJPEG with CUDA, else cpu)",
    )
    pred.set_defaults(func=cmd_predict)

    tune_p = sub.add_parser(
        "tune",
        help="measure speed switches on your model/data/device; write the fastest config",
        description="Try the speed switches one at a time on your model, data and device (batch size, compile and "
        "CUDA graphs, data path, layout, precision; the long compiles last), each trial in a child process killed "
        "at its limit, and end within --budget-s. It measures speed only, not accuracy: a kept batch size or "
        "precision changes training too, which tuned.toml's header names. Keeps a switch only where it is faster "
        "beyond the noise, and "
        "rewrites --out (tuned.toml, in a new folder under --out-dir for each tune; for cnnpar train --config with "
        "its path) after each trial that beats the best; every trial is a row of tuned.csv beside it. The tuner's "
        "own options come first, then the train flags that set the config it starts from.",
        formatter_class=DefaultsHelpFormatter,
    )
    tune_p.add_argument(
        "--budget-s",
        type=budget_seconds,
        default=600,
        help=f"the whole run ends within this, above 0 (plus the last kill, a few s; {INF_NO_LIMIT}, each trial then "
        "runs to its end unless --trial-s cuts it off)",
    )
    tune_p.add_argument(
        "--trial-s",
        type=at_least(0, float),
        default=0,
        help="a trial running longer is killed and reported as cut off (0: the larger of "
        f"{TRIAL_SHARE_WORDS} of the budget and {START_FACTOR:g}x the start trial's time)",
    )
    tune_p.add_argument("--steps", type=at_least(1), default=20, help="timed steps per epoch of a trial")
    tune_p.add_argument("--repeats", type=at_least(1), default=3, help="timed epochs per trial (median counts)")
    tune_p.add_argument(
        "--out",
        default="",
        help="where the winning config goes (its trials: the same name with .csv), refused where either is there "
        "already, unless it is the config file tune starts from (re-tuned in place) (default: tuned.toml in a new "
        "<--out-dir>/tune/<model>-YYYYMMDD-HHMMSS/)",
    )
    add_config_flags(tune_p)
    tune_p.set_defaults(func=cmd_tune)

    from cnnpar.frameworks.compare import add_compare_args

    comp = sub.add_parser(
        "compare",
        help="train cnn3 under other frameworks, each in its own process, side by side",
        description="Train the same cnn3 (same layers, initial weights, optimizer, batch, epochs and data split) "
        "under each of --frameworks, each in its own process, and write one CSV per framework, a combined table "
        "(.md, .csv) and a chart to --out. A framework that is not installed is skipped with one line "
        "(docs/frameworks.md).",
        formatter_class=DefaultsHelpFormatter,
    )
    add_compare_args(comp)
    comp.set_defaults(func=cmd_compare)

    models = sub.add_parser(
        "models", help="list the registered models", description="List the models --model takes, one line each."
    )
    models.set_defaults(func=cmd_models)
    add_bench_parser(sub)
    add_prepare_parser(sub)
    return p


def _preset_data_note(args: argparse.Namespace, e: UserError) -> str:
    """For an error about a --preset's own --data path (not typed: a typed path is the user's), which preset it
    came from and what to pass instead; "" otherwise."""
    preset = getattr(args, "preset", None)
    if not preset or hasattr(args, "data.source"):
        return ""
    from cnnpar.presets import preset_data_note

    note = preset_data_note(preset, user_error_text(e))
    return f" {note}" if note else ""


def budget_start(args: argparse.Namespace) -> float:
    """The `time.monotonic()` a --budget-s (tune, bench --claims) counts from: the process's start where the process
    was started for this command (`cnnpar ...`: interpreter and imports included), else the call's. Counted from the
    process's start in a notebook kernel or script calling `main`, a budget ran out with the kernel's age: an hour
    after the kernel started, every `tune` was refused at once ("time budget spent (0 s left)") and every claim of
    `bench --claims` skipped."""
    if (called := getattr(args, "called_at", None)) is not None:
        return called
    import psutil

    return time.monotonic() - max(0.0, time.time() - psutil.Process().create_time())


def main(argv: list[str] | None = None) -> int:
    called_at = None if argv is None else time.monotonic()  # None: the process's own command line (budget_start)
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        if e.code:  # argparse refused this node's command line, and said why
            tell_the_job_this_rank_ended()
        # without argparse's ArgumentError chained to it, which its message already said: IPython (8.x, in a
        # notebook cell) failed to show a SystemExit with a context, and printed its own AttributeError traceback
        # ("'tuple' object has no attribute 'tb_frame'", ipython/ipython#13796) below cnnpar's error line
        e.__suppress_context__ = True
        raise
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    args.called_at = called_at
    with ctrl_c_noted() as came:  # torch's first import, which a Ctrl-C raised inside left broken for the process
        from cnnpar.console import printable_stdio
        from cnnpar.dist import launched_as_worker, stops_for_a_plain_torchrun, widen_device_queues  # (imports torch)
        from cnnpar.process_state import stops_for_one_command, torch_settings_kept
    if came:  # stopped before the command began: nothing to keep or clean up
        return stopped(KeyboardInterrupt())

    # kept for the process (not put back): CUDA reads it when its context starts, and torchrun's workers inherit it
    widen_device_queues()  # before anything starts CUDA
    # the signal handlers, torch's settings and the random streams the command sets are put back when it returns:
    # main is called from notebooks and scripts too, where they would outlive it
    with contextlib.ExitStack() as kept:
        kept.enter_context(printable_stdio())
        # A launcher's ranks: it stops them (a rank stuck in a collective could not run a handler), and its own stop
        # is handed on once; every other command cleans up. Under a torchrun started by hand nobody else would say
        # what was kept: its rank 0 does, as on Ctrl-C.
        if not launched_as_worker() or stops_for_a_plain_torchrun():
            kept.enter_context(stops_for_one_command())
        kept.enter_context(torch_settings_kept())
        try:
            return run_command(args, argv)
        except KeyboardInterrupt as e:  # raised as it said its end: stderr's reader went away (console.StopWhenGone)
            return stopped(e)


def run_command(args: argparse.Namespace, argv: list[str]) -> int:
    """The parsed command run, its errors and stops turned into their lines and exit statuses."""
    from cnnpar.data.cpu_decode import forget_said_damaged
    from cnnpar.dist import LAUNCHED_NPROC_ENV, init_cpu_threads, launcher_rank
    from cnnpar.host_facts import open_files_line, raise_open_files_limit, too_many_open_files
    from cnnpar.socket_folder import init_socket_folder, too_long_text

    # before any DataLoader worker, decoder pool or launched rank: they inherit it
    raise_open_files_limit()
    init_cpu_threads()  # before any step or decoder runs torch's thread pool
    # a damaged photo is named once in each command, not once in the process: a second `main` in a notebook on the
    # same photos named none, and its run looked clean (before any DataLoader worker: forked ones inherit the set)
    forget_said_damaged()
    try:
        # before any DataLoader worker or launched rank: forked workers inherit the folder
        if (sockets := init_socket_folder()) and launcher_rank() == 0 and LAUNCHED_NPROC_ENV not in os.environ:
            print(f"cnnpar: {too_long_text(tempfile.gettempdir())}: the sockets go in {sockets}", flush=True)
        code = args.func(args, argv[1:])
        raise_pending_stop()  # one whose raise Python dropped after the command's last check: it ends as a stop
        return code
    except UserError as e:
        tell_the_job_this_rank_ended(e)
        text = f"{user_error_text(e)}{_preset_data_note(args, e)}"
        note = launch_note()
        # the one rank of `--nproc 1` refusing before its run folder's note, or after it where the folder went with
        # it (a divergence in epoch 1), is the job's refusal, as every rank's alike is under --nproc 2: said once by
        # the launcher, exit 2, as one process says it (it ended 1, after torchrun's line on its exit, one blaming
        # rank 0 and, for the divergence, "nothing to resume"); a memory-full error keeps the launcher's last line
        alone = bool(note) and not _of_a_job() and not isinstance(e, DeviceMemoryFull) and not _run_folder_kept(note)
        if (isinstance(e, EveryRankRefused) or alone) and note:
            # each rank writes it before it exits (the first to exit is the first torchrun notices); the launcher
            # prints it once
            from cnnpar.report.files import write_text_atomic

            write_text_atomic(refusal_note(note), text)
            return 2
        if isinstance(e, DeviceMemoryFull) and e.resume_flags and note:  # for the launcher's last line
            from cnnpar.report.files import write_text_atomic

            with contextlib.suppress(OSError):  # the line below is said without it
                write_text_atomic(memory_full_note(note), e.resume_flags)
        if a_rank_failure_noted():  # this rank's error or another's, said once by the launcher
            return 2
        prefix = f"[rank {_rank()}] " if _of_a_job() else ""
        return say_user_error(f"{prefix}{text}")
    except KeyboardInterrupt as e:
        return stopped(e)
    except BaseException as e:
        tell_the_job_this_rank_ended(e)
        if (stop := _stop_behind(e)) is not None:  # a worker the stop killed, torch broken under it
            return stopped(stop)
        if too_many_open_files(e):  # the host's limit, not a bug: torch's own error came in a traceback
            prefix = f"[rank {_rank()}] " if _of_a_job() else ""
            return say_user_error(f"{prefix}{open_files_line()}")
        if "RANK" not in os.environ:
            raise
        line, code = another_rank_line(e, _rank())
        if line and reader_gone_in_the_job():  # the job's stop, which that rank's end was: quiet, as a Ctrl-C's
            return stopped(stop_for(SIGPIPE))
        if line and a_rank_failure_noted():  # the launcher says that rank's error, and what is kept
            return code
        if line:  # the other rank's own error, where it had one, is that rank's to say: no traceback of ours
            print(line, file=sys.stderr, flush=True)
            return code
        print(f"cnnpar: rank {_rank()} failed:", file=sys.stderr, flush=True)
        raise


def stopped(stop: KeyboardInterrupt) -> int:
    """The last line of a command stopped by a Ctrl-C, a SIGTERM or a SIGHUP (errors.Terminated), and its exit
    status: 130, or 128 + the signal (143, 129). A rank of `--nproc` leaves the line to its launcher, which says it
    once (each rank's came on top of it)."""
    from cnnpar.dist import LAUNCHED_NPROC_ENV

    terminated = isinstance(stop, Terminated)
    # SIGPIPE (a reader gone, console.StopWhenGone) ends quietly, as `yes | head` does; a command that keeps
    # something (train) has said what on stderr
    if LAUNCHED_NPROC_ENV not in os.environ and not (terminated and stop.signum == SIGPIPE):
        sys.stdout.flush()  # what the command printed (its own stop line) comes first where both go to one file
        said = f"cnnpar: stopped ({stop.signal_name})" if terminated else "cnnpar: interrupted"
        print(said, file=sys.stderr, flush=True)
    return 128 + stop.signum if terminated else 130


def _stop_behind(e: BaseException) -> KeyboardInterrupt | None:
    """The stop that `e` is the doing of (engine/stops.the_stop), for an error no command turned into one."""
    from cnnpar.engine.stops import the_stop

    return the_stop(e)


def another_rank_line(e: BaseException, rank: int) -> tuple[str, int]:
    """The one line, and the exit status, of a rank stopped by another rank (dist.another_ranks_failure); ("", 0)
    for its own failure. Its ~50-line gloo traceback ("Connection closed by peer") buried the other rank's one-line
    error above it, or stood alone in its node's log; a timeout read as this rank's failure."""
    from cnnpar.dist import JoinFailed, another_ranks_failure
    from cnnpar.errors import EXIT_ANOTHER_RANK_ENDED, EXIT_COLLECTIVE_TIMED_OUT

    if isinstance(e, JoinFailed):  # at the start: another rank ended before joining, or never came
        return f"cnnpar: rank {rank} stopped: {e}", e.exit_status
    why, waited = another_ranks_failure(e)
    if why == "ended":
        line = (
            f"cnnpar: rank {rank} stopped: another rank of the job ended; its own error is above, or in its node's log"
        )
        return line, EXIT_ANOTHER_RANK_ENDED
    if why == "silent":
        after = f"after {waited:g} s (--timeout-s {waited:g})" if waited else "(--timeout-s)"
        return (
            f"cnnpar: rank {rank} timed out {after} waiting for another rank in a collective: a rank stopped "
            "responding (stuck, stopped or too slow)",
            EXIT_COLLECTIVE_TIMED_OUT,
        )
    return "", 0
