"""Checkpoints: written atomically by rank 0, read by every rank with weights_only=True.

Only tensors, numbers, strings, lists and dicts go in, so `torch.load(weights_only=True)` can
read them back without unpickling arbitrary objects.
"""

from __future__ import annotations

from pathlib import Path

import torch

from cnnpar.errors import UserError, first_line
from cnnpar.report.files import atomic_write

LAST = "last.pt"
# the weights of the epoch with the best validation accuracy so far, for predict: ckpt/last.pt alone left a run
# whose accuracy peaked early with only its later, worse weights
BEST = "best.pt"
TRAINING_ONLY = ("optimizer", "scheduler", "precision")  # what a resume needs and best.pt leaves out


def best_state(state: dict) -> dict:
    """A training state without what only a resume reads: the model (and its weight average), its description,
    config and history, as predict reads them."""
    return {k: v for k, v in state.items() if k not in TRAINING_ONLY}


# torch.save's errors when its file cannot take the bytes (a full disk, a file size limit): its C++ stream's, then
# its zip writer's on closing
WRITE_ERRORS = ("iostream error", "unexpected pos", "PytorchStreamWriter")


def save_checkpoint(path: str | Path, state: dict) -> None:
    """Write `state` to `path` atomically; UserError where it cannot be written (a full disk, a file size limit):
    torch.save's own error is two chained C++ stream errors ("basic_ios::clear: iostream error" then "unexpected
    pos"), which name neither the file nor the cause, and the run ended in their traceback."""
    path = Path(path)
    try:
        atomic_write(path, lambda p: torch.save(state, p))
    except (OSError, RuntimeError) as e:
        first = _first_error(e)
        if isinstance(first, KeyboardInterrupt):  # a Ctrl-C or SIGTERM in torch.save, its zip writer's error over it
            raise first from None
        if not isinstance(first, OSError) and not any(mark in str(first) for mark in WRITE_ERRORS):
            raise  # not the file's: a CUDA error met in the copy to the host keeps its own traceback
        raise UserError(f"{path}: cannot be written ({_write_failure(first, path.parent)}): {_kept(path)}") from None


def _first_error(e: BaseException) -> BaseException:
    """The error the chain began with: torch's stream error (or a stop), then its zip writer's on closing."""
    while e.__context__ is not None and e.__cause__ is None and not e.__suppress_context__:
        e = e.__context__
    return e


def _write_failure(e: BaseException, folder: Path) -> str:
    """The error, with what the disk and the process's file size limit allow: torch's stream error alone does not
    say which of them ran out."""
    import shutil

    facts = [first_line(e)]
    try:
        facts.append(f"{shutil.disk_usage(folder).free / 2**20:,.0f} MB free on its disk")
    except OSError:
        pass
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if limit != resource.RLIM_INFINITY:
            facts.append(f"a file size limit (ulimit -f) of {limit / 2**20:,.1f} MB")
    except (ImportError, OSError, ValueError):  # no resource module off Unix
        pass
    return "; ".join(facts)


def _kept(path: Path) -> str:
    """What the run folder still holds after a failed write of one of its checkpoints (the earlier file stays)."""
    run_dir = run_dir_of(path)
    epoch = checkpoint_epoch(run_dir)
    expected = "expected room for the checkpoint (free disk space, a higher file size limit)"
    if not epoch:
        return f"{expected}; no epoch is saved in {run_dir}"
    return f"{expected}; the checkpoint in {run_dir} holds epochs 1-{epoch}, which --resume {run_dir} continues"


def find_checkpoint(path: str | Path) -> Path | None:
    """A checkpoint file, or the newest one of a run folder (None when it has none yet)."""
    path = Path(path)
    if path.is_file():
        return path
    for candidate in (path / "ckpt" / LAST, path / LAST):
        if candidate.is_file():
            return candidate
    return None


def resumed_checkpoint(path: str | Path) -> Path | None:
    """The checkpoint `--resume PATH` continues (None where there is none): a link to a run's checkpoint file is
    that run's checkpoint, in that run's folder (the run's config.toml and the run folder are read from there)."""
    found = find_checkpoint(path)
    return found.resolve() if found is not None and found.is_symlink() else found


def run_dir_of(ckpt: Path) -> Path:
    """The run folder a checkpoint file belongs to: RUN for RUN/ckpt/last.pt, else its own folder."""
    return ckpt.parent.parent if ckpt.parent.name == "ckpt" else ckpt.parent


TRAINING_STATE = ("model", "optimizer", "scheduler", "precision", "epoch", "history")  # what a resume reads


def load_checkpoint(path: str | Path, map_location="cpu") -> dict:
    path = Path(path)
    found = find_checkpoint(path)
    if found is None:
        raise UserError(f"{path}: no checkpoint found (expected a .pt file or a run folder with ckpt/{LAST})")
    _check_records(found)
    try:
        return torch.load(found, map_location=map_location, weights_only=True)
    except Exception as e:  # torch raises several types for truncated or foreign files
        if "weights_only" in str(e) or "Weights only load failed" in str(e):
            # torch's own advice here is to load it with weights_only=False: code from the file would then run
            raise UserError(
                f"{found}: holds objects other than tensors, numbers, strings, lists and dicts, which cnnpar never "
                f"unpickles: not a cnnpar checkpoint (expected one written by cnnpar train)"
            ) from None
        raise UserError(f"{found}: not a readable cnnpar checkpoint ({first_line(e)})") from None


def checkpoint_epoch(run_dir: str | Path, ckpt: str | Path | None = None) -> int:
    """The last epoch the run folder's checkpoint holds (`ckpt`, that file of it, where given); 0 where it has
    none, or none that can be read."""
    ckpt = ckpt or find_checkpoint(run_dir)
    if ckpt is None:
        return 0
    try:  # mmap: the epoch without reading the tensors
        state = torch.load(ckpt, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # torch raises several types for truncated or foreign files
        return 0
    epoch = state.get("epoch") if isinstance(state, dict) else None
    return epoch if isinstance(epoch, int) else 0


def _check_records(path: Path) -> None:
    """torch.save writes a zip whose records carry CRC-32 checksums that torch.load does not check: a flipped
    byte in a tensor loaded silently (one optimizer moment changed, training went on). Reading the records once
    to check them costs about a second per GB, once per resume or predict."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, OSError):
        return  # not a zip (a truncated file, a legacy pickle): torch.load says what it is
    if bad is not None:
        raise UserError(
            f"{path}: damaged: its record {bad} fails its checksum (a disk or copy error): expected an intact "
            "checkpoint (an earlier copy of it, or train again)"
        )


def require_training_state(state, path: Path) -> dict:
    """A checkpoint a resume can continue from: what cnnpar train saves. A plain state_dict or another tool's
    file would otherwise fail with a KeyError traceback."""
    missing = [k for k in TRAINING_STATE if k not in state] if isinstance(state, dict) else list(TRAINING_STATE)
    if path.name == BEST and missing:
        raise UserError(
            f"{path}: holds the best epoch's weights, for `cnnpar predict`, not a training state: expected the run's "
            f"ckpt/{LAST} (or the run folder) to resume"
        )
    if missing or not isinstance(state.get("epoch"), int):
        what = f"no {', '.join(repr(k) for k in missing)}" if missing else f"epoch {state.get('epoch')!r}"
        raise UserError(
            f"{path}: not a cnnpar training checkpoint ({what}): expected the ckpt/{LAST} of a run of cnnpar train"
        )
    return state
