"""DDP correctness on the CPU: one 2-process gloo job (tests/dist/checks.py), many assertions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cnnpar.data.store_write import prepare_store
from cnnpar.errors import EXIT_ANOTHER_RANK_ENDED
from tests.conftest import run_cmd, torchrun_cmd
from tests.datafiles import write_image_folder

CHECKS = Path(__file__).with_name("checks.py")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    work = tmp_path_factory.mktemp("ddp_checks")
    # 16 images, 4 held out: 12 train images, 6 a rank (check_store)
    prepare_store(write_image_folder(work / "photos", per_class=8), work / "photos.cnnpar", 24, 1, progress=False)
    proc = run_cmd([*torchrun_cmd(2, "--standalone"), str(CHECKS), str(work)], work, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((work / f"rank{r}.json").read_text()) for r in range(2)]


def test_both_ranks_ran_in_one_world(ranks):
    assert [r["world_size"] for r in ranks] == [2, 2]


def test_parameters_identical_on_both_ranks_after_trainer_steps(ranks):
    assert ranks[0]["trainer"]["params"] == ranks[1]["trainer"]["params"]


def test_batchnorm_statistics_identical_after_evaluation(ranks):
    assert ranks[0]["trainer"]["buffers_after_eval"] == ranks[1]["trainer"]["buffers_after_eval"]


# The reference runs the 61 validation samples as one batch, the ranks as batches of 16 or fewer:
# on a CPU whose oneDNN picks its convolution kernel by batch size (AVX-512 Xeons) the float32
# logits then differ by up to about 1e-7 (seen: mean losses 3e-9 apart), so they agree to 1e-7,
# not to the last digit. An inexact reduction (the mean of the ranks' means, padded duplicates)
# is off by more (seen: 3e-6 for a near-uniform average model), and assert_exact_evaluation
# checks that it would be caught.
LOSS_REL = 1e-7


def assert_exact_evaluation(got: dict, ref: dict) -> None:
    exact = ref["loss_sum"] / ref["count"]
    assert got["val_count"] == ref["count"] == 61  # no padded duplicates, nothing dropped
    assert got["val_acc"] == ref["correct"] / ref["count"]
    assert got["val_loss"] == pytest.approx(exact, rel=LOSS_REL, abs=0)
    assert ref["mean_of_rank_means"] != pytest.approx(exact, rel=10 * LOSS_REL, abs=0)


def test_distributed_validation_equals_single_process_validation(ranks):
    for r in ranks:
        assert_exact_evaluation(r["trainer"]["dist_eval"], ranks[0]["trainer"]["ref_eval"])


def test_weight_average_and_flip_translate_tta_are_exact_under_ddp(ranks):
    a, b = (r["speed_recipe"] for r in ranks)
    assert a["n_averaged"] == b["n_averaged"] == 3
    assert a["average"] == b["average"]  # identical parameters average identically; buffers broadcast
    for r in (a, b):
        assert_exact_evaluation(r["dist_eval"], ranks[0]["speed_recipe"]["ref_eval"])


def test_training_shards_are_disjoint_cover_the_data_and_reshuffle_each_epoch(ranks):
    for epoch in ("epoch1", "epoch2"):
        a, b = (r["sampler"][epoch] for r in ranks)
        assert len(a) == len(b) == 100
        assert not set(a) & set(b)
        assert sorted(a + b) == list(range(200))
    for r in ranks:
        assert r["sampler"]["epoch1"] != r["sampler"]["epoch2"]  # set_epoch gave a new permutation


def test_two_ranks_train_from_one_store_on_disjoint_shards(ranks):
    a, b = (r["store"] for r in ranks)
    assert a["n_train"] == b["n_train"] == 12
    assert len(a["seen"]) == len(b["seen"]) == 6 and sorted(a["seen"] + b["seen"]) == list(range(12))
    assert a["dist_eval"]["val_count"] == b["dist_eval"]["val_count"] == 4


def test_each_rank_seeds_its_randomness_with_seed_plus_rank(ranks):
    seed = 3
    for rank, r in enumerate(ranks):
        assert r["trainer"]["augment_seed"] == seed + rank
        assert r["trainer"]["global_seed"] == seed + rank


def test_lr_scaled_linearly_with_world_size(ranks):
    assert ranks[0]["trainer"]["lr"] == pytest.approx(2e-3 * 2)


def test_no_sync_accumulation_equals_one_large_batch(ranks):
    for r in ranks:
        acc = r["accumulation"]
        assert acc["max_update"] > 1e-3  # the step moved the weights
        assert acc["max_gap_to_reference"] <= 1e-5 * acc["max_update"] + 1e-7
    a, b = (r["accumulation"] for r in ranks)
    # inside no_sync each rank kept its own gradients; after the last micro-step they agree
    assert a["grads_after_first_micro_step"] != b["grads_after_first_micro_step"]
    assert a["grads_synced"] == b["grads_synced"]
    assert a["params"] == b["params"]


def test_ddp_switches_keep_accumulation_exact_and_reach_ddp(ranks):
    """Issue 13's DDP switches (small buckets, no per-forward buffer broadcast): the same exact no_sync
    accumulation, and DDP built with them."""
    for r in ranks:
        acc = r["accumulation_switches"]
        expected = {"bucket_bytes_cap": int(0.001 * 1024 * 1024), "static_graph": False, "broadcast_buffers": False}
        assert acc["ddp"] == expected
        assert r["accumulation"]["ddp"]["broadcast_buffers"] is True  # the default
        assert acc["max_update"] > 1e-3
        assert acc["max_gap_to_reference"] <= 1e-5 * acc["max_update"] + 1e-7
    a, b = (r["accumulation_switches"] for r in ranks)
    assert a["grads_synced"] == b["grads_synced"] and a["params"] == b["params"]


def test_ddp_switches_from_the_config_reach_the_trainer_and_the_ranks_end_with_one_model(ranks):
    a, b = (r["ddp_switches"] for r in ranks)
    for r in (a, b):
        assert r["bucket_bytes_cap"] == 2 * 1024 * 1024 and r["static_graph"] is True
        assert r["broadcast_buffers"] is False
    assert a["params"] == b["params"]
    # each rank's BatchNorm statistics follow its own batches until evaluation gives every rank rank 0's
    assert a["buffers_after_steps"] != b["buffers_after_steps"]
    assert a["buffers_after_eval"] == b["buffers_after_eval"]


def test_train_step_groups_of_any_size_equal_one_large_batch_under_ddp(ranks):
    for r in ranks:
        got = r["step_groups"]
        assert got["max_update"] > 1e-3
        assert got["max_gap_to_reference"] <= 1e-5 * got["max_update"] + 1e-7
    assert ranks[0]["step_groups"]["params"] == ranks[1]["step_groups"]["params"]


def test_gradient_clipping_sees_the_same_global_norm_on_every_rank(ranks):
    a, b = (r["accumulation"] for r in ranks)
    assert a["norm"] == b["norm"]
    assert a["norm"] == pytest.approx(a["ref_norm"], rel=1e-5)
    assert a["norm"] > 0.05  # above the clip threshold, so clipping acted on the update compared above


def test_sync_batchnorm_on_cpu_is_refused_with_a_clear_message(ranks):
    for r in ranks:
        assert r["sync_bn_cpu"]["refused"]
        assert "sync_bn" in r["sync_bn_cpu"]["message"] and "CUDA" in r["sync_bn_cpu"]["message"]


def test_user_error_after_init_names_the_rank_and_destroys_the_group(ranks):
    for rank, r in enumerate(ranks):
        err = r["error_path"]
        assert err["rc"] == 2
        assert not err["initialized_after"]
        assert f"[rank {rank}]" in err["stderr"] and "no-such-run" in err["stderr"]
        assert "Traceback" not in err["stderr"]


def test_a_failing_rank_is_named_and_every_rank_tears_down(ranks):
    failing, other = ranks[1]["failure"], ranks[0]["failure"]
    assert "cnnpar: rank 1 failed" in failing["stderr"]
    assert "injected fault" in failing["exception"]
    # rank 0 lost its peer: one line and a status of its own, not "rank 0 failed" and a 50-line gloo traceback
    assert other["stderr"] == (
        "cnnpar: rank 0 stopped: another rank of the job ended; its own error is above, or in its node's log\n"
    )
    assert other["rc"] == EXIT_ANOTHER_RANK_ENDED and not other["exception"], other
    assert not failing["initialized_after"] and not other["initialized_after"]
