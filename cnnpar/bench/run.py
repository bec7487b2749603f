"""`cnnpar bench`: pick the mode (ladder, claims, time to accuracy, compare), run it, write its files."""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from cnnpar.config import Config, resolve_batch_size
from cnnpar.errors import UserError
from cnnpar.report.files import (
    TEXT,
    check_out_folder,
    output_folder,
    refuse_earlier_results,
    results_in,
    write_text_atomic,
)

from .timing import Timing

# the --budget-s suggested to a ladder whose budget measured no rung, at least: a few small rungs after start-up
LADDER_RETRY_S = 60.0

# the flag that picks each mode but the ladder (the default), as errors name it
MODE_FLAGS = {"claims": "--claims", "time_to_accuracy": "--time-to-accuracy", "compare": "--compare"}


def pick_mode(claims: bool, time_to_accuracy: bool, compare: bool) -> str:
    """The mode the flags typed pick, the ladder where none does; two at once are refused: `--claims --compare A B`
    ran the comparison and `--claims --time-to-accuracy` the claims, the other flag dropped without a word."""
    asked = {"claims": claims, "time_to_accuracy": time_to_accuracy, "compare": compare}
    picked = [mode for mode, on in asked.items() if on]
    if len(picked) > 1:
        typed = " and ".join(MODE_FLAGS[m] for m in picked)
        raise UserError(f"bench {typed}: one mode at a time: expected one of {', '.join(MODE_FLAGS.values())}")
    return picked[0] if picked else "ladder"


class BudgetTooSmall(UserError):
    """--budget-s was spent before any rung or claim asked for could start, or cut off every claim started, so
    nothing was measured: refused in one line (exit 2) with no results written, as `cnnpar tune` refuses a budget its
    first trial cannot fit. It ended 0 after a table of rows all saying "skipped" (1 after one of cut-off claims),
    which a script checking the exit status took for a result. `budget_s` is the one to suggest; the CLI adds the
    command to rerun."""

    def __init__(self, message: str, budget_s: float) -> None:
        super().__init__(message)
        self.budget_s = budget_s


def refuse_if_the_budget_measured_nothing(
    ran: int, left_out: int, asked: int, what: str, budget_s: float, suggest_s: float, started: float | None
) -> None:
    """BudgetTooSmall where no row ran (measured or failed: `ran`) and at least one was left out because the budget
    was spent (`left_out` of `asked`): the budget, not the config or the machine, kept the bench from measuring. Rows
    that cannot run here alone (needing CUDA, left out with --only) are no refusal: those are the documented outcome."""
    if ran or not left_out:
        return
    took_s = time.monotonic() - started if started is not None else 0.0
    took = f"; start-up took {took_s:.0f} s of it" if started is not None else ""
    raise BudgetTooSmall(
        f"bench --budget-s {budget_s:g}: spent before the first {what} could start ({left_out} of {asked} {what}(s) "
        f"not started for it{took}): nothing was measured",
        math.ceil(max(2 * budget_s, suggest_s, 2 * took_s)),
    )


@dataclass(frozen=True)
class BenchOptions:
    mode: str  # "ladder", "claims", "time_to_accuracy" or "compare"
    out: str = ""  # results folder ("" -> a new <run.out_dir>/bench/<model>-<device>-YYYYMMDD-HHMMSS/)
    timing: Timing = Timing()
    only: str | None = None  # comma-separated rung or claim names (None: all; "" typed is refused)
    target: float | None = None  # time to accuracy: validation accuracy to reach (None: not given)
    compare: tuple[str, str] = ("", "")
    ddp: str = ""  # ladder: also measure DDP at these world sizes ("1,2"), one torchrun launch each
    budget_s: float = 0.0  # claims and ladder: nothing new starts after this (0: claims' default, ladder: none)
    started: float | None = None  # time.monotonic() when the command started (the budget counts from it)

    def __post_init__(self) -> None:
        # the DDP rows run after the whole ladder: a bad --ddp must stop the bench before it measures anything
        if self.ddp and self.mode != "ladder":  # only the ladder has DDP rows: elsewhere it would be dropped unsaid
            flag = MODE_FLAGS[self.mode]
            raise UserError(
                f"bench --ddp {self.ddp}: DDP rows go beside the ladder only: expected no --ddp with {flag}"
            )
        # other flags a mode does not read were dropped without a word too (--target on a ladder ran the ladder)
        named = {**MODE_FLAGS, "ladder": "a ladder"}
        read_by = {
            "--target": ("time_to_accuracy",),
            "--budget-s": ("claims", "ladder"),
            "--only": ("claims", "ladder"),
        }
        # typed: a --target 0 or --only "" too, which ask for something the mode would not do either
        given = {
            "--target": self.target is not None,
            "--budget-s": bool(self.budget_s),
            "--only": self.only is not None,
        }
        for flag, modes in read_by.items():
            if given[flag] and self.mode not in modes:
                where = " or ".join(named[m] for m in modes)
                raise UserError(f"bench {flag}: read only with {where}: expected no {flag} with {named[self.mode]}")
        if self.ddp:
            from .ddp_scaling import parse_world_sizes

            try:
                parse_world_sizes(self.ddp)
            except ValueError as e:
                raise UserError(f"bench --ddp {self.ddp}: {e}") from None
        if not self.budget_s >= 0:  # NaN too
            raise UserError(f"bench --budget-s {self.budget_s}: expected seconds >= 0 (0: the mode's default)")
        if self.out:
            check_out_folder(self.out, "bench --out")
            if self.mode != "compare":  # (compare's --out is a Markdown file)
                from .output import RESULT_FILES

                refuse_earlier_results("bench", "--out", self.out, results_in(self.out, RESULT_FILES))


