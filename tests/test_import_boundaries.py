"""The GUI never imports the model stack, and the engine never imports Qt.

Each side is imported in a fresh interpreter, so modules other tests loaded do
not hide a violation; an AST scan of import statements double-checks imports
that only happen inside functions.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {
    "app": ("torch", "transformers", "bitsandbytes"),
    "engine": ("PySide6", "qasync"),
}
_IMPORT_ALL = """
import importlib, json, pkgutil, sys
package = importlib.import_module({package!r})
names = [package.__name__] + [
    info.name for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
    if not info.name.endswith(".__main__") and info.name.rpartition(".")[2].isidentifier()
]  # a name no import statement can spell is a kernel library beside its sources (``native.variants``), not a module
for name in names:
    importlib.import_module(name)
print(json.dumps({{"imported": names, "loaded": sorted(sys.modules)}}))
"""


def _modules_loaded_by_importing(package: str) -> tuple[list[str], set[str]]:
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL.format(package=package)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    return report["imported"], set(report["loaded"])


def _top_level_names(loaded: set[str]) -> set[str]:
    return {name.split(".")[0] for name in loaded}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_importing_every_module_loads_nothing_forbidden(package):
    imported, loaded = _modules_loaded_by_importing(package)

    assert len(imported) > 1
    assert _top_level_names(loaded).isdisjoint(FORBIDDEN[package])


def _imported_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_import_statement_names_a_forbidden_package(package):
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imported_names(path) & set(FORBIDDEN[package]))
        for path in sorted((ROOT / package).rglob("*.py"))
    }

    assert {path: names for path, names in offenders.items() if names} == {}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path, known: set[str]) -> set[str]:
    """Hearth modules that ``path`` imports anywhere (module level or inside functions)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in known else node.module)
    return found & known


def _import_graph(package: str) -> dict[str, set[str]]:
    paths = sorted((ROOT / package).rglob("*.py"))
    known = {_module_name(path) for path in paths}
    return {_module_name(path): _imported_modules(path, known) - {_module_name(path)} for path in paths}


def _a_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of ``graph`` as the modules along it, or [] when there is none."""
    state: dict[str, str] = {}
    trail: list[str] = []

    def visit(module: str) -> list[str]:
        state[module] = "open"
        trail.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                return trail[trail.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[module] = "done"
        trail.pop()
        return []

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return []


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_module_imports_itself_through_others(package):
    graph = _import_graph(package)

    assert len(graph) > 10
    assert _a_cycle(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}

    assert _a_cycle(graph) == ["a", "b", "c", "a"]


def test_only_the_peer_script_imports_llama_cpp():
    """llama.cpp is the benchmarks' yardstick, never a dependency: only the script its own interpreter runs names it."""
    importers = sorted(
        str(path.relative_to(ROOT)) for package in FORBIDDEN for path in sorted((ROOT / package).rglob("*.py"))
        if "llama_cpp" in _imported_names(path)
    )

    assert importers == ["engine/bench/peer_llama.py"]
