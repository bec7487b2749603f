"""Checkpoints: written atomically by rank 0, read by every rank with weights_only=True.

Only tensors, numbers, strings, lists and dicts go in, so `torch.load(weights_only=True)` can
read them back without unpickling arbitrary objects.
"""

from __future__ import annotations

import errno
import math
import shlex
import zipfile
from pathlib import Path

import torch

from cnnpar.config import MAX_CLASSES, MAX_IMAGE_SIZE
from cnnpar.errors import UserError, brief_repr, first_line
from cnnpar.report.files import atomic_write, utf8_text, write_failure

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
        why = write_failure(first, path.parent)
        raise UserError(f"{path}: cannot be written ({why}): {kept_after_failed_write(path, first)}") from None


def _first_error(e: BaseException) -> BaseException:
    """The error the chain began with: torch's stream error (or a stop), then its zip writer's on closing."""
    while e.__context__ is not None and e.__cause__ is None and not e.__suppress_context__:
        e = e.__context__
    return e


# a folder that refuses files, whatever room its disk has (a read-only mount, another user's folder)
NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


def kept_after_failed_write(path: Path, error: BaseException | None = None) -> str:
    """What was expected of a run folder's file that cannot be written (`path`: a checkpoint, or a record such as
    metrics.csv; `error`, the write's), and what the run folder still holds (the earlier file stays): the end of the
    one line of every failed write of train, read where it fails."""
    run_dir = run_dir_of(path)
    epoch = checkpoint_epoch(run_dir)
    if isinstance(error, OSError) and error.errno in NOT_WRITABLE:
        expected = f"expected a run folder where files can be written ({run_dir} is not)"
    else:
        what = "the checkpoint" if path.suffix == ".pt" else "the run's records"
        expected = f"expected room for {what} (free disk space, a higher file size limit)"
    if not epoch:
        return f"{expected}; no epoch is saved in {run_dir}"
    again = shlex.quote(str(run_dir))
    return f"{expected}; the checkpoint in {run_dir} holds {epochs_held(epoch)}, which --resume {again} continues"


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


def require_checkpoint(path: str | Path) -> Path:
    """The checkpoint file `path` names (`find_checkpoint`), refused in one line where there is none; a run folder
    holding only its ckpt/best.pt (its last.pt removed) names that file and the flag that reads it."""
    path = Path(path)
    found = find_checkpoint(path)
    if found is not None:
        return found
    best = next((p for p in (path / "ckpt" / BEST, path / BEST) if p.is_file()), None)
    if best is not None:
        raise UserError(
            f"{path}: no checkpoint of its last epoch ({best.with_name(LAST)}), but {best} holds the best epoch's "
            f"weights: expected --checkpoint {shlex.quote(str(best))} to predict with them"
        )
    raise UserError(f"{path}: no checkpoint found (expected a .pt file or a run folder with ckpt/{LAST})")


def load_checkpoint(path: str | Path, map_location="cpu") -> dict:
    found = require_checkpoint(path)
    looks = foreign_file(found)
    if looks:
        raise UserError(f"{found}: not a checkpoint written by torch.save: {looks}")
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
        if "central directory" in str(e):  # torch's zip reader, where the archive's index (written last) is missing
            raise UserError(
                f"{found}: cut short: its zip index, written last, is missing (a copy or a save that did not "
                f"finish?): {EXPECTED_FILE}"
            ) from None
        raise UserError(f"{found}: not a readable cnnpar checkpoint ({first_line(e)})") from None


EXPECTED_FILE = f"expected a .pt file of cnnpar train (a run folder, or its ckpt/{LAST} or ckpt/{BEST})"