def results_folder(opts: BenchOptions, out_root: str, device, name: str) -> contextlib.AbstractContextManager[Path]:
    """The bench's results folder, for the block: --out, or a new OUT_ROOT/bench/<name>-<device>-YYYYMMDD-HHMMSS,
    made now (`stamped_folder`: two benches started within the same second each picked the same name, and made it
    only at their writes). A bench stopped or failed before it wrote a result leaves no folder it made; one that
    wrote its rows so far (a stop: `kept_if_stopped`) keeps them."""
    from .meta import default_out_place
    from .output import RESULT_FILES

    parent, prefix = default_out_place(out_root, device, name)
    return output_folder(opts.out, parent, prefix, keep=lambda folder: bool(results_in(folder, RESULT_FILES)))


def check_ddp_devices(ddp: str, device) -> None:
    """The GPUs the largest --ddp world size needs, checked before the ladder (the rows run after it)."""
    if not ddp or device.type != "cuda":
        return
    import torch

    from .ddp_scaling import parse_world_sizes

    most, visible = max(parse_world_sizes(ddp)), torch.cuda.device_count()
    if most > visible:
        raise UserError(f"bench --ddp {ddp}: {most} processes need as many GPUs: expected at most {visible} here")


def _ddp_rows(cfg: Config, opts: BenchOptions, out: Path, device_type: str, bundle, batch: int) -> bool:
    """DDP rows beside the ladder: the ladder's model, image shape, classes, optimizer, precision and
    channels_last and per-process batch at each world size, through cnnpar's Trainer and host input pipeline,
    on synthetic images of that shape (see bench/ddp_scaling.py). False, saying so, when they failed (a world size
    failing, or stopped, after others were measured: ddp_scaling writes their rows and its line names them)."""
    from .ddp_scaling import main as ddp_main
    from .output import DDP_PREFIX

    argv = [
        "--world-sizes",
        opts.ddp,
        "--device",
        device_type,
        "--model",
        cfg.model.name,
        "--image-size",
        str(bundle.shape[1]),
        "--image-shape",
        "x".join(str(d) for d in bundle.shape),
        "--num-classes",
        str(bundle.num_classes),
        "--optimizer",
        cfg.optim.optimizer,
        "--precision",
        cfg.speed.precision,
        "--channels-last",
        cfg.speed.channels_last,
        "--batch-size",
        str(batch),
        "--steps",
        str(opts.timing.steps),
        "--repeats",
        str(opts.timing.repeats),
        "--out",
        str(out / DDP_PREFIX),
    ]
    try:
        ddp_main(argv)
    except UserError as e:  # ddp.csv or ddp.json not written (a full disk): the ladder's files are whole
        raise UserError(f"{e}; the ladder's results are kept, whole, in {out}") from None
    except SystemExit as e:  # a failed launch: the ladder's files are already written
        if e.code not in (0, None):
            print(f"bench: DDP rows failed: {e.code}", file=sys.stderr, flush=True)
            return False
    return True


