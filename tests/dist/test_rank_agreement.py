"""Ranks that would train different models stop before the first epoch, together, with one line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from cnnpar.config import Config, DataConfig, OptimConfig, RunConfig, SpeedConfig, resolve_for_device
from cnnpar.engine.agreement import data_identity, first_difference, shared_settings
from tests.conftest import run_cmd, torchrun_cmd

CHECKS = Path(__file__).with_name("agreement_checks.py")


def test_settings_that_may_differ_per_node_are_left_out_and_the_first_other_one_is_named():
    here = Config(data=DataConfig(source="/mnt/a/train.csv"), run=RunConfig(out_dir="/scratch/a"))
    there = Config(
        data=DataConfig(source="/data/train.csv", workers=3),
        run=RunConfig(out_dir="/scratch/b"),
        speed=SpeedConfig(device="cpu"),
    )
    assert first_difference(shared_settings(here), shared_settings(there), 1) == ""
    other = Config(optim=OptimConfig(lr=0.01), run=RunConfig(epochs=9))
    ours = Config(optim=OptimConfig(lr=0.002))  # as the ranks compare it: --lr auto resolved (AdamW's own)
    assert first_difference(shared_settings(ours), shared_settings(other), 1) == (
        "rank 1's optim.lr (--lr) is 0.01, rank 0's 0.002"
    )


def test_crop_min_scale_is_shared_by_every_rank_and_kept_in_the_record():
    """A rank drawing crops of another smallest area trains another recipe: compared, as --lr is; and written to
    config.toml (to_dict) and read back from it, as every setting is."""
    import tomllib

    from cnnpar.config import dumps_toml, from_dict, to_dict

    other = Config(data=DataConfig(crop_min_scale=0.08))
    assert first_difference(shared_settings(Config()), shared_settings(other), 1) == (
        "rank 1's data.crop_min_scale (--crop-min-scale) is 0.08, rank 0's 0.25"
    )
    assert from_dict(tomllib.loads(dumps_toml(other))).data.crop_min_scale == 0.08
    assert to_dict(Config())["data"]["crop_min_scale"] == 0.25


def test_data_is_compared_by_its_content_not_its_path_checksum_first():
    """Other data of the same size trained half of each batch on another file, unsaid."""
    meta = {"model": "cnn3", "mean": [0.37], "data_path": "/mnt/a/train.csv", "data_checksum": "a" * 64}
    here = data_identity(meta, 240, 60)
    assert first_difference(here, data_identity({**meta, "data_path": "/data/train.csv"}, 240, 60), 1) == ""
    other = data_identity({**meta, "mean": [0.36], "data_checksum": "b" * 64}, 240, 60)
    assert first_difference(here, other, 1) == f"rank 1's data's checksum is '{'b' * 23}...', rank 0's '{'a' * 23}...'"


def test_a_typed_batch_size_is_named_not_the_lr_batch_resolved_from_it():
    """A --batch-size of one node's own was reported as a --lr-batch nobody typed (optim.lr_batch, resolved from the
    batch, came first in section order); an automatic 0 is said as what it means."""
    here, there = (resolve_for_device(Config(run=RunConfig(batch_size=b)), "cpu", False) for b in (8, 4))
    assert first_difference(shared_settings(here), shared_settings(there), 1) == (
        "rank 1's run.batch_size (--batch-size) is 4, rank 0's 8"
    )
    sized = Config(data=DataConfig(image_size=16))
    assert first_difference(shared_settings(Config()), shared_settings(sized), 1) == (
        "rank 1's data.image_size (--image-size) is 16, rank 0's 0 (auto: the source's size)"
    )


def test_a_folders_content_sample_is_compared_only_where_there_is_one():
    meta = {"data_checksum": "a" * 64, "class_names": ["cat", "dog"]}
    assert first_difference(data_identity(meta, 40, 10), data_identity(meta, 40, 10, ""), 1) == ""
    assert first_difference(data_identity(meta, 40, 10, "1" * 64), data_identity(meta, 40, 10, "2" * 64), 1) == (
        "rank 1's data's checksum of file sizes and sampled bytes is '22222222222222222222222...', rank 0's "
        "'11111111111111111111111...'"
    )


def test_a_long_value_is_cut_inside_its_quotes_and_brackets():
    """The cut left a checksum's quote open ('14f9..., rank 0's '20e7...) and a list's bracket and item too."""
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog"]
    here = data_identity({"class_names": names}, 240, 60)
    there = data_identity({"class_names": names[::-1]}, 240, 60)
    assert (
        first_difference(here, there, 1)
        == "rank 1's data's class names is ['dog', 'deer', 'cat', ...], rank 0's ['airplane', ...]"
    )