def foreign_file(path: Path) -> str:
    """What a file torch.save did not write looks like, with what was expected; "" where it may be one (a zip, even
    cut short, or a pickle: torch's legacy format). torch's weights-only reader calls any byte it cannot parse a
    pickle holding foreign objects: a CSV, a photo or a Git LFS pointer given as the checkpoint was said to hold
    "objects other than tensors", and a text file starting with 'e' ended in a bare "(101)"."""
    try:
        with path.open("rb") as f:
            head = f.read(512)
    except OSError:
        return ""  # unreadable (permissions): torch.load's error names why
    if head[:1] == b"\x80":  # a pickle's protocol mark: torch's legacy format, or another pickle torch.load refuses
        return ""
    if head[:2] == b"PK":
        try:
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
        except (zipfile.BadZipFile, OSError):
            return ""  # a zip cut short: torch.load says so
        if any(n.endswith("data.pkl") for n in names):
            return ""
        records = ", ".join(names[:3]) or "none"
        return f"a zip archive without torch.save's data.pkl (an .npz? its records: {records}): {EXPECTED_FILE}"
    if head.startswith(b"version https://git-lfs"):
        return (
            "a Git LFS pointer, the checkpoint itself never downloaded: expected the file it points to (`git lfs "
            "pull` in its repository fetches it)"
        )
    return f"{_looks_like(head)}: {EXPECTED_FILE}"


SIGNATURES = (
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"\x89PNG", "a PNG image"),
    (b"GIF8", "a GIF image"),
    (b"\x93NUMPY", "a NumPy .npy array"),
    (b"CNNPSTOR", "a cnnpar store (cnnpar prepare's images)"),
    (b"\x1f\x8b", "a gzip archive"),
)


def _looks_like(head: bytes) -> str:
    """A file's kind from its first bytes: a known signature, an HTML page, a CSV or other text, else its bytes."""
    if not head:
        return "an empty file"
    kind = next((what for mark, what in SIGNATURES if head.startswith(mark)), "")
    if kind:
        return kind
    if head.lstrip()[:15].lower().startswith((b"<!doctype html", b"<html")):
        return "an HTML page (a download that saved a web page?)"
    text = head.decode("utf-8", "replace")
    if "\x00" not in text and text.count("\ufffd") <= 1:  # one: a character cut at the 512th byte
        first = next((line for line in text.splitlines() if line.strip()), "")[:40]
        return f"{'a CSV' if ',' in first else 'a text'} file, its first line {first!r}"
    return f"binary data, its first bytes {head[:8].hex(' ')}"


def stored_state(ckpt: str | Path) -> dict | None:
    """A checkpoint file's state, its tensors mapped rather than read (for its epoch or meta alone); None where it
    cannot be read (cut short, damaged, not a checkpoint)."""
    try:
        # not mapped where the name is not strict UTF-8, as torch's mmap (UntypedStorage.from_file) encodes it: a
        # UTF-8 folder read under LC_ALL=C with PYTHONUTF8=0 (its é as lone surrogates) read as a damaged checkpoint
        state = torch.load(ckpt, map_location="cpu", weights_only=True, mmap=utf8_text(str(ckpt)))
    except Exception:  # torch raises several types for truncated or foreign files
        return None
    return state if isinstance(state, dict) else None


def stored_epoch(ckpt: str | Path) -> int | None:
    """The epoch a checkpoint file holds (0 where it names none); None where it cannot be read (cut short,
    damaged, not a checkpoint)."""
    if (state := stored_state(ckpt)) is None:
        return None
    epoch = state.get("epoch")
    return epoch if isinstance(epoch, int) else 0


def epochs_held(saved_epoch: int) -> str:
    """'epoch 1' or 'epochs 1-N': what a checkpoint holds, in the lines that say what a stopped run kept."""
    return "epoch 1" if saved_epoch == 1 else f"epochs 1-{saved_epoch}"


def checkpoint_epoch(run_dir: str | Path, ckpt: str | Path | None = None) -> int:
    """The last epoch the run folder's checkpoint holds (`ckpt`, that file of it, where given); 0 where it has
    none, or none that can be read."""
    ckpt = ckpt or find_checkpoint(run_dir)
    return (stored_epoch(ckpt) or 0) if ckpt is not None else 0


def _check_records(path: Path) -> None:
    """torch.save writes a zip whose records carry CRC-32 checksums that torch.load does not check: a flipped
    byte in a tensor loaded silently (one optimizer moment changed, training went on). Reading the records once
    to check them costs about a second per GB, once per resume or predict."""
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
    epoch = state.get("epoch") if isinstance(state, dict) else None
    if missing or not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        what = f"no {', '.join(repr(k) for k in missing)}" if missing else f"epoch {state.get('epoch')!r}"
        raise UserError(
            f"{path}: not a cnnpar training checkpoint ({what}): expected the ckpt/{LAST} of a run of cnnpar train"
        )
    return state