def _compare(cfg: Config, opts: BenchOptions) -> int:
    from .compare import compare_ladders, default_compare_path, differ_line

    text, differ = compare_ladders(*opts.compare)
    path = Path(opts.out) / "compare.md" if opts.out else default_compare_path(cfg.run.out_dir, *opts.compare)
    write_text_atomic(path, text)
    print(text, end="")
    print(f"wrote {path}")
    # last, where a reader of the console looks, as the other commands' notes: the table's marks scroll away
    if differ:
        print(f"cnnpar: note: bench --compare: {differ_line(differ)}", file=sys.stderr)
    return 0


def _measurement_setup(cfg: Config, timing: Timing):
    """Device, data and the run metadata (peak FLOP/s and model FLOPs measured here, now)."""
    from cnnpar.data import load_data
    from cnnpar.dist import init_distributed

    from .flops import flops_per_image, peak_flops
    from .meta import run_metadata

    # One process by design: a bench started under torchrun still measures one device.
    info = init_distributed(cfg.speed.device, debug_single=True)
    bundle = load_data(cfg.data, cfg.run.seed)
    peak = peak_flops(info.device)
    fpi = flops_per_image(cfg.model.name, bundle.shape, bundle.num_classes, info.device)
    # resolved: --batch-size auto is the CPU's 64 here, not the 0 that stands for auto (still 0 on a GPU,
    # where each Trainer searches its own batch and the ladder's rows record it)
    batch = resolve_batch_size(cfg.run.batch_size, info.device.type)
    cfg = replace(cfg, run=replace(cfg.run, batch_size=batch))
    return info, bundle, run_metadata(cfg, bundle, info.device, timing, peak, fpi)


def stopped_row(rows: list[dict]) -> list[dict]:
    """A ladder's rows so far and a last one saying the bench stopped there: the table of a stopped run read as
    a whole one, its remaining rungs missing without a word."""
    from .meta import META_COLUMNS

    meta = {k: rows[-1].get(k, "") for k in META_COLUMNS}
    stop = {"rung": "", "name": "(stopped)", "technique": "", "status": "stopped", "repeats_run": ""}
    return [*rows, {**meta, **stop, "error": "the bench was stopped here: the rungs after it were not measured"}]


@contextlib.contextmanager
def kept_if_stopped(
    write: Callable[[list[dict]], list[Path]], mark: Callable[[list[dict]], list[dict]] = list
) -> Iterator[Callable[[list[dict]], None]]:
    """Yields the `on_row` a runner reports its rows to; a Ctrl-C or SIGTERM (errors.Terminated) before the
    runner returns writes the rows measured so far with `write` (after `mark`, which may add a row saying the run
    stopped), says where, and goes on stopping: minutes of measurements were lost with the whole table written
    only at the end."""
    so_far: list[dict] = []

    def keep(rows: list[dict]) -> None:
        so_far[:] = [dict(r) for r in rows]

    try:
        yield keep
    except KeyboardInterrupt:
        if so_far:
            files = write(mark(so_far))
            print(f"bench: stopped; the {len(so_far)} row(s) so far are in {files[0]}", file=sys.stderr, flush=True)
        raise


def _claims(cfg: Config, opts: BenchOptions) -> int:
    """Each claim builds its own workload: the user's --model and --data are not loaded."""
    from cnnpar.dist import init_distributed

    from . import output
    from .claims import run_claims
    from .meta import device_metadata

    info = init_distributed(cfg.speed.device, debug_single=True)
    meta = device_metadata(info.device, opts.timing)
    print(
        f"bench: claims on {meta['device']} ({info.device.type}), torch {meta['torch']}; each on the "
        "workload it names (synthetic images of its shape; --model and --data are not used)",
        flush=True,
    )
    log = lambda text: print(text, flush=True)  # noqa: E731
    only = _only(opts)
    with results_folder(opts, cfg.run.out_dir, info.device, "claims") as out:
        with kept_if_stopped(lambda rows: output.write_claims(out, rows)) as so_far:
            rows = run_claims(cfg, info, opts.timing, meta, only, log, opts.budget_s, opts.started, on_row=so_far)
        from .claims import ALONE_MORE, BUDGET_SPENT, CPU_BUDGET_S, CUDA_BUDGET_S, CUT_OFF_VERDICT, FAILED

        default_s = CUDA_BUDGET_S if info.device.type == "cuda" else CPU_BUDGET_S  # sized to measure the table here
        ran = [r for r in rows if r.get("measured_ratio", "") != "" or r["verdict"] == FAILED]
        spent = [r for r in rows if r["verdict"] == "not measured" and BUDGET_SPENT in r["note"]]
        cut = [r for r in rows if r["verdict"] == CUT_OFF_VERDICT]
        budget_s = opts.budget_s or default_s
        if cut and not ran:  # each claim started passed the limit the budget gave it: tune's start trial cut off, 2
            first = f"{cut[0]['claim']}: {cut[0]['note'].split(ALONE_MORE)[0]}"
            raise BudgetTooSmall(
                f"bench --budget-s {budget_s:g}: every claim started was cut off at the time the budget left it "
                f"({len(cut)} of {len(rows)}; {first}): nothing was measured",
                math.ceil(max(2 * budget_s, default_s)),
            )
        refuse_if_the_budget_measured_nothing(
            len(ran), len(spent), len(rows), "claim", budget_s, default_s, opts.started
        )
        files = output.write_claims(out, rows)
    _finish(files)
    return _claims_exit(rows, files[0])


