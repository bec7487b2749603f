"""cnnpar installed from a wheel (`pip install cnnpar-*.whl`, not `pip install -e .`): its package folder is a
site-packages with no pyproject.toml, benchmarks/ or scripts/ beside it, often inside the user's own git repository
(a project's .venv). Nothing may record that repository's revision as cnnpar's, or write results into site-packages."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from cnnpar.bench import ddp_scaling
from cnnpar.report.environment import git_revision


def _repository(path: Path, *files: str) -> str:
    """A git repository at `path` with `files` committed; its short revision."""
    path.mkdir(parents=True)
    for name in files:
        (path / name).write_text("x\n")
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=path, check=True)
    subprocess.run([*git, "add", *files], cwd=path, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], cwd=path, check=True)
    return subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=path, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_an_installed_cnnpar_inside_another_repository_records_no_revision(tmp_path, monkeypatch):
    monkeypatch.delenv("CNNPAR_GIT_REV", raising=False)
    _repository(tmp_path / "project", "notes.txt")
    site = tmp_path / "project" / ".venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    assert git_revision(site) == "unknown"  # was the project's revision, written into every run's config.toml


def test_a_checkout_records_its_revision(tmp_path, monkeypatch):
    monkeypatch.delenv("CNNPAR_GIT_REV", raising=False)
    rev = _repository(tmp_path / "cnnpar", "pyproject.toml")
    assert git_revision(tmp_path / "cnnpar") == rev
    (tmp_path / "cnnpar" / "pyproject.toml").write_text("changed\n")
    assert git_revision(tmp_path / "cnnpar") == rev + "-dirty"


def test_ddp_scaling_writes_into_the_working_folder_when_installed(tmp_path, monkeypatch):
    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.setattr(ddp_scaling, "ROOT", site)
    assert ddp_scaling.default_prefix("cpu") == Path("runs") / "ddp_scaling_cpu"  # was site-packages/benchmarks/...
    (site / "pyproject.toml").write_text("")  # a checkout keeps its results beside the others
    assert ddp_scaling.default_prefix("cpu") == site / "benchmarks" / "results" / "ddp_scaling_cpu"


def test_the_horovod_refusal_of_an_installed_cnnpar_names_no_path_into_site_packages(tmp_path, monkeypatch):
    from cnnpar import dist
    from cnnpar.errors import ConfigError

    site = tmp_path / "site-packages"
    (site / "cnnpar").mkdir(parents=True)
    monkeypatch.setattr(dist, "CHECKOUT", site)
    monkeypatch.setattr(dist, "HOROVOD_VENV", site / ".venv-horovod")
    for key in dist.HOROVOD_LAUNCH_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as refused:
        dist.check_horovod_launch(0, ["--epochs", "1"])
    said = str(refused.value)
    assert "site-packages" not in said  # was site-packages/scripts/install_horovod.sh, a script the wheel does not hold
    assert (
        "run `scripts/install_horovod.sh && .venv-horovod/bin/horovodrun -np 2 -H localhost:2 .venv-horovod/bin/python "
        "-m cnnpar train --epochs 1 --strategy horovod` from the root of a cnnpar source checkout"
    ) in said


def test_a_missing_cifar10_npz_is_described_by_its_arrays_not_only_by_a_checkouts_script(tmp_path, monkeypatch):
    from cnnpar.presets import get_preset, preset_data_note

    monkeypatch.chdir(tmp_path)  # a pip user's folder: no .devdata/, no benchmarks/
    source = get_preset("cifar10-speed").data.source
    note = preset_data_note("cifar10-speed", f"{source}: file not found")
    assert "x_train uint8 (50000, 32, 32, 3), y_train, x_test uint8 (10000, 32, 32, 3), y_test" in note


def test_an_installed_cnnpars_children_get_no_site_packages_on_their_pythonpath(tmp_path, monkeypatch):
    from cnnpar import checkout

    monkeypatch.setattr(checkout, "ROOT", tmp_path / "site-packages")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert "PYTHONPATH" not in checkout.env_importing_this_checkout()  # it came before the standard library
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    assert checkout.env_importing_this_checkout()["PYTHONPATH"] == "/elsewhere"


def test_records_and_the_cli_name_the_installed_version_where_no_revision_is_known(tmp_path, monkeypatch, capsys):
    # an installed cnnpar records git_rev "unknown": the version pip installed is what says which code ran
    from importlib.metadata import PackageNotFoundError, version

    import torch

    import cnnpar
    from cnnpar.cli import main
    from cnnpar.report import environment

    try:
        expected = version("cnnpar")
    except PackageNotFoundError:  # this checkout on PYTHONPATH, never installed
        expected = cnnpar.__version__
    monkeypatch.setattr(environment, "ROOT", tmp_path)  # no pyproject.toml: not a checkout
    env = environment.environment(torch.device("cpu"))
    assert env["git_rev"] == "unknown" and env["cnnpar"] == expected
    assert f"# cnnpar = {expected}\n" in environment.comment_lines(env)  # config.toml's header
    with pytest.raises(SystemExit) as ended:
        main(["--version"])
    assert ended.value.code == 0 and capsys.readouterr().out == f"cnnpar {expected}\n"


def test_the_cifar10_resnet18_preset_without_its_npz_is_refused_not_trained_on_the_digits(
    tmp_path, monkeypatch, capsys
):
    """--preset cifar10-resnet18 had no --data of its own, so without --data it trained ResNet-18 on the built-in
    digits for 20 epochs with no word: a user's CIFAR-10 run on other images. It reads cifar10-speed's .npz now."""
    from cnnpar.cli import main

    monkeypatch.chdir(tmp_path)  # no .devdata/cifar10.npz here
    assert main(["train", "--preset", "cifar10-resnet18", "--device", "cpu", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cifar10.npz" in err[0], err
    assert "(the --data of --preset cifar10-resnet18: pass --data FILE, a decoded CIFAR-10 .npz" in err[0]
    assert not (tmp_path / "runs").exists()
