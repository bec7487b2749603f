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


def save_checkpoint(path: str | Path, state: dict) -> None:
    atomic_write(path, lambda p: torch.save(state, p))


def find_checkpoint(path: str | Path) -> Path | None:
    """A checkpoint file, or the newest one of a run folder (None when it has none yet)."""
    path = Path(path)
    if path.is_file():
        return path
    for candidate in (path / "ckpt" / LAST, path / LAST):
        if candidate.is_file():
            return candidate
    return None


def run_dir_of(ckpt: Path) -> Path:
    """The run folder a checkpoint file belongs to: RUN for RUN/ckpt/last.pt, else its own folder."""
    return ckpt.parent.parent if ckpt.parent.name == "ckpt" else ckpt.parent


def load_checkpoint(path: str | Path, map_location="cpu") -> dict:
    path = Path(path)
    found = find_checkpoint(path)
    if found is None:
        raise UserError(f"{path}: no checkpoint found (expected a .pt file or a run folder with ckpt/{LAST})")
    try:
        return torch.load(found, map_location=map_location, weights_only=True)
    except Exception as e:  # torch raises several types for truncated or foreign files
        raise UserError(f"{found}: not a readable cnnpar checkpoint ({first_line(e)})") from None
