"""The wheel ships every folder of the package: a folder missing from pyproject's `packages` is left out
of the wheel (with only a setuptools warning), and an installed npu-migrate then fails to find a
template or a table that the editable install in the tests finds."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from conftest import INTEGRATION_PACKAGES, marked_integration

ROOT = Path(__file__).resolve().parent.parent


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]


def test_every_folder_with_files_is_a_declared_package():
    setuptools = _setuptools()
    declared = set(setuptools["packages"])
    missing = []
    for package, folder in setuptools["package-dir"].items():
        for directory in [ROOT / folder, *(p for p in (ROOT / folder).rglob("*") if p.is_dir())]:
            if directory.name == "__pycache__" or not any(f.is_file() for f in directory.iterdir()):
                continue
            relative = directory.relative_to(ROOT / folder).parts
            dotted = ".".join((package, *relative))
            if dotted not in declared:
                missing.append(f"{directory.relative_to(ROOT)} (as {dotted})")
    assert not missing, "add to [tool.setuptools] packages in pyproject.toml: " + ", ".join(missing)


def test_every_data_file_is_package_data():
    setuptools = _setuptools()
    patterns = setuptools.get("package-data", {})
    unshipped = []
    for package, folder in setuptools["package-dir"].items():
        for path in (ROOT / folder).rglob("*"):
            if not path.is_file() or path.suffix in {".py", ".pyc"}:
                continue
            dotted = ".".join((package, *path.parent.relative_to(ROOT / folder).parts))
            if not any(path.match(glob) for glob in patterns.get(dotted, ())):
                unshipped.append(str(path.relative_to(ROOT)))
    assert not unshipped, "add to [tool.setuptools.package-data] in pyproject.toml: " + ", ".join(unshipped)


def _marked_integration(decorators: list[ast.expr]) -> bool:
    return any("integration" in ast.unparse(d) for d in decorators)


def _heavy_uses(node: ast.AST) -> list[int]:
    """Lines in `node` that import an `integration` package or look one up (`find_spec`, `importorskip`)."""
    lines = []
    for child in ast.walk(node):
        names: list[str] = []
        if isinstance(child, ast.Import):
            names = [alias.name for alias in child.names]
        elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
            names = [child.module]
        elif (
            isinstance(child, ast.Call)
            and isinstance(child.func, ast.Attribute | ast.Name)
            and getattr(child.func, "attr", getattr(child.func, "id", "")) in {"find_spec", "importorskip"}
            and child.args
            and isinstance(child.args[0], ast.Constant)
        ):
            names = [str(child.args[0].value)]
        if any(name.split(".")[0] in INTEGRATION_PACKAGES for name in names):
            lines.append(child.lineno)
    return lines


def test_tests_that_need_torch_or_transformers_are_marked_integration():
    """`pytest -m "not integration"` with the light `test` extra must not fail for want of torch: whatever
    imports it is marked (the module, or the test). Run-time imports through npu_migrate.verify are caught
    by CI's floor job, which runs without the extra."""
    unmarked = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if marked_integration(tree):
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
                if not _marked_integration(node.decorator_list) and _heavy_uses(node):
                    unmarked.append(f"{path.name}::{node.name}")
            elif not isinstance(node, ast.FunctionDef | ast.ClassDef) and _heavy_uses(node):
                unmarked.append(f"{path.name}:{node.lineno} (module level)")
    assert not unmarked, "mark these `integration`: " + ", ".join(unmarked)


def test_no_test_skips_itself_for_want_of_a_package():
    # A skipped test hides a failure: a missing extra fails loudly, or the run deselects `integration`.
    offenders = [
        f"{path.name}:{node.lineno}"
        for path in sorted((ROOT / "tests").glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "importorskip"
    ]
    assert offenders == []
