"""No import circles: every module of npu_migrate imports on its own, first, in a fresh interpreter.

A circle that an import order happens to satisfy (`a` imported before `b`) fails here for the module that
starts it, whatever order the rest of the suite imports them in.
"""

from __future__ import annotations

import ast
import importlib.util
import pathlib
import pkgutil
import subprocess
import sys

import pytest

import npu_migrate
import npu_migrate.transforms


def _modules() -> list[str]:
    # `transforms/` is installed as `npu_migrate.transforms` from a folder of its own, so it is walked apart;
    # a `__main__` module runs the program when imported.
    found = [
        *pkgutil.walk_packages(npu_migrate.__path__, "npu_migrate."),
        *pkgutil.walk_packages(npu_migrate.transforms.__path__, "npu_migrate.transforms."),
    ]
    return sorted({info.name for info in found if not info.name.endswith(".__main__")} | {"npu_migrate.transforms"})


def test_every_module_is_found():
    modules = _modules()
    assert {
        "npu_migrate.engine.rule",
        "npu_migrate.engine.context",
        "npu_migrate.engine.scoped",
        "npu_migrate.engine.pipeline",
    } <= set(modules)
    assert "npu_migrate.transforms.fused" in modules


def _needs_torch(module: str) -> bool:
    spec = importlib.util.find_spec(module)
    tree = ast.parse(pathlib.Path(spec.origin).read_text(encoding="utf-8"))
    return any(
        isinstance(node, ast.Import) and any(alias.name.split(".")[0] == "torch" for alias in node.names)
        for node in tree.body
    )


@pytest.mark.parametrize(
    "module", [pytest.param(m, marks=pytest.mark.integration) if _needs_torch(m) else m for m in _modules()]
)
def test_module_imports_alone(module):
    result = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def _imports_of(module: str, path: str, is_package: bool, known: set[str]) -> set[str]:
    """The npu_migrate modules `module` names in any import: top level, function level, TYPE_CHECKING."""
    found = set()
    tree = ast.parse(open(path, encoding="utf-8").read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names)
    return {name for name in found if name in known and name != module}


def test_no_import_circles_not_even_for_type_checking_or_inside_functions():
    # Importing each module alone catches circles an import order trips over; this catches the ones that
    # hide behind `if TYPE_CHECKING:` or a function-level import, which make the layers hard to follow.
    infos = {
        info.name: info
        for info in [
            *pkgutil.walk_packages(npu_migrate.__path__, "npu_migrate."),
            *pkgutil.walk_packages(npu_migrate.transforms.__path__, "npu_migrate.transforms."),
        ]
    }
    known = set(infos)
    graph = {}
    for name, info in infos.items():
        spec = info.module_finder.find_spec(name.rsplit(".", 1)[-1], None)
        graph[name] = _imports_of(name, spec.origin, info.ispkg, known)
    # Depth-first search; a back edge is a circle.
    state: dict[str, int] = {}
    circles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                circles.append(" -> ".join([*path[path.index(dep) :], dep]))
            elif dep not in state:
                visit(dep, [*path, dep])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not circles, circles
