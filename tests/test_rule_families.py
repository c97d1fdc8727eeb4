"""Rule families share helpers through `transforms/common/`, never through each other.

A family may import another family's declarations (a `Rule`, or a table of them), where its checker reports
under that rule's id; anything else it needs from another family belongs in `transforms/common/`.
"""

from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

from npu_migrate.engine.rule import Rule

TRANSFORMS = pathlib.Path(importlib.import_module("npu_migrate.transforms").__file__).parent
# Each family is a module of transforms/ or a package (fused/); `common/` is no family.
FAMILY_FILES = sorted(
    p for p in TRANSFORMS.rglob("*.py") if p.parent.name != "common" and p != TRANSFORMS / "__init__.py"
)
COMMON = sorted((TRANSFORMS / "common").glob("*.py"))


def _family(path: pathlib.Path) -> str:
    return path.relative_to(TRANSFORMS).parts[0].removesuffix(".py")


def _imports_from_transforms(path: pathlib.Path) -> list[tuple[str, str]]:
    """(module, name) of each `from npu_migrate.transforms.<module> import name` in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("npu_migrate.transforms."):
            found.extend((node.module, alias.name) for alias in node.names)
    return found


def _is_declaration(value: object) -> bool:
    if isinstance(value, Rule):
        return True
    return isinstance(value, dict) and bool(value) and all(isinstance(v, Rule) for v in value.values())


@pytest.mark.parametrize("path", FAMILY_FILES, ids=lambda p: str(p.relative_to(TRANSFORMS)))
def test_a_family_takes_only_declarations_from_another(path):
    family = _family(path)
    for module, name in _imports_from_transforms(path):
        owner = module.split(".")[2]
        if owner in ("common", family):
            continue
        value = getattr(importlib.import_module(module), name)
        assert _is_declaration(value), f"{family} imports helper `{name}` from family {owner}: move it to common/"


@pytest.mark.parametrize("path", COMMON, ids=lambda p: p.stem)
def test_common_helpers_depend_on_no_family(path):
    owners = {module.split(".")[2] for module, _ in _imports_from_transforms(path)}
    assert owners <= {"common"}, f"{path.name} imports from {owners - {'common'}}"


def test_the_declaration_check_can_fail():
    from npu_migrate.transforms.common.devices import device_literal
    from npu_migrate.transforms.device import DEVICE_STRING
    from npu_migrate.transforms.environment import RULE_FOR_NEED

    assert _is_declaration(DEVICE_STRING) and _is_declaration(RULE_FOR_NEED)
    assert not _is_declaration(device_literal) and not _is_declaration({})
