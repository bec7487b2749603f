"""Facts stored with every result: device, driver, torch version, git revision, date."""

from __future__ import annotations

import datetime as _dt
import platform
import subprocess
from pathlib import Path

import torch

from cnnpar.checkout import ROOT, cnnpar_version, is_checkout
from cnnpar.report.host import cpu_name


def git_revision(root: str | Path | None = None) -> str:
    """The revision of cnnpar's checkout `root` (default: the one this cnnpar runs from), with -dirty when tracked
    files changed; "unknown" outside a checkout: an installed cnnpar's folder may lie in another repository (a
    project's .venv), and that repository's revision says nothing about the code that ran. CNNPAR_GIT_REV overrides
    it for copies of a checkout that travel without their .git folder (a lent GPU machine)."""
    import os

    if os.environ.get("CNNPAR_GIT_REV"):
        return os.environ["CNNPAR_GIT_REV"]
    here = Path(root) if root else ROOT
    if not is_checkout(here):  # before git: it would answer for whichever repository holds `here`
        return "unknown"
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if rev.returncode != 0:
        return "unknown"
    return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name() or platform.processor() or platform.machine() or "cpu"


def driver_version() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else v
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML, no driver: this is metadata, never a reason to fail
        return ""


def environment(device: torch.device, world_size: int = 1) -> dict[str, str | int]:
    import os

    return {
        "device": device_name(device),
        "device_type": device.type,
        "driver": driver_version() if device.type == "cuda" else "",
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "",
        "python": platform.python_version(),
        "host_cpus": os.cpu_count() or 0,
        # torch's intra-op threads in this process (OMP_NUM_THREADS, cnnpar's share under --nproc): CPU figures
        # depend on it, and a run's record held no trace of it
        "torch_threads": torch.get_num_threads(),
        "world_size": world_size,
        "git_rev": git_revision(),
        # an installed cnnpar has no revision ("unknown"): its version says which code ran
        "cnnpar": cnnpar_version(),
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }


def cpu_threads_note(device: torch.device) -> str:
    """For a run's first line on the CPU, where the speed depends on it: " (N threads each)" (torch's intra-op
    threads, as OMP_NUM_THREADS or cnnpar's share of the cores under --nproc left them); "" on an accelerator."""
    if device.type != "cpu":
        return ""
    n = torch.get_num_threads()
    return f" ({n} thread{'s' * (n != 1)} each)"


def comment_lines(env: dict) -> str:
    """`# key = value` lines heading a TOML file (a run's config.toml, tuned.toml, a profile's config.toml):
    comments, so the file still loads with --config."""
    return "".join(f"# {k} = {v}\n" for k, v in env.items())