# Rank 0 lets go of an all_reduce's tensor while its gloo worker thread still runs the collective (rank 1 comes a
# second late), leaves the group, then drops the group's last reference, as the Trainer in a refusal's traceback
# drops DDP's Reducer when `cli.main` returns. faulthandler ends a deadlocked rank (exit 1) before the test's timeout.
LAST_REFERENCE = """
import faulthandler, time
import torch, torch.distributed as dist
from cnnpar.dist import destroy_distributed, init_distributed
faulthandler.dump_traceback_later(30, exit=True)
info = init_distributed("cpu")
group = dist.group.WORLD
flag = torch.ones(1)
if info.rank == 1:
    time.sleep(1)
work = dist.all_reduce(flag, async_op=True)
if info.rank == 0:
    del flag, work
else:
    work.wait()
destroy_distributed()
del group
print("ended", info.rank, flush=True)
faulthandler.cancel_dump_traceback_later()
"""

# One torchrun launch for every test of the module that needs ranks (each launch costs three interpreters' start-up):
# its ranks first leave LAST_REFERENCE's group, then run the agreement checks, as the next check ran after it before
LAUNCH = f"""{LAST_REFERENCE}
flag = work = None  # rank 1's collective and tensor, which a process of its own kept until it ended
import runpy, sys
sys.argv = [{str(CHECKS)!r}, *sys.argv[1:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.fixture(scope="module")
def launch(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    work = tmp_path_factory.mktemp("agreement")
    for rank in range(2):
        (work / f"n{rank}").mkdir()
    script = work / "last_reference_then_checks.py"
    script.write_text(LAUNCH)
    proc = run_cmd([*torchrun_cmd(2, "--standalone"), str(script), str(work)], work, timeout=240)
    return proc, work


@pytest.fixture(scope="module")
def ranks(launch) -> list[dict]:
    proc, work = launch
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((work / f"rank{r}.json").read_text()) for r in range(2)]


def test_a_rank_given_another_lr_stops_every_rank_before_training(ranks):
    """Rank 1 trained its own schedule beside rank 0's, and said nothing."""
    for rank, result in enumerate(ranks):
        check = result["lr"]
        assert check["rc"] == 2 and not check["initialized_after"], check
        line = f"cnnpar: error: [rank {rank}] rank 1's optim.lr (--lr) is 0.01, rank 0's 0.002: every process"
        assert check["stderr"].startswith(line) and check["stderr"].count("\n") == 1, check["stderr"]
        assert "Traceback" not in check["stderr"]


def test_a_refusal_every_rank_raises_alike_stays_in_each_ranks_log_under_a_plain_torchrun(ranks):
    """The ranks stop together at the settings agreement, each with the one line (EveryRankRefused): a torchrun
    started by hand has no launcher to say it once for them, and each node's log keeps its own copy."""
    line = "model cnn3: input images 4x4: expected at least 8x8 (its three 2x2 max-pools); give --image-size 8 or more"
    for rank, result in enumerate(ranks):
        check = result["too_small"]
        assert check["rc"] == 2 and not check["initialized_after"], check
        assert check["stderr"] == f"cnnpar: error: [rank {rank}] {line}\n", check["stderr"]


def test_a_node_resuming_its_own_copy_with_other_weights_stops_every_rank(ranks):
    """DDP broadcasts the weights when it wraps the model, before the checkpoint is loaded: two models trained."""
    assert [r["first"]["rc"] for r in ranks] == [0, 0]
    for result in ranks:
        check = result["checkpoint"]
        assert check["rc"] == 2 and not check["initialized_after"], check
        assert "rank 1's weights checksum is '" in check["stderr"] and "same checkpoint" in check["stderr"]
    # rank 0 had said "resumed from runs/w/ckpt/last.pt after epoch 1" (and the schedule's rebuild) first
    assert (
        "resumed from" not in ranks[0]["checkpoint"]["stdout"] and "schedule:" not in ranks[0]["checkpoint"]["stdout"]
    )
    assert "resumed from shared/sh/ckpt/last.pt after epoch 1" in ranks[0]["elsewhere_auto"]["stdout"]


def test_a_batch_size_of_one_nodes_own_is_named_as_typed(ranks):
    for rank, result in enumerate(ranks):
        check = result["batch"]
        assert check["rc"] == 2, check
        assert check["stderr"].startswith(
            f"cnnpar: error: [rank {rank}] rank 1's run.batch_size (--batch-size) is 8, rank 0's 16: every process"
        ), check["stderr"]