def _claims_exit(rows: list[dict], csv_path: Path) -> int:
    """1, saying so, when claims were started and none was measured (as the ladder: a table of failures is no
    measurement); claims never started (needing CUDA, left out with --only, past the budget) are no failure."""
    from .claims import FAILED

    measured = [r for r in rows if r.get("measured_ratio", "") != ""]
    failed = [r for r in rows if r["verdict"] in (FAILED, "cut off")]
    if not measured and not failed:  # (a budget that started none was refused before) documented: exit 0, said
        print(
            f"bench: note: nothing was measured: every claim asked for needs CUDA (not measurable here); rows in "
            f"{csv_path}",
            file=sys.stderr,
        )
    if measured or not failed:
        return 0
    first = failed[0]
    print(
        f"bench: nothing was measured: every claim started failed or was cut off ({len(failed)} of {len(rows)}, "
        f"the rest not measurable here or not measured); first, {first['claim']}: {first['verdict']} "
        f"({first['note']}); rows in {csv_path}",
        file=sys.stderr,
    )
    return 1


def _only(opts: BenchOptions) -> set[str] | None:
    from .claims import CLAIM_IDS
    from .ladder import RUNG_NAMES, parse_only

    if opts.mode == "claims":
        return parse_only(opts.only, CLAIM_IDS, "claim")
    return parse_only(opts.only, RUNG_NAMES, "rung")


def _finish(files: list[Path]) -> int:
    print(files[1].read_text(**TEXT), end="")
    print("wrote " + ", ".join(str(f) for f in files))
    return 0


def _tta_exit(rows: list[dict], csv_path: Path) -> int:
    """1, saying so, when no seed reached the target: a run's time that ends short of it is no time to accuracy."""
    if any(r["reached"] for r in rows):
        return 0
    ran = [r for r in rows if r.get("status", "ok") == "ok"]
    failed = len(rows) - len(ran)
    if not ran:
        why = f"every seed's run failed ({len(rows)}; first: {rows[0]['error']})"
    else:
        best = max(r["best_val_acc"] for r in ran)
        why = (
            f"each of {len(ran)} seed(s) {'that ran ' if failed else ''}stopped after {rows[0]['max_epochs']} "
            f"epoch(s), the best at "
            f"{100 * best:.2f}%: more --epochs or a lower --target" + (f"; {failed} failed" if failed else "")
        )
    print(
        f"bench: nothing was measured: no run reached the target {100 * rows[0]['target']:.2f}% ({why}); "
        f"rows in {csv_path}",
        file=sys.stderr,
    )
    return 1


