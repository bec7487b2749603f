"""Children started as `python -m cnnpar ...` import this checkout, wherever they are started from: batch_auto's
`cnnpar train` children, run from outside the repository root, had trained an installed cnnpar while its rows
recorded this checkout's git revision."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from cnnpar.checkout import ROOT, env_importing_this_checkout


def test_a_child_started_elsewhere_without_pythonpath_imports_this_checkout(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    env = env_importing_this_checkout()
    assert env["PYTHONPATH"] == str(ROOT)  # no empty entry: that would put the child's working folder on its path
    code = "import cnnpar; print(cnnpar.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert Path(out.stdout.strip()) == ROOT / "cnnpar" / "__init__.py"


def test_an_existing_pythonpath_is_kept_after_this_checkout(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    assert env_importing_this_checkout()["PYTHONPATH"].split(":") == [str(ROOT), "/elsewhere"]


def test_batch_autos_train_children_import_the_scripts_checkout(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("batch_auto", ROOT / "benchmarks" / "batch_auto.py")
    batch_auto = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(batch_auto)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    seen = {}

    def no_training(cmd, **kw):  # stops run_case right after the launch: only the child's environment matters
        seen.update(kw)
        return subprocess.CompletedProcess(cmd, 1, "", "")

    monkeypatch.setattr(batch_auto.subprocess, "run", no_training)
    args = type("Args", (), dict(data="digits", model="cnn3", epochs=1))()
    try:
        batch_auto.run_case("64", args, tmp_path)
    except SystemExit:
        pass
    assert seen["env"]["PYTHONPATH"].split(":")[0] == str(ROOT)
