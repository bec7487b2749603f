"""Time to accuracy: train with the engine until validation accuracy first reaches a target.

The Trainer's own epoch and evaluation are driven here (not `fit()`, which writes a run folder
and checkpoints whose cost would be counted). The learning-rate schedule spans `run.epochs`, the
most epochs allowed; the clock stops at the first evaluation that reaches the target. Compile
happens in `warm_up_compile` before the clock starts and is reported separately.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from cnnpar.bench.measure import error_text
from cnnpar.config import Config
from cnnpar.data import DataBundle, load_data
from cnnpar.dist import DistInfo
from cnnpar.engine.harness import build_trainer, reset_compiler
from cnnpar.engine.stops import raise_if_the_stop
from cnnpar.errors import Diverged, UserError
from cnnpar.presets import with_overrides
from cnnpar.report.meters import free_device_memory


def check_target(target: float | None) -> None:
    if target is None:  # not given (a typed 0 is told what is expected, as any value outside (0, 1] is)
        raise UserError(
            "bench --time-to-accuracy needs --target: expected a validation accuracy in (0, 1], such as 0.99"
        )
    if not 0.0 < target <= 1.0:
        raise UserError(f"bench --target {target}: expected a validation accuracy in (0, 1], such as 0.99")


def check_has_val(bundle: DataBundle) -> None:
    if bundle.val is None:
        raise UserError(
            f"{bundle.origin}: no validation split to measure accuracy on: give data with a test split "
            "or a --val-fraction above 0"
        )


def time_to_accuracy(cfg: Config, bundle: DataBundle, info: DistInfo, target: float, seed: int) -> dict:
    cfg = with_overrides(cfg, run={"seed": seed, "progress": False})
    free_device_memory(info.device)
    reset_compiler()
    trainer = build_trainer(cfg, info, bundle, whole_run=True)  # the epochs `cnnpar train` would run, compiled alike
    try:
        trainer.warm_up_compile()
        accs: list[float] = []
        train_s = eval_s = 0.0
        start = time.perf_counter()
        for epoch in range(1, cfg.run.epochs + 1):
            trained = trainer.train_epoch(epoch)
            train_s += trained["epoch_s"]
            t0 = time.perf_counter()
            evaluated = trainer.evaluate()  # ends on a host sync
            eval_s += time.perf_counter() - t0
            # a diverged model's NaN logits argmax to class 0, which "reaches" the target on data mostly of it
            trainer.check_diverged(epoch, {**trained, **evaluated})
            accs.append(evaluated["val_acc"])
            if accs[-1] >= target:
                break
        wall_s = time.perf_counter() - start
    finally:
        trainer.close()
    rc = trainer.cfg
    row = {
        "seed": seed,
        "target": target,
        "reached": accs[-1] >= target,
        "epochs": len(accs),
        "max_epochs": cfg.run.epochs,
        "steps": len(accs) * trainer.steps_per_epoch,
        "batch_size": rc.run.batch_size,  # the batch trained: with auto on a GPU, this seed's search's, not meta's 0
        "wall_s": wall_s,
        "wall_with_compile_s": wall_s + trainer.compile_s,
        "train_s": train_s,
        "eval_s": eval_s,
        "compile_s": trainer.compile_s,
        "final_val_acc": accs[-1],
        "best_val_acc": max(accs),
        "acc_by_epoch": " ".join(f"{a:.4f}" for a in accs),
        "precision": rc.speed.precision,
        "channels_last": rc.speed.channels_last,
        "compile": rc.speed.compile,
        "loader": rc.data.loader,
        "optimizer": rc.optim.optimizer,
        "lr": trainer.lr,
    }
    del trainer
    free_device_memory(info.device)
    return row


def run_tta(
    cfg: Config,
    bundle: DataBundle,
    info: DistInfo,
    target: float,
    repeats: int,
    meta: dict,
    log: Callable[[str], None] = print,
    on_row: Callable[[list[dict]], None] = lambda rows: None,
) -> list[dict]:
    """One row per seed (seed, seed + 1, ...): time-to-accuracy varies with the seed, so report each. `on_row`
    gets the rows so far after each seed (what a stopped bench still writes)."""
    check_target(target)
    check_has_val(bundle)
    rows = []
    for r in range(repeats):
        seed = cfg.run.seed + r
        log(f"bench: time to {100 * target:.2f}% accuracy, seed {seed} (at most {cfg.run.epochs} epochs) ...")
        try:
            # the seed draws the hold-out too (data without its own split): seed N's row trains and validates on
            # the split `cnnpar train --seed N` does, not on the first seed's
            seeded = bundle if seed == cfg.run.seed else load_data(cfg.data, seed)
            row = {**meta, **time_to_accuracy(cfg, seeded, info, target, seed), "status": "ok"}
        except Exception as e:  # noqa: BLE001
            raise_if_the_stop(e)  # a stop's doing is the stop, not a failed seed
            if isinstance(e, UserError) and not isinstance(e, Diverged):
                raise  # bad input: the one-line error, as for every command
            # out of memory, say, or this seed's training diverged: a failed row, and the other seeds still run
            row = {**meta, "seed": seed, "target": target, "reached": False, "max_epochs": cfg.run.epochs}
            row.update(status="failed", error=error_text(e))
            log(f"bench: seed {seed}: failed ({row['error']})")
            rows.append(row)
            on_row(rows)
            free_device_memory(info.device)
            continue
        state = "reached" if row["reached"] else "NOT reached"
        log(
            f"bench: seed {seed}: {state} after {row['epochs']} epoch(s): {row['wall_s']:.2f} s "
            f"({row['wall_with_compile_s']:.2f} s with compile), final acc {100 * row['final_val_acc']:.2f}%"
        )
        rows.append(row)
        on_row(rows)
    return rows
