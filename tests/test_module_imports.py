"""No import circles: every module of npu_migrate imports on its own, first, in a fresh interpreter.

A circle that an import order happens to satisfy (`a` imported before `b`) fails here for the module that
starts it, whatever order the rest of the suite imports them in.
"""

from __future__ import annotations

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
    assert {"npu_migrate.rule", "npu_migrate.context", "npu_migrate.scoped", "npu_migrate.pipeline"} <= set(modules)
    assert "npu_migrate.transforms.fused" in modules


@pytest.mark.parametrize("module", _modules())
def test_module_imports_alone(module):
    result = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
