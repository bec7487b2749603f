"""Every rank of a job trains one model: the ranks check that they agree before the first epoch.

Each node reads its own command line, data and (on a disk of its own) checkpoint, and nothing else
compares them: a node given another --lr, another --epochs, other data of the same size or another
copy of the run folder trained on silently (DDP broadcasts the weights when it wraps the model, before
a checkpoint is loaded), or hung at the end waiting for epochs the others never ran. Rank 0's values
are sent to every rank, and every rank stops with the same one line where a rank differs.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from cnnpar.config import Config, setting_name, to_dict
from cnnpar.dist import DistInfo, all_reduce_max, broadcast_object
from cnnpar.errors import EveryRankRefused, UserError

# Settings that may differ from node to node: where this node's copy of the data lies (its content is compared
# instead), how this node's host feeds and runs its device, and what rank 0 alone decides for all (the run folder
# and the checkpoint, broadcast by rundir.resolve_run) or alone writes (progress, TensorBoard, telemetry).
PER_NODE_SETTINGS = {
    "data": (
        "source",
        "workers",
        "pin_memory",
        "persistent_workers",
        "prefetch_factor",
        "prefetch_stream",
        "resident",
        "decode",
        "cpu_share",
        "gpu_resize",
    ),
    "speed": (
        "device",
        "channels_last",
        "compile",
        "cudnn_benchmark",
        "compile_tuning",
        "compile_tiling",
        "compile_eval",
        "cuda_graphs",
    ),
    "dist": ("nproc", "debug_single", "timeout_s"),
    "run": ("out_dir", "name", "resume", "progress", "monitor", "tensorboard"),
}


# Settings that others are resolved from, compared first: the one named is then the one typed. A --batch-size of
# one node's own also changed its resolved optim.lr_batch (config.lr_reference), met first in section order, so the
# ranks were told of a --lr-batch nobody typed; a --lr-batch of its own changes the lr an automatic batch scales.
COMPARED_FIRST = ("run.batch_size", "optim.lr_batch")
# What 0 stands for in a setting where it means "auto", said beside it: "rank 0's 0" read as a value given
ZERO_MEANS = {"data.image_size": "auto: the source's size", "data.num_classes": "auto: from the labels"}


def shared_settings(cfg: Config) -> dict[str, Any]:
    """The resolved settings every rank must share, by "section.name", COMPARED_FIRST first."""
    every = {
        f"{section}.{name}": value
        for section, values in to_dict(cfg).items()
        for name, value in values.items()
        if name not in PER_NODE_SETTINGS.get(section, ())
    }
    return {**{key: every[key] for key in COMPARED_FIRST if key in every}, **every}


# The field of `data_identity` for an image folder's content (data/sources.folder_content_sample)
CONTENT_SAMPLE = "data's checksum of file sizes and sampled bytes"


def data_identity(meta: dict, train: int, val: int, content_sample: str = "") -> dict[str, Any]:
    """What says two ranks hold the same data, wherever its copy lies: the checkpoint's data fields (the path
    left out), the split's sizes and, for an image folder (whose checksum covers names and classes only), its
    `content_sample`: its files' sizes and some of their bytes."""
    # the checksum first: the difference named is then the one that says most (not the mean pixel it moved)
    first = [key for key in ("data_checksum", "examples", "num_classes", "class_names", "image_shape") if key in meta]
    keys = first + [key for key in meta if key not in first and key != "data_path"]
    same = {f"data's {key.removeprefix('data_').replace('_', ' ')}": meta[key] for key in keys}
    sampled = {CONTENT_SAMPLE: content_sample} if content_sample else {}
    return {**same, "data's training samples": train, "data's validation samples": val, **sampled}


def weights_checksum(model: torch.nn.Module) -> str:
    """A short checksum of the weights and buffers (BatchNorm statistics): each tensor's float64 sum, read back
    in one copy. Ranks that loaded the same bytes get the same sums, bit for bit."""
    tensors = [t for t in model.state_dict().values() if t.is_floating_point()]
    if not tensors:
        return ""
    sums = torch.stack([t.detach().double().sum() for t in tensors]).cpu()  # note: a CPU-GPU sync point
    return hashlib.sha256(sums.numpy().tobytes()).hexdigest()[:16]


def _shown(key: str) -> str:
    section, _, name = key.partition(".")
    return setting_name(section, name) if name and " " not in key else key


def _short(value: Any, most: int = 28) -> str:
    """A value for the one line: long ones (a checksum, a list of class names) cut, enough to tell them apart, and
    closed as they opened (a cut string keeps its closing quote, a cut list its bracket)."""
    text = repr(value)
    if len(text) <= most:
        return text
    if isinstance(value, str):
        return text[: most - 4] + "..." + text[0]  # the quote repr chose
    if isinstance(value, (list, tuple)) and text[-1] in ")]":  # whole items, as many as fit, then the rest cut
        shown = [_short(value[0], most - 7)]
        for item in value[1:]:
            if len(", ".join([*shown, repr(item)])) > most - 7:
                break
            shown.append(repr(item))
        return f"{text[0]}{', '.join(shown)}, ...{text[-1]}"
    return text[: most - 3] + "..."


def _value(key: str, value: Any) -> str:
    meaning = ZERO_MEANS.get(key) if value == 0 and not isinstance(value, bool) else None
    return f"0 ({meaning})" if meaning else _short(value)


def first_difference(reference: dict, mine: dict, rank: int) -> str:
    """The first field where `mine` (rank `rank`'s) differs from rank 0's `reference`, in words ("" where none)."""
    for key in [*reference, *(k for k in mine if k not in reference)]:
        theirs, ours = reference.get(key, "(none)"), mine.get(key, "(none)")
        if theirs != ours:
            return f"rank {rank}'s {_shown(key)} is {_value(key, ours)}, rank 0's {_value(key, theirs)}"
    return ""


def refuse_disagreeing_ranks(fields: dict, info: DistInfo, what: str, refusal: UserError | None = None) -> None:
    """Raise on every rank where a rank refused (`refusal`: its own error) or its `fields` differ from rank 0's:
    each refused rank its own error, every other rank the lowest such rank's refusal or first difference, in one
    line; where every rank refused alike, EveryRankRefused with that line, the job's one refusal. Every rank runs
    the same collectives, so all stop together (none waits in another collective for a rank that left). `what`:
    what must be the same, for the line."""
    if not info.distributed:
        if refusal is not None:
            raise refusal
        return
    reference = broadcast_object(fields if info.is_main else None, info)
    difference = first_difference(reference, fields, info.rank)
    problem = f"rank {info.rank}: {refusal}" if refusal is not None else difference
    if difference and refusal is None:
        problem += (
            f": every process of a job must train with the same {what}; expected the same command line, data and "
            "run folder on every node"
        )
    # the lowest rank with a problem, through a max: world_size - rank is largest for it; 0 where none has one
    flag = torch.tensor([info.world_size - info.rank if problem else 0], device=info.device)
    lowest = int(all_reduce_max(flag, info).item())  # note: a CPU-GPU sync point
    if not lowest:
        return
    rank = info.world_size - lowest
    own = str(refusal) if refusal is not None else None
    message, theirs = broadcast_object((problem, own) if info.rank == rank else None, info, src=rank)
    differs = torch.tensor([int(own is None or own != theirs)], device=info.device)
    alike = not int(all_reduce_max(differs, info).item())  # every rank: a collective all of them run
    if alike:
        raise EveryRankRefused(own) from refusal
    if refusal is not None:
        raise refusal
    raise UserError(message)
