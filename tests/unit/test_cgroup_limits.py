"""A container's or a pod's limits, counted: a CPU quota (cgroup v2 cpu.max, v1 cpu.cfs_quota_us / cfs_period_us) and a
memory limit (v2 memory.max, v1 memory.limit_in_bytes) hold a process that the affinity mask and psutil still show
the whole host (a pod held to 2 CPUs on a 64-core node saw 64, and started workers for 64). Each test builds a fake
cgroup tree under tmp_path and a fake /proc/self/cgroup beside it, on a faked 64-core affinity mask."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import torch

from cnnpar import host_facts
from cnnpar.config import Config, DataConfig, RunConfig, resolve_for_device
from cnnpar.data import byte_slots, loader
from cnnpar.data.arrays import check_fits
from cnnpar.dist import DistInfo
from cnnpar.errors import ConfigError, DataError
from cnnpar.host_facts import cgroup_folders, cpu_quota, memory_available, memory_total, quota_note, usable_cores

CPU = DistInfo(0, 0, 1, torch.device("cpu"))
GB = 10**9


@pytest.fixture(autouse=True)
def host(monkeypatch):
    """A 64-core host with 64 GB, 50 GB of it available, as the affinity mask and psutil report it."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(total=64 * GB, available=50 * GB))


def tree(tmp_path: Path, cgroup: str, files: dict[str, str]) -> dict:
    """The root and /proc/self/cgroup of a fake tree holding `files` (path under the root -> text)."""
    root = tmp_path / "sys_fs_cgroup"
    root.mkdir(parents=True)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text + "\n")
    proc = tmp_path / "proc_self_cgroup"
    proc.write_text(cgroup)
    return {"root": root, "proc": proc}


def test_a_v2_quota_sets_the_cores_and_the_line_says_so(tmp_path):
    at = tree(tmp_path, "0::/\n", {"cpu.max": "200000 100000"})
    assert cpu_quota(**at) == 2.0
    assert usable_cores(**at) == 2
    assert quota_note(2, **at) == "2 of 64 cores: the container's CPU quota"


def test_a_v2_max_is_no_quota(tmp_path):
    at = tree(tmp_path, "0::/\n", {"cpu.max": "max 100000"})
    assert cpu_quota(**at) is None
    assert usable_cores(**at) == 64
    assert quota_note(64, **at) == ""


def test_a_v1_quota_is_rounded_up_and_a_fraction_of_a_core_is_one(tmp_path):
    v1 = "4:memory:/\n2:cpu,cpuacct:/\n1:name=systemd:/\n"
    at = tree(tmp_path, v1, {"cpu/cpu.cfs_quota_us": "150000", "cpu/cpu.cfs_period_us": "100000"})
    assert usable_cores(**at) == 2
    (tmp_path / "sys_fs_cgroup/cpu/cpu.cfs_quota_us").write_text("50000\n")
    assert usable_cores(**at) == 1


