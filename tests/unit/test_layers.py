"""docs/architecture.md's rule, held: data flows one way through the layers, and an import points only to the same
layer or a lower one. Every module under cnnpar/ is read with `ast`, its imports inside functions too (cnnpar
imports lazily, to keep torch out of `--help` and of its launchers), so a low module reaching up to a higher one
(data importing engine) fails here rather than as an import cycle or a launcher that imports torch."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "cnnpar"
ARCHITECTURE = REPO / "docs" / "architecture.md"

# Lowest first. A unit is a subpackage or a top-level module of cnnpar ("cnnpar" is the package's own
# __init__.py); docs/architecture.md's "Layers" list states the same (test_the_docs_list_these_layers).
LAYERS: list[tuple[str, list[str]]] = [
    # standard library only, light: a DataLoader worker, torchrun's launcher and every child import them first
    (
        "base",
        ["cnnpar", "errors", "checkout", "console", "host_facts", "process_tree", "socket_folder", "worker_start"],
    ),
    ("config", ["config"]),
    ("presets", ["presets"]),
    ("dist", ["dist", "torchrun"]),
    ("data / models / report", ["data", "models", "report"]),
    ("parallel", ["parallel"]),
    ("engine", ["engine"]),
    ("bench / doctor / frameworks", ["bench", "doctor", "frameworks"]),
    ("cli", ["cli", "cliargs", "flag_effects", "process_state", "__main__"]),
]
# In these layers the units are siblings that import none of each other, but for the pairs below; in the
# others (modules of one concern split into files), a layer's modules may import each other.
INDEPENDENT = {"data / models / report", "bench / doctor / frameworks"}
SIBLING_IMPORTS = {
    # the loaders and decoders time their phases (report.ranges), beat while they work (report.heartbeat) and
    # write atomically (report.files); report imports nothing of data
    ("data", "report"),
}
# (importing module, imported module): imports that break the rule on purpose, each with its reason. None now.
EXCEPTIONS: dict[tuple[str, str], str] = {}

LAYER_OF = {unit: n for n, (_, units) in enumerate(LAYERS) for unit in units}
NAME_OF = {n: name for n, (name, _) in enumerate(LAYERS)}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(dotted: str) -> bool:
    path = REPO.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def cnnpar_imports(path: Path, text: str) -> list[tuple[int, str]]:
    """(line, imported module) for every import of a cnnpar module in `path`'s `text`, at any depth (functions,
    methods, `if` blocks): `from cnnpar.x import y` is cnnpar.x.y where y is a module, else cnnpar.x."""
    name = module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the importing module's package
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                found.append((node.lineno, f"{base}.{alias.name}" if is_module(f"{base}.{alias.name}") else base))
    return [(line, target) for line, target in found if target.split(".")[0] == "cnnpar"]


def unit_of(dotted: str) -> str:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else "cnnpar"


def allowed(importer: str, imported: str) -> bool:
    source, target = unit_of(importer), unit_of(imported)
    if LAYER_OF[target] != LAYER_OF[source]:
        return LAYER_OF[target] < LAYER_OF[source]
    layer = NAME_OF[LAYER_OF[source]]
    return source == target or layer not in INDEPENDENT or (source, target) in SIBLING_IMPORTS


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def violations(read=Path.read_text) -> list[str]:
    out = []
    for path in modules():
        importer = module_name(path)
        for line, imported in cnnpar_imports(path, read(path)):
            if not allowed(importer, imported) and (importer, imported) not in EXCEPTIONS:
                source, target = LAYER_OF[unit_of(importer)], LAYER_OF[unit_of(imported)]
                what = "an independent sibling" if source == target else NAME_OF[target]
                out.append(
                    f"{path.relative_to(REPO)}:{line}: {importer} ({NAME_OF[source]}) imports {imported} ({what})"
                )
    return out


def test_every_module_has_a_layer():
    unplaced = sorted({unit_of(module_name(p)) for p in modules()} - set(LAYER_OF))
    assert not unplaced, f"place these in LAYERS here and in docs/architecture.md's Layers list: {unplaced}"


def test_no_module_imports_from_a_higher_layer_or_an_independent_sibling():
    found = violations()
    assert not found, "imports against docs/architecture.md's layers:\n" + "\n".join(found)


def test_every_exception_is_still_an_import():
    imports = {(module_name(p), imported) for p in modules() for _, imported in cnnpar_imports(p, p.read_text())}
    stale = sorted(set(EXCEPTIONS) - imports)
    assert not stale, f"EXCEPTIONS names imports no module makes any more: {stale}"


def test_a_lazy_import_from_a_higher_layer_is_found():
    """The check itself: an import inside a function of a data module, from engine, is a violation."""
    planted = PACKAGE / "data" / "loader.py"

    def read(path: Path) -> str:
        extra = "\n\ndef _planted():\n    from cnnpar.engine import trainer\n" if path == planted else ""
        return path.read_text() + extra

    new = sorted(set(violations(read)) - set(violations()))
    assert len(new) == 1 and "cnnpar.data.loader (data / models / report) imports cnnpar.engine.trainer" in new[0]


def documented_layers() -> list[tuple[str, list[str]]]:
    """The doc's "## Layers" list: `- **layer**: `module.py`, `package/`, ...` lines, lowest first."""
    section = ARCHITECTURE.read_text().split("## Layers", 1)[1].split("\n## ", 1)[0]
    layers = []
    for name, rest in re.findall(r"^- \*\*(.+?)\*\*: (.*)$", section, re.M):
        units = [t.removesuffix("/").removesuffix(".py") for t in re.findall(r"`([\w/]+(?:\.py|/))`", rest)]
        layers.append((name, ["cnnpar" if u == "cnnpar/__init__" else u for u in units]))
    return layers


def test_the_docs_list_these_layers():
    assert documented_layers() == LAYERS


def test_the_module_table_names_every_top_level_module_and_subpackage():
    first_cells = re.findall(r"^\| ([^|]+) \|", ARCHITECTURE.read_text(), re.M)
    named = {name for cell in first_cells for name in re.findall(r"`([^`]+)`", cell)}
    wanted = {p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    wanted |= {f"{p.parent.name}/" for p in PACKAGE.glob("*/__init__.py")}
    assert not sorted(wanted - named), f"docs/architecture.md's module table lacks rows for {sorted(wanted - named)}"


def test_the_module_table_names_every_module_of_a_subpackage():
    """A subpackage's module is named in a row of its own (`data/overlap.py`) or in its package's row (`loader`):
    33 were named in neither (some only described, "the `Trainer`", "checkpoints"), so the table did not say
    which file owns what."""
    rows = dict(re.findall(r"^\| ([^|]+?) \| (.*) \|$", ARCHITECTURE.read_text(), re.M))
    own_rows = {name for cell in rows for name in re.findall(r"`([^`]+)`", cell)}
    unnamed = []
    for path in sorted(PACKAGE.glob("*/*.py")):
        package, stem = path.parent.name, path.stem
        named_in_row = set(re.findall(r"`([^`]+)`", rows.get(f"`{package}/`", "")))
        if stem != "__init__" and f"{package}/{path.name}" not in own_rows and not {stem, path.name} & named_in_row:
            unnamed.append(f"{package}/{path.name}")
    assert not unnamed, f"docs/architecture.md's module table names neither a row nor its package's row for {unnamed}"