def refuse_nonfinite(weights: dict, path: Path, whose: str = "model") -> None:
    """Weights or buffers a command reads from a checkpoint (`whose`: the model's, or its weight average's) that are
    not finite: cnnpar never saves them (a diverged epoch, its weights or its average, stops before its checkpoint),
    so the file was changed under a valid checksum (edited, another tool's); a resume trained a whole epoch on it,
    then blamed the learning rate, and predict blamed a diverged run, or (a -inf bias before a ReLU) predicted."""
    for name, t in weights.items():
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise UserError(
                f"{path}: its {whose}'s {name} holds values that are not finite (NaN or inf), which cnnpar train "
                "never saves: expected an intact checkpoint (an earlier copy of it, or train again)"
            )


def average_problem(state: dict) -> str:
    """What predict and a resume cannot read of a checkpoint's weight average ('average', --ema: AveragedModel's
    state dict, its count and its weights), "" where it has none or nothing is wrong: an edited file's list or
    text there ended in an AttributeError traceback."""
    if "average" not in state:
        return ""
    average = state["average"]
    if not isinstance(average, dict):
        return f"its 'average' is {brief_repr(average)}: expected the weight average's dict of tensors"
    count = average.get("n_averaged")
    if not (isinstance(count, torch.Tensor) and count.numel() == 1 and not count.is_floating_point()):
        return f"its average's n_averaged is {brief_repr(count)}: expected its count of updates"
    return ""


def require_average(state: dict, path: Path) -> dict:
    """The checkpoint's weight average (`average_problem`), refused in one line where it cannot be read."""
    if problem := average_problem(state):
        raise UserError(
            f"{path}: not a checkpoint a resume can read ({problem}): expected a checkpoint of cnnpar train"
        )
    return state["average"]


MAX_INPUT_VALUES = 3 * MAX_IMAGE_SIZE**2  # one input as large as the largest --image-size makes, in any shape
MODEL_DESCRIPTION = ("model", "image_shape", "num_classes", "mean", "std", "class_names")  # the 'meta' predict reads


def require_model_description(state, path: Path) -> dict:
    """The 'meta' predict builds its model and inputs from, refused in one line where a key it reads is missing or
    unusable, or the file holds no weights: an edited file, or another tool's with a 'meta' dict, ended in a
    KeyError traceback."""
    meta = state.get("meta") if isinstance(state, dict) else None
    if not isinstance(meta, dict):
        raise UserError(f"{path}: holds no model description ('meta'): expected a checkpoint of cnnpar train")
    problem = _description_problem(meta)
    if not problem and "model" not in state:
        problem = "no 'model' weights"
    problem = problem or average_problem(state)  # predict reads the average where it has started
    config = state.get("config") or {}  # predict reads the trained run's settings from its sections
    if not problem and not (isinstance(config, dict) and all(isinstance(v, dict) for v in config.values())):
        problem = f"its config is {brief_repr(config)}: expected a dict of sections"
    if problem:
        raise UserError(f"{path}: not a checkpoint predict can read ({problem}): expected a checkpoint of cnnpar train")
    return meta


def _description_problem(meta: dict) -> str:
    """The first thing in a checkpoint's meta predict cannot use, "" where there is none."""
    missing = [k for k in MODEL_DESCRIPTION if k not in meta]
    if missing:
        return f"its meta has no {', '.join(repr(k) for k in missing)}"
    shape, classes, names = meta["image_shape"], meta["num_classes"], meta["class_names"]
    # bounded as the flags that set them are: a model for 10**12 classes or inputs of 10**6 x 10**6 (an edited or
    # foreign file) was allocated before its weights were read
    sides = isinstance(shape, list | tuple) and len(shape) == 3 and all(_whole(v) for v in shape)
    if not (sides and math.prod(shape) <= MAX_INPUT_VALUES):
        largest = f"3x{MAX_IMAGE_SIZE}x{MAX_IMAGE_SIZE}"
        return f"its meta's image_shape is {brief_repr(shape)}: expected [channels, height, width], at most {largest}"
    if not (_whole(classes) and classes <= MAX_CLASSES):
        return f"its meta's num_classes is {classes!r}: expected a whole number from 1 to {MAX_CLASSES:,}"
    for key in ("mean", "std"):
        values = meta[key]
        numbers = isinstance(values, list | tuple) and all(_real(v) and (v or key == "mean") for v in values)
        if not (numbers and len(values) == shape[0]):  # a std of 0 made every input inf
            return f"its meta's {key} is {values!r}: expected one number per channel ({shape[0]})"
    if not (isinstance(names, list | tuple) and (not names or len(names) >= classes)):
        return f"its meta's class_names is {names!r}: expected a list of {classes} names"
    return ""


