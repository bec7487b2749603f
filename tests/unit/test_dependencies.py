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
    "nvidia.nvimgcodec": "nvidia-nvimgcodec-cu13",  # the nvimgcodec extra
}

# namespace packages: each of their subpackages is a distribution of its own (nvidia.nvimgcodec, nvidia.dali, ...),
# so they are told apart by their first two names, not the first, which would let any nvidia.* pass as named
NAMESPACES = {"nvidia"}

# imported, named nowhere on purpose, each with its reason
NOT_NAMED = {
    "triton": "torch's own dependency on Linux, where the CUDA resize kernel runs",
    "jaxlib": "jax's own dependency (the jax extra)",
    "threadpoolctl": "scikit-learn's own dependency; read by the framework comparison alone",
    "horovod": "built from a patched sdist into a venv of its own (scripts/install_horovod.sh, docs/frameworks.md)",
}


def imported_packages(folder: Path = ROOT / "cnnpar") -> dict[str, str]:
    """Third-party packages imported anywhere under `folder` (inside functions too), by their top-level name (a
    namespace package's first two) -> one file importing it."""
    found: dict[str, str] = {}
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [f"{node.module}.{alias.name}" for alias in node.names]  # `from nvidia import nvimgcodec`
            else:
                continue
            for name in names:
                parts = name.split(".")
                top = ".".join(parts[:2]) if parts[0] in NAMESPACES else parts[0]
                if parts[0] != "cnnpar" and parts[0] not in sys.stdlib_module_names:
                    found.setdefault(top, str(path.relative_to(folder.parent)))
    return found


def named_in_pyproject() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    requirements = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def not_named(imported: dict[str, str]) -> dict[str, str]:
    """The packages of `imported` (name -> a file importing it) that pyproject names nowhere, without a reason."""
    named = named_in_pyproject()
    return {
        top: where
        for top, where in imported.items()
        if top not in NOT_NAMED and DISTRIBUTION.get(top, top).lower().replace("_", "-") not in named
    }


def test_every_package_cnnpar_imports_is_named_in_pyproject():
    assert not_named(imported_packages()) == {}


def test_a_namespace_packages_subpackage_is_a_package_of_its_own(tmp_path):
    # nvidia.nvimgcodec is named (the nvimgcodec extra); another nvidia.* package is not, and must not pass for it
    code = tmp_path / "pkg"
    code.mkdir()
    (code / "a.py").write_text(
        "import nvidia.nvimgcodec\nfrom nvidia import dali\n\n\ndef f():\n    import PIL.Image\n"
    )
    found = imported_packages(code)
    assert set(found) == {"nvidia.nvimgcodec", "nvidia.dali", "PIL"}
    assert not_named(found) == {"nvidia.dali": "pkg/a.py"}


def test_the_packages_named_nowhere_on_purpose_are_still_imported():
    # a reason kept for an import that went would hide the next one added under that name
    assert set(NOT_NAMED) <= set(imported_packages())
