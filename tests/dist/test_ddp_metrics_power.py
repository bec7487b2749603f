"""A real 2-process gloo `Trainer.fit` (tests/dist/power_checks.py): the epoch's reported totals against each
step's own figures, the training shards of an odd sample count, a new order every epoch, and rank 0 alone
writing the run's files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cmd, torchrun_cmd

CHECKS = Path(__file__).with_name("power_checks.py")
N_TRAIN, EPOCHS = 201, 2  # as power_checks.py


@pytest.fixture(scope="module")
def fits(tmp_path_factory) -> list[dict]:
    work = tmp_path_factory.mktemp("ddp_power")
    proc = run_cmd([*torchrun_cmd(2, "--standalone"), str(CHECKS), str(work)], work, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((work / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    return [r["fit"] for r in ranks]


def test_epoch_images_loss_and_accuracy_are_summed_over_both_ranks(fits):
    """Each rank's row holds both shards: the images of both, and the loss and accuracy over all of them, as
    computed here from the steps' own (unreduced) loss sums and correct counts."""
    for epoch in range(1, EPOCHS + 1):
        steps = [s for f in fits for s in f["steps"] if s["epoch"] == epoch]
        images = sum(len(s["ids"]) for s in steps)
        loss = sum(s["loss_sum"] for s in steps) / images
        acc = sum(s["correct"] for s in steps) / images
        assert images == 2 * (N_TRAIN // 2) == 200
        per_rank = [sum(len(s["ids"]) for s in f["steps"] if s["epoch"] == epoch) for f in fits]
        assert per_rank == [100, 100]
        for f in fits:
            row = f["rows"][epoch - 1]
            assert row["epoch"] == epoch and row["images"] == images
            assert row["train_loss"] == pytest.approx(loss, rel=1e-6)
            assert row["train_acc"] == pytest.approx(acc, abs=1e-12)
        # the two shards' own means differ, so a rank that reported its own shard alone would be caught
        own = [sum(s["loss_sum"] for s in f["steps"] if s["epoch"] == epoch) / 100 for f in fits]
        assert own[0] != pytest.approx(own[1], rel=1e-6)


def test_an_odd_training_count_gives_each_rank_100_disjoint_samples_none_twice(fits):
    """201 samples on 2 ranks: each share is cut to 100 (one left out), never padded to 101 with a repeat."""
    for epoch in range(1, EPOCHS + 1):
        shards = [f["sampler"][f"epoch{epoch}"] for f in fits]
        assert [len(s) for s in shards] == [100, 100]
        assert not set(shards[0]) & set(shards[1])
    for epoch in range(1, EPOCHS + 1):
        seen = [[i for s in f["steps"] if s["epoch"] == epoch for i in s["ids"]] for f in fits]
        assert [len(s) for s in seen] == [100, 100]  # the batch (128) is larger than a share: all of it trained
        assert len(set(seen[0]) | set(seen[1])) == 200  # no sample twice, on one rank or across them
        assert all(0 <= i < N_TRAIN for s in seen for i in s)


def test_the_trainer_draws_a_new_order_and_shard_every_epoch_on_every_rank(fits):
    for f in fits:
        first, second = ([i for s in f["steps"] if s["epoch"] == e for i in s["ids"]] for e in (1, 2))
        assert first != second
        assert set(first) != set(second)  # a new permutation of 201 moves samples between the ranks too
        # and each epoch's is the one the sampler's rule gives that epoch (seed + epoch), from the first epoch on
        assert [first, second] == [f["sampler"]["epoch1"], f["sampler"]["epoch2"]]


def test_only_rank_0_writes_metrics_summary_and_checkpoints(fits):
    main, other = (f["writer_calls"] for f in fits)
    assert other == []
    assert main.count("write_csv_atomic:metrics.csv") == EPOCHS
    assert main.count("save_checkpoint:last.pt") == EPOCHS
    assert "write_json_atomic:summary.json" in main
