"""This checkout, for the child processes it starts: `python -m cnnpar ...` imports whichever cnnpar is first on
the child's path, which is an installed one (or none) unless the child is told where this one lives. A benchmark
run from outside the repository root had trained the installed cnnpar while recording this checkout's git revision.

The bottom layer (standard library only): the frameworks' runners, ddp_scaling's workers and the benchmark
scripts' children all start the same way.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def is_checkout(root: Path) -> bool:
    """Whether cnnpar runs from its source tree rather than from an installed wheel. A wheel's cnnpar/ sits in a
    site-packages folder, with no pyproject.toml beside it and none of the repository's benchmarks/ or scripts/;
    that folder may lie inside the user's own git repository (a project's .venv), whose revision is not cnnpar's."""
    return (root / "pyproject.toml").is_file()


def cnnpar_version() -> str:
    """The installed distribution's version (what pip installed), else the package's own (a checkout on PYTHONPATH,
    never installed). Records carry it beside the git revision, which an installed cnnpar has not."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cnnpar")
    except PackageNotFoundError:
        from cnnpar import __version__

        return __version__


def env_importing_this_checkout(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of `env` (default: this process's) whose PYTHONPATH starts with this checkout's root. No empty entry
    is left when there was no PYTHONPATH: an empty entry puts the child's working folder on its path. An installed
    cnnpar's root is a site-packages, which the child's interpreter finds by itself: put on PYTHONPATH it would come
    before the standard library, for the child and for every interpreter the child starts."""
    out = dict(os.environ if env is None else env)
    if not is_checkout(ROOT):
        return out
    rest = out.get("PYTHONPATH", "")
    out["PYTHONPATH"] = str(ROOT) + (os.pathsep + rest if rest else "")
    return out
