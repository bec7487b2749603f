"""What `pip install cnnpar-*.whl` gives, where every other test imports this checkout: the wheel holds every file
of the package, and the installed cnnpar, in a virtualenv inside the user's own git repository (a project's .venv),
runs from another folder and records no revision of that repository as its own. Offline: the wheel is built without
build isolation, and the virtualenv sees this interpreter's packages (torch) instead of downloading them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

# the build backend, without build isolation: PEP 621 metadata from setuptools 61, and bdist_wheel built in from 70.1
# (before it, the wheel package's); a fresh Python 3.11 venv holds setuptools 65.5 and no wheel
_setuptools = pytest.importorskip("setuptools", minversion="61")
if tuple(int(p) for p in _setuptools.__version__.split(".")[:2]) < (70, 1):
    pytest.importorskip("wheel")


def _run(cmd: list, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def _user_env() -> dict[str, str]:
    """A user's shell: no PYTHONPATH (it would import this checkout), no user site, no cnnpar settings."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("CNNPAR_")}
    return {**env, "PYTHONNOUSERSITE": "1", "OMP_NUM_THREADS": "1"}


def _wheel(tmp_path: Path) -> Path:
    """The wheel of this checkout's tracked package files, built in a copy (a build writes build/ where it runs)."""
    src = tmp_path / "src"
    files = _run(["git", "ls-files", "pyproject.toml", "README.md", "cnnpar"], REPO).stdout.split()
    if not files:
        pytest.skip("not a git checkout: its package files are not listed")
    for name in files:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, src / name)
    cmd = [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-q", "-w", tmp_path / "w"]
    built = _run(cmd, src)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "w").glob("cnnpar-*.whl")
    return wheel


@pytest.mark.slow
def test_the_wheel_installed_in_a_projects_venv_runs_and_records_no_revision_of_that_project(tmp_path):
    wheel = _wheel(tmp_path)
    tracked = set(_run(["git", "ls-files", "cnnpar"], REPO).stdout.split())
    assert tracked <= set(zipfile.ZipFile(wheel).namelist())  # data files read at run time included

    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.txt").write_text("x\n")
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
    for cmd in (["init", "-q"], ["add", "notes.txt"], ["commit", "-q", "-m", "one"]):
        assert _run([*git, *cmd], project).returncode == 0
    venv = project / ".venv"
    made = _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv], project)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    # this interpreter's pip installs into the venv's site-packages: --without-pip saves seconds
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], project).stdout.strip()
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target", site, wheel]
    installed = _run(pip, project)
    assert installed.returncode == 0, installed.stderr

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = (
        "import cnnpar; from cnnpar.report.environment import git_revision; "
        "print(cnnpar.__file__); print(git_revision())"
    )
    ran = _run([python, "-c", code], elsewhere, _user_env())
    assert ran.returncode == 0, ran.stderr
    where, rev = ran.stdout.split()
    assert Path(where) == Path(site) / "cnnpar" / "__init__.py"  # the wheel's, not this checkout's
    assert rev == "unknown"  # was the project's revision
    helped = _run([python, "-m", "cnnpar", "--help"], elsewhere, _user_env())
    assert helped.returncode == 0 and "usage: cnnpar" in helped.stdout, helped.stderr
