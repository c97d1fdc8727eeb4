"""`npu-migrate analyze`: what a migration to Ascend involves, before any code changes.

One module per mode (`torch_apis`, `third_party`, `custom_kernels`, `affinity_apis`, `dynamic_shape`,
`model`), the run in `core`, the report formats in `output`, the command in `cli`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from npu_migrate.analyze.core import FileScan
    from npu_migrate.findings import Finding

_MODULES = {
    "torch_apis": "torch_apis",
    "third_party": "third_party",
    "custom_kernels": "custom_kernels",
    "affinity_apis": "affinity",
    "dynamic_shape": "dynamic_shape",
    "model": "model",
}


class _Modes(dict):
    def __missing__(self, mode: str):
        module = importlib.import_module(f"npu_migrate.analyze.{_MODULES[mode]}")
        self[mode] = module
        return module


MODE_MODULES = _Modes()


def scanner_findings(scan: FileScan) -> list[Finding]:
    """The analysis findings the scanners found in one file (every scanner's, whatever the modes)."""
    return [f for facts in scan.facts.values() for f in facts.get("findings", ())]


def __getattr__(name: str):
    # `core` brings in the engine and libcst: the CLI imports this package (for `analyze`'s options) on
    # every run, `apply --check` in a pre-commit hook included, and only `analyze` itself needs them.
    if name == "MODES":
        from npu_migrate.analyze.core import MODES

        return MODES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["MODES", "MODE_MODULES", "scanner_findings"]
