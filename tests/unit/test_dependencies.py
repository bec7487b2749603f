"""Every package cnnpar's own code imports is one pyproject.toml names, in its dependencies or an extra: Pillow was
imported by the photo paths and named nowhere, so torchvision's floor (5.3) let in a Pillow before 9.1, which has no
`Image.Resampling` (prepare's resize: an AttributeError on 9.0.1)"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# import name -> the distribution pyproject names, where they differ
DISTRIBUTION = {
    "PIL": "pillow",
    "sklearn": "scikit-learn",
    "pynvml": "nvidia-ml-py",
    "tomli_w": "tomli-w",
    "tensorflow": "tensorflow-cpu",
    "nvidia": "nvidia-nvimgcodec-cu13",  # nvidia.nvimgcodec, the nvimgcodec extra
}

# imported, named nowhere on purpose, each with its reason
NOT_NAMED = {
    "triton": "torch's own dependency on Linux, where the CUDA resize kernel runs",
    "jaxlib": "jax's own dependency (the jax extra)",
    "threadpoolctl": "scikit-learn's own dependency; read by the framework comparison alone",
    "horovod": "built from a patched sdist into a venv of its own (scripts/install_horovod.sh, docs/frameworks.md)",
}


def imported_packages() -> dict[str, str]:
    """Top-level third-party names imported anywhere in cnnpar/ (inside functions too) -> one file importing it."""
    found: dict[str, str] = {}
    for path in sorted((ROOT / "cnnpar").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top != "cnnpar" and top not in sys.stdlib_module_names:
                    found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def named_in_pyproject() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    requirements = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def test_every_package_cnnpar_imports_is_named_in_pyproject():
    named = named_in_pyproject()
    missing = {
        top: where
        for top, where in imported_packages().items()
        if top not in NOT_NAMED and DISTRIBUTION.get(top, top).lower().replace("_", "-") not in named
    }
    assert missing == {}


def test_the_packages_named_nowhere_on_purpose_are_still_imported():
    # a reason kept for an import that went would hide the next one added under that name
    assert set(NOT_NAMED) <= set(imported_packages())
