"""Another --seed trains in another order: the train sampler's order in each epoch is drawn from the seed hashed, not
from seed + epoch, which made seed s + 1's epochs seed s's orders shifted by one (data/loader.shuffle_seed)."""

from __future__ import annotations

import torch

from cnnpar.config import Config, DataConfig, RunConfig, resolve_for_device
from cnnpar.data import load_data
from cnnpar.data.loader import build_loader, epoch_indices
from cnnpar.dist import DistInfo

EPOCHS = 4


def _orders(seed: int) -> list[list[int]]:
    """The train loader's sample order in epochs 1..EPOCHS under `seed` (the same held-out split for every seed)."""
    cfg = Config(data=DataConfig(source="digits", resident="off", workers=0), run=RunConfig(batch_size=64, seed=seed))
    bundle = load_data(cfg.data, 0)  # the split of seed 0 for all: only the order may differ
    feeder = build_loader(bundle, resolve_for_device(cfg, "cpu", True), DistInfo(0, 0, 1, torch.device("cpu")), True)
    orders = []
    for epoch in range(1, EPOCHS + 1):
        feeder.set_epoch(epoch)
        orders.append(epoch_indices(feeder.sampler).tolist())
    return orders


def test_consecutive_seeds_train_in_orders_of_their_own():
    """bench --time-to-accuracy repeats over seeds s, s + 1, ...: with the sampler seeded by the run's seed, seed 1's
    epoch e was seed 0's epoch e + 1, so two "independent" seeds shared all but one epoch's order."""
    seen = [tuple(order) for seed in range(3) for order in _orders(seed)]
    assert len(set(seen)) == len(seen), "an epoch's sample order repeats another seed's or epoch's"
    assert _orders(0) == _orders(0)  # a function of the seed alone