def test_a_v1_quota_of_minus_one_is_no_quota(tmp_path):
    at = tree(tmp_path, "2:cpu,cpuacct:/\n", {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"})
    assert cpu_quota(**at) is None
    assert usable_cores(**at) == 64


def test_the_process_own_nested_cgroup_and_its_parents_are_read(tmp_path):
    """A pod's limit sits on the pod's cgroup, its container's below it: the smallest holds."""
    files = {
        "kubepods/pod1/cpu.max": "300000 100000",
        "kubepods/pod1/ctr/cpu.max": "max 100000",
        "kubepods/pod1/ctr/memory.max": str(4 * GB),
        "kubepods/pod1/ctr/memory.current": str(3 * GB),
        "kubepods/pod1/ctr/memory.stat": f"anon {2 * GB}\ninactive_file {GB}\nactive_file 0",
        "other/cpu.max": "100000 100000",  # another cgroup's, not this process's
    }
    at = tree(tmp_path, "0::/kubepods/pod1/ctr\n", files)
    assert usable_cores(**at) == 3
    assert memory_total(**at) == 4 * GB
    # the room is the limit less the usage, its inactive file cache left out (the kernel drops it first)
    assert memory_available(**at) == (2 * GB, "the container's memory limit, 4.0 GB")


def test_a_container_that_mounts_its_own_cgroup_at_the_root_is_read_there(tmp_path):
    """Without a cgroup namespace /proc/self/cgroup names the host's path, which the container's mount lacks."""
    at = tree(tmp_path, "0::/docker/abc123\n", {"cpu.max": "200000 100000"})
    assert usable_cores(**at) == 2


def test_v1_memory_limits_and_v1_unlimited(tmp_path):
    v1 = "4:memory:/job\n2:cpu,cpuacct:/job\n"
    files = {
        "memory/job/memory.limit_in_bytes": str(8 * GB),
        "memory/job/memory.usage_in_bytes": str(5 * GB),
        "memory/job/memory.stat": f"total_inactive_file {GB}",
        "memory/memory.limit_in_bytes": "9223372036854771712",  # the root's "unlimited"
        "memory/memory.usage_in_bytes": str(30 * GB),
    }
    at = tree(tmp_path, v1, files)
    assert memory_total(**at) == 8 * GB
    assert memory_available(**at) == (4 * GB, "the container's memory limit, 8.0 GB")
    (tmp_path / "sys_fs_cgroup/memory/job/memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert memory_total(**at) == 64 * GB
    assert memory_available(**at) == (50 * GB, "")


def test_missing_or_unreadable_files_leave_the_affinity_mask_and_psutil(tmp_path):
    at = tree(tmp_path, "0::/\n", {})
    assert (usable_cores(**at), memory_total(**at), memory_available(**at)) == (64, 64 * GB, (50 * GB, ""))
    (at["root"] / "cpu.max").mkdir()  # a file that cannot be read (root reads a mode-000 file)
    (at["root"] / "memory.max").mkdir()
    assert (usable_cores(**at), memory_total(**at), memory_available(**at)) == (64, 64 * GB, (50 * GB, ""))
    gone = {"root": tmp_path / "none", "proc": tmp_path / "no_proc_self_cgroup"}
    assert (usable_cores(**gone), memory_total(**gone), memory_available(**gone)) == (64, 64 * GB, (50 * GB, ""))
    garbled = tree(tmp_path / "g", "no colons here\n", {"cpu.max": "two hundred"})
    assert usable_cores(**garbled) == 64


@pytest.fixture
def pod(tmp_path, monkeypatch):
    """This process in a pod held to 2 CPUs and 4 GB (3 GB of it used), as the commands read it."""
    files = {"cpu.max": "200000 100000", "memory.max": str(4 * GB), "memory.current": str(3 * GB)}
    at = tree(tmp_path, "0::/\n", files)
    monkeypatch.setattr(host_facts, "CGROUP_ROOT", at["root"])
    monkeypatch.setattr(host_facts, "PROC_CGROUP", at["proc"])
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)


def test_the_loaders_workers_follow_the_quota_and_the_cap_line_says_why(pod):
    cfg = resolve_for_device(
        Config(data=DataConfig(source="digits", resident="off", workers=100), run=RunConfig(batch_size=64)), "cpu", True
    )
    assert loader.worker_limit(CPU) == 8  # 4 per core of the quota's 2, not of the host's 64
    assert loader.loader_workers(cfg, None, CPU) == 8
    assert loader.workers_cap_line(cfg, CPU).startswith(
        "--workers 100 capped to 8: 4 per usable core (2 cores; 2 of 64 cores: the container's CPU quota)"
    )


def test_cpu_ranks_are_refused_beyond_the_quota_with_its_reason(pod):
    from cnnpar.dist import _refuse_cpu_processes_beyond_the_cores

    _refuse_cpu_processes_beyond_the_cores(8)
    with pytest.raises(ConfigError, match=r"^9 processes on this node's CPU but 2 usable core\(s\) \(2 of 64 cores: "):
        _refuse_cpu_processes_beyond_the_cores(9)


def test_the_memory_checks_follow_the_limit_and_the_refusal_says_why(pod):
    assert byte_slots.host_memory_bytes() == 4 * GB
    check_fits(GB, "the arrays")
    with pytest.raises(DataError) as e:
        check_fits(2 * GB, "the arrays")
    assert str(e.value) == (
        "the arrays take 2.0 GB, more than the 1.0 GB of memory available under the container's memory limit, "
        "4.0 GB: expected a smaller --image-size"
    )


def test_the_doctors_lines_name_the_quota(pod):
    from cnnpar.doctor.render import load_text
    from tests.unit.test_advise import facts

    f = facts(cores=2, cores_note=quota_note(2), load_avg_1m=1.5)
    assert load_text(f) == ", load average (1 min) 1.50 on 2 usable core(s) (2 of 64 cores: the container's CPU quota)"


@pytest.fixture
def threads():
    saved = torch.get_num_threads()
    torch.set_num_threads(8)  # torch's default on a host of 8 cores in the mask
    yield
    torch.set_num_threads(saved)


def test_torchs_threads_are_held_to_the_quota_unless_omp_num_threads_is_set(pod, threads, monkeypatch):
    from cnnpar.dist import init_cpu_threads

    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    init_cpu_threads()
    assert torch.get_num_threads() == 8
    monkeypatch.delenv("OMP_NUM_THREADS")
    init_cpu_threads()
    assert torch.get_num_threads() == 2


def test_torchs_threads_are_left_without_a_quota(tmp_path, threads, monkeypatch):
    from cnnpar.dist import init_cpu_threads

    at = tree(tmp_path, "0::/\n", {"cpu.max": "max 100000"})
    monkeypatch.setattr(host_facts, "CGROUP_ROOT", at["root"])
    monkeypatch.setattr(host_facts, "PROC_CGROUP", at["proc"])
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    init_cpu_threads()
    assert torch.get_num_threads() == 8


def test_the_ddp_scaling_benchmarks_threads_follow_the_quota(pod):
    from cnnpar.bench.ddp_scaling import threads_per_process

    assert threads_per_process(0, [1, 2]) == 1  # the quota's 2 cores for 2 processes, not the host's 64
    assert threads_per_process(0, [1]) == 2
    assert threads_per_process(3, [1, 2]) == 3  # --threads, as asked


def test_prepares_decoders_and_the_automatic_workers_follow_the_quota(pod, capsys):
    from cnnpar.bench.ladder import ladder_workers
    from cnnpar.data.store_write import decode_workers

    assert decode_workers(-1, 1000) == 2  # auto: one per usable core, the quota's 2, not the host's 64
    assert decode_workers(100, 1000) == 8
    assert "(2 cores; 2 of 64 cores: the container's CPU quota)" in capsys.readouterr().out
    assert loader.auto_workers(object(), CPU) == 1  # a decoded source: the cores less the main process's
    assert ladder_workers(Config()) == 1


def test_a_v1_quota_under_the_joint_mount_of_cpu_and_cpuacct_without_a_cpu_link(tmp_path):
    # v1 mounts controllers that share a line at their joint name; "cpu" is a link to it only where the host or the
    # container's runtime made one: without it the quota was not found and the host's 64 cores counted
    files = {"cpu,cpuacct/job/cpu.cfs_quota_us": "300000", "cpu,cpuacct/job/cpu.cfs_period_us": "100000"}
    at = tree(tmp_path, "4:memory:/job\n2:cpu,cpuacct:/job\n", files)
    assert cpu_quota(**at) == 3.0
    assert usable_cores(**at) == 3
    (at["root"] / "cpu").symlink_to("cpu,cpuacct")  # where the link is made, it is read through it
    assert cgroup_folders("cpu", **at)[0] == at["root"] / "cpu" / "job"
    assert usable_cores(**at) == 3
