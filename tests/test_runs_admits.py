"""Issue #25 items 1 and 5: the fixture project `runs_admits`, migrated by `npu-migrate apply --output` and run
on the simulated NPU host (`npu-migrate verify --smoke`). Migrated by the tool before the fix it crashed four
times, one after another: `import flash_attn` (the module-level import kept for a call through the module),
`from kernels import get_kernel` (a hub probe behind a flipped `torch.cuda.is_available()`),
`nn.parallel.data_parallel` behind a flipped `input.is_cuda`, and `torch._scaled_mm` behind a warning
branch whose `device_type != "cuda"` became `!= "npu"`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from npu_migrate.verify import smoke

PROJECT = Path(__file__).resolve().parent.parent / "fixtures" / "projects" / "runs_admits"


def _apply(project: Path, out: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "npu_migrate", "apply", str(project), "--output", str(out)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def admits(tmp_path_factory):
    base = tmp_path_factory.mktemp("runs_admits")
    original, migrated = base / "original", base / "migrated"
    shutil.copytree(PROJECT, original)
    return original, migrated, _apply(original, migrated)


def test_the_project_runs_a_training_step_on_the_npu_host(admits):
    _, migrated, _ = admits
    report = smoke.run(migrated, factory=migrated / "factory.py")
    assert report.passed, report.to_text(verbose=True)
    assert report.steps == ["import", "build", "forward", "backward", "optimizer step"]
    # The varlen call took the NPU kernel; the hub probe, data_parallel and fp8 stayed off.
    assert "npu_fusion_attention x1" in report.to_text()
    assert "hub_kernel=False" in report.output_tail
    assert "fp8 needs CUDA: ignored" in report.output_tail


def test_the_guards_stay_and_say_what_blocks_them(admits):
    _, migrated, output = admits
    assert "    if not torch.cuda.is_available():\n        return None" in (migrated / "admits/probe.py").read_text()
    assert "if input.is_cuda and self.ngpu > 1:" in (migrated / "admits/parallel.py").read_text()
    precision = (migrated / "admits/precision.py").read_text()
    assert 'device_type = "npu" if torch.npu.is_available() else "cpu"' in precision
    assert 'if fp8 and device_type != "cuda":' in precision
    assert "probe.py:7:12: NPU201 `torch.cuda.is_available()` left as is: the code it guards at line 11" in output
    assert "parallel.py:13:12: NPU103 `input.is_cuda` left as is: the code it guards at line 14 has" in output
    assert 'precision.py:11:31: NPU104 `device_type != "cuda"` left as is: the code it guards at line 17' in output


def test_flash_attn_through_its_module_is_reached_without_the_package(admits):
    _, migrated, _ = admits
    attention = (migrated / "admits/attention.py").read_text()
    assert "try:\n    import flash_attn\nexcept ImportError:" in attention
    assert "flash_attn and flash_attn.flash_attn_varlen_func," in attention


def test_a_second_apply_changes_nothing(admits):
    _, migrated, _ = admits
    again = migrated.parent / "again"
    _apply(migrated, again)
    for path in migrated.rglob("*.py"):
        assert (again / path.relative_to(migrated)).read_bytes() == path.read_bytes(), path
