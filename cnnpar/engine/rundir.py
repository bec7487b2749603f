"""Where a run's files go, and which checkpoint (if any) it resumes from."""

from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path

from cnnpar.config import Config
from cnnpar.dist import DistInfo, broadcast_object
from cnnpar.engine.checkpoint import find_checkpoint
from cnnpar.errors import UserError


def elastic_restart() -> bool:
    """True when torchrun restarted this worker group after a failure (--max-restarts)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0


def default_name(cfg: Config, info: DistInfo) -> str:
    """A name every rank agrees on and that survives torchrun restarts.

    torchrun keeps one job id across restarts (--standalone makes a fresh one per launch), so a
    restarted job finds its own folder again; otherwise rank 0's clock decides and is broadcast.
    """
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none":
        return f"{cfg.model.name}-{run_id[:12]}"
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = f"{cfg.model.name}-{stamp}"
    # Two runs started within the same second must not collide (the second would refuse to start).
    n = 1
    while (Path(cfg.run.out_dir) / name).exists():
        n += 1
        name = f"{cfg.model.name}-{stamp}-{n}"
    return broadcast_object(name, info)


def resolve_run(cfg: Config, info: DistInfo) -> tuple[Path, Path | None]:
    """Return (run folder, checkpoint to resume from or None). Creates nothing."""
    resume = cfg.run.resume
    if resume and resume != "auto":
        target = Path(resume)
        ckpt = find_checkpoint(target)
        if ckpt is None:
            raise UserError(
                f"--resume {resume}: no checkpoint there (expected a run folder with ckpt/last.pt or a .pt file)"
            )
        run_dir = target if target.is_dir() else ckpt.parent.parent if ckpt.parent.name == "ckpt" else ckpt.parent
        return run_dir, ckpt
    name = cfg.run.name or default_name(cfg, info)
    run_dir = Path(cfg.run.out_dir) / name
    existing = find_checkpoint(run_dir) if run_dir.is_dir() else None
    if resume == "auto" or elastic_restart():
        return run_dir, existing
    if existing is not None:
        raise UserError(
            f"{run_dir}: already holds a run with a checkpoint: pass --resume auto to continue it, "
            f"or choose another --name"
        )
    return run_dir, None