def test_a_nodes_copy_of_an_image_folder_with_other_pictures_under_the_same_names_stops_every_rank(ranks):
    """Node 1's copy had two photos of two classes swapped (two wrong labels; names, classes and splits the same):
    the listing's checksum passed it, and the job trained on."""
    for rank, result in enumerate(ranks):
        check = result["photos"]
        assert check["rc"] == 2 and not check["initialized_after"], check
        line = f"cnnpar: error: [rank {rank}] rank 1's data's checksum of file sizes and sampled bytes is '"
        assert check["stderr"].splitlines()[-1].startswith(line), check["stderr"]


def test_each_node_finds_the_run_under_its_own_out_dir_a_shared_folder_mounted_elsewhere(ranks):
    """Node 1 sees node 0's `shared` as `view`: each rank took rank 0's path (`shared/sh`, nothing on node 1) and
    refused the resume: "rank 0 resumes from this checkpoint but rank 1 cannot read it: every node must see
    --out-dir", though node 1 saw it, under its own --out-dir."""
    for name, epochs in (("elsewhere", 1), ("elsewhere_auto", 2), ("elsewhere_path", 3)):
        for result in ranks:
            assert result[name]["rc"] == 0, (name, result[name])
        assert f"epoch {epochs}/{epochs}" in ranks[0][name]["stdout"], ranks[0][name]["stdout"]


def test_a_rank_that_cannot_read_the_checkpoint_stops_every_rank(ranks):
    """Rank 1 stopped alone; rank 0 waited for it in its first collective (or failed with a traceback)."""
    ours = "runs/w/ckpt/last.pt: rank 0 resumes from this checkpoint but rank 1 cannot read it"
    for rank, result in enumerate(ranks):
        check = result["missing"]
        assert check["rc"] == 2 and not check["initialized_after"], check
        said = "cnnpar: error: [rank 1] " if rank == 1 else "cnnpar: error: [rank 0] rank 1: "
        assert check["stderr"].startswith(said + ours), check["stderr"]
        assert "Traceback" not in check["stderr"]


UNSHARED = (
    "--resume runs/w: no checkpoint there; every node must see the run folder (--out-dir on a shared file system)"
)


def test_a_node_without_the_run_folder_is_refused_for_that_not_for_a_setting_it_never_typed(ranks):
    """On a disk not shared between nodes, the node without the run folder read its settings from the defaults,
    not from the run's config.toml: every rank stopped on "rank 1's data.image_size (--image-size) is 0, rank 0's
    16", a field nobody typed."""
    for rank, result in enumerate(ranks):
        check = result["unshared"]
        assert check["rc"] == 2 and not check["initialized_after"], check
        said = "cnnpar: error: [rank 1] " if rank == 1 else "cnnpar: error: [rank 0] rank 1: "
        assert check["stderr"] == f"{said}{UNSHARED}\n", check["stderr"]
    for rank, result in enumerate(ranks):  # --resume auto --name w: node 1 has no run to read settings from
        check = result["unshared_auto"]
        assert check["rc"] == 2 and not check["initialized_after"], check
        assert check["stderr"] == (
            f"cnnpar: error: [rank {rank}] rank 1's run folder for --resume auto is 'not found', rank 0's 'found': "
            "every process of a job must train with the same run folder (--out-dir on a shared file system); "
            "expected the same command line, data and run folder on every node\n"
        ), check["stderr"]


def test_a_rank_whose_copy_of_the_data_is_bad_stops_every_rank_with_its_error(ranks):
    """Node 1's CSV has a bad cell: node 1 said so, and node 0 printed a 50-line gloo traceback ("Connection closed
    by peer") naming nothing."""
    bad = "u.csv, line 8 (data row 7), column 'pixel0': 'abc' is not an integer: expected a pixel value 0..255"
    for rank, result in enumerate(ranks):
        check = result["bad_data"]
        assert check["rc"] == 2 and not check["initialized_after"], check
        said = "cnnpar: error: [rank 1] " if rank == 1 else "cnnpar: error: [rank 0] rank 1: "
        # (rank 0 also notes that --synthetic-samples does nothing for a CSV)
        assert check["stderr"].splitlines()[-1] == f"{said}{bad}", check["stderr"]
        assert "Traceback" not in check["stderr"]


def test_a_group_left_while_its_gloo_thread_still_holds_a_tensor_ends(launch):
    """torch 2.5 joined a gloo group's worker threads when its last reference died, holding the GIL, while a worker
    waited for the GIL to free a collective's tensor: the rank hung for ever. Under a plain torchrun the next
    agreement check's rank waited for it in init_process_group until the job's timeout (about 1 run in 2)."""
    proc, _ = launch  # each rank left the group, then ran the agreement checks
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(proc.stdout.split("\n")[:2]) == ["ended 0", "ended 1"], proc.stdout