def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _real(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def load_model_weights(model: torch.nn.Module, weights, path: Path, described: str, whose: str = "model") -> None:
    """Load `weights` into `model`, refused in one line naming the first weight that does not fit: torch's own
    error is a traceback listing every mismatch, from a checkpoint whose meta disagrees with its weights (edited,
    or from a version of cnnpar whose model layers were renamed or resized since). `whose`: the model's weights, or
    its weight average's (an AveragedModel's state dict, its names under module.)."""
    try:
        model.load_state_dict(weights)
    except (RuntimeError, TypeError, AttributeError) as e:  # a mismatch; a 'model' that is no dict of tensors
        what = "its weights do not" if whose == "model" else f"its {whose}'s weights do not"
        raise UserError(
            f"{path}: {what} fit {described} ({_first_mismatch(model.state_dict(), weights, e, whose)}): "
            "expected a checkpoint written by this cnnpar's train for that model"
        ) from None


def optimizer_state_problem(optimizer: torch.optim.Optimizer, saved, names: dict) -> str:
    """What of a checkpoint's optimizer state does not fit this run's parameters ("" where nothing is found; `names`:
    each parameter's name in the model): torch's load_state_dict compares only the parameter counts, so a moment
    or momentum buffer of another shape (an edited file) loaded, and the first step ended in a foreach kernel's
    traceback after the run folder's records were rewritten."""
    if not (
        isinstance(saved, dict) and isinstance(saved.get("state"), dict) and isinstance(saved.get("param_groups"), list)
    ):
        return f"its 'optimizer' is {brief_repr(saved)}: expected an optimizer's state dict"
    groups = saved["param_groups"]
    if not all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups):
        return "its optimizer's param_groups are not lists of parameters"
    if [len(g["params"]) for g in groups] != [len(g["params"]) for g in optimizer.param_groups]:
        return ""  # another grouping: torch's own check (a ValueError the resume words) names it
    ids = [i for g in groups for i in g["params"]]
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for i, p in zip(ids, params):
        values = saved["state"].get(i, {})
        if not isinstance(values, dict):
            return f"the state of {names.get(p, f'parameter {i}')} is {brief_repr(values)}: expected a dict of tensors"
        for key, value in values.items():
            if isinstance(value, torch.Tensor) and value.dim() and value.shape != p.shape:  # a step count is 0-D
                return (
                    f"{names.get(p, f'parameter {i}')}'s {key} is {list(value.shape)}, the parameter's {list(p.shape)}"
                )
    return ""


def _first_mismatch(expected: dict, weights, error: BaseException, whose: str = "model") -> str:
    """The first weight missing, extra or of another shape; torch's first line on it where none of those is it."""
    if not isinstance(weights, dict):
        key = "model" if whose == "model" else "average"
        return f"its '{key}' is a {type(weights).__name__}, not a dict of tensors"
    for name, tensor in expected.items():
        got = weights.get(name)
        if got is None:
            return f"no {name}"
        if not isinstance(got, torch.Tensor):
            return f"{name} is a {type(got).__name__}, not a tensor"
        if got.shape != tensor.shape:
            return f"{name} is {list(got.shape)}, the model's {list(tensor.shape)}"
    extra = next((name for name in weights if name not in expected), None)
    if extra is not None:
        return f"{extra} is not in the model"
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[1] if len(lines) > 1 else first_line(error)
