"""Issue #25 item 3: the injected code agrees with the imports it sits next to."""

from __future__ import annotations

import textwrap

import pytest

from npu_migrate.engine.pipeline import migrate_text

# A hand-written RMSNorm: fused by default (SDPA calls are left to torch_npu's native dispatch).
NORM = """
import torch


def place(x):
    return x{move}


def norm(x, weight, eps: float = 1e-6):
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))
"""
NORM_AND_MOVE = NORM.format(move=".cuda()")
NORM_ONLY = NORM.format(move=".double()")


def _migrate(source: str, path: str = "mod.py") -> tuple[str, list]:
    migrated, findings = migrate_text(textwrap.dedent(source).lstrip(), path=path)
    again, second = migrate_text(migrated, path=path)
    assert again == migrated, "a second apply must change nothing"
    # ... and finds no helper of its own "stale": both spellings of `_is_npu` are this version's.
    assert not [f for f in second if "differs from the one npu-migrate" in f.message]
    return migrated, findings


def test_a_file_importing_torch_npu_unconditionally_does_not_test_for_its_absence():
    migrated, _ = _migrate(NORM_AND_MOVE)
    assert "\nimport torch_npu\n" in migrated
    assert "torch_npu is None" not in migrated
    assert "    if isinstance(x, torch.fx.Proxy):\n        return False" in migrated


def test_a_file_importing_torch_npu_guarded_keeps_the_test():
    migrated, _ = _migrate(NORM_ONLY)
    assert "except ImportError:  # not an Ascend host: the original code runs\n    torch_npu = None" in migrated
    assert "if torch_npu is None or isinstance(x, torch.fx.Proxy):" in migrated


MOVE = "import torch\n\n\ndef place(x):\n    return x.cuda()\n"


def _import_finding(path) -> str:
    _, findings = migrate_text(MOVE, path=str(path))
    return next(f.message for f in findings if f.rule_id == "NPU001")


def test_a_library_module_is_told_that_its_package_now_needs_torch_npu(tmp_path):
    package = tmp_path / "lib"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "utils.py").write_text(MOVE)
    message = _import_finding(package / "utils.py")
    assert message.startswith("`import torch_npu` added: this module is part of a package")
    assert "--target portable" in message


def test_a_script_or_entry_point_is_not(tmp_path):
    (tmp_path / "train.py").write_text(MOVE)
    assert _import_finding(tmp_path / "train.py") == "`import torch_npu` added"
    package = tmp_path / "app"
    package.mkdir()
    (package / "__init__.py").write_text("")
    main = package / "cli.py"
    main.write_text(MOVE + '\n\nif __name__ == "__main__":\n    place(None)\n')
    _, findings = migrate_text(main.read_text(), path=str(main))
    assert next(f.message for f in findings if f.rule_id == "NPU001") == "`import torch_npu` added"


@pytest.mark.integration
def test_the_shorter_is_npu_keeps_torchscript_fx_and_compile_working_off_the_npu(tmp_path, monkeypatch):
    import importlib
    import sys
    import types

    import torch

    source = (
        "import torch\n\n\ndef place(x):\n    return x.cuda()\n\n\n"
        "class Norm(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.weight = torch.nn.Parameter(torch.rand(8) + 0.5)\n\n"
        "    def forward(self, x):\n        variance = x.pow(2).mean(-1, keepdim=True)\n"
        "        return self.weight * (x * torch.rsqrt(variance + 1e-6))\n"
    )
    migrated, _ = migrate_text(source, path="norm_plain.py")
    assert "def _is_npu(" in migrated and "torch_npu is None" not in migrated
    (tmp_path / "norm_plain.py").write_text(migrated)
    # The file imports torch_npu unconditionally: a stand-in module, as where it is installed (no NPU here).
    monkeypatch.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("norm_plain")
    norm = module.Norm()
    x = torch.randn(2, 3, 8) * 3
    expected = norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    assert torch.equal(norm(x), expected)
    assert torch.equal(torch.jit.script(norm)(x), expected)
    assert torch.equal(torch.fx.symbolic_trace(norm)(x), expected)
    assert torch.equal(torch.compile(norm, backend="eager")(x), expected)
