"""Issue #13: fixture projects of our own, migrated by `npu-migrate apply --output` and run on the simulated
NPU host (`npu-migrate verify --smoke`): import, build, forward, backward and an optimizer step.

* `runs_guards` (patterns 1, 2, 4): flags and branches gated on `torch.cuda.is_available()` (one reaching
  xformers through the module's own functions), capability gates
  (indexing, tuple comparison, unpacking, `major * 10 + minor`), device properties, a framework
  accelerator string under a guard, `x.is_cuda` in front of flash_attn's rms_norm, an fp8 path on
  `torch._scaled_mm` behind `device.type != "cuda"`. Migrated by the tool before issue #13 it crashed at
  import (`torch.cuda.get_device_capability` under the flipped `HAS_GPU`).
* `runs_native` (pattern 7): a library that already tests for "npu" next to "cuda". Before issue #13 both
  branches became npu ones and `is_cuda` read True on the NPU (the program printed `cuda=True`).
* `runs_values` (patterns 3, 5): device values that travel (an f-string device tested with
  `.startswith("cuda:")` before `set_device`, a `.format` device into `map_location`, `device_type="cuda"`
  given to a wrapper of autocast, a private `partial(torch.cuda.amp.autocast, ...)`, `GradScaler()` without
  a device) and a bitsandbytes-style parameter whose `.cuda()` quantises in place (a local stand-in module
  named `bitsandbytes`: the rule keys on that import name). Migrated by the tool before these rewrites it ran
  but silently wrong: `set_device` never ran (`bound=[]`) and autocast was off (`autocast=False`).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from npu_migrate.verify import smoke

PROJECTS = Path(__file__).resolve().parent.parent / "fixtures" / "projects"


def _apply(project: Path, out: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "npu_migrate", "apply", str(project), "--output", str(out)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _migrated(tmp_path_factory, name: str) -> tuple[Path, Path, str]:
    base = tmp_path_factory.mktemp(name)
    original, migrated = base / "original", base / "migrated"
    shutil.copytree(PROJECTS / name, original)
    output = _apply(original, migrated)
    return original, migrated, output


@pytest.fixture(scope="module")
def guards(tmp_path_factory):
    return _migrated(tmp_path_factory, "runs_guards")


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    return _migrated(tmp_path_factory, "runs_native")


@pytest.fixture(scope="module")
def values(tmp_path_factory):
    return _migrated(tmp_path_factory, "runs_values")


def _unchanged_files(original: Path, migrated: Path) -> list[str]:
    return sorted(
        str(p.relative_to(original))
        for p in original.rglob("*.py")
        if (migrated / p.relative_to(original)).read_bytes() == p.read_bytes()
    )


def test_guards_project_runs_a_training_step_on_the_npu_host(guards):
    original, migrated, _ = guards
    report = smoke.run(migrated, factory=migrated / "factory.py", original=original)
    assert report.passed, report.to_text(verbose=True)
    assert report.steps == ["import", "build", "forward", "backward", "optimizer step"]
    # The NPU answers as an Ampere-class GPU: bf16 on, fp8 off; the properties it has are read.
    assert "gpu=True sm=80 bf16=True fp8=False mem=True accelerator=cpu" in report.output_tail


def test_guards_project_keeps_the_guards_it_cannot_make_safe(guards):
    _, migrated, output = guards
    hw = (migrated / "gates" / "hw.py").read_text()
    assert "HAS_GPU = torch.npu.is_available()" in hw
    assert "MEMORY_GB = torch.npu.get_device_properties(0).total_memory / 2**30" in hw
    assert "major, minor = (torch.npu.get_device_capability() or (8, 0))" in hw
    # In front of the framework's accelerator string the guard stays, and says why.
    assert 'if torch.cuda.is_available():\n    accelerator = "cuda"' in hw
    assert "hw.py:17:4: NPU201 `torch.cuda.is_available()` left as is: the code it guards at line 18" in output
    kernels = (migrated / "gates" / "kernels.py").read_text()
    assert "if x.is_cuda and flash_rms_norm is not None:" in kernels
    assert 'if x.device.type != "cuda":' in kernels
    assert "kernels.py:10:8: NPU103 `x.is_cuda` left as is: it decides, with `flash_rms_norm is not None`" in output
    assert "the code it guards at line 21 has `torch._scaled_mm`, which is not migrated (NPU203)" in output
    # xformers reached through the module's own functions: that guard stays; one whose callee tests for
    # xformers itself is flipped.
    mixing = (migrated / "gates" / "mixing.py").read_text()
    assert "        if torch.cuda.is_available():\n            return self._fast(x)" in mixing
    assert "    if torch.npu.is_available():\n        x = _attend_or_identity(x)" in mixing
    assert (
        "mixing.py:28:12: NPU201 `torch.cuda.is_available()` left as is: the code it guards at line 29 calls "
        "`_fast` (line 24), which calls `_memory_efficient` (line 12), which uses `xops` from xformers"
    ) in output


def test_native_project_keeps_its_cuda_branches(native):
    original, migrated, _ = native
    report = smoke.run(migrated, factory=migrated / "factory.py", original=original)
    assert report.passed, report.to_text(verbose=True)
    assert "npu=True cuda=False" in report.output_tail
    device = (migrated / "native" / "device.py").read_text()
    assert device == (original / "native" / "device.py").read_text()


def test_values_project_runs_with_its_device_values_on_the_npu(values):
    original, migrated, _ = values
    report = smoke.run(migrated, factory=migrated / "factory.py", original=original)
    assert report.passed, report.to_text(verbose=True)
    assert report.steps == ["import", "build", "forward", "backward", "optimizer step"]
    # set_device ran behind the prefix test, the checkpoint landed on the NPU, the in-place quantisation
    # happened, autocast and loss scaling are on.
    assert "bound=['npu:0'] state=npu quantised=True autocast=True scaler=True" in report.output_tail


def test_values_project_reports_the_in_place_cuda_call(values):
    _, migrated, output = values
    assert "        self.weight.cuda()\n" in (migrated / "values" / "quant.py").read_text()
    assert "quant.py:14:9: NPU101 `.cuda()` not rewritten: its result is thrown away" in output
    model = (migrated / "values" / "model.py").read_text()
    assert '_head_precision = partial(torch.amp.autocast, "npu", dtype=torch.bfloat16)' in model
    assert 'forward_step(self.quant, x, device_type="npu")' in model


@pytest.mark.parametrize("name", ["runs_guards", "runs_native", "runs_values"])
def test_a_second_apply_changes_nothing(name, guards, native, values):
    original, migrated, _ = {"runs_guards": guards, "runs_native": native, "runs_values": values}[name]
    untouched = _unchanged_files(original, migrated)
    again = migrated.parent / "again"
    _apply(migrated, again)
    for path in migrated.rglob("*.py"):
        assert (again / path.relative_to(migrated)).read_bytes() == path.read_bytes(), path
    # A file with nothing to rewrite (only a finding) stays byte for byte.
    assert {"runs_guards": "gates/model.py", "runs_values": "values/quant.py"}.get(name, "") in untouched + [""]
