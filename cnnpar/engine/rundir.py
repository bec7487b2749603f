"""Where a run's files go, and which checkpoint (if any) it resumes from.

Rank 0 decides and broadcasts the decision, so every rank agrees on the folder and the
checkpoint even when their clocks or their views of the file system differ; each rank then
checks that it can see the checkpoint it must read.
"""

from __future__ import annotations

import datetime as _dt
import os
import uuid
from pathlib import Path

from cnnpar.config import Config, load_toml
from cnnpar.dist import DistInfo, broadcast_object
from cnnpar.engine.checkpoint import find_checkpoint, resumed_checkpoint, run_dir_of
from cnnpar.errors import UserError


def elastic_restart() -> bool:
    """True when torchrun restarted this worker group after a failure (--max-restarts)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0


def torchrun_job_id() -> str:
    """torchrun's job id (--rdzv-id; --standalone makes one per launch), '' when there is none.

    It is the same in every attempt of one launch, so a restarted job finds its folder again.
    A multi-node launch without --rdzv-id gets the literal 'none', which names nothing.
    """
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    return "" if run_id in ("", "none") else run_id


NO_NAME_TO_RESUME = (
    "--resume auto: no --name to find the run by (a run without one gets a new folder each time): "
    "expected --name NAME or --resume runs/NAME"
)


def launch_stable_job_id() -> bool:
    """A torchrun job id that a later launch can give again (--rdzv-id=myjob), not the random UUID that
    --standalone makes for each launch: only the former can find an earlier launch's folder."""
    run_id = torchrun_job_id()
    if not run_id:
        return False
    try:
        uuid.UUID(run_id)
    except ValueError:
        return True
    return False


def restarts_cannot_find_run(cfg: Config) -> bool:
    """torchrun may restart this job, but a restart would not know which folder to resume."""
    may_restart = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0
    return may_restart and not cfg.run.name and not torchrun_job_id()


def default_name(cfg: Config) -> str:
    run_id = torchrun_job_id()
    if run_id:
        return f"{cfg.model.name}-{run_id[:12]}"
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = f"{cfg.model.name}-{stamp}"
    # Two runs started within the same second must not collide (the second would refuse to start).
    n = 1
    while (Path(cfg.run.out_dir) / name).exists():
        n += 1
        name = f"{cfg.model.name}-{stamp}-{n}"
    return name


def same_source(a: str, b: str) -> bool:
    """The same --data, also when typed once as ./train.csv and once as train.csv."""
    return a == b or (Path(a).exists() and Path(b).exists() and Path(a).resolve() == Path(b).resolve())


def refuse_other_data(run_dir: Path, cfg: Config) -> None:
    """A run folder holds one data set's run: another data set's epochs, checkpoint and config.toml
    must not land on top of it (a `--resume auto` that lost its --data would do just that)."""
    stored = run_dir / "config.toml"
    if not stored.is_file():
        return
    try:
        source = load_toml(stored).data.source
    except UserError:
        return  # an unreadable config.toml is not a run's record worth protecting
    if not same_source(source, cfg.data.source):
        raise UserError(
            f"{run_dir}: holds a run on --data {source} (its config.toml), not {cfg.data.source}: "
            f"expected --data {source}, or another --name"
        )


def _decide(cfg: Config) -> tuple[str, str | None]:
    """Rank 0's decision: (run folder, checkpoint or None). Raises UserError; creates nothing."""
    resume = cfg.run.resume
    if resume and resume != "auto":
        target = Path(resume)
        ckpt = resumed_checkpoint(target)
        if ckpt is None:
            again = ""
            if (target / "config.toml").is_file():  # a run stopped before its first checkpoint
                folder = target.resolve()  # `--resume .` names no folder of its own
                again = f"; this run stopped before its first epoch was saved: --resume auto --name {folder.name}"
                again += f" --out-dir {folder.parent} starts it again from its config.toml"
            raise UserError(
                f"--resume {resume}: no checkpoint there (expected a run folder with ckpt/last.pt or a .pt file)"
                + again
            )
        run_dir = run_dir_of(ckpt)
        if ckpt.parent.name != "ckpt" or not (run_dir / "config.toml").is_file():
            # a loose .pt: its folder would become the run folder (config.toml, metrics.csv, ckpt/ written over
            # whatever is there), with the default data, as nothing records the run's own
            raise UserError(
                f"--resume {resume}: {ckpt} is not in a run folder (RUN/ckpt/{ckpt.name} beside RUN/config.toml): "
                "a resume continues a run in its own folder; expected that run folder or its checkpoint"
            )
        name = cfg.run.name
        # the name given must be this folder's: the same path once resolved (a folder reached through a link
        # keeps its link's name), as cliargs._names_folder compares them
        named = Path(cfg.run.out_dir) / name
        if name and named.resolve() != run_dir.resolve():
            # its config.toml would then record another run's folder (a re-run of a resumed run's config.toml
            # did; so would --out-dir elsewhere)
            raise UserError(
                f"--resume {resume}: continues the run in {run_dir}, not {named} (--name, --out-dir or --config): "
                f"expected neither (a resume writes to its own run's folder only), or --name {name} without "
                f"--resume for a new run"
            )
        refuse_other_data(run_dir, cfg)
        return str(run_dir), str(ckpt)
    if resume == "auto" and not cfg.run.name and not (elastic_restart() or launch_stable_job_id()):
        # the folder would be a new default name: a run that resumes nothing, where one was asked for
        raise UserError(NO_NAME_TO_RESUME)
    run_dir = Path(cfg.run.out_dir) / (cfg.run.name or default_name(cfg))
    existing = find_checkpoint(run_dir) if run_dir.is_dir() else None
    refuse_other_data(run_dir, cfg)
    if resume == "auto" or elastic_restart():
        return str(run_dir), str(existing) if existing else None
    if existing is not None:
        raise UserError(
            f"{run_dir}: already holds a run with a checkpoint: pass --resume auto to continue it, "
            f"or choose another --name"
        )
    return str(run_dir), None


def resolve_run(cfg: Config, info: DistInfo) -> tuple[Path, Path | None]:
    """Return (run folder, checkpoint to resume from or None), the same on every rank."""
    decision: tuple[str, str | None] | str
    if info.is_main:
        try:
            decision = _decide(cfg)
        except UserError as e:
            decision = str(e)  # broadcast the refusal too, or the other ranks would wait for a folder
    else:
        decision = ""
    decision = broadcast_object(decision, info)
    if isinstance(decision, str):
        raise UserError(decision)
    run_dir, ckpt = decision
    if ckpt is not None and not Path(ckpt).is_file():
        raise UserError(
            f"{ckpt}: rank 0 resumes from this checkpoint but rank {info.rank} cannot read it: every node "
            f"must see --out-dir (a shared file system)"
        )
    return Path(run_dir), Path(ckpt) if ckpt is not None else None