def run_bench(cfg: Config, opts: BenchOptions) -> int:
    if opts.mode == "compare":
        return _compare(cfg, opts)
    from cnnpar.engine.rundir import refuse_unwritable_settings

    from .tta import check_target

    # Bad flags fail before any data is loaded or anything is measured.
    # every rung's Trainer refuses these settings (a --data read under an ASCII locale): said once, not per rung
    refuse_unwritable_settings(cfg)
    if opts.mode == "time_to_accuracy":
        check_target(opts.target)
    if not opts.out:  # the default folder goes under --out-dir
        check_out_folder(cfg.run.out_dir, "--out-dir")
    only = _only(opts)
    if opts.mode == "claims":
        return _claims(cfg, opts)
    import torch

    from . import output
    from .tta import run_tta

    info, bundle, meta = _measurement_setup(cfg, opts.timing)
    check_ddp_devices(opts.ddp, info.device)
    # the start-up (imports, data, peak and FLOP count) is part of a budgeted run's time: say how much
    took = f"  [{time.monotonic() - opts.started:.0f} s]" if opts.started is not None else ""
    batch = meta["batch_size"] or "auto (searched on the device)"
    print(
        f"bench: {cfg.model.name} on {bundle.origin} ({meta['image_shape']}), batch {batch}, "
        f"{meta['device']} ({info.device.type}), torch {torch.__version__}; peak {meta['peak_tflops']} TFLOP/s "
        f"({meta['peak_kind']}); {meta['gflops_per_image']} GFLOP/image{took}",
        flush=True,
    )
    log = lambda text: print(text, flush=True)  # noqa: E731
    with results_folder(opts, cfg.run.out_dir, info.device, cfg.model.name) as out:
        if opts.mode == "time_to_accuracy":
            with kept_if_stopped(lambda rows: output.write_tta(out, rows)) as so_far:
                rows = run_tta(cfg, bundle, info, opts.target, opts.timing.repeats, meta, log, on_row=so_far)
            files = output.write_tta(out, rows)
            _finish(files)
            return _tta_exit(rows, files[0])
        return _ladder(cfg, opts, info, bundle, meta, only, log, out)


def refuse_ddp_without_a_rung(cfg: Config, opts: BenchOptions, device, bundle, only: set[str] | None) -> None:
    """The DDP rows run at the batch of the last rung measured: where every rung asked for is skipped on this device
    (`--only pin_memory` on a CPU: it needs CUDA) none can run, which the plan knows before anything is measured. It
    measured nothing, said "no DDP rows" and ended 0, the rows asked for missing."""
    from .ladder import plan_ladder

    asked = [p for p in plan_ladder(cfg, device, bundle) if only is None or p.rung.name in only]
    if any(not p.skip_reason for p in asked):
        return
    why = "; ".join(f"{p.rung.name}: {p.skip_reason}" for p in asked)
    raise UserError(
        f"bench --ddp {opts.ddp}: its rows run at the batch of the last ladder rung measured, and no rung asked for "
        f"(--only {opts.only}) runs on {device.type} ({why}): expected --only naming a rung measured here, or no --only"
    )


def _ladder(cfg: Config, opts: BenchOptions, info, bundle, meta: dict, only, log, out: Path) -> int:
    """The ladder's rows into `out`, then the DDP rows beside them where asked for; the exit status."""
    from . import output
    from .ladder import BUDGET_SPENT, run_ladder

    if opts.ddp:
        refuse_ddp_without_a_rung(cfg, opts, info.device, bundle, only)
    with kept_if_stopped(lambda rows: output.write_ladder(out, rows), stopped_row) as so_far:
        rows = run_ladder(cfg, bundle, info, opts.timing, meta, only, log, opts.budget_s, opts.started, on_row=so_far)
    measured = [r for r in rows if r["status"] == "ok"]
    failed = [r for r in rows if r["status"] == "failed"]
    spent = [r for r in rows if r["status"] == "skipped" and r["error"].startswith(BUDGET_SPENT)]
    # before any file is written: a refused budget leaves no folder, as tune's (the DDP rows need a rung's batch too)
    refuse_if_the_budget_measured_nothing(
        len(measured) + len(failed), len(spent), len(rows), "rung", opts.budget_s, LADDER_RETRY_S, opts.started
    )
    files = output.write_ladder(out, rows)
    _finish(files)
    if not measured and not failed:  # each rung asked for cannot run here (--only pin_memory on a CPU): documented, 0
        why = "; ".join(f"{r['name']}: {r['error']}" for r in rows)
        print(
            f"bench: note: nothing was measured: no rung asked for runs here ({why}); rows in {files[0]}",
            file=sys.stderr,
        )
    if failed and not measured:  # a table of failures is no measurement: say so in the exit code too
        first = failed[0]
        print(
            f"bench: every rung run failed ({len(failed)} of {len(rows)}, the rest skipped); first, {first['name']}: "
            f"{first['error']}; rows in {files[0]}",
            file=sys.stderr,
        )
        return 1
    if opts.ddp and not measured:  # (refused before: the budget's, --only's) no batch to run the DDP rows at
        print("bench: no DDP rows: no ladder rung was measured, so no batch to run them at", file=sys.stderr)
        return 1
    if opts.ddp:  # at the ladder's batch; rows asked for and not measured fail the bench as a failed ladder does
        ran = _ddp_rows(cfg, opts, out, info.device.type, bundle, measured[-1]["batch_size"])
        return 0 if ran else 1
    return 0
