"""Issue #14, idiom 4: a project of our own calling flash-attn three ways, migrated and run on the simulated
NPU host (`npu-migrate verify --smoke`), where flash-attn does not install.

* `flashnet/dense.py` imports `flash_attn_func` unconditionally: the original does not even import on an
  NPU host. Migrated, the import is conditional and the call takes npu_fusion_attention (BSND).
* `flashnet/packed.py` reaches `flash_attn_varlen_func` behind a try-import and a config switch, with no
  test of flash-attn's presence: the original calls None there. Migrated, the call takes the kernel (TND).
* `flashnet/local.py` imports `flash_attn_func` inside the method that calls it: the original raises
  ImportError at the first forward on an NPU host. Migrated, that import is conditional too and the call
  takes the kernel (BSND).
* `flashnet/guarded.py` tests `flash_attn_func is not None and q.is_cuda`: that guard stays as it is, and
  its SDPA fallback runs on the NPU host (the flash path is reached only through the wrapper, never by
  flipping the guard).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from npu_migrate.verify import smoke

pytestmark = pytest.mark.integration

PROJECT = Path(__file__).resolve().parent.parent / "fixtures" / "projects" / "runs_flash"


def _apply(source: Path, out: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "npu_migrate", "apply", str(source), "--output", str(out)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def flash(tmp_path_factory):
    base = tmp_path_factory.mktemp("runs_flash")
    original, migrated = base / "original", base / "migrated"
    shutil.copytree(PROJECT, original)
    return original, migrated, _apply(original, migrated)


def test_the_migrated_project_trains_on_the_npu_host_through_the_kernel(flash):
    original, migrated, _ = flash
    report = smoke.run(migrated, factory=migrated / "factory.py", original=original)
    assert report.passed, report.to_text(verbose=True)
    assert report.steps == ["import", "build", "forward", "backward", "optimizer step"]
    # The dense, the function-local and the varlen call, once each; the guarded call's SDPA fallback is fp32,
    # which NPU704 leaves.
    assert report.fused_calls == {"npu_fusion_attention": 3}


def test_the_original_does_not_import_on_the_npu_host(flash):
    original, _, _ = flash
    report = smoke.run(original, factory=original / "factory.py")
    assert not report.passed
    assert report.crash.type in ("ImportError", "ModuleNotFoundError") and report.crash.file.endswith("dense.py")


def test_the_guard_that_tests_for_flash_attn_stays(flash):
    _, migrated, output = flash
    guarded = (migrated / "flashnet" / "guarded.py").read_text()
    assert "    if flash_attn_func is not None and q.is_cuda:\n" in guarded
    assert "        return _npu_flash_attn_func(flash_attn_func, q, k, v, causal=True)\n" in guarded
    dense = (migrated / "flashnet" / "dense.py").read_text()
    assert "try:\n    from flash_attn import flash_attn_func\nexcept ImportError:" in dense
    # The guard's own finding says why it stays.
    assert "guarded.py:13:40: NPU103 `q.is_cuda` left as is" in output


def test_the_import_inside_a_function_is_made_conditional(flash):
    _, migrated, output = flash
    local = (migrated / "flashnet" / "local.py").read_text()
    assert "        try:\n            from flash_attn import flash_attn_func\n        except ImportError:" in local
    assert "return _npu_flash_attn_func(flash_attn_func, q, k, v, causal=True)" in local
    assert not [line for line in output.splitlines() if line.startswith("flashnet/local.py:")]  # nothing left open


def test_a_second_apply_changes_nothing(flash):
    _, migrated, _ = flash
    again = migrated.parent / "again"
    _apply(migrated, again)
    for path in migrated.rglob("*.py"):
        assert (again / path.relative_to(migrated)).read_bytes() == path.read_bytes(), path
