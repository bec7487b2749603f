"""Random numbers per epoch: every generator a training epoch draws from is reseeded at its start
from (seed, rank, epoch) alone.

Why re-derived, not carried in the checkpoint: what an epoch draws then depends on nothing that
came before it (how many batches the compile warm-up or an earlier epoch took, how many workers
drew base seeds), so a run resumed after epoch E draws exactly what the uninterrupted run drew in
epoch E + 1, on every rank, and there is nothing to save, load or keep `weights_only`-safe.
Carrying states could not do this for what lives outside the process (DataLoader workers).

Covered: the torch CPU and CUDA default generators (dropout, DataLoader worker base seeds, the
textbook loader's in-process augmentation, CPU-decode crop boxes in the main process), Python
`random` and NumPy's global state, and, through `DeviceFeeder.set_epoch(epoch, seed)`, the
device transform's and the photo decoders' own generators. The samplers were already functions
of (seed, epoch). DataLoader workers that draw random numbers (the textbook loader, CPU JPEG
decode) get the epoch's seed with every index and reseed themselves at the first index of a new
one (`data.loader.EpochSeeded`, `ReseedingWorkers`), persistent workers included.
"""

from __future__ import annotations

import random

import numpy as np
import torch

EPOCH_STRIDE = 1 << 20  # seeds of one epoch's ranks never meet the next epoch's below 2**20 ranks
# Stored in checkpoints; older ones lack it (their epochs drew on). "per-epoch seeds" was the scheme before the
# per-sample keys were hashed (data/transforms.mix_seed) and random-resized crops fell back as torchvision's; "per-epoch
# seeds, hashed sample keys" the one before the samplers' seed was hashed (data/loader.shuffle_seed): other orders.
RNG_SCHEME = "per-epoch seeds, hashed sample keys, hashed shuffle seed"
# what the resumed epochs of a checkpoint of an earlier scheme draw otherwise than its run would have, as (what drew
# otherwise, what the resumed epochs draw); a scheme not named here drew its augmentation and its orders otherwise
EARLIER_SCHEMES = {
    "per-epoch seeds, hashed sample keys": (
        "their sample order",
        "other sample orders than an uninterrupted run would have (their crops and flips as it would)",
    )
}


def earlier_scheme_note(scheme: str) -> str:
    """The note for resuming a checkpoint whose epochs drew by `scheme`, an earlier one than RNG_SCHEME: what the
    resumed epochs draw otherwise than an uninterrupted run would have. The last scheme's checkpoints differ in
    their sample orders alone, which the note called their augmentation."""
    default = ("their augmentation", "other crops, flips and sample orders than an uninterrupted run would have")
    drew, draw = EARLIER_SCHEMES.get(scheme, default)
    return (
        f"note: this checkpoint's epochs drew {drew} by an earlier scheme ({scheme}; now {RNG_SCHEME}): the resumed "
        f"epochs draw {draw}"
    )


def epoch_seed(seed: int, rank: int, epoch: int) -> int:
    """seed + rank in epoch 1 (the seed every rank used before), moved by a stride each epoch."""
    return (seed + rank + (epoch - 1) * EPOCH_STRIDE) % 2**63


def init_epoch_rng(seed: int) -> None:
    torch.manual_seed(seed)  # the CPU generator and every CUDA device's
    random.seed(seed)
    np.random.seed(seed % 2**32)
