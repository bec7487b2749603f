"""Facts about the host that every layer may need, from the standard library (and errors.chain) alone; psutil, as
process_tree uses it, only inside the memory functions.

The bottom layer, so that dist counts its CPU ranks against the same cores as the loaders and prepare's decoders
above it (report.host, which holds the lines they print about them, lies a layer above dist).

A container or a Kubernetes pod limits a process by its cgroup (a CPU quota, a memory limit) while the affinity mask
and psutil still report the whole host: a pod held to 2 CPUs on a 64-core node sees 64. The cores and the memory
here count the cgroup's limits where one is set. joblib.cpu_count (scikit-learn's dependency) reads the quotas too,
but only at the cgroup root's fixed paths (not the process's own cgroup nor its parents), with no root to point
tests at, and importing it costs about 0.2 s in every DataLoader worker and launcher that imports this layer.
"""

from __future__ import annotations

import errno
import math
import os
from pathlib import Path, PurePosixPath

from cnnpar.errors import chain

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")  # this process's cgroup: "0::/path" (v2), "4:memory:/path" (v1)
QUOTA_WHY = "the container's CPU quota"
MEMORY_WHY = "the container's memory limit"


def affinity_cores() -> int:
    """CPU cores this process may run on by its affinity mask (taskset, a cpuset): the host's count in a container
    that limits it by a quota instead."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def usable_cores(root: Path | None = None, proc: Path | None = None) -> int:
    """CPU cores this process may use: its affinity mask, and a container's CPU quota where one is set (2 CPUs' worth
    of time on a 64-core node is 2); what the processes a command starts are counted against (dist's CPU ranks,
    train's DataLoader workers, prepare's decoders)."""
    cores = affinity_cores()
    quota = cpu_quota(root, proc)
    return cores if quota is None else max(1, min(cores, math.ceil(quota)))


def quota_note(cores: int, root: Path | None = None, proc: Path | None = None) -> str:
    """What a line that names `cores` says where the CPU quota, not the affinity mask, set them ("2 of 64 cores: the
    container's CPU quota"), once, so that a user who sees 64 in top knows why; "" otherwise."""
    host = affinity_cores()
    quota = cpu_quota(root, proc)
    if quota is None or math.ceil(quota) >= host:
        return ""
    return f"{cores} of {host} cores: {QUOTA_WHY}"


def cpu_quota(root: Path | None = None, proc: Path | None = None) -> float | None:
    """The CPUs' worth of time this process's cgroup may use (quota / period), the smallest over its cgroup and the
    parents that hold one (a pod's limit sits above its container's); None where none is set."""
    quotas = []
    for folder in cgroup_folders("cpu", root, proc):
        v2 = (_read(folder / "cpu.max") or "").split()  # "200000 100000", or "max 100000" for none
        quota, period = (
            v2 if len(v2) == 2 else (_read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us"))
        )
        if (q := _number(quota)) and (p := _number(period)) and q > 0 and p > 0:  # v1's quota is -1 for none
            quotas.append(q / p)
    return min(quotas, default=None)


def memory_limit(root: Path | None = None, proc: Path | None = None) -> tuple[int, int] | None:
    """(limit, room left under it) in bytes for this process's cgroup, the smallest over it and its parents; None
    where no limit is set. The room counts the cgroup's usage less its inactive file cache, which the kernel drops
    before it reaches the limit (a store read once fills the cache up to the limit, and is no lack of memory)."""
    limits = []
    for folder in cgroup_folders("memory", root, proc):
        v2 = _read(folder / "memory.max") is not None
        limit = _number(_read(folder / ("memory.max" if v2 else "memory.limit_in_bytes")))  # v2's "max": none
        usage = _number(_read(folder / ("memory.current" if v2 else "memory.usage_in_bytes")))
        if limit is None or usage is None:
            continue
        cache = _stat(folder / "memory.stat", "inactive_file" if v2 else "total_inactive_file")
        limits.append((limit, max(0, limit - max(0, usage - cache))))
    # each on its own: a parent's larger limit may have less room left, shared with the cgroups beside this one
    return (min(lim for lim, _ in limits), min(room for _, room in limits)) if limits else None


def memory_total(root: Path | None = None, proc: Path | None = None) -> int:
    """Bytes of memory this process may hold at most: the host's, or its cgroup's limit where that is smaller."""
    import psutil

    limit = memory_limit(root, proc)
    host = psutil.virtual_memory().total
    return host if limit is None else min(host, limit[0])


def memory_available(root: Path | None = None, proc: Path | None = None) -> tuple[int, str]:
    """(bytes of memory available now, why) : the host's available memory, or the room left under the cgroup's
    limit where that is smaller, with why = MEMORY_WHY and its size (a container's limit is no host shortage)."""
    import psutil

    limit = memory_limit(root, proc)
    host = psutil.virtual_memory().available
    if limit is None or limit[1] >= host:
        return host, ""
    return limit[1], f"{MEMORY_WHY}, {limit[0] / 1e9:,.1f} GB"


def cgroup_folders(controller: str, root: Path | None = None, proc: Path | None = None) -> list[Path]:
    """The folders whose limits hold this process for `controller` ("cpu", "memory"): its cgroup's and each parent's
    up to the root, in the unified (v2) tree and in the controller's own (v1). The parents too: a pod's limit sits
    above its containers', and a container that mounts only its own cgroup at the root still names its host path."""
    root = CGROUP_ROOT if root is None else root  # None: the module's, read at the call (tests point it elsewhere)
    paths = _cgroup_paths(PROC_CGROUP if proc is None else proc)
    joint, v1_path = paths.get(controller, (controller, None))
    # v1 mounts controllers that share a line at their joint name ("cpu,cpuacct"): "cpu" is only a link to that
    # folder where the host or the container's runtime made one
    v1 = root / controller if os.path.isdir(root / controller) else root / joint  # False, not raised, where locked
    folders = []
    for tree, path in ((root, paths.get("", ("", None))[1]), (v1, v1_path)):
        if path is not None:
            parts = PurePosixPath(path).parts[1:]
            folders += [tree.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]
    return folders


def _cgroup_paths(proc: Path) -> dict[str, tuple[str, str]]:
    """Controller -> (the controllers of its line, joined as the line names them, and this process's cgroup path),
    from /proc/self/cgroup's "id:controllers:path" lines; v2's single line has no controllers (key "")."""
    paths = {}
    for line in (_read(proc) or "").splitlines():
        fields = line.split(":", 2)
        if len(fields) == 3:
            paths.update((c, (fields[1], fields[2])) for c in fields[1].split(","))
    return paths


def _read(path: Path) -> str | None:
    """A cgroup file's text; None where it is missing or unreadable (no cgroup, another version, a locked tree)."""
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _number(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:  # "max"
        return None


def _stat(path: Path, key: str) -> int:
    for line in (_read(path) or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return _number(value) or 0
    return 0


# The open-files limit the loaders need: a DataLoader worker hands each batch's tensors over as file descriptors
# (torch's file_descriptor sharing strategy), held open in the worker until the main process takes them, and each
# worker holds pipes in the main process. Two workers ran out under a limit of 32, eight with --prefetch-factor 8
# under 64; Linux's usual soft limit is 1024 under a hard one of 2**19 or more.
OPEN_FILES_WANTED = 65536


def raise_open_files_limit(wanted: int = OPEN_FILES_WANTED) -> None:
    """Raise this process's soft limit on open files (ulimit -n) towards `wanted`, as far as the hard limit allows;
    children (DataLoader workers, torchrun's ranks) inherit it. Kept for the process: a higher soft limit changes
    nothing else, and a low one ended a run in "Too many open files" tracebacks from torch's workers."""
    try:
        import resource
    except ImportError:  # Windows
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):  # macOS refuses more than OPEN_MAX under an unlimited hard limit: keep its own
            pass


def too_many_open_files(e: BaseException) -> bool:
    """Whether `e`, or an error behind it, is the open-files limit running out (EMFILE), as OSError or as torch's
    DataLoader says it ("Too many open files. Communication with the workers is no longer possible")."""
    return any(
        (isinstance(x, OSError) and x.errno == errno.EMFILE) or "Too many open files" in str(x) for x in chain(e)
    )


def higher_limit() -> str:
    """The open-files limit to ask for, as every line that says the limit ran out ends: train's, prepare's, a
    decoder's."""
    return (
        f"a higher limit (ulimit -n {OPEN_FILES_WANTED} in the shell that starts cnnpar, or docker run --ulimit "
        f"nofile={OPEN_FILES_WANTED})"
    )


def open_files_line() -> str:
    """The one line for a command that ran out of open files."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        hard_text = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
        limit = (
            f"this process may have {soft} files open at once (ulimit -n; its hard limit, ulimit -Hn, is {hard_text})"
        )
    except ImportError:
        limit = "the open-files limit is reached"
    return (
        f"too many open files: {limit}, and DataLoader workers hand each batch over as open files: expected "
        f"{higher_limit()}, or fewer --workers or a smaller --prefetch-factor"
    )
