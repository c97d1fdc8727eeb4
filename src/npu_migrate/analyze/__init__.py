"""`npu-migrate analyze`: what a migration to Ascend involves, before any code changes.

One module per mode under `modes/`, named as the mode, each exporting its `Mode` object as `MODE`; the
registry of them below; the types they share in `project`; the run in `core`; the report formats in
`output`; the command in `cli`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from npu_migrate.analyze.project import Mode


class Registry(Mapping[str, "Mode"]):
    """Mode name -> mode object, in report order. A mode's module is imported when it is first looked up:
    the CLI imports this package (for `analyze`'s options) on every run, `apply --check` in a pre-commit hook
    included, and only `analyze` itself needs the modes, the engine and libcst they bring in."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self._names = names
        self._loaded: dict[str, Mode] = {}

    def __getitem__(self, name: str) -> Mode:
        if name not in self._names:
            raise KeyError(name)
        if name not in self._loaded:
            self._loaded[name] = importlib.import_module(f"npu_migrate.analyze.modes.{name}").MODE
        return self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


#: Adding a mode: its module under `modes/`, and its name here.
REGISTRY = Registry(("torch_apis", "third_party", "custom_kernels", "affinity_apis", "dynamic_shape", "model"))

MODES: tuple[str, ...] = tuple(REGISTRY)

__all__ = ["MODES", "REGISTRY", "Registry"]
