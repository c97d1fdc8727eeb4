"""The wheel ships every folder of the package: a folder missing from pyproject's `packages` is left out
of the wheel (with only a setuptools warning), and an installed npu-migrate then fails to find a
template or a table that the editable install in the tests finds."""

from __future__ import annotations

import tomllib
from pathlib import Path

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
